//! The `choria-provisioner run` binary as a child process, with its logs in a
//! file and its metrics read over HTTP, as an operator would see it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_choria-provisioner")
}

/// Sends `signal` (`TERM`, `KILL`, `INT`, `HUP`) to `pid` with kill(2) from
/// this process: kill(1) would cost a fork and exec, which a timed shutdown
/// counts on a loaded machine.
pub fn send_signal(pid: u32, signal: &str) {
    let sig = match signal {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "KILL" => libc::SIGKILL,
        "TERM" => libc::SIGTERM,
        other => panic!("no number for signal {other}"),
    };
    let pid = i32::try_from(pid).expect("a pid fits a pid_t");
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill -{signal} {pid}: {}",
        std::io::Error::last_os_error()
    );
}

pub struct ProvisionerProcess {
    child: Child,
    pub monitor_port: u16,
    pub log_path: PathBuf,
}

impl ProvisionerProcess {
    /// Writes `provisioner.yaml` (with `monitor_port` appended) and
    /// `choria.cfg` into `dir` and starts `run` with `extra` arguments.
    pub fn start(dir: &Path, yaml: &str, choria_cfg: &str, extra: &[&str]) -> Self {
        Self::start_named(dir, "provisioner", yaml, choria_cfg, extra)
    }

    /// [`ProvisionerProcess::start`] with file names prefixed by `name`, so
    /// several instances can share a directory.
    pub fn start_named(
        dir: &Path,
        name: &str,
        yaml: &str,
        choria_cfg: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_with_env(dir, name, yaml, choria_cfg, extra, &[])
    }

    /// [`ProvisionerProcess::start_named`] with extra environment variables.
    pub fn start_with_env(
        dir: &Path,
        name: &str,
        yaml: &str,
        choria_cfg: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_program(Path::new(binary()), dir, name, yaml, choria_cfg, extra, env)
    }

    /// [`ProvisionerProcess::start_with_env`] of another program with the
    /// same command line (`run --config --choria-config`), e.g. the real Go
    /// provisioner.
    pub fn start_program(
        program: &Path,
        dir: &Path,
        name: &str,
        yaml: &str,
        choria_cfg: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let monitor_port = super::free_port();
        let config = dir.join(format!("{name}.yaml"));
        std::fs::write(&config, format!("{yaml}\nmonitor_port: {monitor_port}\n")).unwrap();
        let ccfg = dir.join(format!("{name}-choria.cfg"));
        std::fs::write(&ccfg, choria_cfg).unwrap();
        let log_path = dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        let child = cmd
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--choria-config")
            .arg(&ccfg)
            .args(extra)
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", program.display()));
        let p = ProvisionerProcess {
            child,
            monitor_port,
            log_path,
        };
        p.wait_for_monitor(Duration::from_secs(20));
        p
    }

    fn wait_for_monitor(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while std::net::TcpStream::connect(("127.0.0.1", self.monitor_port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the provisioner's monitor port {} did not open within {timeout:?}; log:\n{}",
                self.monitor_port,
                self.logs_tail(40)
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// A plain HTTP GET on the monitor port: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.monitor_port, path)
    }

    /// The sum of all series of metric `name` (e.g. every `site`).
    pub fn metric(&self, name: &str) -> f64 {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "/metrics answered {status}: {body}");
        metric_sum(&body, name)
    }

    /// Waits until metric `name` reaches `at_least`; panics with the log tail.
    pub async fn wait_for_metric(&mut self, name: &str, at_least: f64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the provisioner exited ({status}) while waiting for {name} >= {at_least}; log:\n{}",
                    self.logs_tail(60)
                );
            }
            let v = self.metric(name);
            if v >= at_least {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} is {v} after {timeout:?}, expected >= {at_least}; log tail:\n{}",
                self.logs_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until metric `name` falls to `at_most`; panics with the log tail.
    pub async fn wait_for_metric_at_most(&mut self, name: &str, at_most: f64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.metric(name);
            if v <= at_most {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} is {v} after {timeout:?}, expected <= {at_most}; log tail:\n{}",
                self.logs_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn signal(&self, signal: &str) {
        send_signal(self.child.id(), signal);
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the provisioner did not exit within {timeout:?}; log tail:\n{}",
                self.logs_tail(40)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn logs_tail(&self, lines: usize) -> String {
        let logs = self.logs();
        let all: Vec<&str> = logs.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ProvisionerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` on 127.0.0.1:`port` over HTTP/1.1; (status, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let (status, _, body) = http_get_with(port, path, &[]);
    (status, body)
}

/// [`http_get`] with request headers; (status, response head, body).
pub fn http_get_with(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("cannot reach 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let (head, body) = text
        .split_once("\r\n\r\n")
        .map(|(head, b)| (head.to_string(), http_body(head, b)))
        .unwrap_or_default();
    (status, head, body)
}

/// The body of an HTTP/1.1 response: as sent, or de-chunked when the head
/// says `Transfer-Encoding: chunked` (Go's net/http chunks large bodies, so
/// the Go provisioner's /metrics would otherwise carry chunk sizes in the
/// middle of its lines).
pub fn http_body(head: &str, body: &str) -> String {
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    out
}

/// Sums the samples of metric `name` in Prometheus text; `name` may hold
/// the first labels (`m{decision="denied"`), in their written order.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with('{')
                    || rest.starts_with(' ')
                    || (name.contains('{') && (rest.starts_with(',') || rest.starts_with('}')))
            })
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
