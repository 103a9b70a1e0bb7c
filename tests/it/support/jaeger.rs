//! A real Jaeger (v2, `$JAEGER_BIN`, built by `scripts/build-go-peers.sh
//! jaeger`) for the traces tier: OTLP over HTTP in, its query API out,
//! traces kept in memory, every port a free one of its own (a config file
//! in the collector's format), so tests beside it do not collide.

use super::peers::{self, Missing};
use super::provisioner::http_get;
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Jaeger {
    child: Child,
    /// Where OTLP/HTTP is received.
    pub otlp_port: u16,
    /// Where the query API answers (`/api/services`, `/api/traces`).
    pub query_port: u16,
    log: std::path::PathBuf,
}

impl Jaeger {
    /// Jaeger in `dir`, answering its query API; `None` (or a failure
    /// under CI) when `$JAEGER_BIN` is missing (see [`super::peers`]).
    pub fn start(test: &str, dir: &Path) -> Option<Jaeger> {
        let bin = match peers::file_from_env("JAEGER_BIN") {
            Ok(bin) => bin,
            Err(problem) => {
                return Missing {
                    test,
                    problem,
                    unproven: "Tracing: each node's trace exported over OTLP and found in Jaeger",
                    advice: "Build the peer with `scripts/build-go-peers.sh jaeger` and export\n\
                             JAEGER_BIN=$HOME/.cache/choria-provisioner-rs/bin/jaeger (scripts/test.sh does both).",
                    build_log_var: Some("JAEGER_UNAVAILABLE"),
                }
                .skip()
            }
        };
        let (otlp_port, query_port, grpc_port) =
            (super::free_port(), super::free_port(), super::free_port());
        let config = dir.join("jaeger.yaml");
        std::fs::write(&config, config_text(otlp_port, query_port, grpc_port)).unwrap();
        let log = dir.join("jaeger.log");
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("jaeger.err")).unwrap())
            .spawn()
            .expect("jaeger starts");
        let mut jaeger = Jaeger {
            child,
            otlp_port,
            query_port,
            log,
        };
        jaeger.wait_ready(Duration::from_secs(60));
        Some(jaeger)
    }

    /// The OTLP/HTTP endpoint for `telemetry.otlp_endpoint`.
    pub fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_port)
    }

    /// Until the query API answers and the OTLP port is open (Jaeger took
    /// ~1 s to start on the loaded two-core machine; the limit is generous).
    fn wait_ready(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("jaeger exited with {status}:\n{}", self.logs());
            }
            let up = std::net::TcpStream::connect(("127.0.0.1", self.query_port)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", self.otlp_port)).is_ok();
            if up && http_get(self.query_port, "/api/services").0 == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "jaeger did not answer within {limit:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The traces Jaeger holds for `service` (its query API's `data`).
    pub fn traces(&self, service: &str) -> Vec<Value> {
        let (status, body) = http_get(
            self.query_port,
            &format!("/api/traces?service={service}&limit=10000&lookback=1h"),
        );
        if status != 200 {
            // No trace of the service yet: Jaeger answers 404 or an empty list.
            return Vec::new();
        }
        let doc: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("the query API's answer is not JSON ({e}): {body}"));
        doc["data"].as_array().cloned().unwrap_or_default()
    }

    /// Polls [`Jaeger::traces`] until `done` holds for them, within `limit`.
    pub async fn wait_traces(
        &self,
        service: &str,
        limit: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let traces = self.traces(service);
            if done(&traces) {
                return traces;
            }
            assert!(
                Instant::now() < deadline,
                "Jaeger did not hold the traces expected within {limit:?}; it holds {} of {service}:\n{}",
                traces.len(),
                serde_json::to_string_pretty(&traces).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub fn logs(&self) -> String {
        let err = self.log.with_file_name("jaeger.err");
        format!(
            "{}{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(err).unwrap_or_default()
        )
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Jaeger v2's configuration (the OpenTelemetry collector's format): the
/// OTLP/HTTP receiver, memory storage and the query API, each on its own
/// port, and no other listener (its own metrics off).
fn config_text(otlp: u16, query: u16, grpc: u16) -> String {
    format!(
        "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{grpc}
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{otlp}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"
    )
}

/// A span's tag `key` (Jaeger's JSON: `tags: [{key, type, value}]`).
pub fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()?
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}
