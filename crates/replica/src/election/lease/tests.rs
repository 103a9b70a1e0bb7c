use super::*;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{json, Value};
use std::sync::Mutex;

type ApiServer = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/choria/leases";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/choria/leases/prov";

struct FakeClock {
    start: Instant,
    wall0: Timestamp,
    elapsed: Mutex<Duration>,
}

impl FakeClock {
    fn advance(&self, d: Duration) {
        *self.elapsed.lock().unwrap() += d;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.start + *self.elapsed.lock().unwrap()
    }
    fn wall(&self) -> Timestamp {
        self.wall0 + *self.elapsed.lock().unwrap()
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn mt(s: &str) -> Option<MicroTime> {
    Some(MicroTime(ts(s)))
}

const WALL0: &str = "2026-05-01T10:00:00Z";

fn setup(identity: &str) -> (LeaseBackend, ApiServer, Arc<FakeClock>) {
    let (svc, server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(svc, "default");
    let cfg = ElectionConfig {
        lease_name: "prov".into(),
        lease_namespace: Some("choria".into()),
        ..ElectionConfig::default()
    };
    let clock = Arc::new(FakeClock {
        start: Instant::now(),
        wall0: ts(WALL0),
        elapsed: Mutex::new(Duration::ZERO),
    });
    let backend = LeaseBackend::new(client, &cfg, identity, "choria").with_clock(clock.clone());
    (backend, server, clock)
}

fn lease(
    rv: &str,
    holder: &str,
    duration: i32,
    acquire: &str,
    renew: &str,
    transitions: i32,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("prov".into()),
            namespace: Some("choria".into()),
            resource_version: Some(rv.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(duration),
            acquire_time: mt(acquire),
            renew_time: mt(renew),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

enum Reply {
    Json(StatusCode, Value),
    /// The written object back, at a new resourceVersion.
    Echo(&'static str),
}

fn status(code: u16, reason: &str) -> Reply {
    Reply::Json(
        StatusCode::from_u16(code).unwrap(),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": format!("test says {reason}"), "reason": reason, "code": code}),
    )
}

fn found(l: &Lease) -> Reply {
    Reply::Json(StatusCode::OK, serde_json::to_value(l).unwrap())
}

/// Answers exactly these requests in order; returns the bodies written.
async fn serve(server: &mut ApiServer, steps: Vec<(Method, &str, Reply)>) -> Vec<Lease> {
    let mut written = Vec::new();
    for (method, path, reply) in steps {
        let (req, send) = server.next_request().await.expect("a request");
        assert_eq!((req.method(), req.uri().path()), (&method, path));
        let body = req.into_body().collect_bytes().await.unwrap();
        let (code, reply) = match reply {
            Reply::Json(code, v) => (code, v),
            Reply::Echo(rv) => {
                let mut v: Value = serde_json::from_slice(&body).unwrap();
                v["metadata"]["resourceVersion"] = json!(rv);
                (StatusCode::OK, v)
            }
        };
        if !body.is_empty() {
            written.push(serde_json::from_slice(&body).unwrap());
        }
        let resp = Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap();
        send.send_response(resp);
    }
    written
}

/// Runs one backend call against exactly `steps`; an unexpected extra
/// request (say, a write where none may happen) hangs and times out.
async fn exchange<T>(
    call: impl std::future::Future<Output = T>,
    server: &mut ApiServer,
    steps: Vec<(Method, &str, Reply)>,
) -> (T, Vec<Lease>) {
    tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(call, serve(server, steps))
    })
    .await
    .expect("the backend made exactly the expected requests")
}

/// `call` GETs `current` and wins with a PUT conditional on `read_rv`,
/// which the server stores as `new_rv`; the spec written.
async fn leads_with_a_conditional_put(
    call: impl std::future::Future<Output = Result<Outcome, ElectionError>>,
    server: &mut ApiServer,
    current: &Lease,
    new_rv: &'static str,
    read_rv: &str,
) -> LeaseSpec {
    let (r, w) = exchange(
        call,
        server,
        vec![
            (Method::GET, LEASE, found(current)),
            (Method::PUT, LEASE, Reply::Echo(new_rv)),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Leading);
    assert_eq!(w[0].metadata.resource_version.as_deref(), Some(read_rv));
    spec(&w[0]).clone()
}

fn spec(l: &Lease) -> &LeaseSpec {
    l.spec.as_ref().unwrap()
}

#[tokio::test]
async fn takes_a_free_lease_with_a_conditional_put() {
    let (mut b, mut server, _) = setup("me");
    let free = lease(
        "41",
        "",
        1,
        "2026-05-01T09:00:00Z",
        "2026-05-01T09:59:59Z",
        3,
    );
    let s = leads_with_a_conditional_put(b.campaign(), &mut server, &free, "42", "41").await;
    assert_eq!(s.holder_identity.as_deref(), Some("me"));
    assert_eq!(s.lease_transitions, Some(4));
    assert_eq!(s.lease_duration_seconds, Some(15));
    assert_eq!(s.acquire_time, mt(WALL0));
    assert_eq!(s.renew_time, mt(WALL0));
}

/// A campaign that finds no Lease and creates it; the Lease written.
async fn campaign_creating(b: &mut LeaseBackend, server: &mut ApiServer) -> Lease {
    let (r, w) = exchange(
        b.campaign(),
        server,
        vec![
            (Method::GET, LEASE, status(404, "NotFound")),
            (Method::POST, LEASES, Reply::Echo("1")),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Leading);
    w.into_iter().next().expect("the Lease written")
}

#[tokio::test]
async fn creates_the_lease_when_absent() {
    let (mut b, mut server, _) = setup("me");
    let w = [campaign_creating(&mut b, &mut server).await];
    assert_eq!(w[0].metadata.name.as_deref(), Some("prov"));
    assert_eq!(w[0].metadata.resource_version, None);
    let s = spec(&w[0]);
    assert_eq!(s.holder_identity.as_deref(), Some("me"));
    assert_eq!(s.lease_transitions, Some(0));
    assert_eq!(s.lease_duration_seconds, Some(15));
    assert_eq!(
        (s.acquire_time.clone(), s.renew_time.clone()),
        (mt(WALL0), mt(WALL0))
    );
}

#[tokio::test]
async fn the_lease_is_created_owned_and_an_ownerless_one_gets_its_owner() {
    let owner = OwnerReference {
        api_version: "provisioning.choria.io/v1alpha1".into(),
        kind: "Provisioner".into(),
        name: "prov".into(),
        uid: "u-1".into(),
        ..OwnerReference::default()
    };
    let (b, mut server, _) = setup("me");
    let mut b = b.with_owner(owner.clone());
    let created = campaign_creating(&mut b, &mut server).await;
    assert_eq!(created.metadata.owner_references, Some(vec![owner.clone()]));

    // Made by a pod of an older release, without an owner: the next write
    // adds it, and only once.
    let (b, mut server, _) = setup("me");
    let mut b = b.with_owner(owner.clone());
    let free = lease("41", "", 1, WALL0, WALL0, 3);
    leads_with_a_conditional_put(b.campaign(), &mut server, &free, "42", "41").await;
    let mut held = lease("42", "me", 15, WALL0, WALL0, 4);
    held.metadata.owner_references = Some(vec![owner.clone()]);
    let (_, w) = exchange(
        b.renew(),
        &mut server,
        vec![
            (Method::GET, LEASE, found(&held)),
            (Method::PUT, LEASE, Reply::Echo("43")),
        ],
    )
    .await;
    assert_eq!(w[0].metadata.owner_references, Some(vec![owner]));
}

#[tokio::test]
async fn losing_the_create_race_follows() {
    let (mut b, mut server, _) = setup("me");
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![
            (Method::GET, LEASE, status(404, "NotFound")),
            (Method::POST, LEASES, status(409, "AlreadyExists")),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Following(None));
}

#[tokio::test]
async fn a_held_lease_expires_by_local_observation_time_only() {
    let (mut b, mut server, clock) = setup("me");
    let held = lease(
        "7",
        "other",
        15,
        "2026-05-01T09:00:00Z",
        "2026-05-01T09:59:58Z",
        2,
    );
    for wait in [0, 14] {
        clock.advance(Duration::from_secs(wait));
        let (r, w) = exchange(
            b.campaign(),
            &mut server,
            vec![(Method::GET, LEASE, found(&held))],
        )
        .await;
        assert_eq!(r.unwrap(), Outcome::Following(Some("other".into())));
        assert!(w.is_empty());
    }
    // The holder renews at 14 s: the observation starts over.
    let renewed = lease(
        "8",
        "other",
        15,
        "2026-05-01T09:00:00Z",
        "2026-05-01T10:00:14Z",
        2,
    );
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![(Method::GET, LEASE, found(&renewed))],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Following(Some("other".into())));
    clock.advance(Duration::from_secs(14));
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![(Method::GET, LEASE, found(&renewed))],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Following(Some("other".into())));
    // 15 s of our time without a change: it expired.
    clock.advance(Duration::from_secs(1));
    let s = leads_with_a_conditional_put(b.campaign(), &mut server, &renewed, "9", "8").await;
    assert_eq!(s.holder_identity.as_deref(), Some("me"));
    assert_eq!(s.lease_transitions, Some(3));
    assert_eq!(s.acquire_time, mt("2026-05-01T10:00:29Z"));
}

#[tokio::test]
async fn an_old_renew_time_is_not_taken_as_expiry() {
    // Far in the past by our clock (or theirs is skewed): only our own
    // observation counts, so the first sight never takes over.
    let (mut b, mut server, clock) = setup("me");
    let stale = lease(
        "5",
        "other",
        15,
        "2020-01-01T00:00:00Z",
        "2020-01-01T00:00:00Z",
        1,
    );
    let (r, w) = exchange(
        b.campaign(),
        &mut server,
        vec![(Method::GET, LEASE, found(&stale))],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Following(Some("other".into())));
    assert!(w.is_empty());
    clock.advance(Duration::from_secs(15));
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![
            (Method::GET, LEASE, found(&stale)),
            (Method::PUT, LEASE, Reply::Echo("6")),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Leading);
}

#[tokio::test]
async fn renewing_keeps_acquire_time_and_transitions() {
    let (mut b, mut server, clock) = setup("me");
    let ours = lease(
        "20",
        "me",
        15,
        "2026-05-01T09:00:00Z",
        "2026-05-01T09:59:59Z",
        2,
    );
    clock.advance(Duration::from_millis(2500));
    let s = leads_with_a_conditional_put(b.renew(), &mut server, &ours, "21", "20").await;
    assert_eq!(s.holder_identity.as_deref(), Some("me"));
    assert_eq!(s.lease_transitions, Some(2));
    assert_eq!(s.acquire_time, mt("2026-05-01T09:00:00Z"));
    assert_eq!(s.renew_time, mt("2026-05-01T10:00:02.5Z"));
}

#[tokio::test]
async fn a_conflicting_write_follows() {
    let (mut b, mut server, _) = setup("me");
    let free = lease("3", "", 1, WALL0, WALL0, 0);
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![
            (Method::GET, LEASE, found(&free)),
            (Method::PUT, LEASE, status(409, "Conflict")),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Following(None));
}

#[tokio::test]
async fn release_clears_the_holder_over_our_last_write() {
    let (mut b, mut server, clock) = setup("me");
    let (r, _) = exchange(b.release(), &mut server, vec![]).await;
    r.expect("nothing to release, no request");

    let free = lease("10", "", 1, WALL0, WALL0, 4);
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![
            (Method::GET, LEASE, found(&free)),
            (Method::PUT, LEASE, Reply::Echo("11")),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Outcome::Leading);
    clock.advance(Duration::from_secs(1));
    let (r, w) = exchange(
        b.release(),
        &mut server,
        vec![(Method::PUT, LEASE, Reply::Echo("12"))],
    )
    .await;
    r.unwrap();
    assert_eq!(w[0].metadata.resource_version.as_deref(), Some("11"));
    let s = spec(&w[0]);
    assert_eq!(s.holder_identity.as_deref(), Some(""));
    assert_eq!(s.lease_duration_seconds, Some(1));
    assert_eq!(s.lease_transitions, Some(5));
    assert_eq!(s.acquire_time, mt("2026-05-01T10:00:01Z"));
    assert_eq!(s.renew_time, mt("2026-05-01T10:00:01Z"));
    // Released: a second release writes nothing.
    let (r, _) = exchange(b.release(), &mut server, vec![]).await;
    r.unwrap();
}

#[tokio::test]
async fn api_errors_are_errors_with_context() {
    let (mut b, mut server, _) = setup("me");
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![(Method::GET, LEASE, status(500, "InternalError"))],
    )
    .await;
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("get of lease choria/prov failed: 500 InternalError"),
        "{e}"
    );
    let free = lease("3", "", 1, WALL0, WALL0, 0);
    let (r, _) = exchange(
        b.campaign(),
        &mut server,
        vec![
            (Method::GET, LEASE, found(&free)),
            (Method::PUT, LEASE, status(403, "Forbidden")),
        ],
    )
    .await;
    let e = r.unwrap_err().to_string();
    assert!(
        e.contains("update of lease choria/prov failed: 403 Forbidden"),
        "{e}"
    );
}

#[tokio::test]
async fn describes_itself_and_uses_client_go_timings() {
    let (b, _server, _) = setup("pod-0");
    assert_eq!(b.describe(), "lease choria/prov");
    assert_eq!(b.identity(), "pod-0");
    assert_eq!(
        b.timings(),
        Timings {
            retry_period: Duration::from_secs(2),
            renew_period: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(10),
        }
    );
}

/// Records what the election told it, and follows leadership like a
/// provisioner's pause gate.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>, Arc<std::sync::atomic::AtomicBool>);

impl super::super::Steer for Recorder {
    fn won(&self, me: &str) {
        self.0.lock().unwrap().push(format!("won {me}"));
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    fn lost(&self, me: &str, reason: &super::super::machine::LossReason) {
        self.0.lock().unwrap().push(format!("lost {me}: {reason}"));
        self.1.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn the_driver_resumes_on_winning_and_releases_on_stop() {
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;
    let steer = Recorder::default();
    let working = || steer.1.load(std::sync::atomic::Ordering::SeqCst);
    let (b, mut server, _) = setup("me");
    let (leader_tx, mut leader) = watch::channel(None);
    let stop = CancellationToken::new();
    let mut b = Some(b);
    let run = tokio::spawn(super::super::run(
        move || std::future::ready(b.take().ok_or(ElectionError::Other("set up once".into()))),
        steer.clone(),
        stop.clone(),
        leader_tx,
    ));

    let free = lease("1", "", 1, WALL0, WALL0, 0);
    let mut w = serve(
        &mut server,
        vec![
            (Method::GET, LEASE, found(&free)),
            (Method::PUT, LEASE, Reply::Echo("2")),
        ],
    )
    .await;
    leader
        .wait_for(|l| l.as_deref() == Some("me"))
        .await
        .unwrap();
    assert!(working(), "the winner works");

    // A renewal one retry period later (tokio's clock is paused and
    // jumps ahead), then the release on stop.
    let mut ours = w.remove(0);
    ours.metadata.resource_version = Some("2".into());
    serve(
        &mut server,
        vec![
            (Method::GET, LEASE, found(&ours)),
            (Method::PUT, LEASE, Reply::Echo("3")),
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let w = serve(&mut server, vec![(Method::PUT, LEASE, Reply::Echo("4"))]).await;
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the election stops")
        .unwrap();
    assert_eq!(w[0].metadata.resource_version.as_deref(), Some("3"));
    assert_eq!(spec(&w[0]).holder_identity.as_deref(), Some(""));
    assert_eq!(*leader.borrow(), None);
    assert!(!working(), "stopped working once released");
    assert_eq!(
        *steer.0.lock().unwrap(),
        ["won me", "lost me: released on shutdown"]
    );
}
