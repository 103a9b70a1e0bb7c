//! Our election against go-choria's, in one bucket: Go candidates that
//! campaign exactly as the Go provisioner does (`choria-election-candidate`,
//! tests/gopeers/choria/candidate: go-choria v0.30.2's streams election with
//! `WithBackoff(backoff.TwentySec)`, API prefix `choria.streams`) and our
//! `choria-provisioner run` processes share `CHORIA_LEADER_ELECTION` /
//! `provisioner` on a broker whose provisioning account imports only the
//! election subjects. Leaders are killed or stopped while a sampler checks,
//! every ~20 ms, that no two candidates lead at once.
//!
//! The real Go provisioner (`choria-go-provisioner`, built from
//! ../shared/peers/go-provisioner) joins the same election in
//! `the_real_go_provisioner_and_ours_share_one_election`, sampled from its
//! `/metrics`.
//!
//! Needs `$CHORIA_ELECTION_CANDIDATE_BIN` and `$CHORIA_GO_PROVISIONER_BIN`
//! (scripts/test.sh builds and exports them); without them the tests fail
//! under CI and otherwise say loudly that they proved nothing.

use crate::support::election::{admin, choria_like_broker, create_bucket, read_key_entry};
use crate::support::gopeers::{candidate_bin, go_provisioner_bin};
use crate::support::provisioner::{binary, http_body, metric_sum, ProvisionerProcess};
use crate::support::NatsServer;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The bucket TTL (Go refuses less than a second; our minimum is 4 s).
const TTL: Duration = Duration::from_secs(5);
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// A Go candidate's ticks follow `backoff.TwentySec.Duration(tries)`: up to
/// 20 s, jittered to [0.5, 1.5) of that, so a long-failing Go standby may
/// wait up to 30 s before its next campaign.
const GO_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A Go winner calls OnWon only at its first renewal (the next tick,
/// `TwentySec.Duration(0)` = 250–750 ms) plus a 200 ms sleep.
const GO_WON_DELAY: Duration = Duration::from_millis(950);
/// Our standbys campaign every quarter TTL, at most every second.
const OURS_RETRY: Duration = Duration::from_secs(1);
/// A crashed leader's key lives TTL after its last renewal, at most one
/// renewal period before the crash (ours: a quarter TTL = 1.25 s; Go: up to
/// 750 ms), so no one may lead sooner than TTL minus that; the rest is room
/// for a renewal tick delayed on a loaded machine.
const EARLIEST_CRASH_FAILOVER: Duration = Duration::from_secs(3);
/// Scheduling, request and sampling latency on a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

/// The election key as the CHORIA account reads it: `Some((operation,
/// value))` with operation "PUT" or "DEL", `None` when there is no entry.
async fn read_key(admin: &async_nats::Client) -> Option<(String, String)> {
    read_key_entry(admin).await.map(|e| (e.op, e.value))
}

// ---------------------------------------------------------------------------
// Candidates.
// ---------------------------------------------------------------------------

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn us(d: Duration) -> i64 {
    d.as_micros() as i64
}

fn secs(d_us: i64) -> String {
    format!("{:.3} s", d_us as f64 / 1e6)
}

/// A running Go candidate; its stdout lines (time_us, leader?) are collected
/// by a reader thread.
struct GoCandidate {
    child: Child,
    lines: Arc<Mutex<Vec<(i64, bool)>>>,
    reader: Option<std::thread::JoinHandle<()>>,
    stderr: PathBuf,
}

impl GoCandidate {
    fn start(bin: &Path, dir: &Path, nats: &NatsServer, identity: &str) -> Self {
        let stderr = dir.join(format!("{identity}.stderr"));
        let mut cmd = if Path::new("/usr/bin/setpriv").exists() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--pdeathsig", "KILL"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let mut child = cmd
            .args(["--server", &nats.url(), "--identity", identity, "--debug"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", bin.display()));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad candidate line {line:?}: {e}"));
                let leader = match v["state"].as_str() {
                    Some("leader") => true,
                    Some("follower") => false,
                    other => panic!("unknown candidate state {other:?} in {line}"),
                };
                sink.lock()
                    .unwrap()
                    .push((v["time_us"].as_i64().unwrap(), leader));
            }
        });
        GoCandidate {
            child,
            lines,
            reader: Some(reader),
            stderr,
        }
    }

    /// SIGKILL (or SIGTERM), reap, and read the rest of stdout.
    fn stop(&mut self, graceful: bool) {
        if graceful {
            let status = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "a Go candidate ignored SIGTERM");
                std::thread::sleep(Duration::from_millis(10));
            }
            let status = self.child.wait().unwrap();
            assert!(
                status.success(),
                "a Go candidate exited with {status} on SIGTERM"
            );
        } else {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl Drop for GoCandidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// go-choria's election as the Go provisioner campaigns
    /// (`choria-election-candidate`).
    Go,
    Ours,
    /// The real Go provisioner (`choria-go-provisioner`, leader_election on).
    GoProvisioner,
}

