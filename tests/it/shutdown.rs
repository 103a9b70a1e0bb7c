//! SIGTERM while the broker is gone: `run` and `fleet` exit within the
//! documented limit (2 s) however the broker behaves, and a Lease leader
//! still releases its Lease on the way out (the API server is reachable
//! when NATS is not).
//!
//! async-nats reconnects for ever and its `flush` waits for a connection, so
//! before these fixes both processes logged their shutdown and stayed up
//! until killed.

use crate::support::kube::ControlPlane;
use crate::support::provisioner::{binary, http_get, send_signal, ProvisionerProcess};
use crate::support::NatsServer;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The provisioning flow ("Pausing and stopping"): on SIGTERM/SIGINT the process exits
/// within 2 s whatever the broker does.
/// The process bounds its own shutdown at 1.5 s (`SHUTDOWN_LIMIT`) plus a
/// 100 ms runtime shutdown, but does not come near that here: measured on
/// this machine (3 runs, load average 8 on 2 cores) `run` with busy workers
/// exited 0.61-0.65 s after SIGTERM, `run` never connected 3-23 ms, `fleet`
/// 0.52-0.53 s, the Lease leader 0.32-0.33 s, so the limit leaves at least
/// 1.35 s for a slower moment. The signal is sent from the test process
/// (kill(2), no kill(1) to spawn), so the time is the process's own.
const LIMIT: Duration = Duration::from_secs(2);

fn choria_cfg(nats: &NatsServer) -> String {
    format!(
        "identity = provisioner.shutdown\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        nats.url()
    )
}

/// A helper that takes 300 ms per node, so workers are busy when the
/// broker goes.
fn slow_helper(dir: &Path) -> String {
    let path = dir.join("slow-helper.sh");
    std::fs::write(
        &path,
        format!("#!/bin/sh\nsleep 0.3\nexec {} fleet-helper\n", binary()),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&path)
        .status()
        .unwrap();
    path.display().to_string()
}

/// Waits until `/readyz` fails because of the broker.
fn wait_not_ready(p: &ProvisionerProcess, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = http_get(p.monitor_port, "/readyz");
        if status != 200 && body.contains("broker") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} {body:?} after the broker went; log:\n{}",
            p.logs_tail(30)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Signals TERM and returns how long the process took to exit.
fn term_and_time(p: &mut ProvisionerProcess) -> (Duration, std::process::ExitStatus) {
    let t = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(30));
    let took = t.elapsed();
    println!("exited {took:?} after SIGTERM");
    (took, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_within_the_limit_after_sigterm_with_the_broker_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    let fleet = crate::support::RunningFleet::start(choria_fleet::FleetOptions {
        broker: choria_wire::client::BrokerOptions::at([nats.url()]),
        nodes: 400,
        key_pool_size: 1,
        journal: Some(dir.path().join("journal.jsonl")),
        ..Default::default()
    })
    .await;
    let yaml = format!(
        "workers: 8\nhelper: {}\nchoria_insecure: true\nloglevel: debug\nrpc_timeout: 2s\n",
        slow_helper(dir.path())
    );
    let mut p = ProvisionerProcess::start(dir.path(), &yaml, &choria_cfg(&nats), &[]);
    p.wait_for_metric(
        "choria_provisioner_provisioned",
        8.0,
        Duration::from_secs(60),
    )
    .await;
    // Workers are in the middle of nodes (helper or RPC) when the broker goes.
    nats.stop();
    wait_not_ready(&p, Duration::from_secs(10));
    let (took, status) = term_and_time(&mut p);
    assert!(status.success(), "exit status {status}");
    assert!(
        took <= LIMIT,
        "took {took:?} to exit after SIGTERM with the broker gone; log:\n{}",
        p.logs_tail(30)
    );
    let logs = p.logs();
    assert!(logs.contains("shutting down"), "{}", p.logs_tail(20));
    assert!(logs.contains("stopped"), "{}", p.logs_tail(20));
    drop(fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_within_the_limit_when_the_broker_never_came_up() {
    // Never connected: the connect loop must give way to the signal too.
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    nats.stop();
    let yaml = "helper: /bin/true\nchoria_insecure: true\nloglevel: debug\n";
    let mut p = ProvisionerProcess::start(dir.path(), yaml, &choria_cfg(&nats), &[]);
    wait_not_ready(&p, Duration::from_secs(10));
    let (took, status) = term_and_time(&mut p);
    assert!(status.success(), "exit status {status}");
    assert!(took <= LIMIT, "took {took:?}; log:\n{}", p.logs_tail(30));
}

#[test]
fn fleet_exits_within_the_limit_after_sigterm_with_the_broker_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    let log = dir.path().join("fleet.log");
    let mut child = Command::new(binary())
        .args(["fleet", "--nodes", "200", "--key-pool", "1", "--nats"])
        .arg(nats.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("fleet started")
    {
        assert!(Instant::now() < deadline, "the fleet did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    nats.stop();
    // Let it notice and start reconnecting.
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    send_signal(child.id(), "TERM");
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!(
                "the fleet did not exit; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t.elapsed();
    println!("the fleet exited {took:?} after SIGTERM");
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(
        took <= LIMIT,
        "the fleet took {took:?} to exit after SIGTERM"
    );
    let summary: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert_eq!(summary["nodes"], 200, "{summary}");
}

fn lease_holder(cp: &ControlPlane) -> String {
    cp.kubectl_ok(&[
        "get",
        "lease",
        "shutdown-test",
        "-n",
        "default",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_leader_releases_its_lease_on_sigterm_with_the_broker_gone() {
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let cp = ControlPlane::start(&bins);
    let dir = tempfile::tempdir().unwrap();
    let mut nats = NatsServer::start();
    let kubeconfig = cp.kubeconfig(cp.admin_token());
    let yaml = "helper: /bin/true\nchoria_insecure: true\nloglevel: debug\n\
                election:\n  backend: lease\n  lease_name: shutdown-test\n  lease_namespace: default\n  \
                lease_duration: 30s\n  renew_deadline: 20s\n  retry_period: 1s\n";
    let mut p = ProvisionerProcess::start_with_env(
        dir.path(),
        "provisioner",
        yaml,
        &choria_cfg(&nats),
        &[],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAME", "shutdown-pod-1"),
        ],
    );
    p.wait_for_metric("choria_provisioner_leader", 1.0, Duration::from_secs(30))
        .await;
    let holder = lease_holder(&cp);
    assert!(holder.starts_with("shutdown-pod-1"), "holder {holder:?}");
    nats.stop();
    wait_not_ready(&p, Duration::from_secs(10));
    let (took, status) = term_and_time(&mut p);
    assert!(status.success(), "exit status {status}");
    assert!(took <= LIMIT, "took {took:?}; log:\n{}", p.logs_tail(30));
    // Released, not left to expire after 30 s: a standby takes over at once.
    let holder = lease_holder(&cp);
    assert_eq!(holder.trim(), "", "the Lease still names a holder");
    assert!(
        p.logs().contains("released leadership"),
        "{}",
        p.logs_tail(30)
    );
}
