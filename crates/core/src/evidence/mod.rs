//! Cloud instance identity evidence (`evidence:`): what a node must present,
//! besides its provisioning JWT, before anything is signed for it — a
//! document its cloud signed that names the instance it runs on — and the
//! one identity each instance may be provisioned as.
//!
//! A go-choria server in provisioning mode reports the facts of the file
//! its provisioning JWT's `chf` claim names (`choria jwt prov --facts`),
//! read again for every inventory; whatever fetches the evidence at boot
//! (cloud-init, a unit before choria-server) writes it there, under
//! `instance_identity`:
//!
//! ```json
//! {"instance_identity": {"aws": {"document": "<the document, verbatim>", "signature": "<base64>"}}}
//! {"instance_identity": {"aws": {"rsa2048": "<the rsa2048 form: PKCS#7, the document inside>"}}}
//! {"instance_identity": {"gcp": {"token": "<the identity token for audience choria:<identity>>"}}}
//! {"instance_identity": {"azure": {"signature": "<the attested document's signature: PKCS#7>"}}}
//! ```
//!
//! Values travel as strings: go-choria re-encodes facts (key order, number
//! types, HTML escaping), and a signature is over the exact bytes.
//!
//! * AWS: the instance identity document and its `signature` (RSA with
//!   SHA-256 over the document), or the `rsa2048` form (PKCS#7 with the
//!   document inside), verified with the regions' certificates
//!   (`aws_certificates`); the account must be listed (`aws_accounts`).
//! * GCP: the instance identity token (RS256), verified with Google's
//!   certificates (`gcp_certificates`), from `accounts.google.com`, for the
//!   audience naming this node (`gcp_audience`), unexpired; the project
//!   must be listed (`gcp_projects`).
//! * Azure: the attested document (PKCS#7 with its JSON inside), signed by
//!   a certificate for `metadata.azure.com` that one of Microsoft's
//!   intermediates (`azure_certificates`) issued, unexpired; the
//!   subscription must be listed (`azure_subscriptions`).
//!
//! An AWS document carries no nonce and no name: a copy is good for as long
//! as the instance lives. What a copy may cost is bounded by
//! [`bindings`]: an instance is provisioned under one identity only, so a
//! document copied from one node is refused under any other name.
//!
//! [`Verifier::verify`] is pure (it takes `now`); the bindings are the one
//! part that talks to the bucket.

mod ber;
mod parse;
mod pkcs7;
#[cfg(test)]
mod tests;

use crate::bindings;
use choria_config::evidence::{EvidenceConfig, NodeName, IDENTITY_PLACEHOLDER};
use choria_wire::security::tokens::{verify_rs256_jws, verify_rsa_sha256, TokenVerifyKey};
use rsa::RsaPublicKey;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The facts key the evidence is under.
pub const FACT: &str = "instance_identity";

/// How far a token's `iat` may be ahead of our clock.
const CLOCK_SKEW: i64 = 60;

/// A verified instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// `aws`, `gcp` or `azure`.
    pub provider: &'static str,
    /// The account (AWS), project (GCP) or subscription (Azure).
    pub account: String,
    pub instance_id: String,
    /// The region (AWS) or zone (GCP); Azure's document names neither.
    pub region: String,
    /// When the instance was launched (AWS `pendingTime`, GCP
    /// `instance_creation_timestamp`; Azure's document does not say),
    /// Unix seconds.
    pub launched_unix: Option<i64>,
    /// The rest the policy may read (image, type; instance name, …).
    pub details: Value,
}

impl Evidence {
    /// The instance's key among all providers: `aws.<account>.<id>`,
    /// `gcp.<project>.<id>` (every part checked to be letters, digits, `-`
    /// and `_`, so it is also a KV key and a subject token).
    pub fn instance(&self) -> String {
        format!("{}.{}.{}", self.provider, self.account, self.instance_id)
    }

    /// What the admission policy reads as `input.evidence`.
    pub fn input(&self) -> Value {
        json!({
            "provider": self.provider,
            "instance": self.instance(),
            "account": self.account,
            "instance_id": self.instance_id,
            "region": self.region,
            "launched_unix": self.launched_unix,
            "details": self.details,
        })
    }
}

