//! Misbehaving machines in the provisioning collective, for the hostile-node
//! tier: each is a plain NATS connection that sees what any
//! provisioning-mode server may see (every node's request subject, every
//! reply subject, the broadcast subjects) and publishes what a hostile one
//! would. They use the crate's own codecs, so their lies are well formed.

use choria_wire::lifecycle::{self, Event, EventType};
use choria_wire::mcorpc::{self, StatusCode};
use choria_wire::protocol::{self, ReplySpec, Request, Version};
use choria_wire::security::csr::{self, CsrSubject};
use choria_wire::security::ecdh::EcdhKeyPair;
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What an actor does.
#[derive(Clone)]
pub enum Mode {
    /// Answers every directed request to any node at once, under its own name.
    OwnName(String),
    /// Answers directed requests to `victims` at once in the victim's name,
    /// with its own key, CSR and a provisioning JWT it holds (`jwt`).
    VictimName {
        victims: HashSet<String>,
        jwt: String,
    },
    /// Answers directed requests to `victims` in their name, with a reply id
    /// that is not the request's.
    WrongRequestId { victims: HashSet<String> },
    /// Publishes every reply it sees once more, unchanged.
    Echo,
    /// Answers broadcast discovery under each of these names (invalid ones).
    BadDiscoveryNames(Vec<String>),
    /// Answers broadcast discovery under each of `names`, and directed
    /// requests to them in their name — a `discovery` ping always, and the
    /// requests named in `answers` (`agent#action`, with `jwt` as the
    /// provisioning JWT) — and nothing else: made-up names that look alive
    /// and then stall.
    Stalling {
        names: Arc<HashSet<String>>,
        answers: Vec<&'static str>,
        jwt: String,
    },
    /// Publishes a `shutdown` event for each of `victims`, `per_second`
    /// times a second, as long as it lives.
    ForgedShutdowns {
        victims: Vec<String>,
        per_second: u32,
    },
}

/// A directed request the actor saw (for "what reached whom").
#[derive(Clone, Debug)]
pub struct Seen {
    pub node: String,
    pub action: String,
}

pub struct Actor {
    task: tokio::task::JoinHandle<()>,
    /// Every directed request seen, in order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// How many messages it published.
    pub published: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Actor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Actor {
    pub async fn start(nats_url: &str, version: Version, mode: Mode) -> Self {
        let nats = async_nats::connect(nats_url)
            .await
            .expect("hostile connect");
        if let Mode::ForgedShutdowns {
            victims,
            per_second,
        } = &mode
        {
            let published = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let (victims, counter) = (victims.clone(), published.clone());
            let period = Duration::from_secs_f64(1.0 / f64::from((*per_second).max(1)));
            let task = tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    for v in &victims {
                        publish_event(&nats, EventType::Shutdown, v).await;
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    let _ = nats.flush().await;
                }
            });
            return Actor {
                task,
                seen: Default::default(),
                published,
            };
        }
        let subject = match &mode {
            Mode::Echo => "provisioning.reply.>",
            Mode::BadDiscoveryNames(_) => "provisioning.broadcast.agent.discovery",
            _ => "provisioning.node.>",
        };
        let mut sub = match &mode {
            // Its victims' subjects only: one task decoding every node's
            // requests falls seconds behind under load, and a reply that
            // lands after the victim's own is not seen.
            Mode::WrongRequestId { victims } => {
                let mut subs = Vec::new();
                for v in victims {
                    subs.push(
                        nats.subscribe(format!("provisioning.node.{v}"))
                            .await
                            .unwrap(),
                    );
                }
                futures::stream::select_all(subs).boxed()
            }
            _ => nats.subscribe(subject.to_string()).await.unwrap().boxed(),
        };
        if let Mode::Stalling { .. } = &mode {
            let broadcast = nats
                .subscribe("provisioning.broadcast.agent.discovery")
                .await
                .unwrap();
            sub = futures::stream::select(sub, broadcast).boxed();
        }
        nats.flush().await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let published = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // The impostor's own key, CSR key and ECDH pair: what it would
        // want the provisioner to trust.
        let ecdh = EcdhKeyPair::generate();
        let csr_key = csr::generate_rsa_key(1024).unwrap();
        let (seen2, published2) = (seen.clone(), published.clone());
        let task = tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                if let Mode::Echo = mode {
                    let _ = nats.publish(m.subject.clone(), m.payload.clone()).await;
                    published2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                let Ok(req) = protocol::decode_request(&m.payload, version) else {
                    continue;
                };
                let node = m
                    .subject
                    .strip_prefix("provisioning.node.")
                    .unwrap_or("")
                    .to_string();
                let body: Value = serde_json::from_slice(&req.payload()).unwrap_or(Value::Null);
                let action = body["action"].as_str().unwrap_or("").to_string();
                seen2.lock().unwrap().push(Seen {
                    node: node.clone(),
                    action: action.clone(),
                });
                let replies: Vec<(String, String, Vec<u8>)> = match &mode {
                    Mode::OwnName(name) => vec![(
                        name.clone(),
                        req.id.clone(),
                        fake_body(&req, &action, &node, None, &ecdh, &csr_key),
                    )],
                    Mode::VictimName { victims, jwt } if victims.contains(&node) => vec![(
                        node.clone(),
                        req.id.clone(),
                        fake_body(&req, &action, &node, Some(jwt), &ecdh, &csr_key),
                    )],
                    Mode::WrongRequestId { victims } if victims.contains(&node) => vec![(
                        node.clone(),
                        format!("{}x", &req.id[..req.id.len() - 1]),
                        fake_body(&req, &action, &node, None, &ecdh, &csr_key),
                    )],
                    Mode::BadDiscoveryNames(names) => names
                        .iter()
                        .map(|n| (n.clone(), req.id.clone(), b"pong".to_vec()))
                        .collect(),
                    Mode::Stalling { names, .. } if m.subject.contains(".broadcast.") => names
                        .iter()
                        .map(|n| (n.clone(), req.id.clone(), b"pong".to_vec()))
                        .collect(),
                    Mode::Stalling {
                        names,
                        answers,
                        jwt,
                    } if names.contains(&node)
                        && (req.agent == "discovery"
                            || answers.contains(&format!("{}#{action}", req.agent).as_str())) =>
                    {
                        vec![(
                            node.clone(),
                            req.id.clone(),
                            fake_body(&req, &action, &node, Some(jwt), &ecdh, &csr_key),
                        )]
                    }
                    _ => Vec::new(),
                };
                for (sender, id, body) in replies {
                    let spec = ReplySpec {
                        request_id: &id,
                        sender: &sender,
                        agent: &req.agent,
                        time_nanos: now_nanos(),
                        body: &body,
                        connected_url: "",
                    };
                    let bytes = protocol::encode_reply(version, &spec).unwrap();
                    let _ = nats.publish(req.reply_to.clone(), bytes.into()).await;
                    published2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Actor {
            task,
            seen,
            published,
        }
    }

    /// Directed requests seen for `node` with `action`.
    pub fn seen_for(&self, node: &str, action: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.node == node && s.action == action)
            .count()
    }
}

