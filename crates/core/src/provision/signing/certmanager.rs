//! cert-manager as the signer of the nodes' certificates (`cert_manager:`).
//!
//! With `features.pki`, once a node's CSR passed our checks (name, deny
//! list, key), a `cert-manager.io/v1` `CertificateRequest` carrying it is
//! created in the configured namespace, and followed through one watch of
//! our requests ([`requests`]) until cert-manager decides: `Ready=True` gives the certificate and CA sent to the node;
//! `Denied`, `InvalidRequest` or `Ready=False` with reason `Failed` are
//! errors naming the request; no decision within `timeout` is an error that
//! says what cert-manager last said (an issuer that does not exist leaves
//! requests `Pending`). The node is retried on a later cycle like any other
//! failure. Each request is labelled as ours, annotated with the node's
//! identity (a label cannot hold every identity), owned by the Provisioner
//! when we run as one (so deleting it collects them), and deleted after use
//! or after `keep` — and at the latest when the process stops, however the
//! node's sequence ended (abandoned, dropped).
//!
//! The kube client is the process's one, passed in; when it could not be
//! made, the provisioner still starts and fails only the nodes that need a
//! certificate, with the reason.

mod requests;

use crate::provision::gate::{PauseGate, Paused};
use base64::Engine;
use choria_config::provisioner::CertManagerConfig;
use choria_k8s::certificate_request::{
    CertificateRequest, CertificateRequestSpec, CertificateRequestStatus, IssuerRef,
};
use choria_k8s::crd::ResourceRef;
use choria_k8s::Kube;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use requests::Requests;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How long past `timeout` + `keep` a request an earlier process left
/// behind is deleted: it cannot be in use any more.
const LEFTOVER_MARGIN: Duration = Duration::from_secs(60);
/// The label every request we make carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "choria-provisioner");
/// The label naming the Provisioner that made the request.
pub const PROVISIONER_LABEL: &str = "provisioning.choria.io/provisioner";
/// The annotation holding the node's identity.
pub const NODE_ANNOTATION: &str = "provisioning.choria.io/node";

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("cannot reach Kubernetes for cert-manager: {0}")]
    Client(String),
    #[error("could not create a CertificateRequest in namespace {namespace}: {message}")]
    Create { namespace: String, message: String },
    #[error("CertificateRequest {request} was denied ({reason}: {message})")]
    Denied {
        request: String,
        reason: String,
        message: String,
    },
    #[error("CertificateRequest {request} failed ({reason}: {message})")]
    Failed {
        request: String,
        reason: String,
        message: String,
    },
    #[error("CertificateRequest {request} was not issued within {timeout:?} (last: {last})")]
    Timeout {
        request: String,
        timeout: Duration,
        last: String,
    },
    #[error("CertificateRequest {request}: {message}")]
    Lookup { request: String, message: String },
    #[error("{0}")]
    Paused(#[from] Paused),
    #[error("shutting down")]
    Abandoned,
}

impl SignError {
    /// The metric label.
    pub fn outcome(&self) -> &'static str {
        match self {
            SignError::Denied { .. } => "denied",
            SignError::Failed { .. } => "failed",
            SignError::Timeout { .. } => "timeout",
            _ => "error",
        }
    }
}

/// What cert-manager says about a request.
#[derive(Debug, PartialEq, Eq)]
pub enum State {
    Issued { certificate: String, ca: String },
    Denied { reason: String, message: String },
    Failed { reason: String, message: String },
    Pending { reason: String, message: String },
}

/// Reads a request's `status` (pure, for tests).
pub fn state(status: Option<&CertificateRequestStatus>) -> State {
    let Some(status) = status else {
        return no_decision();
    };
    let find = |t: &str| {
        status
            .condition(t)
            .map(|c| (c.status.as_str(), c.reason.clone(), short(&c.message)))
    };
    if let Some(("True", reason, message)) = find("Denied") {
        return State::Denied { reason, message };
    }
    if let Some(("True", reason, message)) = find("InvalidRequest") {
        return State::Failed { reason, message };
    }
    match find("Ready") {
        Some(("True", _, _)) => {
            let decode = |field: &Option<String>| {
                field
                    .as_deref()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .and_then(|d| String::from_utf8(d).ok())
                    .unwrap_or_default()
            };
            let certificate = decode(&status.certificate);
            if certificate.is_empty() {
                // Ready without a certificate is not something to send.
                return State::Pending {
                    reason: "Issued".into(),
                    message: "Ready but status.certificate is empty or not base64 PEM".into(),
                };
            }
            State::Issued {
                certificate,
                ca: decode(&status.ca),
            }
        }
        Some((_, reason, message)) if reason == "Failed" || reason == "Denied" => {
            State::Failed { reason, message }
        }
        Some((_, reason, message)) => State::Pending { reason, message },
        None => no_decision(),
    }
}

