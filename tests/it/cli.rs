//! The command line as a user of the Go provisioner types it: `run` is the
//! default command, `--debug` goes anywhere, `--choria-config` defaults to
//! go-choria's UserConfig(), and `--check` validates without connecting.

use crate::support::provisioner::binary;
use std::path::Path;
use std::process::{Command, Output};

const TOKEN: &str = "cli-t0ken-s3cret";
const PASSWORD: &str = "cli-pa55w0rd-s3cret";

fn run(args: &[&str], home: &Path) -> Output {
    Command::new(binary())
        .args(args)
        .env("HOME", home)
        .env_remove("CHORIA_PROVISIONER_LOG")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A valid pair of files; nothing listens on the broker port.
fn files(dir: &Path) -> (String, String) {
    let yaml = dir.join("provisioner.yaml");
    std::fs::write(
        &yaml,
        format!(
            "workers: 4\nhelper: /bin/true\nchoria_insecure: true\ntoken: {TOKEN}\nbroker_provisioning_password: {PASSWORD}\nsite: cli\n"
        ),
    )
    .unwrap();
    let cfg = dir.join("choria.cfg");
    std::fs::write(
        &cfg,
        format!(
            "identity = from-flag.example.net\nplugin.choria.middleware_hosts = nats://127.0.0.1:{}\nplugin.security.provider = file\n",
            crate::support::free_port()
        ),
    )
    .unwrap();
    (yaml.display().to_string(), cfg.display().to_string())
}

#[test]
fn check_validates_both_files_and_prints_the_settings_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = files(dir.path());
    let started = std::time::Instant::now();
    // The Choria Helm chart's form, without `run`, and --debug first.
    let o = run(
        &[
            "--debug",
            "--config",
            &yaml,
            "--choria-config",
            &cfg,
            "--check",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    // It returns without connecting (nothing listens on that broker port,
    // and a connection attempt would retry): measured here 7-10 ms (3 runs,
    // load average 8 on 2 cores), so 5 s only fails on a wait.
    let took = started.elapsed();
    println!("--check took {took:?}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    for want in [
        "workers: 4",
        "site: cli",
        "token: (set, redacted)",
        "broker_provisioning_password: (set, redacted)",
        "identity: from-flag.example.net",
        "nats_user: provisioner (password redacted)",
        "configuration is valid",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains(TOKEN) && !out.contains(PASSWORD), "{out}");
    // Same with the explicit subcommand.
    let o = run(
        &["run", "--config", &yaml, "--choria-config", &cfg, "--check"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn check_fails_with_the_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = files(dir.path());
    std::fs::write(&yaml, "helper: /bin/true\ninterval: 30s\n").unwrap();
    let o = run(
        &["--config", &yaml, "--choria-config", &cfg, "--check"],
        dir.path(),
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("provisioner.yaml") && out.contains("interval") && out.contains("1m"),
        "{out}"
    );

    let (yaml, _) = files(dir.path());
    std::fs::write(&cfg, "plugin.security.provider = file\nplugin.security.file.certificate = /nonexistent.pem\nplugin.security.file.key = /nonexistent.key\nplugin.security.file.ca = /nonexistent-ca.pem\nplugin.choria.middleware_hosts = nats://127.0.0.1:4222\n").unwrap();
    std::fs::write(&yaml, "helper: /bin/true\n").unwrap();
    let o = run(
        &["--config", &yaml, "--choria-config", &cfg, "--check"],
        dir.path(),
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("/nonexistent.pem"), "{out}");
}

#[test]
fn the_choria_config_defaults_to_the_users_choriarc() {
    let home = tempfile::tempdir().unwrap();
    let (yaml, cfg) = files(home.path());
    let rc = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("from-flag", "from-choriarc");
    std::fs::write(home.path().join(".choriarc"), rc).unwrap();
    let o = run(&["--config", &yaml, "--check"], home.path());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("identity: from-choriarc.example.net"), "{out}");
    // ~/.mcollective when there is no ~/.choriarc.
    std::fs::rename(
        home.path().join(".choriarc"),
        home.path().join(".mcollective"),
    )
    .unwrap();
    let o = run(&["--config", &yaml, "--check"], home.path());
    assert!(text(&o).contains("identity: from-choriarc.example.net"));
}

#[test]
fn version_and_help_name_the_default_command() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(&["--version"], dir.path());
    assert!(o.status.success());
    assert!(text(&o).contains(env!("CARGO_PKG_VERSION")));
    let o = run(&["--help"], dir.path());
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("--config") && out.contains("fleet"), "{out}");
    let o = run(&[], dir.path());
    assert!(!o.status.success());
    assert!(text(&o).contains("--config"));
}

/// The policy of the book's "Attested provisioning" guide, in small.
const ROLE_POLICY: &str = "package choria.provisioner\n\ndefault allow := false\n\n\
allow if input.facts.role == \"web\"\n\n\
deny_reason := sprintf(\"role %v is not provisioned here\", [input.facts.role]) if not allow\n";

#[test]
fn check_compiles_the_admission_policy_and_names_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = files(dir.path());
    let policy = dir.path().join("admission.rego");
    std::fs::write(&policy, ROLE_POLICY).unwrap();
    let base = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, format!("{base}rego_policy: {}\n", policy.display())).unwrap();
    let args = ["--config", &yaml, "--choria-config", &cfg, "--check"];
    let o = run(&args, dir.path());
    assert!(o.status.success(), "{}", text(&o));
    // A syntax error, then a policy in another package: both refused,
    // naming the file.
    std::fs::write(&policy, "package choria.provisioner\nallow if {\n").unwrap();
    let o = run(&args, dir.path());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("does not compile") && out.contains("admission.rego"),
        "{out}"
    );
    std::fs::write(&policy, "package choria\n\nallow := true\n").unwrap();
    let o = run(&args, dir.path());
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("no package choria.provisioner"), "{out}");
}

