//! The simulator's journal: one JSON line per request a node received, plus each
//! node's final state, so tests and benchmarks assert outcomes from a file rather
//! than from logs.

use serde::Serialize;
use std::io::Write;
use std::path::Path;
use tokio::sync::mpsc;

/// One journal line.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A request reached a node.
    Action {
        node: String,
        agent: String,
        action: String,
        caller: String,
        sender: String,
        request_id: String,
        /// RFC 3339 with microseconds.
        time: String,
        /// Unix time in microseconds, for arithmetic.
        time_us: i64,
        outcome: Outcome,
        #[serde(skip_serializing_if = "Option::is_none")]
        statuscode: Option<u8>,
        #[serde(skip_serializing_if = "String::is_empty")]
        statusmsg: String,
    },
    /// A lifecycle event a node published.
    Event {
        node: String,
        event: String,
        component: String,
        time: String,
        time_us: i64,
    },
    /// The state of a node when the simulator stopped.
    Final(FinalState),
}

impl Entry {
    /// A request line stamped with the current time. `req` is None when the
    /// message could not be decoded far enough to know who sent it.
    pub fn action(
        node: &str,
        req: Option<&choria_wire::protocol::Request>,
        action: &str,
        outcome: Outcome,
        statuscode: Option<u8>,
        statusmsg: &str,
    ) -> Self {
        let (time, time_us) = timestamp();
        let field = |f: fn(&choria_wire::protocol::Request) -> &String| {
            req.map(f).cloned().unwrap_or_default()
        };
        Entry::Action {
            node: node.to_string(),
            agent: field(|r| &r.agent),
            action: action.to_string(),
            caller: field(|r| &r.caller),
            sender: field(|r| &r.sender),
            request_id: field(|r| &r.id),
            time,
            time_us,
            outcome,
            statuscode,
            statusmsg: statusmsg.to_string(),
        }
    }
}

/// What happened to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Answered with status OK.
    Ok,
    /// Answered with a failure status.
    Error,
    /// Not answered, as a real server would not (bad schema, TTL, unknown agent...).
    Dropped,
    /// Not answered because failure injection made this node silent.
    Silent,
    /// Answered with a deliberately malformed reply (failure injection).
    Malformed,
}

#[derive(Clone, Debug, Serialize)]
pub struct FinalState {
    pub node: String,
    /// `provisioning`, `provisioned` or `shutdown`.
    pub state: String,
    pub protocol: String,
    /// How many times `configure` succeeded.
    pub configured: u32,
    /// How many times the node restarted.
    pub restarts: u32,
    /// Whether the last written configuration set `plugin.choria.server.provision=false`.
    pub provision_disabled: bool,
    /// Configuration keys written (values are left out: they may hold secrets).
    pub config_keys: Vec<String>,
    /// The values of the keys `--journal-config-key` names.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub config_values: std::collections::BTreeMap<String, String>,
    pub has_certificate: bool,
    pub has_private_key: bool,
    pub has_server_jwt: bool,
    /// What `configure` wrote (public material only: certificates and JWTs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_jwt: Option<String>,
    /// The node's ed25519 public key from its last `gen25519`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ed25519_public_key: Option<String>,
    /// SHA-256 of the decrypted private key's DER, so tests can check the key
    /// arrived intact without the key itself reaching the journal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key_sha256: Option<String>,
    pub version: String,
    /// Failure injected into this node, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injected_failure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provisioned_at: Option<String>,
}

/// Hands entries to a writer task so that request handling never blocks on disk.
#[derive(Clone)]
pub struct Journal {
    tx: Option<mpsc::UnboundedSender<Entry>>,
}

impl Journal {
    /// A journal that drops everything (no `--journal` given).
    pub fn disabled() -> Self {
        Journal { tx: None }
    }

    /// Opens `path` (truncating it) and starts the writer task.
    pub fn open(
        path: &Path,
    ) -> std::io::Result<(Self, tokio::task::JoinHandle<std::io::Result<()>>)> {
        let file = std::fs::File::create(path)?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Entry>();
        let handle = tokio::task::spawn_blocking(move || {
            let mut out = std::io::BufWriter::new(file);
            while let Some(entry) = rx.blocking_recv() {
                serde_json::to_writer(&mut out, &entry)?;
                out.write_all(b"\n")?;
                // Flush when idle so a reader sees lines promptly while the fleet runs.
                if rx.is_empty() {
                    out.flush()?;
                }
            }
            out.flush()
        });
        Ok((Journal { tx: Some(tx) }, handle))
    }

    pub fn record(&self, entry: Entry) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(entry);
        }
    }

    /// Stops accepting entries; the writer drains and exits.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// RFC 3339 time with microseconds and the matching Unix microseconds.
pub fn timestamp() -> (String, i64) {
    let now = chrono::Utc::now();
    (
        now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        now.timestamp_micros(),
    )
}