fn no_decision() -> State {
    State::Pending {
        reason: "NoDecision".into(),
        message:
            "no Ready condition yet (is cert-manager running, and does the request need approval?)"
                .into(),
    }
}

/// What cert-manager writes is not ours: one line, cut short.
fn short(s: &str) -> String {
    crate::provision::text::one_line(s, 300)
}

/// A name prefix from an identity: a DNS label's characters, at most 40.
pub fn name_prefix(identity: &str) -> String {
    let mut p: String = identity
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    p = p.trim_matches('-').to_string();
    if p.is_empty() {
        p = "node".into();
    }
    format!("{p}-")
}

/// The issued certificate and its CA (PEM).
#[derive(Debug)]
pub struct Issued {
    pub certificate: String,
    pub ca: String,
}

pub struct Signer {
    cfg: CertManagerConfig,
    provisioner: Option<ResourceRef>,
    kube: Kube,
    owner: OnceCell<Option<OwnerReference>>,
    requests: OnceCell<Requests>,
}

impl Signer {
    /// `provisioner`: the Provisioner we run as (`run --provisioner`); it
    /// owns the requests when it lives in their namespace.
    pub fn new(cfg: CertManagerConfig, kube: Kube, provisioner: Option<ResourceRef>) -> Self {
        Signer {
            cfg,
            provisioner,
            kube,
            owner: OnceCell::new(),
            requests: OnceCell::new(),
        }
    }