/// Why a signature is refused when no configured key verifies it.
const NOT_CONFIGURED: &str = "not signed by the configured certificates";

#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    #[error("cannot read {what} {}: {source}", .path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {}: {reason}", .path.display())]
    Load {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the node presented no instance identity evidence (facts.{FACT})")]
    Missing,
    #[error("the instance identity evidence is malformed: {0}")]
    Malformed(String),
    #[error("the node presented {0} evidence, and evidence.{0}_certificates is not set")]
    Unconfigured(&'static str),
    /// The provider, and why (fixed words and dates: nothing the node chose).
    #[error("the {0} instance identity signature does not verify: {1}")]
    Signature(&'static str, String),
    #[error("{0}")]
    Refused(String),
}

impl EvidenceError {
    /// The `outcome` label of `choria_provisioner_evidence`.
    pub fn label(&self) -> &'static str {
        match self {
            EvidenceError::Missing => "missing",
            EvidenceError::Malformed(_) | EvidenceError::Unconfigured(_) => "malformed",
            EvidenceError::Signature(..) => "signature",
            EvidenceError::Refused(_) => "refused",
            EvidenceError::Read { .. } | EvidenceError::Load { .. } => "error",
        }
    }
}

/// The trust anchors and rules of `evidence:`, loaded.
pub struct Verifier {
    aws: Vec<RsaPublicKey>,
    aws_accounts: Vec<String>,
    gcp: Vec<(String, RsaPublicKey)>,
    gcp_audience: String,
    gcp_projects: Vec<String>,
    azure: Vec<RsaPublicKey>,
    azure_subscriptions: Vec<String>,
    max_age: Option<Duration>,
    node_name: Option<NodeName>,
}

impl Verifier {
    /// Reads the certificates `cfg` names: an error names the file.
    pub fn load(cfg: &EvidenceConfig) -> Result<Verifier, EvidenceError> {
        let pem = |path: &Option<PathBuf>, what: &'static str| match path {
            Some(p) => Ok(parse::pem_keys(&read(p, what)?)
                .map_err(|reason| load(p, what, reason))?
                .into_iter()
                .map(|(_, k)| k)
                .collect()),
            None => Ok(Vec::new()),
        };
        let aws = pem(&cfg.aws_certificates, "evidence.aws_certificates")?;
        let azure = pem(&cfg.azure_certificates, "evidence.azure_certificates")?;
        let gcp = match &cfg.gcp_certificates {
            Some(p) => parse::google_keys(&read(p, "evidence.gcp_certificates")?)
                .map_err(|reason| load(p, "evidence.gcp_certificates", reason))?,
            None => Vec::new(),
        };
        Ok(Verifier {
            azure,
            azure_subscriptions: cfg.azure_subscriptions.clone(),
            aws,
            aws_accounts: cfg.aws_accounts.clone(),
            gcp,
            gcp_audience: cfg.gcp_audience.clone(),
            gcp_projects: cfg.gcp_projects.clone(),
            max_age: cfg.max_age,
            node_name: cfg.node_name,
        })
    }

    /// The evidence in `facts` for a node presenting itself as
    /// `identity`, verified at `now` (Unix seconds).
    pub fn verify(
        &self,
        identity: &str,
        facts: &Value,
        now: i64,
    ) -> Result<Evidence, EvidenceError> {
        let Some(presented) = facts.get(FACT) else {
            return Err(EvidenceError::Missing);
        };
        let provided = (
            presented.get("aws"),
            presented.get("gcp"),
            presented.get("azure"),
        );
        let evidence = match provided {
            (Some(aws), None, None) => self.aws(aws, now)?,
            (None, Some(gcp), None) => self.gcp(identity, gcp, now)?,
            (None, None, Some(azure)) => self.azure(azure, now)?,
            _ => {
                return Err(EvidenceError::Malformed(format!(
                    "facts.{FACT} must hold one of aws, gcp or azure"
                )))
            }
        };
        if let (Some(age), Some(launched)) = (self.max_age, evidence.launched_unix) {
            let limit = i64::try_from(age.as_secs()).unwrap_or(i64::MAX);
            if now.saturating_sub(launched) > limit {
                return Err(EvidenceError::Refused(format!(
                    "instance {} was launched {} s ago, more than evidence.max_age ({} s)",
                    evidence.instance(),
                    now - launched,
                    limit
                )));
            }
        }
        self.names_node(identity, &evidence)?;
        Ok(evidence)
    }

    /// With `node_name`: the identity names the instance the evidence is
    /// for.
    fn names_node(&self, identity: &str, evidence: &Evidence) -> Result<(), EvidenceError> {
        let named = match self.node_name {
            None => return Ok(()),
            Some(NodeName::InstanceId) => identity.split('.').any(|l| l == evidence.instance_id),
            Some(NodeName::InstanceName) => {
                let name = evidence.details["instance_name"]
                    .as_str()
                    .unwrap_or_default();
                !name.is_empty() && identity.split('.').next() == Some(name)
            }
        };
        match named {
            true => Ok(()),
            false => Err(EvidenceError::Refused(format!(
                "the identity does not name instance {} (evidence.node_name: {})",
                evidence.instance(),
                self.node_name.map(NodeName::as_str).unwrap_or_default()
            ))),
        }
    }

    fn aws(&self, aws: &Value, now: i64) -> Result<Evidence, EvidenceError> {
        if self.aws.is_empty() {
            return Err(EvidenceError::Unconfigured("aws"));
        }
        let field = |name: &str| {
            aws.get(name).and_then(Value::as_str).ok_or_else(|| {
                EvidenceError::Malformed(format!("facts.{FACT}.aws.{name} is not a string"))
            })
        };
        let document = if aws.get("rsa2048").is_some() {
            let signed = self.pkcs7("aws", "aws.rsa2048", field("rsa2048")?, &self.aws, now)?;
            String::from_utf8(signed.content).map_err(|_| {
                EvidenceError::Malformed("the AWS document in rsa2048 is not UTF-8".into())
            })?
        } else {
            let document = field("document")?;
            let signature = parse::base64(field("signature")?).map_err(|e| {
                EvidenceError::Malformed(format!("facts.{FACT}.aws.signature: {e}"))
            })?;
            if !self
                .aws
                .iter()
                .any(|k| verify_rsa_sha256(k, document.as_bytes(), &signature).is_ok())
            {
                return Err(EvidenceError::Signature("aws", NOT_CONFIGURED.into()));
            }
            document.to_string()
        };
        // Signed by AWS: from here on its content is trusted, but still
        // checked for where it lands (a KV key, a log line).
        let evidence = parse::aws_document(&document).map_err(EvidenceError::Malformed)?;
        if !self.aws_accounts.is_empty() && !self.aws_accounts.contains(&evidence.account) {
            return Err(EvidenceError::Refused(format!(
                "AWS account {} is not in evidence.aws_accounts",
                evidence.account
            )));
        }
        Ok(evidence)
    }

    fn gcp(&self, identity: &str, gcp: &Value, now: i64) -> Result<Evidence, EvidenceError> {
        if self.gcp.is_empty() {
            return Err(EvidenceError::Unconfigured("gcp"));
        }
        let token = gcp.get("token").and_then(Value::as_str).ok_or_else(|| {
            EvidenceError::Malformed(format!("facts.{FACT}.gcp.token is not a string"))
        })?;
        let claims = verify_rs256_jws(token, &self.gcp).map_err(|e| match e {
            choria_wire::security::tokens::TokenError::InvalidSignature => {
                EvidenceError::Signature("gcp", NOT_CONFIGURED.into())
            }
            other if other.to_string().contains("none of the given keys") => {
                EvidenceError::Malformed(format!(
                    "the GCP identity token: {other}; Google rotates its signing keys: refresh evidence.gcp_certificates from https://www.googleapis.com/oauth2/v1/certs"
                ))
            }
            other => EvidenceError::Malformed(format!("the GCP identity token: {other}")),
        })?;
        let audience = self.gcp_audience.replace(IDENTITY_PLACEHOLDER, identity);
        let evidence = parse::gcp_claims(&claims, &audience, now, CLOCK_SKEW)
            .map_err(EvidenceError::Refused)?;
        if !self.gcp_projects.is_empty() && !self.gcp_projects.contains(&evidence.account) {
            return Err(EvidenceError::Refused(format!(
                "GCP project {} is not in evidence.gcp_projects",
                evidence.account
            )));
        }
        Ok(evidence)
    }
}

