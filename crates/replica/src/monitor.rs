//! The monitoring HTTP endpoint: `/metrics` for Prometheus, `/healthz` for
//! liveness and `/readyz` for readiness (e.g. Kubernetes probes).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

pub mod openmetrics;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Content type of the Prometheus text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error("cannot listen for monitoring on port {port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("monitoring endpoint failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Adds the standard `process_*` metrics (resident and virtual memory, CPU
/// seconds, open and maximum file descriptors, start time, threads) that
/// Prometheus users expect from any exporter, and that the Go provisioner
/// exports through client_golang's default registry. Unlabelled, as there.
pub fn register_process_metrics(registry: &prometheus::Registry) {
    // Only fails when the names are taken: a registry is set up once.
    if let Err(e) = registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    )) {
        tracing::error!("could not register the process metrics: {e}");
    }
}

/// Readiness as the conjunction of named checks; clones share the state.
///
/// A check that was never set counts as passing, so components report only
/// once they have something to say.
#[derive(Clone, Default)]
pub struct Health {
    // Only the failing checks, by name: sorted for a stable /readyz body.
    failing: Arc<Mutex<BTreeMap<String, String>>>,
}

impl Health {
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks a named check failing with a reason (e.g. `"broker"`:
    /// `"disconnected from nats://..."`), or passing.
    pub fn set(&self, check: &str, result: Result<(), String>) {
        let mut failing = self.lock();
        match result {
            Ok(()) => {
                failing.remove(check);
            }
            Err(reason) => {
                failing.insert(check.to_string(), reason);
            }
        }
    }

    /// `Ok` when every check passes, otherwise the failing `(check, reason)`
    /// pairs sorted by check name.
    pub fn ready(&self) -> Result<(), Vec<(String, String)>> {
        let failing = self.lock();
        if failing.is_empty() {
            return Ok(());
        }
        Err(failing
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        // A map of strings cannot be left half updated by a panic.
        self.failing.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failing", &*self.lock())
            .finish()
    }
}

/// Binds the monitoring listener on all interfaces, IPv6 and IPv4 alike
/// (one dual-stack socket: a pod on an IPv6-only or dual-stack cluster is
/// scraped at its IPv6 address); IPv4 only where the host has no IPv6.
pub async fn bind(port: u16) -> Result<TcpListener, MonitorError> {
    match bind_dual_stack(port) {
        Ok(listener) => Ok(listener),
        Err(_) => TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
            .await
            .map_err(|source| MonitorError::Bind { port, source }),
    }
}

/// `[::]:port` with `IPV6_V6ONLY` off, whatever the host's default.
fn bind_dual_stack(port: u16) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<dyn Exposition>,
    health: Health,
}

/// Anything whose metrics `/metrics` serves in the Prometheus text format
/// (the provisioner's and the operator's registries).
pub trait Exposition: Send + Sync + 'static {
    /// The registry holding every metric.
    fn registry(&self) -> &prometheus::Registry;

    /// All metrics in the Prometheus text exposition format 0.0.4.
    fn encode_text(&self) -> String {
        encode_registry(self.registry())
    }

    /// All metrics in the OpenMetrics text format, for a scraper that asks
    /// for it; an owner that keeps exemplars adds them here.
    fn encode_openmetrics(&self) -> String {
        openmetrics::encode(&self.registry().gather(), &|_, _, _| None)
    }

    /// Current value of a metric by name, summed over its series (e.g. all
    /// labels): counters and gauges give their value, summaries and
    /// histograms their observation count. `None` for an unknown name.
    fn value(&self, name: &str) -> Option<f64> {
        registry_value(self.registry(), name)
    }
}

/// A registry in the Prometheus text exposition format 0.0.4.
pub fn encode_registry(registry: &prometheus::Registry) -> String {
    let mut out = String::new();
    // Encoding only fails for a family without series, and the registry
    // drops those while gathering; log rather than lose a scrape.
    if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
        tracing::error!("could not encode the metrics: {e}");
    }
    out
}

/// [`Exposition::value`] of a registry.
pub fn registry_value(registry: &prometheus::Registry, name: &str) -> Option<f64> {
    use prometheus::proto::MetricType;
    let family = registry.gather().into_iter().find(|f| f.name() == name)?;
    let kind = family.get_field_type();
    Some(
        family
            .get_metric()
            .iter()
            .map(|m| match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                MetricType::SUMMARY => m.get_summary().sample_count() as f64,
                MetricType::HISTOGRAM => m.get_histogram().get_sample_count() as f64,
                MetricType::UNTYPED => 0.0,
            })
            .sum(),
    )
}

/// Serves the monitoring endpoints on `listener` until `shutdown` is
/// cancelled, then finishes in-flight requests and returns.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), MonitorError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!("monitoring endpoint listening on http://{addr}/metrics");
    }
    axum::serve(listener, router(AppState { metrics, health }))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(MonitorError::Serve)
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The Prometheus text, or OpenMetrics (with exemplars) when the
/// scraper's `Accept` asks for it.
async fn metrics_handler(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if openmetrics::wants_openmetrics(accept) {
        return (
            [(header::CONTENT_TYPE, openmetrics::OPENMETRICS_CONTENT_TYPE)],
            state.metrics.encode_openmetrics(),
        );
    }
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        state.metrics.encode_text(),
    )
}

