//! `choria-provisioner revoke NODE --reason TEXT` and `unrevoke NODE`: a
//! sealed revocation in the revocations' bucket (`<records.bucket>_REVOCATIONS`).
//! Every replica reads it within a second or so; from then on the identity
//! is never provisioned or asked to renew, and its credentials run out at
//! their expiry. `unrevoke` writes a sealed lifting (a deleted key lifts
//! nothing).

use anyhow::{bail, Context, Result};
use choria_config::ProvisionerConfig;
use choria_core::records::revocations::{Revocation, RevocationStore};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RevokeArgs {
    /// The node's identity.
    pub node: String,
    /// Why: shown in the provisioner's log, the audit stream and errors.
    #[arg(long)]
    pub reason: String,
    /// The provisioner's configuration: its `records:` say where the
    /// revocations are and which key seals them.
    #[arg(
        long,
        default_value = "/etc/choria-provisioner/choria-provisioner.yaml"
    )]
    pub config: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct UnrevokeArgs {
    /// The node's identity.
    pub node: String,
    /// Why the revocation is lifted.
    #[arg(long, default_value = "unrevoked")]
    pub reason: String,
    #[arg(
        long,
        default_value = "/etc/choria-provisioner/choria-provisioner.yaml"
    )]
    pub config: PathBuf,
}

pub async fn revoke(args: RevokeArgs) -> Result<()> {
    write(&args.config, &args.node, true, &args.reason).await?;
    println!("revoked {}", args.node);
    Ok(())
}

pub async fn unrevoke(args: UnrevokeArgs) -> Result<()> {
    write(&args.config, &args.node, false, &args.reason).await?;
    println!("unrevoked {}", args.node);
    Ok(())
}

async fn write(config: &std::path::Path, node: &str, revoked: bool, reason: &str) -> Result<()> {
    choria_wire::identity::validate(node).map_err(|e| anyhow::anyhow!("{node:?}: {e}"))?;
    if reason.trim().is_empty() {
        bail!("--reason is empty: say why, it is what the log and the audit stream show");
    }
    let cfg = ProvisionerConfig::load(config)?;
    let Some(records) = &cfg.records else {
        bail!(
            "{}: no records: section; revocations live beside the records (see records: in the configuration reference)",
            config.display()
        );
    };
    let (key, verifier) = choria_core::records::store::seal_keys(records)?;
    let store = RevocationStore::connect(
        records,
        key,
        verifier,
        &cfg.site,
        "choria-provisioner revoke",
    )
    .await
    .context("writing the revocation")?;
    let now = chrono::Utc::now();
    let by = who();
    store
        .put(&Revocation {
            identity: node.to_string(),
            revoked,
            reason: reason.to_string(),
            time: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            time_unix: now.timestamp(),
            by,
            site: cfg.site.clone(),
            n: 0,
        })
        .await
        .context("writing the revocation")?;
    Ok(())
}

/// Who writes: the command's user and host.
pub fn who() -> String {
    format!(
        "{}@{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
        hostname()
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
