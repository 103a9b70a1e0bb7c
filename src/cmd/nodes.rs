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
    /// Every column (the replica that provisioned the node, what was
    /// issued), each cell whole; otherwise the table fits the terminal
    /// (120 columns when the output is not a terminal).
    #[arg(long)]
    pub wide: bool,
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
    let layout = super::table::Layout::stdout(args.wide);
    print!("{}", table(&shown, now, layout));
    println!("{}", count_line(&shown, args.expiring));
    Ok(())
}

/// The line under the table: how many nodes, and how many of them are not
/// trusted or revoked.
pub fn count_line(shown: &[Listed], expiring: Option<Duration>) -> String {
    let n = shown.len();
    let within = expiring
        .map(|d| {
            format!(
                " expiring within {}",
                choria_config::duration::format_duration(d)
            )
        })
        .unwrap_or_default();
    if n == 0 {
        return format!("no nodes on record{within}");
    }
    let unverified = shown.iter().filter(|l| !l.verified).count();
    let revoked = shown.iter().filter(|l| l.revoked).count();
    let mut parts = Vec::new();
    if unverified > 0 {
        parts.push(format!("{unverified} unverified"));
    }
    if revoked > 0 {
        parts.push(format!("{revoked} revoked"));
    }
    let plural = if n == 1 { "" } else { "s" };
    match parts.is_empty() {
        true => format!("{n} node{plural}{within}"),
        false => format!("{n} node{plural}{within}: {}", parts.join(", ")),
    }
}

