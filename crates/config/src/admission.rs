//! `admission:` (ours) and Go's `rego_policy`: the Rego policy every node
//! is evaluated against before anything is signed or configured for it.
//!
//! ```yaml
//! admission:
//!   policy: /etc/choria-provisioner/admission.rego
//! ```
//!
//! `rego_policy: FILE` (a key the Go provisioner reads and never uses)
//! means the same. The file is compiled when the provisioner starts and by
//! `run --check`; that is the core's business (`choria_core::admission`),
//! this only says where it is.

use super::schema::AdmissionFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use std::path::{Path, PathBuf};

/// `admission:` or `rego_policy`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// The Rego file.
    pub policy: PathBuf,
    /// The file is written in Rego v0 (OPA before 1.0: rules without
    /// `if`), as go-choria's own authorization policies are.
    pub rego_v0: bool,
}

impl AdmissionConfig {
    pub fn to_file(&self) -> AdmissionFile {
        AdmissionFile {
            policy: Some(self.policy.display().to_string()),
            rego_v0: Some(self.rego_v0),
        }
    }
}

/// `admission:`, or `rego_policy` when that is the only one set; both set
/// must name the same file.
pub(crate) fn admission(
    file: &Path,
    sec: &Section,
    rego_policy: Option<&str>,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<AdmissionConfig>, ConfigError> {
    if !sec.is_set("admission") {
        return Ok(rego_policy.map(|p| AdmissionConfig {
            policy: PathBuf::from(p),
            rego_v0: false,
        }));
    }
    let a = Section::new(
        file,
        &format!("{}.", sec.key("admission")),
        sec.node("admission").cloned().unwrap_or(Node::Null),
        AdmissionFile::KEYS,
        w,
    )?;
    let policy = a.string("policy")?.filter(|p| !p.trim().is_empty());
    let policy = match (policy, rego_policy) {
        (Some(p), Some(r)) if p != r => {
            return Err(a.error(
                "policy",
                format!("{p:?} differs from rego_policy {r:?}; set one of the two"),
            ))
        }
        (Some(p), _) => p,
        (None, Some(r)) => r.to_string(),
        (None, None) => {
            return Err(a.error(
                "policy",
                "required: the Rego file every node is evaluated against",
            ))
        }
    };
    Ok(Some(AdmissionConfig {
        policy: PathBuf::from(policy),
        rego_v0: a.bool("rego_v0")?.unwrap_or(false),
    }))
}
