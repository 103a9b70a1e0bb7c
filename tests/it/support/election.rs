//! A nats-server standing in for a Choria broker's election plumbing: a
//! CHORIA account with JetStream holds the election bucket, and a
//! PROVISIONING account (where provisioners and servers log in) imports
//! exactly the two subjects a Choria broker imports for the election.
//!
//! Checked against the real broker (tests/broker.rs, which runs `choria
//! broker run`): the bucket's configuration is the broker's field by field,
//! and the two imports are all a provisioner on it needs. What this stand-in
//! leaves out, and the real-broker tier covers instead: TLS and the login
//! rules (`provisioner` with its password and a verified certificate or a
//! JWT with the provisioner permission; nodes with a provisioning JWT from
//! the broker's signer or issuer), the subjects provisioning-mode servers
//! may use (subscribe `provisioning.node.>` and four broadcast agents;
//! publish `choria.lifecycle.>`, `provisioning.reply.>`,
//! `provisioning.registration.>`), and the export of the provisioning
//! account's lifecycle events to the `choria` account. Fault tiers keep the
//! stand-in: they restart and partition a plain nats-server.

use super::NatsServer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

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
/// Retries for up to 10 s: after `NatsServer::restart` the server listens
/// before JetStream has recovered its store, and on a loaded machine a
/// connection right then was refused (seen once in the fault tier).
pub async fn admin(nats: &NatsServer) -> async_nats::Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let connected =
            async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
                .connect(nats.url())
                .await;
        match connected {
            Ok(c) => return c,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("admin connection to {}: {e}; retrying", nats.url());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no admin connection to {} within 10 s: {e}", nats.url()),
        }
    }
}

/// The election bucket's stream configuration as a Choria broker makes it
/// (go-choria `broker/network/network_jetstream.go`); tests/broker.rs checks
/// every field against the real broker's.
pub fn bucket_config(ttl: Duration) -> Value {
    serde_json::json!({
        "name": "KV_CHORIA_LEADER_ELECTION",
        "subjects": ["$KV.CHORIA_LEADER_ELECTION.>"],
        "retention": "limits", "max_consumers": -1, "max_msgs_per_subject": 1,
        "max_msgs": -1, "max_bytes": -1, "max_age": ttl.as_nanos() as u64,
        "max_msg_size": 1024, "storage": "file", "discard": "new", "num_replicas": 1,
        "deny_delete": true, "allow_rollup_hdrs": true, "allow_direct": true,
    })
}

/// Creates the election bucket as the broker would, from the CHORIA account.
pub async fn create_bucket(nats: &NatsServer, ttl: Duration) {
    let config = bucket_config(ttl);
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

/// The election key's last entry, as the CHORIA account reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyEntry {
    /// "PUT", or "DEL"/"PURGE" for a marker.
    pub op: String,
    pub value: String,
    pub seq: u64,
    /// When the broker stored it (`Nats-Time-Stamp`): the entry expires for
    /// everyone a bucket TTL later.
    pub stored: SystemTime,
}

/// The election key's last entry (DIRECT.GET), `None` when there is none.
pub async fn read_key_entry(admin: &async_nats::Client) -> Option<KeyEntry> {
    let reply = admin
        .request(
            "$JS.API.DIRECT.GET.KV_CHORIA_LEADER_ELECTION",
            r#"{"last_by_subj":"$KV.CHORIA_LEADER_ELECTION.provisioner"}"#.into(),
        )
        .await
        .unwrap();
    let headers = reply.headers.as_ref()?;
    // None on a 404 status: no message.
    let seq = headers.get("Nats-Sequence")?.as_str().parse().unwrap();
    let stamp = headers
        .get("Nats-Time-Stamp")
        .expect("a DIRECT.GET reply without Nats-Time-Stamp")
        .as_str();
    let stored: SystemTime = chrono::DateTime::parse_from_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("Nats-Time-Stamp {stamp:?}: {e}"))
        .into();
    let op = headers
        .get("KV-Operation")
        .map_or("PUT".to_string(), |v| v.as_str().to_string());
    Some(KeyEntry {
        op,
        value: String::from_utf8_lossy(&reply.payload).into_owned(),
        seq,
        stored,
    })
}

