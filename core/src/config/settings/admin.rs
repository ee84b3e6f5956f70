//! `[admin]`: who may call the admin endpoints that reveal or change limiter state, or decide.

use std::path::PathBuf;

use serde::Deserialize;

/// `[admin]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSettings {
    /// A bearer token required on `/why`, `/counters*`, `/ui*` and the decision endpoints;
    /// none: those answer only on a loopback admin port.
    pub token: Option<String>,
    /// A file holding the token (its first line, read at start); exclusive with `token`.
    pub token_file: Option<PathBuf>,
    /// Also require the token on `/metrics`.
    pub token_metrics: bool,
    /// The decision endpoints (`/json`, and limitador's `/check`, `/report`,
    /// `/check_and_report`) answer every caller, token or not, as the gRPC port does. On when
    /// started as `ratelimit` or `limitador-server`, whose users call them so.
    pub open_decisions: bool,
}

impl AdminSettings {
    /// Checks what deserializing cannot.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.token.is_some() && self.token_file.is_some() {
            return Err("admin.token and admin.token_file exclude each other".to_owned());
        }
        if self.token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err("admin.token must not be empty".to_owned());
        }
        if self.token_metrics && self.token.is_none() && self.token_file.is_none() {
            return Err("admin.token_metrics needs admin.token or admin.token_file".to_owned());
        }
        Ok(())
    }

    /// The token: `token`, or the first line of `token_file` (read now). An unreadable or
    /// empty file is an error naming it.
    pub fn resolve_token(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.token_file else {
            return Ok(self.token.clone());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("admin.token_file {}: {e}", path.display()))?;
        let token = text.lines().next().unwrap_or_default().trim();
        if token.is_empty() {
            return Err(format!("admin.token_file {}: empty", path.display()));
        }
        Ok(Some(token.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_from_the_setting_or_a_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret\n").unwrap_or_else(|e| panic!("{e}"));
        let from_file = AdminSettings {
            token_file: Some(file.clone()),
            ..AdminSettings::default()
        };
        assert_eq!(from_file.check(), Ok(()));
        assert_eq!(from_file.resolve_token(), Ok(Some("s3cret".to_owned())));
        std::fs::write(&file, "\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(from_file.resolve_token().is_err());
        let both = AdminSettings {
            token: Some("a".into()),
            token_file: Some(file),
            ..AdminSettings::default()
        };
        assert!(both.check().is_err());
        let empty = AdminSettings {
            token: Some(" ".into()),
            ..AdminSettings::default()
        };
        assert!(empty.check().is_err());
        let alone = AdminSettings {
            token_metrics: true,
            ..AdminSettings::default()
        };
        assert!(alone.check().is_err());
    }
}