#[test]
fn policy_eval_prints_the_decision_and_exits_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("admission.rego");
    std::fs::write(&policy, ROLE_POLICY).unwrap();
    let input = dir.path().join("node.json");
    let eval = |facts: &str| {
        std::fs::write(
            &input,
            format!("{{\"identity\": \"n1.example.net\", \"facts\": {facts}}}"),
        )
        .unwrap();
        run(
            &[
                "policy",
                "eval",
                "--policy",
                policy.to_str().unwrap(),
                "--input",
                input.to_str().unwrap(),
            ],
            dir.path(),
        )
    };
    let o = eval("{\"role\": \"web\"}");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["decision"], "allowed");
    let o = eval("{\"role\": \"db\"}");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out["decision"], "denied");
    assert_eq!(out["reason"], "role db is not provisioned here");
    // A policy that cannot be evaluated for this input refuses (exit 2).
    std::fs::write(
        &policy,
        "package choria.provisioner\n\nallow if to_number(input.facts.role) > 1\n",
    )
    .unwrap();
    let o = eval("{\"role\": \"db\"}");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("could not be evaluated"), "{}", text(&o));
}

/// `token issue` mints a join token a node can be renewed with: with
/// `--config` one that would not outlive the credentials the provisioner
/// issues is refused, naming the least that would; the provisioning token
/// comes from a file (or the environment), never the command line, and
/// `--facts` names the node's facts file (where its evidence goes).
#[test]
fn token_issue_refuses_a_token_that_would_strand_its_node() {
    use choria_wire::security::tokens;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let signer = choria_wire::security::ed25519::Ed25519KeyPair::generate();
    std::fs::write(d.join("signer.seed"), signer.seed_hex()).unwrap();
    std::fs::write(d.join("token"), format!("{TOKEN}\n")).unwrap();
    std::fs::write(
        d.join("provisioner.yaml"),
        format!(
            "token: {TOKEN}\nchoria_insecure: true\nhelper: /bin/true\nfeatures:\n  ed25519: true\n\
             jwt_signing_key: {seed}\njwt_verify_cert: {public}\nserver_jwt_validity: 30d\n\
             records:\n  url: nats://127.0.0.1:4222\n  signing_key: {seed}\n\
             renewal:\n  before: 20%\n  retry: 1h\n  choria_config: {cfg}\n",
            seed = d.join("signer.seed").display(),
            public = signer.public_hex(),
            cfg = d.join("renewal.cfg").display(),
        ),
    )
    .unwrap();
    let issue = |ttl: &str| {
        run(
            &[
                "token",
                "issue",
                "--identity",
                "joined.example.net",
                "--ttl",
                ttl,
                "--signer",
                &d.join("signer.seed").display().to_string(),
                "--token-file",
                &d.join("token").display().to_string(),
                "--facts",
                "/etc/choria/facts.json",
                "--urls",
                "nats://broker.example.net:4222",
                "--config",
                &d.join("provisioner.yaml").display().to_string(),
            ],
            d,
        )
    };
    let refused = issue("7d");
    assert!(!refused.status.success());
    let why = text(&refused);
    assert!(
        why.contains("would strand the node")
            && why.contains("server_jwt_validity")
            && why.contains("give --ttl 31d"),
        "{why}"
    );
    let ok = issue("90d");
    assert!(ok.status.success(), "{}", text(&ok));
    let jwt = String::from_utf8_lossy(&ok.stdout).trim().to_string();
    let claims = tokens::parse_provisioning_token_unverified(&jwt).unwrap();
    assert_eq!(claims.token, TOKEN, "the token read from its file");
    assert_eq!(claims.prov_facts, "/etc/choria/facts.json");
    assert_eq!(claims.bound_identity().unwrap(), Some("joined.example.net"));
    // From the environment, and never echoed by --help.
    let env = Command::new(binary())
        .args(["token", "issue", "--help"])
        .env("CHORIA_PROVISIONING_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!text(&env).contains(TOKEN), "{}", text(&env));
}

/// `run` at the default log level (warn) says one line when it starts:
/// where it provisions, how, where its metrics are and how it waits to
/// work; no secret of either file is in it. (Before, a newcomer saw
/// nothing at all and could not tell it was up.)
#[test]
fn run_says_one_line_at_start_whatever_the_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = files(dir.path());
    let mut child = Command::new(binary())
        .args(["run", "--config", &yaml, "--choria-config", &cfg])
        .env("HOME", dir.path())
        .env_remove("CHORIA_PROVISIONER_LOG")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stderr, &mut first).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        first.starts_with("choria-provisioner ")
            && first.contains(" starting: on nats://127.0.0.1:"),
        "{first}"
    );
    for part in [
        "as from-flag.example.net",
        "4 workers configuring with the helper",
        "no metrics (monitor_port unset)",
        "no election: working at once",
    ] {
        assert!(first.contains(part), "{part:?} not in {first}");
    }
    assert!(
        !first.contains(TOKEN) && !first.contains(PASSWORD),
        "{first}"
    );
}
