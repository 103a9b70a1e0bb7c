//! One simulated Choria Server in provisioning mode.
//!
//! The request handling here is pure: it takes a decoded request and returns the
//! reply body and the side effects (events, restart, shutdown), so it is tested
//! without NATS. Behaviour follows go-choria's `server/processor.go` and the
//! `choria_provision`, `rpcutil` and `discovery` agents.

use choria_wire::filter::NodeFacts;
use choria_wire::lifecycle::EventType;
use choria_wire::mcorpc::{encode_reply, error_reply, IncomingRpcRequest, StatusCode};
use choria_wire::protocol::{Request, Version};
use choria_wire::security::csr::{self, CsrSubject, RsaKeyPool};
use choria_wire::security::ecdh::EcdhKeyPair;
use choria_wire::security::ed25519::Ed25519KeyPair;
use choria_wire::security::pem_crypt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The agents a provisioning-mode server runs.
pub const AGENTS: &[&str] = &["choria_provision", "choria_util", "discovery", "rpcutil"];

/// How long the provisioning lock is held after the last locked call.
pub const LOCK_WINDOW: Duration = Duration::from_secs(120);

/// Settings shared by every simulated node.
pub struct FleetShared {
    pub protocol: Version,
    /// The version the nodes report (`rpcutil#inventory`, lifecycle events).
    pub server_version: String,
    /// The `cht` claim of the provisioning JWT; empty means any token passes.
    pub token: String,
    /// The provisioning JWT the `jwt` action returns (None: no JWT configured).
    pub provisioning_jwt: Option<String>,
    /// The JWT's `update` claim: `release_update` allowed, inventory `upgradable`.
    pub upgradable: bool,
    pub key_pool: Arc<RsaKeyPool>,
    /// `--presign-csrs`: by node index, the CSR `gencsr` returns when asked
    /// for the default subject (CN = the identity, nothing else), signed
    /// before the fleet started so a benchmark measures the provisioner,
    /// not the simulator's RSA work. Empty: every CSR is made when asked.
    pub presigned_csrs: Vec<String>,
    /// Where each node pretends its configuration lives.
    pub config_root: String,
    pub facts: serde_json::Value,
    /// `--evidence-key`: each node's facts carry its instance's document.
    pub evidence: Option<crate::evidence::EvidenceSigner>,
    /// `--journal-config-key`: values the final state records.
    pub journal_config_keys: Vec<String>,
}

/// Failure injected into a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Never answers anything (it still publishes lifecycle events).
    Silent,
    /// Answers RPCs with an error status.
    ErrorStatus,
    /// Answers RPCs with replies that do not decode.
    Malformed,
}

impl Failure {
    pub fn name(self) -> &'static str {
        match self {
            Failure::Silent => "silent",
            Failure::ErrorStatus => "error_status",
            Failure::Malformed => "malformed",
        }
    }
}

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the `provisioning` collective, answering.
    Provisioning,
    /// Restarted with `plugin.choria.server.provision=false`: gone from the collective.
    Provisioned,
    /// Shut down by the `shutdown` action.
    Shutdown,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Provisioning => "provisioning",
            Mode::Provisioned => "provisioned",
            Mode::Shutdown => "shutdown",
        }
    }
}

/// The reply data of the actions that only report a message.
#[derive(Serialize)]
struct MessageReply {
    message: String,
}

/// What handling a request produced.
#[derive(Debug, PartialEq)]
pub enum Response {
    /// Send this reply body.
    Reply(Vec<u8>),
    /// Do not answer; the reason is for the journal and debug logs.
    NoReply(String),
    /// Failure injection: send a reply that does not decode.
    Malformed,
}

/// Side effects the fleet carries out after the reply was sent.
#[derive(Debug, Default, PartialEq)]
pub struct Effects {
    /// Lifecycle events to publish now.
    pub events: Vec<EventType>,
    /// Re-exec after this delay (the shutdown event is in `events`).
    pub restart_after: Option<Duration>,
    /// Stop after this delay.
    pub shutdown_after: Option<Duration>,
}

/// The result of one request, with what the journal needs.
#[derive(Debug)]
pub struct Handled {
    pub response: Response,
    pub effects: Effects,
    pub action: String,
    pub statuscode: Option<StatusCode>,
    pub statusmsg: String,
}

impl Handled {
    fn no_reply(action: &str, reason: impl Into<String>) -> Self {
        Handled {
            response: Response::NoReply(reason.into()),
            effects: Effects::default(),
            action: action.to_string(),
            statuscode: None,
            statusmsg: String::new(),
        }
    }
}

