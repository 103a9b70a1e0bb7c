use super::*;
use crate::ElectionBackend;
use choria_wire::security::tokens::{ClientIdClaims, TokenSigningKey, TokenVerifyKey};
use std::io::Write;

const FILE: &str = "provisioner.yaml";

fn parse(yaml: &str) -> Result<ProvisionerConfig, ConfigError> {
    ProvisionerConfig::parse(yaml, FILE)
}

fn ok(yaml: &str) -> ProvisionerConfig {
    parse(yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn err(yaml: &str) -> String {
    match parse(yaml) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn warnings(c: &ProvisionerConfig) -> Vec<String> {
    c.warnings.iter().map(|w| w.to_string()).collect()
}

/// `helper:` plus whatever the test needs.
fn with_helper(rest: &str) -> String {
    format!("helper: /usr/bin/helper\ntoken: t\n{rest}")
}

/// The example from the Go provisioner's documentation
/// (docs/content/configuration/provisioner/_index.md), unchanged.
const GO_DOCS_EXAMPLE: &str = "workers: 4
interval: 1m
logfile: /dev/stdout
loglevel: warn
helper: /etc/choria-provisioner/provisioner/helper.rb
token: s3cret
site: testing
broker_provisioning_password: s3cret
jwt_verify_cert: e72cba5268b34627b75c5ceae9449ad16d62f15f862c30d4e0e7d2588e2e6259
jwt_signing_key: /etc/choria-provisioner/credentials/signer.seed
jwt_signing_token: /etc/choria-provisioner/credentials/signer.jwt

features:
  jwt: true
  ed25519: true
";

#[test]
fn go_documentation_example() {
    let c = ok(GO_DOCS_EXAMPLE);
    assert_eq!(c.workers, 4);
    assert_eq!(c.interval, Duration::from_secs(60));
    assert_eq!(c.interval_text, "1m");
    assert_eq!(c.logfile.as_deref(), Some("/dev/stdout"));
    assert_eq!(c.log_target(), LogTarget::File("/dev/stdout".into()));
    assert_eq!(c.log_level(), LogLevel::Warn);
    assert_eq!(c.helper, "/etc/choria-provisioner/provisioner/helper.rb");
    assert_eq!(c.token.expose(), "s3cret");
    assert_eq!(c.site, "testing");
    assert_eq!(
        c.broker_provisioning_password.as_ref().map(Secret::expose),
        Some("s3cret")
    );
    assert_eq!(
        c.jwt_verify_cert.as_deref(),
        Some("e72cba5268b34627b75c5ceae9449ad16d62f15f862c30d4e0e7d2588e2e6259")
    );
    assert_eq!(
        c.jwt_signing_key,
        Some(crate::ca::KeyRef::File(
            "/etc/choria-provisioner/credentials/signer.seed".into()
        ))
    );
    assert_eq!(
        c.jwt_signing_token.as_deref(),
        Some(Path::new("/etc/choria-provisioner/credentials/signer.jwt"))
    );
    assert_eq!(
        c.features,
        Features {
            pki: false,
            jwt: true,
            ed25519: true,
            upgrades: false
        }
    );
    assert_eq!(c.lifecycle_component, "provision_mode_server");
    assert_eq!(c.server_jwt_validity, DEFAULT_SERVER_JWT_VALIDITY);
    assert_eq!(c.election.backend, ElectionBackend::None);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

/// The insecure test configuration of the protocol notes (§12.5).
#[test]
fn insecure_test_example() {
    let c = ok("workers: 2
interval: 1m          # minimum allowed
logfile: /dev/stdout
loglevel: debug
helper: /abs/test/helper.sh
token: s3cret
site: test
choria_insecure: true
jwt_verify_cert: /abs/test/prov-signer-public.pem   # or hex ed25519 issuer public key
leader_election: false
features:
  jwt: true
");
    assert!(c.choria_insecure);
    assert_eq!(c.workers, 2);
    assert_eq!(c.log_level(), LogLevel::Debug);
    assert!(c.features.jwt && !c.features.ed25519);
    assert_eq!(
        c.jwt_verify_cert.as_deref(),
        Some("/abs/test/prov-signer-public.pem")
    );
    assert!(!c.election.enabled());
}

#[test]
fn defaults() {
    let c = ok("helper: /usr/bin/helper\n");
    assert_eq!(c.workers, default_workers());
    assert!(c.workers >= 1);
    assert_eq!(c.interval, Duration::from_secs(60));
    assert_eq!(c.interval_text, "1m");
    assert_eq!(c.lifecycle_component, "provision_mode_server");
    assert_eq!(
        c.cert_deny_list,
        [
            r"\.privileged.mcollective$",
            r"\.privileged.choria$",
            r"\.mcollective$",
            r"\.choria$"
        ]
    );
    assert_eq!(c.server_jwt_validity, Duration::from_secs(365 * 86_400));
    assert_eq!(c.server_jwt_validity_text(), "1y");
    assert_eq!(c.features, Features::default());
    assert!(!c.choria_insecure && !c.leader_election && !c.upgrades_optional);
    assert_eq!(c.monitor_port, None);
    assert_eq!(c.broker_port, None);
    assert_eq!(c.broker_provisioning_password, None);
    assert_eq!(c.site, "");
    assert_eq!(c.election.backend, ElectionBackend::None);
    // Go: an unset loglevel is not one go-choria knows, so it logs at warn.
    assert_eq!(c.log_level(), LogLevel::Warn);
    assert_eq!(c.log_target(), LogTarget::Stdout);
    assert_eq!(c.cert_deny_regexes().unwrap().len(), 4);
    assert_eq!(
        warnings(&c),
        ["provisioner.yaml: token: not set; requests carry an empty token, which only servers whose provisioning.jwt has no token accept"]
    );
}

#[test]
fn interval_rules() {
    assert_eq!(
        err(&with_helper("interval: 30s\n")),
        "provisioner.yaml: interval: 30s is below the minimum of 1m; use for example 10m or 1h"
    );
    assert!(err(&with_helper("interval: 59s\n")).contains("below the minimum of 1m"));
    assert!(err(&with_helper("interval: ''\n")).contains("interval: is empty"));
    assert!(err(&with_helper("interval: 60\n"))
        .contains("interval: expected a duration such as 30s, 10m, 1h or 1d, found the number 60"));
    assert!(err(&with_helper("interval: '10'\n")).contains("interval: \"10\" has no unit"));
    assert!(
        err(&with_helper("interval: 1H\n")).contains("interval: \"1H\" is not a valid duration")
    );
    for (text, secs) in [
        ("1m", 60),
        ("60s", 60),
        ("10m", 600),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("1d", 86_400),
        ("2w", 14 * 86_400),
        ("1M", 30 * 86_400),
        ("1y", 365 * 86_400),
    ] {
        let c = ok(&with_helper(&format!("interval: {text}\n")));
        assert_eq!(c.interval, Duration::from_secs(secs), "{text}");
        assert_eq!(c.interval_text, text);
    }
    // null keeps the default, as in Go.
    assert_eq!(ok(&with_helper("interval: ~\n")).interval, DEFAULT_INTERVAL);
}

#[test]
fn server_jwt_validity_rules() {
    let v = |y: &str| ok(&with_helper(y)).server_jwt_validity;
    assert_eq!(v("server_jwt_validity: ''\n"), DEFAULT_SERVER_JWT_VALIDITY);
    assert_eq!(
        v("server_jwt_validity: 90d\n"),
        Duration::from_secs(90 * 86_400)
    );
    assert_eq!(
        v("server_jwt_validity: 2y\n"),
        Duration::from_secs(730 * 86_400)
    );
    assert_eq!(
        v("server_jwt_validity: 36h\n"),
        Duration::from_secs(36 * 3600)
    );
    assert!(err(&with_helper("server_jwt_validity: 0s\n"))
        .starts_with("provisioner.yaml: server_jwt_validity: \"0s\" is zero"));
    assert!(err(&with_helper("server_jwt_validity: forever\n"))
        .starts_with("provisioner.yaml: server_jwt_validity: \"forever\""));
}

#[test]
fn lifecycle_component_rules() {
    for bad in ["a.b", "a*", "a>", "with space"] {
        let e = err(&with_helper(&format!("lifecycle_component: '{bad}'\n")));
        assert!(
            e.starts_with(&format!(
                "provisioner.yaml: lifecycle_component: {bad:?} is not valid"
            )),
            "{e}"
        );
    }
    assert_eq!(
        ok(&with_helper("lifecycle_component: ''\n")).lifecycle_component,
        "provision_mode_server"
    );
    assert_eq!(
        ok(&with_helper("lifecycle_component: custom_mode\n")).lifecycle_component,
        "custom_mode"
    );
}

#[test]
fn feature_rules() {
    assert_eq!(
        err(&with_helper(
            "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  pki: true\n  ed25519: true\n"
        )),
        "provisioner.yaml: features: pki and ed25519 cannot both be enabled; enable only one"
    );
    let c = ok(&with_helper(
        "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  ed25519: true\n",
    ));
    assert!(c.features.jwt && c.features.ed25519);
    assert!(c.warnings.is_empty());
    let c = ok(&with_helper(
        "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  ed25519: true\n  jwt: false\n",
    ));
    assert!(c.features.jwt);
    assert_eq!(
        warnings(&c),
        ["provisioner.yaml: features.jwt: forced on because ed25519 is enabled"]
    );
    let c = ok(&with_helper("features:\n  pki: true\n  upgrades: true\n"));
    assert!(c.features.pki && c.features.upgrades && !c.features.jwt);
    assert!(warnings(&c)[0]
        .starts_with("provisioner.yaml: upgrades_repository: not set while features.upgrades"));
    let c = ok(&with_helper(
        "features:\n  upgrades: true\nupgrades_optional: true\n",
    ));
    assert!(c.warnings.is_empty());
    let c = ok(&with_helper(
        "features:\n  upgrades: true\nupgrades_repository: https://repo.example.net\n",
    ));
    assert_eq!(
        c.upgrades_repository.as_deref(),
        Some("https://repo.example.net")
    );
    assert!(c.warnings.is_empty());
    assert!(err(&with_helper("features: [jwt]\n"))
        .contains("provisioner.yaml: features: expected a mapping of settings, found a list"));
    assert!(err(&with_helper("features:\n  jwt: maybe\n"))
        .contains("provisioner.yaml: features.jwt: expected true or false, found \"maybe\""));
    let c = ok(&with_helper("features:\n  pkix: true\n"));
    assert_eq!(
        warnings(&c),
        ["provisioner.yaml: features.pkix: unknown setting, ignored; did you mean features.pki?"]
    );
}

#[test]
fn settings_required_by_features() {
    assert_eq!(
        err(&with_helper("features:\n  jwt: true\n")),
        "provisioner.yaml: jwt_verify_cert: required when features.jwt is enabled: the file or hex ed25519 public key that verifies the nodes' provisioning.jwt"
    );
    assert!(err(&with_helper(
        "jwt_verify_cert: x\nfeatures:\n  ed25519: true\n"
    ))
    .starts_with("provisioner.yaml: jwt_signing_key: required when features.ed25519"));
    assert!(err(&with_helper(
        "jwt_signing_key: k\nfeatures:\n  ed25519: true\n"
    ))
    .starts_with("provisioner.yaml: jwt_verify_cert: required when features.ed25519"));
}

#[test]
fn helper_rules() {
    assert_eq!(
        err("token: t\n"),
        "provisioner.yaml: helper: required: the command that decides each node's configuration (or a configuration_template)"
    );
    assert!(err("helper: '   '\n").contains("helper: required"));
    assert!(err("helper: \"ruby '/x\"\n")
        .contains("helper: \"ruby '/x\": cannot split the command line: missing closing quote"));
    let c = ok("helper: ruby '/opt/my helper.rb' --site test\n");
    assert_eq!(
        c.helper_command().unwrap(),
        ["ruby", "/opt/my helper.rb", "--site", "test"]
    );
}

#[test]
fn workers_and_ports() {
    assert_eq!(ok(&with_helper("workers: 0\n")).workers, default_workers());
    assert_eq!(ok(&with_helper("workers: 16\n")).workers, 16);
    assert_eq!(ok(&with_helper("workers: 2.0\n")).workers, 2);
    assert!(
        err(&with_helper("workers: -1\n")).starts_with("provisioner.yaml: workers: -1 is negative")
    );
    assert!(err(&with_helper("workers: '4'\n"))
        .contains("workers: expected a whole number, found a string \"4\""));
    assert!(err(&with_helper("workers: 2.5\n")).contains("workers: expected a whole number"));
    assert_eq!(
        ok(&with_helper("monitor_port: 8080\n")).monitor_port,
        Some(8080)
    );
    assert_eq!(ok(&with_helper("monitor_port: 0\n")).monitor_port, None);
    let c = ok(&with_helper("monitor_port: -1\n"));
    assert_eq!(c.monitor_port, None);
    assert!(warnings(&c)[0].contains("monitor_port: -1 is negative"));
    assert!(err(&with_helper("monitor_port: 70000\n"))
        .contains("provisioner.yaml: monitor_port: 70000 is not a port"));
}

#[test]
fn unused_keys_are_accepted_with_a_warning() {
    let c = ok(&with_helper("broker_port: 4222\n"));
    assert_eq!(c.broker_port, Some(4222));
    assert_eq!(
        warnings(&c),
        ["provisioner.yaml: broker_port: accepted for compatibility but not used (the Go provisioner ignores it too)"]
    );
}

#[test]
fn rego_policy_and_admission_name_the_admission_policy() {
    let c = ok(&with_helper("rego_policy: /etc/x.rego\n"));
    let a = c
        .admission
        .clone()
        .expect("rego_policy sets the admission policy");
    assert_eq!(a.policy, PathBuf::from("/etc/x.rego"));
    assert!(!a.rego_v0);
    assert!(warnings(&c).is_empty(), "{:?}", warnings(&c));
    let c = ok(&with_helper(
        "admission:\n  policy: /p.rego\n  rego_v0: true\n",
    ));
    assert_eq!(
        c.admission,
        Some(crate::admission::AdmissionConfig {
            policy: "/p.rego".into(),
            rego_v0: true
        })
    );
    let same = ok(&with_helper(
        "rego_policy: /p.rego\nadmission: {policy: /p.rego}\n",
    ));
    assert_eq!(same.admission.unwrap().policy, PathBuf::from("/p.rego"));
    let e = err(&with_helper(
        "rego_policy: /a.rego\nadmission: {policy: /b.rego}\n",
    ));
    assert!(
        e.contains("admission.policy") && e.contains("set one of the two"),
        "{e}"
    );
    let e = err(&with_helper("admission: {rego_v0: true}\n"));
    assert!(e.contains("admission.policy: required"), "{e}");
    assert_eq!(ok(&with_helper("")).admission, None);
}

#[test]
fn unknown_keys_warn_with_suggestions() {
    let c = ok(&with_helper("worker: 3\nintreval: 5m\nsomething: else\n"));
    assert_eq!(c.workers, default_workers());
    assert_eq!(c.interval, DEFAULT_INTERVAL);
    assert_eq!(
        warnings(&c),
        [
            "provisioner.yaml: worker: unknown setting, ignored; did you mean workers?",
            "provisioner.yaml: intreval: unknown setting, ignored; did you mean interval?",
            "provisioner.yaml: something: unknown setting, ignored",
        ]
    );
}

#[test]
fn go_json_key_matching() {
    // encoding/json matches field names case-insensitively.
    let c = ok("Helper: /usr/bin/helper\nTOKEN: t\nWorkers: 3\nFeatures:\n  PKI: true\n");
    assert_eq!(c.workers, 3);
    assert!(c.features.pki);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // The last duplicate wins.
    let c = ok(&with_helper("workers: 3\nworkers: 5\n"));
    assert_eq!(c.workers, 5);
    assert_eq!(
        warnings(&c),
        ["provisioner.yaml: workers: set more than once (also as workers); the last value is used"]
    );
    // Errors name the key as written.
    assert!(
        err("Helper: /usr/bin/helper\nWorkers: -2\n").starts_with("provisioner.yaml: Workers: -2")
    );
}

#[test]
fn yaml_1_1_booleans_and_nulls() {
    let c = ok(&with_helper(
        "choria_insecure: yes\nleader_election: on\nupgrades_optional: Y\nfeatures:\n  pki: TRUE\n",
    ));
    assert!(c.choria_insecure && c.leader_election && c.upgrades_optional && c.features.pki);
    let c = ok(&with_helper("choria_insecure: no\nleader_election: off\n"));
    assert!(!c.choria_insecure && !c.leader_election);
    let c = ok(&with_helper(
        "lifecycle_component:\ncert_deny_list: ~\nfeatures:\nlogfile: ''\n",
    ));
    assert_eq!(c.lifecycle_component, DEFAULT_LIFECYCLE_COMPONENT);
    assert_eq!(c.cert_deny_list.len(), 4);
    assert_eq!(c.logfile, None);
    assert!(err(&with_helper("choria_insecure: 1\n"))
        .contains("choria_insecure: expected true or false, found a number 1"));
}

#[test]
fn strings_must_be_strings() {
    assert_eq!(
        err("helper: /usr/bin/helper\ntoken: 12345\n"),
        "provisioner.yaml: token: expected a string, found a number 12345; put it in quotes if it is meant as text"
    );
    assert_eq!(
        ok("helper: /usr/bin/helper\ntoken: '12345'\n")
            .token
            .expose(),
        "12345"
    );
    assert!(err(&with_helper("site: [a]\n")).contains("site: expected a string, found a list"));
}

#[test]
fn cert_deny_list_rules() {
    let c = ok(&with_helper("cert_deny_list: ['\\.bad$', '/^evil/']\n"));
    assert_eq!(c.cert_deny_list, [r"\.bad$", "/^evil/"]);
    assert_eq!(c.cert_deny_regexes().unwrap().len(), 2);
    assert_eq!(
        ok(&with_helper("cert_deny_list: []\n"))
            .cert_deny_list
            .len(),
        4
    );
    let e = err(&with_helper("cert_deny_list: ['ok', '(']\n"));
    assert!(
        e.starts_with("provisioner.yaml: cert_deny_list[1]: "),
        "{e}"
    );
    assert!(
        err(&with_helper("cert_deny_list: [1]\n")).contains("cert_deny_list[0]: expected a string")
    );
    assert!(err(&with_helper("cert_deny_list: x\n"))
        .contains("cert_deny_list: expected a list of strings"));
}

#[test]
fn logging() {
    let l = |y: &str| ok(&with_helper(y)).log_level();
    assert_eq!(l("loglevel: debug\n"), LogLevel::Debug);
    assert_eq!(l("loglevel: info\n"), LogLevel::Info);
    assert_eq!(l("loglevel: error\n"), LogLevel::Error);
    assert_eq!(l("loglevel: fatal\n"), LogLevel::Fatal);
    assert_eq!(LogLevel::Fatal.as_filter(), "error");
    let c = ok(&with_helper("loglevel: INFO\n"));
    assert_eq!(c.log_level(), LogLevel::Warn);
    assert!(warnings(&c)[0].starts_with("provisioner.yaml: loglevel: \"INFO\" is not one of"));
    let t = |y: &str| ok(&with_helper(y)).log_target();
    assert_eq!(t("logfile: STDOUT\n"), LogTarget::Stdout);
    assert_eq!(t("logfile: stderr\n"), LogTarget::Stderr);
    assert_eq!(t("logfile: discard\n"), LogTarget::Discard);
    assert_eq!(
        t("logfile: /var/log/p.log\n"),
        LogTarget::File("/var/log/p.log".into())
    );
}

#[test]
fn election_from_legacy_flag_and_block() {
    let c = ok(&with_helper("leader_election: true\n"));
    assert_eq!(c.election.backend, ElectionBackend::Streams);
    assert_eq!(c.election.bucket, "CHORIA_LEADER_ELECTION");
    let c = ok(&with_helper(
        "election:\n  backend: lease\n  lease_namespace: choria\n",
    ));
    assert_eq!(c.election.backend, ElectionBackend::Lease);
    assert!(err(&with_helper(
        "leader_election: true\nelection:\n  backend: none\n"
    ))
    .contains("election.backend: none contradicts leader_election: true"));
}

#[test]
fn syntax_errors() {
    let e = err("workers: [1, 2\n");
    assert!(e.starts_with("provisioner.yaml: not valid YAML: "), "{e}");
    assert_eq!(
        err("- a\n- b\n"),
        "provisioner.yaml: expected a mapping of settings (key: value) at the top level, found a list"
    );
    assert!(err("").contains("helper: required"));
    assert!(err("helper: !custom x\n").contains("not valid YAML"));
}

#[test]
fn secrets_stay_out_of_debug() {
    let c = ok(GO_DOCS_EXAMPLE);
    let d = format!("{c:?}");
    assert!(!d.contains("s3cret"), "{d}");
    assert!(d.contains("<redacted>"));
}

// ----- files -----------------------------------------------------------

fn write(dir: &Path, name: &str, data: &[u8], mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(data).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[test]
fn load_reads_the_file_and_checks_the_helper() {
    let dir = tempfile::tempdir().unwrap();
    let helper = write(dir.path(), "helper.sh", b"#!/bin/sh\n", 0o755);
    let cfg = write(
        dir.path(),
        "provisioner.yaml",
        format!("helper: {}\ntoken: t\nworkers: 2\n", helper.display()).as_bytes(),
        0o644,
    );
    let c = ProvisionerConfig::load(&cfg).unwrap();
    assert_eq!(c.workers, 2);
    assert_eq!(c.file, cfg);

    let missing = dir.path().join("nope.yaml");
    let e = ProvisionerConfig::load(&missing).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}: could not read", missing.display())),
        "{e}"
    );

    let cfg = write(
        dir.path(),
        "p2.yaml",
        b"helper: /nonexistent/helper.rb --x\n",
        0o644,
    );
    let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}: helper: /nonexistent/helper.rb: ",
            cfg.display()
        )),
        "{e}"
    );

    let noexec = write(dir.path(), "noexec.sh", b"#!/bin/sh\n", 0o644);
    let cfg = write(
        dir.path(),
        "p3.yaml",
        format!("helper: {}\n", noexec.display()).as_bytes(),
        0o644,
    );
    let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
    assert!(e.ends_with("is not executable"), "{e}");

    // A bare program name is looked up in PATH.
    let cfg = write(dir.path(), "p4.yaml", b"helper: sh -c true\n", 0o644);
    ProvisionerConfig::load(&cfg).unwrap();
    let cfg = write(
        dir.path(),
        "p5.yaml",
        b"helper: no-such-helper-program\n",
        0o644,
    );
    let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
    assert!(
        e.contains("helper: \"no-such-helper-program\" was not found in PATH"),
        "{e}"
    );
}

