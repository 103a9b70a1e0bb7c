//! `choria-provisioner nodes`: the records of provisioned nodes (see
//! `records:` in `provisioner.yaml`), optionally only those expiring soon.

use crate::config::duration::parse_duration;
use crate::config::ProvisionerConfig;
use crate::records::store::RecordStore;
use crate::records::Record;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct NodesArgs {
    /// The provisioner's configuration: its `records:` say where they are.
    #[arg(
        long,
        default_value = "/etc/choria-provisioner/choria-provisioner.yaml"
    )]
    pub config: PathBuf,
    /// Only nodes whose credentials expire within this (`30d`, `12h`).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub expiring: Option<Duration>,
    /// One JSON record per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

pub async fn run(args: NodesArgs) -> Result<()> {
    let cfg = ProvisionerConfig::load(&args.config)?;
    let Some(records) = &cfg.records else {
        bail!(
            "{}: no records: section, so nothing is recorded (see records: in the configuration reference)",
            args.config.display()
        );
    };
    let store = RecordStore::connect(records, "choria-provisioner nodes")
        .await
        .context("reading the records")?;
    let now = chrono::Utc::now().timestamp();
    let mut shown: Vec<Record> = store.all().await?;
    if let Some(within) = args.expiring {
        let until = now + within.as_secs() as i64;
        shown.retain(|r| r.expiry().is_some_and(|(_, e)| e <= until));
    }
    if args.json {
        for r in &shown {
            println!("{}", serde_json::to_string(r)?);
        }
        return Ok(());
    }
    print!("{}", table(&shown, now));
    Ok(())
}

/// The listing: one line per node, expiry as a date and how far away.
pub fn table(records: &[Record], now: i64) -> String {
    let mut out = format!(
        "{:<40} {:<20} {:<24} {:<16} {:<20} {}\n",
        "NODE", "PROVISIONED", "REPLICA", "MODE", "EXPIRES", "ISSUED"
    );
    for r in records {
        let expires = r
            .expiry()
            .map(|(_, e)| {
                let at = chrono::DateTime::from_timestamp(e, 0)
                    .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
                    .unwrap_or_default();
                format!("{at} ({})", left(e - now))
            })
            .unwrap_or_else(|| "-".into());
        let issued = match (&r.certificate, &r.server_jwt) {
            (Some(c), _) => format!("certificate {}", c.serial),
            (None, Some(j)) => format!("server JWT {}", j.jti),
            (None, None) => "-".into(),
        };
        out.push_str(&format!(
            "{:<40} {:<20} {:<24} {:<16} {:<20} {}\n",
            r.identity, r.time, r.replica, r.mode, expires, issued
        ));
    }
    out
}

fn left(seconds: i64) -> String {
    match seconds {
        s if s < 0 => "expired".into(),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
