//! Configuration files, read the way the Go provisioner reads them so existing
//! installations switch without editing anything.
//!
//! * [`provisioner`]: `provisioner.yaml` (`--config`), the Go provisioner's
//!   `config/config.go` keys, defaults and checks, plus the new `election:` block.
//! * [`choria`]: the Choria client configuration (`--choria-config`), go-choria's
//!   `key = value` format, reduced to what a provisioner client needs, and the
//!   derivation of the NATS connection options and the request signer from it.
//! * [`duration`]: Choria's duration syntax (`1m`, `36h`, `1d`, `1w`, `1M`, `1y`).
//! * The sections of `provisioner.yaml` beyond the Go provisioner's, each
//!   its own module: [`election`], [`day_two`] (records and renewal),
//!   [`admission`] (the Rego policy), [`ca`] (the built-in CA), [`evidence`] (cloud instance
//!   documents), [`audit`] (the audit stream), [`telemetry`] (traces
//!   over OTLP), [`template`]
//!   (`configuration_template:` and its minijinja environment, with
//!   `template_names` the names templates are compiled under) and
//!   [`interpolation`] (what an interpolated value may hold where it lands).
//! * [`schema`]: every key of `provisioner.yaml` declared once, read by the
//!   parser, the operator's writer and the book's reference; [`names`]:
//!   Kubernetes' name rules; `yaml`: a YAML tree that keeps entries in order,
//!   duplicates included.
//!
//! Every error names the file, the key and what is wrong, for example
//! `provisioner.yaml: interval: 30s is below the minimum of 1m`. Settings that
//! the Go provisioner silently ignores (unknown keys, unused keys) are accepted,
//! but reported as [`ConfigWarning`]s so typos become visible.

pub mod admission;
pub mod audit;
pub mod ca;
pub mod choria;
pub mod day_two;
pub mod duration;
pub mod election;
pub mod evidence;
pub mod interpolation;
pub mod names;
pub mod provisioner;
pub mod schema;
pub mod telemetry;
pub mod template;
mod template_names;
mod yaml;

pub use choria::{ChoriaClientConfig, ClientSetup, Environment, SecurityProvider};
pub use duration::{parse_duration, DurationError};
pub use election::{ElectionBackend, ElectionConfig};
pub use provisioner::{Features, LogLevel, LogTarget, ProvisionerConfig};

use std::fmt;
use std::path::{Path, PathBuf};

/// Splits the `helper` command line the way a POSIX shell would, without any
/// expansion (the Go provisioner uses go-shellquote, which follows the same rules).
pub fn split_command_line(line: &str) -> Result<Vec<String>, String> {
    shell_words::split(line).map_err(|e| format!("cannot split the command line: {e}"))
}

/// Reads a configuration file, naming it in the error.
pub(crate) fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })
}

/// A configuration error: which file, where, which key and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("{}: could not read the configuration file: {source}", .file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML, or its top level is not a mapping.
    #[error("{}: {message}", .file.display())]
    Syntax { file: PathBuf, message: String },
    /// A setting is missing, malformed or not allowed.
    #[error("{}: {key}: {message}", location(.file, *.line))]
    Invalid {
        file: PathBuf,
        /// 1-based line, where the format keeps track of lines.
        line: Option<usize>,
        key: String,
        message: String,
    },
}

impl ConfigError {
    pub fn invalid(
        file: &Path,
        line: Option<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            line,
            key: key.into(),
            message: message.into(),
        }
    }

    /// The key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Something accepted for compatibility that the user probably wants to know
/// about: an unknown (possibly misspelt) key, a key that is ignored, a value
/// that falls back to a default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

impl ConfigWarning {
    pub(crate) fn new(
        file: &Path,
        line: Option<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigWarning {
            file: file.to_path_buf(),
            line,
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            location(&self.file, self.line),
            self.key,
            self.message
        )
    }
}

/// Logs warnings through `tracing` at WARN level.
pub fn log_warnings(warnings: &[ConfigWarning]) {
    for w in warnings {
        tracing::warn!("{w}");
    }
}

fn location(file: &Path, line: Option<usize>) -> String {
    match line {
        Some(l) => format!("{}:{l}", file.display()),
        None => file.display().to_string(),
    }
}

/// A credential read from a configuration file. It never appears in `Debug`
/// output and has no `Display`; use [`Secret::expose`] where the value is sent.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("<empty>")
        } else {
            f.write_str("<redacted>")
        }
    }
}

/// Suggests the closest known key for a misspelt one (edit distance ≤ 2, or
/// the same letters ignoring `_`, `-` and `.`).
pub(crate) fn suggest<'a>(key: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let squash = |s: &str| {
        s.chars()
            .filter(|c| !matches!(c, '_' | '-' | '.'))
            .flat_map(char::to_lowercase)
            .collect::<String>()
    };
    let k = key.to_lowercase();
    let ks = squash(key);
    let mut best: Option<(usize, &str)> = None;
    for cand in known {
        let d = if squash(cand) == ks {
            0
        } else {
            edit_distance(&k, cand)
        };
        if d <= 2 && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, cand));
        }
    }
    best.map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_in_debug() {
        let s = Secret::new("s3cret");
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Secret::default()), "<empty>");
        assert_eq!(s.expose(), "s3cret");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = ConfigError::invalid(Path::new("provisioner.yaml"), None, "interval", "bad");
        assert_eq!(e.to_string(), "provisioner.yaml: interval: bad");
        assert_eq!(e.key(), Some("interval"));
        let e = ConfigError::invalid(Path::new("choria.cfg"), Some(3), "identity", "bad");
        assert_eq!(e.to_string(), "choria.cfg:3: identity: bad");
        let w = ConfigWarning::new(Path::new("choria.cfg"), Some(4), "k", "m");
        assert_eq!(w.to_string(), "choria.cfg:4: k: m");
    }

    #[test]
    fn suggestions_for_typos() {
        let known = ["workers", "interval", "lifecycle_component", "token"];
        assert_eq!(suggest("worker", known), Some("workers"));
        assert_eq!(suggest("intreval", known), Some("interval"));
        assert_eq!(
            suggest("lifecycle-component", known),
            Some("lifecycle_component")
        );
        assert_eq!(suggest("something_else", known), None);
    }
}