/// Liveness: answering at all is the signal, so readiness checks never fail
/// it (a disconnected broker must not get the process restarted).
async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, String) {
    match state.health.ready() {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(failing) => {
            let body = failing
                .iter()
                .map(|(check, reason)| format!("{check}: {reason}\n"))
                .collect();
            (StatusCode::SERVICE_UNAVAILABLE, body)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::task::JoinHandle;

    struct Response {
        status: u16,
        headers: String,
        body: String,
    }

    /// One plain HTTP/1.1 request; `Connection: close` makes the server end
    /// the stream after the response, so reading to EOF gets all of it.
    async fn get(addr: SocketAddr, path: &str) -> Response {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut raw = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut raw))
            .await
            .expect("response within 10s")
            .expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("header end");
        let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        Response {
            status,
            headers: headers.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }

    /// One counter with a constant label, in a registry of its own.
    struct TestMetrics {
        registry: prometheus::Registry,
        provisioned: prometheus::IntCounter,
    }

    impl TestMetrics {
        fn new() -> Self {
            let registry = prometheus::Registry::new();
            let provisioned = prometheus::IntCounter::with_opts(
                prometheus::Opts::new("choria_provisioner_provisioned", "nodes")
                    .const_label("site", "testsite"),
            )
            .unwrap();
            registry.register(Box::new(provisioned.clone())).unwrap();
            TestMetrics {
                registry,
                provisioned,
            }
        }

        fn provisioned(&self) {
            self.provisioned.inc();
        }
    }

    impl Exposition for TestMetrics {
        fn registry(&self) -> &prometheus::Registry {
            &self.registry
        }
    }

    struct Server {
        addr: SocketAddr,
        metrics: Arc<TestMetrics>,
        health: Health,
        shutdown: CancellationToken,
        task: JoinHandle<Result<(), MonitorError>>,
    }

    async fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(TestMetrics::new());
        let health = Health::new();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(
            listener,
            metrics.clone(),
            health.clone(),
            shutdown.clone(),
        ));
        Server {
            addr,
            metrics,
            health,
            shutdown,
            task,
        }
    }

    impl Server {
        async fn stop(self) {
            self.shutdown.cancel();
            let result = tokio::time::timeout(Duration::from_secs(10), self.task)
                .await
                .expect("serve ends after the shutdown token")
                .expect("serve task did not panic");
            assert!(result.is_ok(), "{result:?}");
        }
    }

    #[test]
    fn health_is_the_conjunction_of_its_checks() {
        let h = Health::new();
        assert_eq!(h.ready(), Ok(()));
        h.set("broker", Err("disconnected".into()));
        h.set("election", Err("no leader".into()));
        h.set("helper", Ok(()));
        let clone = h.clone();
        assert_eq!(
            clone.ready(),
            Err(vec![
                ("broker".to_string(), "disconnected".to_string()),
                ("election".to_string(), "no leader".to_string()),
            ])
        );
        h.set("broker", Ok(()));
        assert_eq!(
            clone.ready(),
            Err(vec![("election".to_string(), "no leader".to_string())])
        );
        clone.set("election", Ok(()));
        assert_eq!(h.ready(), Ok(()));
    }

    #[tokio::test]
    async fn metrics_endpoint_serves_the_text_format() {
        let s = start().await;
        s.metrics.provisioned();
        let r = get(s.addr, "/metrics").await;
        assert_eq!(r.status, 200);
        assert!(
            r.headers
                .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
            "{}",
            r.headers
        );
        assert!(
            r.body
                .lines()
                .any(|l| l == "choria_provisioner_provisioned{site=\"testsite\"} 1"),
            "{}",
            r.body
        );
        assert!(r
            .body
            .contains("# TYPE choria_provisioner_provisioned counter"));
        s.stop().await;
    }

    #[tokio::test]
    async fn readyz_follows_the_checks_and_healthz_does_not() {
        let s = start().await;
        let r = get(s.addr, "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        s.health
            .set("broker", Err("disconnected from nats://b:4222".into()));
        s.health.set("election", Err("lost the lease".into()));
        let r = get(s.addr, "/readyz").await;
        assert_eq!(r.status, 503);
        assert_eq!(
            r.body,
            "broker: disconnected from nats://b:4222\nelection: lost the lease\n"
        );
        let r = get(s.addr, "/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        s.health.set("broker", Ok(()));
        s.health.set("election", Ok(()));
        let r = get(s.addr, "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        s.stop().await;
    }

    #[tokio::test]
    async fn unknown_paths_are_404() {
        let s = start().await;
        assert_eq!(get(s.addr, "/nope").await.status, 404);
        s.stop().await;
    }

    #[tokio::test]
    async fn shutdown_stops_the_listener() {
        let s = start().await;
        let addr = s.addr;
        assert_eq!(get(addr, "/healthz").await.status, 200);
        s.stop().await;
        assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    }

    #[tokio::test]
    async fn the_listener_answers_on_ipv4_and_ipv6() {
        let listener = bind(0).await.expect("bind");
        let port = listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(
            listener,
            Arc::new(TestMetrics::new()),
            Health::new(),
            stop.clone(),
        ));
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        assert_eq!(get(v4, "/healthz").await.status, 200, "IPv4");
        if std::net::TcpListener::bind("[::1]:0").is_ok() {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            assert_eq!(get(v6, "/healthz").await.status, 200, "IPv6");
        } else {
            assert!(
                std::env::var_os("CI").is_none(),
                "this host has no IPv6 loopback: IPv6 cannot be checked"
            );
            eprintln!("NOT RUN (IPv6 part): this host has no IPv6 loopback");
        }
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn bind_names_the_port_it_failed_on() {
        let taken = bind(0).await.expect("bind an ephemeral port");
        let port = taken.local_addr().unwrap().port();
        let err = bind(port).await.expect_err("port is taken");
        assert!(matches!(err, MonitorError::Bind { port: p, .. } if p == port));
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}
