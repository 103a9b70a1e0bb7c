//! A real Kubernetes control plane for integration tests: etcd and
//! kube-apiserver (built by `scripts/build-kube-peers.sh`, see
//! tests/kubepeers/README.md) on free loopback ports in a temporary directory.
//! There is no kubelet, scheduler or controller-manager: Pods never run,
//! namespaces are never finalized and nothing is garbage collected, which is
//! fine for CRD, status, finalizer, Lease, Event and RBAC tests.
//!
//! ```ignore
//! let Some(bins) = ControlPlane::available() else { return };
//! let cp = ControlPlane::start(&bins);
//! cp.kubectl_ok(&["create", "namespace", "demo"]);
//! let out = cp.kubectl_as(cp.operator_token(), &["get", "leases", "-n", "demo"]);
//! ```
//!
//! The processes die with the thread that started them (`setpriv --pdeathsig`),
//! so start the control plane on the test's own thread: not in a `static`
//! shared between tests, nor in `spawn_blocking` (whose threads exit when idle).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::free_port;

/// How long etcd plus kube-apiserver may take to become ready; ~3 s on an idle
/// 2-core machine, much more when cargo builds run next to the test.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Paths of the three binaries.
#[derive(Clone, Debug)]
pub struct Bins {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
}

/// A running etcd + kube-apiserver pair, killed on drop.
pub struct ControlPlane {
    bins: Bins,
    etcd: Child,
    apiserver: Child,
    /// How kube-apiserver was started, to start it again.
    apiserver_args: Vec<String>,
    port: u16,
    admin_token: String,
    operator_token: String,
    admin_kubeconfig: PathBuf,
    started_in: Duration,
    // last, so that it is removed after the processes are gone
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// The binaries from `$ETCD_BIN`, `$KUBE_APISERVER_BIN`, `$KUBECTL_BIN` or
    /// the project cache; when one is missing, fails the test under CI or
    /// says loudly why it proves nothing and returns `None` (see
    /// [`super::peers`]).
    pub fn available() -> Option<Bins> {
        let cache = std::env::var_os("CHORIA_RS_CACHE")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/choria-provisioner-rs"))
            })
            .unwrap_or_default()
            .join("bin");
        let mut problems = Vec::new();
        let mut find = |var: &str, name: &str| -> PathBuf {
            let (path, source) = match std::env::var_os(var) {
                Some(p) => (PathBuf::from(p), format!("{var}=")),
                None => (cache.join(name), format!("{var} is not set and ")),
            };
            if !path.is_file() {
                problems.push(format!("{source}{} does not exist", path.display()));
            }
            path
        };
        let bins = Bins {
            etcd: find("ETCD_BIN", "etcd"),
            kube_apiserver: find("KUBE_APISERVER_BIN", "kube-apiserver"),
            kubectl: find("KUBECTL_BIN", "kubectl"),
        };
        if problems.is_empty() {
            return Some(bins);
        }
        super::peers::Missing {
            test: &super::peers::current_test(),
            problem: problems.join("; "),
            unproven: "The Kubernetes control-plane tier",
            advice: "Build etcd, kube-apiserver and kubectl with scripts/build-kube-peers.sh\n\
                     (~8 min cold on 2 cores, into $HOME/.cache/choria-provisioner-rs/bin),\n\
                     or export ETCD_BIN, KUBE_APISERVER_BIN and KUBECTL_BIN.",
            build_log_var: Some("KUBE_PEERS_UNAVAILABLE"),
        }
        .skip()
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` passes.
    /// Panics with the end of their logs when they do not come up.
    pub fn start(bins: &Bins) -> Self {
        let mut last = String::new();
        // free_port() only finds a port that was free a moment ago: another
        // test may take it first, so a lost bind race is retried.
        for _ in 0..3 {
            match Self::try_start(bins) {
                Ok(cp) => return cp,
                Err(e) if e.contains("address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("{last}")
    }

    fn try_start(bins: &Bins) -> Result<Self, String> {
        let began = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("kube-cp-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        let d = dir.path();
        let (client, peer, port) = (free_port(), free_port(), free_port());
        let sa_key = service_account_key(d)?;
        let (admin_token, operator_token, tokens) = token_file(d)?;
        let deadline = began + READY_TIMEOUT;
        let (mut etcd, etcd_url) = start_etcd(bins, d, client, peer, deadline)?;
        let apiserver_args = apiserver_args(d, &etcd_url, port, &sa_key, &tokens);
        let apiserver = spawn(
            &bins.kube_apiserver,
            &d.join("kube-apiserver.log"),
            &apiserver_args,
        );
        let apiserver = match apiserver {
            Ok(c) => c,
            Err(e) => {
                let _ = etcd.kill();
                let _ = etcd.wait();
                return Err(e);
            }
        };

        let mut cp = ControlPlane {
            bins: bins.clone(),
            etcd,
            apiserver,
            apiserver_args,
            port,
            admin_kubeconfig: PathBuf::new(),
            admin_token,
            operator_token,
            started_in: Duration::ZERO,
            dir,
        };
        cp.wait_ready(deadline)?;
        cp.started_in = began.elapsed();
        eprintln!(
            "kube control plane ready at {} in {:.1?} (dir {})",
            cp.server_url(),
            cp.started_in,
            cp.dir.path().display()
        );
        Ok(cp)
    }

    /// Waits for kube-apiserver: its certificate written, its port open,
    /// then `/readyz`; sets the admin kubeconfig on the way.
    fn wait_ready(&mut self, deadline: Instant) -> Result<(), String> {
        let port = self.port;
        // The CA is only known once kube-apiserver has written its certificate.
        let crt = self.dir.path().join("certs/apiserver.crt");
        loop {
            let log = self.apiserver_log_path();
            if let Some(e) = exited(&mut self.apiserver, "kube-apiserver", &log) {
                return Err(e);
            }
            if crt.is_file() && TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err(self.not_ready("did not listen"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.admin_kubeconfig = self.kubeconfig(&self.admin_token.clone());
        loop {
            let out = self.kubectl(&["get", "--raw=/readyz", "--request-timeout=5s"]);
            if out.status.success() {
                break;
            }
            let log = self.apiserver_log_path();
            if let Some(e) = exited(&mut self.apiserver, "kube-apiserver", &log) {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(&format!(
                    "/readyz did not pass: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Kills kube-apiserver (etcd keeps the data).
    pub fn stop_apiserver(&mut self) {
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
    }

    /// Starts kube-apiserver again on the same port and certificates and
    /// waits until it is ready.
    pub fn restart_apiserver(&mut self) {
        self.stop_apiserver();
        self.apiserver = spawn(
            &self.bins.kube_apiserver,
            &self.apiserver_log_path(),
            &self.apiserver_args,
        )
        .unwrap_or_else(|e| panic!("restarting kube-apiserver: {e}"));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let out = self.kubectl(&["get", "--raw=/readyz", "--request-timeout=5s"]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}",
                self.not_ready("did not come back")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn not_ready(&self, what: &str) -> String {
        format!(
            "kube-apiserver at {} {what} within {READY_TIMEOUT:?}\n--- kube-apiserver log (end):\n{}\n--- etcd log (end):\n{}",
            self.server_url(),
            tail(&self.apiserver_log_path()),
            tail(&self.dir.path().join("etcd.log"))
        )
    }

    /// `https://127.0.0.1:<port>`
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Bearer token of user `admin` in group `system:masters` (all rights).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Bearer token of user `operator`, in no group: it may do nothing beyond
    /// discovery until a test binds it a (Cluster)Role with `--user=operator`.
    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }

    /// The PEM certificate chain kube-apiserver serves (self-signed); its CA
    /// verifies the server for 127.0.0.1.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.path().join("certs/apiserver.crt"))
            .expect("kube-apiserver's certificate")
    }

    /// Writes a kubeconfig that logs in with `token` and verifies the server
    /// with its CA, and returns its path (the same path for the same token).
    pub fn kubeconfig(&self, token: &str) -> PathBuf {
        let user = if token == self.admin_token {
            "admin".to_string()
        } else if token == self.operator_token {
            "operator".to_string()
        } else {
            // any other token (say, a ServiceAccount's): a name from its hash
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            token.hash(&mut h);
            format!("token-{:016x}", h.finish())
        };
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem());
        let text = format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\n\
             contexts:\n- name: {user}@test\n  context:\n    cluster: test\n    user: {user}\n    namespace: default\n\
             current-context: {user}@test\n",
            self.server_url()
        );
        let path = self.dir.path().join(format!("{user}.kubeconfig"));
        std::fs::write(&path, text).expect("writing a kubeconfig");
        path
    }

    /// The kubeconfig of `admin` (system:masters), for commands a test runs
    /// as the cluster's administrator would.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Runs kubectl as `admin`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(&self.admin_kubeconfig, args, None)
    }

    /// Runs kubectl as `admin` and returns its stdout; panics with its output
    /// when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        expect_ok(args, self.kubectl(args))
    }

    /// Waits until each CRD is Established. `kubectl wait` fails at once
    /// (".status.conditions accessor error: <nil>") when asked before the
    /// apiserver wrote the CRD's first status, so this asks until it holds.
    pub fn wait_established(&self, crds: &[&str]) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for crd in crds {
            let path = "jsonpath={.status.conditions[?(@.type==\"Established\")].status}";
            loop {
                let out = self.kubectl(&["get", &format!("crd/{crd}"), "-o", path]);
                if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "True" {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "crd/{crd} not Established within 60 s: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }

    /// Runs kubectl as `admin` with `input` on its stdin (`apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        self.kubectl_with(&self.admin_kubeconfig, args, Some(input))
    }

    /// Runs kubectl logged in with `token`.
    pub fn kubectl_as(&self, token: &str, args: &[&str]) -> Output {
        self.kubectl_with(&self.kubeconfig(token), args, None)
    }

    /// Runs kubectl with the kubeconfig at `kubeconfig`, optionally feeding
    /// `input` on its stdin.
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Output {
        let mut child = Command::new(&self.bins.kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            // A discovery cache of our own: the ~/.kube one is keyed by
            // host:port, and a port reused by a later run would serve it
            // stale resource lists (CRDs "not found").
            .env("KUBECACHEDIR", self.dir.path().join("kube-cache"))
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", self.bins.kubectl.display()));
        if let Some(text) = input {
            let mut stdin = child.stdin.take().expect("kubectl stdin");
            // kubectl may exit before reading it all; its output says why
            let _ = stdin.write_all(text.as_bytes());
        }
        child.wait_with_output().expect("kubectl output")
    }

    fn apiserver_log_path(&self) -> PathBuf {
        self.dir.path().join("kube-apiserver.log")
    }

    /// How long etcd and kube-apiserver took to become ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }
}

/// A fresh RSA key in `d`: one private key serves both to sign
/// service-account tokens and, as --service-account-key-file accepts
/// private keys, to verify them.
fn service_account_key(d: &Path) -> Result<PathBuf, String> {
    let sa_key = d.join("sa.key");
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&sa_key)
        .output()
        .map_err(|e| format!("openssl is needed for the service-account key: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl genpkey failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }

    Ok(sa_key)
}

/// The static token file in `d`: (the admin's token, the operator's, the file).
/// Random tokens: nothing outside this test can guess its way in.
fn token_file(d: &Path) -> Result<(String, String, PathBuf), String> {
    let admin_token = format!("admin-{}", uuid::Uuid::new_v4().simple());
    let operator_token = format!("operator-{}", uuid::Uuid::new_v4().simple());
    let tokens = d.join("tokens.csv");
    std::fs::write(
        &tokens,
        // token,user,uid,"groups"; the operator is in no group, so RBAC
        // grants it only what every authenticated user gets (discovery).
        format!(
            "{admin_token},admin,admin,\"system:masters\"\n{operator_token},operator,operator\n"
        ),
    )
    .map_err(|e| format!("writing {}: {e}", tokens.display()))?;

    Ok((admin_token, operator_token, tokens))
}

/// Starts etcd on `client` and `peer` and waits until it is healthy: the
/// process and its client URL.
fn start_etcd(
    bins: &Bins,
    d: &Path,
    client: u16,
    peer: u16,
    deadline: Instant,
) -> Result<(Child, String), String> {
    let etcd_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut etcd = spawn(
        &bins.etcd,
        &d.join("etcd.log"),
        &[
            "--name=default".into(),
            format!("--data-dir={}", d.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // test data need not survive a power cut; fsync is most of
            // etcd's latency on a busy disk
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ],
    )?;
    // Started before etcd answers, kube-apiserver only logs dial errors
    // and retries; waiting keeps its log readable.
    loop {
        if http_get_ok(client, "/health") {
            break;
        }
        if let Some(e) = exited(&mut etcd, "etcd", &d.join("etcd.log")) {
            return Err(e);
        }
        if Instant::now() > deadline {
            let _ = etcd.kill();
            let _ = etcd.wait();
            return Err(format!(
                "etcd did not become healthy on {etcd_url} in {READY_TIMEOUT:?}:\n{}",
                tail(&d.join("etcd.log"))
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    Ok((etcd, etcd_url))
}

/// kube-apiserver's command line for a lone server on `port` over etcd.
fn apiserver_args(
    d: &Path,
    etcd_url: &str,
    port: u16,
    sa_key: &Path,
    tokens: &Path,
) -> Vec<String> {
    let server = format!("https://127.0.0.1:{port}");
    vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // needed when the machine has no default route
        "--advertise-address=127.0.0.1".into(),
        // no kube-proxy/endpoints to maintain for a lone apiserver
        "--endpoint-reconciler-type=none".into(),
        // serving certificate self-signed into this directory
        format!("--cert-dir={}", d.join("certs").display()),
        format!("--service-account-issuer={server}"),
        format!("--service-account-key-file={}", sa_key.display()),
        format!("--service-account-signing-key-file={}", sa_key.display()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--authorization-mode=RBAC".into(),
        format!("--token-auth-file={}", tokens.display()),
        // no controller-manager creates the default ServiceAccounts
        // this plugin would insist on (as in envtest)
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
    ]
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // apiserver first: killed after etcd, it would log etcd errors
        for child in [&mut self.apiserver, &mut self.etcd] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// kubectl's stdout, or a panic showing what it was asked and what it said.
pub fn expect_ok(args: &[&str], out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Spawns `bin args` with its output appended to `log`, killed with the
/// spawning thread by `setpriv --pdeathsig` even when Drop never runs.
fn spawn(bin: &Path, log: &Path, args: &[String]) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", bin.display()))
}

/// `Some(reason)` when `child` has already exited.
fn exited(child: &mut Child, name: &str, log: &Path) -> Option<String> {
    match child.try_wait() {
        Ok(Some(status)) => Some(format!("{name} exited ({status}):\n{}", tail(log))),
        _ => None,
    }
}

/// The last 40 lines of a log file.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A plain-HTTP GET on loopback that answers 200 (etcd's /health).
fn http_get_ok(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200")
}