/// What a node has written that its final state reports, kept in memory.
#[derive(Default)]
struct Written {
    config: Option<BTreeMap<String, String>>,
    certificate: Option<String>,
    ca: Option<String>,
    /// DER of the decrypted private key.
    private_key: Option<Vec<u8>>,
    server_jwt: Option<String>,
    /// The public half of the ed25519 seed `gen25519` wrote.
    ed25519_public: Option<String>,
}

/// A simulated node.
pub struct Node {
    pub identity: String,
    pub index: usize,
    pub failure: Option<Failure>,
    shared: Arc<FleetShared>,
    pub mode: Mode,
    pub version: String,
    /// Per-process state, reset by a restart (go-choria re-execs).
    ecdh: Option<EcdhKeyPair>,
    lock: Option<(String, Instant)>,
    restart_scheduled: bool,
    written: Written,
    pub configured: u32,
    pub restarts: u32,
    pub provisioned_at: Option<String>,
}

impl Node {
    pub fn new(
        identity: String,
        index: usize,
        failure: Option<Failure>,
        shared: Arc<FleetShared>,
    ) -> Self {
        Node {
            version: shared.server_version.clone(),
            identity,
            index,
            failure,
            shared,
            mode: Mode::Provisioning,
            ecdh: None,
            lock: None,
            restart_scheduled: false,
            written: Written::default(),
            configured: 0,
            restarts: 0,
            provisioned_at: None,
        }
    }

    fn config_file(&self) -> String {
        format!("{}/{}/server.conf", self.shared.config_root, self.identity)
    }

    fn config_dir(&self) -> String {
        format!("{}/{}", self.shared.config_root, self.identity)
    }

    fn ssl_dir(&self) -> String {
        format!("{}/{}/ssl", self.shared.config_root, self.identity)
    }

    /// True when the node's filter matches and it is still in the collective.
    pub fn accepts(&self, req: &Request) -> bool {
        self.mode == Mode::Provisioning
            && req.filter.matches(&NodeFacts {
                identity: &self.identity,
                agents: AGENTS,
                classes: &[],
                facts: Some(&self.shared.facts),
            })
    }

    /// Handles one request as go-choria's processor and agents would.
    pub fn handle(&mut self, req: &Request, now_nanos: i64) -> Handled {
        let agent = req.agent.as_str();
        if self.mode == Mode::Provisioned {
            return self.handle_provisioned(req, now_nanos);
        }
        if self.mode != Mode::Provisioning {
            return Handled::no_reply("", format!("node is {}", self.mode.name()));
        }
        if req.version != self.shared.protocol {
            return Handled::no_reply(
                "",
                format!(
                    "{} request to a {} server",
                    req.version, self.shared.protocol
                ),
            );
        }
        if !self.accepts(req) {
            return Handled::no_reply("", "filter does not match");
        }
        if !req.within_ttl(now_nanos) {
            return Handled::no_reply("", "request is outside its TTL window");
        }
        if req.reply_to.is_empty() {
            return Handled::no_reply("", "request has no reply-to");
        }
        if self.failure == Some(Failure::Silent) {
            return Handled::no_reply("", "silent node (failure injection)");
        }

        let payload = req.payload();
        if agent == "discovery" {
            return discovery::handle(&payload);
        }
        if !AGENTS.contains(&agent) {
            return Handled::no_reply("", format!("unknown agent {agent}"));
        }

        let rpc: IncomingRpcRequest = match serde_json::from_slice(&payload) {
            Ok(r) => r,
            Err(e) => {
                let msg = format!(
                    "Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: {e}"
                );
                return self.reply_error("", StatusCode::InvalidData, msg);
            }
        };
        let action = rpc.action.clone();
        let data = rpc.data.as_ref().map(|d| d.get()).unwrap_or("{}");

        match self.failure {
            Some(Failure::ErrorStatus) => {
                return self.reply_error(
                    &action,
                    StatusCode::Aborted,
                    "Simulated failure (fleet failure injection)".into(),
                )
            }
            Some(Failure::Malformed) => {
                return Handled {
                    response: Response::Malformed,
                    effects: Effects::default(),
                    action,
                    statuscode: None,
                    statusmsg: String::new(),
                }
            }
            _ => {}
        }

        match agent {
            "rpcutil" => self.rpcutil(&action),
            "choria_provision" => self.provision(&action, data, req),
            _ => self.reply_error(
                &action,
                StatusCode::UnknownAction,
                format!("Unknown action {action} for agent {agent}"),
            ),
        }
    }

    fn reply_ok<T: Serialize>(&self, action: &str, data: &T) -> Handled {
        Handled {
            response: Response::Reply(encode_reply(action, StatusCode::Ok, "OK", data)),
            effects: Effects::default(),
            action: action.to_string(),
            statuscode: Some(StatusCode::Ok),
            statusmsg: "OK".into(),
        }
    }