impl Verifier {
    /// The Azure attested document: a certificate for `metadata.azure.com`
    /// (or a sovereign cloud's domain, or a subdomain) issued by one of
    /// `azure_certificates` signed it, and it has not expired.
    fn azure(&self, azure: &Value, now: i64) -> Result<Evidence, EvidenceError> {
        if self.azure.is_empty() {
            return Err(EvidenceError::Unconfigured("azure"));
        }
        let text = azure
            .get("signature")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                EvidenceError::Malformed(format!("facts.{FACT}.azure.signature is not a string"))
            })?;
        let signed = self.pkcs7("azure", "azure.signature", text, &self.azure, now)?;
        let azure_named = signed.signer_names.iter().any(|n| {
            AZURE_SIGNERS
                .iter()
                .any(|d| n == d || n.ends_with(&format!(".{d}")))
        });
        if !azure_named {
            return Err(EvidenceError::Refused(format!(
                "the Azure attested document is not signed by a certificate for {}",
                AZURE_SIGNERS.join(", ")
            )));
        }
        let evidence =
            parse::azure_document(&signed.content, now).map_err(EvidenceError::Refused)?;
        // UUIDs: the same in either case.
        let listed = |s: &String| s.eq_ignore_ascii_case(&evidence.account);
        if !self.azure_subscriptions.is_empty() && !self.azure_subscriptions.iter().any(listed) {
            return Err(EvidenceError::Refused(format!(
                "Azure subscription {} is not in evidence.azure_subscriptions",
                evidence.account
            )));
        }
        Ok(evidence)
    }

    /// A base64 PKCS#7 SignedData from `facts.instance_identity.<field>`,
    /// verified with `anchors`.
    fn pkcs7(
        &self,
        provider: &'static str,
        field: &str,
        text: &str,
        anchors: &[RsaPublicKey],
        now: i64,
    ) -> Result<pkcs7::Signed, EvidenceError> {
        let der = parse::base64(text)
            .map_err(|e| EvidenceError::Malformed(format!("facts.{FACT}.{field}: {e}")))?;
        pkcs7::verify(&der, anchors, now).map_err(|e| match e {
            pkcs7::Pkcs7Error::Signature(why) => EvidenceError::Signature(provider, why),
            pkcs7::Pkcs7Error::Malformed(e) => {
                EvidenceError::Malformed(format!("facts.{FACT}.{field}: {e}"))
            }
        })
    }
}

