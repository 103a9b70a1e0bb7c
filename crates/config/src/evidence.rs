//! `evidence:` (ours): a cloud instance identity document every node must
//! present, verified before anything is signed or configured for it, and
//! one instance, one identity.
//!
//! ```yaml
//! evidence:
//!   aws_certificates: /etc/choria-provisioner/aws-regions.pem
//!   aws_accounts: ["123456789012"]
//!   gcp_certificates: /etc/choria-provisioner/google-certs.json
//!   gcp_audience: "choria:{identity}"
//!   gcp_projects: [fleet-prod]
//!   azure_certificates: /etc/choria-provisioner/azure-intermediates.pem
//!   azure_subscriptions: ["8d10da13-8125-4ba9-a717-bf7490507b3d"]
//!   max_age: 1h
//!   node_name: instance_id
//!   one_identity_per_instance: true
//! ```
//!
//! A node carries its evidence in its facts (the file its provisioning
//! JWT's `chf` claim names, `choria jwt prov --facts`), under
//! `instance_identity`; the core verifies it (`choria_core::evidence`), this
//! only says with what.

use super::duration::format_duration;
use super::schema::EvidenceFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `{identity}` in `gcp_audience` is replaced with.
pub const IDENTITY_PLACEHOLDER: &str = "{identity}";

/// `evidence.node_name`: what of the instance the identity names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeName {
    /// One of the identity's dot-separated labels is the instance id.
    InstanceId,
    /// The identity's first label is the instance's name (GCP).
    InstanceName,
}

impl NodeName {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeName::InstanceId => "instance_id",
            NodeName::InstanceName => "instance_name",
        }
    }
}

/// `evidence:`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidenceConfig {
    /// PEM certificates of the AWS regions whose `signature` the instance
    /// identity documents carry.
    pub aws_certificates: Option<PathBuf>,
    /// AWS accounts whose instances may be provisioned; empty: any.
    pub aws_accounts: Vec<String>,
    /// Google's signing certificates (`{"kid": "PEM", ...}`, as
    /// `https://www.googleapis.com/oauth2/v1/certs` serves them) or a PEM
    /// bundle.
    pub gcp_certificates: Option<PathBuf>,
    /// The audience a GCP identity token must be for, `{identity}` the
    /// node's name: binds the token to the name it is presented under.
    pub gcp_audience: String,
    /// GCP projects whose instances may be provisioned; empty: any.
    pub gcp_projects: Vec<String>,
    /// PEM certificates of the Microsoft intermediates that issue the
    /// `metadata.azure.com` certificate attested documents are signed with.
    pub azure_certificates: Option<PathBuf>,
    /// Azure subscriptions whose virtual machines may be provisioned;
    /// empty: any.
    pub azure_subscriptions: Vec<String>,
    /// Refuse instances launched longer ago than this (AWS `pendingTime`,
    /// GCP `instance_creation_timestamp`).
    pub max_age: Option<Duration>,
    /// What of the instance the node's identity must name.
    pub node_name: Option<NodeName>,
    /// An instance is provisioned under one identity only, and an identity
    /// from one instance only (needs records).
    pub one_identity_per_instance: bool,
    /// A name bound to an instance may be taken by another instance once
    /// the credentials on record for the name have expired (otherwise only
    /// `choria-provisioner rebind` moves it).
    pub rebind_after_expiry: bool,
}

impl EvidenceConfig {
    pub fn to_file(&self) -> EvidenceFile {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let list = |l: &Vec<String>| (!l.is_empty()).then(|| l.clone());
        EvidenceFile {
            aws_certificates: path(&self.aws_certificates),
            aws_accounts: list(&self.aws_accounts),
            gcp_certificates: path(&self.gcp_certificates),
            gcp_audience: Some(self.gcp_audience.clone()),
            gcp_projects: list(&self.gcp_projects),
            azure_certificates: path(&self.azure_certificates),
            azure_subscriptions: list(&self.azure_subscriptions),
            max_age: self.max_age.map(format_duration),
            node_name: self.node_name.map(|n| n.as_str().to_string()),
            one_identity_per_instance: Some(self.one_identity_per_instance),
            rebind_after_expiry: Some(self.rebind_after_expiry),
        }
    }

