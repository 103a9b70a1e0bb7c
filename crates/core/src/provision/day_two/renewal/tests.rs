use super::*;
use crate::records::Record;
use crate::records::ServerJwtRecord;
use choria_config::day_two::Before;
use std::collections::BTreeSet;

fn cfg(before: Before, jitter: u64) -> RenewalConfig {
    RenewalConfig {
        before,
        jitter: Duration::from_secs(jitter),
        rate: 60,
        choria_config: "renewal.cfg".into(),
        collective: "mcollective".into(),
        retry: Duration::from_secs(600),
    }
}

fn record(identity: &str, issued: i64, expires: i64) -> Record {
    Record {
        identity: identity.into(),
        time: String::new(),
        time_unix: issued,
        replica: "r".into(),
        site: "s".into(),
        protocol: "v2".into(),
        mode: "template".into(),
        signer: None,
        certificate: None,
        server_jwt: Some(ServerJwtRecord {
            jti: "j".into(),
            issued_unix: issued,
            expires_unix: expires,
            collectives: vec!["choria".into()],
        }),
        config_sha256: String::new(),
        provisioning_jwt_expires_unix: None,
    }
}

fn due(identity: &str, collective: Option<&str>) -> DueNode {
    DueNode {
        identity: identity.into(),
        collective: collective.map(str::to_string),
        returns_until: None,
    }
}

#[test]
fn a_node_is_due_before_its_expiry_by_a_duration_or_a_share() {
    let mut s = Schedule::default();
    s.upsert(
        &record("a", 0, 10_000),
        &cfg(Before::Duration(Duration::from_secs(1_000)), 0),
    );
    assert_eq!(s.due_at("a"), Some(9_000));
    s.upsert(&record("b", 0, 10_000), &cfg(Before::Share(0.25), 0));
    assert_eq!(s.due_at("b"), Some(7_500));
    assert_eq!(s.due_count(8_999), 1);
    assert_eq!(
        s.due(9_000, 10),
        [due("b", Some("choria")), due("a", Some("choria"))]
    );
    // A newer record replaces the old due time.
    s.upsert(
        &record("a", 10_000, 20_000),
        &cfg(Before::Duration(Duration::from_secs(1_000)), 0),
    );
    assert_eq!(s.due_at("a"), Some(19_000));
    assert_eq!(s.len(), 2);
}

#[test]
fn jitter_spreads_a_fleet_provisioned_at_once_but_is_stable_per_node() {
    let c = cfg(Before::Duration(Duration::from_secs(100)), 3_600);
    let mut s = Schedule::default();
    for i in 0..1_000 {
        s.upsert(&record(&format!("n{i}"), 0, 100_000), &c);
    }
    let dues: BTreeSet<i64> = (0..1_000)
        .map(|i| s.due_at(&format!("n{i}")).unwrap())
        .collect();
    // 1,000 nodes uniform over 3,600 whole seconds share some seconds:
    // 3,600 x (1 - e^(-1000/3600)) = ~872 distinct are expected.
    assert!(
        dues.len() > 800,
        "spread: {} distinct due times",
        dues.len()
    );
    assert!(dues
        .iter()
        .all(|d| (100_000 - 100 - 3_600..=100_000 - 100).contains(d)));
    let again = s.due_at("n7");
    s.upsert(&record("n7", 0, 100_000), &c);
    assert_eq!(s.due_at("n7"), again, "the same node, the same share");
}

#[test]
fn an_asked_node_waits_for_its_retry_and_a_failure_backs_off() {
    let c = cfg(Before::Duration(Duration::from_secs(1)), 0);
    let mut s = Schedule::default();
    s.upsert(&record("a", 0, 100), &c);
    s.asked("a", 100, Duration::from_secs(600));
    assert_eq!(s.due_at("a"), Some(700));
    s.failed("a", 700, Duration::from_secs(600));
    assert_eq!(s.due_at("a"), Some(730));
    s.failed("a", 730, Duration::from_secs(600));
    assert_eq!(s.due_at("a"), Some(790), "doubled");
    for _ in 0..10 {
        s.failed("a", 1_000, Duration::from_secs(600));
    }
    assert_eq!(s.due_at("a"), Some(1_600), "at most the retry");
    // Nothing expiring, nothing to renew.
    let mut r = record("none", 0, 0);
    r.server_jwt = None;
    s.upsert(&r, &c);
    assert_eq!(s.due_at("none"), None);
}