#[test]
fn jwt_verify_cert_file_or_hex() {
    let dir = tempfile::tempdir().unwrap();
    let pair = choria_wire::security::generate_keypair();
    let hex_pub = pair.public_hex();
    let base = "helper: /bin/sh\nfeatures:\n  jwt: true\n";

    let c = ok(&format!("{base}jwt_verify_cert: {hex_pub}\n"));
    c.check_files().unwrap();
    assert!(matches!(
        c.load_verify_key().unwrap(),
        TokenVerifyKey::Ed25519(_)
    ));

    let f = write(dir.path(), "issuer.pub", hex_pub.as_bytes(), 0o644);
    let c = ok(&format!("{base}jwt_verify_cert: {}\n", f.display()));
    c.check_files().unwrap();

    let c = ok(&format!("{base}jwt_verify_cert: /etc/missing/signer.pem\n"));
    let e = c.check_files().unwrap_err().to_string();
    assert!(
        e.starts_with("provisioner.yaml: jwt_verify_cert: /etc/missing/signer.pem is neither an existing file nor a hex encoded ed25519 public key"),
        "{e}"
    );

    let f = write(dir.path(), "garbage.pem", b"not a key", 0o644);
    let c = ok(&format!("{base}jwt_verify_cert: {}\n", f.display()));
    let e = c.check_files().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "provisioner.yaml: jwt_verify_cert: {}: ",
            f.display()
        )),
        "{e}"
    );
}

