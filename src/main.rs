//! The `choria-provisioner` binary: one executable, several subcommands.

use anyhow::{Context, Result};
use choria_provisioner::choria::client::{
    self, ChoriaClient, ConnectOptions, DiscoveryOptions, Identity,
};
use choria_provisioner::choria::filter::Filter;
use choria_provisioner::choria::protocol::{RequestSigner, Version};
use choria_provisioner::choria::tls::TlsSettings;
use choria_provisioner::fleet::{self, FleetOptions};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "choria-provisioner",
    version,
    about = "Provisioning service, operator and fleet simulator for Choria"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true, env = "CHORIA_PROVISIONER_LOG_FORMAT")]
    log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `choria_provisioner=debug`.
    #[arg(
        long,
        default_value = "info",
        global = true,
        env = "CHORIA_PROVISIONER_LOG"
    )]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate many Choria Servers in provisioning mode.
    Fleet(FleetArgs),
    /// Discover provisioning-mode servers and optionally fetch their inventory.
    Discover(DiscoverArgs),
}

#[derive(Args)]
struct NatsArgs {
    /// NATS server URL(s); repeat or separate with commas.
    #[arg(long, default_value = "nats://127.0.0.1:4222", value_delimiter = ',')]
    nats: Vec<String>,
    /// Verify the broker's TLS certificate against this CA (otherwise TLS, when
    /// used, does not verify, like a provisioning-mode server).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// Always use TLS.
    #[arg(long)]
    tls_required: bool,
}

impl NatsArgs {
    fn tls(&self) -> TlsSettings {
        TlsSettings {
            required: self.tls_required,
            insecure_skip_verify: self.tls_ca.is_none(),
            ca_file: self.tls_ca.clone(),
            client_cert: None,
        }
    }
}

#[derive(Args)]
struct FleetArgs {
    #[command(flatten)]
    nats: NatsArgs,
    /// How many servers to simulate.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// The provisioning token (`cht` claim) the nodes expect; empty accepts any.
    #[arg(
        long,
        default_value = "",
        env = "CHORIA_FLEET_TOKEN",
        hide_env_values = true
    )]
    token: String,
    /// Key that signs the provisioning JWT: RSA PEM (PKCS#1 or PKCS#8) or a hex
    /// ed25519 seed. Without it a throwaway ed25519 key is used and its public key logged.
    #[arg(long)]
    jwt_signer: Option<PathBuf>,
    /// Protocol the nodes speak (the provisioning JWT's `v2` claim).
    #[arg(long, default_value = "v1")]
    protocol: Version,
    /// Write a JSON-lines journal of every request and each node's final state.
    #[arg(long)]
    journal: Option<PathBuf>,
    /// Identities are `<prefix><number><suffix>`.
    #[arg(long, default_value = "node-")]
    identity_prefix: String,
    #[arg(long, default_value = ".fleet.example.net")]
    identity_suffix: String,
    /// Share of nodes (0..1) that never answer.
    #[arg(long, default_value_t = 0.0)]
    fail_silent: f64,
    /// Share of nodes that answer RPCs with an error status.
    #[arg(long, default_value_t = 0.0)]
    fail_error: f64,
    /// Share of nodes that answer RPCs with malformed replies.
    #[arg(long, default_value_t = 0.0)]
    fail_malformed: f64,
    /// Seed for choosing which nodes fail.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Allow `release_update` (the JWT's `update` claim) and report `upgradable`.
    #[arg(long)]
    upgradable: bool,
    /// The version the nodes report.
    #[arg(long, default_value = "0.30.2")]
    server_version: String,
    /// Pre-generated RSA keys shared by `gencsr` (generating one per node is slow).
    #[arg(long, default_value_t = 16)]
    key_pool: usize,
    /// NATS connections the nodes are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Stop after this many seconds.
    #[arg(long)]
    duration: Option<u64>,
    /// Stop once every node without injected failures has been provisioned.
    #[arg(long)]
    exit_when_done: bool,
    /// Facts (a JSON object) every node reports in its inventory.
    #[arg(long, default_value = "{}")]
    facts: String,
}

#[derive(Args)]
struct DiscoverArgs {
    #[command(flatten)]
    nats: NatsArgs,
    /// Our identity (`senderid`).
    #[arg(long, default_value = "provisioner.example.net")]
    identity: String,
    /// The caller id; defaults to `choria=<identity>` for v1.
    #[arg(long)]
    caller: Option<String>,
    /// v2: the client JWT (its `callerid` claim becomes the caller).
    #[arg(long, requires = "seed_file")]
    token_file: Option<PathBuf>,
    /// v2: the hex ed25519 seed that signs requests.
    #[arg(long, requires = "token_file")]
    seed_file: Option<PathBuf>,
    /// Discovery ends this long after the last reply.
    #[arg(long, default_value_t = 300)]
    window_ms: u64,
    /// Discovery never takes longer than this.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Fetch `rpcutil#inventory` from this many of the discovered nodes.
    #[arg(long, default_value_t = 0)]
    inventory: usize,
}

