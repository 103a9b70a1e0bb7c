//! One trace per node sequence (`telemetry.otlp_endpoint`): a root span
//! for the node, a child span per step, exported over OTLP by
//! [`export`]'s task.
//!
//! Off (no endpoint, or a sequence not sampled) a sequence holds no
//! [`NodeTrace`] and every seam is one `Option` test: no span is made, no
//! clock read, nothing allocated. On, a sequence's spans collect in its
//! own [`NodeTrace`] (no lock shared with other sequences) and go to the
//! exporter in one message when it ends; the queue is bounded and a full
//! one drops the trace rather than wait.
//!
//! What a span carries is bounded and never secret: the identity (checked
//! where it entered, cut to [`MAX_TEXT`] here too), names of steps and
//! RPCs, counts, and error texts as the log prints them (cut too).

pub mod export;

use choria_config::telemetry::TelemetryConfig;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// The most bytes of any text a span carries (an identity, an error).
pub const MAX_TEXT: usize = 512;
/// The most spans one trace holds; later steps are counted, not kept.
pub const MAX_SPANS: usize = 256;
/// Finished traces waiting for the exporter at most.
const QUEUE: usize = 4096;

/// A span attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Int(i64),
    Bool(bool),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Self {
        Value::Str(Cow::Borrowed(s))
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(Cow::Owned(s))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

/// The OTLP span kinds we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Internal,
    /// A request to a node.
    Client,
}

/// One finished span, as the exporter encodes it.
#[derive(Clone, Debug)]
pub struct SpanData {
    pub span_id: [u8; 8],
    /// `None` for the root.
    pub parent: Option<[u8; 8]>,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    /// Unix time in nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<(&'static str, Value)>,
    /// The error this step ended in, if it failed.
    pub error: Option<String>,
}

/// A finished trace: every span of one node's sequence.
#[derive(Debug)]
pub struct Finished {
    pub trace_id: [u8; 16],
    pub spans: Vec<SpanData>,
}

struct Shared {
    tx: mpsc::Sender<Finished>,
    sample_percent: u8,
    /// Traces dropped because the exporter fell behind.
    dropped: Arc<AtomicU64>,
}

/// Makes each sampled node sequence's trace; off without an endpoint.
#[derive(Clone, Default)]
pub struct Tracer(Option<Arc<Shared>>);

impl Tracer {
    /// No traces: what every sequence gets without `telemetry:`.
    pub fn off() -> Self {
        Tracer(None)
    }

    /// On: the tracer and the queue its exporter reads
    /// ([`export::run`]).
    pub fn new(cfg: &TelemetryConfig) -> (Self, export::Queue) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let shared = Shared {
            tx,
            sample_percent: cfg.sample_percent,
            dropped: dropped.clone(),
        };
        (
            Tracer(Some(Arc::new(shared))),
            export::Queue { rx, dropped },
        )
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// The trace of one node's sequence, or `None` when tracing is off or
    /// this one is not sampled. `waiting` is how long the name waited
    /// since `source` (discovery or a startup event) gave it: the root
    /// starts then, with a `discovery` span for the wait.
    pub fn node(
        &self,
        identity: &str,
        source: &'static str,
        waiting: Duration,
    ) -> Option<NodeTrace> {
        let shared = self.0.as_ref()?;
        if shared.sample_percent < 100 && rand::random::<u8>() % 100 >= shared.sample_percent {
            return None;
        }
        let now = unix_nanos();
        let found = now.saturating_sub(u64::try_from(waiting.as_nanos()).unwrap_or(u64::MAX));
        let trace_id = nonzero();
        let trace = NodeTrace {
            shared: shared.clone(),
            trace_id,
            hex: hex::encode(trace_id),
            root: nonzero(),
            start: found,
            identity: bounded(identity),
            spans: Mutex::new(Vec::new()),
        };
        let mut queued = trace.start("discovery");
        queued.span.start = found;
        queued.attr("choria.source", source);
        trace.end(queued, None);
        Some(trace)
    }
}

/// The trace of one node's sequence: its spans so far.
pub struct NodeTrace {
    shared: Arc<Shared>,
    trace_id: [u8; 16],
    /// `trace_id` in hex, made once for the exemplars.
    hex: String,
    root: [u8; 8],
    start: u64,
    identity: String,
    spans: Mutex<Vec<SpanData>>,
}

/// A step under way; [`NodeTrace::end`] ends it.
#[must_use = "a step is recorded when it is ended"]
pub struct Step {
    span: SpanData,
}

impl Step {
    pub fn attr(&mut self, key: &'static str, value: impl Into<Value>) {
        self.span.attributes.push((key, value.into()));
    }

    pub fn kind(mut self, kind: Kind) -> Self {
        self.span.kind = kind;
        self
    }
}

impl NodeTrace {
    /// The trace id as W3C and OpenMetrics exemplars write it (32 hex
    /// digits).
    pub fn trace_id(&self) -> &str {
        &self.hex
    }

    /// A step begins now, a child of the node's root span.
    pub fn start(&self, name: &'static str) -> Step {
        Step {
            span: SpanData {
                span_id: nonzero(),
                parent: Some(self.root),
                name: Cow::Borrowed(name),
                kind: Kind::Internal,
                start: unix_nanos(),
                end: 0,
                attributes: Vec::new(),
                error: None,
            },
        }
    }

    /// Ends a step now; `error` when it failed.
    pub fn end(&self, mut step: Step, error: Option<&dyn std::fmt::Display>) {
        step.span.end = unix_nanos().max(step.span.start);
        step.span.error = error.map(|e| bounded(&e.to_string()));
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() < MAX_SPANS {
            spans.push(step.span);
        }
    }

    /// Ends the node's root span with what it was and how it ended, and
    /// hands the trace to the exporter (dropped, and counted, when its
    /// queue is full).
    pub fn finish(
        &self,
        attributes: Vec<(&'static str, Value)>,
        error: Option<&dyn std::fmt::Display>,
    ) {
        let mut spans =
            std::mem::take(&mut *self.spans.lock().unwrap_or_else(PoisonError::into_inner));
        let mut root_attributes = vec![("choria.identity", Value::from(self.identity.clone()))];
        root_attributes.extend(attributes);
        spans.push(SpanData {
            span_id: self.root,
            parent: None,
            name: Cow::Borrowed("provision node"),
            kind: Kind::Internal,
            start: self.start,
            end: unix_nanos().max(self.start),
            attributes: root_attributes,
            error: error.map(|e| bounded(&e.to_string())),
        });
        let finished = Finished {
            trace_id: self.trace_id,
            spans,
        };
        if self.shared.tx.try_send(finished).is_err() {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs `step` as the span `name` of `trace` (when there is one): its
/// error, if any, is the span's.
pub async fn traced<R, E: std::fmt::Display>(
    trace: Option<&NodeTrace>,
    name: &'static str,
    step: impl std::future::Future<Output = Result<R, E>>,
) -> Result<R, E> {
    let Some(trace) = trace else {
        return step.await;
    };
    let span = trace.start(name);
    let result = step.await;
    trace.end(
        span,
        result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
    );
    result
}

fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A random id that is not all zeros (OTLP's "invalid").
fn nonzero<const N: usize>() -> [u8; N] {
    loop {
        let mut id = [0u8; N];
        rand::Rng::fill(&mut rand::thread_rng(), &mut id[..]);
        if id.iter().any(|b| *b != 0) {
            return id;
        }
    }
}

/// `text` cut to [`MAX_TEXT`] bytes on a character boundary, control
/// characters replaced.
fn bounded(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests;
