//! `choria-provisioner token issue`: a provisioning JWT minted for one node
//! (a join token), in the format `choria jwt prov` writes, with the node's
//! identity in its `extensions`. go-choria servers take it unchanged; the
//! provisioner refuses it under any other name.
//!
//! Sign it with the key `jwt_verify_cert` trusts (the one `choria jwt prov`
//! is given), and place it where the node's go-choria build reads its
//! provisioning JWT.

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
    /// How long the token is valid (`24h`, `7d`).
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub ttl: Duration,
    /// The signing key: an RSA PEM or a hex ed25519 seed file, the key
    /// `jwt_verify_cert` verifies.
    #[arg(long)]
    pub signer: PathBuf,
    /// The provisioning token (`cht`) the node expects in requests.
    #[arg(long, default_value = "")]
    pub token: String,
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
    let now = chrono::Utc::now().timestamp();
    let mut claims = ProvisioningClaims::new_at(&a.token, &a.urls, &a.srv, a.ttl, now)
        .context("the token's claims")?;
    claims.proto_v2 = a.protocol_v2;
    claims.bind_identity(&a.identity);
    let jwt = key.sign(&claims).context("signing the token")?;
    match &a.out {
        Some(path) => write_private(path, &jwt)?,
        None => println!("{jwt}"),
    }
    Ok(())
}

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
