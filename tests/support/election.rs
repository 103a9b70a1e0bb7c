//! A nats-server standing in for a Choria broker's election plumbing: a
//! CHORIA account with JetStream holds the election bucket, and a
//! PROVISIONING account (where provisioners and servers log in) imports
//! exactly the two subjects a Choria broker imports for the election.

use super::NatsServer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// nats-server with JetStream in a CHORIA account and a PROVISIONING account
/// that imports exactly what a Choria broker imports for the election.
pub fn choria_like_broker() -> NatsServer {
    let store = tempfile::tempdir().unwrap();
    let extra = format!(
        r#"
jetstream {{ store_dir: "{}" }}
accounts {{
  CHORIA: {{ jetstream: enabled, users: [{{user: admin, password: admin}}],
    exports: [{{service: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}},
              {{service: "$KV.CHORIA_LEADER_ELECTION.provisioner"}}] }}
  PROVISIONING: {{ users: [{{user: prov, password: prov}}], imports: [
    {{service: {{account: CHORIA, subject: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}},
     to: "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}}
    {{service: {{account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}},
     to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"}}
    {{service: {{account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}}}} ] }}
}}
no_auth_user: prov
"#,
        store.path().display()
    );
    let nats = NatsServer::start_with(&extra);
    std::mem::forget(store); // lives as long as the test process
    nats
}

/// A connection to the CHORIA account, where the bucket lives.
pub async fn admin(nats: &NatsServer) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
        .connect(nats.url())
        .await
        .unwrap()
}

/// Creates the election bucket as the broker would, from the CHORIA account.
pub async fn create_bucket(nats: &NatsServer, ttl: Duration) {
    let config = serde_json::json!({
        "name": "KV_CHORIA_LEADER_ELECTION",
        "subjects": ["$KV.CHORIA_LEADER_ELECTION.>"],
        "retention": "limits", "max_consumers": -1, "max_msgs_per_subject": 1,
        "max_msgs": -1, "max_bytes": -1, "max_age": ttl.as_nanos() as u64,
        "max_msg_size": 1024, "storage": "file", "discard": "new", "num_replicas": 1,
        "deny_delete": true, "allow_rollup_hdrs": true, "allow_direct": true,
    });
    let reply = admin(nats)
        .await
        .request(
            "$JS.API.STREAM.CREATE.KV_CHORIA_LEADER_ELECTION",
            serde_json::to_vec(&config).unwrap().into(),
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(v.get("error").is_none(), "bucket creation failed: {v}");
}

/// Checks that no instance sent a request to a node while another
/// instance's sequence on that node was between its first and last call.
pub fn assert_no_overlap(journal: &[Value]) {
    // node -> list of (sender, time) in journal order
    let mut per_node: BTreeMap<&str, Vec<(&str, i64, &str)>> = BTreeMap::new();
    // Only requests a node acted on: one it refused (outside its TTL, say)
    // changed nothing.
    for e in journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["outcome"] != "dropped")
    {
        per_node
            .entry(e["node"].as_str().unwrap())
            .or_default()
            .push((
                e["sender"].as_str().unwrap_or(""),
                e["time_us"].as_i64().unwrap(),
                e["action"].as_str().unwrap_or(""),
            ));
    }
    let mut checked = 0;
    for (node, mut calls) in per_node {
        calls.sort_by_key(|c| c.1);
        // A sequence starts with `jwt` (or `inventory` without the jwt
        // feature); it spans to the sender's last call before its next one.
        let mut spans: Vec<(&str, i64, i64)> = Vec::new();
        for (sender, t, action) in &calls {
            if *action == "ping" {
                continue; // discovery is broadcast, not a sequence
            }
            match spans.iter_mut().rev().find(|s| s.0 == *sender) {
                Some(span) if *action != "jwt" && *action != "inventory" => span.2 = *t,
                _ => spans.push((sender, *t, *t)),
            }
        }
        for (sender, t, action) in &calls {
            if *action == "ping" {
                continue;
            }
            for (other, start, end) in &spans {
                assert!(
                    other == sender || !(*start < *t && *t < *end),
                    "{node}: {sender} sent {action} at {t} inside {other}'s sequence {start}..{end}"
                );
            }
        }
        checked += 1;
    }
    assert!(checked > 0);
}

/// Samples every replica's `choria_provisioner_paused` continuously and
/// records each moment two of them were certainly working at once: a
/// replica counts as working through a pass when it reported unpaused both
/// at the start and at the end of the pass (a few ms), so a handover seen
/// half-way is not mistaken for an overlap.
pub struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<String>>>,
    /// (name, monitor port) of the replicas to sample; update as they change.
    pub replicas: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
}

impl Sampler {
    pub fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replicas = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, u16)>::new()));
        let (st, reps) = (stop.clone(), replicas.clone());
        let thread = std::thread::spawn(move || {
            let mut violations = Vec::new();
            let working = |port: u16| -> Option<bool> {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
                s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                use std::io::{Read, Write};
                write!(
                    s,
                    "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                )
                .ok()?;
                let mut text = String::new();
                s.read_to_string(&mut text).ok()?;
                let paused = super::provisioner::metric_sum(&text, "choria_provisioner_paused");
                Some(paused == 0.0)
            };
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                let now: Vec<(String, u16)> = reps.lock().unwrap().clone();
                let first: Vec<Option<bool>> = now.iter().map(|(_, p)| working(*p)).collect();
                let second: Vec<Option<bool>> = now.iter().map(|(_, p)| working(*p)).collect();
                let both: Vec<&String> = now
                    .iter()
                    .zip(first.iter().zip(&second))
                    .filter(|(_, (a, b))| **a == Some(true) && **b == Some(true))
                    .map(|((n, _), _)| n)
                    .collect();
                if both.len() > 1 {
                    violations.push(format!(
                        "{:?}: {both:?} working at once",
                        std::time::SystemTime::now()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            violations
        });
        Sampler {
            stop,
            thread: Some(thread),
            replicas,
        }
    }

    pub fn set(&self, replicas: Vec<(String, u16)>) {
        *self.replicas.lock().unwrap() = replicas;
    }

    /// Stops sampling; panics when two replicas ever worked at once.
    pub fn assert_never_two_working(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let violations = self.thread.take().unwrap().join().unwrap();
        assert!(
            violations.is_empty(),
            "{} samples with two working replicas, first: {:?}",
            violations.len(),
            violations.first()
        );
    }
}
