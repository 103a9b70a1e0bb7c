//! Node identities from the network, checked where they enter.
//!
//! Any machine can join the provisioning collective and claim any name, so
//! an identity is untrusted text until it passes [`validate`]: it becomes a
//! NATS subject (`provisioning.node.<identity>`), a log field, a registry key
//! and the helper's input. An 8 KiB name in a subject exceeds the broker's
//! control line and disconnects the client that publishes it; a name with
//! `*` or `>` would address many nodes at once; whitespace or control
//! characters would forge log lines.
//!
//! The rule is a host name's: at most 253 characters of `[A-Za-z0-9._-]`,
//! in dot-separated labels that are not empty.

use std::fmt;

/// The longest identity accepted (a DNS name's limit).
pub const MAX_IDENTITY_LEN: usize = 253;

/// Why an identity was refused. The text names the problem and never holds
/// the identity itself (see [`preview`] for a safe glimpse of it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the identity is empty")]
    Empty,
    #[error("the identity is {0} bytes long, more than {MAX_IDENTITY_LEN}")]
    TooLong(usize),
    #[error("the identity holds {0:?}, which is not a letter, digit, '.', '_' or '-'")]
    BadCharacter(char),
    #[error("the identity has an empty label (a leading, trailing or doubled '.')")]
    EmptyLabel,
}

impl IdentityError {
    /// A short, fixed label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::Empty => "empty",
            IdentityError::TooLong(_) => "too_long",
            IdentityError::BadCharacter(_) => "bad_character",
            IdentityError::EmptyLabel => "empty_label",
        }
    }
}

/// Checks an identity from the network; see the module documentation.
pub fn validate(identity: &str) -> Result<&str, IdentityError> {
    if identity.is_empty() {
        return Err(IdentityError::Empty);
    }
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(IdentityError::TooLong(identity.len()));
    }
    if let Some(c) = identity
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(IdentityError::BadCharacter(c));
    }
    if identity.split('.').any(str::is_empty) {
        return Err(IdentityError::EmptyLabel);
    }
    Ok(identity)
}

/// A glimpse of untrusted text that is safe to log: at most 40 characters,
/// control characters and non-ASCII escaped, and the full length.
pub fn preview(text: &str) -> Preview<'_> {
    Preview(text)
}

pub struct Preview<'a>(&'a str);

/// Untrusted text for a message: as it is when it is a valid identity (so
/// messages read like Go's), else its [`preview`].
pub fn shown(text: &str) -> String {
    match validate(text) {
        Ok(t) => t.to_string(),
        Err(_) => preview(text).to_string(),
    }
}

impl fmt::Display for Preview<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 40;
        f.write_str("\"")?;
        for c in self.0.chars().take(MAX) {
            for e in c.escape_default() {
                fmt::Write::write_char(f, e)?;
            }
        }
        let chars = self.0.chars().count();
        if chars > MAX {
            write!(f, "…\" ({} bytes)", self.0.len())
        } else {
            f.write_str("\"")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_pass() {
        for ok in [
            "node-1.example.net",
            "a",
            "NODE_2.Example-Net",
            "x1",
            &"a".repeat(253),
            "web01.dc-1.corp.example.com",
        ] {
            assert_eq!(validate(ok), Ok(ok), "{ok}");
        }
    }

    #[test]
    fn everything_else_is_refused_with_its_reason() {
        assert_eq!(validate(""), Err(IdentityError::Empty));
        assert_eq!(validate(&"a".repeat(254)), Err(IdentityError::TooLong(254)));
        assert_eq!(
            validate(&"a".repeat(8192)).unwrap_err().reason(),
            "too_long"
        );
        for (bad, c) in [
            ("node.*", '*'),
            ("node.>", '>'),
            ("node 1", ' '),
            ("node\t1", '\t'),
            ("node\n1", '\n'),
            ("nöde", 'ö'),
            ("a/b", '/'),
            ("a\u{0}b", '\u{0}'),
        ] {
            assert_eq!(
                validate(bad),
                Err(IdentityError::BadCharacter(c)),
                "{bad:?}"
            );
        }
        for bad in [".node", "node.", "a..b", "."] {
            assert_eq!(validate(bad), Err(IdentityError::EmptyLabel), "{bad}");
        }
    }

    #[test]
    fn errors_never_hold_the_identity() {
        let secret = format!("evil{}", "x".repeat(300));
        let e = validate(&secret).unwrap_err().to_string();
        assert!(!e.contains("evil"), "{e}");
    }

    #[test]
    fn previews_are_short_and_escaped() {
        assert_eq!(preview("node-1").to_string(), "\"node-1\"");
        assert_eq!(
            preview("a\nb\u{1b}[31m").to_string(),
            "\"a\\nb\\u{1b}[31m\""
        );
        let long = "y".repeat(8192);
        let p = preview(&long).to_string();
        assert!(p.len() < 80, "{p}");
        assert!(p.ends_with("(8192 bytes)"), "{p}");
    }
}