/// What a lying node answers: plausible data for each action, with the
/// impostor's keys wherever a key or CSR goes.
fn fake_body(
    req: &Request,
    action: &str,
    node: &str,
    jwt: Option<&String>,
    ecdh: &EcdhKeyPair,
    csr_key: &rsa::RsaPrivateKey,
) -> Vec<u8> {
    if req.agent == "discovery" {
        return b"pong".to_vec();
    }
    let data = match (req.agent.as_str(), action) {
        ("choria_provision", "jwt") => json!({
            "jwt": jwt.cloned().unwrap_or_else(|| "x.y.z".into()),
            "ecdh_public": ecdh.public_hex(),
        }),
        ("choria_provision", "gencsr") => json!({
            "csr": csr::make_csr(csr_key, &CsrSubject::new(node)).unwrap(),
            "public_key": "",
            "ssldir": "/tmp/stolen",
        }),
        ("rpcutil", "inventory") => json!({
            "agents": ["choria_provision"], "classes": [], "facts": {}, "version": "0.30.2",
        }),
        _ => json!({"message": "ok"}),
    };
    mcorpc::encode_reply(action, StatusCode::Ok, "OK", &data)
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// A provisioning-mode server's `startup` event for `identity`.
async fn publish_startup(nats: &async_nats::Client, identity: &str) {
    publish_event(nats, EventType::Startup, identity).await
}

/// A provisioning-mode server's lifecycle event of `kind` for `identity`.
async fn publish_event(nats: &async_nats::Client, kind: EventType, identity: &str) {
    let event = Event::new(kind, identity, "provision_mode_server", Some("0.30.2"));
    let _ = nats
        .publish(
            lifecycle::subject(kind, "provision_mode_server"),
            event.to_choria_json().into(),
        )
        .await;
}

/// Publishes fake `startup` events at `per_second` for `for_how_long`,
/// for identities that exist nowhere; returns how many it sent.
pub async fn flood_startup_events(nats_url: &str, per_second: u64, for_how_long: Duration) -> u64 {
    let nats = async_nats::connect(nats_url).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while started.elapsed() < for_how_long {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * per_second as f64) as u64;
        while sent < due {
            let name = format!("ghost-{sent}.flood.example.net");
            publish_startup(&nats, &name).await;
            sent += 1;
        }
    }
    let _ = nats.flush().await;
    sent
}

/// Publishes `startup` events with each of `names` as the identity.
pub async fn bad_startup_events(nats_url: &str, names: &[String], times: usize) {
    let nats = async_nats::connect(nats_url).await.unwrap();
    for _ in 0..times {
        for n in names {
            publish_startup(&nats, n).await;
        }
    }
    nats.flush().await.unwrap();
}
