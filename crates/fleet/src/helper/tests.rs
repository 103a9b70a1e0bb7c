use super::*;
use crate::ca::{certificate_common_name, verify_issued_by};
use choria_core::provision::signing::helper::HelperResponse;
use choria_wire::security::csr::{make_csr, CsrSubject};
use serde_json::{json, Value};
use std::sync::OnceLock;

// What the command line turns into these options (and refuses) is tested
// with it, in the binary's `cmd::fleet_helper`.

/// The options of a helper told only `--fail mode`.
fn failing(mode: FailMode) -> FleetHelperOptions {
    FleetHelperOptions {
        fail: Some(mode),
        ..Default::default()
    }
}

/// The options of a helper told only `--ca-cert cert --ca-key key`.
fn with_ca(cert: &Path, key: &Path) -> FleetHelperOptions {
    FleetHelperOptions {
        ca_cert: Some(cert.to_path_buf()),
        ca_key: Some(key.to_path_buf()),
        ..Default::default()
    }
}

/// The options of a helper told only `--defer-once-dir dir`.
fn deferring_once(dir: &Path) -> FleetHelperOptions {
    FleetHelperOptions {
        defer_once_dir: Some(dir.to_path_buf()),
        ..Default::default()
    }
}

fn regex(pattern: &str) -> Option<Regex> {
    Some(Regex::new(pattern).unwrap())
}

fn node_key() -> &'static rsa::RsaPrivateKey {
    choria_wire::testing::test_key()
}

fn csr_for(cn: &str) -> String {
    make_csr(node_key(), &CsrSubject::new(cn)).unwrap()
}

/// Input shaped like the provisioner's, with every optional part set.
fn full_input(identity: &str, csr: Option<&str>) -> Vec<u8> {
    json!({
        "identity": identity,
        "csr": csr.map(|c| json!({"csr": c, "public_key": "-----BEGIN PUBLIC KEY-----\n...", "ssldir": "/etc/choria/ssl"})),
        "ed25519_pubkey": {"public_key": "ab", "directory": "/etc/choria", "signature": "cd"},
        "inventory": "{\"agents\":[\"rpcutil\"]}",
        "jwt": {"chu": "nats://p:4222", "purl": ""},
    })
    .to_string()
    .into_bytes()
}

fn answer(opts: &FleetHelperOptions, input: &[u8]) -> Value {
    let out = run(opts, input).unwrap();
    assert_eq!(out.last(), Some(&b'\n'));
    serde_json::from_slice(&out).unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort_unstable();
    k
}

/// A CA written to `dir`, as the files `--ca-cert`/`--ca-key` name.
fn ca_files(dir: &Path) -> (PathBuf, PathBuf, String) {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    let ca = CA.get_or_init(|| {
        let key = csr::generate_rsa_key(1024).unwrap();
        CertificateAuthority::from_key("Fleet Test CA", key).unwrap()
    });
    let cert = dir.join("ca.pem");
    let key = dir.join("ca.key");
    std::fs::write(&cert, ca.cert_pem()).unwrap();
    std::fs::write(&key, ca.key_pem()).unwrap();
    (cert, key, ca.cert_pem())
}

#[test]
fn default_configuration_only() {
    let v = answer(
        &FleetHelperOptions::default(),
        &full_input("node-000.example.net", None),
    );
    assert_eq!(
        v,
        json!({"configuration": {
            "identity": "node-000.example.net",
            "loglevel": "info",
            "plugin.choria.middleware_hosts": DEFAULT_BROKER,
            "plugin.choria.server.provision": "false",
        }})
    );
}

