//! `choria-provisioner revoke NODE --reason TEXT` and `unrevoke NODE`: a
//! sealed revocation in the revocations' bucket (`<records.bucket>_REVOCATIONS`).
//! Every replica reads it within a second or so; from then on the identity
//! is never provisioned or asked to renew, and its credentials run out at
//! their expiry. `unrevoke` writes a sealed lifting (a deleted key lifts
//! nothing).

use anyhow::{bail, Context, Result};
use choria_config::ProvisionerConfig;
use choria_core::records::store::RecordStore;
use choria_core::revocations::{Revocation, RevocationStore};
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
    /// Revoke an identity that has no record (never provisioned here, or
    /// not yet): without it, such a name is refused as a likely typo.
    #[arg(long)]
    pub force: bool,
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
    if !args.force {
        on_record(&args.config, &args.node).await?;
    }
    write(&args.config, &args.node, true, &args.reason).await?;
    println!("revoked {}", args.node);
    Ok(())
}

pub async fn unrevoke(args: UnrevokeArgs) -> Result<()> {
    write(&args.config, &args.node, false, &args.reason).await?;
    println!("unrevoked {}", args.node);
    Ok(())
}

/// Fails unless `node` has a record: a name never provisioned here is more
/// often a typo than a node to keep out.
async fn on_record(config: &std::path::Path, node: &str) -> Result<()> {
    choria_wire::identity::validate(node).map_err(|e| anyhow::anyhow!("{node:?}: {e}"))?;
    let cfg = ProvisionerConfig::load(config)?;
    let Some(records) = &cfg.records else {
        return Ok(());
    };
    let sealer = choria_core::records::store::sealer(records, &cfg.site)?;
    let found =
        match RecordStore::connect_read_only(records, sealer, "choria-provisioner revoke").await {
            Ok(store) => store.ever_written(node).await,
            Err(e) => Err(e),
        };
    // A read-only open of a bucket never made says Missing: no records.
    let found = match found {
        Err(choria_core::records::store::RecordsError::Missing { .. }) => Ok(false),
        other => other,
    };
    match found {
        Ok(true) => Ok(()),
        Ok(false) => bail!(
            "{node} has no record: it was never provisioned here (a typo?); revoke it anyway, before it arrives, with --force"
        ),
        Err(e) => bail!(
            "cannot read the records to see whether {node} was provisioned ({e}); revoke it anyway with --force"
        ),
    }
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