fn init_tracing(cli: &Cli) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).with_context(|| {
        format!(
            "--log {:?} is not a valid log filter; use a level such as info or debug, or e.g. choria_provisioner=debug",
            cli.log
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing(&cli)?;
    match cli.command {
        Command::Fleet(args) => run_fleet(args).await,
        Command::Discover(args) => run_discover(args).await,
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn run_fleet(args: FleetArgs) -> Result<()> {
    let facts: serde_json::Value =
        serde_json::from_str(&args.facts).context("--facts must be a JSON object")?;
    anyhow::ensure!(facts.is_object(), "--facts must be a JSON object");
    let opts = FleetOptions {
        tls: args.nats.tls(),
        nats: args.nats.nats,
        nodes: args.nodes,
        token: args.token,
        jwt_signer: args.jwt_signer,
        protocol: args.protocol,
        journal: args.journal,
        identity_prefix: args.identity_prefix,
        identity_suffix: args.identity_suffix,
        fail_silent: args.fail_silent,
        fail_error: args.fail_error,
        fail_malformed: args.fail_malformed,
        seed: args.seed,
        upgradable: args.upgradable,
        server_version: args.server_version,
        key_pool_size: args.key_pool,
        connections: args.connections,
        duration: args.duration.map(Duration::from_secs),
        exit_when_done: args.exit_when_done,
        facts,
    };
    let summary = fleet::run(opts, shutdown_signal()).await?;
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

async fn run_discover(args: DiscoverArgs) -> Result<()> {
    let (signer, caller, nats_jwt) = match (&args.token_file, &args.seed_file) {
        (Some(token_file), Some(seed_file)) => {
            let jwt = std::fs::read_to_string(token_file)
                .with_context(|| format!("reading --token-file {}", token_file.display()))?
                .trim()
                .to_string();
            let seed_hex = std::fs::read_to_string(seed_file)
                .with_context(|| format!("reading --seed-file {}", seed_file.display()))?;
            let seed =
                choria_provisioner::choria::security::ed25519::parse_seed_hex(seed_hex.trim())
                    .with_context(|| format!("--seed-file {}", seed_file.display()))?;
            let key = ed25519_dalek::SigningKey::from_bytes(&seed);
            let claims: serde_json::Value =
                choria_provisioner::choria::security::tokens::parse_unverified(&jwt).with_context(
                    || format!("--token-file {} is not a JWT", token_file.display()),
                )?;
            let caller = args.caller.clone().unwrap_or_else(|| {
                claims
                    .get("callerid")
                    .and_then(|c| c.as_str())
                    .unwrap_or(&args.identity)
                    .to_string()
            });
            (
                RequestSigner::V2 {
                    seed: Box::new(key.clone()),
                    jwt: jwt.clone(),
                },
                caller,
                Some((jwt, key)),
            )
        }
        _ => (
            RequestSigner::V1Insecure,
            args.caller
                .clone()
                .unwrap_or_else(|| format!("choria={}", args.identity)),
            None,
        ),
    };
    let nats = client::connect(&ConnectOptions {
        servers: args.nats.nats.clone(),
        name: format!("{}-discover", args.identity),
        tls: args.nats.tls(),
        nats_jwt,
        ..Default::default()
    })
    .await?;
    let client = ChoriaClient::new(
        nats,
        Identity {
            identity: args.identity.clone(),
            caller,
            signer,
        },
    );
    let started = std::time::Instant::now();
    let nodes = client
        .discover(
            &Filter::with_agent("choria_provision"),
            DiscoveryOptions {
                timeout: Duration::from_millis(args.timeout_ms),
                sliding_window: Some(Duration::from_millis(args.window_ms)),
            },
        )
        .await?;
    eprintln!(
        "discovered {} node(s) in {:?}",
        nodes.len(),
        started.elapsed()
    );
    for node in &nodes {
        println!("{node}");
    }
    for node in nodes.iter().take(args.inventory) {
        match client
            .rpc(node, "rpcutil", "inventory", &serde_json::json!({}))
            .await
        {
            Ok(result) => println!(
                "{node} inventory ({}): {}",
                result.body.statusmsg,
                serde_json::to_string(&result.body.data)?
            ),
            Err(e) => println!("{node} inventory failed: {e}"),
        }
    }
    Ok(())
}
