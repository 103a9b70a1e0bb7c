//! Choria lifecycle events (`lifecycle/*.go`) in the Choria format and wrapped as
//! CloudEvents 1.0, which is what servers publish by default.

use serde::{Deserialize, Serialize};

/// Lifecycle event types the provisioner and the simulator deal with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Startup,
    Shutdown,
    Provisioned,
    Alive,
    Upgraded,
}

impl EventType {
    /// The subject word (`choria.lifecycle.event.<type>.<component>`).
    pub fn name(self) -> &'static str {
        match self {
            EventType::Startup => "startup",
            EventType::Shutdown => "shutdown",
            EventType::Provisioned => "provisioned",
            EventType::Alive => "alive",
            EventType::Upgraded => "upgraded",
        }
    }

    /// The `protocol` field of the Choria format.
    pub fn protocol(self) -> &'static str {
        match self {
            EventType::Startup => "io.choria.lifecycle.v1.startup",
            EventType::Shutdown => "io.choria.lifecycle.v1.shutdown",
            EventType::Provisioned => "io.choria.lifecycle.v1.provisioned",
            EventType::Alive => "io.choria.lifecycle.v1.alive",
            EventType::Upgraded => "io.choria.lifecycle.v1.upgraded",
        }
    }

    fn from_protocol(p: &str) -> Option<Self> {
        Some(match p {
            "io.choria.lifecycle.v1.startup" | "choria:lifecycle:startup:1" => EventType::Startup,
            "io.choria.lifecycle.v1.shutdown" | "choria:lifecycle:shutdown:1" => {
                EventType::Shutdown
            }
            "io.choria.lifecycle.v1.provisioned" | "choria:lifecycle:provisioned:1" => {
                EventType::Provisioned
            }
            "io.choria.lifecycle.v1.alive" | "choria:lifecycle:alive:1" => EventType::Alive,
            "io.choria.lifecycle.v1.upgraded" | "choria:lifecycle:upgraded:1" => {
                EventType::Upgraded
            }
            _ => return None,
        })
    }
}

/// Subject a lifecycle event is published on.
pub fn subject(event: EventType, component: &str) -> String {
    format!("choria.lifecycle.event.{}.{}", event.name(), component)
}

/// A lifecycle event in the Choria format. Field order as Go marshals it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub protocol: String,
    pub id: String,
    pub identity: String,
    pub component: String,
    pub timestamp: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_version: Option<String>,
}

impl Event {
    pub fn new(event: EventType, identity: &str, component: &str, version: Option<&str>) -> Self {
        Event {
            protocol: event.protocol().to_string(),
            id: crate::ids::event_id(),
            identity: identity.to_string(),
            component: component.to_string(),
            timestamp: chrono::Utc::now().timestamp(),
            version: version.map(str::to_string),
            new_version: None,
        }
    }

    pub fn event_type(&self) -> Option<EventType> {
        EventType::from_protocol(&self.protocol)
    }

    /// The Choria-format JSON (what the Go provisioner publishes for itself).
    pub fn to_choria_json(&self) -> Vec<u8> {
        crate::json::to_vec(self).expect("events always serialize")
    }

    /// The CloudEvents 1.0 JSON that go-choria servers publish by default.
    pub fn to_cloudevent_json(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct CloudEvent<'a> {
            specversion: &'static str,
            id: &'a str,
            source: &'static str,
            #[serde(rename = "type")]
            kind: &'a str,
            subject: &'a str,
            datacontenttype: &'static str,
            time: String,
            data: &'a Event,
        }
        let time = chrono::DateTime::from_timestamp(self.timestamp, 0)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let ce = CloudEvent {
            specversion: "1.0",
            id: &self.id,
            source: CLOUDEVENT_SOURCE,
            kind: &self.protocol,
            subject: &self.identity,
            datacontenttype: "application/json",
            time,
            data: self,
        };
        crate::json::to_vec(&ce).expect("events always serialize")
    }
}

const CLOUDEVENT_SOURCE: &str = "io.choria.lifecycle";

/// Why a lifecycle payload was not understood.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("lifecycle event is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a Choria lifecycle event: neither a io.choria.lifecycle protocol nor a CloudEvent from io.choria.lifecycle")]
    NotLifecycle,
    #[error("unknown lifecycle event protocol {0:?}")]
    UnknownType(String),
    #[error("lifecycle event has no identity")]
    NoIdentity,
}

