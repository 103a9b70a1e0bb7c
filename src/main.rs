//! The `choria-provisioner` binary: one executable, several subcommands.

use anyhow::{Context, Result};
use choria_provisioner::choria::client::{
    self, ChoriaClient, ConnectOptions, DiscoveryOptions, Identity,
};
use choria_provisioner::choria::filter::Filter;
use choria_provisioner::choria::protocol::{RequestSigner, Version};
use choria_provisioner::choria::tls::TlsSettings;
use choria_provisioner::config::{
    self, ChoriaClientConfig, Environment, LogTarget, ProvisionerConfig,
};
use choria_provisioner::fleet::{self, FleetOptions};
use choria_provisioner::provision::{self, Provisioner};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

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
    /// Default: info; for `run`, the config's `loglevel` (Go's default: warn).
    #[arg(long, global = true, env = "CHORIA_PROVISIONER_LOG")]
    log: Option<String>,
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
    /// Run the provisioner (discovery, events, workers, helper).
    Run(RunArgs),
    /// A reference helper for trying the provisioner against `fleet`: reads a
    /// node's details as JSON on stdin and prints its configuration.
    FleetHelper(fleet::helper::FleetHelperArgs),
    /// Simulate many Choria Servers in provisioning mode.
    Fleet(FleetArgs),
    /// Discover provisioning-mode servers and optionally fetch their inventory.
    Discover(DiscoverArgs),
    /// Print the `Provisioner` CustomResourceDefinition as YAML.
    Crd,
    /// Run the Kubernetes operator for `Provisioner` resources.
    Operator(choria_provisioner::operator::OperatorArgs),
}

#[derive(Args)]
struct RunArgs {
    /// The provisioner configuration (the Go provisioner's YAML).
    #[arg(long)]
    config: PathBuf,
    /// The Choria client configuration (default: ~/.choriarc when it exists
    /// and we are not root, else /etc/choria/client.conf).
    #[arg(long)]
    choria_config: Option<PathBuf>,
    /// Write our PID to this file while running.
    #[arg(long)]
    pid: Option<PathBuf>,
    /// Log at debug level.
    #[arg(long)]
    debug: bool,
    /// Print a progress line to stderr every second.
    #[arg(long)]
    progress: bool,
    /// The `Provisioner` resource (NAMESPACE/NAME) this pod belongs to: its
    /// `spec.paused` is followed and, while leading, its status gets our name.
    #[arg(long, env = "CHORIA_PROVISIONER_RESOURCE")]
    provisioner: Option<provision::resource::ResourceRef>,
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

fn init_tracing(format: LogFormat, filter: &str, target: &LogTarget) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).with_context(|| {
        format!(
            "log filter {filter:?} is not valid; use a level such as info or debug, or e.g. choria_provisioner=debug"
        )
    })?;
    use std::io::IsTerminal;
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = match target {
        LogTarget::Stdout => std::io::stdout().is_terminal(),
        LogTarget::Stderr => std::io::stderr().is_terminal(),
        LogTarget::Discard | LogTarget::File(_) => false,
    };
    let writer = match target {
        LogTarget::Stdout => BoxMakeWriter::new(std::io::stdout),
        LogTarget::Stderr => BoxMakeWriter::new(std::io::stderr),
        LogTarget::Discard => BoxMakeWriter::new(std::io::sink),
        LogTarget::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file {}", path.display()))?;
            BoxMakeWriter::new(std::sync::Mutex::new(file))
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The helper runs once per node: no runtime and no logging on stdout.
    if let Command::FleetHelper(args) = &cli.command {
        return fleet::helper::main_with_stdio(args);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(async_main(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn async_main(cli: Cli) -> Result<()> {
    if let Command::Run(args) = cli.command {
        return run_provisioner(args, cli.log, cli.log_format).await;
    }
    init_tracing(
        cli.log_format,
        cli.log.as_deref().unwrap_or("info"),
        &LogTarget::Stderr,
    )?;
    match cli.command {
        Command::Run(_) | Command::FleetHelper(_) => unreachable!("handled above"),
        Command::Fleet(args) => run_fleet(args).await,
        Command::Discover(args) => run_discover(args).await,
        Command::Crd => {
            print!("{}", choria_provisioner::operator::crd::crd_yaml());
            Ok(())
        }
        Command::Operator(args) => {
            Ok(choria_provisioner::operator::run(args, shutdown_signal()).await?)
        }
    }
}

/// Go's `choria.UserConfig()`.
fn default_choria_config() -> PathBuf {
    let is_root = Environment::from_process().is_root;
    if !is_root {
        if let Some(home) = std::env::var_os("HOME") {
            let rc = PathBuf::from(home).join(".choriarc");
            if rc.exists() {
                return rc;
            }
        }
    }
    PathBuf::from("/etc/choria/client.conf")
}

async fn run_provisioner(args: RunArgs, log: Option<String>, format: LogFormat) -> Result<()> {
    let cfg = ProvisionerConfig::load(&args.config)
        .with_context(|| "the provisioner could not be configured")?;
    let filter = match (&log, args.debug) {
        (Some(l), _) => l.clone(),
        (None, true) => "debug".to_string(),
        (None, false) => cfg.log_level().as_filter().to_string(),
    };
    init_tracing(format, &filter, &cfg.log_target())?;
    config::log_warnings(&cfg.warnings);

    let choria_config = args.choria_config.unwrap_or_else(default_choria_config);
    let env = Environment::from_process();
    let ccfg = ChoriaClientConfig::load_with(&choria_config, &env)
        .with_context(|| "could not load the Choria client configuration")?;
    let setup = ccfg
        .client_setup(&cfg, &env)
        .with_context(|| "could not set up the Choria client")?;
    config::log_warnings(&setup.warnings);

    let _pid = match &args.pid {
        Some(path) => Some(PidFile::write(path)?),
        None => None,
    };
    let mut provisioner = Provisioner::new(cfg, setup, env!("CARGO_PKG_VERSION"));
    if let Some(r) = args.provisioner {
        provisioner = provisioner.with_resource(r);
    }
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signal.cancel();
    });
    if args.progress {
        tokio::spawn(print_progress(provisioner.handle(), shutdown.clone()));
    }
    provisioner.run(shutdown).await?;
    Ok(())
}

/// One line per second on stderr: what the demo shows while it runs.
async fn print_progress(handle: provision::Handle, stop: CancellationToken) {
    let started = std::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let m = &handle.metrics;
        let v = |name: &str| m.value(name).unwrap_or(0.0) as u64;
        let provisioned = v("choria_provisioner_provisioned");
        let minutes = started.elapsed().as_secs_f64() / 60.0;
        eprintln!(
            "[{:>5.1}s] provisioned {provisioned}  errors {}  waiting {}  queued {}  busy {}  ({:.0} nodes/min){}",
            started.elapsed().as_secs_f64(),
            v("choria_provisioner_provision_errors"),
            v("choria_provisioner_waiting_nodes"),
            v("choria_provisioner_work_queue_entries"),
            v("choria_provisioner_busy_workers"),
            provisioned as f64 / minutes.max(1e-9),
            if handle.gate.is_paused() { "  PAUSED" } else { "" },
        );
    }
}

/// Writes our PID on creation and removes the file on drop.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &std::path::Path) -> Result<Self> {
        std::fs::write(path, std::process::id().to_string())
            .with_context(|| format!("could not write the PID file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
