//! `choria-provisioner rebind NODE --reason TEXT [--instance ID]`: moves a
//! name to another cloud instance, or frees it for the next instance that
//! presents valid evidence under it (a replaced machine: the honest case
//! of a name bound to an instance that no longer exists). A sealed,
//! numbered word in `<records.bucket>_NAMES`, read by every replica at its
//! next node of that name, and an audit event when `audit:` is set.

use anyhow::{bail, Context, Result};
use choria_config::ProvisionerConfig;
use choria_core::audit::event::{Event, Kind};
use choria_core::bindings::{Bindings, Side};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RebindArgs {
    /// The node's identity.
    pub node: String,
    /// Why: kept in the binding and the audit stream.
    #[arg(long)]
    pub reason: String,
    /// The instance the name is bound to from now on, as the provisioner
    /// names instances (`aws.<account>.<instance id>`, `gcp.<project>.<id>`,
    /// `azure.<subscription>.<vm id>`; `nodes` and the audit stream show
    /// them). Without it the name is freed: the next instance to present
    /// valid evidence under it takes it.
    #[arg(long)]
    pub instance: Option<String>,
    /// The provisioner's configuration: its `records:` say where the
    /// bindings are and which key seals them.
    #[arg(
        long,
        default_value = "/etc/choria-provisioner/choria-provisioner.yaml"
    )]
    pub config: PathBuf,
}

pub async fn run(args: RebindArgs) -> Result<()> {
    choria_wire::identity::validate(&args.node)
        .map_err(|e| anyhow::anyhow!("{:?}: {e}", args.node))?;
    if args.reason.trim().is_empty() {
        bail!("--reason is empty: say why, it is what the audit stream shows");
    }
    let instance = args.instance.clone().unwrap_or_default();
    if instance.contains(|c: char| c.is_whitespace() || c.is_control() || c == '*' || c == '>') {
        bail!("--instance {instance:?} is not an instance name (provider.account.id)");
    }
    let cfg = ProvisionerConfig::load(&args.config)?;
    let Some(records) = &cfg.records else {
        bail!(
            "{}: no records: section; the bindings live beside the records",
            args.config.display()
        );
    };
    let (key, verifier) = choria_core::records::store::seal_keys(records)?;
    let names = Bindings::connect_side(
        records,
        Side::Names,
        key.clone(),
        verifier,
        &cfg.site,
        "choria-provisioner rebind",
    )
    .await
    .context("opening the bindings")?;
    let by = super::revoke::who();
    let now = chrono::Utc::now().timestamp();
    let word = names
        .rebind(&args.node, &instance, &by, &args.reason, now)
        .await
        .context("writing the binding")?;
    if let Some(audit) = &cfg.audit {
        let event = Event::new(
            Kind::Rebound,
            &args.node,
            &format!("choria-provisioner/{}/{by}", cfg.site),
            serde_json::json!({"step": "rebind", "reason": format!("{} (instance {})", args.reason, if instance.is_empty() { "any" } else { &instance }), "n": word.n}),
        );
        choria_core::audit::writer::publish_one(
            records,
            audit,
            &key,
            &cfg.site,
            Kind::Rebound,
            &event,
        )
        .await
        .map_err(anyhow::Error::msg)
        .context("auditing the rebinding")?;
    }
    match args.instance {
        Some(i) => println!("{} is bound to instance {i} from now on", args.node),
        None => println!(
            "{} is free: the next instance to present valid evidence under it takes it",
            args.node
        ),
    }
    Ok(())
}
