//! Service settings.
