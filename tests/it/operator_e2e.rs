//! The operator and its provisioner pods against a real control plane
//! (tests/support/kube.rs: etcd + kube-apiserver, no kubelet, scheduler or
//! controller-manager):
//!
//! * `choria-provisioner operator` runs as a child process logged in as the
//!   chart's ServiceAccount with only the chart's RBAC (deploy/rbac.yaml) and
//!   reconciles `Provisioner`s into their owned objects;
//! * `choria-provisioner run` processes stand in for the pods: a simulated
//!   kubelet materializes the Deployment the operator wrote (its ConfigMap and
//!   Secret volumes under a directory, its args, its fieldRef env) and they log
//!   in with a token of the ServiceAccount the operator bound to the Role it
//!   generated. They follow `spec.paused`, report the leader in the status and
//!   fail over through the Lease while a simulated fleet is provisioned.
//!
//! The replicas share the Choria identity of the generated choria.cfg, as a
//! Deployment's pods do, so the fleet's journal cannot name the replica that
//! sent a request: the leaders' own logs give their terms, and every request
//! must fall into exactly one term.
//!
//! Fails under CI, and is NOT RUN (with a loud banner) without it, when
//! scripts/build-kube-peers.sh has not built the binaries. `CHORIA_ELECTION_LONG=1` runs 20 kills + 20 stops instead of
//! 3 + 3; `OPERATOR_E2E_KEEP=1` keeps the logs and journals.

use crate::support::kube::{expect_ok, Bins, ControlPlane};
use crate::support::operator::*;
use crate::support::{free_port, read_journal_so_far, NatsServer, RunningFleet};
use choria_fleet::FleetOptions;
use choria_operator::build::{CHECKSUM_ANNOTATION, CHORIA_CFG};
use choria_operator::build::{MANAGED_BY, MANAGED_BY_LABEL, PROVISIONER_YAML};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The tests of this file share two cores: one at a time, so the failover
/// figures measure the election rather than a neighbouring control plane.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Lease timings of the pods (client-go's rule: 4 > 3 > 1.2 × 1).
const LEASE_DURATION: Duration = Duration::from_secs(4);
const RETRY_PERIOD: Duration = Duration::from_secs(1);

fn checksum_of(deployment: &Value) -> String {
    deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM_ANNOTATION]
        .as_str()
        .unwrap_or_else(|| panic!("no checksum annotation: {}", deployment["spec"]["template"]))
        .to_string()
}

/// The documented checksum, recomputed: sha256 over each key and value of the
/// ConfigMap's data in key order, each followed by a NUL.
fn config_checksum(cm: &Value) -> String {
    let data: BTreeMap<&str, &str> = cm["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str().unwrap()))
        .collect();
    let mut h = Sha256::new();
    for (k, v) in data {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    hex::encode(h.finalize())
}

fn server_startups(journal: &Path) -> usize {
    crate::support::server_startups(&read_journal_so_far(journal))
}

fn wait_all_provisioned(journal: &Path, nodes: usize, timeout: Duration, leader: &Proc) {
    let deadline = Instant::now() + timeout;
    loop {
        let done = server_startups(journal);
        if done >= nodes {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {nodes} nodes provisioned; {} log:\n{}",
            leader.name,
            leader.tail(20)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every node ended provisioned, and restarted exactly once.
fn assert_provisioned_once(journal: &[Value], nodes: usize) {
    let finals: Vec<&Value> = journal.iter().filter(|e| e["kind"] == "final").collect();
    assert_eq!(finals.len(), nodes);
    for e in finals {
        assert_eq!(e["state"], "provisioned", "{e}");
        assert_eq!(e["restarts"], 1, "{e}");
    }
}

/// A replica's leadership intervals (µs since the epoch) from its log: from
/// "became leader" to "lost leadership", or to `ended` when the log stops
/// leading (killed at that instant, or `i64::MAX` when still running).
fn leadership(log: &str, ended: i64) -> Vec<(i64, i64)> {
    let mut intervals = Vec::new();
    let mut since = None;
    for line in log.lines() {
        let Some(t) = line
            .split_whitespace()
            .next()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        else {
            continue;
        };
        let t = t.as_microsecond();
        if line.contains("became leader") {
            since = Some(t);
        } else if line.contains("lost leadership") {
            if let Some(s) = since.take() {
                intervals.push((s, t));
            }
        }
    }
    if let Some(s) = since {
        intervals.push((s, ended));
    }
    intervals
}

/// How late a request may reach a node after its sender stopped leading.
const TRANSIT: i64 = 300_000;

/// No two replicas led at once, and every request a node received (bar
/// discovery pings) was sent while one led. The replicas share a Choria
/// identity, so the journal cannot name the sender: the leaders' own logs
/// give the intervals. Returns how many requests each leader's term saw.
fn assert_requests_while_one_leads(
    journal: &[Value],
    replicas: &[(String, Vec<(i64, i64)>)],
) -> Vec<(String, usize)> {
    let mut terms: Vec<(i64, i64, &str)> = replicas
        .iter()
        .flat_map(|(name, iv)| iv.iter().map(move |(s, e)| (*s, *e, name.as_str())))
        .collect();
    terms.sort();
    for w in terms.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "{} led until {} but {} led from {}",
            w[0].2,
            w[0].1,
            w[1].2,
            w[1].0
        );
    }
    let mut seen = vec![0; terms.len()];
    let mut requests = 0;
    for e in journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] != "ping")
    {
        let t = e["time_us"].as_i64().unwrap();
        let term = terms.iter().rposition(|(s, _, _)| *s <= t);
        let inside = term.is_some_and(|i| t <= terms[i].1.saturating_add(TRANSIT));
        assert!(inside, "a request while nobody led: {e}\nterms: {terms:?}");
        seen[term.unwrap()] += 1;
        requests += 1;
    }
    assert!(requests > 0, "no provisioning requests in the journal");
    terms
        .iter()
        .zip(seen)
        .map(|((_, _, n), c)| (n.to_string(), c))
        .collect()
}

/// The non-ping senders of the journal: the identity the pods share.
fn senders(journal: &[Value]) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> = journal
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] != "ping")
        .filter_map(|e| e["sender"].as_str())
        .collect();
    set.into_iter().map(String::from).collect()
}

// ------------------------------------------------------------------ tests

/// The least-privilege scenario: one Provisioner reconciled, inspected,
/// changed, refused and deleted; `uid` is its uid, for the owner references.
struct LeastPrivilege {
    c: Cluster,
    uid: String,
    t0: Instant,
}

/// Values that must never leave their Secrets.
const SECRETS: [&str; 6] = [
    "tok-e2e-7f3a9c",
    "pw-e2e-51d0b2",
    "verify-e2e-0c9e44",
    "crt-e2e-aa01",
    "key-e2e-bb02",
    "ca-e2e-cc03",
];

/// What the operator makes for a Provisioner `prov`.
const OWNED: [(&str, &str); 9] = [
    ("serviceaccount", "prov"),
    ("role", "prov"),
    ("rolebinding", "prov"),
    ("rolebinding", "prov-leases"),
    ("rolebinding", "prov-certificaterequests"),
    ("configmap", "prov-config"),
    ("service", "prov-metrics"),
    ("deployment", "prov"),
    ("poddisruptionbudget", "prov"),
];

/// The operator, with only the chart's permissions, turns a Provisioner into
/// its owned objects with the right content, follows spec changes (checksum
/// roll, PDB removal, pause without roll), reports an invalid spec as
/// Degraded with a Warning Event while leaving the objects alone, and owns
/// everything with controller references so a cluster's GC collects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_reconciles_a_provisioner_with_least_privilege() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let c = Cluster::start(&bins);
    // The chart's leader-election Role suffices for the operator's Lease.
    let lease = get(&c.cp, "lease", OPERATOR_NS, "choria-provisioner-operator");
    assert_eq!(lease["spec"]["holderIdentity"], OPERATOR_POD, "{lease}");

    let (p, uid) = given_a_provisioner_with_secrets_tls_and_a_helper(&c, t0);
    let s = LeastPrivilege { c, uid, t0 };
    then_its_status_says_nothing_runs_its_pods(&p);
    s.then_every_owned_object_is_the_operators_and_holds_no_secret();
    let cm = then_the_configmap_names_the_secrets_by_path_only(&s.c.cp);
    let d = then_the_deployment_runs_the_config_locked_down(&s.c.cp, &cm);
    then_only_the_referenced_secret_keys_are_mounted_read_only(&d);
    then_pod_security_restricted_admits_the_pods(&s.c.cp, &d);
    then_the_pods_role_binds_their_own_provisioner_only(&s.c.cp);
    s.then_the_operator_has_least_privilege();
    let cm = s.when_the_configuration_changes_the_pods_roll(&d);
    let d = s.when_one_replica_there_is_no_disruption_budget();
    let d = s.when_paused_nothing_rolls(&d, &cm);
    then_a_password_in_a_broker_url_is_refused_at_admission(&s.c.cp);
    s.when_the_spec_is_invalid_it_is_degraded_and_nothing_applied(&d);
    s.when_fixed_it_recovers();
    policy_refusals(&s.c);
    s.when_deleted_the_objects_keep_their_owner_and_the_operator_is_quiet();
}

