//! Test helpers: Provisioner fixtures and a mocked API server (the
//! controller-rs `ApiServerVerifier` pattern on tower-test).

use choria_k8s::crd::{Provisioner, API_VERSION, KIND};
use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const NS: &str = "choria";
pub const NAME: &str = "prov";
pub const UID: &str = "7f3c1a52-0000-4000-8000-000000000001";

/// Merges `extra` into `base`, objects key by key.
pub fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// The resource as the API server returns it, with `spec` merged into a
/// minimal valid spec (x509 broker login, helper from a ConfigMap).
pub fn resource_json(spec: Value) -> Value {
    let mut s = json!({
        "broker": {"urls": ["nats://broker.example.net:4222"], "tlsSecret": "prov-tls"},
        "helper": {"command": "/etc/choria-provisioner/helper/helper.sh", "configMap": "prov-helper"},
    });
    merge(&mut s, spec);
    json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": NAME, "namespace": NS, "uid": UID, "generation": 3, "resourceVersion": "100"},
        "spec": s,
    })
}

/// The operator's defaults, as with no policy flags.
pub fn settings() -> super::build::Settings {
    super::build::Settings::new(choria_k8s::crd::default_image())
}

pub fn provisioner(spec: Value) -> Provisioner {
    serde_json::from_value(resource_json(spec)).expect("a valid Provisioner")
}

/// One request the mocked API server answered.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

impl Seen {
    /// `PATCH /api/v1/namespaces/choria/configmaps/prov-config`
    pub fn line(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// How the mocked API server behaves.
#[derive(Clone)]
pub struct Scenario {
    /// `status.readyReplicas` of the applied Deployment.
    pub ready_replicas: Option<i32>,
    /// The resource before the status patch (the status patch answer is this
    /// with the patched status).
    pub resource: Value,
    /// Writes whose path contains this fail with 500.
    pub fail: Option<&'static str>,
    /// Objects that exist already: a GET whose path ends with the first
    /// item answers the second; every other GET finds nothing.
    pub existing: Vec<(&'static str, Value)>,
}

/// Answers every request of `client` until it is dropped: applies and event
/// creations are echoed, deletes find nothing, status patches return the
/// resource with the new status. Returns what it saw, in order.
pub fn api_server(scenario: Scenario) -> (kube::Client, tokio::task::JoinHandle<Vec<Seen>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, NS);
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.expect("request body");
            let body: Value = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("JSON request body")
            };
            let s = Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query: parts.uri.query().unwrap_or_default().to_string(),
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string(),
                body,
            };
            let (code, reply) = answer(&s, &scenario);
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
            seen.push(s);
        }
        seen
    });
    (client, task)
}

fn answer(s: &Seen, scenario: &Scenario) -> (u16, Value) {
    if s.method == "GET" {
        return match scenario.existing.iter().find(|(p, _)| s.path.ends_with(p)) {
            Some((_, obj)) => (200, obj.clone()),
            None => (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": "not found", "reason": "NotFound", "code": 404}),
            ),
        };
    }
    if scenario.fail.is_some_and(|f| s.path.contains(f)) {
        return (
            500,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "etcd is sad", "reason": "InternalError", "code": 500}),
        );
    }
    match s.method.as_str() {
        "DELETE" => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "message": "not found", "reason": "NotFound", "code": 404}),
        ),
        "PATCH" if s.path.ends_with("/status") => {
            let mut r = scenario.resource.clone();
            r["status"] = s.body["status"].clone();
            (200, r)
        }
        "PATCH" if s.path.contains("/deployments/") => {
            let mut d = s.body.clone();
            if let Some(n) = scenario.ready_replicas {
                d["status"] = json!({"readyReplicas": n});
            }
            (200, d)
        }
        _ => (200, s.body.clone()),
    }
}

/// Requests to the fake cluster's Provisioners and Leases (namespace `ops`).
pub const PROVISIONERS: &str = "/apis/provisioning.choria.io/v1alpha1/namespaces/ops/provisioners";
pub const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/ops/leases";

/// The requests the fake cluster saw: `GET <path>`, with ` watch` for a watch.
pub type Log = Arc<Mutex<Vec<String>>>;

/// An empty cluster with a Lease store. Lists are empty, watches never
/// answer. Returns the Lease as last written once the client is gone.
pub fn fake_cluster() -> (kube::Client, Log, tokio::task::JoinHandle<Option<Value>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "ops");
    let log: Log = Arc::default();
    let seen = log.clone();
    let task = tokio::spawn(async move {
        let mut lease: Option<Value> = None;
        let mut version = 0;
        let mut watches = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let path = parts.uri.path().to_string();
            let method = parts.method.to_string();
            let watch = parts.uri.query().unwrap_or_default().contains("watch=true");
            let suffix = if watch { " watch" } else { "" };
            seen.lock()
                .unwrap()
                .push(format!("{method} {path}{suffix}"));
            if watch {
                watches.push(send);
                continue;
            }
            let (code, reply) = if path.starts_with(LEASES) {
                match (method.as_str(), &lease) {
                    ("GET", Some(l)) => (200, l.clone()),
                    ("GET", None) => (
                        404,
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                               "reason": "NotFound", "code": 404, "message": "not found"}),
                    ),
                    _ => {
                        version += 1;
                        let mut l: Value = serde_json::from_slice(&bytes).unwrap();
                        l["metadata"]["resourceVersion"] = json!(version.to_string());
                        lease = Some(l.clone());
                        (if method == "POST" { 201 } else { 200 }, l)
                    }
                }
            } else {
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "List",
                           "metadata": {"resourceVersion": "1"}, "items": []}),
                )
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap(),
            );
        }
        lease
    });
    (client, log, task)
}

pub async fn wait_for_line(log: &Log, line: &str) {
    let found = async {
        while !log.lock().unwrap().iter().any(|l| l == line) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), found)
        .await
        .is_err()
    {
        panic!("no {line:?} in {:#?}", log.lock().unwrap());
    }
}
