//! The secrets this process holds (API keys, bearer tokens, secret environment values given
//! to MCP servers), registered where they are read, so the Host can take them out of every
//! message it shows or writes itself: notes, hints, Host events, logs, error details. A
//! server that echoes a key in its error text (gateways do) must not get it printed.
//!
//! Only the Host's own messages are redacted; a run's result and the answers a record keeps
//! are the run's data and are never rewritten.

use std::borrow::Cow;
use std::sync::RwLock;

/// Shorter values are not taken out: replacing a two-letter "key" everywhere would garble
/// every message, and a value that short is no secret.
const SHORTEST: usize = 6;

/// What a secret is shown as.
pub const REDACTED: &str = "[redacted]";

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Remember a secret value (an API key, a bearer token).
pub fn register(value: &str) {
    let value = value.trim();
    if value.chars().count() < SHORTEST {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|s| s == value) {
        secrets.push(value.to_owned());
        // Longest first, so a key that contains another is taken out whole.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered secret replaced by [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|s| text.contains(s.as_str())) {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_owned();
    for secret in secrets.iter() {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), REDACTED);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_secrets_are_taken_out_and_short_ones_left() {
        register("sk-test-abcdef123456");
        register("sk-test-abcdef123456-longer");
        register("ab");
        assert_eq!(
            redact("bad key sk-test-abcdef123456-longer and sk-test-abcdef123456, ab"),
            "bad key [redacted] and [redacted], ab"
        );
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
    }
}