enum Proc {
    Go(GoCandidate),
    Ours(ProvisionerProcess),
    /// Sampled from its `/metrics` like ours: it works while
    /// `choria_provisioner_paused` is 0. `trusted` once its log shows it
    /// started its election: it serves /metrics, with the gauge still 0 from
    /// loading its configuration, before it connects and pauses, and it does
    /// not provision in that gap.
    GoProvisioner {
        p: ProvisionerProcess,
        trusted: bool,
    },
}

/// One candidate and what is known *for certain* about when it led.
///
/// Why "certain" intervals: a sample reads the candidates one after the
/// other, so a handover between two reads (e.g. our graceful release, where
/// a standby wins within milliseconds) would look like two leaders. Each
/// candidate therefore keeps intervals during which it certainly believed it
/// led, and two such intervals must never intersect:
///
/// * ours: the gauge read 1 in consecutive reads r1..rn, so it was 1 from the
///   end of r1's request to the start of rn's (the gauge is set 0 before our
///   release and set 1 only after a win, so a handover cannot fall inside; a
///   loss and re-win between two reads 20 ms apart would need a whole
///   campaign period);
/// * Go: from the time_us of its `leader` line (OnWon, when the Go
///   provisioner resumes) to that of its `follower` line (OnLost, only after a
///   failed renewal) or until the process was reaped after SIGKILL/SIGTERM.
///   While still open, the online check only trusts it up to the sample's
///   start minus [`PIPE_LAG`], since a `follower` line may still be in the
///   pipe; the final check, with every interval closed, is exact.
///
/// A live Go leader loses its key only by failing to renew for a whole TTL,
/// which does not happen here, so an intersection is a real double leader.
struct Candidate {
    name: String,
    kind: Kind,
    proc: Proc,
    alive: bool,
    /// Closed certain intervals (unix µs).
    intervals: Vec<(i64, i64)>,
    /// Go: the open interval's start.
    open_since: Option<i64>,
    go_seen: usize,
    /// Ours: current run of 1-reads (end of the first read, start of the last).
    run: Option<(i64, i64)>,
    /// Last observed state and since when (Go: OnWon time; ours: end of the
    /// first read of 1), for the rounds' leader search and failover times.
    leading_since: Option<i64>,
}

const PIPE_LAG: i64 = 250_000;

impl Candidate {
    /// Reads the candidate's state now (called with the pool locked).
    fn sample(&mut self) {
        if !self.alive {
            return;
        }
        match &mut self.proc {
            Proc::Go(g) => {
                let new: Vec<(i64, bool)> = g.lines.lock().unwrap()[self.go_seen..].to_vec();
                self.go_seen += new.len();
                for (t, leader) in new {
                    self.go_line(t, leader);
                }
            }
            Proc::Ours(p) => {
                let start = now_us();
                let value = try_metric(p.monitor_port, "choria_provisioner_leader");
                let end = now_us();
                self.read(start, end, value == Some(1.0));
            }
            Proc::GoProvisioner { p, trusted } => {
                if !*trusted {
                    *trusted = p.logs().contains("Starting leader election");
                }
                let trusted = *trusted;
                let start = now_us();
                let value = try_metric(p.monitor_port, "choria_provisioner_paused");
                let end = now_us();
                self.read(start, end, trusted && value == Some(0.0));
            }
        }
    }

    /// One gauge read taken between `start` and `end`.
    fn read(&mut self, start: i64, end: i64, leading: bool) {
        observe_read(&mut self.run, &mut self.intervals, start, end, leading);
        if self.run.is_some() {
            self.leading_since.get_or_insert(end);
        } else {
            self.leading_since = None;
        }
    }

