//! Attestation that holds, against simulated fleets whose nodes carry
//! cloud instance identity evidence (a document signed by a test AWS
//! region): what a copy of a document under another name can and cannot
//! do. Real go-choria servers carry the same evidence in
//! `provision_go.rs`.

use crate::support::evidence::AwsRegion;
use crate::support::provisioner::ProvisionerProcess;
use crate::support::{NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use std::path::Path;
use std::time::Duration;

const TOKEN: &str = "att3sted-t0ken";

/// A JetStream for the records and bindings, a test region, and the
/// provisioner's configuration: evidence, the `policy` and a template.
struct Bench {
    dir: tempfile::TempDir,
    _store: tempfile::TempDir,
    nats: NatsServer,
    region: AwsRegion,
}

impl Bench {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = tempfile::tempdir().unwrap();
        let nats = NatsServer::start_with(&format!(
            "jetstream {{ store_dir: \"{}\" }}\n",
            store.path().display()
        ));
        let region = AwsRegion::create(dir.path());
        Bench {
            dir,
            _store: store,
            nats,
            region,
        }
    }

    fn yaml(&self, policy: &str) -> String {
        let path = self.dir.path().join("admission.rego");
        std::fs::write(&path, policy).unwrap();
        format!(
            "workers: 4\ntoken: {TOKEN}\nsite: attested\nchoria_insecure: true\nrpc_timeout: 3s\n\
             discovery_window: 500ms\nloglevel: info\n\
             configuration_template:\n  configuration:\n    identity: '{{{{ identity }}}}'\n\
             records:\n  url: {url}\n  signing_key: {seed}\n\
             evidence:\n  aws_certificates: {cert}\n  max_age: 1h\n\
             admission:\n  policy: {policy}\n",
            url = self.nats.url(),
            seed = crate::support::signing_key(self.dir.path()).display(),
            cert = self.region.cert.display(),
            policy = path.display(),
        )
    }

    fn provisioner(&self, yaml: &str) -> ProvisionerProcess {
        let choria = crate::support::plain_client_cfg("provisioner.attested", &self.nats.url());
        ProvisionerProcess::start(self.dir.path(), yaml, &choria, &[])
    }

    /// One node named `<prefix>000…` carrying `facts`, journaling as
    /// `machine` (two machines may answer under one name).
    async fn node(&self, machine: &str, prefix: &str, facts: &serde_json::Value) -> RunningFleet {
        RunningFleet::start(FleetOptions {
            broker: BrokerOptions::at([self.nats.url()]),
            nodes: 1,
            token: TOKEN.into(),
            journal: Some(self.journal(machine)),
            identity_prefix: prefix.into(),
            facts: facts.clone(),
            ..Default::default()
        })
        .await
    }

    fn journal(&self, machine: &str) -> std::path::PathBuf {
        self.dir.path().join(format!("{machine}.jsonl"))
    }
}

fn configured(journal: &Path) -> usize {
    crate::support::read_journal_so_far(journal)
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure" && e["outcome"] == "ok")
        .count()
}

/// A copy of an instance's document presented under a name the admission
/// policy denies binds nothing: the instance's own node, arriving after,
/// is provisioned, not refused as bound elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_document_under_a_denied_name_binds_nothing() {
    let bench = Bench::start();
    let facts = bench
        .region
        .facts("i-1", &AwsRegion::document("i-0abc1234"));
    let mut p = bench.provisioner(&bench.yaml(
        "package choria.provisioner\nimport rego.v1\n\
         default allow := false\n\
         allow if not startswith(input.identity, \"copy-\")\n\
         deny_reason := \"not one of ours\" if startswith(input.identity, \"copy-\")\n",
    ));
    let _copy = bench.node("copy", "copy-", &facts).await;
    p.wait_for_metric(
        "choria_provisioner_admission{decision=\"denied\"",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    let _real = bench.node("real", "web-", &facts).await;
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(configured(&bench.journal("real")), 1);
    assert_eq!(configured(&bench.journal("copy")), 0);
    assert_eq!(
        p.metric("choria_provisioner_evidence{outcome=\"bound_elsewhere\""),
        0.0,
        "{}",
        p.logs_tail(20)
    );
}

/// One name, one instance: a node provisioned from instance A leaves
/// provisioning; a machine presenting valid evidence of instance B under
/// the same name is refused (a VM in anyone's account has valid evidence
/// of its own). Its operator rebinds the name (`rebind`, audited), and the
/// new instance is provisioned. (Each step is a provisioner started anew:
/// one that just provisioned a name holds it for a minute, and a refused
/// name is tried again at the next interval.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_is_refused_from_another_instance_until_it_is_rebound() {
    const NODE: &str = "web-000.fleet.example.net";
    let bench = Bench::start();
    let first = bench
        .region
        .facts("a", &AwsRegion::document("i-0aaaaaaaaaaaaaaaa"));
    let second = bench
        .region
        .facts("b", &AwsRegion::document("i-0bbbbbbbbbbbbbbbb"));
    let yaml = bench.yaml("package choria.provisioner\nimport rego.v1\ndefault allow := true\n")
        + "audit: {}\n";
    let mut p = bench.provisioner(&yaml);
    let a = bench.node("a", "web-", &first).await;
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    drop(p);
    a.finish().await;

    let _b = bench.node("b", "web-", &second).await;
    let mut p = bench.provisioner(&yaml);
    p.wait_for_metric(
        "choria_provisioner_evidence{outcome=\"bound_elsewhere\"",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(configured(&bench.journal("b")), 0);
    assert!(
        p.logs()
            .contains("provisioned from instance aws.123456789012.i-0aaaaaaaaaaaaaaaa"),
        "{}",
        p.logs_tail(10)
    );
    drop(p);
    let cli = crate::support::stdout_of(
        std::process::Command::new(crate::support::provisioner::binary())
            .args([
                "rebind",
                NODE,
                "--reason",
                "machine replaced",
                "--instance",
                "aws.123456789012.i-0bbbbbbbbbbbbbbbb",
                "--config",
            ])
            .arg(bench.dir.path().join("provisioner.yaml")),
    );
    assert!(cli.contains("bound to instance"), "{cli}");
    let mut p = bench.provisioner(&yaml);
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        1.0,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(configured(&bench.journal("b")), 1);
    let events = crate::support::stdout_of(
        std::process::Command::new(crate::support::provisioner::binary())
            .args(["audit", "--config"])
            .arg(bench.dir.path().join("provisioner.yaml")),
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("rebound") && l.contains("machine replaced")),
        "{events}"
    );
}
