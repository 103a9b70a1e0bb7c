//! Reading what the clouds sign, and the certificates that verify it. Every
//! value kept is checked for where it goes: the instance's key is a KV key
//! and a subject token, the details reach a log line and the audit stream.

use super::{rsa_key, Evidence};
use base64::Engine as _;
use rsa::RsaPublicKey;
use serde_json::{json, Map, Value};

/// The longest detail kept (an image id, an instance name).
const MAX_DETAIL: usize = 128;

/// Every RSA key of a PEM bundle (certificates or public keys), with an
/// empty id.
pub(super) fn pem_keys(text: &str) -> Result<Vec<(String, RsaPublicKey)>, String> {
    let blocks = pem::parse_many(text.as_bytes()).map_err(|e| format!("not PEM: {e}"))?;
    if blocks.is_empty() {
        return Err("holds no PEM certificate or public key".into());
    }
    blocks
        .iter()
        .enumerate()
        .map(|(i, b)| {
            rsa_key(&pem::encode(b))
                .map(|k| (String::new(), k))
                .map_err(|e| format!("PEM block {}: {e}", i + 1))
        })
        .collect()
}

/// Google's certificates: `{"kid": "PEM", ...}` (as
/// `oauth2/v1/certs` serves them), or a PEM bundle.
pub(super) fn google_keys(text: &str) -> Result<Vec<(String, RsaPublicKey)>, String> {
    if !text.trim_start().starts_with('{') {
        return pem_keys(text);
    }
    let map: Map<String, Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON object: {e}"))?;
    if map.is_empty() {
        return Err("holds no certificate".into());
    }
    map.iter()
        .map(|(kid, pem)| {
            let pem = pem
                .as_str()
                .ok_or_else(|| format!("{kid:?} is not a PEM string"))?;
            rsa_key(pem)
                .map(|k| (kid.clone(), k))
                .map_err(|e| format!("{kid:?}: {e}"))
        })
        .collect()
}

pub(super) fn base64(text: &str) -> Result<Vec<u8>, String> {
    // AWS serves the signature with line breaks every 64 characters.
    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .map_err(|e| format!("not base64: {e}"))
}

/// Letters, digits, `-` and `_`, 1 to 64 of them: a KV key's and a subject
/// token's part.
fn token(what: &str, value: Option<&str>) -> Result<String, String> {
    let v = value.ok_or_else(|| format!("{what} is missing or not a string"))?;
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then(|| v.to_string()).ok_or_else(|| {
        format!(
            "{what} {:?} is not letters, digits, - and _ (at most 64)",
            clip(v)
        )
    })
}

/// A printable one-line value of bounded length, or nothing.
fn detail(value: Option<&Value>) -> Value {
    match value.and_then(Value::as_str) {
        Some(s) if s.len() <= MAX_DETAIL && !s.chars().any(char::is_control) => json!(s),
        _ => Value::Null,
    }
}

fn clip(s: &str) -> String {
    s.chars().take(40).filter(|c| !c.is_control()).collect()
}

/// An AWS instance identity document (its signature checked already).
pub(super) fn aws_document(text: &str) -> Result<Evidence, String> {
    let doc: Value =
        serde_json::from_str(text).map_err(|e| format!("the AWS document is not JSON: {e}"))?;
    let s = |k: &str| doc.get(k).and_then(Value::as_str);
    let account = token("accountId", s("accountId"))?;
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("accountId {account:?} is not 12 digits"));
    }
    let launched_unix = match s("pendingTime") {
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| format!("pendingTime {:?}: {e}", clip(t)))?
                .timestamp(),
        ),
        None => None,
    };
    Ok(Evidence {
        provider: "aws",
        account,
        instance_id: token("instanceId", s("instanceId"))?,
        region: token("region", s("region"))?,
        launched_unix,
        details: json!({
            "image_id": detail(doc.get("imageId")),
            "instance_type": detail(doc.get("instanceType")),
            "availability_zone": detail(doc.get("availabilityZone")),
            "architecture": detail(doc.get("architecture")),
            "private_ip": detail(doc.get("privateIp")),
        }),
    })
}

