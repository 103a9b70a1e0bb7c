//! The operator tiers' harness on the real control plane of
//! [`super::kube`]: the operator and provisioner "pods" as child processes
//! (a simulated kubelet materializes a Deployment the operator wrote),
//! kubectl helpers, and what the operator's objects look like.

use super::kube::{expect_ok, Bins, ControlPlane};
use super::provisioner::{binary, http_get, metric_sum};
use super::{free_port, NatsServer};
use base64::Engine as _;
use choria_operator::build::{CONFIG_DIR, PROVISIONER_YAML};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where deploy/rbac.yaml puts the operator.
pub const OPERATOR_NS: &str = "choria-provisioner";
pub const OPERATOR_SA: &str = "choria-provisioner-operator";
/// The operator's pod name (its Lease identity).
pub const OPERATOR_POD: &str = "choria-provisioner-operator-5d8c7b9f4-qx7lm";
pub const PROV: &str = "provisioners.provisioning.choria.io";
/// The Provisioners' namespace.
pub const NS: &str = "choria";
/// The fleet's provisioning token, from a Secret.
pub const TOKEN: &str = "s3cret";

pub fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Polls `f` every 100 ms until it returns `Some`; panics naming `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------- kubectl

pub fn apply(cp: &ControlPlane, manifest: &str) {
    expect_ok(
        &["apply", "-f", "-"],
        cp.kubectl_stdin(&["apply", "-f", "-"], manifest),
    );
}

/// The object as JSON, `None` when it does not exist.
pub fn try_get(cp: &ControlPlane, kind: &str, ns: &str, name: &str) -> Option<Value> {
    let out = cp.kubectl(&[
        "get",
        kind,
        name,
        "-n",
        ns,
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    if out.status.success() {
        return Some(serde_json::from_slice(&out.stdout).expect("kubectl JSON"));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NotFound"),
        "kubectl get {kind} {ns}/{name}: {err}"
    );
    None
}

pub fn get(cp: &ControlPlane, kind: &str, ns: &str, name: &str) -> Value {
    try_get(cp, kind, ns, name).unwrap_or_else(|| panic!("{kind} {ns}/{name} does not exist"))
}

pub fn patch_spec(cp: &ControlPlane, name: &str, spec: Value) {
    let patch = json!({ "spec": spec }).to_string();
    cp.kubectl_ok(&["patch", PROV, name, "-n", NS, "--type=merge", "-p", &patch]);
}

/// A token of ServiceAccount `ns/sa` from the TokenRequest API.
pub fn create_token(cp: &ControlPlane, ns: &str, sa: &str) -> String {
    cp.kubectl_ok(&["create", "token", sa, "-n", ns, "--duration=2h"])
        .trim()
        .to_string()
}

/// `kubectl auth can-i` as the identity of `kubeconfig`.
pub fn can_i(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    let out = cp.kubectl_with(kubeconfig, &all, None);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// The RBAC authorizer learns of bindings through a watch: not at once.
pub fn wait_allowed(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) {
    wait_for(
        &format!("RBAC to allow {args:?}"),
        Duration::from_secs(20),
        || can_i(cp, kubeconfig, args).then_some(()),
    );
}

// ------------------------------------------------------------ processes

/// A child process (operator or pod) with its log in a file and its
/// monitoring port, killed on drop and with the test's thread.
pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    pub port: u16,
}

impl Proc {
    pub fn spawn(
        name: &str,
        dir: &Path,
        port: u16,
        args: &[String],
        env: &[(String, String)],
    ) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(binary());
            c
        } else {
            Command::new(binary())
        };
        // Nothing of the test's own environment may steer the process.
        for var in [
            "KUBECONFIG",
            "POD_NAME",
            "POD_NAMESPACE",
            "CHORIA_PROVISIONER_RESOURCE",
            "CHORIA_PROVISIONER_OPERATOR_NAMESPACE",
            "CHORIA_PROVISIONER_LOG",
            "CHORIA_PROVISIONER_LOG_FORMAT",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary()));
        let mut p = Proc {
            name: name.into(),
            child,
            log,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!(
                    "{name} exited ({status}) before opening port {port}:\n{}",
                    p.tail(40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "{name}: port {port} did not open:\n{}",
                p.tail(40)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        p
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (status, body) = http_get(self.port, "/metrics");
        assert_eq!(status, 200, "{}: /metrics answered {status}", self.name);
        metric_sum(&body, name)
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn tail(&self, n: usize) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {} failed", self.name);
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}:\n{}",
                self.name,
                self.tail(30)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- cluster

/// A control plane with the CRD, the chart's RBAC and a running operator.
pub struct Cluster {
    pub operator: Proc,
    pub operator_kubeconfig: PathBuf,
    // Dropped after the processes above, before the control plane.
    pub dir: tempfile::TempDir,
    pub cp: ControlPlane,
}

impl Cluster {
    pub fn start(bins: &Bins) -> Self {
        let cp = ControlPlane::start(bins);
        // OPERATOR_E2E_KEEP=1 keeps the logs and the journal for a post-mortem.
        let keep = std::env::var_os("OPERATOR_E2E_KEEP").is_some();
        let dir = tempfile::Builder::new()
            .prefix("operator-e2e-")
            .disable_cleanup(keep)
            .tempdir()
            .unwrap();
        if keep {
            eprintln!("OPERATOR_E2E_KEEP: {}", dir.path().display());
        }
        install_crd(&cp);
        apply(&cp, &repo_file("deploy/rbac.yaml"));
        let token = create_token(&cp, OPERATOR_NS, OPERATOR_SA);
        let kubeconfig = cp.kubeconfig(&token);
        // The operator lists Provisioners first and exits when it may not.
        wait_allowed(&cp, &kubeconfig, &["list", PROV, "--all-namespaces"]);
        let operator = spawn_operator(dir.path(), "operator", OPERATOR_POD, &kubeconfig, &[]);
        wait_for(
            "the operator to lead (chart Role on its Lease)",
            Duration::from_secs(30),
            || (operator.metric("choria_provisioner_operator_leader") == 1.0).then_some(()),
        );
        Cluster {
            operator,
            operator_kubeconfig: kubeconfig,
            dir,
            cp,
        }
    }

    pub fn provisioner(&self, name: &str) -> Value {
        get(&self.cp, PROV, NS, name)
    }

    /// The Provisioner once the operator has acted on its current
    /// generation (status and every condition say so).
    pub fn observed(&self, name: &str) -> Value {
        wait_for(
            &format!("the operator to observe Provisioner {name}"),
            Duration::from_secs(30),
            || {
                let p = self.provisioner(name);
                let generation = &p["metadata"]["generation"];
                let conditions = p["status"]["conditions"].as_array()?;
                let current = p["status"]["observedGeneration"] == *generation
                    && conditions.iter().any(|c| c["type"] == "Degraded")
                    && conditions
                        .iter()
                        .all(|c| c["observedGeneration"] == *generation);
                current.then_some(p)
            },
        )
    }

    /// A namespace for Provisioners; pods there must meet Pod Security
    /// "restricted", as in deploy/example-provisioner.yaml.
    pub fn create_namespace(&self) {
        apply(
            &self.cp,
            &format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n  labels:\n    \
                 pod-security.kubernetes.io/enforce: restricted\n    \
                 pod-security.kubernetes.io/enforce-version: latest\n"
            ),
        );
    }

    pub fn operator_failures(&self) -> f64 {
        self.operator
            .metric("choria_provisioner_operator_reconcile_failures_total")
    }
}

/// The committed CRD, which must be accepted and become Established, and
/// the operator's namespace.
pub fn install_crd(cp: &ControlPlane) {
    apply(cp, &repo_file("crds/provisioner.yaml"));
    cp.wait_established(&[PROV]);
    apply(cp, &repo_file("deploy/namespace.yaml"));
}

/// An operator process named `name` (its log file) for the pod `pod`, logged
/// in with `kubeconfig`, with the shipped command line and `extra` args.
pub fn spawn_operator(
    dir: &Path,
    name: &str,
    pod: &str,
    kubeconfig: &Path,
    extra: &[&str],
) -> Proc {
    let port = free_port();
    let mut args = vec!["--log".to_string(), "info".into()];
    args.extend(shipped_operator_args(port));
    args.extend(extra.iter().map(|a| a.to_string()));
    Proc::spawn(
        name,
        dir,
        port,
        &args,
        &[
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            ("POD_NAME".into(), pod.into()),
            ("POD_NAMESPACE".into(), OPERATOR_NS.into()),
        ],
    )
}

/// The operator's command line as deploy/operator.yaml (the chart's default
/// render) gives it, on `port`: the shipped policy and ClusterRole names.
pub fn shipped_operator_args(port: u16) -> Vec<String> {
    let text = repo_file("deploy/operator.yaml");
    let deployment = serde_norway::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment")
        .expect("deploy/operator.yaml has the Deployment");
    operator_args(&deployment, port)
}

/// The operator container's args of `deployment`, listening on `port`.
pub fn operator_args(deployment: &Value, port: u16) -> Vec<String> {
    let mut args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .filter(|a| !a.starts_with("--metrics-port"))
        .collect();
    args.push(format!("--metrics-port={port}"));
    args
}

/// The Event with `reason` about Provisioner `name`, once it exists.
pub fn event_for(cp: &ControlPlane, name: &str, reason: &str) -> Value {
    event_where(cp, name, reason, |_| true)
}

/// The Event with `reason` about Provisioner `name` whose note passes
/// `want`, once it exists; panics with the Events there are.
pub fn event_where(
    cp: &ControlPlane,
    name: &str,
    reason: &str,
    want: impl Fn(&str) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events: Value = serde_json::from_str(&cp.kubectl_ok(&[
            "get",
            "events.v1.events.k8s.io",
            "-n",
            NS,
            "-o",
            "json",
        ]))
        .unwrap();
        let items = events["items"].as_array().cloned().unwrap_or_default();
        if let Some(e) = items.iter().find(|e| {
            e["reason"] == reason
                && e["regarding"]["name"] == name
                && want(e["note"].as_str().unwrap_or_default())
        }) {
            return e.clone();
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = items
                .iter()
                .map(|e| format!("{} {}: {}", e["reason"], e["regarding"]["name"], e["note"]))
                .collect();
            panic!(
                "no such {reason} Event for {name} within 20s; there are:\n{}",
                seen.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn condition<'a>(p: &'a Value, type_: &str) -> &'a Value {
    p["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {}", p["status"]))
}

/// (status, reason) of a condition.
pub fn cond(p: &Value, type_: &str) -> (String, String) {
    let c = condition(p, type_);
    (
        c["status"].as_str().unwrap_or_default().into(),
        c["reason"].as_str().unwrap_or_default().into(),
    )
}

pub fn pair(status: &str, reason: &str) -> (String, String) {
    (status.into(), reason.into())
}

pub fn managers(obj: &Value) -> Vec<(String, String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
            (s("manager"), s("operation"), s("subresource"))
        })
        .collect()
}

// ------------------------------------------------------------------- pods

/// Starts a "pod" of the Deployment as a kubelet would, outside a cluster:
/// each ConfigMap and Secret volume is written under the pod's directory
/// (only the Secret keys the volume lists), `/etc/choria-provisioner/` in the
/// args and mounted files is moved there, the env comes from its fieldRefs,
/// and the ServiceAccount token arrives as a kubeconfig. One change a real
/// pod does not need: its own monitoring port (pods have their own network).
/// The replicas share the Choria identity of the generated choria.cfg, as a
/// Deployment's pods do, and with it the nodes' provisioning lock.
pub fn start_pod(c: &Cluster, deployment: &Value, pod: &str, kubeconfig: &Path) -> Proc {
    let ns = deployment["metadata"]["namespace"].as_str().unwrap();
    let spec = &deployment["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let root = c.dir.path().join(pod);
    let base = "/etc/choria-provisioner/";
    let moved_base = format!("{}{base}", root.display());
    let moved = |s: &str| s.replace(base, &moved_base);
    let volumes = spec["volumes"].as_array().expect("volumes");
    for m in container["volumeMounts"].as_array().expect("volumeMounts") {
        let volume = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume for the mount {m}"));
        let mount = m["mountPath"].as_str().unwrap();
        if volume.get("emptyDir").is_some() {
            assert_eq!(mount, "/tmp", "{m}");
            continue;
        }
        assert!(mount.starts_with(base), "mounted outside {base}: {m}");
        let target = root.join(mount.trim_start_matches('/'));
        std::fs::create_dir_all(&target).unwrap();
        if let Some(source) = volume.get("configMap") {
            let cm = get(&c.cp, "configmap", ns, source["name"].as_str().unwrap());
            for (key, value) in cm["data"].as_object().unwrap() {
                std::fs::write(target.join(key), moved(value.as_str().unwrap())).unwrap();
            }
        } else if let Some(source) = volume.get("secret") {
            let secret = get(&c.cp, "secret", ns, source["secretName"].as_str().unwrap());
            for item in source["items"].as_array().expect("secret items") {
                let key = item["key"].as_str().unwrap();
                let data = base64::engine::general_purpose::STANDARD
                    .decode(secret["data"][key].as_str().unwrap_or_else(|| {
                        panic!("Secret {} has no key {key}", source["secretName"])
                    }))
                    .unwrap();
                std::fs::write(target.join(item["path"].as_str().unwrap()), data).unwrap();
            }
        } else {
            panic!("a volume the test kubelet does not know: {volume}");
        }
    }

    let port = free_port();
    let config = root.join(CONFIG_DIR.trim_start_matches('/'));
    let path = config.join(PROVISIONER_YAML);
    let text = std::fs::read_to_string(&path).unwrap();
    let prefix = "monitor_port:";
    assert_eq!(
        text.lines().filter(|l| l.starts_with(prefix)).count(),
        1,
        "{text}"
    );
    let text: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with(prefix) {
                format!("{prefix} {port}")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, text.join("\n") + "\n").unwrap();

    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| moved(a.as_str().unwrap()))
        .collect();
    let mut env: Vec<(String, String)> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => pod.to_string(),
                Some("metadata.namespace") => ns.to_string(),
                _ => panic!("an env var the test kubelet does not know: {e}"),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect();
    env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    Proc::spawn(pod, c.dir.path(), port, &args, &env)
}

/// Index of the one pod whose leader gauge is 1; panics on two.
pub fn sole_leader(pods: &[Proc], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let leaders: Vec<usize> = (0..pods.len())
            .filter(|i| pods[*i].metric("choria_provisioner_leader") == 1.0)
            .collect();
        assert!(
            leaders.len() <= 1,
            "two leaders at once: {:?}",
            leaders.iter().map(|i| &pods[*i].name).collect::<Vec<_>>()
        );
        if let [i] = leaders[..] {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "no leader within {timeout:?}:\n{}",
            pods.iter()
                .map(|p| format!("--- {}\n{}", p.name, p.tail(15)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A Provisioner for the simulated fleet on `nats`: lease election with short
/// timings, the token from a Secret, the reference helper slowed down so
/// provisioning lasts long enough to pause and fail over in the middle.
pub fn fleet_provisioner(
    c: &Cluster,
    name: &str,
    nats: &NatsServer,
    replicas: i32,
    workers: i32,
    helper_sleep: &str,
    rpc_timeout: &str,
) -> Value {
    fleet_provisioner_with(
        c,
        name,
        nats,
        (replicas, workers),
        helper_sleep,
        rpc_timeout,
        json!({}),
    )
}

/// [`fleet_provisioner`] with `extra` merged into its spec (top-level keys
/// replace the defaults').
pub fn fleet_provisioner_with(
    c: &Cluster,
    name: &str,
    nats: &NatsServer,
    (replicas, workers): (i32, i32),
    helper_sleep: &str,
    rpc_timeout: &str,
    extra: Value,
) -> Value {
    token_secret(&c.cp, name);
    let mut resource = json!({
        "apiVersion": "provisioning.choria.io/v1alpha1",
        "kind": "Provisioner",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "workers": workers,
            "site": "e2e",
            "logLevel": "info",
            "choriaInsecure": true,
            "broker": {"urls": [nats.url()]},
            "tokenSecret": {"name": format!("{name}-token"), "key": "token"},
            "helper": {"command": format!("sh -c 'sleep {helper_sleep}; exec {} fleet-helper'", binary())},
            "rpcTimeout": rpc_timeout,
            "discoveryTimeout": "2s",
            "discoveryWindow": "500ms",
            "election": {
                "backend": "lease",
                "leaseDuration": "4s",
                "renewDeadline": "3s",
                "retryPeriod": "1s",
            },
        },
    });
    for (k, v) in extra.as_object().expect("extra spec fields") {
        resource["spec"][k] = v.clone();
    }
    apply(&c.cp, &resource.to_string());
    let p = c.observed(name);
    assert_eq!(
        cond(&p, "Degraded"),
        pair("False", "AsExpected"),
        "{}",
        p["status"]
    );
    p
}

/// Secret `<name>-token` holding the fleet's provisioning token.
pub fn token_secret(cp: &ControlPlane, name: &str) {
    cp.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        &format!("{name}-token"),
        "-n",
        NS,
        &format!("--from-literal=token={TOKEN}"),
    ]);
}

/// The pods' ServiceAccount token (the operator created the account and bound
/// it to its Role), once RBAC allows what the pods do.
pub fn pod_kubeconfig(c: &Cluster, name: &str) -> PathBuf {
    wait_for(
        "the operator's RoleBinding",
        Duration::from_secs(30),
        || try_get(&c.cp, "rolebinding", NS, name),
    );
    let kubeconfig = c.cp.kubeconfig(&create_token(&c.cp, NS, name));
    let lease = format!("leases.coordination.k8s.io/{name}");
    let own = format!("{PROV}/{name}");
    wait_allowed(&c.cp, &kubeconfig, &["update", &lease, "-n", NS]);
    wait_allowed(
        &c.cp,
        &kubeconfig,
        &["list", "leases.coordination.k8s.io", "-n", NS],
    );
    wait_allowed(&c.cp, &kubeconfig, &["watch", &own, "-n", NS]);
    wait_allowed(
        &c.cp,
        &kubeconfig,
        &["patch", &own, "--subresource=status", "-n", NS],
    );
    // ...and nothing beyond its own objects.
    for denied in [
        vec!["get", "provisioners.provisioning.choria.io/other", "-n", NS],
        vec!["patch", &own, "-n", NS],
        vec!["update", &own, "--subresource=status", "-n", NS],
        vec!["get", "secrets", "-n", NS],
        vec!["create", "leases.coordination.k8s.io", "-n", "default"],
        vec![
            "update",
            "leases.coordination.k8s.io/kube-scheduler",
            "-n",
            "kube-system",
        ],
        // Shards members list and delete Leases, in their namespace only.
        vec![
            "delete",
            "leases.coordination.k8s.io/kube-scheduler",
            "-n",
            "kube-system",
        ],
        vec!["list", "leases.coordination.k8s.io", "-n", "default"],
    ] {
        assert!(
            !can_i(&c.cp, &kubeconfig, &denied),
            "the pods may {denied:?}"
        );
    }
    kubeconfig
}

/// Stands in for the deployment controller: writes the status of
/// Deployment `name` as that controller would, at its current generation.
pub fn set_deployment_status(c: &Cluster, name: &str, replicas: i32, updated: i32, available: i32) {
    let d = get(&c.cp, "deployment", NS, name);
    let status = json!({"status": {
        "observedGeneration": d["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": available,
        "availableReplicas": available,
    }});
    c.cp.kubectl_ok(&[
        "patch",
        "deployment",
        name,
        "-n",
        NS,
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
}

/// A simulated fleet of `nodes` on `nats` for the operator tiers, with the
/// fleet's token and its journal at `journal`.
pub fn fleet_options(
    nats: &NatsServer,
    nodes: usize,
    journal: &Path,
) -> choria_fleet::FleetOptions {
    choria_fleet::FleetOptions {
        broker: choria_wire::client::BrokerOptions::at([nats.url()]),
        nodes,
        token: TOKEN.into(),
        journal: Some(journal.to_path_buf()),
        key_pool_size: 2,
        connections: 4,
        ..Default::default()
    }
}

/// The API server's requests so far, by `verb resource[/subresource]`, from
/// its own `apiserver_request_total`.
pub fn apiserver_requests(cp: &ControlPlane) -> std::collections::BTreeMap<String, f64> {
    apiserver_counts(cp, "apiserver_request_total{")
}

/// The long-running requests (watches) open now, keyed like
/// [`apiserver_requests`]. The apiserver counts a WATCH in
/// `apiserver_request_total` only when it ends, so a watch held open
/// since the start shows here and not there.
pub fn apiserver_open_requests(cp: &ControlPlane) -> std::collections::BTreeMap<String, f64> {
    apiserver_counts(cp, "apiserver_longrunning_requests{")
}

fn apiserver_counts(cp: &ControlPlane, prefix: &str) -> std::collections::BTreeMap<String, f64> {
    let text = cp.kubectl_ok(&["get", "--raw", "/metrics"]);
    let mut requests = std::collections::BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let mut what = format!("{} {}", label("verb"), label("resource"));
        let sub = label("subresource");
        if !sub.is_empty() {
            what = format!("{what}/{sub}");
        }
        *requests.entry(what).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    requests
}
