//! What `choria-provisioner fleet` can be told, its defaults and checks, and
//! the names its nodes get.

use crate::FleetError;
use choria_wire::client::BrokerOptions;
use choria_wire::protocol::Version;
use std::path::PathBuf;
use std::time::Duration;

/// Everything `choria-provisioner fleet` can be told (`cmd::fleet` in the
/// binary turns its command line into these), and what tests start.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetOptions {
    pub broker: BrokerOptions,
    /// How many servers to simulate.
    pub nodes: usize,
    /// The provisioning token (`cht` claim) the nodes expect; empty accepts any.
    pub token: String,
    /// Key that signs the provisioning JWT: RSA PEM (PKCS#1 or PKCS#8) or a hex
    /// ed25519 seed. Without it a throwaway ed25519 key is used and its public key logged.
    pub jwt_signer: Option<PathBuf>,
    /// Protocol the nodes speak (the provisioning JWT's `v2` claim).
    pub protocol: Version,
    /// Write a JSON-lines journal of every request and each node's final state.
    pub journal: Option<PathBuf>,
    /// Identities are `<prefix><number><suffix>`.
    pub identity_prefix: String,
    pub identity_suffix: String,
    /// Share of nodes (0..1) that never answer.
    pub fail_silent: f64,
    /// Share of nodes that answer RPCs with an error status.
    pub fail_error: f64,
    /// Share of nodes that answer RPCs with malformed replies.
    pub fail_malformed: f64,
    /// How many nodes (the first ones) answer directed requests slowly;
    /// they are healthy, just slow (broadcast discovery is answered at once).
    pub slow_nodes: usize,
    /// How long a slow node takes to answer each directed request, in ms.
    pub slow_delay_ms: u64,
    /// Seed for choosing which nodes fail.
    pub seed: u64,
    /// Allow `release_update` (the JWT's `update` claim) and report `upgradable`.
    pub upgradable: bool,
    /// The version the nodes report.
    pub server_version: String,
    /// Pre-generated RSA keys shared by `gencsr` (generating one per node is slow).
    pub key_pool_size: usize,
    /// Sign every node's default CSR (CN = its identity) before the nodes
    /// start, so `gencsr` costs the fleet no RSA work while a benchmark is
    /// measured. The CSR is the same one `gencsr` would make.
    pub presign_csrs: bool,
    /// NATS connections the nodes are spread over.
    pub connections: usize,
    /// How directed requests reach the nodes.
    pub directed: Directed,
    /// Provisioned nodes keep serving in their collective (the first of
    /// their written `collectives`, else `mcollective`) and answer
    /// `choria_provision#reprovision` as go-choria does: for renewal tests
    /// and benchmarks. One queue subscription per connection on
    /// `*.node.>`.
    pub serve_provisioned: bool,
    /// Configuration keys whose written values the journal's final states
    /// record (`config_values`); other values are left out, as they may
    /// hold secrets.
    pub journal_config_keys: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Stop once every node without injected failures has left provisioning.
    pub exit_when_done: bool,
    /// Facts (a JSON object) every node reports in its inventory.
    pub facts: serde_json::Value,
    /// Instance identity evidence in every node's facts, an instance of
    /// its own each ([`crate::evidence`]).
    pub evidence: Option<crate::evidence::EvidenceOptions>,
    /// What to show while running.
    pub progress: crate::progress::Progress,
}

impl Default for FleetOptions {
    /// The command line's defaults (a test of `cmd::fleet` keeps them equal):
    /// ten healthy v1 nodes on a local broker, accepting any token.
    fn default() -> Self {
        FleetOptions {
            broker: BrokerOptions::default(),
            nodes: 10,
            token: String::new(),
            jwt_signer: None,
            protocol: Version::V1,
            journal: None,
            identity_prefix: "node-".into(),
            identity_suffix: ".fleet.example.net".into(),
            fail_silent: 0.0,
            fail_error: 0.0,
            fail_malformed: 0.0,
            slow_nodes: 0,
            slow_delay_ms: 0,
            seed: 1,
            upgradable: false,
            server_version: "0.30.2".into(),
            key_pool_size: 16,
            presign_csrs: false,
            connections: 4,
            directed: Directed::PerNode,
            serve_provisioned: false,
            journal_config_keys: Vec::new(),
            duration: None,
            exit_when_done: false,
            facts: serde_json::json!({}),
            evidence: None,
            progress: crate::progress::Progress::Off,
        }
    }
}

/// How directed requests reach the nodes ([`FleetOptions::directed`]). What
/// the provisioner sees is the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Directed {
    /// Each node subscribes its own subject, as go-choria servers do (the
    /// broker sees one subscription per node; ~10 KiB of simulator memory per
    /// node, most of it the subscription's channel).
    #[default]
    PerNode,
    /// `provisioning.node.>` is subscribed once per connection in one queue
    /// group and each request handed to its node (~1 KiB per node: for
    /// fleets of hundreds of thousands).
    Shared,
}

impl FleetOptions {
    /// Refuses what the fleet cannot run with, before it makes anything.
    pub(crate) fn validate(&self) -> Result<(), FleetError> {
        if self.nodes == 0 {
            return Err(FleetError::Options("--nodes must be at least 1".into()));
        }
        for (name, v) in [
            ("--fail-silent", self.fail_silent),
            ("--fail-error", self.fail_error),
            ("--fail-malformed", self.fail_malformed),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(FleetError::Options(format!(
                    "{name} must be between 0 and 1, got {v}"
                )));
            }
        }
        if self.fail_silent + self.fail_error + self.fail_malformed > 1.0 + f64::EPSILON {
            return Err(FleetError::Options(
                "the failure shares add up to more than 1".into(),
            ));
        }
        if self.connections == 0 {
            return Err(FleetError::Options(
                "--connections must be at least 1".into(),
            ));
        }
        if self.broker.nats.is_empty() {
            return Err(FleetError::Options("--nats needs at least one URL".into()));
        }
        Ok(())
    }
}

/// The identity of node `i`.
pub fn identity_for(opts: &FleetOptions, i: usize) -> String {
    let width = opts.nodes.saturating_sub(1).to_string().len().max(3);
    format!(
        "{}{:0width$}{}",
        opts.identity_prefix, i, opts.identity_suffix
    )
}