/// A chain issuer's client token for `public`, signed by `issuer`: without
/// and with the org issuer's trust chain signature.
fn signer_tokens(
    issuer: &choria_wire::security::ed25519::Ed25519KeyPair,
    public: &str,
) -> (String, String) {
    let now = chrono::Utc::now().timestamp();
    let mut claims = ClientIdClaims::new_at(
        now,
        "provisioner_signer",
        Some(public),
        "issuer",
        Duration::from_secs(3600),
    )
    .unwrap();
    let issuer_key = TokenSigningKey::Ed25519(issuer.signing_key().clone());
    let unchained = issuer_key.sign(&claims).unwrap();
    claims
        .standard
        .add_org_issuer_data(issuer.signing_key())
        .unwrap();
    (unchained, issuer_key.sign(&claims).unwrap())
}

#[test]
fn signing_key_and_chain_token() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = choria_wire::security::generate_keypair();
    let signer = choria_wire::security::generate_keypair();
    let seed = write(
        dir.path(),
        "signer.seed",
        signer.seed_hex().as_bytes(),
        0o600,
    );
    let yaml_with_key = |key: &Path, extra: &str| {
        format!(
            "helper: /bin/sh\njwt_verify_cert: {}\njwt_signing_key: {}\nfeatures:\n  ed25519: true\n{extra}",
            issuer.public_hex(),
            key.display()
        )
    };
    let yaml = |extra: &str| yaml_with_key(&seed, extra);
    let c = ok(&yaml(""));
    c.check_files().unwrap();
    assert!(c.load_signing_key().unwrap().as_ed25519().is_some());
    assert!(c.load_signing_token().unwrap().is_none());

    // A chain issuer token made by the Org Issuer.
    let (unchained, chained) = signer_tokens(&issuer, &signer.public_hex());
    let tok = write(
        dir.path(),
        "signer.jwt",
        format!("{chained}\n").as_bytes(),
        0o600,
    );
    let c = ok(&yaml(&format!("jwt_signing_token: {}\n", tok.display())));
    c.check_files().unwrap();
    let (raw, parsed) = c.load_signing_token().unwrap().unwrap();
    assert_eq!(raw, chained);
    assert_eq!(parsed.caller_id, "provisioner_signer");

    let tok2 = write(dir.path(), "plain.jwt", unchained.as_bytes(), 0o600);
    let c = ok(&yaml(&format!("jwt_signing_token: {}\n", tok2.display())));
    let e = c.check_files().unwrap_err().to_string();
    assert!(
        e.contains("jwt_signing_token: ") && e.contains("has no trust chain signature"),
        "{e}"
    );

    let missing = dir.path().join("missing.seed");
    let c = ok(&yaml_with_key(&missing, ""));
    let e = c.check_files().unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "provisioner.yaml: jwt_signing_key: {}: ",
            missing.display()
        )),
        "{e}"
    );
    let bad = write(dir.path(), "bad.seed", b"zz", 0o600);
    let e = ok(&yaml_with_key(&bad, ""))
        .check_files()
        .unwrap_err()
        .to_string();
    assert!(e.contains("jwt_signing_key: "));
    assert!(
        e.starts_with(&format!(
            "provisioner.yaml: jwt_signing_key: {}: unsupported signing key",
            bad.display()
        )),
        "{e}"
    );
}