#[test]
fn input_without_csr_or_with_null_fields() {
    let a = FleetHelperOptions::default();
    for input in [
        json!({"identity": "n1"}),
        json!({"identity": "n1", "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null}),
        json!({"identity": "n1", "csr": {"csr": "", "public_key": "", "ssldir": ""}}),
        json!({"identity": "n1", "csr": {"csr": null, "ssldir": null}, "future_field": [1]}),
    ] {
        let v = answer(&a, input.to_string().as_bytes());
        assert_eq!(keys(&v), ["configuration"], "{input}");
        assert_eq!(v["configuration"]["identity"], "n1");
    }
}

#[test]
fn invalid_input_is_an_error_naming_the_problem() {
    let a = FleetHelperOptions::default();
    for (input, expect) in [
        (
            &b"<html>"[..],
            "invalid input JSON: expected value at line 1 column 1",
        ),
        (b"{}", "missing field `identity`"),
        (br#"{"identity": 7}"#, "invalid type: integer `7`"),
        (
            br#"{"identity": "n1", "csr": "pem"}"#,
            "invalid type: string",
        ),
        (br#"{"identity": ""}"#, "invalid identity \"\": it is empty"),
    ] {
        let err = run(&a, input).unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
        let (code, out, stderr) = serve_capture(&a, input);
        assert_eq!(code, EXIT_ERROR);
        assert!(out.is_empty());
        assert!(stderr.contains(expect), "{stderr}");
    }
}

#[test]
fn broker_and_settings() {
    let setting = |k: &str, v: &str| (k.to_string(), v.to_string());
    let a = FleetHelperOptions {
        broker: "nats://b1:4222,nats://b2:4222".into(),
        settings: vec![
            setting("plugin.choria.srv_domain", "example.net"),
            setting("loglevel", "debug"),
            setting("with.equals", "a=b"),
        ],
        ..Default::default()
    };
    let v = answer(&a, &full_input("n1", None));
    let c = &v["configuration"];
    assert_eq!(
        c["plugin.choria.middleware_hosts"],
        "nats://b1:4222,nats://b2:4222"
    );
    assert_eq!(c["plugin.choria.srv_domain"], "example.net");
    assert_eq!(c["loglevel"], "debug");
    assert_eq!(c["with.equals"], "a=b");
    assert_eq!(c["plugin.choria.server.provision"], "false");
}

#[test]
fn upgrade_and_server_claims() {
    let a = FleetHelperOptions {
        upgrade: Some("0.31.0".into()),
        collectives: vec!["mcollective".into(), "prod".into()],
        org: Some("acme".into()),
        ..Default::default()
    };
    let out = run(&a, &full_input("n1", None)).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["upgrade"], "0.31.0");
    assert_eq!(
        v["server_claims"],
        json!({"collectives": ["mcollective", "prod"], "ou": "acme"})
    );
    // the provisioner reads it back as intended
    let r = HelperResponse::from_json(&out).unwrap();
    assert_eq!(r.upgrade, "0.31.0");
    let claims = r.server_claims.unwrap();
    assert_eq!(claims.collectives, ["mcollective", "prod"]);
    assert_eq!(claims.organization_unit, "acme");

    let only_org = FleetHelperOptions {
        org: Some("acme".into()),
        ..Default::default()
    };
    let only_org = answer(&only_org, &full_input("n1", None));
    assert_eq!(only_org["server_claims"], json!({"ou": "acme"}));
}

#[test]
fn key_file_is_shipped() {
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("node.key");
    let key_pem = csr::private_key_pkcs1_pem(node_key()).unwrap();
    std::fs::write(&key_path, &key_pem).unwrap();
    let shipping = |key_file: &Path| FleetHelperOptions {
        key_file: Some(key_file.to_path_buf()),
        ..Default::default()
    };
    let v = answer(&shipping(&key_path), &full_input("n1", None));
    assert_eq!(v["key"], key_pem.as_str());

    let missing = dir.path().join("missing.key");
    let err = run(&shipping(&missing), &full_input("n1", None))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("could not read --key-file {}", missing.display())),
        "{err}"
    );
}

#[test]
fn ca_signs_the_node_csr() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca_pem) = ca_files(dir.path());
    let a = with_ca(&cert, &key);
    let identity = "node-001.example.net";
    let out = run(&a, &full_input(identity, Some(&csr_for(identity)))).unwrap();
    let r = HelperResponse::from_json(&out).unwrap();
    verify_issued_by(&r.certificate, &ca_pem).unwrap();
    assert_eq!(certificate_common_name(&r.certificate).unwrap(), identity);
    assert_eq!(r.ca, ca_pem);
    assert_eq!(r.ssldir, "/etc/choria/ssl");
    assert_eq!(r.configuration["identity"], identity);
    assert!(r.key.is_empty());

    // loaded once: later runs use the cached CA even if the files go away
    std::fs::remove_file(&key).unwrap();
    let again = run(&a, &full_input("n2", Some(&csr_for("n2")))).unwrap();
    let r = HelperResponse::from_json(&again).unwrap();
    assert_eq!(certificate_common_name(&r.certificate).unwrap(), "n2");

    // no CSR, nothing to sign
    let v = answer(&a, &full_input("n3", None));
    assert_eq!(keys(&v), ["configuration"]);
}

#[test]
fn ca_refuses_bad_csrs() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca_files(dir.path());
    let a = with_ca(&cert, &key);
    let err = run(&a, &full_input("n1", Some(&csr_for("other.example.net"))))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "CSR common name \"other.example.net\" does not match identity \"n1\""
    );
    let err = run(&a, &full_input("n1", Some("garbage")))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("could not sign the CSR of n1: "), "{err}");
}

#[test]
fn unusable_ca_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _, _) = ca_files(dir.path());
    let input = full_input("n1", Some(&csr_for("n1")));
    let wrong_key = dir.path().join("wrong.key");
    std::fs::write(&wrong_key, csr::private_key_pkcs1_pem(node_key()).unwrap()).unwrap();
    let err = run(&with_ca(&cert, &wrong_key), &input).unwrap_err();
    assert!(
        matches!(
            err,
            FleetHelperError::Ca {
                source: PkiError::KeyMismatch,
                ..
            }
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("PRIVATE KEY"), "{err}");
    let missing = dir.path().join("nope.pem");
    let err = run(&with_ca(&missing, &wrong_key), &input).unwrap_err();
    assert!(matches!(
        err,
        FleetHelperError::Read {
            what: "--ca-cert",
            ..
        }
    ));
}

