//! One audit event: a CloudEvents 1.0 JSON document, sealed.
//!
//! ```json
//! {"specversion":"1.0","id":"…","source":"choria-provisioner/dc1/r1",
//!  "type":"io.choria.provisioner.v1.denied","subject":"n1.example.net",
//!  "time":"2026-12-06T05:00:00Z","datacontenttype":"application/json",
//!  "data":{"step":"admission","reason":"…"},
//!  "choriasealkey":"<hex>","choriasealsig":"<base64>"}
//! ```
//!
//! The seal signs the stream's name and the exact text of the event up to
//! its seal attributes, which are always last: a reader cuts them off and
//! verifies the bytes the writer signed, whatever JSON library either used.
//! Anyone who may publish on the audit subjects can add events; only ours
//! verify, and `audit` shows the others as unverified.

use choria_wire::security::seal::{Purpose, SealKey, SealVerifier};
use serde::{Deserialize, Serialize};

/// The `type` prefix of every event.
pub const TYPE_PREFIX: &str = "io.choria.provisioner.v1.";

/// A larger message is not one of ours.
pub const MAX_EVENT: usize = 64 * 1024;

/// What happened to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Configured and restarted; the data is its record.
    Provisioned,
    /// A check refused what the node sent (JWT, key, CSR, names, grants).
    Refused,
    /// The admission policy denied it (or could not be evaluated).
    Denied,
    /// The helper or the admission policy deferred it.
    Deferred,
    /// The helper asked for it to be shut down.
    Shutdown,
    /// Renewal asked it to reprovision.
    Renewal,
    /// Provisioned again while it held valid credentials renewal did not
    /// ask it to replace.
    Held,
    /// Its operator moved its name to another instance (or freed it).
    Rebound,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Provisioned => "provisioned",
            Kind::Refused => "refused",
            Kind::Denied => "denied",
            Kind::Deferred => "deferred",
            Kind::Shutdown => "shutdown",
            Kind::Renewal => "renewal",
            Kind::Held => "held",
            Kind::Rebound => "rebound",
        }
    }

    pub const ALL: [Kind; 8] = [
        Kind::Provisioned,
        Kind::Refused,
        Kind::Denied,
        Kind::Deferred,
        Kind::Shutdown,
        Kind::Renewal,
        Kind::Held,
        Kind::Rebound,
    ];
}

/// An event as written, without its seal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub specversion: String,
    pub id: String,
    pub source: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The node's identity.
    pub subject: String,
    pub time: String,
    pub datacontenttype: String,
    pub data: serde_json::Value,
}

impl Event {
    /// A new event about `node`, now, from `source`
    /// (`choria-provisioner/<site>/<replica>`).
    pub fn new(kind: Kind, node: &str, source: &str, data: serde_json::Value) -> Self {
        Event {
            specversion: "1.0".into(),
            id: uuid::Uuid::new_v4().to_string(),
            source: source.to_string(),
            kind: format!("{TYPE_PREFIX}{}", kind.name()),
            subject: node.to_string(),
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            datacontenttype: "application/json".into(),
            data,
        }
    }

    /// The event's kind without the prefix (`denied`).
    pub fn short_kind(&self) -> &str {
        self.kind.strip_prefix(TYPE_PREFIX).unwrap_or(&self.kind)
    }
}

/// The attributes the seal goes in, always last.
const SEAL_KEY_ATTR: &str = ",\"choriasealkey\":";

/// The message body of `event`, sealed for `stream`.
pub fn seal(event: &Event, key: &SealKey, stream: &str) -> Result<Vec<u8>, serde_json::Error> {
    let text = serde_json::to_string(event)?;
    let seal = key.seal(Purpose::Audit, &[stream.as_bytes(), text.as_bytes()]);
    let open = &text[..text.len() - 1];
    let key = serde_json::to_string(&seal.key)?;
    let sig = serde_json::to_string(&seal.sig)?;
    Ok(format!("{open}{SEAL_KEY_ATTR}{key},\"choriasealsig\":{sig}}}").into_bytes())
}

