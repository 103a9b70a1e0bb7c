//! A real JetStream cluster on loopback: three `nats-server` processes with
//! routes to each other, each with a store of its own. A server can be
//! killed as a crash would (`kill -9`), its disk wiped, and started again
//! under its name, as when a machine of a broker cluster is replaced.

use super::{free_port, nats_server_bin};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One server of the cluster.
struct Server {
    name: String,
    port: u16,
    conf: PathBuf,
    store: PathBuf,
    child: Option<Child>,
}

pub struct JetStreamCluster {
    servers: Vec<Server>,
    _dir: tempfile::TempDir,
}

impl JetStreamCluster {
    /// Three servers, up, with a JetStream meta leader.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, cluster)| format!("\"nats-route://127.0.0.1:{cluster}\""))
            .collect();
        let mut servers = Vec::new();
        for (i, (port, cluster)) in ports.iter().enumerate() {
            let name = format!("js-{i}");
            let store = dir.path().join(&name);
            let conf = dir.path().join(format!("{name}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "server_name: {name}\nlisten: 127.0.0.1:{port}\nmax_payload: 1048576\n\
                     jetstream {{ store_dir: \"{store}\" }}\n\
                     cluster {{ name: memory, listen: 127.0.0.1:{cluster}, routes: [{routes}] }}\n",
                    store = store.display(),
                    routes = routes.join(", ")
                ),
            )
            .unwrap();
            servers.push(Server {
                name,
                port: *port,
                conf,
                store,
                child: None,
            });
        }
        let mut c = JetStreamCluster { servers, _dir: dir };
        for i in 0..3 {
            c.spawn(i);
        }
        c.wait_ready(Duration::from_secs(60)).await;
        c
    }

    fn spawn(&mut self, i: usize) {
        let s = &mut self.servers[i];
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(nats_server_bin());
            c
        } else {
            Command::new(nats_server_bin())
        };
        s.child = Some(
            cmd.arg("-c")
                .arg(&s.conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nats-server starts"),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "{} did not open its port",
                s.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until JetStream answers on every running server (a meta
    /// leader was elected and each server knows it).
    pub async fn wait_ready(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for s in self.servers.iter().filter(|s| s.child.is_some()) {
            let url = format!("nats://127.0.0.1:{}", s.port);
            let client = async_nats::connect(&url).await.unwrap();
            let js = async_nats::jetstream::new(client);
            while js.query_account().await.is_err() {
                assert!(
                    Instant::now() < deadline,
                    "JetStream not ready on {}",
                    s.name
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    /// The client URL of server `i`.
    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.servers[i].port)
    }

    /// Every server's URL, comma-separated (a `records.url`).
    pub fn urls(&self) -> String {
        (0..self.servers.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills server `i` as a crash would and wipes its store.
    pub fn kill_and_wipe(&mut self, i: usize) {
        let s = &mut self.servers[i];
        if let Some(mut c) = s.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&s.store);
    }

    /// Starts server `i` again under its name (it catches up from the others).
    pub fn restart(&mut self, i: usize) {
        self.spawn(i);
    }
}

impl Drop for JetStreamCluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