#[test]
fn defer_once_then_provision() {
    let dir = tempfile::tempdir().unwrap();
    let a = deferring_once(dir.path());
    let first = answer(&a, &full_input("n1", None));
    assert_eq!(first, json!({"defer": true, "msg": DEFER_MSG}));
    assert!(dir.path().join("n1").exists());
    let second = answer(&a, &full_input("n1", None));
    assert_eq!(keys(&second), ["configuration"]);
    // other identities are deferred on their own first run
    assert_eq!(answer(&a, &full_input("n2", None))["defer"], true);

    let r = HelperResponse::from_json(&run(&a, &full_input("n3", None)).unwrap()).unwrap();
    assert!(r.defer && !r.shutdown && r.msg == DEFER_MSG);
}

#[test]
fn defer_once_is_safe_for_concurrent_runs() {
    let dir = tempfile::tempdir().unwrap();
    let a = deferring_once(dir.path());
    let input = full_input("n1", None);
    let deferred = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| answer(&a, &input)["defer"] == true))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|d| *d)
            .count()
    });
    assert_eq!(deferred, 1);
}

#[test]
fn defer_once_refuses_identities_that_are_not_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let a = deferring_once(dir.path());
    for bad in ["../escape", "..", "a/b", "a\\b"] {
        let err = run(&a, &full_input(bad, None)).unwrap_err();
        assert!(matches!(err, FleetHelperError::Identity { .. }), "{err}");
    }
    assert!(!dir.path().parent().unwrap().join("escape").exists());
    let err = run(
        &deferring_once(&dir.path().join("missing")),
        &full_input("n1", None),
    )
    .unwrap_err();
    assert!(matches!(err, FleetHelperError::DeferMarker { .. }), "{err}");
}

#[test]
fn shutdown_match() {
    let dir = tempfile::tempdir().unwrap();
    let a = FleetHelperOptions {
        shutdown_match: regex(r"^bad-\d+\."),
        ..deferring_once(dir.path())
    };
    let v = answer(&a, &full_input("bad-1.example.net", None));
    assert_eq!(v, json!({"shutdown": true, "msg": SHUTDOWN_MSG}));
    // shutdown wins over deferring
    assert!(!dir.path().join("bad-1.example.net").exists());
    let v = answer(&a, &full_input("notbad-1.example.net", None));
    assert_eq!(v["defer"], true);
}

fn serve_capture(opts: &FleetHelperOptions, input: &[u8]) -> (u8, Vec<u8>, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = serve(opts, input, &mut out, &mut err, || {
        panic!("hang was not asked for")
    });
    (code, out, String::from_utf8(err).unwrap())
}

#[test]
fn failure_modes() {
    let input = full_input("n1", None);
    let (code, out, err) = serve_capture(&failing(FailMode::Crash), &input);
    assert_eq!((code, out.as_slice()), (EXIT_CRASH, &b""[..]));
    assert!(err.contains("simulated crash for n1"), "{err}");

    let (code, out, _) = serve_capture(&failing(FailMode::Garbage), &input);
    assert_eq!((code, out.as_slice()), (0, &b"this is not json\n"[..]));

    let (code, out, err) = serve_capture(&failing(FailMode::Empty), &input);
    assert_eq!((code, out.len(), err.len()), (0, 0, 0));

    let (code, out, _) = serve_capture(&failing(FailMode::Exit1), &input);
    assert_eq!(code, 1);
    assert_eq!(
        HelperResponse::from_json(&out).unwrap().configuration["identity"],
        "n1"
    );

    let mut hung = false;
    let mut out = Vec::new();
    let code = serve(
        &failing(FailMode::Hang),
        &input,
        &mut out,
        &mut Vec::new(),
        || hung = true,
    );
    assert!(hung);
    assert_eq!(code, 0);
    assert!(HelperResponse::from_json(&out).is_ok());
}

#[test]
fn fail_match_selects_nodes() {
    let a = FleetHelperOptions {
        fail_match: regex("^n1$"),
        ..failing(FailMode::Crash)
    };
    assert_eq!(a.failure_for("n1"), Some(FailMode::Crash));
    assert_eq!(a.failure_for("n10"), None);
    assert_eq!(
        failing(FailMode::Empty).failure_for("x"),
        Some(FailMode::Empty)
    );
    assert_eq!(FleetHelperOptions::default().failure_for("x"), None);

    let (code, out, _) = serve_capture(&a, &full_input("n10", None));
    assert_eq!(code, 0);
    assert!(HelperResponse::from_json(&out).is_ok());
    assert_eq!(serve_capture(&a, &full_input("n1", None)).0, EXIT_CRASH);
}