/// Creates the namespace, the Secrets, the helper's ConfigMap and the
/// Provisioner `prov`; the Provisioner as first observed, and its uid.
fn given_a_provisioner_with_secrets_tls_and_a_helper(c: &Cluster, t0: Instant) -> (Value, String) {
    let cp = &c.cp;
    c.create_namespace();
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "prov-secrets",
        "-n",
        NS,
        &format!("--from-literal=token={}", SECRETS[0]),
        &format!("--from-literal=broker-password={}", SECRETS[1]),
        &format!("--from-literal=jwt-verify.pem={}", SECRETS[2]),
        "--from-literal=unused=not-mounted",
    ]);
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "prov-tls",
        "-n",
        NS,
        "--type=kubernetes.io/tls",
        &format!("--from-literal=tls.crt={}", SECRETS[3]),
        &format!("--from-literal=tls.key={}", SECRETS[4]),
        &format!("--from-literal=ca.crt={}", SECRETS[5]),
    ]);
    cp.kubectl_ok(&[
        "create",
        "configmap",
        "prov-helper",
        "-n",
        NS,
        "--from-literal=helper.sh=#!/bin/sh\necho '{}'\n",
    ]);
    apply(
        cp,
        &format!(
            "apiVersion: provisioning.choria.io/v1alpha1
kind: Provisioner
metadata:
  name: prov
  namespace: {NS}
spec:
  image: choria-provisioner:0.1.0
  workers: 4
  site: e2e
  broker:
    urls: [nats://broker.example.net:4222]
    tlsSecret: prov-tls
  features:
    jwt: true
  tokenSecret: {{name: prov-secrets, key: token}}
  brokerPasswordSecret: {{name: prov-secrets, key: broker-password}}
  jwtVerifyKeySecret: {{name: prov-secrets, key: jwt-verify.pem}}
  helper:
    command: /etc/choria-provisioner/helper/helper.sh
    configMap: prov-helper
"
        ),
    );
    let p = c.observed("prov");
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    eprintln!("reconciled in {:.1?} since start", t0.elapsed());
    (p, uid)
}

fn then_its_status_says_nothing_runs_its_pods(p: &Value) {
    let generation = p["metadata"]["generation"].as_i64().unwrap();
    // Status: nothing runs pods here, so not Ready, and nothing else wrong.
    assert_eq!(p["status"]["observedGeneration"], generation);
    assert_eq!(p["status"]["readyReplicas"], 0);
    // No deployment controller here: it never saw the Deployment.
    assert_eq!(cond(p, "Ready"), pair("False", "RolloutPending"));
    assert_eq!(
        cond(p, "Progressing"),
        pair("Unknown", "NoDeploymentStatus")
    );
    assert_eq!(cond(p, "LeaderElected"), pair("False", "NoLeader"));
    assert_eq!(cond(p, "Paused"), pair("False", "NotPaused"));
    assert_eq!(cond(p, "Degraded"), pair("False", "AsExpected"));
    assert!(
        managers(p).contains(&(
            "choria-provisioner-operator".into(),
            "Apply".into(),
            "status".into()
        )),
        "{:?}",
        managers(p)
    );
}

impl LeastPrivilege {
    fn then_every_owned_object_is_the_operators_and_holds_no_secret(&self) {
        let (cp, uid) = (&self.c.cp, &self.uid);
        // Every owned object: a controller reference to this Provisioner, our
        // label, and server-side apply by the operator.
        let owner = json!([{
            "apiVersion": "provisioning.choria.io/v1alpha1",
            "kind": "Provisioner",
            "name": "prov",
            "uid": uid,
            "controller": true,
        }]);
        for (kind, name) in OWNED {
            let obj = wait_for(&format!("{kind} {name}"), Duration::from_secs(10), || {
                try_get(cp, kind, NS, name)
            });
            assert_eq!(obj["metadata"]["ownerReferences"], owner, "{kind} {name}");
            assert_eq!(
                obj["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY,
                "{kind} {name}"
            );
            assert!(
                managers(&obj).contains(&(
                    "choria-provisioner-operator".into(),
                    "Apply".into(),
                    String::new()
                )),
                "{kind} {name}: {:?}",
                managers(&obj)
            );
            let text = obj.to_string();
            for s in SECRETS {
                assert!(!text.contains(s), "{kind} {name} holds a Secret value {s}");
            }
        }
    }
}

fn then_the_configmap_names_the_secrets_by_path_only(cp: &ControlPlane) -> Value {
    // The ConfigMap has the Secrets as paths only.
    let cm = get(cp, "configmap", NS, "prov-config");
    let yaml = cm["data"][PROVISIONER_YAML].as_str().unwrap();
    let cfg: Value = serde_norway::from_str(yaml).unwrap();
    let secret_path = |s: &str, k: &str| json!(format!("/etc/choria-provisioner/secrets/{s}/{k}"));
    assert_eq!(
        cfg["token_file"],
        secret_path("prov-secrets", "token"),
        "{yaml}"
    );
    assert_eq!(
        cfg["broker_provisioning_password_file"],
        secret_path("prov-secrets", "broker-password")
    );
    assert_eq!(
        cfg["jwt_verify_cert"],
        secret_path("prov-secrets", "jwt-verify.pem")
    );
    assert_eq!(cfg["helper"], "/etc/choria-provisioner/helper/helper.sh");
    assert_eq!(cfg["workers"], 4);
    assert_eq!(cfg["site"], "e2e");
    assert_eq!(cfg["monitor_port"], 8080);
    assert_eq!(cfg["features"]["jwt"], true);
    assert_eq!(
        cfg["election"],
        json!({"backend": "lease", "lease_name": "prov", "lease_namespace": NS}),
        "{yaml}"
    );
    let ccfg = cm["data"][CHORIA_CFG].as_str().unwrap();
    for line in [
        "identity = prov",
        "plugin.choria.middleware_hosts = nats://broker.example.net:4222",
        "plugin.security.provider = file",
        "plugin.security.file.certificate = /etc/choria-provisioner/secrets/prov-tls/tls.crt",
        "plugin.security.file.key = /etc/choria-provisioner/secrets/prov-tls/tls.key",
        "plugin.security.file.ca = /etc/choria-provisioner/secrets/prov-tls/ca.crt",
    ] {
        assert!(ccfg.lines().any(|l| l == line), "{line:?} not in:\n{ccfg}");
    }
    cm
}

/// The pods' selector labels.
fn selector() -> Value {
    json!({"app.kubernetes.io/name": "choria-provisioner", "app.kubernetes.io/instance": "prov"})
}

fn then_the_deployment_runs_the_config_locked_down(cp: &ControlPlane, cm: &Value) -> Value {
    let selector = selector();
    // The Deployment, as the API server stored it.
    let d = get(cp, "deployment", NS, "prov");
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(checksum_of(&d), config_checksum(cm));
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "prov");
    let ctr = &pod["containers"][0];
    assert_eq!(ctr["image"], "choria-provisioner:0.1.0");
    assert_eq!(
        ctr["args"],
        json!([
            "run",
            "--config",
            "/etc/choria-provisioner/config/provisioner.yaml",
            "--choria-config",
            "/etc/choria-provisioner/config/choria.cfg",
            "--provisioner",
            "choria/prov"
        ])
    );
    assert_eq!(
        ctr["env"],
        json!([
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}},
        ])
    );
    assert_eq!(ctr["ports"][0]["name"], "monitor");
    assert_eq!(ctr["ports"][0]["containerPort"], 8080);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(ctr[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(ctr[probe]["httpGet"]["port"], "monitor", "{probe}");
    }
    assert_eq!(
        ctr["securityContext"],
        json!({
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
        })
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    d
}

fn then_only_the_referenced_secret_keys_are_mounted_read_only(d: &Value) {
    let pod = &d["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];
    // Only the referenced Secrets, only their referenced keys, read-only.
    let mut mounted: Vec<(String, Vec<String>)> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| {
            let s = v.get("secret")?;
            assert_eq!(s["defaultMode"], 0o440, "{v}");
            let mut keys: Vec<String> = s["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["key"].as_str().unwrap().to_string())
                .collect();
            keys.sort();
            Some((s["secretName"].as_str().unwrap().to_string(), keys))
        })
        .collect();
    mounted.sort();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        mounted,
        [
            (
                "prov-secrets".to_string(),
                strings(&["broker-password", "jwt-verify.pem", "token"])
            ),
            (
                "prov-tls".to_string(),
                strings(&["ca.crt", "tls.crt", "tls.key"])
            ),
        ]
    );
    let helper = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == "prov-helper")
        .expect("the helper ConfigMap volume");
    assert_eq!(helper["configMap"]["defaultMode"], 0o755);
    for m in ctr["volumeMounts"].as_array().unwrap() {
        let tmp = m["mountPath"] == "/tmp";
        assert_eq!(m["readOnly"].as_bool().unwrap_or(false), !tmp, "{m}");
    }
}

fn then_pod_security_restricted_admits_the_pods(cp: &ControlPlane, d: &Value) {
    let pod = &d["spec"]["template"]["spec"];
    // Pod Security "restricted" admits the pod template (server dry run in
    // the enforcing namespace) and refuses one without the security context,
    // so the check is live.
    let pod_of = |spec: &Value| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "prov-psa-check", "namespace": NS},
               "spec": spec})
        .to_string()
    };
    expect_ok(
        &["create --dry-run=server (restricted)"],
        cp.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], &pod_of(pod)),
    );
    let mut lax = pod.clone();
    lax["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("securityContext");
    let refused = cp.kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], &pod_of(&lax));
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("violates PodSecurity"),
        "PodSecurity is not enforced: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