    /// The request object (pure, for tests).
    pub fn request_body(
        &self,
        identity: &str,
        csr_pem: &str,
        owner: Option<&OwnerReference>,
    ) -> CertificateRequest {
        let mut labels = BTreeMap::from([(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string())]);
        if let Some(p) = &self.provisioner {
            labels.insert(PROVISIONER_LABEL.into(), p.name.clone());
        }
        let spec = CertificateRequestSpec {
            request: base64::engine::general_purpose::STANDARD.encode(csr_pem),
            issuer_ref: IssuerRef {
                name: self.cfg.issuer.clone(),
                kind: self.cfg.issuer_kind.clone(),
                group: self.cfg.issuer_group.clone(),
            },
            usages: self.cfg.usages.clone(),
            duration: self.cfg.duration.map(|d| format!("{}s", d.as_secs())),
            is_ca: None,
        };
        let mut request = CertificateRequest::new("", spec);
        request.metadata = ObjectMeta {
            name: None,
            generate_name: Some(name_prefix(identity)),
            namespace: Some(self.cfg.namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                NODE_ANNOTATION.to_string(),
                identity.to_string(),
            )])),
            owner_references: owner.map(|o| vec![o.clone()]),
            ..ObjectMeta::default()
        };
        request
    }

    fn client(&self) -> Result<kube::Client, SignError> {
        self.kube.client().map_err(SignError::Client)
    }

    /// The Provisioner's owner reference, looked up once.
    async fn owner(&self, client: &kube::Client) -> Result<Option<OwnerReference>, SignError> {
        let Some(p) = self
            .provisioner
            .as_ref()
            .filter(|p| p.namespace == self.cfg.namespace)
        else {
            return Ok(None);
        };
        self.owner
            .get_or_try_init(|| async {
                p.owner(client.clone())
                    .await
                    .map(Some)
                    .map_err(|e| SignError::Client(format!("to own the CertificateRequests: {e}")))
            })
            .await
            .cloned()
    }

    /// Our requests (the ones labelled with our Provisioner, else all the
    /// provisioner's), watched from first use on.
    async fn requests(&self) -> Result<&Requests, SignError> {
        let client = self.client()?;
        self.requests
            .get_or_init(|| async {
                let api = Api::namespaced(client.clone(), &self.cfg.namespace);
                let mut selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
                if let Some(p) = &self.provisioner {
                    selector.push_str(&format!(",{PROVISIONER_LABEL}={}", p.name));
                }
                // Only a Provisioner's requests are known to be ours alone.
                let leftovers = self
                    .provisioner
                    .as_ref()
                    .map(|_| self.cfg.timeout + self.cfg.keep + LEFTOVER_MARGIN);
                Requests::start(api, &selector, leftovers)
            })
            .await;
        Ok(self.requests.get().expect("initialized above"))
    }

    /// Has `csr_pem` signed for `identity`. The gate is read before the
    /// request is made and whenever it closes; the request is deleted
    /// however this ends (after `keep` when set).
    pub async fn sign(
        &self,
        identity: &str,
        csr_pem: &str,
        gate: &PauseGate,
        abandon: &CancellationToken,
    ) -> Result<Issued, SignError> {
        gate.check()?;
        let client = self.client()?;
        let owner = self.owner(&client).await?;
        let requests = self.requests().await?;
        let api: Api<CertificateRequest> = Api::namespaced(client.clone(), &self.cfg.namespace);
        let body = self.request_body(identity, csr_pem, owner.as_ref());
        let created = api
            .create(&PostParams::default(), &body)
            .await
            .map_err(|e| SignError::Create {
                namespace: self.cfg.namespace.clone(),
                message: choria_k8s::describe_error(&e),
            })?;
        let name = created.metadata.name.clone().unwrap_or_default();
        // Deleted after `keep` however this ends, dropped futures included.
        let _disposal = Disposal {
            requests,
            name: &name,
            keep: self.cfg.keep,
        };
        let request = format!("{}/{name}", self.cfg.namespace);
        debug!(node = identity, %request, "CertificateRequest created");
        self.wait(requests, &name, &request, gate, abandon).await
    }

    /// Waits for cert-manager's decision on `name`, woken by the watch.
    async fn wait(
        &self,
        requests: &Requests,
        name: &str,
        request: &str,
        gate: &PauseGate,
        abandon: &CancellationToken,
    ) -> Result<Issued, SignError> {
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let waiter = requests.waiter(name);
        let mut paused = gate.subscribe();
        let mut seen = false;
        let mut last = State::Pending {
            reason: "NoDecision".into(),
            message: "not seen by the watch yet".into(),
        };
        loop {
            gate.check()?;
            match requests.get(name) {
                Some(obj) => {
                    seen = true;
                    last = state(obj.status.as_ref());
                }
                None if seen => {
                    return Err(SignError::Lookup {
                        request: request.into(),
                        message: "deleted before it was issued".into(),
                    })
                }
                None => {}
            }
            match last {
                State::Issued { certificate, ca } => return Ok(Issued { certificate, ca }),
                State::Denied { reason, message } => {
                    return Err(SignError::Denied {
                        request: request.into(),
                        reason,
                        message,
                    })
                }
                State::Failed { reason, message } => {
                    return Err(SignError::Failed {
                        request: request.into(),
                        reason,
                        message,
                    })
                }
                State::Pending { .. } => {}
            }
            tokio::select! {
                _ = waiter.changed() => {}
                _ = paused.wait_for(|p| *p) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let State::Pending { reason, message } = last else {
                        unreachable!("decided states returned above")
                    };
                    return Err(SignError::Timeout {
                        request: request.into(),
                        timeout: self.cfg.timeout,
                        last: format!("{reason}: {message}"),
                    });
                }
                _ = abandon.cancelled() => return Err(SignError::Abandoned),
            }
        }
    }

    /// Deletes at once every request still waiting for its `keep` to pass:
    /// none outlives the process. Called at shutdown, after the workers.
    pub async fn shutdown(&self) {
        if let Some(r) = self.requests.get() {
            let pending = r.pending();
            r.finish().await;
            debug!(pending, "CertificateRequests deleted at shutdown");
        }
    }
}

/// Schedules a request's deletion when dropped.
struct Disposal<'a> {
    requests: &'a Requests,
    name: &'a str,
    keep: Duration,
}

