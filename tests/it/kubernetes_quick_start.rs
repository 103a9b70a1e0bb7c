//! The quick start on Kubernetes (`docs/src/quick-start/kubernetes.md`)
//! run from the page's own text on the node tier's cluster (a real kubelet,
//! containerd, scheduler, controller-manager; `scripts/node-tier.sh` runs it
//! last), its blocks in order in one bash, as its reader pastes them. What
//! differs, and why:
//! * step 1's `docker build` and `docker push` (`sh,step,build`) are not run:
//!   no registry is reachable here. The node tier built the image from this
//!   tree and put it in the node's containerd under the name and tag those
//!   lines push (`registry.example.net/choria-provisioner:0.1.0-<commit>`,
//!   the tag from the page's own `TAG` line), where the chart and the fleet
//!   find it as a pulled image;
//! * the reader's clone is a local `git clone` of this repository (so the
//!   `TAG` line names the same commit) with the files the page reads taken
//!   from the working tree, and the shell starts in it (the page's paths are
//!   relative to the repository's root);
//! * step 7's local port 8080 is a free one.
//!
//! What the page assumes of the cluster (cert-manager, cluster DNS and
//! Services, the `nats:2.10` image) the node tier adds before this runs
//! (`scripts/node-tier/quick-start.sh`).

use crate::support::free_port;
use crate::support::page::{blocks, script, tail_of, Block, Shell};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const PAGE: &str = "docs/src/quick-start/kubernetes.md";

/// The files of the working tree the page reads, copied over the clone.
const READ: [&str; 2] = [
    "charts/choria-provisioner-operator",
    "docs/src/examples/kubernetes",
];

/// A clone of this repository at HEAD in `dir`, with the page's files as
/// they are in the working tree.
fn reader_clone(repo: &Path, dir: &Path) -> PathBuf {
    let clone = dir.join("choria-provisioner-rs");
    let ok = Command::new("git")
        .args(["clone", "--quiet", "--shared"])
        .arg(repo)
        .arg(&clone)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git clone of {}", repo.display());
    for path in READ {
        let target = clone.join(path);
        std::fs::remove_dir_all(&target).unwrap();
        let ok = Command::new("cp")
            .arg("-a")
            .arg(repo.join(path))
            .arg(&target)
            .status()
            .unwrap()
            .success();
        assert!(ok, "copying {path}");
    }
    clone
}

#[test]
#[ignore = "run by scripts/node-tier.sh on its cluster"]
fn the_kubernetes_quick_start_on_a_real_kubelet() {
    let var =
        |k: &str| PathBuf::from(std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set")));
    let kubeconfig = var("NODE_TIER_KUBECONFIG");
    let kubectl = var("NODE_TIER_KUBECTL");
    let helm = var("NODE_TIER_HELM");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join(PAGE)).unwrap();
    let steps: Vec<Block> = blocks(&page)
        .into_iter()
        .filter(|b| b.is(&["step"]) && !b.is(&["build"]))
        .collect();
    assert!(steps.len() >= 7, "{PAGE}: only {} step blocks", steps.len());
    let shell = Shell::new(&[("kubectl", &kubectl), ("helm", &helm)]);
    let clone = reader_clone(repo, shell.work.path());
    // Only the local side of the port-forward moves.
    let port = free_port().to_string();
    let ports = [
        ("8080:8080", format!("{port}:8080")),
        ("localhost:8080", format!("localhost:{port}")),
    ];
    let text = format!("cd \"$REPO\"\n{}", script(&steps, &ports, 300));
    let ran = shell.run(
        &text,
        &[("REPO", &clone), ("KUBECONFIG", &kubeconfig)],
        Duration::from_secs(1200),
    );
    if let Err(e) = ran {
        panic!(
            "{PAGE}: {e}\nthe page's shell:\n{}",
            tail_of(&shell.out(), 60)
        );
    }
    // What the page tells its reader to expect: 50 provisioned, the metrics
    // its last block greps for, and on the leader (the port-forward reaches
    // any replica) every node's certificate issued and no provisioning error.
    let out = std::fs::read_to_string(shell.out()).unwrap();
    println!("{}", tail_of(&shell.out(), 25));
    let kubectl_out = |args: &[&str]| {
        let o = Command::new(&kubectl)
            .env("KUBECONFIG", &kubeconfig)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "kubectl {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let status = |path: &str| {
        kubectl_out(&[
            "-n",
            "choria",
            "get",
            "prov",
            "quickstart",
            "-o",
            &format!("jsonpath={{{path}}}"),
        ])
    };
    assert_eq!(status(".status.provisioned"), "50", "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("choria_provisioner_leader")),
        "the metrics block printed nothing:\n{out}"
    );
    let leader = status(".status.leader");
    let metrics = kubectl_out(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/choria/pods/{leader}:8080/proxy/metrics"),
    ]);
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{leader} has no {series}:\n{metrics}"))
    };
    assert_eq!(
        value("choria_provisioner_provision_errors{"),
        0.0,
        "provisioning errors on the leader {leader}"
    );
    assert!(
        value("choria_provisioner_cert_manager_requests{outcome=\"issued\"") >= 50.0,
        "certificates issued through the leader {leader}:\n{metrics}"
    );
}