fn then_the_pods_role_binds_their_own_provisioner_only(cp: &ControlPlane) {
    let selector = selector();
    // The pods' Role: their own Provisioner, nothing else; Leases come from
    // the chart's ClusterRole, bound in this namespace only.
    let role = get(cp, "role", NS, "prov");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["provisioning.choria.io"], "resources": ["provisioners"],
             "resourceNames": ["prov"], "verbs": ["get", "watch", "list"]},
            {"apiGroups": ["provisioning.choria.io"], "resources": ["provisioners/status"],
             "resourceNames": ["prov"], "verbs": ["patch"]},
        ])
    );
    let pods = json!([{"kind": "ServiceAccount", "name": "prov", "namespace": NS}]);
    for (binding, kind, role, subjects) in [
        ("prov", "Role", "prov", pods.clone()),
        (
            "prov-leases",
            "ClusterRole",
            "choria-provisioner-operator-leases",
            pods,
        ),
        // No cert-manager here: bound to nobody.
        (
            "prov-certificaterequests",
            "ClusterRole",
            "choria-provisioner-operator-certificaterequests",
            Value::Null,
        ),
    ] {
        let rb = get(cp, "rolebinding", NS, binding);
        assert_eq!(
            rb["roleRef"],
            json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}),
            "{binding}"
        );
        assert_eq!(rb["subjects"], subjects, "{binding}");
    }
    let svc = get(cp, "service", NS, "prov-metrics");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "metrics", "port": 8080, "protocol": "TCP", "targetPort": "monitor"}])
    );
    assert_eq!(svc["spec"]["selector"], selector);
    let pdb = get(cp, "poddisruptionbudget", NS, "prov");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(pdb["spec"]["selector"]["matchLabels"], selector);
}

impl LeastPrivilege {
    fn then_the_operator_has_least_privilege(&self) {
        let (c, cp) = (&self.c, &self.c.cp);
        // Least privilege: the operator can neither read Secrets nor delete or
        // create what it only applies, touches no Lease but its own and no
        // CertificateRequest, and binds only the two shipped ClusterRoles.
        for denied in [
            vec!["get", "secrets", "-n", NS],
            vec!["list", "secrets", "--all-namespaces"],
            vec!["delete", "deployments", "-n", NS],
            vec!["create", "pods", "-n", NS],
            vec!["update", "provisioners.provisioning.choria.io", "-n", NS],
            vec!["delete", "configmaps", "-n", NS],
            vec![
                "update",
                "leases.coordination.k8s.io/kube-scheduler",
                "-n",
                "kube-system",
            ],
            vec!["get", "leases.coordination.k8s.io", "-n", NS],
            vec!["create", "leases.coordination.k8s.io", "-n", NS],
            vec![
                "update",
                "leases.coordination.k8s.io/other",
                "-n",
                OPERATOR_NS,
            ],
            vec!["create", "certificaterequests.cert-manager.io", "-n", NS],
            vec![
                "bind",
                "clusterroles.rbac.authorization.k8s.io/cluster-admin",
            ],
            vec![
                "bind",
                "clusterroles.rbac.authorization.k8s.io/admin",
                "-n",
                NS,
            ],
            vec!["escalate", "roles.rbac.authorization.k8s.io", "-n", NS],
        ] {
            assert!(
                !can_i(cp, &c.operator_kubeconfig, &denied),
                "the operator may {denied:?}"
            );
        }
        for allowed in [
            vec![
                "bind",
                "clusterroles.rbac.authorization.k8s.io/choria-provisioner-operator-leases",
                "-n",
                NS,
            ],
            vec![
                "update",
                "leases.coordination.k8s.io/choria-provisioner-operator",
                "-n",
                OPERATOR_NS,
            ],
        ] {
            assert!(
                can_i(cp, &c.operator_kubeconfig, &allowed),
                "the operator may not {allowed:?}"
            );
        }
    }

    /// The ConfigMap after the change.
    fn when_the_configuration_changes_the_pods_roll(&self, d: &Value) -> Value {
        let (c, cp) = (&self.c, &self.c.cp);
        // A configuration change rolls the pods: a new checksum.
        let first_checksum = checksum_of(d);
        patch_spec(cp, "prov", json!({"workers": 8}));
        let p = c.observed("prov");
        let d2 = wait_for(
            "the checksum to follow workers: 8",
            Duration::from_secs(20),
            || {
                let d = get(cp, "deployment", NS, "prov");
                (checksum_of(&d) != first_checksum).then_some(d)
            },
        );
        let cm2 = get(cp, "configmap", NS, "prov-config");
        assert!(cm2["data"][PROVISIONER_YAML]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l == "workers: 8"));
        assert_eq!(checksum_of(&d2), config_checksum(&cm2));
        assert_eq!(cond(&p, "Degraded"), pair("False", "AsExpected"));
        cm2
    }

    /// The Deployment at one replica.
    fn when_one_replica_there_is_no_disruption_budget(&self) -> Value {
        let (c, cp) = (&self.c, &self.c.cp);
        // One replica: no PodDisruptionBudget (it would block drains).
        patch_spec(cp, "prov", json!({"replicas": 1}));
        wait_for("the PDB to be deleted", Duration::from_secs(20), || {
            try_get(cp, "poddisruptionbudget", NS, "prov")
                .is_none()
                .then_some(())
        });
        c.observed("prov");
        let d3 = get(cp, "deployment", NS, "prov");
        assert_eq!(d3["spec"]["replicas"], 1);
        d3
    }

    /// The paused Deployment; `d3` the one before, `cm2` its ConfigMap.
    fn when_paused_nothing_rolls(&self, d3: &Value, cm2: &Value) -> Value {
        let (c, cp) = (&self.c, &self.c.cp);
        // A pause is followed by the pods themselves: no roll, same ConfigMap.
        patch_spec(cp, "prov", json!({"paused": true}));
        let p = c.observed("prov");
        assert_eq!(cond(&p, "Paused"), pair("True", "PausedBySpec"));
        assert_eq!(event_for(cp, "prov", "Paused")["type"], "Normal");
        let d4 = get(cp, "deployment", NS, "prov");
        assert_eq!(
            checksum_of(&d4),
            checksum_of(d3),
            "pausing must not roll the pods"
        );
        assert_eq!(d4["spec"]["template"], d3["spec"]["template"]);
        assert_eq!(get(cp, "configmap", NS, "prov-config")["data"], cm2["data"]);
        d4
    }
}