impl Drop for Disposal<'_> {
    fn drop(&mut self) {
        self.requests.delete_after(self.name, self.keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn cfg() -> CertManagerConfig {
        CertManagerConfig {
            issuer: "choria-ca".into(),
            issuer_kind: "ClusterIssuer".into(),
            issuer_group: "cert-manager.io".into(),
            namespace: "choria".into(),
            duration: Some(Duration::from_secs(90 * 24 * 3600)),
            usages: vec!["server auth".into(), "client auth".into()],
            timeout: Duration::from_secs(5),
            keep: Duration::ZERO,
        }
    }

    #[test]
    fn the_request_carries_the_csr_issuer_labels_owner_and_node() {
        let p: ResourceRef = "choria/prov".parse().unwrap();
        let s = Signer::new(cfg(), Kube::unavailable("a test"), Some(p));
        let owner = OwnerReference {
            api_version: "provisioning.choria.io/v1alpha1".into(),
            kind: "Provisioner".into(),
            name: "prov".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        let b = serde_json::to_value(s.request_body(
            "Web1.Example.NET",
            "-----BEGIN CERTIFICATE REQUEST-----\n",
            Some(&owner),
        ))
        .unwrap();
        assert_eq!(b["metadata"]["generateName"], "web1-example-net-");
        assert_eq!(b["metadata"]["namespace"], "choria");
        assert_eq!(b["metadata"]["labels"][PROVISIONER_LABEL], "prov");
        assert_eq!(b["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(
            b["metadata"]["annotations"][NODE_ANNOTATION],
            "Web1.Example.NET"
        );
        assert_eq!(b["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(
            b["spec"]["issuerRef"],
            json!({"name": "choria-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
        assert_eq!(b["spec"]["duration"], "7776000s");
        assert_eq!(b["spec"]["usages"], json!(["server auth", "client auth"]));
        let csr = base64::engine::general_purpose::STANDARD
            .decode(b["spec"]["request"].as_str().unwrap())
            .unwrap();
        assert_eq!(csr, b"-----BEGIN CERTIFICATE REQUEST-----\n");
        let b = serde_json::to_value(
            Signer::new(
                CertManagerConfig {
                    duration: None,
                    ..cfg()
                },
                Kube::unavailable("a test"),
                None,
            )
            .request_body("n", "x", None),
        )
        .unwrap();
        assert!(b["spec"].get("duration").is_none(), "the issuer's default");
        assert!(b["metadata"].get("ownerReferences").is_none());
        assert!(b["metadata"]["labels"].get(PROVISIONER_LABEL).is_none());
    }

    #[test]
    fn name_prefixes_are_dns_labels() {
        assert_eq!(name_prefix("a.b_c"), "a-b-c-");
        assert_eq!(name_prefix("---"), "node-");
        assert_eq!(name_prefix(&"x".repeat(100)).len(), 41);
    }

    fn with(conditions: Value, status: Value) -> Option<CertificateRequestStatus> {
        let mut s = status;
        s["conditions"] = conditions;
        Some(serde_json::from_value(s).unwrap())
    }

    #[test]
    fn cert_manager_states_are_read_as_it_writes_them() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        // As seen from cert-manager v1.21.2 (tests/it/cert_manager.rs runs it).
        let issued = with(
            json!([{"type": "Approved", "status": "True", "reason": "cert-manager.io"},
                   {"type": "Ready", "status": "True", "reason": "Issued", "message": "Certificate fetched from issuer successfully"}]),
            json!({"certificate": b64("CERT"), "ca": b64("CA")}),
        );
        assert_eq!(
            state(issued.as_ref()),
            State::Issued {
                certificate: "CERT".into(),
                ca: "CA".into()
            }
        );
        let pending = with(
            json!([{"type": "Ready", "status": "False", "reason": "Pending",
                    "message": "Referenced \"Issuer\" not found: issuer.cert-manager.io \"no-such-issuer\" not found"}]),
            json!({}),
        );
        assert!(
            matches!(state(pending.as_ref()), State::Pending { ref reason, ref message }
            if reason == "Pending" && message.contains("no-such-issuer"))
        );
        let denied = with(
            json!([{"type": "Denied", "status": "True", "reason": "policy", "message": "no"},
                   {"type": "Ready", "status": "False", "reason": "Denied"}]),
            json!({}),
        );
        assert_eq!(
            state(denied.as_ref()),
            State::Denied {
                reason: "policy".into(),
                message: "no".into()
            }
        );
        let failed = with(
            json!([{"type": "Ready", "status": "False", "reason": "Failed", "message": "bad\nCSR"}]),
            json!({"failureTime": "x"}),
        );
        assert_eq!(
            state(failed.as_ref()),
            State::Failed {
                reason: "Failed".into(),
                message: "bad CSR".into()
            }
        );
        let invalid = with(
            json!([{"type": "InvalidRequest", "status": "True", "reason": "UnsupportedIssuer", "message": "m"}]),
            json!({}),
        );
        assert!(
            matches!(state(invalid.as_ref()), State::Failed { ref reason, .. } if reason == "UnsupportedIssuer")
        );
        assert!(matches!(state(None), State::Pending { ref reason, .. } if reason == "NoDecision"));
        let ready_empty = with(json!([{"type": "Ready", "status": "True"}]), json!({}));
        assert!(matches!(state(ready_empty.as_ref()), State::Pending { .. }));
    }
}
