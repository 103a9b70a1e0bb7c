//! The Choria Streams election's own rules (`src/election/streams.rs`),
//! one `Backend` call at a time against a real nats-server with JetStream:
//! a campaign only wins an absent key, a renewal expects our sequence and a
//! foreign write makes us a follower, a release leaves a delete marker and
//! announces it, a standby behind a Choria broker claims an announced
//! marker, and the bucket TTL's bounds and the timings derived from it.
//! Only the `Backend` trait is used, not how the driver reacts to it.

use crate::support::election::{
    admin, choria_like_broker, create_bucket, read_key_entry, KeyEntry,
};
use crate::support::NatsServer;
use choria_config::ElectionConfig;
use choria_core::election::machine::Outcome;
use choria_core::election::streams::{release_subject, StreamsBackend, StreamsError};
use choria_core::election::Backend;
use futures::StreamExt;
use serde_json::Value;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(5);

/// A nats-server with JetStream in its one account: the whole JetStream API
/// (DIRECT.GET included) is reachable, as on a plain server.
fn jetstream_server() -> NatsServer {
    let store = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_with(&format!(
        "jetstream {{ store_dir: \"{}\" }}\n",
        store.path().display()
    ));
    std::mem::forget(store); // lives as long as the test process
    nats
}

/// The election settings for a plain server (`$JS.API`).
fn plain() -> ElectionConfig {
    ElectionConfig {
        api_prefix: String::new(),
        ..Default::default()
    }
}

/// A candidate on a plain server, creating the bucket with `ttl` if needed.
async fn candidate(nats: &NatsServer, identity: &str, ttl: Duration) -> StreamsBackend {
    StreamsBackend::connect(nats.connect(identity).await, &plain(), identity, Some(ttl))
        .await
        .unwrap_or_else(|e| panic!("{identity}: {e}"))
}

/// A candidate behind the Choria-like broker (provisioning account, API
/// prefix `choria.streams`, only the election subjects imported).
async fn candidate_behind_broker(nats: &NatsServer, identity: &str) -> StreamsBackend {
    StreamsBackend::connect(
        nats.connect(identity).await,
        &ElectionConfig::default(),
        identity,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("{identity}: {e}"))
}

async fn key(reader: &async_nats::Client) -> KeyEntry {
    read_key_entry(reader)
        .await
        .expect("the election key has an entry")
}

async fn campaign(b: &mut StreamsBackend) -> Outcome {
    b.campaign()
        .await
        .unwrap_or_else(|e| panic!("{}: campaign: {e}", b.identity()))
}

async fn renew(b: &mut StreamsBackend) -> Outcome {
    b.renew()
        .await
        .unwrap_or_else(|e| panic!("{}: renew: {e}", b.identity()))
}

/// An unconditional write or delete marker on the key, from `client`.
async fn write_key(client: &async_nats::Client, delete: bool, value: &str) {
    let mut headers = async_nats::HeaderMap::new();
    if delete {
        headers.insert("KV-Operation", "DEL");
    }
    let ack = client
        .request_with_headers(
            "$KV.CHORIA_LEADER_ELECTION.provisioner",
            headers,
            value.as_bytes().to_vec().into(),
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&ack.payload).unwrap();
    assert!(v.get("error").is_none(), "write: {v}");
}

#[tokio::test]
async fn a_campaign_wins_only_an_absent_key_and_writes_its_identity() {
    let nats = jetstream_server();
    let reader = nats.connect("reader").await;
    let mut a = candidate(&nats, "a.example.net", TTL).await;
    let mut b = candidate(&nats, "b.example.net", TTL).await;
    assert_eq!(read_key_entry(&reader).await, None, "the key starts absent");
    assert_eq!(campaign(&mut a).await, Outcome::Leading);
    let won = key(&reader).await;
    assert_eq!(
        (won.op.as_str(), won.value.as_str()),
        ("PUT", "a.example.net")
    );
    // The key exists: the other candidate's campaign (expecting sequence 0)
    // fails, and so does the leader's own second campaign.
    assert_eq!(campaign(&mut b).await, Outcome::Following(None));
    assert_eq!(campaign(&mut a).await, Outcome::Following(None));
    assert_eq!(key(&reader).await, won, "a lost campaign writes nothing");
}

