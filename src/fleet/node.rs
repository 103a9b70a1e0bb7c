//! One simulated Choria Server in provisioning mode.
//!
//! The request handling here is pure: it takes a decoded request and returns the
//! reply body and the side effects (events, restart, shutdown), so it is tested
//! without NATS. Behaviour follows go-choria's `server/processor.go` and the
//! `choria_provision`, `rpcutil` and `discovery` agents.

use crate::choria::filter::NodeFacts;
use crate::choria::lifecycle::EventType;
use crate::choria::mcorpc::{encode_reply, error_reply, IncomingRpcRequest, StatusCode};
use crate::choria::protocol::{Request, Version};
use crate::choria::security::csr::{self, CsrSubject, RsaKeyPool};
use crate::choria::security::ecdh::EcdhKeyPair;
use crate::choria::security::ed25519::Ed25519KeyPair;
use crate::choria::security::pem_crypt;
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
    /// Where each node pretends its configuration lives.
    pub config_root: String,
    pub facts: serde_json::Value,
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
            // The discovery agent answers "pong" to anything containing "ping".
            if payload.windows(4).any(|w| w == b"ping") {
                return Handled {
                    response: Response::Reply(b"pong".to_vec()),
                    effects: Effects::default(),
                    action: "ping".into(),
                    statuscode: None,
                    statusmsg: String::new(),
                };
            }
            return Handled::no_reply("", "discovery request without ping");
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

    fn rpcutil(&self, action: &str) -> Handled {
        match action {
            "inventory" => {
                #[derive(Serialize)]
                struct Inventory<'a> {
                    agents: &'a [&'a str],
                    classes: [(); 0],
                    collectives: [&'a str; 1],
                    data_plugins: [(); 0],
                    facts: &'a serde_json::Value,
                    machines: [(); 0],
                    main_collective: &'a str,
                    version: &'a str,
                    upgradable: bool,
                }
                self.reply_ok(
                    action,
                    &Inventory {
                        agents: AGENTS,
                        classes: [],
                        collectives: ["provisioning"],
                        data_plugins: [],
                        facts: &self.shared.facts,
                        machines: [],
                        main_collective: "provisioning",
                        version: &self.version,
                        upgradable: self.shared.upgradable,
                    },
                )
            }
            "ping" => {
                #[derive(Serialize)]
                struct Pong {
                    pong: i64,
                }
                self.reply_ok(
                    action,
                    &Pong {
                        pong: chrono::Utc::now().timestamp(),
                    },
                )
            }
            "collective_info" => {
                #[derive(Serialize)]
                struct Info<'a> {
                    main_collective: &'a str,
                    collectives: [&'a str; 1],
                }
                self.reply_ok(
                    action,
                    &Info {
                        main_collective: "provisioning",
                        collectives: ["provisioning"],
                    },
                )
            }
            other => self.reply_error(
                other,
                StatusCode::UnknownAction,
                format!("Unknown action {other} for agent rpcutil"),
            ),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(
        &self,
        action: &str,
        data: &str,
    ) -> Result<T, Box<Handled>> {
        serde_json::from_str(data).map_err(|e| {
            Box::new(self.reply_error(
                action,
                StatusCode::InvalidData,
                format!("Could not parse request data for choria_provision#{action}: {e}"),
            ))
        })
    }

    /// go-choria's `checkToken`: with no token in the provisioning JWT any token passes.
    fn check_token(&self, action: &str, token: &str) -> Result<(), Box<Handled>> {
        if self.shared.token.is_empty() || token == self.shared.token {
            Ok(())
        } else {
            Err(Box::new(
                self.abort(action, "Incorrect provision token supplied"),
            ))
        }
    }

    /// The per-server provisioning lock keyed on `<senderid>.<callerid>`.
    fn take_lock(&mut self, req: &Request) -> bool {
        let key = format!("{}.{}", req.sender, req.caller);
        let now = Instant::now();
        match &self.lock {
            Some((holder, until)) if *holder != key && *until > now => false,
            _ => {
                self.lock = Some((key, now + LOCK_WINDOW));
                true
            }
        }
    }

    fn provision(&mut self, action: &str, data: &str, req: &Request) -> Handled {
        const LOCKED: &[&str] = &["configure", "gen25519", "gencsr", "jwt", "release_update"];
        const KNOWN: &[&str] = &[
            "configure",
            "gen25519",
            "gencsr",
            "jwt",
            "release_update",
            "reprovision",
            "restart",
            "shutdown",
        ];
        if !KNOWN.contains(&action) {
            return self.reply_error(
                action,
                StatusCode::UnknownAction,
                format!("Unknown action {action} for agent choria_provision"),
            );
        }
        if LOCKED.contains(&action) && !self.take_lock(req) {
            return self.abort(action, "Could not obtain provisioning lock");
        }
        let result = match action {
            "jwt" => self.jwt(data),
            "gen25519" => self.gen25519(data),
            "gencsr" => self.gencsr(data),
            "configure" => self.configure(data),
            "restart" => self.restart(data),
            "shutdown" => self.shutdown(data),
            "reprovision" => self.reprovision(data),
            "release_update" => self.release_update(data),
            _ => unreachable!("checked against KNOWN"),
        };
        result.unwrap_or_else(|boxed| *boxed)
    }

    fn jwt(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
        }
        let args: Args = self.parse("jwt", data)?;
        self.check_token("jwt", &args.token)?;
        let Some(jwt) = self.shared.provisioning_jwt.clone() else {
            return Ok(self.abort("jwt", "No Provisioning JWT file has been configured"));
        };
        // A new X25519 pair per call, replacing any earlier one, as go-choria does.
        let ecdh = EcdhKeyPair::generate();
        #[derive(Serialize)]
        struct Reply {
            jwt: String,
            ecdh_public: String,
        }
        let reply = Reply {
            jwt,
            ecdh_public: ecdh.public_hex(),
        };
        self.ecdh = Some(ecdh);
        Ok(self.reply_ok("jwt", &reply))
    }

    fn gen25519(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            nonce: String,
        }
        let args: Args = self.parse("gen25519", data)?;
        self.check_token("gen25519", &args.token)?;
        let pair = Ed25519KeyPair::generate();
        #[derive(Serialize)]
        struct Reply {
            public_key: String,
            directory: String,
            signature: String,
        }
        let reply = Reply {
            public_key: pair.public_hex(),
            directory: self.config_dir(),
            signature: pair.sign_nonce_hex(&args.nonce),
        };
        // A new seed invalidates any server JWT issued for the old one.
        self.written.server_jwt = None;
        self.written.ed25519_public = Some(reply.public_key.clone());
        Ok(self.reply_ok("gen25519", &reply))
    }

    fn gencsr(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            cn: String,
            #[serde(default, rename = "C")]
            country: String,
            #[serde(default, rename = "L")]
            locality: String,
            #[serde(default, rename = "O")]
            organization: String,
            #[serde(default, rename = "OU")]
            organizational_unit: String,
            #[serde(default, rename = "ST")]
            state: String,
        }
        let args: Args = self.parse("gencsr", data)?;
        self.check_token("gencsr", &args.token)?;
        let key = self.shared.key_pool.get(self.index);
        let mut subject = CsrSubject::new(if args.cn.is_empty() {
            self.identity.clone()
        } else {
            args.cn
        });
        let opt = |s: String| (!s.is_empty()).then_some(s);
        subject.country = opt(args.country);
        subject.locality = opt(args.locality);
        subject.organization = opt(args.organization);
        subject.organizational_unit = opt(args.organizational_unit);
        // go-choria accepts ST but never puts it into the subject.
        let _ = args.state;
        let csr_pem = match csr::make_csr(&key, &subject) {
            Ok(c) => c,
            Err(e) => return Ok(self.abort("gencsr", format!("Could not create CSR: {e}"))),
        };
        let public_key = match csr::public_key_pem_go_style(&key.to_public_key()) {
            Ok(p) => p,
            Err(e) => return Ok(self.abort("gencsr", format!("Could not encode public key: {e}"))),
        };
        #[derive(Serialize)]
        struct Reply {
            csr: String,
            public_key: String,
            ssldir: String,
        }
        Ok(self.reply_ok(
            "gencsr",
            &Reply {
                csr: csr_pem,
                public_key,
                ssldir: self.ssl_dir(),
            },
        ))
    }

    fn configure(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            config: String,
            #[serde(default)]
            key: String,
            #[serde(default)]
            certificate: String,
            #[serde(default)]
            ca: String,
            #[serde(default)]
            ssldir: String,
            #[serde(default)]
            ecdh_public: String,
            #[serde(default)]
            server_jwt: String,
            #[serde(default)]
            action_policies: BTreeMap<String, String>,
            #[serde(default)]
            opa_policies: BTreeMap<String, String>,
        }
        let a = "configure";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        if args.config.is_empty() {
            return Ok(self.abort(
                a,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            ));
        }
        if !args.key.is_empty() && args.ecdh_public.is_empty() {
            return Ok(self.abort(
                a,
                "EDCH Public Key not supplied while providing a private key",
            ));
        }
        let settings: BTreeMap<String, String> = match serde_json::from_str(&args.config) {
            Ok(s) => s,
            Err(e) => return Ok(self.abort(a, format!("Could not decode configuration data: {e}"))),
        };

        if !args.certificate.is_empty() && !args.ssldir.is_empty() && !args.ca.is_empty() {
            if !args.key.is_empty() {
                let Some(ecdh) = &self.ecdh else {
                    return Ok(self.abort(a, "TLS Setup Failed: private key not set"));
                };
                let shared = match ecdh.shared_secret(&args.ecdh_public) {
                    Ok(s) => s,
                    Err(e) => return Ok(self.abort(a, format!("TLS Setup Failed: {e}"))),
                };
                match pem_crypt::decrypt_private_key(&args.key, &shared) {
                    Ok(der) => self.written.private_key = Some(der),
                    Err(e) => return Ok(self.abort(a, format!("TLS Setup Failed: {e}"))),
                }
            }
            self.written.certificate = Some(args.certificate);
            self.written.ca = Some(args.ca);
        }
        if !args.server_jwt.is_empty() {
            self.written.server_jwt = Some(args.server_jwt);
        }
        if let Err(e) = validate_config(&settings) {
            return Ok(self.abort(
                a,
                format!("Could not write config: generated configuration could not be parsed: {e}"),
            ));
        }
        for name in args.action_policies.keys() {
            if !name.ends_with(".policy") {
                return Ok(self.abort(
                    a,
                    format!("Could not save Action Policies: expected {name:?} to have .policy extension"),
                ));
            }
        }
        for name in args.opa_policies.keys() {
            if !name.ends_with(".rego") {
                return Ok(self.abort(
                    a,
                    format!(
                        "Could not save OPA Policies: expected {name:?} to have .rego extension"
                    ),
                ));
            }
        }
        let lines = settings.len() + 1;
        self.written.config = Some(settings);
        self.configured += 1;
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Wrote {lines} lines to {}", self.config_file()),
            },
        );
        handled.effects.events.push(EventType::Provisioned);
        Ok(handled)
    }

    /// Whether the written configuration turns provisioning off.
    pub fn provision_disabled(&self) -> bool {
        self.written
            .config
            .as_ref()
            .and_then(|c| c.get("plugin.choria.server.provision"))
            .is_some_and(|v| parse_bool(v) == Some(false))
    }

    fn provision_enabled_in_config(&self) -> bool {
        self.written
            .config
            .as_ref()
            .and_then(|c| c.get("plugin.choria.server.provision"))
            .is_some_and(|v| parse_bool(v) == Some(true))
    }

    fn restart(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            splay: i64,
        }
        let a = "restart";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        if self.provision_enabled_in_config() {
            return Ok(self.abort(
                a,
                format!(
                    "Configuration {} enables provisioning, restart cannot continue",
                    self.config_file()
                ),
            ));
        }
        let splay = if args.splay <= 0 { 10 } else { args.splay };
        let delay = Duration::from_secs(rand::random::<u64>() % splay as u64 + 2);
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Restarting Choria Server after {}s", delay.as_secs()),
            },
        );
        // go-choria allows one restart per process; later requests still get the
        // reply but nothing more happens.
        if !self.restart_scheduled {
            self.restart_scheduled = true;
            handled.effects.events.push(EventType::Shutdown);
            handled.effects.restart_after = Some(delay);
        }
        Ok(handled)
    }

    fn shutdown(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
        }
        let a = "shutdown";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        let delay = Duration::from_secs(rand::random::<u64>() % 10);
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Shutting Choria Server down after {}s", delay.as_secs()),
            },
        );
        handled.effects.shutdown_after = Some(delay);
        Ok(handled)
    }

    fn reprovision(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            #[allow(dead_code)]
            token: String,
        }
        let _args: Args = self.parse("reprovision", data)?;
        Ok(self.abort(
            "reprovision",
            "Server is already in provisioning mode, cannot enable provisioning mode again",
        ))
    }

    fn release_update(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            repository: String,
            #[serde(default)]
            version: String,
        }
        let a = "release_update";
        let args: Args = self.parse(a, data)?;
        if !self.shared.upgradable {
            return Ok(self.abort(a, "Version updates is not enabled in the configuration"));
        }
        self.check_token(a, &args.token)?;
        if !(args.repository.starts_with("http://") || args.repository.starts_with("https://"))
            || args.version.is_empty()
        {
            return Ok(self.abort(
                a,
                format!(
                    "Update to version {} failed, release rolled back: invalid repository {:?}",
                    args.version, args.repository
                ),
            ));
        }
        // The simulator cannot download a release; it behaves as a successful
        // update: the new version is reported after the restart.
        self.version = args.version;
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: "Restarting Choria Server after 2s".into(),
            },
        );
        handled.effects.events.push(EventType::Upgraded);
        if !self.restart_scheduled {
            self.restart_scheduled = true;
            handled.effects.restart_after = Some(Duration::from_secs(2));
        }
        Ok(handled)
    }

    /// The re-exec after a restart: a new process reads the written config and
    /// either leaves provisioning or comes back into it with fresh state.
    pub fn complete_restart(&mut self) {
        self.restarts += 1;
        self.ecdh = None;
        self.lock = None;
        self.restart_scheduled = false;
        if self.provision_disabled() {
            self.mode = Mode::Provisioned;
            self.provisioned_at = Some(crate::fleet::journal::timestamp().0);
        }
    }

    pub fn complete_shutdown(&mut self) {
        self.mode = Mode::Shutdown;
    }

    pub fn final_state(&self) -> crate::fleet::journal::FinalState {
        crate::fleet::journal::FinalState {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choria::filter::Filter;

    fn node() -> Node {
        let key = csr::generate_rsa_key(1024).unwrap();
        let shared = Arc::new(FleetShared {
            protocol: Version::V1,
            server_version: "0.30.2".into(),
            token: "s3cret".into(),
            provisioning_jwt: Some("a.b.c".into()),
            upgradable: false,
            key_pool: Arc::new(RsaKeyPool::from_keys(vec![key]).unwrap()),
            config_root: "/etc/choria-fleet".into(),
            facts: serde_json::json!({}),
        });
        Node::new("n1.example.net".into(), 0, None, shared)
    }

    fn request(agent: &str, payload: &str, sender: &str) -> Request {
        Request {
            version: Version::V1,
            id: crate::choria::ids::v1_request_id(),
            sender: sender.into(),
            caller: format!("choria={sender}"),
            collective: "provisioning".into(),
            agent: agent.into(),
            ttl: 60,
            time_nanos: crate::choria::client::now_nanos(),
            filter: Filter::with_agent(agent),
            message: payload.as_bytes().to_vec(),
            reply_to: "provisioning.reply.x.y".into(),
            transport_sender: sender.into(),
            caller_jwt: String::new(),
        }
    }

    fn body(h: &Handled) -> serde_json::Value {
        match &h.response {
            Response::Reply(b) => serde_json::from_slice(b).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn gencsr_ignores_st_like_go_choria() {
        let mut n = node();
        let payload = r#"{"agent":"choria_provision","action":"gencsr","data":{"token":"s3cret","cn":"n1.example.net","O":"Acme","ST":"Somewhere"}}"#;
        let h = n.handle(
            &request("choria_provision", payload, "p"),
            crate::choria::client::now_nanos(),
        );
        let b = body(&h);
        let pem_text = b["data"]["csr"].as_str().unwrap();
        let der = pem::parse(pem_text).unwrap().into_contents();
        // stateOrProvinceName is OID 2.5.4.8 (06 03 55 04 08); organizationName 2.5.4.10 is present.
        assert!(
            !der.windows(5).any(|w| w == [0x06, 0x03, 0x55, 0x04, 0x08]),
            "ST must not be in the subject"
        );
        assert!(
            der.windows(5).any(|w| w == [0x06, 0x03, 0x55, 0x04, 0x0a]),
            "O is in the subject"
        );
    }

    #[test]
    fn lock_is_per_sender_and_caller_and_restart_is_not_locked() {
        let mut n = node();
        let now = crate::choria::client::now_nanos();
        let jwt = r#"{"agent":"choria_provision","action":"jwt","data":{"token":"s3cret"}}"#;
        assert_eq!(
            body(&n.handle(&request("choria_provision", jwt, "a"), now))["statuscode"],
            0
        );
        assert_eq!(
            body(&n.handle(&request("choria_provision", jwt, "a"), now))["statuscode"],
            0
        );
        let refused = body(&n.handle(&request("choria_provision", jwt, "b"), now));
        assert_eq!(refused["statusmsg"], "Could not obtain provisioning lock");
        let restart = r#"{"agent":"choria_provision","action":"restart","data":{"token":"s3cret","splay":1}}"#;
        let h = n.handle(&request("choria_provision", restart, "b"), now);
        assert_eq!(
            body(&h)["data"]["message"],
            "Restarting Choria Server after 2s"
        );
        assert_eq!(h.effects.events, [EventType::Shutdown]);
        assert_eq!(h.effects.restart_after, Some(Duration::from_secs(2)));
        // One restart per process: a second request replies but schedules nothing.
        let again = n.handle(&request("choria_provision", restart, "b"), now);
        assert_eq!(again.effects.restart_after, None);
        n.complete_restart();
        assert_eq!(
            n.mode,
            Mode::Provisioning,
            "no provision=false written: back into provisioning"
        );
        // The re-exec clears the lock.
        assert_eq!(
            body(&n.handle(&request("choria_provision", jwt, "b"), now))["statuscode"],
            0
        );
    }

    #[test]
    fn configure_with_provision_true_blocks_restart() {
        let mut n = node();
        let now = crate::choria::client::now_nanos();
        let cfg = r#"{"agent":"choria_provision","action":"configure","data":{"token":"s3cret","config":"{\"plugin.choria.server.provision\":\"true\"}"}}"#;
        let h = n.handle(&request("choria_provision", cfg, "a"), now);
        assert_eq!(
            body(&h)["data"]["message"],
            "Wrote 2 lines to /etc/choria-fleet/n1.example.net/server.conf"
        );
        assert_eq!(h.effects.events, [EventType::Provisioned]);
        let restart =
            r#"{"agent":"choria_provision","action":"restart","data":{"token":"s3cret"}}"#;
        let b = body(&n.handle(&request("choria_provision", restart, "a"), now));
        assert_eq!(
            b["statusmsg"],
            "Configuration /etc/choria-fleet/n1.example.net/server.conf enables provisioning, restart cannot continue"
        );
    }

    #[test]
    fn unparsable_rpc_body_is_invalid_data_with_empty_action() {
        let mut n = node();
        let h = n.handle(
            &request("rpcutil", "{not json", "a"),
            crate::choria::client::now_nanos(),
        );
        let b = body(&h);
        assert_eq!(b["statuscode"], 4);
        assert_eq!(b["action"], "");
        assert!(b["statusmsg"]
            .as_str()
            .unwrap()
            .starts_with("Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: "));
    }
}