    fn go_line(&mut self, t: i64, leader: bool) {
        if leader {
            self.open_since.get_or_insert(t);
            self.leading_since.get_or_insert(t);
        } else {
            if let Some(s) = self.open_since.take() {
                self.intervals.push((s, t));
            }
            self.leading_since = None;
        }
    }

    fn end_run(&mut self) {
        observe_read(&mut self.run, &mut self.intervals, 0, 0, false);
        self.leading_since = None;
    }

    /// Certain intervals, an open Go interval trusted up to `horizon`.
    fn certain(&self, horizon: i64) -> Vec<(i64, i64)> {
        let mut v = self.intervals.clone();
        if let Some(s) = self.open_since {
            v.push((s, horizon));
        }
        if let Some((a, b)) = self.run {
            v.push((a, b));
        }
        v.retain(|(a, b)| b > a);
        v
    }

    /// Kills the candidate (SIGKILL; a Go one with SIGTERM when
    /// `term_go`, which must exit 0) and closes its intervals once reaped.
    fn kill(&mut self, term_go: bool) {
        match &mut self.proc {
            Proc::Go(g) => {
                g.stop(term_go);
                let lines = g.lines.lock().unwrap().clone();
                for &(t, leader) in &lines[self.go_seen..] {
                    self.go_line(t, leader);
                }
                self.go_seen = lines.len();
                if let Some(s) = self.open_since.take() {
                    self.intervals.push((s, now_us()));
                }
            }
            Proc::Ours(p) => {
                p.signal("KILL");
                p.wait_exit(Duration::from_secs(10));
                self.end_run();
            }
            Proc::GoProvisioner { p, .. } => {
                p.signal(if term_go { "TERM" } else { "KILL" });
                p.wait_exit(Duration::from_secs(10));
                self.end_run();
            }
        }
        self.alive = false;
        self.leading_since = None;
    }

    fn logs_tail(&self) -> String {
        match &self.proc {
            Proc::Go(g) => {
                let text = std::fs::read_to_string(&g.stderr).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(10)..].join("\n")
            }
            Proc::Ours(p) | Proc::GoProvisioner { p, .. } => p.logs_tail(15),
        }
    }
}

/// GET /metrics without panicking on a process that is going away.
fn try_metric(port: u16, name: &str) -> Option<f64> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    let body = http_body(head, body);
    body.contains(name).then(|| metric_sum(&body, name))
}

/// One read of our leader gauge, taken between `start` and `end`: a read of
/// 1 extends the current run (certain from the end of its first read to the
/// start of its last); any other read closes it.
fn observe_read(
    run: &mut Option<(i64, i64)>,
    intervals: &mut Vec<(i64, i64)>,
    start: i64,
    end: i64,
    leader: bool,
) {
    if leader {
        let first = run.map_or(end, |r| r.0);
        *run = Some((first, start));
    } else if let Some((a, b)) = run.take() {
        // A 0, or no answer (exiting): nothing certain past the last 1.
        if b > a {
            intervals.push((a, b));
        }
    }
}

/// Two candidates' indices and their intersecting intervals.
type Conflict = (usize, usize, (i64, i64), (i64, i64));

/// Every pair of intersecting intervals of two different candidates.
fn conflicts(certain: &[Vec<(i64, i64)>]) -> Vec<Conflict> {
    let mut found = Vec::new();
    for i in 0..certain.len() {
        for j in i + 1..certain.len() {
            for a in &certain[i] {
                for b in &certain[j] {
                    if a.0 < b.1 && b.0 < a.1 {
                        found.push((i, j, *a, *b));
                    }
                }
            }
        }
    }
    found
}

/// Every candidate ever started, sampled by a background thread.
struct Pool {
    candidates: Vec<Candidate>,
    violations: Vec<String>,
    samples: u64,
    last_sample: Option<i64>,
    /// Longest time between two samples (kills hold the pool briefly).
    max_gap: i64,
}

impl Pool {
    fn sample(&mut self) {
        let now = now_us();
        if let Some(last) = self.last_sample.replace(now) {
            self.max_gap = self.max_gap.max(now - last);
        }
        let horizon = now - PIPE_LAG;
        for c in &mut self.candidates {
            c.sample();
        }
        self.samples += 1;
        self.check(horizon);
    }