#[test]
fn the_rate_limit_allows_rate_a_minute() {
    let t0 = std::time::Instant::now();
    let mut l = RateLimit::per_minute(120, t0);
    assert_eq!(l.available(t0), 2, "a burst of one second's worth");
    l.take(2);
    assert_eq!(l.available(t0), 0);
    assert_eq!(l.available(t0 + Duration::from_millis(500)), 1);
    let mut total = 0;
    let mut l = RateLimit::per_minute(120, t0);
    for s in 0..60 {
        let n = l.available(t0 + Duration::from_secs(s));
        l.take(n);
        total += n;
    }
    assert!(
        (118..=122).contains(&total),
        "{total} in a minute at 120/min"
    );
    let mut slow = RateLimit::per_minute(6, t0);
    assert_eq!(slow.available(t0), 1);
    slow.take(1);
    assert_eq!(slow.available(t0 + Duration::from_secs(5)), 0);
    assert_eq!(slow.available(t0 + Duration::from_secs(10)), 1);
}

#[test]
fn a_node_is_not_asked_while_it_still_restarts_from_its_provisioning() {
    // Already due by its expiry (a short, backdated certificate), but
    // provisioned a moment ago: it is still in its restart splay.
    let mut s = Schedule::default();
    s.upsert(&record("a", 1_000, 1_100), &cfg(Before::Share(0.9), 0));
    assert_eq!(s.due_at("a"), Some(1_000 + SETTLE_AFTER_PROVISIONING));
}

#[test]
fn an_older_record_of_a_node_is_a_replay_and_changes_nothing() {
    let c = cfg(Before::Duration(Duration::from_secs(100)), 0);
    let mut s = Schedule::default();
    assert_eq!(
        s.upsert(&record("a", 1_000, 10_000), &c),
        Upserted::Scheduled
    );
    assert_eq!(s.due_at("a"), Some(9_900));
    // An earlier revision written again would make it due at once.
    assert_eq!(s.upsert(&record("a", 500, 1_000), &c), Upserted::Replayed);
    assert_eq!(s.due_at("a"), Some(9_900));
    assert_eq!(
        s.upsert(&record("a", 2_000, 20_000), &c),
        Upserted::Scheduled
    );
    assert_eq!(s.due_at("a"), Some(19_900));
}

#[test]
fn a_lead_not_shorter_than_the_lifetime_renews_at_half_of_it() {
    // Before this, every node was asked 15 s after every provisioning.
    let c = cfg(Before::Duration(Duration::from_secs(30 * 86_400)), 0);
    let mut s = Schedule::default();
    assert_eq!(s.upsert(&record("a", 0, 3_600), &c), Upserted::Shortened);
    assert_eq!(s.due_at("a"), Some(1_800));
}

#[test]
fn a_node_that_could_not_come_back_is_stranded_until_a_newer_record() {
    let retry = Duration::from_secs(600);
    assert!(can_return(None, 1_000, retry), "no provisioning JWT expiry");
    assert!(can_return(Some(1_601), 1_000, retry));
    assert!(
        !can_return(Some(1_600), 1_000, retry),
        "expires within the retry window"
    );
    assert!(!can_return(Some(900), 1_000, retry), "expired");
    let c = cfg(Before::Duration(Duration::from_secs(100)), 0);
    let mut s = Schedule::default();
    let mut r = record("a", 0, 1_000);
    r.provisioning_jwt_expires_unix = Some(950);
    s.upsert(&r, &c);
    assert_eq!(s.due(900, 10)[0].returns_until, Some(950));
    s.strand("a");
    assert_eq!((s.due_count(10_000), s.stranded(), s.len()), (0, 1, 0));
    s.upsert(&record("a", 2_000, 9_000), &c);
    assert_eq!((s.stranded(), s.len()), (0, 1));
}

#[test]
fn members_share_the_fleets_rate() {
    assert_eq!(share_of_rate(600, 1), 600);
    assert_eq!(share_of_rate(600, 3), 200);
    assert_eq!(share_of_rate(2, 5), 1, "at least one a minute");
    assert_eq!(share_of_rate(600, 0), 600);
    let t0 = std::time::Instant::now();
    let mut l = RateLimit::per_minute(600, t0);
    l.set_per_minute(share_of_rate(600, 3), t0);
    let mut total = 0;
    // As the loop sends: every 100 ms.
    for tick in 0..600 {
        let n = l.available(t0 + Duration::from_millis(tick * 100));
        l.take(n);
        total += n;
    }
    assert!(
        (195..=205).contains(&total),
        "{total} a minute for a third of 600"
    );
}

