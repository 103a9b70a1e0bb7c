//! cert-manager as the signer, against the real thing: cert-manager
//! v1.21.2's own controllers (issuers, the approver, the CA issuer; built
//! by `scripts/build-kube-peers.sh cert-manager`) on the test control plane,
//! and `choria-provisioner run` with `features.pki`, a
//! `configuration_template` and no helper at all.
//!
//! 1. A CA `Issuer`: every node gets a certificate cert-manager signed with
//!    that CA, for its own name, and its rendered configuration; every
//!    CertificateRequest is deleted after use; no process ran per node
//!    (tests/operator_e2e.rs checks the requests' labels and owner, made
//!    with only the Role the operator generates).
//! 2. An issuer that does not exist: the requests stay `Pending`, each node
//!    fails with an error naming its request and what cert-manager said,
//!    the `timeout` outcome is counted, no node is configured, and the
//!    requests are deleted all the same.
//! 3. Requests denied by an approval policy (cert-manager's approver off,
//!    the test denying each): the error names the request and the policy's
//!    reason, `denied` is counted, no node is configured.

use crate::support::certmanager::{self, CertManager};
use crate::support::kube::ControlPlane;
use crate::support::provisioner::ProvisionerProcess;
use crate::support::{read_journal_so_far, NatsServer, RunningFleet};
use choria_fleet::ca as pki;
use choria_fleet::FleetOptions;
use choria_wire::client::BrokerOptions;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

const NS: &str = "choria";
/// Signed in the first part.
const NODES: usize = 500;
/// Failed on purpose in the others.
const FAILING: usize = 50;

const TEMPLATE: &str = "configuration_template:\n  configuration:\n    identity: '{{ identity }}'\n\
    \x20   plugin.security.file.certificate: '{{ csr.ssldir }}/cert.pem'\n    plugin.choria.server.provision: false\n";

/// A fleet and a provisioner signing through `issuer`.
async fn start(
    dir: &Path,
    nats: &NatsServer,
    kubeconfig: &Path,
    name: &str,
    issuer: &str,
    timeout: &str,
    nodes: usize,
) -> (RunningFleet, ProvisionerProcess) {
    let fleet = RunningFleet::start(FleetOptions {
        broker: BrokerOptions::at([nats.url()]),
        nodes,
        token: "cm-token".into(),
        journal: Some(dir.join(format!("{name}.jsonl"))),
        key_pool_size: 8,
        journal_config_keys: vec!["identity".into(), "plugin.security.file.certificate".into()],
        ..Default::default()
    })
    .await;
    let yaml = format!(
        "workers: 16\ninterval: 1m\ntoken: cm-token\nsite: cm\nchoria_insecure: true\nloglevel: debug\nrpc_timeout: 3s\ndiscovery_window: 500ms\n\
         features:\n  pki: true\n{TEMPLATE}cert_manager:\n  issuer: {issuer}\n  namespace: {NS}\n  duration: 2160h\n  timeout: {timeout}\n"
    );
    let choria = format!(
        "identity = provisioner.cm\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        nats.url()
    );
    let p = ProvisionerProcess::start_with_env(
        dir,
        name,
        &yaml,
        &choria,
        &[],
        &[("KUBECONFIG", &kubeconfig.display().to_string())],
    );
    (fleet, p)
}

/// The scenario's fixture: a control plane with cert-manager and its
/// Issuer's CA in `NS`, a broker, and an admin kubeconfig for the provisioners.
struct Signing {
    // Fields drop in order: what started last stops first.
    nats: NatsServer,
    admin: std::path::PathBuf,
    cm: CertManager,
    dir: tempfile::TempDir,
    cp: ControlPlane,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_manager_signs_every_node_and_missing_issuers_and_denials_fail_them_by_name() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let Some(cm_bins) = certmanager::available() else {
        return;
    };
    let cp = ControlPlane::start(&bins);
    cp.kubectl_ok(&["create", "namespace", NS]);
    let dir = tempfile::tempdir().unwrap();
    let cm = CertManager::start(&cp, &cm_bins, dir.path(), NS, "choria-ca");
    let admin = cp.kubeconfig(cp.admin_token());
    let nats = NatsServer::start();
    let mut s = Signing {
        cp,
        dir,
        cm,
        admin,
        nats,
    };
    let (logs, journal) = s.when_the_issuer_exists_every_node_is_signed().await;
    s.then_every_certificate_is_the_issuers_and_configured(&logs, &journal);
    s.when_the_issuer_is_missing_requests_time_out_by_name()
        .await;
    s.when_a_policy_denies_requests_they_fail_by_name().await;
}