/// Marks the revoked nodes (and lists those revoked with no record).
async fn mark_revoked(
    shown: &mut Vec<Listed>,
    records: &choria_config::day_two::RecordsConfig,
    site: &str,
) -> Result<()> {
    let (key, verifier) = choria_core::records::store::seal_keys(records)?;
    let store = choria_core::revocations::RevocationStore::connect_read_only(
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
        // The reason first: it is what a table cut to the terminal keeps.
        let state = format!(
            "REVOKED: {} (by {}, {})",
            one(&r.reason),
            one(&r.by),
            one(&r.time)
        );
        match shown.iter_mut().find(|l| l.key == r.identity) {
            Some(l) => {
                l.state = state;
                l.revoked = true;
            }
            None => shown.push(Listed {
                key: r.identity.clone(),
                record: None,
                verified: true,
                revoked: true,
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
    pub revoked: bool,
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
                revoked: false,
            },
            Read::Refused { key, why, record } => Listed {
                key,
                record: record.map(|r| *r),
                verified: false,
                revoked: false,
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
/// record is what someone else wrote). Narrow, the replica and what was
/// issued are left out and the state is cut to the width; revoked and
/// unverified rows are red, those renewal must look at soon yellow.
pub fn table(listed: &[Listed], now: i64, layout: super::table::Layout) -> String {
    use super::table::{Column, Table, Tone};
    let col = |header, max| Column { header, max };
    let mut columns = vec![col("NODE", 40), col("PROVISIONED", 20)];
    if layout.wide {
        columns.push(col("REPLICA", 0));
    }
    columns.extend([col("MODE", 10), col("EXPIRES", 22)]);
    if layout.wide {
        columns.push(col("ISSUED", 0));
    }
    columns.push(col("STATE", 0));
    let mut t = Table::new(columns);
    for l in listed {
        let dash = || "-".to_string();
        let r = l.record.as_ref();
        let expires = r
            .and_then(|r| r.expiry())
            .map(|(_, e)| format!("{} ({})", date(e), left(e - now)))
            .unwrap_or_else(dash);
        let issued = match r.map(|r| (&r.certificate, &r.server_jwt)) {
            Some((Some(c), _)) => format!("certificate {}", c.serial),
            Some((None, Some(j))) => format!("server JWT {}", j.jti),
            _ => dash(),
        };
        let provisioned = r.map_or_else(dash, |r| match layout.wide {
            true => r.time.clone(),
            false => short_time(&r.time),
        });
        // Its key in the bucket: an unverified record may name another.
        let mut cells = vec![l.key.clone(), provisioned];
        if layout.wide {
            cells.push(r.map_or_else(dash, |r| r.replica.clone()));
        }
        cells.extend([r.map_or_else(dash, |r| r.mode.clone()), expires]);
        if layout.wide {
            cells.push(issued);
        }
        cells.push(l.state.clone());
        let tone = if l.revoked || !l.verified {
            Some(Tone::Alarm)
        } else if l.state == "due now" || l.state.starts_with("cannot return") {
            Some(Tone::Warn)
        } else {
            None
        };
        t.toned(cells, tone);
    }
    t.lay_out(layout)
}

/// An RFC 3339 time as `YYYY-MM-DD HH:MM` (UTC), or as it is when it is
/// not one.
fn short_time(rfc3339: &str) -> String {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_else(|_| rfc3339.to_string())
}

fn left(seconds: i64) -> String {
    match seconds {
        s if s < 0 => "expired".into(),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 * 2 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::table::Layout;
    use choria_core::records::CertificateRecord;

    const NOW: i64 = 1_796_000_000;

    fn listed(identity: &str, revoked: bool) -> Listed {
        let record = Record {
            identity: identity.into(),
            time: "2026-12-07T09:14:27.123456789+00:00".into(),
            time_unix: NOW,
            replica: "choria-provisioner-6c9d8b7f5-k2x4p.provisioning.example.net".into(),
            site: "eu-west-1".into(),
            protocol: "v1".into(),
            mode: "template+helper".into(),
            signer: Some("cert-manager".into()),
            certificate: Some(CertificateRecord {
                serial: "5F3A9C0E7B21D4468AA9013C5E7F9B2D11E0A3C4".into(),
                issuer: "CN=fleet".into(),
                not_before_unix: NOW,
                not_after_unix: NOW + 90 * 86_400,
            }),
            server_jwt: None,
            config_sha256: String::new(),
            provisioning_jwt_expires_unix: None,
        };
        Listed {
            key: identity.into(),
            record: Some(record),
            verified: true,
            revoked,
            state: match revoked {
                true => "REVOKED: stolen laptop, reported by the owner on the phone (by root@ops-1, 2026-12-07T09:14:27Z)".into(),
                false => "due in 60d".into(),
            },
        }
    }

    #[test]
    fn the_table_fits_120_columns_unless_wide_and_counts_its_nodes() {
        let shown = vec![
            listed("web-0001.eu-west-1.production.fleet.example.net", false),
            listed("db-12.eu-west-1.production.fleet.example.net", true),
        ];
        let fit = Layout {
            width: Some(120),
            ..Layout::default()
        };
        let narrow = table(&shown, NOW, fit);
        for line in narrow.lines() {
            assert!(
                line.chars().count() <= 120,
                "{} wide: {line}",
                line.chars().count()
            );
        }
        assert!(narrow.contains("2026-12-07 09:14"), "{narrow}");
        assert!(narrow.contains("REVOKED: stolen laptop"), "{narrow}");
        assert!(
            !narrow.contains("REPLICA") && !narrow.contains("ISSUED"),
            "{narrow}"
        );
        let wide = table(
            &shown,
            NOW,
            Layout {
                wide: true,
                ..Layout::default()
            },
        );
        assert!(
            wide.contains("certificate 5F3A9C0E7B21D4468AA9013C5E7F9B2D11E0A3C4"),
            "{wide}"
        );
        assert!(
            wide.contains("choria-provisioner-6c9d8b7f5-k2x4p.provisioning.example.net"),
            "{wide}"
        );
        assert!(
            wide.contains("(by root@ops-1, 2026-12-07T09:14:27Z)"),
            "{wide}"
        );
        assert_eq!(count_line(&shown, None), "2 nodes: 1 revoked");
        assert_eq!(
            count_line(&[], Some(Duration::from_secs(30 * 86_400))),
            "no nodes on record expiring within 30d"
        );
    }
}
