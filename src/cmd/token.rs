//! `choria-provisioner token issue`: a provisioning JWT minted for one node
//! (a join token), in the format `choria jwt prov` writes, with the node's
//! identity in its `extensions`. go-choria servers take it unchanged; the
//! provisioner refuses it under any other name.
//!
//! Sign it with the key `jwt_verify_cert` trusts (the one `choria jwt prov`
//! is given), and place it where the node's go-choria build reads its
//! provisioning JWT.
//!
//! A node comes back through provisioning with this same token each time
//! renewal asks it to (go-choria keeps its provisioning JWT), and renewal
//! never asks a node whose provisioning JWT expires first: the token's
//! lifetime is how long the node can be renewed. With `--config`, a token
//! that would not outlive one lifetime of the credentials the provisioner
//! issues is refused; without it, the date after which the node cannot be
//! renewed is said.

use anyhow::{Context, Result};
use choria_config::duration::parse_duration;
use choria_wire::security::tokens::{ProvisioningClaims, TokenSigningKey};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum TokenCommand {
    /// Mint a provisioning JWT bound to one node's identity.
    Issue(IssueArgs),
}

#[derive(clap::Args, Debug)]
pub struct IssueArgs {
    /// The node's identity: the only name the token is accepted under.
    #[arg(long)]
    pub identity: String,
    /// How long the token is valid (`24h`, `90d`, `1y`): also how long the
    /// node can be renewed (renewal never asks a node whose provisioning JWT
    /// expires first).
    #[arg(long, default_value = "1y", value_parser = duration)]
    pub ttl: Duration,
    /// The signing key: an RSA PEM or a hex ed25519 seed file, the key
    /// `jwt_verify_cert` verifies.
    #[arg(long)]
    pub signer: PathBuf,
    /// The provisioning token (`cht`) the node expects in requests; prefer
    /// `--token-file` or the environment (a command line shows in `ps` and
    /// the shell's history).
    #[arg(long, env = "CHORIA_PROVISIONING_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the provisioning token from this file.
    #[arg(long, conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// The facts file the node reads (`chf`), where its instance identity
    /// evidence goes (`instance_identity`).
    #[arg(long)]
    pub facts: Option<String>,
    /// The provisioner's configuration: the token is refused when it would
    /// not outlive one lifetime of the credentials it issues (with
    /// `renewal:`), as the node could not come back to renew them.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Broker URLs the node connects to in provisioning mode (`chu`).
    #[arg(long, default_value = "")]
    pub urls: String,
    /// An SRV domain instead of `--urls` (`chsrv`).
    #[arg(long, default_value = "")]
    pub srv: String,
    /// The node speaks protocol v2 (`v2`).
    #[arg(long)]
    pub protocol_v2: bool,
    /// Write the token to this file (mode 0600) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

pub fn run(args: TokenArgs) -> Result<()> {
    let TokenCommand::Issue(a) = args.command;
    choria_wire::identity::validate(&a.identity)
        .map_err(|e| anyhow::anyhow!("--identity {:?}: {e}", a.identity))?;
    let key = TokenSigningKey::from_file(&a.signer)
        .with_context(|| format!("--signer {}", a.signer.display()))?;
    let token = match (&a.token, &a.token_file) {
        (_, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("--token-file {}", f.display()))?
            .trim()
            .to_string(),
        (Some(t), None) => t.clone(),
        (None, None) => String::new(),
    };
    match &a.config {
        Some(config) => outlives_credentials(config, a.ttl)?,
        None => eprintln!(
            "the node can be renewed until this token expires, {} (renewal never asks a node whose provisioning JWT expires first); give --config to check that against the credentials' lifetime",
            (chrono::Utc::now() + chrono::Duration::from_std(a.ttl).unwrap_or_default())
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
    }
    let now = chrono::Utc::now().timestamp();
    let mut claims = ProvisioningClaims::new_at(&token, &a.urls, &a.srv, a.ttl, now)
        .context("the token's claims")?;
    claims.proto_v2 = a.protocol_v2;
    if let Some(f) = &a.facts {
        claims.prov_facts = f.clone();
    }
    claims.bind_identity(&a.identity);
    let jwt = key.sign(&claims).context("signing the token")?;
    match &a.out {
        Some(path) => write_private(path, &jwt)?,
        None => println!("{jwt}"),
    }
    Ok(())
}

/// Refuses a `ttl` that would not outlive one lifetime of the credentials
/// `config` issues, and `renewal.retry` besides: a node joined with it could
/// not come back to renew them.
fn outlives_credentials(config: &std::path::Path, ttl: Duration) -> Result<()> {
    let cfg = choria_config::ProvisionerConfig::load(config)?;
    let Some(renewal) = &cfg.renewal else {
        return Ok(());
    };
    let Some(longest) = cfg.issued_lifetime_longest() else {
        eprintln!(
            "{}: the credentials' lifetime is the helper's to choose, so it cannot be checked; the node can be renewed while this token is valid",
            config.display()
        );
        return Ok(());
    };
    let needed = round_up(longest.lifetime + renewal.retry + RETURN_MARGIN);
    if ttl < needed {
        anyhow::bail!(
            "--ttl {} would strand the node: its credentials live {} ({}) and it must be able to come back with this token to renew them; give --ttl {} or more",
            choria_config::duration::format_duration(ttl),
            choria_config::duration::format_duration(longest.lifetime),
            longest.setting,
            choria_config::duration::format_duration(needed)
        );
    }
    Ok(())
}

/// `d` up to whole days (from two days on) or hours, as a person would
/// write a `--ttl`.
fn round_up(d: Duration) -> Duration {
    let unit = if d >= Duration::from_secs(2 * 86_400) {
        86_400
    } else {
        3_600
    };
    Duration::from_secs(d.as_secs().div_ceil(unit) * unit)
}

/// What renewal leaves besides `renewal.retry` before a provisioning JWT's
/// expiry (as `renewal` does).
const RETURN_MARGIN: Duration = Duration::from_secs(60);

/// Writes `text` readable by its owner only: the token holds `cht`.
fn write_private(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}
