//! `choria-provisioner fleet`: simulated provisioning-mode servers.

use super::broker::BrokerArgs;
use anyhow::Result;
use choria_fleet::{self as fleet, Directed, FleetOptions};
use choria_wire::protocol::Version;
use std::path::PathBuf;
use std::time::Duration;

/// The command line of [`FleetOptions`]; the defaults here and in
/// `FleetOptions::default()` are kept equal by a test.
#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// How many servers to simulate.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// The provisioning token (`cht` claim) the nodes expect; empty accepts any.
    #[arg(
        long,
        default_value = "",
        env = "CHORIA_FLEET_TOKEN",
        hide_env_values = true
    )]
    pub token: String,
    /// Key that signs the provisioning JWT: RSA PEM (PKCS#1 or PKCS#8) or a hex
    /// ed25519 seed. Without it a throwaway ed25519 key is used and its public key logged.
    #[arg(long)]
    pub jwt_signer: Option<PathBuf>,
    /// Protocol the nodes speak (the provisioning JWT's `v2` claim).
    #[arg(long, default_value = "v1")]
    pub protocol: Version,
    /// Write a JSON-lines journal of every request and each node's final state.
    #[arg(long)]
    pub journal: Option<PathBuf>,
    /// Identities are `<prefix><number><suffix>`.
    #[arg(long, default_value = "node-")]
    pub identity_prefix: String,
    #[arg(long, default_value = ".fleet.example.net")]
    pub identity_suffix: String,
    /// Share of nodes (0..1) that never answer.
    #[arg(long, default_value_t = 0.0)]
    pub fail_silent: f64,
    /// Share of nodes that answer RPCs with an error status.
    #[arg(long, default_value_t = 0.0)]
    pub fail_error: f64,
    /// Share of nodes that answer RPCs with malformed replies.
    #[arg(long, default_value_t = 0.0)]
    pub fail_malformed: f64,
    /// How many nodes (the first ones) answer directed requests slowly;
    /// they are healthy, just slow (broadcast discovery is answered at once).
    #[arg(long, default_value_t = 0)]
    pub slow_nodes: usize,
    /// How long a slow node takes to answer each directed request, in ms.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub slow_delay_ms: u64,
    /// Seed for choosing which nodes fail.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Allow `release_update` (the JWT's `update` claim) and report `upgradable`.
    #[arg(long)]
    pub upgradable: bool,
    /// The version the nodes report.
    #[arg(long, default_value = "0.30.2")]
    pub server_version: String,
    /// Pre-generated RSA keys shared by `gencsr` (generating one per node is slow).
    #[arg(long = "key-pool", default_value_t = 16)]
    pub key_pool_size: usize,
    /// Sign every node's default CSR (CN = its identity) before the nodes
    /// start, so `gencsr` costs the fleet no RSA work while a benchmark is
    /// measured. The CSR is the same one `gencsr` would make.
    #[arg(long)]
    pub presign_csrs: bool,
    /// NATS connections the nodes are spread over.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How directed requests reach the nodes: `per-node` subscribes each
    /// node's own subject, as go-choria servers do (the broker sees one
    /// subscription per node; ~10 KiB of simulator memory per node, most
    /// of it the subscription's channel); `shared` subscribes
    /// `provisioning.node.>` once per connection in one queue group and
    /// hands each request to its node (~1 KiB per node: for fleets of
    /// hundreds of thousands). What the provisioner sees is the same.
    #[arg(long, value_enum, default_value_t = DirectedArg::PerNode)]
    pub directed: DirectedArg,
    /// Provisioned nodes keep serving in their collective (the first of
    /// their written `collectives`, else `mcollective`) and answer
    /// `choria_provision#reprovision` as go-choria does: for renewal tests
    /// and benchmarks. One queue subscription per connection on
    /// `*.node.>`.
    #[arg(long)]
    pub serve_provisioned: bool,
    /// Configuration keys whose written values the journal's final states
    /// record (`config_values`); other values are left out, as they may
    /// hold secrets. Repeatable.
    #[arg(long = "journal-config-key", value_name = "KEY")]
    pub journal_config_keys: Vec<String>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Stop once every node without injected failures has left provisioning.
    #[arg(long)]
    pub exit_when_done: bool,
    /// Facts (a JSON object) every node reports in its inventory.
    #[arg(long, default_value = "{}", value_parser = parse_facts)]
    pub facts: serde_json::Value,
    /// Each node presents an AWS instance identity document of an instance
    /// of its own, signed with this RSA private key (PEM) as a region's key
    /// would sign it: for trying `evidence:` on one machine, with the key's
    /// certificate as `evidence.aws_certificates`.
    #[arg(long, value_name = "PEM")]
    pub evidence_key: Option<PathBuf>,
    /// The AWS account the documents name (12 digits).
    #[arg(
        long,
        value_name = "ID",
        default_value = "123456789012",
        requires = "evidence_key"
    )]
    pub evidence_account: String,
}