/// An event read back, and whether its seal is ours.
#[derive(Clone, Debug, PartialEq)]
pub struct Opened {
    pub event: Event,
    /// `None` when the seal verified; else why not.
    pub unverified: Option<&'static str>,
    /// An event with this id was read earlier from the stream: this one is
    /// a copy published again (the seal covers the id, so a copy verifies).
    pub repeated: bool,
}

/// Reads a message body from `stream`; `None` when it is not an event at
/// all (or too large to be ours).
pub fn open(body: &[u8], verifier: &SealVerifier, stream: &str) -> Option<Opened> {
    if body.len() > MAX_EVENT {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let event: Event = serde_json::from_str(text).ok()?;
    #[derive(Deserialize)]
    struct SealAttrs {
        choriasealkey: Option<String>,
        choriasealsig: Option<String>,
    }
    let attrs: SealAttrs = serde_json::from_str(text).ok()?;
    let unverified = match (
        attrs.choriasealkey,
        attrs.choriasealsig,
        text.rfind(SEAL_KEY_ATTR),
    ) {
        (Some(key), Some(sig), Some(at)) => {
            let signed = format!("{}}}", &text[..at]);
            let seal = choria_wire::security::seal::Seal { key, sig };
            verifier
                .verify(
                    Some(&seal),
                    Purpose::Audit,
                    &[stream.as_bytes(), signed.as_bytes()],
                )
                .err()
                .map(|e| e.reason())
        }
        _ => Some("unsigned"),
    };
    Some(Opened {
        event,
        unverified,
        repeated: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_event_verifies_only_as_written_for_its_stream() {
        let key = SealKey::generate();
        let v = key.verifier();
        let e = Event::new(
            Kind::Denied,
            "n1.example.net",
            "choria-provisioner/dc1/r1",
            json!({"step": "admission", "reason": "retired rack"}),
        );
        let body = seal(&e, &key, "AUDIT").unwrap();
        let opened = open(&body, &v, "AUDIT").unwrap();
        assert_eq!(opened.event, e);
        assert_eq!(opened.unverified, None);
        assert_eq!(opened.event.short_kind(), "denied");
        // Another stream, a changed reason, another key: not ours.
        assert_eq!(
            open(&body, &v, "OTHER").unwrap().unverified,
            Some("signature")
        );
        let text = String::from_utf8(body.clone()).unwrap();
        let forged = text.replace("retired rack", "all fine");
        assert_eq!(
            open(forged.as_bytes(), &v, "AUDIT").unwrap().unverified,
            Some("signature")
        );
        let other = SealKey::generate().verifier();
        assert_eq!(
            open(&body, &other, "AUDIT").unwrap().unverified,
            Some("signature")
        );
        // Without a seal, or not an event at all.
        let bare = serde_json::to_vec(&e).unwrap();
        assert_eq!(
            open(&bare, &v, "AUDIT").unwrap().unverified,
            Some("unsigned")
        );
        assert!(open(b"not json", &v, "AUDIT").is_none());
        assert!(open(&vec![b' '; MAX_EVENT + 1], &v, "AUDIT").is_none());
    }

    #[test]
    fn events_are_cloudevents() {
        let key = SealKey::generate();
        let e = Event::new(
            Kind::Provisioned,
            "n1",
            "choria-provisioner/-/r1",
            json!({}),
        );
        let doc: serde_json::Value = serde_json::from_slice(&seal(&e, &key, "S").unwrap()).unwrap();
        for attr in ["specversion", "id", "source", "type", "time", "subject"] {
            assert!(doc.get(attr).is_some(), "{attr} missing: {doc}");
        }
        assert_eq!(doc["specversion"], "1.0");
        assert_eq!(doc["type"], "io.choria.provisioner.v1.provisioned");
    }
}
