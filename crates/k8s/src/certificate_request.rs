//! cert-manager's `CertificateRequest` (`cert-manager.io/v1`), typed, with
//! only the fields the provisioner writes and reads: the CSR, the issuer,
//! usages, duration and `isCA` in the spec; the conditions, certificate
//! and CA in the status. Unknown fields are ignored on read, so a newer
//! cert-manager's additions do no harm.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// What a `CertificateRequest` asks for.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cert-manager.io",
    version = "v1",
    kind = "CertificateRequest",
    plural = "certificaterequests",
    namespaced,
    status = "CertificateRequestStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequestSpec {
    /// The PEM CSR, base64-encoded (a Go `[]byte`).
    pub request: String,
    pub issuer_ref: IssuerRef,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    /// A Go duration (`2160h0m0s`, `7776000s`); the issuer's default when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Asks for a CA certificate: never by the provisioner, and refused at
    /// admission for its pods (see the operator's admission policy).
    #[serde(default, rename = "isCA", skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
}

/// Which issuer signs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IssuerRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
}

/// What cert-manager says about a request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequestStatus {
    #[serde(default)]
    pub conditions: Vec<RequestCondition>,
    /// The signed certificate, PEM, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// The issuing CA, PEM, base64-encoded, when the issuer tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_time: Option<String>,
}

/// One of `Approved`, `Denied`, `Ready`, `InvalidRequest`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl CertificateRequestStatus {
    /// The condition of `type_`, if cert-manager set it.
    pub fn condition(&self, type_: &str) -> Option<&RequestCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_cert_manager_writes_and_writes_what_it_reads() {
        let status: CertificateRequestStatus = serde_json::from_value(json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "Issued",
                            "message": "ok", "lastTransitionTime": "2026-12-06T00:00:00Z"}],
            "certificate": "Q0VSVA==", "ca": "Q0E=", "somethingNew": 1
        }))
        .unwrap();
        assert_eq!(status.condition("Ready").unwrap().status, "True");
        assert_eq!(status.certificate.as_deref(), Some("Q0VSVA=="));
        let spec = CertificateRequestSpec {
            request: "UEVN".into(),
            issuer_ref: IssuerRef {
                name: "ca".into(),
                kind: "ClusterIssuer".into(),
                group: "cert-manager.io".into(),
            },
            usages: vec!["client auth".into()],
            duration: None,
            is_ca: None,
        };
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"request": "UEVN", "usages": ["client auth"],
                   "issuerRef": {"name": "ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}})
        );
    }
}
