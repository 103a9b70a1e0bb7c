//! `choria-provisioner discover`: broadcast discovery of provisioning-mode
//! servers, as the provisioner does it, and optionally their inventory.

use super::broker::BrokerArgs;
use anyhow::{Context, Result};
use choria_wire::client::{
    self, BrokerOptions, ChoriaClient, ConnectOptions, DiscoveryOptions, Identity,
};
use choria_wire::filter::Filter;
use choria_wire::protocol::RequestSigner;
use choria_wire::security::{ed25519::parse_seed_hex, tokens};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Our identity (`senderid`).
    #[arg(long, default_value = "provisioner.example.net")]
    pub identity: String,
    /// The caller id; defaults to `choria=<identity>` for v1 and to the
    /// client JWT's `callerid` for v2.
    #[arg(long)]
    pub caller: Option<String>,
    /// v2: the client JWT (its `callerid` claim becomes the caller).
    #[arg(long, requires = "seed_file")]
    pub token_file: Option<PathBuf>,
    /// v2: the hex ed25519 seed that signs requests.
    #[arg(long, requires = "token_file")]
    pub seed_file: Option<PathBuf>,
    /// Discovery ends this long after the last reply.
    #[arg(long, default_value_t = 300)]
    pub window_ms: u64,
    /// Discovery never takes longer than this.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
    /// Fetch `rpcutil#inventory` from this many of the discovered nodes.
    #[arg(long, default_value_t = 0)]
    pub inventory: usize,
}

/// The signer, caller and NATS credentials: v2 from a client JWT and seed,
/// else v1 without protocol security.
type Credentials = (
    RequestSigner,
    String,
    Option<(String, ed25519_dalek::SigningKey)>,
);

fn credentials(args: &DiscoverArgs) -> Result<Credentials> {
    let (Some(token_file), Some(seed_file)) = (&args.token_file, &args.seed_file) else {
        let caller = args
            .caller
            .clone()
            .unwrap_or_else(|| format!("choria={}", args.identity));
        return Ok((RequestSigner::V1Insecure, caller, None));
    };
    let jwt = read_trimmed(token_file, "--token-file")?;
    let seed = parse_seed_hex(&read_trimmed(seed_file, "--seed-file")?)
        .with_context(|| format!("--seed-file {}", seed_file.display()))?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let claims = tokens::parse_client_id_token_unverified(&jwt).with_context(|| {
        format!(
            "--token-file {} is not a Choria client JWT",
            token_file.display()
        )
    })?;
    let caller = args.caller.clone().unwrap_or(claims.caller_id);
    let signer = RequestSigner::V2 {
        seed: Box::new(key.clone()),
        jwt: jwt.clone(),
    };
    Ok((signer, caller, Some((jwt, key))))
}

fn read_trimmed(path: &Path, flag: &str) -> Result<String> {
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading {flag} {}", path.display()))?
        .trim()
        .to_string())
}

pub async fn run(args: DiscoverArgs) -> Result<()> {
    let (signer, caller, nats_jwt) = credentials(&args)?;
    let broker = BrokerOptions::from(args.broker);
    let nats = client::connect(&ConnectOptions {
        tls: broker.tls(),
        servers: broker.nats,
        name: format!("{}-discover", args.identity),
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
    let started = Instant::now();
    let nodes = client
        .discover(
            &Filter::with_agent("choria_provision"),
            DiscoveryOptions {
                timeout: Duration::from_millis(args.timeout_ms),
                sliding_window: Some(Duration::from_millis(args.window_ms)),
                ..Default::default()
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