/// [`Directed`] as `--directed` spells it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DirectedArg {
    PerNode,
    Shared,
}

impl From<DirectedArg> for Directed {
    fn from(arg: DirectedArg) -> Self {
        match arg {
            DirectedArg::PerNode => Directed::PerNode,
            DirectedArg::Shared => Directed::Shared,
        }
    }
}

impl From<FleetArgs> for FleetOptions {
    fn from(args: FleetArgs) -> Self {
        // Destructured so that a new flag cannot be left out of the options.
        let FleetArgs {
            broker,
            nodes,
            token,
            jwt_signer,
            protocol,
            journal,
            identity_prefix,
            identity_suffix,
            fail_silent,
            fail_error,
            fail_malformed,
            slow_nodes,
            slow_delay_ms,
            seed,
            upgradable,
            server_version,
            key_pool_size,
            presign_csrs,
            connections,
            directed,
            serve_provisioned,
            journal_config_keys,
            duration,
            exit_when_done,
            facts,
            evidence_key,
            evidence_account,
        } = args;
        FleetOptions {
            broker: broker.into(),
            nodes,
            token,
            jwt_signer,
            protocol,
            journal,
            identity_prefix,
            identity_suffix,
            fail_silent,
            fail_error,
            fail_malformed,
            slow_nodes,
            slow_delay_ms,
            seed,
            upgradable,
            server_version,
            key_pool_size,
            presign_csrs,
            connections,
            directed: directed.into(),
            serve_provisioned,
            journal_config_keys,
            duration,
            exit_when_done,
            facts,
            evidence: evidence_key.map(|key| choria_fleet::evidence::EvidenceOptions {
                account: evidence_account,
                ..choria_fleet::evidence::EvidenceOptions::new(key)
            }),
            progress: fleet::progress::Progress::Off,
        }
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|e| format!("{s:?} is not a whole number of seconds: {e}"))
}

fn parse_facts(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("must be a JSON object: {e}")),
    }
}

/// Runs the fleet until SIGTERM/SIGINT (or its own end) and prints the
/// summary as one JSON line.
pub async fn run(args: FleetArgs) -> Result<()> {
    let mut opts: FleetOptions = args.into();
    // A line a second on a terminal; into a file or a pipe only the summary.
    if super::terminal::is_terminal(true) {
        opts.progress = fleet::progress::Progress::InPlace;
    }
    let summary = fleet::run(opts, super::shutdown_signal()).await?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FleetArgs,
    }

    /// `choria-provisioner fleet LINE...` as the library receives it.
    fn options(line: &[&str]) -> Result<FleetOptions, clap::Error> {
        let argv = std::iter::once("fleet").chain(line.iter().copied());
        Ok(Cli::try_parse_from(argv)?.args.into())
    }

    #[test]
    fn the_empty_command_line_is_the_default() {
        assert_eq!(options(&[]).unwrap(), FleetOptions::default());
    }

    #[test]
    fn every_flag_reaches_the_options() {
        let o = options(&[
            "--nats=nats://a:4222,nats://b:4222",
            "--nodes=3",
            "--protocol=v2",
            "--key-pool=2",
            "--directed=shared",
            "--journal-config-key=identity",
            "--journal-config-key=loglevel",
            "--duration=90",
            r#"--facts={"rack": 7}"#,
        ])
        .unwrap();
        assert_eq!(o.broker.nats, ["nats://a:4222", "nats://b:4222"]);
        assert_eq!(o.nodes, 3);
        assert_eq!(o.protocol, Version::V2);
        assert_eq!(o.key_pool_size, 2);
        assert_eq!(o.directed, Directed::Shared);
        assert_eq!(o.journal_config_keys, ["identity", "loglevel"]);
        assert_eq!(o.duration, Some(Duration::from_secs(90)));
        assert_eq!(o.facts, serde_json::json!({"rack": 7}));
    }

    #[test]
    fn bad_values_are_refused() {
        for line in [
            &["--duration=1.5"][..],
            &["--facts=[1]"],
            &["--facts={"],
            &["--directed=per_node"],
            &["--protocol=v3"],
        ] {
            assert!(options(line).is_err(), "{line:?}");
        }
    }
}
