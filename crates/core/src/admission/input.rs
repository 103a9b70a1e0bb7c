//! The document the admission policy reads as `input`, made from what a
//! node told us (all of it checked already, none of it trusted more for
//! being here) and what we know of the node.
//!
//! ```json
//! {
//!   "identity": "n1.example.net",
//!   "protocol": "v2",
//!   "site": "dc1",
//!   "version": "0.30.2",
//!   "facts": {"...": "..."},
//!   "agents": ["choria_provision", "rpcutil"],
//!   "collectives": ["provisioning"],
//!   "classes": [],
//!   "inventory": {"...": "the rest of the rpcutil#inventory reply"},
//!   "csr": {"common_name": "n1.example.net", "dns_names": [], "ip_addresses": [], "email_addresses": [], "uris": []},
//!   "jwt": {"chs": true, "chu": "...", "ou": "...", "extensions": {}, "exp": 1767225600},
//!   "ed25519_public_key": "hex",
//!   "evidence": {"provider": "aws", "instance": "aws.123456789012.i-0abc", "account": "123456789012", "instance_id": "i-0abc", "region": "eu-west-1", "launched_unix": 1765000000, "details": {}},
//!   "record": {"provisioned_unix": 1765000000, "expires_unix": 1765086400, "renewal_asked_unix": 0, "holds_unasked": true}
//! }
//! ```
//!
//! `inventory` holds what the reply has besides the fields above (each
//! value is given once: a node's facts can be large, and every byte is
//! converted for the policy). `csr`, `jwt` and `ed25519_public_key` are
//! `null` when the feature that
//! fetches them is off. The provisioning JWT's token (`cht`) and broker
//! password (`chpwd`) are left out: a policy has no use for them, and a
//! policy's `print` or a test's input file should not carry them.

use super::PolicyError;
use choria_wire::security::tokens::ProvisioningClaims;
use regorus::Value as R;
use serde_json::{json, Value};

/// Claims of the provisioning JWT never given to a policy.
const SECRET_CLAIMS: [&str; 2] = ["cht", "chpwd"];

/// What a node told us, and what we know of it.
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeInput<'a> {
    pub identity: &'a str,
    /// `v1` or `v2`.
    pub protocol: &'a str,
    pub site: &'a str,
    /// The `rpcutil#inventory` reply as JSON text.
    pub inventory: &'a str,
    /// The CSR's PEM, with the `pki` feature.
    pub csr: Option<&'a str>,
    /// The verified provisioning JWT's claims, with the `jwt` feature.
    pub jwt: Option<&'a ProvisioningClaims>,
    /// The node's ed25519 public key (hex), with the `ed25519` feature.
    pub ed25519_public_key: Option<&'a str>,
    /// What the records say it holds (with `records:`).
    pub record: Option<crate::held::Standing>,
    /// Its verified instance identity (with `evidence:`).
    pub evidence: Option<&'a crate::evidence::Evidence>,
}

impl NodeInput<'_> {
    /// The `input` document, as JSON (what `policy eval --input` reads).
    pub fn document(&self) -> Result<Value, PolicyError> {
        serde_json::to_value(self.value()?)
            .map_err(|e| PolicyError::Input(format!("the document as JSON: {e}")))
    }

    /// The `input` document as the policy engine holds it. Built in the
    /// engine's own values, the inventory parsed straight into them: going
    /// through `serde_json::Value` first cost a node as much again as
    /// evaluating the policy (`benches/admission.rs`).
    pub fn value(&self) -> Result<R, PolicyError> {
        let mut inventory = if self.inventory.trim().is_empty() {
            R::new_object()
        } else {
            // Not `R::from_json_str`: it shares repeated keys through a
            // table made for each parse, which costs more than it saves for
            // one node's inventory.
            serde_json::from_str::<R>(self.inventory)
                .map_err(|e| PolicyError::Input(format!("the inventory is not JSON: {e}")))?
        };
        let rest = inventory
            .as_object_mut()
            .map_err(|_| PolicyError::Input("the inventory is not an object".into()))?;
        let mut field = |name: &str, empty: R| rest.remove(&R::from(name)).unwrap_or(empty);
        let version = field("version", R::from(""));
        let facts = field("facts", R::new_object());
        let agents = field("agents", R::new_array());
        let collectives = field("collectives", R::new_array());
        let classes = field("classes", R::new_array());
        let jwt = match self.jwt {
            Some(claims) => {
                let mut v = serde_json::to_value(claims)
                    .map_err(|e| PolicyError::Input(format!("the JWT's claims: {e}")))?;
                if let Some(map) = v.as_object_mut() {
                    for secret in SECRET_CLAIMS {
                        map.remove(secret);
                    }
                }
                R::from(v)
            }
            None => R::Null,
        };
        let record = match self.record {
            Some(r) => object([
                ("provisioned_unix", R::from(r.provisioned_unix)),
                ("expires_unix", R::from(r.expires_unix)),
                ("renewal_asked_unix", R::from(r.renewal_asked_unix)),
                (
                    "holds_unasked",
                    R::from(r.holds_unasked(chrono::Utc::now().timestamp())),
                ),
            ]),
            None => R::Null,
        };
        Ok(object([
            ("identity", R::from(self.identity)),
            ("protocol", R::from(self.protocol)),
            ("site", R::from(self.site)),
            ("version", version),
            ("facts", facts),
            ("agents", agents),
            ("collectives", collectives),
            ("classes", classes),
            ("csr", self.csr.map_or(R::Null, |pem| R::from(csr(pem)))),
            ("jwt", jwt),
            (
                "ed25519_public_key",
                self.ed25519_public_key.map_or(R::Null, R::from),
            ),
            (
                "evidence",
                self.evidence
                    .map_or(R::Null, |e| R::from(crate::evidence::Evidence::input(e))),
            ),
            ("record", record),
            ("inventory", inventory),
        ]))
    }
}

/// An object of the engine's values.
fn object<const N: usize>(fields: [(&str, R); N]) -> R {
    R::from(
        fields
            .into_iter()
            .map(|(k, v)| (R::from(k), v))
            .collect::<std::collections::BTreeMap<_, _>>(),
    )
}

/// The names a CSR asks for; `null` when it cannot be read (it was checked
/// when it arrived, so that does not happen for a node in a sequence).
fn csr(pem: &str) -> Value {
    match choria_wire::security::csr::parse_csr(pem) {
        Ok(info) => json!({
            "common_name": info.common_name,
            "dns_names": info.dns_names,
            "ip_addresses": info.ip_addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "email_addresses": info.email_addresses,
            "uris": info.uris,
        }),
        Err(_) => Value::Null,
    }
}
