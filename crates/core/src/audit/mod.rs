//! The audit stream (`audit:`): every decision about a node as one sealed
//! CloudEvent ([`event`]) on a JetStream stream with bounded retention,
//! written from a task of its own ([`writer`]) and read by `audit`
//! ([`reader`]).
//!
//! Nothing secret goes in: a provisioned node's event carries its record
//! (serials, `jti`, collectives, a digest of its configuration), a refused
//! one the step and the reason, cut to one line.

pub mod event;
pub mod reader;
pub mod writer;

use choria_config::audit::AuditConfig;

/// The subject an event of `kind` from `site` is published on.
pub fn subject(cfg: &AuditConfig, site: &str, kind: event::Kind) -> String {
    let site = if site.is_empty() { "_" } else { site };
    // A site is ours (the configuration's), but keep it one token.
    let site: String = site
        .chars()
        .map(|c| {
            if matches!(c, '.' | '*' | '>' | ' ') {
                '_'
            } else {
                c
            }
        })
        .collect();
    format!("{}.{site}.{}", cfg.subject, kind.name())
}

/// The stream, opened (or made, when allowed).
pub async fn stream(
    js: &async_nats::jetstream::Context,
    cfg: &AuditConfig,
) -> Result<async_nats::jetstream::stream::Stream, String> {
    use async_nats::jetstream::stream;
    match js.get_stream(&cfg.stream).await {
        Ok(s) => Ok(s),
        Err(get) if cfg.create_stream => js
            .create_stream(stream::Config {
                name: cfg.stream.clone(),
                description: Some("choria-provisioner: every decision about a node, sealed".into()),
                subjects: vec![format!("{}.>", cfg.subject)],
                max_age: cfg.max_age,
                max_bytes: cfg.max_bytes,
                discard: stream::DiscardPolicy::Old,
                storage: stream::StorageType::File,
                num_replicas: usize::from(cfg.replicas.max(1)),
                // What a retried publish is recognised within.
                duplicate_window: std::time::Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|create| {
                format!(
                    "stream {}: not found ({get}) and not created ({create})",
                    cfg.stream
                )
            }),
        Err(e) => Err(format!("stream {}: {e}", cfg.stream)),
    }
}
