//! The real cert-manager on a test control plane: its CRDs, a CA `Issuer`
//! and its controllers (issuers, the approver, the CA issuer) from
//! `scripts/build-kube-peers.sh cert-manager` (tests/gopeers/certmanager).

use super::kube::ControlPlane;
use choria_provisioner::fleet::ca::CertificateAuthority;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The controller binary and the CRD directory.
pub struct Bins {
    pub controller: PathBuf,
    pub crds: PathBuf,
}

/// From `CERT_MANAGER_CONTROLLER_BIN` / `CERT_MANAGER_CRDS` or the project
/// cache; `None` with a loud banner when they were not built.
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
    let thread = std::thread::current();
    let bar = "!".repeat(78);
    let _ = writeln!(
        std::io::stderr(),
        "\n{bar}\n!!! {}: NOT RUN — {} or {} is missing.\n\
         !!! Build them with scripts/build-kube-peers.sh cert-manager (~3 min cold).\n{bar}\n",
        thread.name().unwrap_or("cert-manager test"),
        controller.display(),
        crds.display()
    );
    None
}

/// cert-manager running with a CA `Issuer` named `issuer` in `namespace`;
/// the controller is killed on drop.
pub struct CertManager {
    child: Child,
    log: PathBuf,
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
        cp.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/certificaterequests.cert-manager.io",
            "crd/issuers.cert-manager.io",
            "--timeout=60s",
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
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(&bins.controller)
            .arg(format!("--kubeconfig={}", admin.display()))
            .arg(format!("--cluster-resource-namespace={namespace}"))
            .arg("-v=2")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting cert-manager-controller");
        let cm = CertManager { child, log, ca };
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

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(25)..].join("\n")
    }
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
