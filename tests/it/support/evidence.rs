//! Cloud instance identity evidence a test node carries: an AWS region's
//! signing key and certificate made by openssl (RSA 1024, as AWS publishes
//! one per region for the `signature` form), and documents it signs.

use super::gopeers::{openssl, openssl_output};
use std::path::{Path, PathBuf};

pub struct AwsRegion {
    dir: PathBuf,
    /// The certificate `evidence.aws_certificates` names.
    pub cert: PathBuf,
}

impl AwsRegion {
    /// `region.pem` and its key in `dir`.
    pub fn create(dir: &Path) -> AwsRegion {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:1024",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=Amazon Web Services LLC",
                "-keyout",
                "region-key.pem",
                "-out",
                "region.pem",
            ],
        );
        AwsRegion {
            dir: dir.to_path_buf(),
            cert: dir.join("region.pem"),
        }
    }

    /// A document as AWS's instance metadata serves it, for `instance`,
    /// launched now.
    pub fn document(instance: &str) -> String {
        let pending = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        format!(
            "{{\n  \"accountId\" : \"123456789012\",\n  \"architecture\" : \"x86_64\",\n  \"availabilityZone\" : \"eu-west-1a\",\n  \
             \"imageId\" : \"ami-0abc\",\n  \"instanceId\" : \"{instance}\",\n  \"instanceType\" : \"t3.micro\",\n  \
             \"pendingTime\" : \"{pending}\",\n  \"privateIp\" : \"10.0.0.7\",\n  \"region\" : \"eu-west-1\",\n  \"version\" : \"2017-09-30\"\n}}"
        )
    }

    /// A node's facts carrying `document` and its RSA-SHA256 signature by
    /// this region (`name` names the scratch file).
    pub fn facts(&self, name: &str, document: &str) -> serde_json::Value {
        let doc = format!("{name}.document");
        std::fs::write(self.dir.join(&doc), document).unwrap();
        let signature = openssl_output(
            &self.dir,
            &["dgst", "-sha256", "-sign", "region-key.pem", &doc],
        );
        use base64::Engine as _;
        let signature = base64::engine::general_purpose::STANDARD.encode(signature);
        serde_json::json!({
            "role": "web",
            "instance_identity": {"aws": {"document": document, "signature": signature}},
        })
    }
}