#[test]
fn the_same_record_again_changes_nothing_not_even_a_retry_wait() {
    // Written again by anyone who may write the bucket, it used to reset
    // the wait after a request, and the node was asked again at once.
    let c = cfg(Before::Duration(Duration::from_secs(100)), 0);
    let mut s = Schedule::default();
    let r = record("a", 1_000, 10_000);
    assert_eq!(s.upsert(&r, &c), Upserted::Scheduled);
    s.asked("a", 9_900, Duration::from_secs(600));
    assert_eq!(s.upsert(&r, &c), Upserted::Same);
    assert_eq!(s.due_at("a"), Some(10_500), "still waiting for its retry");
    let mut other = r.clone();
    other.config_sha256 = "changed".into();
    assert_eq!(
        s.upsert(&other, &c),
        Upserted::Scheduled,
        "same time, another record"
    );
}

#[test]
fn a_node_is_asked_while_its_provisioning_jwt_still_lets_it_come_back() {
    let c = cfg(Before::Duration(Duration::from_secs(100)), 0);
    let mut s = Schedule::default();
    let mut r = record("a", 0, 100_000);
    r.provisioning_jwt_expires_unix = Some(50_000);
    s.upsert(&r, &c);
    // Due 600 s (retry) and a minute before the JWT expires, not at 99,900.
    assert_eq!(s.due_at("a"), Some(50_000 - 600 - 60));
    assert!(can_return(
        r.provisioning_jwt_expires_unix,
        50_000 - 660,
        c.retry
    ));
}

/// A renewal client configuration in `dir`: the broker, and the file
/// provider's certificate, key and CA when `x509`.
fn renewal_client_config(dir: &std::path::Path, x509: bool) -> RenewalConfig {
    use choria_wire::security::ca::CertificateAuthority;
    use choria_wire::security::csr::{generate_rsa_key, make_csr, CsrSubject};
    use rsa::pkcs1::{EncodeRsaPrivateKey, LineEnding};
    let mut text =
        "identity = admin.mcollective\nplugin.choria.middleware_hosts = nats://127.0.0.1:4222\n\
                    plugin.security.provider = file\n"
            .to_string();
    if x509 {
        let ca = CertificateAuthority::generate_p256("Renewal CA").unwrap();
        let key = generate_rsa_key(2048).unwrap();
        let csr = make_csr(&key, &CsrSubject::new("admin.mcollective")).unwrap();
        let cert = ca.sign_csr(&csr, Duration::from_secs(3600)).unwrap();
        let key_pem = key.to_pkcs1_pem(LineEnding::LF).unwrap();
        for (name, body) in [
            ("cert.pem", cert.as_str()),
            ("key.pem", key_pem.as_str()),
            ("ca.pem", &ca.cert_pem()),
        ] {
            std::fs::write(dir.join(name), body).unwrap();
        }
        text.push_str(&format!(
            "plugin.security.file.certificate = {0}/cert.pem\nplugin.security.file.key = {0}/key.pem\n\
             plugin.security.file.ca = {0}/ca.pem\n",
            dir.display()
        ));
    }
    let path = dir.join("renewal.cfg");
    std::fs::write(&path, text).unwrap();
    RenewalConfig {
        choria_config: path,
        ..cfg(Before::Share(0.5), 0)
    }
}

/// `choria_insecure` leaves the provisioning network unsigned; the
/// provisioned nodes check their callers, so renewal signs with the x509
/// credentials its own configuration names (real go-choria refuses an
/// unsigned `reprovision` as "invalid pem data": tests/it/builtin_ca.rs).
#[test]
fn renewal_signs_with_its_own_certificate_even_when_provisioning_is_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let env = choria_config::Environment::default();
    let signed = setup(&renewal_client_config(dir.path(), true), true, &env).unwrap();
    assert!(
        matches!(
            signed.identity.signer,
            choria_wire::protocol::RequestSigner::V1Rsa { .. }
        ),
        "{:?}",
        signed.identity.signer
    );
    let bare = tempfile::tempdir().unwrap();
    let unsigned = setup(&renewal_client_config(bare.path(), false), true, &env).unwrap();
    assert!(matches!(
        unsigned.identity.signer,
        choria_wire::protocol::RequestSigner::V1Insecure
    ));
}