fn then_a_password_in_a_broker_url_is_refused_at_admission(cp: &ControlPlane) {
    // A password in a broker URL: refused by the API server at once (the
    // CRD's rule), without repeating it; nothing reaches the operator.
    let password = "hunter2-e2e";
    let patch = json!({"spec": {"broker": {"urls": [format!("nats://provisioner:{password}@broker.example.net:4222")]}}});
    let refused = cp.kubectl(&[
        "patch",
        PROV,
        "prov",
        "-n",
        NS,
        "--type=merge",
        "-p",
        &patch.to_string(),
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("spec.broker.urls carry credentials"),
        "{stderr}"
    );
    assert!(
        !stderr.contains(password),
        "the API server repeats the password: {stderr}"
    );
}

impl LeastPrivilege {
    fn when_the_spec_is_invalid_it_is_degraded_and_nothing_applied(&self, d4: &Value) {
        let (c, cp, uid) = (&self.c, &self.c.cp, &self.uid);
        // What only the operator can see (the provisioner's own parsers over the
        // generated files): Degraded with a message saying what to fix, a
        // Warning Event, nothing owned touched.
        patch_spec(cp, "prov", json!({"certDenyList": ["("]}));
        let p = c.observed("prov");
        let degraded = condition(&p, "Degraded");
        assert_eq!(degraded["status"], "True", "{degraded}");
        assert_eq!(degraded["reason"], "InvalidSpec");
        let message = degraded["message"].as_str().unwrap();
        assert!(
            message.contains("the provisioner would refuse its configuration")
                && message.contains("cert_deny_list"),
            "{message}"
        );
        assert_eq!(cond(&p, "Ready"), pair("False", "InvalidSpec"));
        let event = event_for(cp, "prov", "InvalidSpec");
        assert_eq!(event["type"], "Warning", "{event}");
        assert_eq!(event["regarding"]["kind"], "Provisioner");
        assert_eq!(event["regarding"]["uid"], uid.as_str());
        assert_eq!(event["reportingController"], "choria-provisioner-operator");
        assert_eq!(event["reportingInstance"], OPERATOR_POD);
        assert_eq!(event["note"], message);
        let d5 = get(cp, "deployment", NS, "prov");
        assert_eq!(d5["spec"]["template"], d4["spec"]["template"]);
        assert!(
            c.operator
                .metric("choria_provisioner_operator_invalid_specs_total")
                >= 1.0
        );
    }

    fn when_fixed_it_recovers(&self) {
        let (c, cp) = (&self.c, &self.c.cp);
        // Fixed again: no longer Degraded, and an Event says so.
        patch_spec(cp, "prov", json!({"certDenyList": null}));
        let p = c.observed("prov");
        assert_eq!(cond(&p, "Degraded"), pair("False", "AsExpected"));
        event_for(cp, "prov", "Recovered");
    }

    fn when_deleted_the_objects_keep_their_owner_and_the_operator_is_quiet(self) {
        let (c, uid, t0) = (self.c, self.uid, self.t0);
        let cp = &c.cp;
        // Deleted: without a garbage collector here the objects stay, each with a
        // controller reference to the deleted Provisioner, which is what makes
        // a cluster's GC delete them; the operator takes the deletion quietly.
        cp.kubectl_ok(&["delete", PROV, "prov", "-n", NS, "--wait=true"]);
        assert!(try_get(cp, PROV, NS, "prov").is_none());
        std::thread::sleep(Duration::from_secs(2));
        for (kind, name) in OWNED.iter().filter(|(k, _)| *k != "poddisruptionbudget") {
            let obj = get(cp, kind, NS, name);
            let refs = &obj["metadata"]["ownerReferences"];
            assert_eq!(refs[0]["uid"], uid.as_str(), "{kind} {name}");
            assert_eq!(refs[0]["controller"], true, "{kind} {name}");
        }
        let mut op = c.operator;
        assert!(op.running(), "the operator exited:\n{}", op.tail(30));
        assert_eq!(op.metric("choria_provisioner_operator_leader"), 1.0);
        let logs = op.logs();
        assert!(
            !logs.contains("reconciliation failed") && !logs.contains("ERROR"),
            "the operator reported errors:\n{logs}"
        );
        assert_eq!(
            op.metric("choria_provisioner_operator_reconcile_failures_total"),
            0.0
        );
        eprintln!("operator e2e done in {:.1?}", t0.elapsed());
    }
}

/// What the shipped policy refuses (only the operator's own image, no
/// ClusterIssuer, a server's key usages): Degraded NotAllowed with a message
/// naming what was asked and what is allowed, a Warning Event, and nothing
/// applied — the running Deployment unchanged, nothing made for a new one.
fn policy_refusals(c: &Cluster) {
    let cp = &c.cp;
    let before = get(cp, "deployment", NS, "prov");
    patch_spec(cp, "prov", json!({"image": "busybox:latest"}));
    let p = c.observed("prov");
    assert_eq!(cond(&p, "Degraded"), pair("True", "NotAllowed"));
    assert_eq!(cond(&p, "Ready"), pair("False", "NotAllowed"));
    let message = condition(&p, "Degraded")["message"].as_str().unwrap();
    assert_eq!(
        message,
        "spec.image \"busybox:latest\" is not an image this operator may run; allowed: only the operator's own image choria-provisioner:0.1.0 (the cluster admin's --allowed-image)"
    );
    let event = event_for(cp, "prov", "NotAllowed");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["note"], message);
    let after = get(cp, "deployment", NS, "prov");
    assert_eq!(after["spec"]["template"], before["spec"]["template"]);
    assert_eq!(
        after["metadata"]["generation"],
        before["metadata"]["generation"]
    );
    patch_spec(cp, "prov", json!({"image": "choria-provisioner:0.1.0"}));
    assert_eq!(
        cond(&c.observed("prov"), "Degraded"),
        pair("False", "AsExpected")
    );

    // A new Provisioner asking for a ClusterIssuer and a CA's key usage.
    apply(
        cp,
        &json!({
            "apiVersion": "provisioning.choria.io/v1alpha1",
            "kind": "Provisioner",
            "metadata": {"name": "greedy", "namespace": NS},
            "spec": {
                "choriaInsecure": true,
                "broker": {"urls": ["nats://broker.example.net:4222"]},
                "features": {"pki": true},
                "nodeConfiguration": {"configuration": {"identity": "{{ identity }}"}},
                "pki": {"certManager": {
                    "issuerRef": {"name": "corp-root", "kind": "ClusterIssuer"},
                    "usages": ["client auth", "cert sign"],
                }},
            },
        })
        .to_string(),
    );
    let p = c.observed("greedy");
    assert_eq!(cond(&p, "Degraded"), pair("True", "NotAllowed"));
    let message = condition(&p, "Degraded")["message"].as_str().unwrap();
    assert_eq!(
        message,
        "spec.pki.certManager.issuerRef names ClusterIssuer \"corp-root\", which this operator does not let Provisioners use; allowed beyond an Issuer in the Provisioner's namespace: none (the cluster admin's --allowed-cluster-issuer); \
         spec.pki.certManager.usages asks for \"cert sign\", which this operator does not allow; allowed: digital signature, key encipherment, server auth, client auth (the cluster admin's --allowed-usage)"
    );
    event_for(cp, "greedy", "NotAllowed");
    for (kind, name) in [
        ("deployment", "greedy"),
        ("configmap", "greedy-config"),
        ("serviceaccount", "greedy"),
        ("rolebinding", "greedy-certificaterequests"),
    ] {
        assert!(
            try_get(cp, kind, NS, name).is_none(),
            "{kind} {name} was made"
        );
    }
    cp.kubectl_ok(&["delete", PROV, "greedy", "-n", NS]);
}

/// How many nodes the pause scenario provisions.
const PAUSED_FLEET: usize = 1000;

/// The pause scenario's fixture: a fleet provisioned by two pods of one
/// Provisioner, `li` the index of the pod that leads.
struct PauseRun {
    // Fields drop in order: what started last stops first.
    pods: Vec<Proc>,
    li: usize,
    fleet: RunningFleet,
    journal: PathBuf,
    /// The fleet's broker, held until the pods and the fleet stop.
    _nats: NatsServer,
    c: Cluster,
}

/// Two `run` processes of a Provisioner's Deployment, logged in with only the
/// operator-generated Role: one leads through the Lease, `kubectl get prov`
/// shows it and the provisioned count, `spec.paused` pauses and resumes the
/// leader within 5 s without a restart, and every node is provisioned once.
/// Also writes the sample `kubectl get prov -A` for the README.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioner_pods_follow_pause_and_report_the_leader() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut run = PauseRun::given_two_pods_one_leading_and_provisioning(&bins).await;
    let (frozen, pid, paused_after) = run.when_paused_the_leader_stops_sending();
    run.then_the_status_shows_the_leader_and_its_count(frozen);
    run.when_its_deployment_is_ready_it_is_ready_with_a_leader();
    let resumed_after = run.when_resumed_the_leader_provisions_the_rest(pid);
    run.then_kubectl_get_prov_shows_the_leader_and_its_count();
    run.then_one_term_sent_every_request_once().await;
    println!(
        "paused {paused_after:.2?} and resumed {resumed_after:.2?} after the spec change; whole test {:.1?}",
        t0.elapsed()
    );
}

impl PauseRun {
    async fn given_two_pods_one_leading_and_provisioning(bins: &Bins) -> PauseRun {
        const NODES: usize = PAUSED_FLEET;
        let c = Cluster::start(bins);
        let cp = &c.cp;
        c.create_namespace();
        let nats = NatsServer::start();
        fleet_provisioner(&c, "fleet", &nats, 2, 8, "0.1", "2s");
        let deployment = get(cp, "deployment", NS, "fleet");
        let kubeconfig = pod_kubeconfig(&c, "fleet");

        let journal = c.dir.path().join("journal.jsonl");
        let fleet = RunningFleet::start(fleet_options(&nats, NODES, &journal)).await;

        let pods = vec![
            start_pod(&c, &deployment, "fleet-6c8f9d7b5-kq4zt", &kubeconfig),
            start_pod(&c, &deployment, "fleet-6c8f9d7b5-w7xmn", &kubeconfig),
        ];
        let li = sole_leader(&pods, Duration::from_secs(20));
        let (leader, standby) = (&pods[li], &pods[1 - li]);
        assert_eq!(standby.metric("choria_provisioner_paused"), 1.0);
        let lease = get(cp, "lease", NS, "fleet");
        assert!(
            candidate_of(&lease["spec"]["holderIdentity"], &leader.name),
            "{lease}"
        );
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 4);
        wait_for("provisioning to start", Duration::from_secs(60), || {
            (leader.metric("choria_provisioner_provisioned") >= 30.0).then_some(())
        });