    /// `run --check`'s line.
    pub fn effective(&self) -> String {
        let mut parts = Vec::new();
        if self.aws_certificates.is_some() {
            parts.push(match self.aws_accounts.len() {
                0 => "aws (any account)".to_string(),
                n => format!("aws ({n} account{})", if n == 1 { "" } else { "s" }),
            });
        }
        if self.gcp_certificates.is_some() {
            parts.push(format!(
                "gcp (audience {}, {})",
                self.gcp_audience,
                match self.gcp_projects.len() {
                    0 => "any project".to_string(),
                    n => format!("{n} project{}", if n == 1 { "" } else { "s" }),
                }
            ));
        }
        if self.azure_certificates.is_some() {
            parts.push(match self.azure_subscriptions.len() {
                0 => "azure (any subscription)".to_string(),
                n => format!("azure ({n} subscription{})", if n == 1 { "" } else { "s" }),
            });
        }
        if let Some(age) = self.max_age {
            parts.push(format!("launched within {}", format_duration(age)));
        }
        if let Some(n) = self.node_name {
            parts.push(format!("identity names the {}", n.as_str()));
        }
        if self.one_identity_per_instance {
            parts.push(if self.rebind_after_expiry {
                "one identity per instance and one instance per identity (moved once its credentials expired)".into()
            } else {
                "one identity per instance and one instance per identity".into()
            });
        }
        format!("required: {}", parts.join(", "))
    }
}

/// The default `gcp_audience`.
pub const DEFAULT_GCP_AUDIENCE: &str = "choria:{identity}";

pub(crate) fn evidence(
    file: &Path,
    sec: &Section,
    has_records: bool,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<EvidenceConfig>, ConfigError> {
    if !sec.is_set("evidence") {
        return Ok(None);
    }
    let e = Section::new(
        file,
        &format!("{}.", sec.key("evidence")),
        sec.node("evidence").cloned().unwrap_or(Node::Null),
        EvidenceFile::KEYS,
        w,
    )?;
    let path = |key: &str| -> Result<Option<PathBuf>, ConfigError> {
        Ok(e.string(key)?
            .filter(|p| !p.trim().is_empty())
            .map(PathBuf::from))
    };
    let aws_certificates = path("aws_certificates")?;
    let gcp_certificates = path("gcp_certificates")?;
    let azure_certificates = path("azure_certificates")?;
    if aws_certificates.is_none() && gcp_certificates.is_none() && azure_certificates.is_none() {
        return Err(e.error(
            "aws_certificates",
            "evidence needs aws_certificates, gcp_certificates or azure_certificates: what verifies the instance identity documents",
        ));
    }
    let (aws_accounts, gcp_projects, azure_subscriptions) = account_lists(&e)?;
    let gcp_audience = gcp_audience(&e, gcp_certificates.is_some())?;
    let max_age = max_age(&e)?;
    let node_name = node_name(&e)?;
    let one_identity_per_instance = e.bool("one_identity_per_instance")?.unwrap_or(true);
    if one_identity_per_instance && !has_records {
        return Err(e.error(
            "one_identity_per_instance",
            "needs records: the instances' identities are kept beside them (or set it to false)",
        ));
    }
    warn_unnarrowed(
        &e,
        w,
        [
            (aws_certificates.is_some(), &aws_accounts, "aws_accounts"),
            (gcp_certificates.is_some(), &gcp_projects, "gcp_projects"),
            (
                azure_certificates.is_some(),
                &azure_subscriptions,
                "azure_subscriptions",
            ),
        ],
    );
    let rebind_after_expiry = e.bool("rebind_after_expiry")?.unwrap_or(false);
    Ok(Some(EvidenceConfig {
        rebind_after_expiry,
        aws_certificates,
        aws_accounts,
        gcp_certificates,
        gcp_audience,
        gcp_projects,
        azure_certificates,
        azure_subscriptions,
        max_age,
        node_name,
        one_identity_per_instance,
    }))
}

/// `evidence.gcp_audience`, or the default: with GCP tokens verified it must
/// name the node, or one node's token would pass for another.
fn gcp_audience(e: &Section, gcp: bool) -> Result<String, ConfigError> {
    let gcp_audience = e
        .string("gcp_audience")?
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_GCP_AUDIENCE.into());
    if gcp && !gcp_audience.contains(IDENTITY_PLACEHOLDER) {
        return Err(e.error(
            "gcp_audience",
            format!("{gcp_audience:?} does not hold {IDENTITY_PLACEHOLDER}: a token for one node would then be good for any name"),
        ));
    }
    Ok(gcp_audience)
}