/// `jwt_signing_key` as a `pkcs11:` URI: opened in its token, a key that
/// chain-signs; a URI that does not parse or names no usable key is an
/// error about `jwt_signing_key`; the PIN shows nowhere.
#[test]
fn signing_key_in_a_token() {
    use choria_wire::testing::softhsm::{
        softhsm, ED25519_SEED, ED25519_SEED_KEY, RSA_KEY, USER_PIN,
    };
    let issuer = choria_wire::security::generate_keypair();
    let yaml = |key: &str, extra: &str| {
        format!(
            "helper: /bin/sh\njwt_verify_cert: {}\njwt_signing_key: {key}\nfeatures:\n  ed25519: true\n{extra}",
            issuer.public_hex()
        )
    };
    let check = |key: &str| ok(&yaml(key, "")).check_files().unwrap_err().to_string();
    for (key, wanted) in [
        ("PKCS11:object=k?pin-value=s3cret", "no module-path"),
        (
            "pkcs11:object=k?module-path=/no/such/module.so&pin-value=s3cret",
            "cannot load the PKCS#11 module",
        ),
    ] {
        let e = check(key);
        assert!(
            e.starts_with("provisioner.yaml: jwt_signing_key: ") && e.contains(wanted),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
    }
    let Some(hsm) = softhsm() else { return };
    let _shared = hsm.shared();
    let e = check(&hsm.uri(RSA_KEY));
    assert!(
        e.contains("jwt_signing_key: ") && e.contains("unsupported key"),
        "{e}"
    );
    assert!(!e.contains(USER_PIN), "{e}");

    // The chain issuer's token, for the key in the token.
    let seed = ed25519_dalek::SigningKey::from_bytes(&ED25519_SEED);
    let public = hex::encode(seed.verifying_key().as_bytes());
    let (_, chained) = signer_tokens(&issuer, &public);
    let dir = tempfile::tempdir().unwrap();
    let tok = write(dir.path(), "signer.jwt", chained.as_bytes(), 0o600);
    let uri = hsm.uri(ED25519_SEED_KEY);
    let c = ok(&yaml(
        &uri,
        &format!("jwt_signing_token: {}\n", tok.display()),
    ));
    c.check_files().unwrap();
    let key = c.load_signing_key().unwrap();
    assert!(key.in_token() && key.as_ed25519().is_some());
    assert_eq!(
        key.as_ed25519().unwrap().public_key_bytes(),
        seed.verifying_key().to_bytes()
    );
    let shown = format!("{:?} {key:?}", c.effective_settings());
    assert!(
        shown.contains("pin-value=(redacted)") && !shown.contains(USER_PIN),
        "{shown}"
    );
    // Written back as given.
    assert_eq!(c.to_file().jwt_signing_key.as_deref(), Some(uri.as_str()));
}

#[test]
fn secrets_can_come_from_files_but_not_twice() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    let pass = dir.path().join("pass");
    std::fs::write(&token, "t0ken\n").unwrap();
    std::fs::write(&pass, "pa55").unwrap();
    let mut cfg = ok(&format!(
        "helper: /bin/true\ntoken_file: {}\nbroker_provisioning_password_file: {}\n",
        token.display(),
        pass.display()
    ));
    assert!(cfg.token.is_empty(), "parse does not read files");
    cfg.read_secret_files().unwrap();
    assert_eq!(cfg.token.expose(), "t0ken");
    assert_eq!(
        cfg.broker_provisioning_password
            .as_ref()
            .map(|p| p.expose()),
        Some("pa55")
    );
    let both = parse("helper: /bin/true\ntoken: a\ntoken_file: /x\n").unwrap_err();
    assert!(both.to_string().contains("token_file"), "{both}");
    let mut missing = ok("helper: /bin/true\ntoken_file: /nonexistent/token\n");
    let e = missing.read_secret_files().unwrap_err().to_string();
    assert!(
        e.contains("token_file") && e.contains("/nonexistent/token"),
        "{e}"
    );
}