        PauseRun {
            pods,
            li,
            fleet,
            journal,
            _nats: nats,
            c,
        }
    }

    fn leader(&self) -> &Proc {
        &self.pods[self.li]
    }

    /// The count it froze at, the leader's pid, and how long the pause took.
    fn when_paused_the_leader_stops_sending(&self) -> (f64, u32, Duration) {
        const NODES: usize = PAUSED_FLEET;
        let (cp, journal, leader) = (&self.c.cp, self.journal.clone(), self.leader());
        // Pause: the leader's pod reads spec.paused itself.
        let pid = self.pods[self.li].child.id();
        let asked = Instant::now();
        patch_spec(cp, "fleet", json!({"paused": true}));
        wait_for("the leader to pause", Duration::from_secs(5), || {
            (leader.metric("choria_provisioner_paused") == 1.0).then_some(())
        });
        let paused_after = asked.elapsed();
        assert_eq!(
            leader.metric("choria_provisioner_leader"),
            1.0,
            "still the leader"
        );
        // In-flight nodes stop at their next step (a configured one still gets
        // its restart, which can be retried: not a fixed time under load): wait
        // until none is in flight; then nothing moves.
        wait_for(
            "the in-flight sequences to end",
            Duration::from_secs(20),
            || (leader.metric("choria_provisioner_sequences") == 0.0).then_some(()),
        );
        // A node stamps a request as it answers, before its sequence can end.
        let drained_at = now_us();
        let frozen = leader.metric("choria_provisioner_provisioned");
        assert!(frozen < NODES as f64, "the fleet finished before the pause");
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(leader.metric("choria_provisioner_provisioned"), frozen);
        let late: Vec<Value> = read_journal_so_far(&journal)
            .into_iter()
            .filter(|e| e["kind"] == "action" && e["action"] != "ping")
            .filter(|e| e["time_us"].as_i64().unwrap() > drained_at)
            .collect();
        assert!(
            late.is_empty(),
            "requests while paused: {:?}",
            &late[..late.len().min(3)]
        );

        (frozen, pid, paused_after)
    }

    fn then_the_status_shows_the_leader_and_its_count(&self, frozen: f64) {
        let (c, leader) = (&self.c, self.leader());
        // The status shows the leader and its count, next to the operator's
        // fields (two field managers), and the operator saw the pause.
        let p = wait_for(
            "the leader and its count in the status",
            Duration::from_secs(15),
            || {
                let p = c.provisioner("fleet");
                // status.leader names the pod; the Lease holds its suffixed
                // candidate name.
                (p["status"]["leader"] == leader.name.as_str()
                    && p["status"]["provisioned"].as_f64() == Some(frozen)
                    && p["status"]["observedGeneration"] == p["metadata"]["generation"])
                    .then_some(p)
            },
        );
        assert_eq!(cond(&p, "Paused"), pair("True", "PausedBySpec"));
        let m = managers(&p);
        for manager in ["choria-provisioner-operator", "choria-provisioner-pod"] {
            assert!(
                m.contains(&(manager.into(), "Apply".into(), "status".into())),
                "{m:?}"
            );
        }
    }

    fn when_its_deployment_is_ready_it_is_ready_with_a_leader(&self) {
        let (c, leader) = (&self.c, self.leader());
        // Stand in for the deployment controller: two ready replicas make the
        // Provisioner Ready with an elected leader.
        set_deployment_status(c, "fleet", 2, 2, 2);
        let p = wait_for("Ready", Duration::from_secs(20), || {
            let p = c.provisioner("fleet");
            (cond(&p, "Ready").0 == "True").then_some(p)
        });
        assert_eq!(cond(&p, "Ready"), pair("True", "Available"));
        let elected = condition(&p, "LeaderElected");
        assert_eq!(elected["status"], "True", "{elected}");
        assert_eq!(elected["message"], format!("{} leads", leader.name));
    }

    /// How long the resume took.
    fn when_resumed_the_leader_provisions_the_rest(&mut self, pid: u32) -> Duration {
        const NODES: usize = PAUSED_FLEET;
        let (cp, journal, leader) = (&self.c.cp, self.journal.clone(), self.leader());
        // Resume: the leader opens the gate and discovers at once.
        let cycles = leader.metric("choria_provisioner_discover_cycles");
        let asked = Instant::now();
        patch_spec(cp, "fleet", json!({"paused": false}));
        wait_for("the leader to resume", Duration::from_secs(5), || {
            (leader.metric("choria_provisioner_paused") == 0.0).then_some(())
        });
        let resumed_after = asked.elapsed();
        wait_for("a discovery on resume", Duration::from_secs(5), || {
            (leader.metric("choria_provisioner_discover_cycles") > cycles).then_some(())
        });
        wait_all_provisioned(&journal, NODES, Duration::from_secs(150), leader);
        let li = self.li;
        assert_eq!(self.pods[li].child.id(), pid);
        assert!(self.pods[li].running(), "the leader restarted");
        assert_eq!(self.pods[1 - li].metric("choria_provisioner_paused"), 1.0);

        resumed_after
    }

    fn then_kubectl_get_prov_shows_the_leader_and_its_count(&self) {
        const NODES: usize = PAUSED_FLEET;
        let (c, cp, leader) = (&self.c, &self.c.cp, self.leader());
        // `kubectl get prov` shows the leader and what it provisioned.
        let sample = wait_for(
            "status.provisioned to reach the fleet",
            Duration::from_secs(20),
            || {
                let p = c.provisioner("fleet");
                if p["status"]["provisioned"].as_u64() != Some(NODES as u64) {
                    return None;
                }
                Some(cp.kubectl_ok(&["get", "prov", "-A"]))
            },
        );
        assert!(sample.contains(&leader.name), "{sample}");
        let line = sample.lines().find(|l| l.contains(&leader.name)).unwrap();
        let columns: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            [columns[0], columns[1], columns[2], columns[3], columns[4], columns[5]],
            [NS, "fleet", "True", leader.name.as_str(), "false", "1000"]
        );
        println!("kubectl get prov -A\n{sample}");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubectl-get-prov.txt");
        std::fs::write(&out, format!("$ kubectl get prov -A\n{sample}")).unwrap();
        println!("written to {}", out.display());
    }

    async fn then_one_term_sent_every_request_once(self) {
        const NODES: usize = PAUSED_FLEET;
        let PauseRun {
            pods, li, fleet, c, ..
        } = self;
        let cp = &c.cp;
        let leader = &pods[li];
        let (_, journal) = fleet.finish().await;
        assert_provisioned_once(&journal, NODES);
        // Both pods run the generated choria.cfg: one identity, "fleet".
        assert_eq!(senders(&journal), ["fleet"]);
        let replicas: Vec<(String, Vec<(i64, i64)>)> = pods
            .iter()
            .map(|p| (p.name.clone(), leadership(&p.logs(), i64::MAX)))
            .collect();
        let terms = assert_requests_while_one_leads(&journal, &replicas);
        assert_eq!(terms.len(), 1, "{terms:?}");
        assert_eq!(terms[0].0, leader.name);
        assert_eq!(c.operator_failures(), 0.0, "{}", c.operator.tail(20));
        let leader_name = pods[li].name.clone();
        let changed = event_for(cp, "fleet", "LeaderChanged");
        assert_eq!(changed["note"], format!("{leader_name} leads"), "{changed}");
        after_the_leader(&c, pods, li, NODES);
    }
}

/// What the pods leave in their Provisioner when leaders go: the Lease is
/// owned by the Provisioner; when the leader stops the standby's name
/// replaces it and the count goes on from where it was (it used to restart
/// at 0); when the last one stops, no leader is named (it used to stay).
fn after_the_leader(c: &Cluster, mut pods: Vec<Proc>, leader: usize, nodes: usize) {
    let cp = &c.cp;
    let p = c.provisioner("fleet");
    let lease = get(cp, "lease", NS, "fleet");
    assert_eq!(
        lease["metadata"]["ownerReferences"],
        json!([{"apiVersion": "provisioning.choria.io/v1alpha1", "kind": "Provisioner",
                "name": "fleet", "uid": p["metadata"]["uid"],
                "controller": false, "blockOwnerDeletion": false}]),
        "{lease}"
    );
    let mut old = pods.remove(leader);
    old.signal("TERM");
    assert!(old.wait_exit(Duration::from_secs(15)).success());
    let standby = pods.pop().unwrap();
    wait_for(
        "the standby's name in status.leader",
        Duration::from_secs(20),
        || (c.provisioner("fleet")["status"]["leader"] == standby.name.as_str()).then_some(()),
    );
    let p = c.provisioner("fleet");
    assert_eq!(
        p["status"]["provisioned"].as_u64(),
        Some(nodes as u64),
        "the count survives the failover: {}",
        p["status"]
    );
    // The old leader cleared its name as it went, or the standby's replaced
    // it first: either way an Event names the new leader.
    let now = format!("{} leads", standby.name);
    event_where(cp, "fleet", "LeaderChanged", |n| n.starts_with(&now));
    let mut standby = standby;
    standby.signal("TERM");
    assert!(standby.wait_exit(Duration::from_secs(15)).success());
    let p = wait_for("status.leader cleared", Duration::from_secs(10), || {
        let p = c.provisioner("fleet");
        p["status"]["leader"].is_null().then_some(p)
    });
    assert_eq!(p["status"]["provisioned"].as_u64(), Some(nodes as u64));
    let gone = format!("no pod leads (before: {})", standby.name);
    event_where(cp, "fleet", "LeaderChanged", |n| n == gone);
}

/// The failover scenario's fixture: a fleet provisioned by three pods of
/// one Provisioner while leaders are killed and stopped in turn, and what
/// each round measured.
struct Failover {
    // Fields drop in order: what started last stops first.
    pods: Vec<Proc>,
    /// Taken when it finishes.
    fleet: Option<RunningFleet>,
    journal: PathBuf,
    kubeconfig: PathBuf,
    deployment: Value,
    /// The fleet's broker, held until the pods and the fleet stop.
    _nats: NatsServer,
    c: Cluster,
    nodes: usize,
    /// Pods started so far: the next one's name.
    started: usize,
    /// The state of the xorshift that picks how long a leader works.
    rng: u64,
    /// Nodes provisioned when the last leader went.
    done_before_last: usize,
    /// Each replica that exited, with its leadership terms.
    gone: Vec<(String, Vec<(i64, i64)>)>,
    crash: Vec<Duration>,
    graceful: Vec<Duration>,
}