/// Every distinct entry the election key held while this ran, read every
/// 20 ms from the CHORIA account: a leader's entry lives at least until it
/// is renewed (a renew period) or expires (the TTL), so no claim or renewal
/// is missed; a release marker a standby replaces within 20 ms may be.
pub struct KeyHistory {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<KeyEntry>>,
}

impl KeyHistory {
    pub async fn start(nats: &NatsServer) -> KeyHistory {
        KeyHistory::start_with(admin(nats).await)
    }

    /// The same, read through `admin`, a client of the account that holds
    /// the bucket (a real Choria broker's `choria` account).
    pub fn start_with(admin: async_nats::Client) -> KeyHistory {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen: Vec<KeyEntry> = Vec::new();
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(e) = read_key_entry(&admin).await {
                    if seen.last().is_none_or(|l| l.seq != e.seq) {
                        seen.push(e);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        });
        KeyHistory { stop, task }
    }

    pub async fn finish(self) -> Vec<KeyEntry> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// Whether the replica whose monitor listens on `port` works (its
/// `choria_provisioner_paused` gauge is 0); `None` when it does not answer.
pub fn probe_working(port: u16) -> Option<bool> {
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
    if !text.starts_with("HTTP/1.1 200") {
        return None;
    }
    let paused = super::provisioner::metric_sum(&text, "choria_provisioner_paused");
    Some(paused == 0.0)
}

/// When a condition over some replicas' working states first held, as seen
/// by a thread polling them (every ~10 ms) from before the fault on: it
/// became true after `after` (the start of the last pass in which it did
/// not hold) and by `by` (the end of the first pass in which it held).
#[derive(Clone, Copy, Debug)]
pub struct Change {
    pub after: Instant,
    pub by: Instant,
    /// `by` by the wall clock, to compare with the broker's timestamps.
    pub by_wall: SystemTime,
}

/// A thread watching for a [`Change`]; several run at the same time.
pub struct Watch {
    what: String,
    thread: std::thread::JoinHandle<Option<Change>>,
}

impl Watch {
    /// Polls `ports` until `holds` of their working states (in `ports`
    /// order) is true, for up to `timeout`. Returns once the first pass is
    /// done, so the watch runs before the caller injects a fault; panics
    /// when the condition already held then.
    pub fn start(
        what: &str,
        ports: Vec<u16>,
        holds: fn(&[Option<bool>]) -> bool,
        timeout: Duration,
    ) -> Watch {
        let (first_tx, first_rx) = std::sync::mpsc::channel::<bool>();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + timeout;
            let mut after = Instant::now();
            let mut first = Some(first_tx);
            while Instant::now() < deadline {
                let start = Instant::now();
                let states: Vec<Option<bool>> = ports.iter().map(|p| probe_working(*p)).collect();
                let held = holds(&states);
                if let Some(tx) = first.take() {
                    let _ = tx.send(held);
                }
                if held {
                    return Some(Change {
                        after,
                        by: Instant::now(),
                        by_wall: SystemTime::now(),
                    });
                }
                after = start;
                std::thread::sleep(Duration::from_millis(10));
            }
            None
        });
        let held_at_once = first_rx.recv().unwrap_or(false);
        assert!(!held_at_once, "{what}: already so before the fault");
        Watch {
            what: what.to_string(),
            thread,
        }
    }

    /// When the change happened; panics when it did not within the timeout.
    pub fn join(self) -> Change {
        self.thread
            .join()
            .unwrap()
            .unwrap_or_else(|| panic!("{}: did not happen in time", self.what))
    }
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
                    "{node}: {sender} sent {action} at {t} inside {other}'s sequence {start}..{end}; its calls:\n{}",
                    calls
                        .iter()
                        .map(|(s, t, a)| format!("  {t} {s} {a}"))
                        .collect::<Vec<_>>()
                        .join("\n")
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
            let working = probe_working;
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
