//! Cloud instance identity evidence the simulated nodes present: each node
//! an AWS instance of its own (`i-` and 17 hex digits of its identity's
//! SHA-256, so a node keeps its instance across fleet runs), with an
//! instance identity document as the instance metadata serves it, signed
//! RSA-SHA256 by a key the user made (standing in for an AWS region's),
//! in the node's facts as `instance_identity.aws` (the `signature` form).
//! So a provisioner's `evidence:` section, its admission policy over
//! `input.evidence`, one name one instance and revocation can be tried on
//! one machine: `evidence.aws_certificates` names the key's certificate.

use choria_wire::security::rsa_signer::RsaSigningKey;
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs8::DecodePrivateKey;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// `--evidence-key` and what the documents say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidenceOptions {
    /// The RSA private key (PEM, PKCS#8 or PKCS#1) that signs every
    /// document.
    pub key: PathBuf,
    /// The AWS account the instances are in (12 digits).
    pub account: String,
    /// The region the documents name.
    pub region: String,
}

impl EvidenceOptions {
    pub fn new(key: PathBuf) -> Self {
        EvidenceOptions {
            key,
            account: "123456789012".into(),
            region: "eu-west-1".into(),
        }
    }
}

/// Signs each node's document.
pub struct EvidenceSigner {
    key: RsaSigningKey,
    account: String,
    region: String,
    /// When every instance was launched: the fleet's start (`pendingTime`).
    launched: String,
}

impl std::fmt::Debug for EvidenceSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceSigner")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl EvidenceSigner {
    /// Loads the key; an error names the file and never shows the key.
    pub fn load(opts: &EvidenceOptions) -> Result<Self, String> {
        if opts.account.len() != 12 || !opts.account.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "--evidence-account {:?} is not 12 digits",
                opts.account
            ));
        }
        let pem = std::fs::read_to_string(&opts.key)
            .map_err(|e| format!("--evidence-key {}: {e}", opts.key.display()))?;
        let key = rsa::RsaPrivateKey::from_pkcs8_pem(&pem)
            .or_else(|_| rsa::RsaPrivateKey::from_pkcs1_pem(&pem))
            .map_err(|_| not_a_key(&opts.key))?;
        Ok(EvidenceSigner {
            key: RsaSigningKey::new(key),
            account: opts.account.clone(),
            region: opts.region.clone(),
            launched: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        })
    }

    /// The instance `identity` runs on: `i-` and 17 hex digits.
    pub fn instance_id(identity: &str) -> String {
        let digest = hex::encode(Sha256::digest(identity.as_bytes()));
        format!("i-{}", &digest[..17])
    }

    /// `facts` with `instance_identity.aws` set for `identity`.
    pub fn facts(&self, identity: &str, facts: &Value) -> Result<Value, String> {
        let document = format!(
            "{{\n  \"accountId\" : \"{account}\",\n  \"architecture\" : \"x86_64\",\n  \
             \"availabilityZone\" : \"{region}a\",\n  \"imageId\" : \"ami-0c0ffee0c0ffee000\",\n  \
             \"instanceId\" : \"{instance}\",\n  \"instanceType\" : \"t3.micro\",\n  \
             \"pendingTime\" : \"{launched}\",\n  \"privateIp\" : \"10.0.0.10\",\n  \
             \"region\" : \"{region}\",\n  \"version\" : \"2017-09-30\"\n}}",
            account = self.account,
            region = self.region,
            instance = Self::instance_id(identity),
            launched = self.launched,
        );
        let signature = self.key.sign_sha256(document.as_bytes())?;
        let mut out = match facts {
            Value::Object(m) => m.clone(),
            _ => serde_json::Map::new(),
        };
        out.insert(
            "instance_identity".into(),
            json!({"aws": {
                "document": document,
                "signature": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, signature),
            }}),
        );
        Ok(Value::Object(out))
    }
}

fn not_a_key(path: &Path) -> String {
    format!(
        "--evidence-key {}: not an RSA private key in PEM (make one with openssl genpkey -algorithm RSA)",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_is_an_instance_of_its_own_and_keeps_it() {
        let a = EvidenceSigner::instance_id("node-000.fleet.example.net");
        let b = EvidenceSigner::instance_id("node-001.fleet.example.net");
        assert_ne!(a, b);
        assert_eq!(a, EvidenceSigner::instance_id("node-000.fleet.example.net"));
        assert!(a.starts_with("i-") && a.len() == 19, "{a}");
    }

    #[test]
    fn a_file_that_is_not_a_key_is_named_and_not_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("not-a-key.pem");
        std::fs::write(
            &path,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let e = EvidenceSigner::load(&EvidenceOptions::new(path)).unwrap_err();
        assert!(
            e.contains("not-a-key.pem") && !e.contains("c2VjcmV0"),
            "{e}"
        );
        let mut bad = EvidenceOptions::new(dir.path().join("k.pem"));
        bad.account = "1234".into();
        assert!(EvidenceSigner::load(&bad)
            .unwrap_err()
            .contains("12 digits"));
    }
}