/// `evidence.max_age`: unset takes instances of any age, zero is refused
/// rather than refusing every instance.
fn max_age(e: &Section) -> Result<Option<Duration>, ConfigError> {
    Ok(match e.duration("max_age")? {
        Some((raw, d)) if d.is_zero() => {
            return Err(e.error(
                "max_age",
                format!("{raw:?} is zero; leave it out to accept instances of any age"),
            ))
        }
        other => other.map(|(_, d)| d),
    })
}

/// `evidence.node_name`: which of the instance's names the node must carry.
fn node_name(e: &Section) -> Result<Option<NodeName>, ConfigError> {
    Ok(match e.string("node_name")?.as_deref().map(str::trim) {
        None | Some("") => None,
        Some("instance_id") => Some(NodeName::InstanceId),
        Some("instance_name") => Some(NodeName::InstanceName),
        Some(other) => {
            return Err(e.error(
                "node_name",
                format!("{other:?} is neither instance_id nor instance_name"),
            ))
        }
    })
}

/// `8d10da13-8125-4ba9-a717-bf7490507b3d`: 8-4-4-4-12 hex digits.
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The AWS accounts, GCP projects and Azure subscriptions listed.
type AccountLists = (Vec<String>, Vec<String>, Vec<String>);

/// The account, project and subscription lists, each checked for the
/// cloud's id format.
fn account_lists(e: &Section) -> Result<AccountLists, ConfigError> {
    let azure_subscriptions = e.string_list("azure_subscriptions")?.unwrap_or_default();
    if let Some(bad) = azure_subscriptions.iter().find(|s| !is_uuid(s)) {
        return Err(e.error(
            "azure_subscriptions",
            format!("{bad:?} is not an Azure subscription id (a UUID)"),
        ));
    }
    let aws_accounts = e.string_list("aws_accounts")?.unwrap_or_default();
    if let Some(bad) = aws_accounts
        .iter()
        .find(|a| a.len() != 12 || !a.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(e.error(
            "aws_accounts",
            format!("{bad:?} is not an AWS account id (12 digits)"),
        ));
    }
    let gcp_projects = e.string_list("gcp_projects")?.unwrap_or_default();
    Ok((aws_accounts, gcp_projects, azure_subscriptions))
}

/// Where no list narrows a cloud whose certificates are set, a VM in
/// anyone's account presents valid evidence: said at start-up and by
/// `run --check`.
fn warn_unnarrowed(
    e: &Section,
    w: &mut Vec<ConfigWarning>,
    clouds: [(bool, &Vec<String>, &str); 3],
) {
    for (set, list, what) in clouds {
        if set && list.is_empty() {
            w.push(e.warning(
                what,
                format!("{what} is empty: instances of any account of that cloud are accepted, an attacker's own VM included; list yours"),
            ));
        }
    }
}