/// The Lease election of operator-run pods on a real API server: the leader
/// killed (-9) or stopped (TERM) again and again while a fleet is
/// provisioned. A standby works again within 1 s past lease_duration plus
/// retry_period of a crash and within 2 s of a stop, no two replicas lead at
/// once and no node hears from a replica outside its term, and every node is
/// provisioned exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_failover_kill_and_stop() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let long = std::env::var("CHORIA_ELECTION_LONG").is_ok_and(|v| v == "1");
    let (rounds, nodes) = if long { (20, 8000) } else { (3, 1500) };
    let t0 = Instant::now();
    let c = Cluster::start(&bins);
    let mut f = Failover::given_a_fleet_and_three_pods(c, nodes).await;
    println!("fleet of {nodes} started at {:.1?}", t0.elapsed());
    for _ in 0..3 {
        f.start_pod();
    }
    for round in 0..2 * rounds {
        f.when_the_leader_is_killed_or_stopped(round);
        f.start_pod();
    }
    f.then_every_node_is_provisioned_once_in_one_term(rounds, t0)
        .await;
    f.then_failovers_take_no_longer_than_their_bounds(t0);
}

impl Failover {
    async fn given_a_fleet_and_three_pods(c: Cluster, nodes: usize) -> Failover {
        let cp = &c.cp;
        c.create_namespace();
        let nats = NatsServer::start();
        // A 0.5 s helper paces provisioning (at most 64 nodes/s) so that it
        // lasts through the rounds however idle the machine is, and lets a
        // stopped leader drain well within its 1 s shutdown grace. A leader that
        // takes over discovers the nodes its predecessor just told to restart
        // (they answer for 2 s more, then never again) and spends 5 tries on
        // each: many workers and a short RPC timeout keep that stall short.
        fleet_provisioner(&c, "ha", &nats, 3, 32, "0.5", "1s");
        let deployment = get(cp, "deployment", NS, "ha");
        let kubeconfig = pod_kubeconfig(&c, "ha");
        let journal = c.dir.path().join("journal.jsonl");
        let fleet = RunningFleet::start(fleet_options(&nats, nodes, &journal)).await;

        Failover {
            pods: Vec::new(),
            fleet: Some(fleet),
            journal,
            kubeconfig,
            deployment,
            _nats: nats,
            c,
            nodes,
            started: 0,
            rng: 0x9e3779b97f4a7c15u64,
            done_before_last: 0,
            gone: Vec::new(),
            crash: Vec::new(),
            graceful: Vec::new(),
        }
    }

    fn start_pod(&mut self) {
        self.started += 1;
        let name = format!("ha-7b9f6c5d4-{:02}", self.started);
        let pod = start_pod(&self.c, &self.deployment, &name, &self.kubeconfig);
        self.pods.push(pod);
    }

    /// A crash failover on even rounds, a graceful one on odd: the leader
    /// killed or stopped, then timed until a standby resumed.
    fn when_the_leader_is_killed_or_stopped(&mut self, round: usize) {
        let crash_bound = LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(1);
        let kill = round.is_multiple_of(2);
        let li = sole_leader(&self.pods, LEASE_DURATION * 4);
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let rng = self.rng;
        // Let it work for 0.5–2.5 s first.
        std::thread::sleep(Duration::from_millis(500 + rng % 2000));
        self.done_before_last = server_startups(&self.journal);
        let mut old = self.pods.remove(li);
        let t = Instant::now();
        // A killed leader's term ends now; a stopped one logs its end.
        let ended = if kill { now_us() } else { i64::MAX };
        old.signal(if kill { "KILL" } else { "TERM" });
        let status = old.wait_exit(Duration::from_secs(10));
        self.gone
            .push((old.name.clone(), leadership(&old.logs(), ended)));
        if !kill {
            assert!(
                status.success(),
                "{} exited with {status} after TERM",
                old.name
            );
            let logs = old.logs();
            assert!(
                logs.contains("released leadership") && !logs.contains("could not release"),
                "{} did not release the Lease:\n{}",
                old.name,
                old.tail(20)
            );
        }
        let timeout = if kill {
            crash_bound * 3
        } else {
            Duration::from_secs(10)
        };
        let pods = &self.pods;
        let (ni, took) = loop {
            if let Some(i) =
                (0..pods.len()).find(|i| pods[*i].metric("choria_provisioner_paused") == 0.0)
            {
                break (i, t.elapsed());
            }
            assert!(
                t.elapsed() < timeout,
                "no pod resumed within {timeout:?} after {} {}",
                if kill { "killing" } else { "stopping" },
                old.name
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let holder = get(&self.c.cp, "lease", NS, "ha")["spec"]["holderIdentity"].clone();
        assert!(
            candidate_of(&holder, &pods[ni].name),
            "the Lease names the new leader: {holder}"
        );
        println!(
            "round {round}: {} {}: {} resumed after {took:.2?}",
            if kill { "kill -9" } else { "TERM   " },
            old.name,
            pods[ni].name
        );
        if kill {
            self.crash.push(took);
        } else {
            self.graceful.push(took);
        }
        drop(old);
    }

    async fn then_every_node_is_provisioned_once_in_one_term(
        &mut self,
        rounds: usize,
        t0: Instant,
    ) {
        let (nodes, done_before_last) = (self.nodes, self.done_before_last);
        let pods = &self.pods;
        let journal = self.journal.clone();
        println!(
        "{} rounds done at {:.1?}: {} of {nodes} nodes provisioned ({done_before_last} at the last failover)",
        2 * rounds,
        t0.elapsed(),
        server_startups(&journal),
    );
        assert!(
            done_before_last < nodes,
            "provisioning ended before the last failover: it proves nothing about overlap"
        );
        let li = sole_leader(pods, LEASE_DURATION * 4);
        wait_all_provisioned(&journal, nodes, Duration::from_secs(180), &pods[li]);
        println!("all provisioned at {:.1?}", t0.elapsed());
        let fleet = self.fleet.take().expect("the fleet runs until now");
        let (_, journal) = fleet.finish().await;
        assert_provisioned_once(&journal, nodes);
        assert_eq!(senders(&journal), ["ha"]);
        for p in pods {
            self.gone
                .push((p.name.clone(), leadership(&p.logs(), i64::MAX)));
        }
        let terms = assert_requests_while_one_leads(&journal, &self.gone);
        assert!(terms.len() > 2 * rounds, "{terms:?}");
        println!("requests per leadership term, in order: {terms:?}");
    }

    fn then_failovers_take_no_longer_than_their_bounds(mut self, t0: Instant) {
        let (c, nodes) = (&self.c, self.nodes);
        let (crash, graceful) = (&mut self.crash, &mut self.graceful);
        let crash_bound = LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(1);
        let graceful_bound = Duration::from_secs(2);
        let report = |name: &str, v: &mut Vec<Duration>| {
            v.sort();
            println!(
                "{name}: n={} min {:.2?} median {:.2?} max {:.2?}",
                v.len(),
                v[0],
                v[v.len() / 2],
                v[v.len() - 1]
            );
            v[v.len() - 1]
        };
        println!(
        "lease_duration {LEASE_DURATION:?}, renew_deadline 3s, retry_period {RETRY_PERIOD:?}, {nodes} nodes, {:.1?} in all",
        t0.elapsed()
    );
        let crash_max = report("crash failover (kill -9 → standby paused=0)", crash);
        let graceful_max = report("graceful failover (TERM → standby paused=0)", graceful);
        assert!(
            crash_max <= crash_bound,
            "crash failover {crash_max:?} > lease_duration + retry_period + 1 s"
        );
        assert!(
            graceful_max <= graceful_bound,
            "graceful failover {graceful_max:?} > {graceful_bound:?}"
        );
        assert_eq!(c.operator_failures(), 0.0, "{}", c.operator.tail(20));
    }
}

/// Whether `holder` is the candidate name of the pod `pod`: its name and
/// the process's own six hex digits.
fn candidate_of(holder: &Value, pod: &str) -> bool {
    holder
        .as_str()
        .and_then(|h| h.strip_prefix(pod))
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|suffix| suffix.len() == 6 && suffix.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The chart rendered with `values` by Helm's own engine (helm-python-sdk,
/// installed by scripts/check-manifests.sh into the cache's virtualenv), as
/// objects.
fn render_chart(values: &Value) -> Vec<Value> {
    let cache = std::env::var_os("CHORIA_RS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/choria-provisioner-rs")
        });
    let python = cache.join("venv/bin/python");
    let script = r#"
import json, sys, yaml
import helm_python as helm
values = json.loads(sys.argv[2])
with helm.Chart.load(sys.argv[1]) as ch:
    out = ch.render(values, name="choria-provisioner-operator", namespace="choria-provisioner")
docs = [d for p in sorted(out) if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(out[p]) if d]
print(json.dumps(docs))
"#;
    let out = Command::new(&python)
        .args(["-c", script])
        .arg(repo_file_path("charts/choria-provisioner-operator"))
        .arg(values.to_string())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{} not runnable ({e}); scripts/test.sh installs it (scripts/check-manifests.sh)",
                python.display()
            )
        });
    assert!(
        out.status.success(),
        "rendering the chart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn repo_file_path(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The chart's namespaced mode (`watchNamespace`) end to end on a real API
/// server, with only the RBAC that mode renders: the operator reconciles
/// Provisioners in its namespace and ignores others, holds its Lease there,
/// and leaves alone an object of someone else that has a name a
/// Provisioner needs (Degraded NotOwned, a Warning Event, nothing written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaced_operator_reconciles_only_its_namespace_and_leaves_foreign_objects_alone() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start(&bins);
    install_crd(&cp);
    for ns in [NS, "elsewhere"] {
        cp.kubectl_ok(&["create", "namespace", ns]);
    }
    let docs = render_chart(&json!({"watchNamespace": NS}));
    // Cluster-wide only the admission policy's binding (that policy and its
    // binding are cluster-scoped); the rest is bound in the namespace.
    let cluster_bindings: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding")
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        cluster_bindings,
        ["choria-provisioner-operator-pod-certificaterequests"]
    );
    for d in docs.iter().filter(|d| {
        matches!(
            d["kind"].as_str(),
            Some("ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding")
        )
    }) {
        apply(&cp, &d.to_string());
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let port = free_port();
    let args = operator_args(deployment, port);
    assert!(args.contains(&format!("--namespace={NS}")), "{args:?}");
    let token = create_token(&cp, OPERATOR_NS, OPERATOR_SA);
    let kubeconfig = cp.kubeconfig(&token);
    wait_allowed(&cp, &kubeconfig, &["list", PROV, "-n", NS]);
    let dir = tempfile::tempdir().unwrap();
    let operator = Proc::spawn(
        "operator",
        dir.path(),
        port,
        &args,
        &[
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            ("POD_NAME".into(), OPERATOR_POD.into()),
            ("POD_NAMESPACE".into(), OPERATOR_NS.into()),
        ],
    );
    wait_for(
        "the namespaced operator to lead",
        Duration::from_secs(30),
        || (operator.metric("choria_provisioner_operator_leader") == 1.0).then_some(()),
    );
    // Its Lease lives in the watched namespace.
    let lease = get(&cp, "lease", NS, "choria-provisioner-operator");
    assert_eq!(lease["spec"]["holderIdentity"], OPERATOR_POD);

    // Someone else's ConfigMap has the name Provisioner "clash" needs.
    cp.kubectl_ok(&[
        "create",
        "configmap",
        "clash-config",
        "-n",
        NS,
        "--from-literal=owner=billing",
    ]);
    let provisioner = |ns: &str, name: &str| {
        format!(
            "apiVersion: provisioning.choria.io/v1alpha1\nkind: Provisioner\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
             spec:\n  choriaInsecure: true\n  broker:\n    urls: [nats://broker.example.net:4222]\n  \
             helper:\n    command: /bin/true\n"
        )
    };
    apply(&cp, &provisioner(NS, "ours"));
    apply(&cp, &provisioner(NS, "clash"));
    apply(&cp, &provisioner("elsewhere", "theirs"));

    let ours = wait_for(
        "Provisioner ours reconciled",
        Duration::from_secs(30),
        || try_get(&cp, "deployment", NS, "ours"),
    );
    assert_eq!(ours["metadata"]["ownerReferences"][0]["name"], "ours");
    let clash = wait_for(
        "Provisioner clash reported",
        Duration::from_secs(30),
        || {
            let p = get(&cp, PROV, NS, "clash");
            (cond(&p, "Degraded").0 == "True").then_some(p)
        },
    );
    assert_eq!(cond(&clash, "Degraded"), pair("True", "NotOwned"));
    let message = condition(&clash, "Degraded")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("ConfigMap choria/clash-config exists") && message.contains("kubectl"),
        "{message}"
    );
    let cm = get(&cp, "configmap", NS, "clash-config");
    assert_eq!(
        cm["data"],
        json!({"owner": "billing"}),
        "the foreign ConfigMap was changed"
    );
    assert!(cm["metadata"]["ownerReferences"].is_null(), "{cm}");
    assert!(
        try_get(&cp, "deployment", NS, "clash").is_none(),
        "nothing of clash was applied"
    );
    let events = cp.kubectl_ok(&["get", "events.events.k8s.io", "-n", NS, "-o", "json"]);
    let events: Value = serde_json::from_str(&events).unwrap();
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "NotOwned"
                && e["type"] == "Warning"
                && e["regarding"]["name"] == "clash"),
        "no NotOwned Warning event for clash"
    );

    // The other namespace is not watched: its Provisioner is untouched.
    std::thread::sleep(Duration::from_secs(3));
    let theirs = get(&cp, PROV, "elsewhere", "theirs");
    assert!(theirs["status"].is_null(), "{theirs}");
    assert!(try_get(&cp, "deployment", "elsewhere", "theirs").is_none());
    drop(operator);
}