#[tokio::test]
async fn a_renewal_expects_our_sequence_and_a_foreign_write_makes_us_follow() {
    let nats = jetstream_server();
    let reader = nats.connect("reader").await;
    let mut a = candidate(&nats, "a.example.net", TTL).await;
    assert_eq!(campaign(&mut a).await, Outcome::Leading);
    let first = key(&reader).await;
    assert_eq!(renew(&mut a).await, Outcome::Leading);
    let renewed = key(&reader).await;
    assert!(renewed.seq > first.seq, "{renewed:?} after {first:?}");
    assert_eq!(renewed.value, "a.example.net");
    // Someone else writes the key: our next renewal, expecting our
    // sequence, fails and leaves their entry alone.
    write_key(&reader, false, "intruder.example.net").await;
    let foreign = key(&reader).await;
    assert_eq!(renew(&mut a).await, Outcome::Following(None));
    assert_eq!(key(&reader).await, foreign);
    // `choria election evict` (a delete marker) does the same.
    let mut b = candidate(&nats, "b.example.net", TTL).await;
    write_key(&reader, true, "").await;
    assert_eq!(
        campaign(&mut b).await,
        Outcome::Leading,
        "a marker is claimable"
    );
    assert_eq!(renew(&mut b).await, Outcome::Leading);
    write_key(&reader, true, "").await;
    assert_eq!(renew(&mut b).await, Outcome::Following(None));
}

/// On a plain server a candidate reads a delete marker (DIRECT.GET) and
/// claims the key on it, as nats.go's Create does; the holder it evicted may
/// still work until its next renewal, so the win asks to settle that long,
/// once.
#[tokio::test]
async fn claiming_an_unannounced_marker_settles_for_a_renewal_period_once() {
    let nats = jetstream_server();
    let reader = nats.connect("reader").await;
    let mut a = candidate(&nats, "a.example.net", TTL).await;
    let mut b = candidate(&nats, "b.example.net", TTL).await;
    assert_eq!(campaign(&mut a).await, Outcome::Leading);
    assert_eq!(b.settle(), Duration::ZERO, "nothing claimed yet");
    write_key(&reader, true, "").await;
    assert_eq!(campaign(&mut b).await, Outcome::Leading);
    assert_eq!(key(&reader).await.value, "b.example.net");
    let settle = b.settle();
    assert!(
        settle > b.timings().renew_period,
        "the evicted holder renews within a renewal period: settle {settle:?}"
    );
    assert_eq!(b.settle(), Duration::ZERO, "asked once per win");
    assert_eq!(renew(&mut a).await, Outcome::Following(None));
}

/// Behind a Choria broker a standby cannot read the marker a release
/// leaves (no DIRECT.GET import): the leader announces the marker's
/// sequence, and the standby claims the key expecting exactly it.
#[tokio::test]
async fn a_release_leaves_an_announced_marker_that_a_standby_claims() {
    let nats = choria_like_broker();
    create_bucket(&nats, TTL).await;
    let admin = admin(&nats).await;
    let listener = nats.connect("listener").await;
    let mut announcements = listener
        .subscribe(release_subject("CHORIA_LEADER_ELECTION", "provisioner"))
        .await
        .unwrap();
    listener.flush().await.unwrap();
    let mut a = candidate_behind_broker(&nats, "a.example.net").await;
    let mut b = candidate_behind_broker(&nats, "b.example.net").await;
    assert_eq!(campaign(&mut a).await, Outcome::Leading);
    assert_eq!(campaign(&mut b).await, Outcome::Following(None));
    a.release().await.unwrap_or_else(|e| panic!("release: {e}"));
    let marker = key(&admin).await;
    assert_eq!(
        marker.op, "DEL",
        "the release leaves a delete marker: {marker:?}"
    );
    let announced = tokio::time::timeout(Duration::from_secs(10), announcements.next())
        .await
        .expect("the release is announced")
        .unwrap();
    let announced: Value = serde_json::from_slice(&announced.payload).unwrap();
    assert_eq!(announced["revision"], marker.seq, "{announced}");
    assert_eq!(announced["identity"], "a.example.net", "{announced}");
    // Without the announcement a campaign expects an absent key and loses to
    // the marker: only the announced sequence opens it.
    let mut c = candidate_behind_broker(&nats, "c.example.net").await;
    assert_eq!(campaign(&mut c).await, Outcome::Following(None));
    tokio::time::timeout(TTL, b.announcement(false))
        .await
        .expect("the standby hears of the release");
    assert_eq!(campaign(&mut b).await, Outcome::Leading);
    assert_eq!(
        b.settle(),
        choria_core::election::streams::ANNOUNCED_HOLD_OFF,
        "a win on an announcement, which anyone could forge, holds off before working"
    );
    assert_eq!(b.settle(), Duration::ZERO, "once");
    let claimed = key(&admin).await;
    assert_eq!(
        (claimed.op.as_str(), claimed.value.as_str()),
        ("PUT", "b.example.net")
    );
    assert_eq!(claimed.seq, marker.seq + 1, "claimed on the marker itself");
    assert_eq!(renew(&mut a).await, Outcome::Following(None));
}