/// The schema, the reader and `to_file` agree: the settings written out
/// from a parsed file parse back to the same settings, and every key of the
/// schema is read (a key missing from the reader would come back as an
/// "unknown setting" warning, one missing from the schema would not be
/// written and its value would be lost).
#[test]
fn settings_written_by_to_file_parse_back_to_the_same_settings() {
    let cases = [
        "helper: /bin/true\n",
        "helper: \"/usr/bin/helper --flag 'two words'\"\nworkers: 7\ninterval: 90m\nlogfile: stderr\nloglevel: debug\ntoken: t0k\n\
         lifecycle_component: pm\nchoria_insecure: true\nsite: dc2\nmonitor_port: 9100\nbroker_port: 4222\n\
         broker_provisioning_password: pw\ncert_deny_list: [\"^a$\", \"\\\\.b$\"]\nserver_jwt_validity: 90d\nrego_policy: x.rego\nadmission: {rego_v0: true}\n\
         upgrades_repository: https://repo.example.net\nupgrades_optional: true\nfeatures: {upgrades: true, pki: true}\n\
         discovery_timeout: 20s\ndiscovery_window: 1500ms\nhelper_timeout: 30s\nrpc_timeout: 4s\n",
        "helper: h\ntoken_file: /run/token\nbroker_provisioning_password_file: /run/pw\nleader_election: true\n",
        "helper: h\njwt_verify_cert: abcd\njwt_signing_key: /k\njwt_signing_token: /t\nfeatures: {ed25519: true}\n\
         election: {backend: lease, lease_name: l, lease_namespace: ns, lease_duration: 20s, renew_deadline: 15s, retry_period: 3s}\n",
        "helper: h\nelection: {backend: streams, bucket: B, name: n, api_prefix: '', create_bucket: true, bucket_ttl: 30s}\n",
        "configuration_template:\n  values: {broker: 'nats://b:4222', n: 3, list: [a, b]}\n  configuration: {identity: '{{ identity }}', interval: 300}\n\
         \x20 action_policies: {rpcutil.policy: \"policy default allow\\n\"}\n  opa_policies: {default.rego: 'package choria'}\n\
         \x20 server_claims: {collectives: [c1], ou: ops}\n  upgrade: '{{ values.v }}'\n",
        "features: {pki: true}\ncert_manager: {issuer: ca, issuer_kind: ClusterIssuer, namespace: ns, duration: 2160h, usages: [client auth], timeout: 1m, keep: 5m}\n\
         configuration_template: {configuration: {a: b}}\n",
        "helper: h\ntoken: t\nrecords: {url: 'nats://a:4222,nats://b:4222', bucket: B, history: 9, create_bucket: false, user: u, password_file: /p, tls_ca: /ca, tls_cert: /c, tls_key: /k, signing_key: /s, verify_keys: ['5866666666666666666666666666666666666666666666666666666666666666'], exclusive: true}\n\
         renewal: {before: 20%, jitter: 1h, rate: 50, choria_config: /r.cfg, collective: choria, retry: 5m}\n\
         audit: {stream: A, subject: audit.x, max_age: 30d, max_bytes: 2097152, create_stream: false}\n\
         evidence: {aws_certificates: /aws.pem, aws_accounts: ['123456789012'], gcp_certificates: /g.json, gcp_audience: 'x:{identity}', gcp_projects: [p1], max_age: 2h, node_name: instance_id, one_identity_per_instance: true}\n",
        "helper: h\nevidence: {aws_certificates: /aws.pem, one_identity_per_instance: false}\n",
        "features: {pki: true}\nconfiguration_template: {configuration: {a: b}}\n\
         ca: {certificate: /ca.pem, key: 'pkcs11:token=fleet;object=ca?module-path=/m.so&pin-source=file:/pin', validity: 30d}\n",
    ];
    for yaml in cases {
        let first = parse(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let written = first.to_file().to_yaml().unwrap();
        let mut again = parse(&written).unwrap_or_else(|e| panic!("{written}: {e}"));
        assert!(
            !again.warnings.iter().any(|w| w.message.contains("unknown")),
            "{written}\n{:?}",
            again.warnings
        );
        again.warnings = first.warnings.clone();
        assert_eq!(first, again, "written as\n{written}");
    }
}

#[test]
fn a_records_client_certificate_needs_its_key() {
    for (records, key) in [
        (
            "{url: 'nats://r:4222', tls_cert: /c, signing_key: /s}",
            "records.tls_key",
        ),
        (
            "{url: 'nats://r:4222', tls_key: /k, signing_key: /s}",
            "records.tls_cert",
        ),
    ] {
        let e = parse(&format!("helper: h\nrecords: {records}\n")).unwrap_err();
        assert!(e.to_string().contains(key), "{records}: {e}");
    }
    let c = ok(
        "helper: h\nrecords: {url: 'nats://r:4222', tls_cert: /c, tls_key: /k, signing_key: /s}\n",
    );
    assert_eq!(
        c.records.unwrap().tls_client,
        Some(("/c".into(), "/k".into()))
    );
}

#[test]
fn every_schema_key_is_written_for_a_full_configuration() {
    let c = parse(
        "helper: h\ntoken: t\nbroker_provisioning_password: p\nlogfile: f\nloglevel: info\nbroker_port: 1\n\
         jwt_verify_cert: abcd\njwt_signing_key: /k\njwt_signing_token: /t\nrego_policy: r\nupgrades_repository: u\nrpc_timeout: 1s\n\
         configuration_template: {configuration: {identity: '{{ identity }}'}}\ncert_manager: {issuer: i, namespace: n}\n\
         records: {url: 'nats://r:4222', user: u, password: p, signing_key: /s}\nrenewal: {before: 30d, choria_config: /r.cfg}\naudit: {}\n\
         evidence: {aws_certificates: /a.pem}\ntelemetry: {otlp_endpoint: 'http://127.0.0.1:4318'}\n",
    )
    .unwrap();
    // One signer of ours at a time: the built-in CA in a second one.
    let with_ca = ok("helper: h\nca: {certificate: /ca.pem, key: /ca.key}\n");
    let mut yaml = String::new();
    let mut written = serde_json::Map::new();
    for c in [c, with_ca] {
        let text = c.to_file().to_yaml().unwrap();
        let doc: serde_json::Value = serde_norway::from_str(&text).unwrap();
        written.extend(doc.as_object().unwrap().clone());
        yaml.push_str(&text);
    }
    // The *_file forms stand in for the secrets themselves.
    for key in crate::schema::ProvisionerFile::KEYS
        .iter()
        .filter(|k| !k.ends_with("_file"))
    {
        assert!(written.contains_key(*key), "{key} not written:\n{yaml}");
    }
}

#[test]
fn a_configuration_template_makes_the_helper_optional() {
    let c = ok("configuration_template:\n  configuration:\n    identity: '{{ identity }}'\n    registration_interval: 300\n");
    assert_eq!(c.helper, "");
    assert!(c.helper_command().unwrap().is_empty());
    let t = c.configuration_template.as_ref().unwrap();
    assert_eq!(t.configuration["identity"], "{{ identity }}");
    assert_eq!(
        t.configuration["registration_interval"], "300",
        "numbers are text"
    );
    c.check_files().expect("no helper program to check");
    // Both: the helper is kept and checked as before.
    let c = ok("helper: /bin/h\nconfiguration_template: {configuration: {a: b}}\n");
    assert_eq!(c.helper, "/bin/h");
}

#[test]
fn configuration_template_mistakes_are_errors_naming_the_key() {
    let e = err("configuration_template:\n  configuration:\n    plugin.choria.middleware_hosts: '{{ values.broker'\n");
    assert!(
        e.contains("configuration_template.configuration.plugin.choria.middleware_hosts: not a valid template"),
        "{e}"
    );
    let e = err("configuration_template: {configuration: {'bad key': x}}\n");
    assert!(
        e.contains(
            "configuration_template.configuration: \"bad key\" is not a Choria setting name"
        ),
        "{e}"
    );
    let e = err("configuration_template: {configuration: {a: [x]}}\n");
    assert!(
        e.contains("configuration_template.configuration.a: expected text, found a list"),
        "{e}"
    );
    let e = err(
        "configuration_template: {configuration: {a: b}, action_policies: {'../x.policy': y}}\n",
    );
    assert!(
        e.contains(
            "configuration_template.action_policies: \"../x.policy\" is not a policy file name"
        ),
        "{e}"
    );
    let e =
        err("configuration_template: {configuration: {a: b}, server_claims: {collectives: 3}}\n");
    assert!(
        e.contains("configuration_template.server_claims: not server claims"),
        "{e}"
    );
    let e = err("configuration_template: {values: {a: 1}}\n");
    assert!(
        e.contains("configuration_template.configuration: empty while no helper is set"),
        "{e}"
    );
    let e = err("configuration_template: {configuration: {a: b}}\nfeatures: {pki: true}\n");
    assert!(e.contains("helper: required with features.pki"), "{e}");
    let c = ok("configuration_template: {configuration: {a: b}, confguration: {}}\n");
    assert!(
        c.warnings.iter().any(|w| w
            .to_string()
            .contains("configuration_template.confguration: unknown setting")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn cert_manager_is_a_signer_for_pki_without_a_helper() {
    let c = ok(
        "features: {pki: true}\nconfiguration_template: {configuration: {a: b}}\n\
                cert_manager: {issuer: choria-ca, namespace: choria, duration: 90d, keep: 10m}\n",
    );
    let cm = c.cert_manager.as_ref().unwrap();
    assert_eq!(cm.issuer, "choria-ca");
    assert_eq!(cm.issuer_kind, "Issuer");
    assert_eq!(cm.issuer_group, "cert-manager.io");
    assert_eq!(cm.duration, Some(Duration::from_secs(90 * 24 * 3600)));
    assert_eq!(cm.usages, DEFAULT_CERT_MANAGER_USAGES);
    assert_eq!(cm.timeout, DEFAULT_CERT_MANAGER_TIMEOUT);
    assert_eq!(cm.keep, Duration::from_secs(600));
    let e = err(&with_helper("cert_manager: {namespace: choria}\n"));
    assert!(e.contains("cert_manager.issuer: required"), "{e}");
    let e = err(&with_helper("cert_manager: {issuer: x}\n"));
    assert!(e.contains("cert_manager.namespace: required"), "{e}");
    let e = err(&with_helper(
        "cert_manager: {issuer: 'Bad Name', namespace: n}\n",
    ));
    assert!(
        e.contains("cert_manager.issuer: \"Bad Name\" is not a Kubernetes name"),
        "{e}"
    );
    let e = err(&with_helper(
        "cert_manager: {issuer: x, namespace: n, usages: [server auth, everything]}\n",
    ));
    assert!(
        e.contains("cert_manager.usages[1]: \"everything\" is not a cert-manager key usage"),
        "{e}"
    );
    let e = err(&with_helper(
        "cert_manager: {issuer: x, namespace: n, duration: 30m}\n",
    ));
    assert!(
        e.contains("shorter than cert-manager's minimum of 1h"),
        "{e}"
    );
    let c = ok("helper: h\ncert_manager: {issuer: x, namespace: n}\n");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.to_string().contains("features.pki is off")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn records_need_a_signing_key_and_renewal_a_lead_shorter_than_what_is_issued() {
    let e = err("helper: h\ntoken: t\nrecords: {url: 'nats://r:4222'}\n");
    assert!(
        e.contains("records.signing_key: required") && e.contains("openssl rand -hex 32"),
        "{e}"
    );
    let e = err("helper: h\ntoken: t\nrecords: {url: 'nats://r:4222', signing_key: /s, verify_keys: [nothex]}\n");
    assert!(
        e.contains("records.verify_keys") && e.contains("not an ed25519 public key"),
        "{e}"
    );
    let records = "records: {url: 'nats://r:4222', signing_key: /s}\n";
    let e = err(&format!(
        "helper: h\ntoken: t\n{records}renewal: {{before: 100%, choria_config: /r.cfg}}\n"
    ));
    assert!(
        e.contains("renewal.before") && e.contains("below 100%"),
        "{e}"
    );
    // Server JWTs live 7 days: renewing 7 days before expiry is at once.
    let ed = "jwt_verify_cert: abcd\njwt_signing_key: /k\nfeatures: {ed25519: true}\nserver_jwt_validity: 7d\n";
    let e = err(&format!(
        "helper: h\ntoken: t\n{ed}{records}renewal: {{before: 7d, choria_config: /r.cfg}}\n"
    ));
    assert!(
        e.contains("renewal.before")
            && e.contains("server_jwt_validity")
            && e.contains("as soon as it is provisioned"),
        "{e}"
    );
    ok(&format!("helper: h\ntoken: t\n{ed}{records}renewal: {{before: 2d, jitter: 1d, choria_config: /r.cfg}}\n"));
    let e = err(&format!("helper: h\ntoken: t\n{ed}{records}renewal: {{before: 50%, jitter: 4d, choria_config: /r.cfg}}\n"));
    assert!(e.contains("renewal.jitter"), "{e}");
    // cert-manager's certificates, when their duration is set.
    let cm = "features: {pki: true}\ncert_manager: {issuer: i, namespace: n, duration: 24h}\n";
    let e = err(&format!(
        "helper: h\ntoken: t\n{cm}{records}renewal: {{before: 30d, choria_config: /r.cfg}}\n"
    ));
    assert!(e.contains("cert_manager.duration"), "{e}");
}

#[test]
fn audit_needs_records_and_bounded_retention() {
    let records = "records: {url: 'nats://r:4222', signing_key: /s}\n";
    let c = ok(&format!("helper: h\n{records}audit: {{}}\n"));
    let a = c.audit.expect("audit: {} turns it on");
    assert_eq!(a.stream, crate::audit::DEFAULT_AUDIT_STREAM);
    assert_eq!(a.max_age, crate::audit::DEFAULT_AUDIT_MAX_AGE);
    let e = err("helper: h\naudit: {}\n");
    assert!(e.contains("audit needs records"), "{e}");
    let e = err(&format!("helper: h\n{records}audit: {{max_age: 0s}}\n"));
    assert!(e.contains("audit.max_age") && e.contains("bounded"), "{e}");
    let e = err(&format!("helper: h\n{records}audit: {{max_bytes: 10}}\n"));
    assert!(e.contains("audit.max_bytes"), "{e}");
    let e = err(&format!("helper: h\n{records}audit: {{subject: 'a.*'}}\n"));
    assert!(
        e.contains("audit.subject") && e.contains("no wildcards"),
        "{e}"
    );
}

#[test]
fn evidence_needs_certificates_bounds_and_records_for_its_bindings() {
    let records = "records: {url: 'nats://r:4222', signing_key: /s}\n";
    let c = ok(&format!(
        "helper: h\n{records}evidence: {{aws_certificates: /a.pem}}\n"
    ));
    let e = c.evidence.expect("evidence: turns it on");
    assert!(
        e.one_identity_per_instance,
        "one identity per instance by default"
    );
    assert_eq!(e.gcp_audience, crate::evidence::DEFAULT_GCP_AUDIENCE);
    for (yaml, says) in [
        ("evidence: {}\n", "aws_certificates, gcp_certificates or azure_certificates"),
        ("evidence: {aws_certificates: /a.pem}\n", "needs records"),
        (
            "evidence: {aws_certificates: /a.pem, one_identity_per_instance: false, aws_accounts: ['12']}\n",
            "12 digits",
        ),
        (
            "evidence: {gcp_certificates: /g.json, one_identity_per_instance: false, gcp_audience: choria}\n",
            "{identity}",
        ),
        (
            "evidence: {azure_certificates: /z.pem, one_identity_per_instance: false, azure_subscriptions: [prod]}\n",
            "not an Azure subscription id",
        ),
        (
            "evidence: {aws_certificates: /a.pem, one_identity_per_instance: false, max_age: 0s}\n",
            "max_age",
        ),
        (
            "evidence: {aws_certificates: /a.pem, one_identity_per_instance: false, node_name: hostname}\n",
            "neither instance_id nor instance_name",
        ),
    ] {
        let e = err(&format!("helper: h\n{yaml}"));
        assert!(e.contains(says), "{yaml}: {e}");
    }
}