/// How many nodes the cert-manager scenario provisions.
const CERT_MANAGER_FLEET: usize = 60;

/// The cert-manager scenario's fixture: cert-manager and its Issuer beside
/// the operator, a broker, and the Provisioner `nohelper` (its uid and the
/// Deployment the operator made for it).
struct NoHelper {
    // Fields drop in order: what started last stops first.
    nats: NatsServer,
    cm: crate::support::certmanager::CertManager,
    c: Cluster,
    uid: String,
    deployment: Value,
}

/// Helper-free on Kubernetes: a Provisioner with `nodeConfiguration` and
/// `pki.certManager` and no helper. Its pod, logged in with only the Role
/// the operator generated (which now allows CertificateRequests, and
/// nothing more), has the real cert-manager sign every node's CSR; the
/// requests carry our labels, the node's identity and the Provisioner as
/// owner; every node is provisioned with its rendered configuration and a
/// certificate from the Issuer's CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioner_without_a_helper_signs_through_cert_manager_with_its_own_role() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let Some(cm_bins) = crate::support::certmanager::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(&bins);
    let s = NoHelper::given_a_provisioner_signing_through_cert_manager(c, &cm_bins);
    let kubeconfig = s.then_its_pods_may_handle_certificaterequests_and_nothing_else();
    let watches_before_the_pod = certificaterequest_watches(&s.c.cp);
    let (fleet, pod) = s
        .when_its_pod_runs_every_node_is_provisioned(&kubeconfig)
        .await;
    s.then_its_requests_are_kept_labelled_and_owned();
    s.then_they_are_followed_through_one_watch(watches_before_the_pod);
    s.when_stopped_no_request_outlives_its_pod(pod);
    s.then_every_certificate_is_the_issuers(fleet).await;
}

impl NoHelper {
    fn given_a_provisioner_signing_through_cert_manager(
        c: Cluster,
        cm_bins: &crate::support::certmanager::Bins,
    ) -> NoHelper {
        let cp = &c.cp;
        c.create_namespace();
        let cm = crate::support::certmanager::CertManager::start(
            cp,
            cm_bins,
            c.dir.path(),
            NS,
            "choria-ca",
        );
        let nats = NatsServer::start();
        token_secret(cp, "nohelper");
        let resource = json!({
            "apiVersion": "provisioning.choria.io/v1alpha1",
            "kind": "Provisioner",
            "metadata": {"name": "nohelper", "namespace": NS},
            "spec": {
                "replicas": 1,
                "workers": 8,
                "site": "e2e",
                "logLevel": "info",
                "choriaInsecure": true,
                "broker": {"urls": [nats.url()]},
                "tokenSecret": {"name": "nohelper-token", "key": "token"},
                "features": {"pki": true},
                "rpcTimeout": "3s",
                "discoveryTimeout": "2s",
                "discoveryWindow": "500ms",
                "nodeConfiguration": {
                    "values": {"broker": "nats://broker.e2e.example.net:4222"},
                    "configuration": {
                        "identity": "{{ identity }}",
                        "plugin.choria.middleware_hosts": "{{ values.broker }}",
                        "plugin.choria.server.provision": "false",
                    },
                },
                "pki": {"certManager": {"issuerRef": {"name": "choria-ca"}, "duration": "2160h", "keep": "5m"}},
                "election": {"backend": "none"},
            },
        });
        apply(cp, &resource.to_string());
        let p = c.observed("nohelper");
        assert_eq!(
            cond(&p, "Degraded"),
            pair("False", "AsExpected"),
            "{}",
            p["status"]
        );
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let deployment = get(cp, "deployment", NS, "nohelper");
        let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
        assert!(
            !volumes
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["name"] == "helper"),
            "a helper volume without a helper: {volumes}"
        );