/// Parses either format, like `lifecycle.NewFromJSON`.
pub fn parse(data: &[u8]) -> Result<(EventType, Event), EventError> {
    let value: serde_json::Value = serde_json::from_slice(data)?;
    let inner = if value
        .get("protocol")
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.starts_with("io.choria.lifecycle") || p.starts_with("choria:lifecycle"))
    {
        value
    } else if value.get("specversion").and_then(|v| v.as_str()) == Some("1.0")
        && value.get("source").and_then(|v| v.as_str()) == Some(CLOUDEVENT_SOURCE)
    {
        value.get("data").cloned().ok_or(EventError::NotLifecycle)?
    } else {
        return Err(EventError::NotLifecycle);
    };
    let event: Event = serde_json::from_value(inner)?;
    let kind = event
        .event_type()
        .ok_or_else(|| EventError::UnknownType(event.protocol.clone()))?;
    if event.identity.is_empty() {
        return Err(EventError::NoIdentity);
    }
    Ok((kind, event))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Event {
        Event {
            protocol: "io.choria.lifecycle.v1.startup".into(),
            id: "01e72410-d734-4611-9485-8c6a2dd2579b".into(),
            identity: "node1.example.net".into(),
            component: "provision_mode_server".into(),
            timestamp: 1718000000,
            version: Some("0.30.2".into()),
            new_version: None,
        }
    }

    #[test]
    fn choria_format_matches_the_protocol_doc() {
        assert_eq!(
            String::from_utf8(sample().to_choria_json()).unwrap(),
            r#"{"protocol":"io.choria.lifecycle.v1.startup","id":"01e72410-d734-4611-9485-8c6a2dd2579b","identity":"node1.example.net","component":"provision_mode_server","timestamp":1718000000,"version":"0.30.2"}"#
        );
    }

    #[test]
    fn cloudevent_format_matches_the_protocol_doc() {
        assert_eq!(
            String::from_utf8(sample().to_cloudevent_json()).unwrap(),
            r#"{"specversion":"1.0","id":"01e72410-d734-4611-9485-8c6a2dd2579b","source":"io.choria.lifecycle","type":"io.choria.lifecycle.v1.startup","subject":"node1.example.net","datacontenttype":"application/json","time":"2024-06-10T06:13:20Z","data":{"protocol":"io.choria.lifecycle.v1.startup","id":"01e72410-d734-4611-9485-8c6a2dd2579b","identity":"node1.example.net","component":"provision_mode_server","timestamp":1718000000,"version":"0.30.2"}}"#
        );
    }

    #[test]
    fn both_formats_and_legacy_protocols_parse() {
        let (k, e) = parse(&sample().to_cloudevent_json()).unwrap();
        assert_eq!(
            (k, e.identity.as_str()),
            (EventType::Startup, "node1.example.net")
        );
        let (k, _) = parse(&sample().to_choria_json()).unwrap();
        assert_eq!(k, EventType::Startup);
        let legacy = br#"{"protocol":"choria:lifecycle:shutdown:1","id":"x","identity":"n","component":"c","timestamp":1}"#;
        assert_eq!(parse(legacy).unwrap().0, EventType::Shutdown);
    }

    #[test]
    fn non_lifecycle_payloads_are_typed_errors() {
        assert!(matches!(parse(b"{}"), Err(EventError::NotLifecycle)));
        assert!(matches!(parse(b"nope"), Err(EventError::Json(_))));
        assert!(matches!(
            parse(br#"{"protocol":"io.choria.lifecycle.v1.bogus","id":"x","identity":"n","component":"c","timestamp":1}"#),
            Err(EventError::UnknownType(_))
        ));
        assert!(matches!(
            parse(br#"{"protocol":"io.choria.lifecycle.v1.startup","id":"x","identity":"","component":"c","timestamp":1}"#),
            Err(EventError::NoIdentity)
        ));
    }

    #[test]
    fn subjects_follow_the_lifecycle_scheme() {
        assert_eq!(
            subject(EventType::Startup, "provision_mode_server"),
            "choria.lifecycle.event.startup.provision_mode_server"
        );
    }
}
