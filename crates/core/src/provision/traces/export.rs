//! The exporter: finished traces to the collector over OTLP/HTTP, in
//! OTLP's JSON encoding (the same messages as its protobuf one; every
//! OTLP/HTTP receiver takes both), batched, from a task of its own.
//!
//! A collector that is down or slow costs the provisioner nothing but the
//! traces: each post has [`POST_LIMIT`], failures are logged at most once
//! a minute, and the queue in front of it drops rather than waits.

use super::{Finished, Kind, SpanData, Value};
use bytes::Bytes;
use choria_config::telemetry::TelemetryConfig;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value as Json};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// How long a batch gathers after its first trace.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// Traces in one post at most.
const MAX_BATCH: usize = 512;
/// One post's limit, connection included.
pub const POST_LIMIT: Duration = Duration::from_secs(10);
/// What is queued at a stop is sent within this, or dropped.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);
/// The least time between two warnings about failed posts.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The finished traces, as the exporter takes them.
pub struct Queue {
    pub(super) rx: mpsc::Receiver<Finished>,
    pub(super) dropped: Arc<AtomicU64>,
}

/// Who the traces are from: OTLP's resource.
pub struct Resource {
    pub service_name: String,
    /// This replica's name (`service.instance.id`).
    pub instance: String,
    pub site: String,
}

impl Resource {
    pub fn new(cfg: &TelemetryConfig, instance: &str, site: &str) -> Self {
        Resource {
            service_name: cfg.service_name.clone(),
            instance: super::bounded(instance),
            site: super::bounded(site),
        }
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Poster {
    client: HttpClient,
    url: String,
    resource: Resource,
    failed: u64,
    warned: Option<Instant>,
}

/// Sends what the queue holds until `stop`, then what is left within
/// [`FLUSH_LIMIT`].
pub async fn run(
    mut queue: Queue,
    cfg: TelemetryConfig,
    resource: Resource,
    stop: CancellationToken,
) {
    let mut poster = Poster {
        client: Client::builder(TokioExecutor::new()).build_http(),
        url: cfg.traces_url.clone(),
        resource,
        failed: 0,
        warned: None,
    };
    loop {
        let first = tokio::select! {
            t = queue.rx.recv() => t,
            _ = stop.cancelled() => None,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let gather = tokio::time::sleep(BATCH_WAIT);
        tokio::pin!(gather);
        while batch.len() < MAX_BATCH {
            tokio::select! {
                t = queue.rx.recv() => match t {
                    Some(t) => batch.push(t),
                    None => break,
                },
                _ = &mut gather => break,
                _ = stop.cancelled() => break,
            }
        }
        poster.post(&batch, &queue.dropped).await;
    }
    let mut left = Vec::new();
    while let Ok(t) = queue.rx.try_recv() {
        left.push(t);
    }
    if !left.is_empty() {
        let _ = tokio::time::timeout(FLUSH_LIMIT, poster.post(&left, &queue.dropped)).await;
    }
}

impl Poster {
    async fn post(&mut self, batch: &[Finished], dropped: &AtomicU64) {
        let body = Bytes::from(encode(batch, &self.resource).to_string());
        let request = hyper::Request::post(self.url.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body));
        let request = match request {
            Ok(r) => r,
            Err(e) => return self.failed(batch.len(), &format!("cannot make the request: {e}")),
        };
        let sent = tokio::time::timeout(POST_LIMIT, self.client.request(request)).await;
        match sent {
            Ok(Ok(r)) if r.status().is_success() => {
                debug!(traces = batch.len(), "traces exported");
            }
            Ok(Ok(r)) => self.failed(
                batch.len(),
                &format!("the collector answered {}", r.status()),
            ),
            Ok(Err(e)) => self.failed(batch.len(), &format!("{e}")),
            Err(_) => self.failed(batch.len(), &format!("no answer within {POST_LIMIT:?}")),
        }
        let lost = dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            self.failed(lost as usize, "the export queue was full");
        }
    }

    fn failed(&mut self, traces: usize, why: &str) {
        self.failed += traces as u64;
        if self.warned.is_some_and(|at| at.elapsed() < WARN_EVERY) {
            return;
        }
        self.warned = Some(Instant::now());
        warn!(url = %self.url, lost = self.failed, error = why, "traces could not be exported; the provisioner goes on without them");
        self.failed = 0;
    }
}

/// An OTLP `ExportTraceServiceRequest` in OTLP's JSON encoding: ids in
/// hex, 64-bit integers as strings.
pub fn encode(batch: &[Finished], resource: &Resource) -> Json {
    let spans: Vec<Json> = batch
        .iter()
        .flat_map(|t| t.spans.iter().map(move |s| span(&t.trace_id, s)))
        .collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                attribute("service.name", &Value::from(resource.service_name.clone())),
                attribute("service.instance.id", &Value::from(resource.instance.clone())),
                attribute("choria.site", &Value::from(resource.site.clone())),
            ]},
            "scopeSpans": [{
                "scope": {"name": "choria-provisioner", "version": env!("CARGO_PKG_VERSION")},
                "spans": spans,
            }],
        }],
    })
}

fn span(trace_id: &[u8; 16], s: &SpanData) -> Json {
    let mut out = json!({
        "traceId": hex::encode(trace_id),
        "spanId": hex::encode(s.span_id),
        "name": s.name,
        // SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT
        "kind": match s.kind { Kind::Internal => 1, Kind::Client => 3 },
        "startTimeUnixNano": s.start.to_string(),
        "endTimeUnixNano": s.end.to_string(),
        "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        // STATUS_CODE_OK, STATUS_CODE_ERROR
        "status": match &s.error {
            None => json!({"code": 1}),
            Some(e) => json!({"code": 2, "message": e}),
        },
    });
    if let Some(parent) = s.parent {
        out["parentSpanId"] = Json::String(hex::encode(parent));
    }
    out
}

fn attribute(key: &str, value: &Value) -> Json {
    let value = match value {
        Value::Str(s) => json!({"stringValue": s}),
        Value::Int(n) => json!({"intValue": n.to_string()}),
        Value::Bool(b) => json!({"boolValue": b}),
    };
    json!({"key": key, "value": value})
}
