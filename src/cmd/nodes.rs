//! `choria-provisioner nodes`: the records of provisioned nodes (see
//! `records:` in `provisioner.yaml`), optionally only those expiring soon.
//! Records whose seal is not ours are listed as unverified, with why, and
//! never counted as expiring.

use anyhow::{bail, Context, Result};
use choria_config::duration::parse_duration;
use choria_config::ProvisionerConfig;
use choria_core::provision::day_two::renewal::{can_return, Schedule};
use choria_core::records::sealed::Read;
use choria_core::records::store::{sealer, RecordStore};
use choria_core::records::Record;
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
    /// One JSON object per line (the record, `verified`, `state`) instead
    /// of a table.
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
    let sealer = sealer(records, &cfg.site)?;
    let store = RecordStore::connect_read_only(records, sealer, "choria-provisioner nodes")
        .await
        .context("reading the records")?;
    let now = chrono::Utc::now().timestamp();
    let mut shown: Vec<Listed> = store
        .all()
        .await?
        .into_iter()
        .map(|read| Listed::new(read, cfg.renewal.as_ref(), now))
        .collect();
    mark_revoked(&mut shown, records, &cfg.site).await?;
    if let Some(within) = args.expiring {
        let until = now + within.as_secs() as i64;
        shown.retain(|l| {
            l.verified
                && l.record
                    .as_ref()
                    .and_then(|r| r.expiry())
                    .is_some_and(|(_, e)| e <= until)
        });
    }
    if args.json {
        for l in &shown {
            println!("{}", l.json()?);
        }
        return Ok(());
    }
    print!("{}", table(&shown, now));
    Ok(())
}

/// Marks the revoked nodes (and lists those revoked with no record).
async fn mark_revoked(
    shown: &mut Vec<Listed>,
    records: &choria_config::day_two::RecordsConfig,
    site: &str,
) -> Result<()> {
    let (key, verifier) = choria_core::records::store::seal_keys(records)?;
    let store = choria_core::records::revocations::RevocationStore::connect_read_only(
        records,
        key,
        verifier,
        site,
        "choria-provisioner nodes",
    )
    .await
    .context("reading the revocations")?;
    for r in store.revoked().await? {
        let one = |s: &str| choria_core::provision::one_line(s, 200);
        let state = format!(
            "REVOKED {} by {}: {}",
            one(&r.time),
            one(&r.by),
            one(&r.reason)
        );
        match shown.iter_mut().find(|l| l.key == r.identity) {
            Some(l) => l.state = state,
            None => shown.push(Listed {
                key: r.identity.clone(),
                record: None,
                verified: true,
                state,
            }),
        }
    }
    shown.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(())
}

/// One line of the listing.
pub struct Listed {
    pub key: String,
    pub record: Option<Record>,
    pub verified: bool,
    /// What renewal makes of it, or why it is not trusted.
    pub state: String,
}

impl Listed {
    pub fn new(
        read: Read,
        renewal: Option<&choria_config::day_two::RenewalConfig>,
        now: i64,
    ) -> Self {
        match read {
            Read::Verified(r) => Listed {
                key: r.identity.clone(),
                state: renewal
                    .map(|c| renewal_state(&r, c, now))
                    .unwrap_or_default(),
                record: Some(*r),
                verified: true,
            },
            Read::Refused { key, why, record } => Listed {
                key,
                record: record.map(|r| *r),
                verified: false,
                state: why.describe().to_string(),
            },
        }
    }

    fn json(&self) -> Result<String> {
        let mut v = match &self.record {
            Some(r) => serde_json::to_value(r)?,
            None => serde_json::json!({ "identity": self.key }),
        };
        v["verified"] = self.verified.into();
        v["state"] = self.state.clone().into();
        Ok(serde_json::to_string(&v)?)
    }
}

/// When renewal asks the node, or why it never will.
fn renewal_state(r: &Record, cfg: &choria_config::day_two::RenewalConfig, now: i64) -> String {
    let mut s = Schedule::default();
    s.upsert(r, cfg);
    let Some(at) = s.due_at(&r.identity) else {
        return "nothing expires".into();
    };
    if !can_return(r.provisioning_jwt_expires_unix, at.max(now), cfg.retry) {
        return format!(
            "cannot return: its provisioning JWT expires {} ({}), before it could be renewed",
            date(r.provisioning_jwt_expires_unix.unwrap_or_default()),
            left(r.provisioning_jwt_expires_unix.unwrap_or_default() - now)
        );
    }
    if at <= now {
        "due now".into()
    } else {
        format!("due in {}", left(at - now))
    }
}

fn date(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M").to_string())
        .unwrap_or_default()
}

/// The listing: one line per node, expiry as a date and how far away;
/// every cell cleaned for the terminal ([`super::table`]: an unverified
/// record is what someone else wrote).
pub fn table(listed: &[Listed], now: i64) -> String {
    use super::table::{Column, Table};
    let col = |header, max| Column { header, max };
    let mut t = Table::new(vec![
        col("NODE", 60),
        col("PROVISIONED", 20),
        col("REPLICA", 60),
        col("MODE", 16),
        col("EXPIRES", 30),
        col("ISSUED", 60),
        col("STATE", 0),
    ]);
    for l in listed {
        let Some(r) = &l.record else {
            let dash = || "-".to_string();
            t.row(vec![
                l.key.clone(),
                dash(),
                dash(),
                dash(),
                dash(),
                dash(),
                l.state.clone(),
            ]);
            continue;
        };
        let expires = r
            .expiry()
            .map(|(_, e)| format!("{} ({})", date(e), left(e - now)))
            .unwrap_or_else(|| "-".into());
        let issued = match (&r.certificate, &r.server_jwt) {
            (Some(c), _) => format!("certificate {}", c.serial),
            (None, Some(j)) => format!("server JWT {}", j.jti),
            (None, None) => "-".into(),
        };
        t.row(vec![
            // Its key in the bucket: an unverified record may name another.
            l.key.clone(),
            r.time.clone(),
            r.replica.clone(),
            r.mode.clone(),
            expires,
            issued,
            l.state.clone(),
        ]);
    }
    t.render(false)
}

fn left(seconds: i64) -> String {
    match seconds {
        s if s < 0 => "expired".into(),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