    /// Records every pair of intersecting certain intervals (once).
    fn check(&mut self, horizon: i64) {
        let certain: Vec<Vec<(i64, i64)>> =
            self.candidates.iter().map(|c| c.certain(horizon)).collect();
        for (i, j, a, b) in conflicts(&certain) {
            let (x, y) = (&self.candidates[i], &self.candidates[j]);
            // An open interval grows: report a pair once.
            let key = format!("{}@{} {}@{}", x.name, a.0, y.name, b.0);
            if !self.violations.iter().any(|v| v.starts_with(&key)) {
                self.violations.push(format!(
                    "{key}: {} ({:?}) led {}..{} while {} ({:?}) led {}..{}",
                    x.name, x.kind, a.0, a.1, y.name, y.kind, b.0, b.1
                ));
            }
        }
    }

    /// Alive candidates that currently lead: (index, since).
    fn leaders(&self) -> Vec<(usize, i64)> {
        self.candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.alive)
            .filter_map(|(i, c)| c.leading_since.map(|s| (i, s)))
            .collect()
    }

    fn alive(&self, kind: Kind) -> usize {
        self.candidates
            .iter()
            .filter(|c| c.alive && c.kind == kind)
            .count()
    }

    fn logs(&self) -> String {
        self.candidates
            .iter()
            .filter(|c| c.alive)
            .map(|c| format!("--- {} ({:?})\n{}", c.name, c.kind, c.logs_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Harness {
    pool: Arc<Mutex<Pool>>,
    stop: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
    nats: NatsServer,
    dir: tempfile::TempDir,
    /// `choria-election-candidate`, for [`Kind::Go`].
    go_bin: Option<PathBuf>,
    /// `choria-go-provisioner`, for [`Kind::GoProvisioner`].
    go_provisioner: Option<PathBuf>,
    started: (usize, usize, usize),
}

impl Harness {
    async fn new(go_bin: PathBuf) -> Self {
        Self::with_peers(Some(go_bin), None).await
    }

    async fn with_peers(go_bin: Option<PathBuf>, go_provisioner: Option<PathBuf>) -> Self {
        let nats = choria_like_broker();
        create_bucket(&nats, TTL).await;
        let pool = Arc::new(Mutex::new(Pool {
            candidates: Vec::new(),
            violations: Vec::new(),
            samples: 0,
            last_sample: None,
            max_gap: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        // A plain thread: the HTTP reads block, and the test's own tokio
        // workers must stay free.
        let sampler = {
            let (pool, stop) = (pool.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    pool.lock().unwrap().sample();
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Harness {
            pool,
            stop,
            sampler: Some(sampler),
            nats,
            dir: tempfile::tempdir().unwrap(),
            go_bin,
            go_provisioner,
            started: (0, 0, 0),
        }
    }

    fn start(&mut self, kind: Kind) -> String {
        let (name, proc) = match kind {
            Kind::Go => {
                self.started.0 += 1;
                let name = format!("go{}", self.started.0);
                let identity = format!("{name}.provisioners.example.net");
                let bin = self.go_bin.as_ref().expect("no Go candidate binary");
                let g = GoCandidate::start(bin, self.dir.path(), &self.nats, &identity);
                (name, Proc::Go(g))
            }
            Kind::GoProvisioner => {
                self.started.2 += 1;
                let name = format!("gp{}", self.started.2);
                let bin = self
                    .go_provisioner
                    .as_ref()
                    .expect("no Go provisioner binary");
                let p = ProvisionerProcess::start_program(
                    bin,
                    self.dir.path(),
                    &name,
                    &go_yaml(),
                    &format!(
                        "identity = {name}.provisioners.example.net\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
                        self.nats.url()
                    ),
                    &[],
                    &[],
                );
                (name, Proc::GoProvisioner { p, trusted: false })
            }
            Kind::Ours => {
                self.started.1 += 1;
                let name = format!("rs{}", self.started.1);
                let p = ProvisionerProcess::start_named(
                    self.dir.path(),
                    &name,
                    &yaml(),
                    &format!(
                        "identity = {name}.provisioners.example.net\nplugin.choria.middleware_hosts = {}\n",
                        self.nats.url()
                    ),
                    &[],
                );
                (name, Proc::Ours(p))
            }
        };
        self.pool.lock().unwrap().candidates.push(Candidate {
            name: name.clone(),
            kind,
            proc,
            alive: true,
            intervals: Vec::new(),
            open_since: None,
            go_seen: 0,
            run: None,
            leading_since: None,
        });
        name
    }

    fn assert_no_violation(&self) {
        let pool = self.pool.lock().unwrap();
        assert!(
            pool.violations.is_empty(),
            "two leaders at once:\n{}\nlogs:\n{}",
            pool.violations.join("\n"),
            pool.logs()
        );
    }

    /// Waits for exactly one alive leader; returns (index, name, kind, since).
    async fn leader(&self, timeout: Duration) -> (usize, String, Kind, i64) {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_no_violation();
            {
                let pool = self.pool.lock().unwrap();
                if let [(i, since)] = pool.leaders()[..] {
                    let c = &pool.candidates[i];
                    return (i, c.name.clone(), c.kind, since);
                }
                assert!(
                    Instant::now() < deadline,
                    "no single leader within {timeout:?} (leaders: {:?}); logs:\n{}",
                    pool.leaders(),
                    pool.logs()
                );
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    /// Kills candidate `i` (-9) between two samples; returns when.
    fn kill(&self, i: usize) -> i64 {
        let mut pool = self.pool.lock().unwrap();
        let t = now_us();
        pool.candidates[i].kill(false);
        t
    }

    /// Stops our instance `i` with TERM while the sampler keeps reading it
    /// (its gauge must drop before a standby wins); returns when TERM was
    /// sent, once it exited 0 having released.
    async fn stop_ours(&self, i: usize) -> i64 {
        let t = {
            let pool = self.pool.lock().unwrap();
            let Proc::Ours(p) = &pool.candidates[i].proc else {
                panic!("not one of ours")
            };
            p.signal("TERM");
            now_us()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            {
                let mut pool = self.pool.lock().unwrap();
                let c = &mut pool.candidates[i];
                let Proc::Ours(p) = &mut c.proc else {
                    unreachable!()
                };
                if !p.is_running() {
                    let status = p.wait_exit(Duration::from_secs(1));
                    assert!(
                        status.success(),
                        "{} exited with {status} after TERM",
                        c.name
                    );
                    let logs = p.logs();
                    assert!(
                        logs.contains("released on shutdown")
                            && !logs.contains("could not release"),
                        "{} did not release: {}",
                        c.name,
                        p.logs_tail(20)
                    );
                    c.end_run();
                    c.alive = false;
                    return t;
                }
            }
            assert!(Instant::now() < deadline, "TERM did not stop our instance");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The longest a failover from `leader` to a live candidate may take:
    /// TTL plus the campaign period of the quickest kind left.
    fn failover_bound(&self, leader: usize) -> Duration {
        let pool = self.pool.lock().unwrap();
        let ours_left = pool
            .candidates
            .iter()
            .enumerate()
            .any(|(j, c)| j != leader && c.alive && c.kind == Kind::Ours);
        if ours_left {
            TTL + OURS_RETRY + GO_WON_DELAY + SLACK
        } else {
            TTL + GO_BACKOFF_MAX + GO_WON_DELAY + SLACK
        }
    }

    /// Stops sampling, kills everything, and checks the closed intervals.
    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.sampler.take() {
            s.join().expect("the sampler panicked");
        }
        let mut pool = self.pool.lock().unwrap();
        for c in &mut pool.candidates {
            if c.alive {
                c.kill(true);
            }
        }
        pool.check(i64::MAX);
        assert!(
            pool.violations.is_empty(),
            "two leaders at once:\n{}",
            pool.violations.join("\n")
        );
        let led: Vec<String> = pool
            .candidates
            .iter()
            .map(|c| {
                let total: i64 = c.intervals.iter().map(|(a, b)| b - a).sum();
                format!(
                    "{} led {} in {} terms",
                    c.name,
                    secs(total),
                    c.intervals.len()
                )
            })
            .collect();
        println!(
            "{} samples (longest gap {}), no overlap; {}",
            pool.samples,
            secs(pool.max_gap),
            led.join(", ")
        );
    }
}

impl Drop for Harness {
    /// On a failed assertion, stop the sampler so that the pool, and with it
    /// every candidate process, is dropped.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.sampler.take() {
            let _ = s.join();
        }
    }
}

/// The Go provisioner's configuration: the same keys as ours where they
/// exist (it has no rpc/discovery timeouts), logging to stderr (the process
/// log) at debug so its election lines are there.
fn go_yaml() -> String {
    format!(
        "workers: 2\ninterval: 1m\ntoken: s3cret\nsite: election\nhelper: {}\nchoria_insecure: true\nleader_election: true\nlogfile: /dev/stderr\nloglevel: debug\n",
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/helper.sh").display()
    )
}

fn yaml() -> String {
    format!(
        "workers: 2\ninterval: 1m\ntoken: s3cret\nsite: election\nhelper: {} fleet-helper\nchoria_insecure: true\nrpc_timeout: 2s\ndiscovery_timeout: 2s\ndiscovery_window: 500ms\nleader_election: true\n",
        binary()
    )
}

// ---------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------

/// Go candidates and ours campaign together; the leader is killed -9 four
/// times. Rounds are forced (by also killing the leader's kind's standbys)
/// until each kind has led once, then pools are mixed so both kinds race for
/// the expired key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_candidates_and_ours_never_lead_at_once_and_leadership_moves() {
    let Some(go_bin) =
        candidate_bin("go_candidates_and_ours_never_lead_at_once_and_leadership_moves")
    else {
        return;
    };
    let mut h = Harness::new(go_bin).await;
    let admin = admin(&h.nats).await;
    h.start(Kind::Go);
    h.start(Kind::Ours);
    h.start(Kind::Go);
    h.start(Kind::Ours);

    // A Go candidate first sleeps a random splay of up to 5 s.
    let mut bound = TTL + Duration::from_secs(5) + GO_WON_DELAY + SLACK;
    let (mut led_go, mut led_ours) = (false, false);
    let mut record = Vec::new();
    const ROUNDS: usize = 4;
    for round in 0..=ROUNDS {
        let (i, name, kind, _) = h.leader(bound).await;
        // The bucket names the same leader.
        // Go candidates campaign under their identity; ours add a random
        // suffix so replicas sharing an identity stay distinct.
        let key = read_key(&admin).await;
        let identity = format!("{name}.provisioners.example.net");
        let holds = match (&key, kind) {
            (Some((op, v)), Kind::Go | Kind::GoProvisioner) => op == "PUT" && *v == identity,
            (Some((op, v)), Kind::Ours) => {
                op == "PUT"
                    && v.strip_prefix(&identity)
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|s| s.len() == 6 && s.chars().all(|c| c.is_ascii_hexdigit()))
            }
            (None, _) => false,
        };
        assert!(
            holds,
            "round {round}: the bucket holds {key:?}, not the leader {name}"
        );
        match kind {
            Kind::Go | Kind::GoProvisioner => led_go = true,
            Kind::Ours => led_ours = true,
        }
        if round == ROUNDS {
            record.push(format!("final leader {name} ({kind:?})"));
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Until each kind has led, make the other kind the only standbys.
        let wanted = match (led_go, led_ours) {
            (false, _) => Some(Kind::Go),
            (_, false) => Some(Kind::Ours),
            _ => None,
        };
        let forced = wanted.filter(|w| *w != kind).is_some();
        if forced {
            let standbys: Vec<usize> = {
                let pool = h.pool.lock().unwrap();
                (0..pool.candidates.len())
                    .filter(|&j| j != i && pool.candidates[j].alive)
                    .filter(|&j| pool.candidates[j].kind == kind)
                    .collect()
            };
            for j in standbys {
                h.kill(j);
            }
        }
        let bound_now = h.failover_bound(i);
        let t_kill = h.kill(i);
        let (_, new, new_kind, since) = h.leader(bound_now).await;
        let took = since - t_kill;
        println!(
            "round {round}: kill -9 {name} ({kind:?}){} -> {new} ({new_kind:?}) after {}",
            if forced {
                ", its kind's standbys too"
            } else {
                ""
            },
            secs(took)
        );
        record.push(format!(
            "round {round}: {name} ({kind:?}) -> {new} ({new_kind:?}) {}",
            secs(took)
        ));
        assert!(
            took <= us(bound_now),
            "round {round}: failover took {} > {bound_now:?}",
            secs(took)
        );
        // An earlier winner would have taken a live key.
        assert!(
            took >= us(EARLIEST_CRASH_FAILOVER),
            "round {round}: {new} led {} after {name} was killed: before its key expired",
            secs(took)
        );
        // Back to two of each (the leader included).
        for k in [Kind::Go, Kind::Ours] {
            while h.pool.lock().unwrap().alive(k) < 2 {
                h.start(k);
            }
        }
        // New Go candidates sleep a splay of up to 5 s first; a leader is
        // already there, so only the next round's check waits for it.
        bound = TTL;
    }
    println!("{}", record.join("\n"));
    assert!(led_go, "no Go candidate ever led: {record:?}");
    assert!(led_ours, "none of ours ever led: {record:?}");
    h.assert_no_violation();
    h.finish();
}

/// Our leader stops (TERM): it releases with a delete marker and announces
/// the marker's sequence. Our standby claims the key at once; a Go standby
/// cannot read the marker through the provisioning account's imports
/// (nats.go's Create falls back to a DIRECT.GET there is no import for), so
/// Go standbys take over only once the marker has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_graceful_stop_hands_over_to_ours_at_once_and_to_go_after_the_marker_expires() {
    let Some(go_bin) = candidate_bin(
        "our_graceful_stop_hands_over_to_ours_at_once_and_to_go_after_the_marker_expires",
    ) else {
        return;
    };
    let mut h = Harness::new(go_bin).await;
    let admin = admin(&h.nats).await;
    h.start(Kind::Ours);
    let (first, name, _, _) = h.leader(TTL * 3).await;
    h.start(Kind::Go);
    h.start(Kind::Ours);
    // Let the Go standby campaign (after its splay of up to 5 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        h.leader(SLACK).await.1,
        name,
        "the leader changed unprompted"
    );

    let t0 = h.stop_ours(first).await;
    let (second, to_ours, kind, since) = h.leader(Duration::from_secs(5)).await;
    let to_ours_took = since - t0;
    println!(
        "TERM {name} with an ours and a Go standby -> {to_ours} ({kind:?}) after {}",
        secs(to_ours_took)
    );
    assert_eq!(
        kind,
        Kind::Ours,
        "our standby must take over via the announcement"
    );
    // At once, through the announcement: waiting for the key to expire
    // could not be this fast (the last renewal came at most a quarter TTL
    // before the stop, so the key lives 3/4 TTL after it at least).
    assert!(
        to_ours_took < us(TTL * 3 / 4),
        "our standby took over after {}: no faster than the key's expiry",
        secs(to_ours_took)
    );

    // Now our leader with Go standbys only.
    h.start(Kind::Go);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.leader(SLACK).await.1, to_ours);
    let bound = h.failover_bound(second);
    let t1 = h.stop_ours(second).await;
    let marker = read_key(&admin).await;
    let (_, to_go, kind, since) = h.leader(bound).await;
    let to_go_took = since - t1;
    println!(
        "TERM {to_ours} with only Go standbys -> {to_go} ({kind:?}) after {} (marker seen by the CHORIA account: {marker:?})",
        secs(to_go_took)
    );
    assert_eq!(kind, Kind::Go);
    assert_eq!(
        marker.map(|m| m.0),
        Some("DEL".to_string()),
        "our release must leave a delete marker"
    );
    assert!(
        to_go_took >= us(TTL),
        "a Go standby led {} after our release: before the marker expired",
        secs(to_go_took)
    );
    h.assert_no_violation();
    h.finish();
}

/// The real Go provisioner and ours on one election, sampled from both
/// `/metrics` (Go: `choria_provisioner_paused`, ours: the leader gauge,
/// which is 1 exactly while our gate is open for the election): the Go one
/// wins while ours are gone, keeps the lead when ours arrive, ours take over
/// only after its key expired when it is killed, and a Go provisioner that
/// comes back stays a standby under our leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_go_provisioner_and_ours_share_one_election() {
    let Some(go_provisioner) =
        go_provisioner_bin("the_real_go_provisioner_and_ours_share_one_election")
    else {
        return;
    };
    let mut h = Harness::with_peers(None, Some(go_provisioner)).await;
    let admin = admin(&h.nats).await;

    // Alone, the Go provisioner wins (after its connect, a splay of up to
    // 5 s and its first renewal).
    h.start(Kind::GoProvisioner);
    let (go, go_name, kind, _) = h
        .leader(TTL + Duration::from_secs(5) + GO_WON_DELAY + SLACK * 2)
        .await;
    assert_eq!(kind, Kind::GoProvisioner);
    assert_eq!(
        read_key(&admin).await,
        Some((
            "PUT".to_string(),
            format!("{go_name}.provisioners.example.net")
        )),
        "the bucket names the Go provisioner"
    );

    // Ours arrive: they campaign, fail, and stay paused for three TTLs.
    h.start(Kind::Ours);
    h.start(Kind::Ours);
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        assert_eq!(
            h.leader(SLACK).await.0,
            go,
            "the Go provisioner lost the lead"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    {
        let pool = h.pool.lock().unwrap();
        for c in pool.candidates.iter().filter(|c| c.kind == Kind::Ours) {
            let Proc::Ours(p) = &c.proc else {
                unreachable!()
            };
            assert_eq!(
                p.metric("choria_provisioner_paused"),
                1.0,
                "{} works",
                c.name
            );
            // Losing to the Go provisioner's key is not an error: ours read
            // it through the provisioning account's imports.
            assert_eq!(
                p.metric("choria_provisioner_election_errors"),
                0.0,
                "{}: {}",
                c.name,
                p.logs_tail(20)
            );
        }
    }

    // The Go provisioner dies: one of ours takes over, not before its key
    // (renewed at most one Go renewal period before the kill) expired.
    let bound = h.failover_bound(go);
    let killed = h.kill(go);
    let (ours, ours_name, kind, since) = h.leader(bound).await;
    let took = since - killed;
    println!(
        "kill -9 {go_name} -> {ours_name} ({kind:?}) after {}",
        secs(took)
    );
    assert_eq!(kind, Kind::Ours);
    assert!(
        took >= us(EARLIEST_CRASH_FAILOVER),
        "ours led {} after the kill, before the Go provisioner's key could expire",
        secs(took)
    );

    // A Go provisioner comes back: it stays a standby.
    h.start(Kind::GoProvisioner);
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        assert_eq!(h.leader(SLACK).await.0, ours, "our leader lost the lead");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // And ours, all gone (kill -9, so no release), leave it to the Go one.
    let bound = TTL + GO_BACKOFF_MAX + GO_WON_DELAY + SLACK;
    let standby = {
        let pool = h.pool.lock().unwrap();
        (0..pool.candidates.len())
            .find(|&j| {
                j != ours && pool.candidates[j].alive && pool.candidates[j].kind == Kind::Ours
            })
            .unwrap()
    };
    h.kill(standby);
    let killed = h.kill(ours);
    let (_, back, kind, since) = h.leader(bound).await;
    println!(
        "kill -9 {ours_name} (and our standby) -> {back} ({kind:?}) after {}",
        secs(since - killed)
    );
    assert_eq!(kind, Kind::GoProvisioner);
    h.assert_no_violation();
    h.finish();
}

/// The overlap check itself: a handover between two reads of one sample is
/// not flagged, two leaders seen in two consecutive samples are.
#[test]
fn the_overlap_check_tells_a_sampling_race_from_two_leaders() {
    // Each sample reads A during [t, t+2] then B during [t+2, t+4].
    let run = |reads: &[(i64, bool)]| {
        let (mut run, mut intervals) = (None, Vec::new());
        for &(t, leader) in reads {
            observe_read(&mut run, &mut intervals, t, t + 2, leader);
        }
        observe_read(&mut run, &mut intervals, 0, 0, false);
        intervals
    };
    // A hands over to B at 43, between A's read at 40 and B's at 42.
    let a = run(&[(0, true), (20, true), (40, true), (60, false)]);
    let b = run(&[(2, false), (22, false), (42, true), (62, true), (82, true)]);
    assert_eq!(a, vec![(2, 40)]);
    assert_eq!(b, vec![(44, 82)]);
    assert!(conflicts(&[a.clone(), b]).is_empty());
    // B already leads at 22 and 42 while A does: flagged.
    let b = run(&[(2, false), (22, true), (42, true), (62, true)]);
    assert_eq!(conflicts(&[a, b]).len(), 1);
    // A single read of 1 proves nothing certain.
    assert!(run(&[(0, false), (20, true), (40, false)]).is_empty());
}
