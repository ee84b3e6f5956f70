//! State keys: an injective, escaped text encoding of what a limiter state belongs to.