        NoHelper {
            nats,
            cm,
            c,
            uid,
            deployment,
        }
    }

    /// The pods' kubeconfig, once their role is bound.
    fn then_its_pods_may_handle_certificaterequests_and_nothing_else(&self) -> PathBuf {
        let cp = &self.c.cp;
        wait_for(
            "the operator's RoleBinding",
            Duration::from_secs(30),
            || try_get(cp, "rolebinding", NS, "nohelper"),
        );
        let kubeconfig = cp.kubeconfig(&create_token(cp, NS, "nohelper"));
        let requests = "certificaterequests.cert-manager.io";
        wait_allowed(cp, &kubeconfig, &["create", requests, "-n", NS]);
        for allowed in ["list", "watch", "delete"] {
            assert!(
                can_i(cp, &kubeconfig, &[allowed, requests, "-n", NS]),
                "{allowed}"
            );
        }
        for denied in [
            vec!["get", requests, "-n", NS],
            vec!["update", requests, "-n", NS],
            vec!["create", requests, "-n", "default"],
            vec!["get", "certificates.cert-manager.io", "-n", NS],
            vec!["get", "issuers.cert-manager.io", "-n", NS],
        ] {
            assert!(!can_i(cp, &kubeconfig, &denied), "the pods may {denied:?}");
        }

        kubeconfig
    }

    async fn when_its_pod_runs_every_node_is_provisioned(
        &self,
        kubeconfig: &Path,
    ) -> (RunningFleet, Proc) {
        const NODES: usize = CERT_MANAGER_FLEET;
        let (c, nats, deployment) = (&self.c, &self.nats, &self.deployment);
        let journal = c.dir.path().join("nohelper.jsonl");
        let fleet = RunningFleet::start(FleetOptions {
            key_pool_size: 4,
            journal_config_keys: vec!["identity".into(), "plugin.choria.middleware_hosts".into()],
            ..fleet_options(nats, NODES, &journal)
        })
        .await;
        let pod = start_pod(c, deployment, "nohelper-7d9f8c6b5-z2x4q", kubeconfig);
        wait_all_provisioned(&journal, NODES, Duration::from_secs(120), &pod);
        assert_eq!(pod.metric("choria_provisioner_helper_time_count"), 0.0);

        (fleet, pod)
    }

    fn then_its_requests_are_kept_labelled_and_owned(&self) {
        const NODES: usize = CERT_MANAGER_FLEET;
        let (cp, uid) = (&self.c.cp, &self.uid);
        // Kept for `keep`: each request is ours, names its node, is owned.
        let made = crate::support::certmanager::requests(cp, NS);
        assert!(made.len() >= NODES, "{} requests", made.len());
        for r in &made {
            let m = &r["metadata"];
            assert_eq!(
                m["labels"]["app.kubernetes.io/managed-by"], "choria-provisioner",
                "{m}"
            );
            assert_eq!(
                m["labels"]["provisioning.choria.io/provisioner"], "nohelper",
                "{m}"
            );
            assert!(
                m["annotations"]["provisioning.choria.io/node"].is_string(),
                "{m}"
            );
            assert_eq!(m["ownerReferences"][0]["uid"], uid.as_str(), "{m}");
            assert_eq!(m["ownerReferences"][0]["kind"], "Provisioner", "{m}");
            assert_eq!(r["spec"]["duration"], "7776000s", "{}", r["spec"]);
        }
    }

    fn then_they_are_followed_through_one_watch(&self, watches_before_the_pod: f64) {
        let cp = &self.c.cp;
        // Followed through one watch, not read back per node.
        let requests = apiserver_requests(cp);
        assert_eq!(
            requests
                .get("GET certificaterequests")
                .copied()
                .unwrap_or(0.0),
            0.0,
            "{requests:?}"
        );
        // A watch is counted in the request total only once it ends; the one
        // the pod holds open since its start is among the open ones, beside
        // cert-manager's own.
        assert!(
            certificaterequest_watches(cp) > watches_before_the_pod,
            "the pod watches no certificaterequests: {requests:?} {:?}",
            apiserver_open_requests(cp)
        );
    }

    fn when_stopped_no_request_outlives_its_pod(&self, mut pod: Proc) {
        let cp = &self.c.cp;
        // Stopped while they wait out `keep` (5m): none outlives the process.
        pod.signal("TERM");
        assert!(
            pod.wait_exit(Duration::from_secs(15)).success(),
            "{}",
            pod.tail(20)
        );
        let left = crate::support::certmanager::requests(cp, NS);
        assert!(left.is_empty(), "{} requests outlived the pod", left.len());
    }

    async fn then_every_certificate_is_the_issuers(&self, fleet: RunningFleet) {
        const NODES: usize = CERT_MANAGER_FLEET;
        let cm = &self.cm;
        let (_, journal) = fleet.finish().await;
        assert_provisioned_once(&journal, NODES);
        for f in journal.iter().filter(|e| e["kind"] == "final") {
            let node = f["node"].as_str().unwrap();
            let cert = f["certificate"]
                .as_str()
                .unwrap_or_else(|| panic!("{node}: no certificate"));
            choria_fleet::ca::verify_issued_by(cert, &cm.ca.cert_pem())
                .unwrap_or_else(|e| panic!("{node}: not from the Issuer's CA: {e}"));
            assert_eq!(f["config_values"]["identity"], node);
            assert_eq!(
                f["config_values"]["plugin.choria.middleware_hosts"],
                "nats://broker.e2e.example.net:4222"
            );
        }
    }
}

/// The watches of certificaterequests the apiserver has served: ended
/// ones and those open now.
fn certificaterequest_watches(cp: &ControlPlane) -> f64 {
    let watches =
        |m: BTreeMap<String, f64>| m.get("WATCH certificaterequests").copied().unwrap_or(0.0);
    watches(apiserver_requests(cp)) + watches(apiserver_open_requests(cp))
}

/// `spec.revocations` (issue 33): the pod writes each listed identity as a
/// sealed revocation (the operator cannot: it may not read the signing
/// key), the node is refused and `status.revoked` and `status.refused`
/// say so; taken out of the list, the identity is lifted and provisioned at
/// the next discovery. A revocation written with `choria-provisioner
/// revoke` is not the list's to lift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_revocations_are_written_by_the_pods_and_lifted_when_removed() {
    const NODES: usize = 12;
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(&bins);
    let cp = &c.cp;
    c.create_namespace();
    let nats = NatsServer::start_jetstream();
    let journal = c.dir.path().join("journal.jsonl");
    let fleet = RunningFleet::start(fleet_options(&nats, NODES, &journal)).await;
    let (listed, by_hand) = (fleet.identities[0].clone(), fleet.identities[1].clone());
    fleet_provisioner_with(
        &c,
        "revoking",
        &nats,
        (1, 4),
        "0",
        "2s",
        json!({
            "records": {"urls": [nats.url()]},
            "revocations": [{"identity": listed, "reason": "stolen laptop"}],
        }),
    );
    let deployment = get(cp, "deployment", NS, "revoking");
    let kubeconfig = pod_kubeconfig(&c, "revoking");
    let pod = start_pod(&c, &deployment, "revoking-5d8c7b9f4-r2k7q", &kubeconfig);

    // Every node but the listed one is provisioned; the listed one is
    // refused as revoked, and the status counts both.
    wait_for("the others provisioned", Duration::from_secs(90), || {
        (pod.metric("choria_provisioner_provisioned") >= (NODES - 1) as f64).then_some(())
    });
    let p = wait_for(
        "status.revoked and status.refused",
        Duration::from_secs(30),
        || {
            let p = c.provisioner("revoking");
            (p["status"]["revoked"] == 1 && p["status"]["refused"].as_i64() >= Some(1)).then_some(p)
        },
    );
    // The gauge follows the bucket (every second): the written revocation.
    wait_for("the revocation read back", Duration::from_secs(10), || {
        (pod.metric("choria_provisioner_revocations") == 1.0).then_some(())
    });
    assert!(pod.metric("choria_provisioner_revoked_refusals") >= 1.0);
    let configured = |node: &str| {
        read_journal_so_far(&journal)
            .iter()
            .filter(|e| e["kind"] == "action" && e["node"] == node)
            .filter(|e| e["action"] == "configure" && e["outcome"] == "ok")
            .count()
    };
    assert_eq!(configured(&listed), 0, "a listed node was configured");
    assert!(
        pod.logs().contains("revoked by spec.revocations"),
        "{}",
        pod.tail(20)
    );
    println!(
        "status while listed: revoked {} refused {}",
        p["status"]["revoked"], p["status"]["refused"]
    );

    // A revocation by hand, with the pod's own configuration.
    let config = c
        .dir
        .path()
        .join("revoking-5d8c7b9f4-r2k7q")
        .join(choria_operator::build::CONFIG_DIR.trim_start_matches('/'))
        .join(PROVISIONER_YAML);
    let cli = |args: &[&str]| {
        let out = Command::new(crate::support::provisioner::binary())
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        let (stdout, stderr) = (out.stdout, String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{args:?}: {stderr}");
        String::from_utf8(stdout).unwrap()
    };
    cli(&["revoke", &by_hand, "--reason", "by hand"]);
    wait_for("two revoked", Duration::from_secs(30), || {
        (c.provisioner("revoking")["status"]["revoked"] == 2).then_some(())
    });

    // Out of the list: lifted by the pod, which discovers at once (the
    // interval is a minute); the revocation by hand stays.
    let lifted = Instant::now();
    patch_spec(cp, "revoking", json!({"revocations": null}));
    wait_for(
        "the listed node provisioned",
        Duration::from_secs(45),
        || (configured(&listed) >= 1).then_some(()),
    );
    println!(
        "lifted and provisioned {:.1?} after the spec change",
        lifted.elapsed()
    );
    assert!(pod.logs().contains("lifted: no longer in spec.revocations"));
    let p = wait_for("one revoked", Duration::from_secs(30), || {
        let p = c.provisioner("revoking");
        (p["status"]["revoked"] == 1).then_some(p)
    });
    // The one left is the one revoked by hand.
    let nodes = cli(&["nodes"]);
    let revoked: Vec<&str> = nodes.lines().filter(|l| l.contains("REVOKED")).collect();
    assert!(
        revoked.len() == 1 && revoked[0].contains(&by_hand) && revoked[0].contains("by hand"),
        "{nodes}"
    );
    assert!(
        p["status"]["provisioned"].as_i64() >= Some((NODES - 1) as i64),
        "{}",
        p["status"]
    );
    drop(pod);
    fleet.finish().await;
}
