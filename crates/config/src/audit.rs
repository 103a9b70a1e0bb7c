//! `audit:` (ours): every decision the provisioner makes about a node —
//! provisioned, refused, denied by the admission policy, deferred, shut
//! down, renewed — as one sealed CloudEvent on a JetStream stream.
//!
//! ```yaml
//! audit:
//!   stream: CHORIA_PROVISIONER_AUDIT
//!   max_age: 90d
//!   max_bytes: 1073741824
//! ```
//!
//! It needs `records:`: the events go through the records' connection and
//! are sealed with `records.signing_key`.

use super::duration::format_duration;
use super::schema::AuditFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use std::path::Path;
use std::time::Duration;

pub const DEFAULT_AUDIT_STREAM: &str = "CHORIA_PROVISIONER_AUDIT";
/// The subjects are `<subject>.<site or "_">.<event type>`.
pub const DEFAULT_AUDIT_SUBJECT: &str = "choria.provisioner.audit";
pub const DEFAULT_AUDIT_MAX_AGE: Duration = Duration::from_secs(90 * 86_400);
pub const DEFAULT_AUDIT_MAX_BYTES: i64 = 1 << 30;

/// `audit:`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditConfig {
    pub stream: String,
    pub subject: String,
    /// Events older than this are removed by the stream.
    pub max_age: Duration,
    /// The stream keeps at most this many bytes, the oldest removed first.
    pub max_bytes: i64,
    /// Create the stream when it is missing.
    pub create_stream: bool,
    /// Servers holding a copy of a stream we create.
    pub replicas: u8,
}

impl AuditConfig {
    pub fn to_file(&self) -> AuditFile {
        AuditFile {
            stream: Some(self.stream.clone()),
            subject: Some(self.subject.clone()),
            max_age: Some(format_duration(self.max_age)),
            max_bytes: Some(self.max_bytes),
            create_stream: Some(self.create_stream),
            replicas: Some(i64::from(self.replicas)),
        }
    }
}

pub(crate) fn audit(
    file: &Path,
    sec: &Section,
    has_records: bool,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<AuditConfig>, ConfigError> {
    if !sec.is_set("audit") {
        return Ok(None);
    }
    let a = Section::new(
        file,
        &format!("{}.", sec.key("audit")),
        sec.node("audit").cloned().unwrap_or(Node::Null),
        AuditFile::KEYS,
        w,
    )?;
    if !has_records {
        return Err(a.error(
            "stream",
            "audit needs records: its events go through the records' connection and are sealed with records.signing_key",
        ));
    }
    let stream = a
        .string("stream")?
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_AUDIT_STREAM.into());
    if !stream
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(a.error(
            "stream",
            format!("{stream:?} is not a stream name (letters, digits, _ and -)"),
        ));
    }
    let subject = a
        .string("subject")?
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_AUDIT_SUBJECT.into());
    let token_ok = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if !subject.split('.').all(token_ok) {
        return Err(a.error(
            "subject",
            format!("{subject:?} is not a subject prefix (dot-separated tokens of letters, digits, _ and -; no wildcards)"),
        ));
    }
    let max_age = match a.duration("max_age")? {
        None => DEFAULT_AUDIT_MAX_AGE,
        Some((raw, d)) if d.is_zero() => {
            return Err(a.error(
                "max_age",
                format!("{raw:?} is zero; the stream's retention must be bounded"),
            ))
        }
        Some((_, d)) => d,
    };
    let max_bytes = match a.int("max_bytes")? {
        None => DEFAULT_AUDIT_MAX_BYTES,
        Some(b) if b >= 1024 * 1024 => b,
        Some(b) => {
            return Err(a.error(
                "max_bytes",
                format!("{b} is below 1 MiB (1048576); the stream's size must be bounded, but not to nothing"),
            ))
        }
    };
    Ok(Some(AuditConfig {
        stream,
        subject,
        max_age,
        max_bytes,
        create_stream: a.bool("create_stream")?.unwrap_or(true),
        replicas: crate::day_two::replicas(&a, "replicas")?,
    }))
}