/// The names (and their subdomains, as `eastus.metadata.azure.com`) of
/// the certificates Azure signs attested documents with: the public cloud,
/// Azure Government, Azure in China, Azure Germany. The certificate must
/// still be issued by one of `azure_certificates`.
const AZURE_SIGNERS: [&str; 4] = [
    "metadata.azure.com",
    "metadata.azure.us",
    "metadata.azure.cn",
    "metadata.microsoftazure.de",
];

fn read(path: &Path, what: &'static str) -> Result<String, EvidenceError> {
    std::fs::read_to_string(path).map_err(|source| EvidenceError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn load(path: &Path, what: &'static str, reason: String) -> EvidenceError {
    EvidenceError::Load {
        what,
        path: path.to_path_buf(),
        reason,
    }
}

/// An RSA public key from a PEM certificate or public key.
fn rsa_key(pem: &str) -> Result<RsaPublicKey, String> {
    match TokenVerifyKey::from_pem_or_hex(pem.trim_start().as_bytes()) {
        Ok(TokenVerifyKey::Rsa(k)) => Ok(k),
        Ok(_) => Err("not an RSA key".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// `evidence:` at work: the verifier, and the bindings' buckets (connected
/// on first use, and again after a failure, which refuses only the node
/// at hand: it is retried at the next discovery).
pub struct Gate {
    pub verifier: Verifier,
    bindings: Option<BindingsLink>,
}

struct BindingsLink {
    records: choria_config::day_two::RecordsConfig,
    site: String,
    name: String,
    instances: tokio::sync::OnceCell<bindings::Bindings>,
    names: tokio::sync::OnceCell<bindings::Bindings>,
}

/// What the bindings say of an instance presented under an identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Free to bind, or bound to each other already.
    Fits,
    /// The instance is bound to another identity, named.
    InstanceElsewhere(String),
    /// The identity is bound to another instance, named.
    NameElsewhere(String),
}

/// What binding wrote: whether a value not ours was found over a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub forgery_replaced: bool,
}

impl Gate {
    /// `None` without `evidence:`; an error names the file that is wrong.
    pub fn load(
        cfg: &choria_config::ProvisionerConfig,
        me: &str,
    ) -> Result<Option<Gate>, EvidenceError> {
        let Some(e) = &cfg.evidence else {
            return Ok(None);
        };
        let bindings = match (&cfg.records, e.one_identity_per_instance) {
            (Some(records), true) => Some(BindingsLink {
                records: records.clone(),
                site: cfg.site.clone(),
                name: format!("choria-provisioner instance bindings {me}"),
                instances: tokio::sync::OnceCell::new(),
                names: tokio::sync::OnceCell::new(),
            }),
            _ => None,
        };
        Ok(Some(Gate {
            verifier: Verifier::load(e)?,
            bindings,
        }))
    }

    /// What the bindings say of `evidence`'s instance under `identity`,
    /// without writing (with `one_identity_per_instance`).
    pub async fn check(
        &self,
        evidence: &Evidence,
        identity: &str,
    ) -> Result<Verdict, crate::records::store::RecordsError> {
        let Some(link) = &self.bindings else {
            return Ok(Verdict::Fits);
        };
        let instance = evidence.instance();
        let instances = link.store(bindings::Side::Instances).await?;
        if let bindings::Bound::Other(name) = instances.check(&instance, identity).await? {
            return Ok(Verdict::InstanceElsewhere(name));
        }
        let names = link.store(bindings::Side::Names).await?;
        if let bindings::Bound::Other(other) = names.check(identity, &instance).await? {
            return Ok(Verdict::NameElsewhere(other));
        }
        Ok(Verdict::Fits)
    }

    /// Binds `evidence`'s instance and `identity` to each other (with
    /// `one_identity_per_instance`); `take_name` moves the name from the
    /// instance it was bound to (the caller judged it may). A binding that
    /// another replica wrote meanwhile is the verdict's.
    pub async fn bind(
        &self,
        evidence: &Evidence,
        identity: &str,
        take_name: bool,
        now: i64,
    ) -> Result<Result<Written, Verdict>, crate::records::store::RecordsError> {
        let Some(link) = &self.bindings else {
            return Ok(Ok(Written {
                forgery_replaced: false,
            }));
        };
        use crate::bindings::Bound;
        let instance = evidence.instance();
        let instances = link.store(bindings::Side::Instances).await?;
        let first = match instances.bind(&instance, identity, false, now).await? {
            Bound::Other(name) => return Ok(Err(Verdict::InstanceElsewhere(name))),
            b => b,
        };
        let names = link.store(bindings::Side::Names).await?;
        let second = match names.bind(identity, &instance, take_name, now).await? {
            Bound::Other(other) => return Ok(Err(Verdict::NameElsewhere(other))),
            b => b,
        };
        Ok(Ok(Written {
            forgery_replaced: first == Bound::ReplacedForgery || second == Bound::ReplacedForgery,
        }))
    }
}

impl Gate {
    /// The names' bucket (`<records.bucket>_NAMES`), connected on first
    /// use; `None` without `one_identity_per_instance`.
    pub async fn names(
        &self,
    ) -> Result<Option<&bindings::Bindings>, crate::records::store::RecordsError> {
        match &self.bindings {
            Some(link) => link.store(bindings::Side::Names).await.map(Some),
            None => Ok(None),
        }
    }
}

impl BindingsLink {
    /// The bucket of `side`, connected on first use.
    async fn store(
        &self,
        side: bindings::Side,
    ) -> Result<&bindings::Bindings, crate::records::store::RecordsError> {
        let cell = match side {
            bindings::Side::Instances => &self.instances,
            bindings::Side::Names => &self.names,
        };
        cell.get_or_try_init(|| async {
            let (key, verifier) = crate::records::store::seal_keys(&self.records)?;
            bindings::Bindings::connect_side(
                &self.records,
                side,
                key,
                verifier,
                &self.site,
                &self.name,
            )
            .await
        })
        .await
    }
}
