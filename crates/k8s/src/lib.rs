//! Kubernetes in one place both sides use: the `Provisioner` resource
//! ([`crd`]), which the operator builds from and a pod follows, and small
//! helpers shared by the operator, the Lease election and a pod's link to
//! its `Provisioner`: the process's one client, error text that never
//! carries secrets, the pod's namespace; and cert-manager's
//! [`certificate_request`], typed with the fields we write and read.

pub mod certificate_request;
pub mod crd;

use std::path::Path;
use std::sync::Arc;

/// The process's one Kubernetes client, made once by the binary and passed
/// to every part that talks to the API server (the Lease election, the
/// link to its Provisioner, cert-manager, the operator), so they share its
/// connection pool and credentials. When it could not be made, the reason
/// is kept instead: only what needs Kubernetes fails, with that reason.
#[derive(Clone)]
pub struct Kube(Result<kube::Client, Arc<str>>);

impl Kube {
    /// Found as kubectl finds its configuration (`KUBECONFIG`,
    /// `~/.kube/config`, else the pod's service account). Nothing is
    /// connected to yet.
    pub async fn from_environment() -> Self {
        Kube(
            kube::Client::try_default()
                .await
                .map_err(|e| Arc::from(describe_error(&e))),
        )
    }

    /// This client (tests, the operator's own).
    pub fn from_client(client: kube::Client) -> Self {
        Kube(Ok(client))
    }

    /// No client, for `reason` (a process whose configuration needs none).
    pub fn unavailable(reason: &str) -> Self {
        Kube(Err(Arc::from(reason)))
    }

    /// The client, or why there is none.
    pub fn client(&self) -> Result<kube::Client, String> {
        self.0.clone().map_err(|e| e.to_string())
    }
}

/// Where Kubernetes mounts the pod's namespace.
pub const POD_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Status code, reason and message only: never request details, and never
/// an exec credential plugin's output (it may hold a token).
pub fn describe_error(e: &kube::Error) -> String {
    use kube::client::AuthError;
    let exec_failure = |a: &AuthError| match a {
        AuthError::AuthExecRun { cmd, out } => Some(format!(
            "auth exec command '{cmd}' failed with {} (output not shown)",
            out.status
        )),
        _ => None,
    };
    let hidden = match e {
        kube::Error::Api(s) => return format!("{} {}: {}", s.code, s.reason, s.message),
        kube::Error::Auth(a) => exec_failure(a),
        kube::Error::Service(b) => b.downcast_ref::<AuthError>().and_then(exec_failure),
        _ => None,
    };
    hidden.unwrap_or_else(|| e.to_string())
}

/// The namespace to use: `configured`, else the one in `pod_file` (the
/// pod's), else the client's default.
pub fn resolve_namespace(
    configured: Option<&str>,
    pod_file: &Path,
    client_default: &str,
) -> String {
    if let Some(ns) = configured.filter(|n| !n.is_empty()) {
        return ns.to_string();
    }
    std::fs::read_to_string(pod_file)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| client_default.to_string())
}

/// The machine's host name (a pod's name, in Kubernetes).
pub fn hostname_from_proc() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_plugin_output_stays_out_of_errors() {
        use std::os::unix::process::ExitStatusExt;
        let run = || kube::client::AuthError::AuthExecRun {
            cmd: "get-token".into(),
            out: Box::new(std::process::Output {
                status: std::process::ExitStatus::from_raw(256),
                stdout: b"{\"token\":\"s3cr3t\"}".to_vec(),
                stderr: b"s3cr3t".to_vec(),
            }),
        };
        for e in [
            kube::Error::Auth(run()),
            kube::Error::Service(Box::new(run())),
        ] {
            let text = describe_error(&e);
            assert!(text.contains("get-token"), "{text}");
            assert!(!text.contains("s3cr3t"), "{text}");
        }
    }

    #[test]
    fn namespace_configured_then_pod_then_client_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("namespace");
        let missing = dir.path().join("absent");
        assert_eq!(resolve_namespace(Some("cfg"), &file, "dflt"), "cfg");
        assert_eq!(resolve_namespace(None, &missing, "dflt"), "dflt");
        std::fs::write(&file, "pod-ns\n").unwrap();
        assert_eq!(resolve_namespace(None, &file, "dflt"), "pod-ns");
        std::fs::write(&file, "  \n").unwrap();
        assert_eq!(resolve_namespace(None, &file, "dflt"), "dflt");
    }
}
