//! The real cert-manager on a test control plane: its CRDs, a CA `Issuer`
//! and its controllers (issuers, the approver, the CA issuer) from
//! `scripts/build-kube-peers.sh cert-manager` (tests/gopeers/certmanager).

use super::kube::ControlPlane;
use choria_fleet::ca::CertificateAuthority;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The controller binary and the CRD directory.
pub struct Bins {
    pub controller: PathBuf,
    pub crds: PathBuf,
}

/// From `CERT_MANAGER_CONTROLLER_BIN` / `CERT_MANAGER_CRDS` or the project
/// cache; when they were not built, fails the test under CI or says loudly
/// why it proves nothing and returns `None` (see [`super::peers`]).
pub fn available() -> Option<Bins> {
    let cache = std::env::var_os("CHORIA_RS_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/choria-provisioner-rs"))
        })
        .unwrap_or_default();
    let controller = std::env::var_os("CERT_MANAGER_CONTROLLER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("bin/cert-manager-controller"));
    let crds = std::env::var_os("CERT_MANAGER_CRDS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache.join("cert-manager/crds"));
    if controller.is_file() && crds.join("VERSION").is_file() {
        return Some(Bins { controller, crds });
    }
    super::peers::Missing {
        test: &super::peers::current_test(),
        problem: format!(
            "{} or {} is missing",
            controller.display(),
            crds.join("VERSION").display()
        ),
        unproven: "Signing through the real cert-manager",
        advice:
            "Build them with scripts/build-kube-peers.sh cert-manager (~3 min cold), or export\n\
                 CERT_MANAGER_CONTROLLER_BIN and CERT_MANAGER_CRDS.",
        build_log_var: Some("CERT_MANAGER_UNAVAILABLE"),
    }
    .skip()
}

/// cert-manager running with a CA `Issuer` named `issuer` in `namespace`;
/// the controller is killed on drop.
pub struct CertManager {
    child: Child,
    log: PathBuf,
    bins: Bins,
    admin: PathBuf,
    namespace: String,
    /// The Issuer's CA.
    pub ca: CertificateAuthority,
}

impl Drop for CertManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CertManager {
    /// Installs the CRDs, a CA Secret and Issuer in `namespace` (which must
    /// exist) with a CA of its own, starts the controllers logged in as
    /// admin and waits for the Issuer to be Ready.
    pub fn start(
        cp: &ControlPlane,
        bins: &Bins,
        dir: &Path,
        namespace: &str,
        issuer: &str,
    ) -> Self {
        let ca = CertificateAuthority::generate("cert-manager test CA").unwrap();
        let (crt, key) = (dir.join("cm-ca.crt"), dir.join("cm-ca.key"));
        std::fs::write(&crt, ca.cert_pem()).unwrap();
        std::fs::write(&key, ca.key_pem()).unwrap();
        Self::start_with_ca(cp, bins, namespace, issuer, &crt, &key, dir)
    }

    /// [`CertManager::start`] with the CA in these PEM files (say, the one
    /// that signed the broker's certificate).
    pub fn start_with_ca(
        cp: &ControlPlane,
        bins: &Bins,
        namespace: &str,
        issuer: &str,
        crt: &Path,
        key: &Path,
        dir: &Path,
    ) -> Self {
        let ca = CertificateAuthority::from_pem(
            &std::fs::read_to_string(crt).unwrap(),
            &std::fs::read_to_string(key).unwrap(),
        )
        .unwrap();
        // The Issuer CRDs are too big for client-side apply's annotation.
        let out = cp.kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &bins.crds.display().to_string(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        cp.wait_established(&[
            "certificaterequests.cert-manager.io",
            "issuers.cert-manager.io",
        ]);
        cp.kubectl_ok(&[
            "create",
            "secret",
            "tls",
            issuer,
            "-n",
            namespace,
            &format!("--cert={}", crt.display()),
            &format!("--key={}", key.display()),
        ]);
        let manifest = format!(
            "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {{name: {issuer}, namespace: {namespace}}}\nspec:\n  ca: {{secretName: {issuer}}}\n"
        );
        let out = cp.kubectl_stdin(&["apply", "-f", "-"], &manifest);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let admin = cp.kubeconfig(cp.admin_token());
        let log = dir.join("cert-manager.log");
        let child = spawn(bins, &admin, namespace, &log, None);
        let cm = CertManager {
            child,
            log,
            ca,
            bins: Bins {
                controller: bins.controller.clone(),
                crds: bins.crds.clone(),
            },
            admin,
            namespace: namespace.to_string(),
        };
        let out = cp.kubectl(&[
            "wait",
            "--for=condition=Ready",
            &format!("issuer/{issuer}"),
            "-n",
            namespace,
            "--timeout=90s",
        ]);
        assert!(
            out.status.success(),
            "the Issuer did not become Ready: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cm.log_tail()
        );
        cm
    }

    /// Restarts the controllers without cert-manager's approver: requests
    /// then wait for an approval decision (an approval policy's job), which
    /// the test makes itself (see [`deny_pending`]).
    pub fn restart_without_approver(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(
            &self.bins,
            &self.admin,
            &self.namespace,
            &self.log,
            Some("issuers,certificaterequests-issuer-ca"),
        );
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }
}

fn spawn(
    bins: &Bins,
    admin: &Path,
    namespace: &str,
    log: &Path,
    controllers: Option<&str>,
) -> Child {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(&bins.controller);
    cmd.arg(format!("--kubeconfig={}", admin.display()))
        .arg(format!("--cluster-resource-namespace={namespace}"))
        .arg("-v=2");
    if let Some(c) = controllers {
        cmd.arg(format!("--controllers={c}"));
    }
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("starting cert-manager-controller")
}

/// Denies every request in `namespace` that has no approval decision yet,
/// as an approval policy that refuses them would; returns how many.
pub fn deny_pending(cp: &ControlPlane, namespace: &str) -> usize {
    let mut denied = 0;
    for r in requests(cp, namespace) {
        let decided = r["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Approved" || c["type"] == "Denied")
        });
        if decided {
            continue;
        }
        let name = r["metadata"]["name"].as_str().unwrap();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Denied", "status": "True", "reason": "TestPolicy",
            "message": "denied by the test's approval policy",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}});
        let out = cp.kubectl(&[
            "patch",
            "certificaterequest",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ]);
        // It may be gone already (the provisioner deletes what it gave up on).
        if out.status.success() {
            denied += 1;
        }
    }
    denied
}

/// The CertificateRequests in `namespace`.
pub fn requests(cp: &ControlPlane, namespace: &str) -> Vec<Value> {
    let out = cp.kubectl_ok(&["get", "certificaterequests", "-n", namespace, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    v["items"].as_array().cloned().unwrap_or_default()
}

/// Waits until no CertificateRequest is left in `namespace`.
pub fn wait_no_requests(cp: &ControlPlane, namespace: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let left = requests(cp, namespace).len();
        if left == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{left} CertificateRequests were not deleted"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