/// The leader never hears its own release (replicas may share an
/// identity, so it is told apart by instance): it does not campaign again
/// on it.
#[tokio::test]
async fn a_leader_does_not_take_its_own_release_for_a_vacancy() {
    let nats = choria_like_broker();
    create_bucket(&nats, TTL).await;
    let mut a = candidate_behind_broker(&nats, "a.example.net").await;
    assert_eq!(campaign(&mut a).await, Outcome::Leading);
    a.release().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), a.announcement(false))
            .await
            .is_err(),
        "its own announcement woke the releasing candidate"
    );
}

#[tokio::test]
async fn the_bucket_ttl_must_be_within_go_bounds_and_sets_the_timings() {
    for (ttl, ok) in [
        (Duration::from_secs(3), false),
        (Duration::from_secs(4), true),
        (Duration::from_secs(3600), true),
        (Duration::from_secs(3601), false),
    ] {
        let nats = jetstream_server();
        let r = StreamsBackend::connect(nats.connect("c").await, &plain(), "c", Some(ttl)).await;
        match (r, ok) {
            (Ok(b), true) => assert_eq!(b.ttl(), ttl),
            (Err(StreamsError::BadTtl { ttl: got, .. }), false) => assert_eq!(got, ttl),
            (r, _) => panic!("TTL {ttl:?}: {:?}", r.map(|b| b.ttl())),
        }
    }
    // Renew four times per TTL (at most every 2 s), campaign every quarter
    // TTL (at most every second), step down a quarter TTL before expiry.
    for (ttl, retry, renew, deadline) in [(5, 1000, 1250, 3750), (3600, 1000, 2000, 2_700_000)] {
        let nats = jetstream_server();
        let b = candidate(&nats, "c", Duration::from_secs(ttl)).await;
        let t = b.timings();
        assert_eq!(
            (t.retry_period, t.renew_period, t.renew_deadline),
            (
                Duration::from_millis(retry),
                Duration::from_millis(renew),
                Duration::from_millis(deadline)
            ),
            "TTL {ttl} s"
        );
    }
}

#[tokio::test]
async fn a_missing_bucket_is_named_unless_we_may_create_it() {
    let nats = jetstream_server();
    let r = StreamsBackend::connect(nats.connect("c").await, &plain(), "c", None).await;
    assert!(
        matches!(r, Err(StreamsError::NoBucket { ref bucket }) if bucket == "CHORIA_LEADER_ELECTION"),
        "{:?}",
        r.map(|b| b.ttl())
    );
    let mut b = candidate(&nats, "c", TTL).await;
    assert_eq!(b.ttl(), TTL);
    assert_eq!(campaign(&mut b).await, Outcome::Leading);
    // Behind a broker without JetStream for us, the error says where to look.
    let bare = NatsServer::start();
    let r = StreamsBackend::connect(
        bare.connect("c").await,
        &ElectionConfig::default(),
        "c",
        None,
    )
    .await;
    let e = r.map(|b| b.ttl()).unwrap_err();
    assert!(matches!(e, StreamsError::NoResponders { .. }), "{e}");
    assert!(e.to_string().contains("choria.streams"), "{e}");
}
