//! Smoke test of the Kubernetes control-plane harness (tests/support/kube.rs):
//! a real kube-apiserver + etcd answer kubectl and kube-rs, enforce
//! resourceVersion optimistic concurrency (409) on a coordination.k8s.io/v1
//! Lease, and enforce RBAC for the unprivileged `operator` user.
//! Fails under CI, and is NOT RUN (with a loud banner) without it, when
//! scripts/build-kube-peers.sh has not built the binaries.

use std::time::{Duration, Instant};

use crate::support::kube::{expect_ok, ControlPlane};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;

const NS: &str = "smoke";

fn lease_json(cp: &ControlPlane) -> Value {
    let out = cp.kubectl_ok(&["get", "lease", "smoke", "-n", NS, "-o", "json"]);
    serde_json::from_str(&out).expect("lease JSON")
}

fn with_holder(lease: &Value, holder: &str) -> String {
    let mut l = lease.clone();
    l["spec"]["holderIdentity"] = holder.into();
    l.to_string()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn apiserver_lease_conflict_and_operator_rbac() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let t0 = Instant::now();
    let cp = ControlPlane::start(&bins);

    // Server and kubectl come from the same module set, so their versions match.
    let v: Value = serde_json::from_str(&cp.kubectl_ok(&["version", "-o", "json"])).unwrap();
    let server = v["serverVersion"]["gitVersion"]
        .as_str()
        .unwrap_or_default();
    assert!(server.starts_with("v1."), "server version: {v}");
    assert_eq!(server, v["clientVersion"]["gitVersion"], "{v}");
    eprintln!("kube-apiserver {server} ready in {:.1?}", cp.started_in());

    cp.kubectl_ok(&["create", "namespace", NS]);
    let manifest = format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: smoke\n  namespace: {NS}\n\
         spec:\n  holderIdentity: a\n  leaseDurationSeconds: 15\n"
    );
    expect_ok(
        &["create"],
        cp.kubectl_stdin(&["create", "-f", "-"], &manifest),
    );
    let first = lease_json(&cp);
    let rv1 = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // An update carrying the current resourceVersion wins...
    expect_ok(
        &["replace"],
        cp.kubectl_stdin(&["replace", "-f", "-"], &with_holder(&first, "b")),
    );
    let second = lease_json(&cp);
    assert_eq!(second["spec"]["holderIdentity"], "b");
    assert_ne!(second["metadata"]["resourceVersion"], rv1.as_str());

    // ...and one carrying the now stale one is refused with 409 Conflict.
    let stale = cp.kubectl_stdin(&["replace", "-v=6", "-f", "-"], &with_holder(&first, "c"));
    let err = stderr(&stale);
    assert!(!stale.status.success(), "stale update accepted:\n{err}");
    assert!(err.contains("409 Conflict"), "no 409 in:\n{err}");
    assert!(err.contains("the object has been modified"), "{err}");
    assert_eq!(lease_json(&cp)["spec"]["holderIdentity"], "b");

    // The operator user starts with no rights at all.
    let op = cp.operator_token();
    let denied = cp.kubectl_as(op, &["get", "lease", "smoke", "-n", NS]);
    assert!(!denied.status.success());
    assert!(
        stderr(&denied).contains(
            "User \"operator\" cannot get resource \"leases\" in API group \"coordination.k8s.io\""
        ),
        "{}",
        stderr(&denied)
    );

    // Least privilege: get and update leases in this namespace only.
    cp.kubectl_ok(&[
        "create",
        "role",
        "lease-holder",
        "-n",
        NS,
        "--verb=get,update",
        "--resource=leases.coordination.k8s.io",
    ]);
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "lease-holder",
        "-n",
        NS,
        "--role=lease-holder",
        "--user=operator",
    ]);
    // The RBAC authorizer learns of the binding through a watch: not at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let allowed = loop {
        let out = cp.kubectl_as(op, &["get", "lease", "smoke", "-n", NS, "-o", "json"]);
        if out.status.success() {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "operator still denied after the RoleBinding:\n{}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let current: Value = serde_json::from_slice(&allowed.stdout).unwrap();
    let kc = cp.kubeconfig(op);
    expect_ok(
        &["replace (operator)"],
        cp.kubectl_with(
            &kc,
            &["replace", "-f", "-"],
            Some(&with_holder(&current, "operator")),
        ),
    );
    // ...and nothing more: no delete, no other namespace.
    for args in [
        &["delete", "lease", "smoke", "-n", NS][..],
        &["get", "leases", "-n", "default"][..],
    ] {
        let out = cp.kubectl_as(op, args);
        assert!(
            !out.status.success() && stderr(&out).contains("Forbidden"),
            "operator allowed to {args:?}: {}",
            stderr(&out)
        );
    }

    // kube-rs with the written kubeconfig (token + the server's own CA).
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kc).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, NS);
    let lease = leases.get("smoke").await.expect("operator GET via kube-rs");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("operator")
    );
    match leases.list(&Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("operator may list leases: {other:?}"),
    }

    eprintln!("smoke test done in {:.1?}", t0.elapsed());
}