/// The claims of a GCP instance identity token (its signature checked
/// already), for a node presenting itself under `audience`'s name.
pub(super) fn gcp_claims(
    claims: &Value,
    audience: &str,
    now: i64,
    skew: i64,
) -> Result<Evidence, String> {
    let iss = claims
        .get("iss")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if iss != "https://accounts.google.com" && iss != "accounts.google.com" {
        return Err(format!(
            "the GCP token's issuer {:?} is not Google's",
            clip(iss)
        ));
    }
    let for_us = match claims.get("aud") {
        Some(Value::String(a)) => a == audience,
        Some(Value::Array(a)) => a.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !for_us {
        return Err(format!(
            "the GCP token is not for audience {audience:?}: it was made for another name"
        ));
    }
    let exp = claims
        .get("exp")
        .and_then(Value::as_i64)
        .ok_or("the GCP token has no exp")?;
    if now >= exp {
        return Err(format!("the GCP token expired {} s ago", now - exp));
    }
    if claims
        .get("iat")
        .and_then(Value::as_i64)
        .is_some_and(|iat| iat > now + skew)
    {
        return Err("the GCP token was issued in the future".into());
    }
    let ce = claims
        .pointer("/google/compute_engine")
        .ok_or("the GCP token has no google.compute_engine claims (ask for format=full)")?;
    let s = |k: &str| ce.get(k).and_then(Value::as_str);
    Ok(Evidence {
        provider: "gcp",
        account: token("project_id", s("project_id"))?,
        instance_id: token("instance_id", s("instance_id"))?,
        region: token("zone", s("zone"))?,
        launched_unix: ce
            .get("instance_creation_timestamp")
            .and_then(Value::as_i64),
        details: json!({
            "instance_name": detail(ce.get("instance_name")),
            "project_number": ce.get("project_number").and_then(Value::as_i64),
        }),
    })
}

/// The time format of Azure's attested document (`12/13/21 20:38:05 -0000`).
const AZURE_TIME: &str = "%m/%d/%y %H:%M:%S %z";

/// An Azure attested document's content (its signature checked already),
/// unexpired at `now`.
pub(super) fn azure_document(content: &[u8], now: i64) -> Result<Evidence, String> {
    let doc: Value = serde_json::from_slice(content)
        .map_err(|e| format!("the Azure attested document is not JSON: {e}"))?;
    let s = |k: &str| doc.get(k).and_then(Value::as_str);
    let time = |k: &str| -> Result<i64, String> {
        let t = doc
            .pointer(&format!("/timeStamp/{k}"))
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the Azure attested document has no timeStamp.{k}"))?;
        chrono::DateTime::parse_from_str(t, AZURE_TIME)
            .map(|t| t.timestamp())
            .map_err(|e| format!("timeStamp.{k} {:?}: {e}", clip(t)))
    };
    let (created, expires) = (time("createdOn")?, time("expiresOn")?);
    if now >= expires {
        return Err(format!(
            "the Azure attested document expired {} s ago",
            now - expires
        ));
    }
    if created > now + super::CLOCK_SKEW {
        return Err("the Azure attested document was made in the future".into());
    }
    let subscription = token("subscriptionId", s("subscriptionId"))?;
    let vm = token("vmId", s("vmId"))?;
    Ok(Evidence {
        provider: "azure",
        account: subscription,
        instance_id: vm,
        region: String::new(),
        launched_unix: None,
        details: json!({
            "sku": detail(doc.get("sku")),
            "offer": detail(doc.pointer("/plan/product")),
            "publisher": detail(doc.pointer("/plan/publisher")),
            "plan": detail(doc.pointer("/plan/name")),
            "created_unix": created,
            "expires_unix": expires,
        }),
    })
}