    fn reply_error(&self, action: &str, code: StatusCode, msg: String) -> Handled {
        Handled {
            response: Response::Reply(error_reply(action, code, &msg)),
            effects: Effects::default(),
            action: action.to_string(),
            statuscode: Some(code),
            statusmsg: msg,
        }
    }

    fn abort(&self, action: &str, msg: impl Into<String>) -> Handled {
        self.reply_error(action, StatusCode::Aborted, msg.into())
    }
}

impl Node {
    /// The re-exec after a restart: a new process reads the written config and
    /// either leaves provisioning or comes back into it with fresh state.
    pub fn complete_restart(&mut self) {
        self.restarts += 1;
        self.ecdh = None;
        self.lock = None;
        self.restart_scheduled = false;
        if self.provision_disabled() {
            self.mode = Mode::Provisioned;
            self.provisioned_at = Some(crate::journal::timestamp().0);
        } else if self.mode == Mode::Provisioned {
            // `reprovision` rewrote the configuration: back into provisioning.
            self.mode = Mode::Provisioning;
        }
    }

    /// The collective a provisioned node serves in: the first of its
    /// written `collectives`, else go-choria's default.
    pub fn collective(&self) -> String {
        self.written
            .config
            .as_ref()
            .and_then(|c| c.get("collectives"))
            .and_then(|c| c.split(',').map(str::trim).find(|c| !c.is_empty()))
            .unwrap_or("mcollective")
            .to_string()
    }

    /// A provisioned node, in its own collective, answers what renewal
    /// needs: `choria_provision#reprovision` (the `choria_provision` agent
    /// stays active while the provisioning JWT holds a token, as in
    /// go-choria). Everything else is left unanswered here.
    fn handle_provisioned(&mut self, req: &Request, now_nanos: i64) -> Handled {
        if req.collective != self.collective() {
            return Handled::no_reply("", "not the node's collective");
        }
        if !req.within_ttl(now_nanos) || req.reply_to.is_empty() {
            return Handled::no_reply("", "request is outside its TTL window");
        }
        let payload = req.payload();
        let rpc: IncomingRpcRequest = match serde_json::from_slice(&payload) {
            Ok(r) => r,
            Err(_) => return Handled::no_reply("", "not an RPC request"),
        };
        if req.agent != "choria_provision" || rpc.action != "reprovision" {
            return Handled::no_reply(
                &rpc.action,
                "provisioned nodes answer only reprovision here",
            );
        }
        let data = rpc.data.as_ref().map(|d| d.get()).unwrap_or("{}");
        self.reprovision_provisioned(data)
            .unwrap_or_else(|boxed| *boxed)
    }

    pub fn complete_shutdown(&mut self) {
        self.mode = Mode::Shutdown;
    }

    pub fn final_state(&self) -> crate::journal::FinalState {
        crate::journal::FinalState {
            node: self.identity.clone(),
            state: self.mode.name().to_string(),
            protocol: self.shared.protocol.to_string(),
            configured: self.configured,
            restarts: self.restarts,
            provision_disabled: self.provision_disabled(),
            config_keys: self
                .written
                .config
                .as_ref()
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default(),
            config_values: self
                .written
                .config
                .as_ref()
                .map(|c| {
                    c.iter()
                        .filter(|(k, _)| self.shared.journal_config_keys.contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            has_certificate: self.written.certificate.is_some(),
            has_private_key: self.written.private_key.is_some(),
            has_server_jwt: self.written.server_jwt.is_some(),
            certificate: self.written.certificate.clone(),
            ca: self.written.ca.clone(),
            server_jwt: self.written.server_jwt.clone(),
            ed25519_public_key: self.written.ed25519_public.clone(),
            private_key_sha256: self.written.private_key.as_ref().map(|der| {
                use sha2::Digest;
                hex::encode(sha2::Sha256::digest(der))
            }),
            version: self.version.clone(),
            injected_failure: self.failure.map(|f| f.name().to_string()),
            provisioned_at: self.provisioned_at.clone(),
        }
    }
}

/// Choria's boolean spellings.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" | "on" => Some(true),
        "0" | "false" | "f" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// What go-choria's config parser would refuse in a `key=value` file we write.
fn validate_config(settings: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in settings {
        if k.trim().is_empty() {
            return Err("empty configuration key".into());
        }
        if k.contains('\n') || v.contains('\n') || k.contains('=') {
            return Err(format!("invalid configuration line for key {k:?}"));
        }
        if k == "plugin.choria.server.provision" && parse_bool(v).is_none() {
            return Err(format!("{k}: {v:?} is not a boolean"));
        }
    }
    Ok(())
}

mod choria_provision;
mod discovery;
mod rpcutil;

#[cfg(test)]
mod tests;
