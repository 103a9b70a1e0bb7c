//! Shared test support: a real nats-server on a free loopback port.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Finds the nats-server binary: `$NATS_SERVER_BIN`, the project cache, or `$PATH`.
pub fn nats_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NATS_SERVER_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(home) = std::env::var("HOME") {
        let cached = Path::new(&home).join(".cache/choria-provisioner-rs/bin/nats-server");
        if cached.exists() {
            return cached;
        }
    }
    PathBuf::from("nats-server")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running nats-server, killed on drop.
pub struct NatsServer {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl NatsServer {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Plain server, no TLS.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Server offering TLS (optional for clients, as in the Choria test recipe),
    /// with a self-signed certificate made by openssl.
    pub fn start_tls_available() -> Self {
        let dir = tempfile::tempdir().unwrap();
        make_self_signed(dir.path());
        let extra = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\nallow_non_tls: true\n",
            dir.path().join("cert.pem").display(),
            dir.path().join("key.pem").display()
        );
        Self::start_in(dir, &extra)
    }

    pub fn start_with(extra: &str) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), extra)
    }

    fn start_in(dir: tempfile::TempDir, extra: &str) -> Self {
        let port = free_port();
        let conf = dir.path().join("nats.conf");
        let mut f = std::fs::File::create(&conf).unwrap();
        writeln!(f, "listen: 127.0.0.1:{port}\nmax_payload: 1048576\n{extra}").unwrap();
        // setpriv --pdeathsig: the server dies with the test process even when
        // that is killed outright and Drop never runs.
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(nats_server_bin());
            c
        } else {
            Command::new(nats_server_bin())
        };
        let child = cmd
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "could not start nats-server ({}): {e}; run scripts/test.sh, which installs it",
                    nats_server_bin().display()
                )
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        NatsServer { child, port, dir }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A self-signed certificate for 127.0.0.1/localhost in `dir` (cert.pem, key.pem).
pub fn make_self_signed(dir: &Path) {
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl is needed to make test certificates");
    assert!(status.success(), "openssl could not make a certificate");
}

/// Reads a fleet journal into JSON values.
pub fn read_journal(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad journal line {l:?}: {e}")))
        .collect()
}