impl Signing {
    /// Signed by cert-manager, configured by the template (part 1): the
    /// provisioner's log and the fleet's journal.
    async fn when_the_issuer_exists_every_node_is_signed(&self) -> (String, Vec<Value>) {
        let (dir, cp, nats, admin) = (&self.dir, &self.cp, &self.nats, &self.admin);
        // 1. Signed by cert-manager, configured by the template.
        let (fleet, mut p) =
            start(dir.path(), nats, admin, "good", "choria-ca", "30s", NODES).await;
        p.wait_for_metric(
            "choria_provisioner_provisioned",
            NODES as f64,
            Duration::from_secs(180),
        )
        .await;
        // Requests are deleted once used.
        certmanager::wait_no_requests(cp, NS, Duration::from_secs(20));
        let (_, metrics) = p.get("/metrics");
        let issued = metric(
            &metrics,
            "choria_provisioner_cert_manager_requests{",
            "outcome=\"issued\"",
        );
        assert!(issued >= NODES as f64, "issued {issued}");
        assert_eq!(
            metric(&metrics, "choria_provisioner_helper_time_count", ""),
            0.0
        );
        // A node restarts 2 s after its restart reply: wait until every one
        // came back as a server rather than for a fixed margin.
        let journal = dir.path().join("good.jsonl");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let back: std::collections::BTreeSet<String> = read_journal_so_far(&journal)
                .iter()
                .filter(|e| e["kind"] == "event" && e["event"] == "startup")
                .filter(|e| e["component"] == "server")
                .filter_map(|e| e["node"].as_str().map(str::to_string))
                .collect();
            if back.len() >= NODES {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {NODES} nodes came back as servers",
                back.len()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(10)).success());
        let logs = p.logs();
        let (_, journal) = fleet.finish().await;
        (logs, journal)
    }

    fn then_every_certificate_is_the_issuers_and_configured(&self, logs: &str, journal: &[Value]) {
        let (dir, ca) = (&self.dir, &self.cm.ca);
        let finals: BTreeMap<String, &Value> = journal
            .iter()
            .filter(|e| e["kind"] == "final")
            .map(|e| (e["node"].as_str().unwrap().to_string(), e))
            .collect();
        assert_eq!(finals.len(), NODES);
        for (node, f) in &finals {
            assert_eq!(f["state"], "provisioned", "{node}: {f}");
            let cert = f["certificate"]
                .as_str()
                .unwrap_or_else(|| panic!("{node}: no certificate"));
            pki::verify_issued_by(cert, &ca.cert_pem()).unwrap_or_else(|e| {
                panic!("{node}'s certificate is not from the Issuer's CA: {e}")
            });
            assert_eq!(pki::certificate_common_name(cert).unwrap(), *node);
            assert_eq!(
                f["ca"].as_str().map(str::trim),
                Some(ca.cert_pem().trim()),
                "{node}: status.ca"
            );
            assert_eq!(f["config_values"]["identity"], node.as_str());
            assert!(f["config_values"]["plugin.security.file.certificate"]
                .as_str()
                .is_some_and(|c| c.ends_with("/cert.pem") && c.len() > "/cert.pem".len()));
        }
        assert!(!logs.contains("PRIVATE KEY"));
        // The usages asked for (the defaults: a Choria server's certificate is
        // a TLS server's and the broker's client's), on a few of them.
        for (node, f) in finals.iter().take(3) {
            let file = dir.path().join("sample.pem");
            std::fs::write(&file, f["certificate"].as_str().unwrap()).unwrap();
            let out = std::process::Command::new("openssl")
                .args(["x509", "-noout", "-ext", "keyUsage,extendedKeyUsage", "-in"])
                .arg(&file)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            for usage in [
                "Digital Signature",
                "Key Encipherment",
                "TLS Web Server Authentication",
                "TLS Web Client Authentication",
            ] {
                assert!(text.contains(usage), "{node}: {usage} missing: {text}");
            }
        }
    }

    async fn when_the_issuer_is_missing_requests_time_out_by_name(&self) {
        let (dir, cp, nats, admin) = (&self.dir, &self.cp, &self.nats, &self.admin);
        // 2. No such issuer: Pending until the timeout, named, counted, cleaned up.
        let (fleet, mut p) = start(
            dir.path(),
            nats,
            admin,
            "missing",
            "no-such-issuer",
            "2s",
            FAILING,
        )
        .await;
        p.wait_for_metric(
            "choria_provisioner_cert_manager_requests",
            FAILING as f64,
            Duration::from_secs(120),
        )
        .await;
        let (_, metrics) = p.get("/metrics");
        assert!(
            metric(
                &metrics,
                "choria_provisioner_cert_manager_requests{",
                "outcome=\"timeout\""
            ) >= FAILING as f64
        );
        assert_eq!(
            metric(
                &metrics,
                "choria_provisioner_cert_manager_requests{",
                "outcome=\"issued\""
            ),
            0.0
        );
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(10)).success());
        let logs = p.logs();
        let line = logs
            .lines()
            .find(|l| l.contains("was not issued within 2s"))
            .unwrap_or_else(|| panic!("no timeout error logged:\n{}", p.logs_tail(20)));
        assert!(
            line.contains(&format!("CertificateRequest {NS}/")),
            "{line}"
        );
        assert!(
            line.contains("no-such-issuer"),
            "cert-manager's reason is in the error: {line}"
        );
        let (_, journal) = fleet.finish().await;
        assert_nothing_configured(&journal, "a node was configured without a certificate");
        certmanager::wait_no_requests(cp, NS, Duration::from_secs(20));
    }

    async fn when_a_policy_denies_requests_they_fail_by_name(&mut self) {
        // 3. Denied by an approval policy (cert-manager's approver off, the test
        //    denies every request as it comes): a clear error naming the
        //    request and the policy's reason, counted, nothing configured.
        self.cm.restart_without_approver();
        let (dir, cp, nats, admin) = (&self.dir, &self.cp, &self.nats, &self.admin);
        let (fleet, mut p) = start(
            dir.path(),
            nats,
            admin,
            "denied",
            "choria-ca",
            "20s",
            FAILING,
        )
        .await;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut denied = 0;
        while metric(
            &p.get("/metrics").1,
            "choria_provisioner_cert_manager_requests{",
            "outcome=\"denied\"",
        ) < FAILING as f64
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{denied} denied, not all seen as denied:\n{}",
                p.logs_tail(20)
            );
            denied += certmanager::deny_pending(cp, NS);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(10)).success());
        let logs = p.logs();
        let line = logs
            .lines()
            .find(|l| l.contains("was denied"))
            .unwrap_or_else(|| panic!("no denial logged:\n{}", p.logs_tail(20)));
        assert!(
            line.contains(&format!("CertificateRequest {NS}/"))
                && line.contains("TestPolicy: denied by the test's approval policy"),
            "{line}"
        );
        let (_, journal) = fleet.finish().await;
        assert_nothing_configured(&journal, "a denied node was configured");
        certmanager::wait_no_requests(cp, NS, Duration::from_secs(20));
    }
}

/// No `configure` reached any node of this fleet.
fn assert_nothing_configured(journal: &[Value], why: &str) {
    assert!(
        !journal
            .iter()
            .any(|e| e["kind"] == "action" && e["action"] == "configure"),
        "{why}"
    );
}

/// The sum of the series of `name` whose line contains `labels`.
fn metric(body: &str, name: &str, labels: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
