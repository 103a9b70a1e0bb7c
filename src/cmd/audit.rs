//! `choria-provisioner audit`: the audit stream (`audit:` in
//! `provisioner.yaml`) read back, oldest first. Events whose seal is not
//! ours are shown as unverified: anyone who may publish on the audit
//! subjects can add events, only ours verify.

use anyhow::{bail, Context, Result};
use choria_config::duration::parse_duration;
use choria_config::ProvisionerConfig;
use choria_core::audit::event::Opened;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct AuditArgs {
    /// The provisioner's configuration: its `audit:` and `records:` say
    /// where the stream is and which key seals it.
    #[arg(
        long,
        default_value = "/etc/choria-provisioner/choria-provisioner.yaml"
    )]
    pub config: PathBuf,
    /// Only events about this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only events of the last DURATION (`1h`, `7d`).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub since: Option<Duration>,
    /// Show at most this many events (the newest).
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// One JSON object per line (the CloudEvent and `verified`) instead of
    /// a table.
    #[arg(long)]
    pub json: bool,
}

fn duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

pub async fn run(args: AuditArgs) -> Result<()> {
    let cfg = ProvisionerConfig::load(&args.config)?;
    let (Some(records), Some(audit)) = (&cfg.records, &cfg.audit) else {
        bail!(
            "{}: no audit: section, so nothing is audited (see audit: in the configuration reference)",
            args.config.display()
        );
    };
    let (_, verifier) = choria_core::records::store::seal_keys(records)?;
    let since = args
        .since
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .map(|d| chrono::Utc::now() - d);
    let mut events = choria_core::audit::reader::read(records, audit, &verifier, since, usize::MAX)
        .await
        .map_err(anyhow::Error::msg)
        .context("reading the audit stream")?;
    if let Some(node) = &args.node {
        events.retain(|o| &o.event.subject == node);
    }
    let skip = events.len().saturating_sub(args.limit);
    let events = &events[skip..];
    if args.json {
        for o in events {
            let mut v = serde_json::to_value(&o.event)?;
            v["verified"] = serde_json::Value::Bool(o.unverified.is_none());
            println!("{v}");
        }
        return Ok(());
    }
    print!("{}", table(events));
    Ok(())
}

/// The events as a table: time, event, node, what it says; every cell
/// cleaned for the terminal (anyone may have published an event).
fn table(events: &[Opened]) -> String {
    use super::table::{Column, Table};
    let col = |header, max| Column { header, max };
    let mut t = Table::new(vec![
        col("TIME", 24),
        col("EVENT", 11),
        col("NODE", 40),
        col("DETAIL", 0),
    ]);
    for o in events {
        let e = &o.event;
        let mut detail = summary(&e.data);
        if o.repeated {
            detail = format!("COPY of an earlier event (id {}) {detail}", e.id);
        }
        if let Some(why) = o.unverified {
            detail = format!("UNVERIFIED ({why}) {detail}");
        }
        t.row(vec![
            e.time.clone(),
            e.short_kind().to_string(),
            e.subject.clone(),
            detail,
        ]);
    }
    t.render(false)
}

/// One line of what an event's data says: a refusal's reason, or what a
/// provisioning issued.
fn summary(data: &serde_json::Value) -> String {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    if let Some(reason) = data.get("reason") {
        return one_line(&format!("{}: {}", text(&data["step"]), text(reason)));
    }
    let mut parts = Vec::new();
    if let Some(mode) = data.get("mode") {
        parts.push(format!("mode {}", text(mode)));
    }
    if let Some(serial) = data.pointer("/certificate/serial") {
        parts.push(format!("certificate {}", text(serial)));
    }
    if let Some(jti) = data.pointer("/server_jwt/jti") {
        parts.push(format!("server JWT {}", text(jti)));
    }
    if let Some(c) = data.get("collective") {
        parts.push(format!("collective {}", text(c)));
    }
    one_line(&parts.join(", "))
}

/// What anyone may have published, fit for one terminal line: no control
/// characters (a forged event must not move the cursor), cut at 300.
fn one_line(s: &str) -> String {
    choria_core::provision::one_line(s, 300)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_forged_events_fields_reach_the_terminal_as_text_and_copies_are_marked() {
        use choria_core::audit::event::{Event, Kind};
        let mut forged = Opened {
            event: Event::new(Kind::Provisioned, "n1.example.net", "s", json!({})),
            unverified: Some("signature"),
            repeated: false,
        };
        // A time that would erase its own row and draw a verified one.
        forged.event.time = "2026-12-07\u{1b}[2K\r2026-12-07 provisioned n2".into();
        let copy = Opened {
            event: Event::new(Kind::Provisioned, "n3.example.net", "s", json!({})),
            unverified: None,
            repeated: true,
        };
        let t = table(&[forged, copy]);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert!(t.contains("UNVERIFIED (signature)"), "{t}");
        assert!(t.contains("COPY of an earlier event"), "{t}");
    }

    #[test]
    fn the_table_says_why_and_what_was_issued_and_marks_forgeries() {
        let e = |kind, data| Opened {
            event: choria_core::audit::event::Event::new(kind, "n1.example.net", "s", data),
            unverified: None,
            repeated: false,
        };
        use choria_core::audit::event::Kind;
        let mut forged = e(Kind::Provisioned, json!({"mode": "helper"}));
        forged.unverified = Some("signature");
        let t = table(&[
            e(
                Kind::Denied,
                json!({"step": "admission", "reason": "retired rack"}),
            ),
            e(
                Kind::Provisioned,
                json!({"mode": "template", "certificate": {"serial": "0A"}}),
            ),
            forged,
        ]);
        assert!(
            t.contains("denied") && t.contains("admission: retired rack"),
            "{t}"
        );
        assert!(t.contains("mode template, certificate 0A"), "{t}");
        assert!(t.contains("UNVERIFIED (signature) mode helper"), "{t}");
    }
}
