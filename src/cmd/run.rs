//! `choria-provisioner [run]`: the provisioner, with the Go provisioner's
//! options (`--config`, `--choria-config`, `--pid`, `--debug`), and `--check`.

use super::GlobalArgs;
use crate::telemetry;
use anyhow::{Context, Result};
use choria_config::{self as config, Environment};
use choria_core::monitor::Exposition;
use choria_core::provision::{self, Options, Prepared, Provisioner, Steering};
use choria_k8s::Kube;
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The provisioner configuration (the Go provisioner's YAML).
    #[arg(long)]
    pub config: PathBuf,
    /// The Choria client configuration (default as go-choria's UserConfig():
    /// ~/.choriarc, ~/.mcollective, /etc/choria/client.conf,
    /// /usr/local/etc/choria/client.conf, else /etc/puppetlabs/mcollective/client.cfg).
    #[arg(long)]
    pub choria_config: Option<PathBuf>,
    /// Write our PID to this file while running.
    #[arg(long)]
    pub pid: Option<PathBuf>,
    /// Print a progress line to stderr every second (rewritten in place on
    /// a terminal).
    #[arg(long)]
    pub progress: bool,
    /// Load and validate both files as `run` does before it connects, print
    /// the effective settings (secrets redacted) and exit: 0 valid, 1 not.
    #[arg(long)]
    pub check: bool,
    /// The `Provisioner` resource (NAMESPACE/NAME) this pod belongs to: its
    /// `spec.paused` is followed and, while leading, its status gets our name.
    #[arg(long, env = "CHORIA_PROVISIONER_RESOURCE")]
    pub provisioner: Option<choria_k8s::crd::ResourceRef>,
}

impl RunArgs {
    fn prepare(&self) -> Result<Prepared> {
        let env = Environment::from_process();
        let choria_config = self
            .choria_config
            .clone()
            .unwrap_or_else(|| user_config(env.home.as_deref(), &|p| go_file_exist(p)));
        Ok(provision::prepare(&self.config, &choria_config, &env)?)
    }
}

/// Runs the provisioner until SIGTERM/SIGINT.
pub async fn run(args: RunArgs, global: &GlobalArgs) -> Result<()> {
    let prepared = args.prepare()?;
    let cfg = &prepared.config;
    let _log = telemetry::init(
        global.log_format,
        &global.filter(cfg.log_level().as_filter()),
        &cfg.log_target(),
    )?;
    config::log_warnings(&prepared.warnings());

    let _pid = match &args.pid {
        Some(path) => Some(PidFile::write(path)?),
        None => None,
    };
    let mut options = Options::new(env!("CARGO_PKG_VERSION"));
    if provision::needs_kubernetes(cfg, args.provisioner.is_some()) {
        // The process's one client, for every part that talks to the API
        // server. Running as a resource needs it at once; cert-manager
        // alone fails only the nodes that need a certificate without it.
        options.kube = Kube::from_environment().await;
        if let (Some(r), Err(e)) = (&args.provisioner, options.kube.client()) {
            anyhow::bail!("--provisioner {r}: no Kubernetes client: {e}");
        }
    }
    options.resource = args.provisioner;
    // Whatever the log level (the default, warn, says nothing when all is
    // well): a newcomer sees that it is up, and where.
    let line = prepared.start_line(env!("CARGO_PKG_VERSION"));
    match global.log_format {
        telemetry::LogFormat::Human => eprintln!("{line}"),
        // One JSON object a line, as the logs are, for whatever reads them.
        telemetry::LogFormat::Json => eprintln!(
            "{}",
            serde_json::json!({
                "timestamp": chrono::Utc::now().to_rfc3339(),
                "level": "INFO",
                "fields": {"message": line},
                "target": "choria_provisioner::start",
            })
        ),
    }
    let provisioner = Provisioner::new(prepared.config, prepared.setup, options)?;
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        super::shutdown_signal().await;
        signal.cancel();
    });
    if args.progress {
        tokio::spawn(print_progress(provisioner.steering(), shutdown.clone()));
    }
    provisioner.run(shutdown).await?;
    Ok(())
}

/// `run --check`: everything `run` checks before it connects, then the
/// effective settings; nothing is connected to or started.
pub fn check(args: &RunArgs, _global: &GlobalArgs) -> ExitCode {
    match args.prepare() {
        Ok(prepared) => {
            for w in prepared.warnings() {
                eprintln!("warning: {w}");
            }
            print!("{}", prepared.report());
            eprintln!("configuration is valid");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {}", super::error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// go-choria v0.30.2's `UserConfig()` (`internal/util/util.go`): the first
/// of `$HOME/.choriarc`, `$HOME/.mcollective` (only when `HOME` is set),
/// `/etc/choria/client.conf`, `/usr/local/etc/choria/client.conf` that
/// exists, else `/etc/puppetlabs/mcollective/client.cfg`. Go checks no
/// uid: root reads `~/.choriarc` too.
pub fn user_config(home: Option<&Path>, exists: &dyn Fn(&Path) -> bool) -> PathBuf {
    if let Some(home) = home.filter(|h| !h.as_os_str().is_empty()) {
        for name in [".choriarc", ".mcollective"] {
            let candidate = home.join(name);
            if exists(&candidate) {
                return candidate;
            }
        }
    }
    for candidate in [
        "/etc/choria/client.conf",
        "/usr/local/etc/choria/client.conf",
    ] {
        if exists(Path::new(candidate)) {
            return PathBuf::from(candidate);
        }
    }
    PathBuf::from("/etc/puppetlabs/mcollective/client.cfg")
}

/// go-choria's `FileExist`: anything but "does not exist" counts as existing
/// (a file we may not read is found, and then fails to load with its reason).
fn go_file_exist(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
    }
}

/// One line per second on stderr: what the demo shows while it runs.
/// `not started`: names waiting in their lane; `in progress`: sequences
/// running (most waiting for replies); `working`: those holding a
/// `workers` slot; `remembered`: every node the registry holds, provisioned
/// ones included for 60 s (so one seen again at once is not worked twice).
/// The rate covers the time from the first node worked to the last
/// provisioned, so it stays put once the fleet is done instead of decaying.
async fn print_progress(steering: Arc<Steering>, stop: CancellationToken) {
    let started = Instant::now();
    // Sampled ten times a second so the rate's span is right to 0.1 s;
    // printed once a second.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut rate = RateWindow::default();
    // On a terminal the line is rewritten in place; into a file or a pipe
    // each second is a line of its own.
    let in_place = super::terminal::is_terminal(true);
    for n in 1u64.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => {
                if in_place {
                    eprintln!();
                }
                return;
            }
        }
        let m = steering.metrics();
        let v = |name: &str| m.value(name).unwrap_or(0.0) as u64;
        let provisioned = v("choria_provisioner_provisioned");
        let busy = v("choria_provisioner_busy_workers");
        let now = Instant::now();
        rate.observe(now, provisioned, busy > 0);
        if n % 10 != 0 {
            continue;
        }
        let line = format!(
            "[{:>5.1}s] provisioned {provisioned}  errors {}  not started {}  in progress {}  working {busy}  remembered {}  ({}){}",
            now.duration_since(started).as_secs_f64(),
            v("choria_provisioner_provision_errors"),
            v("choria_provisioner_pending_nodes"),
            v("choria_provisioner_sequences"),
            v("choria_provisioner_waiting_nodes"),
            match rate.per_minute() {
                Some(r) => format!("{r:.0} nodes/min"),
                None => "- nodes/min".into(),
            },
            if steering.is_paused() {
                "  PAUSED"
            } else {
                ""
            },
        );
        if in_place {
            // Back to the line's start, the old one cleared.
            eprint!("\r\x1b[2K{line}");
        } else {
            eprintln!("{line}");
        }
    }
}

/// Nodes per minute over the active span: from the first sample with work
/// going on to the last sample at which the provisioned count grew.
#[derive(Debug, Default)]
struct RateWindow {
    first_active: Option<(Instant, u64)>,
    last_growth: Option<(Instant, u64)>,
}

impl RateWindow {
    fn observe(&mut self, now: Instant, provisioned: u64, busy: bool) {
        if self.first_active.is_none() && (busy || provisioned > 0) {
            // Work already done before the first sample counts from here.
            self.first_active = Some((now, 0));
        }
        if provisioned > self.last_growth.map_or(0, |(_, n)| n) {
            self.last_growth = Some((now, provisioned));
        }
    }

    fn per_minute(&self) -> Option<f64> {
        let (start, base) = self.first_active?;
        let (end, n) = self.last_growth?;
        let span = end.duration_since(start).as_secs_f64().max(0.1);
        Some((n - base) as f64 / span * 60.0)
    }
}

/// Writes our PID on creation and removes the file on drop.
struct PidFile(PathBuf);

impl PidFile {
    fn write(path: &Path) -> Result<Self> {
        std::fs::write(path, std::process::id().to_string())
            .with_context(|| format!("could not write the PID file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn user_config_with(home: Option<&str>, existing: &[&str]) -> String {
        let existing: HashSet<PathBuf> = existing.iter().map(PathBuf::from).collect();
        user_config(home.map(Path::new), &|p| existing.contains(p))
            .display()
            .to_string()
    }

    #[test]
    fn user_config_prefers_choriarc_in_home() {
        let all = [
            "/home/u/.choriarc",
            "/home/u/.mcollective",
            "/etc/choria/client.conf",
            "/usr/local/etc/choria/client.conf",
        ];
        assert_eq!(user_config_with(Some("/home/u"), &all), "/home/u/.choriarc");
    }

    #[test]
    fn user_config_then_mcollective_in_home() {
        let existing = ["/home/u/.mcollective", "/etc/choria/client.conf"];
        assert_eq!(
            user_config_with(Some("/home/u"), &existing),
            "/home/u/.mcollective"
        );
    }

    #[test]
    fn user_config_reads_roots_home_too() {
        // Go's UserConfig has no uid check: root's ~/.choriarc wins as well.
        assert_eq!(
            user_config_with(
                Some("/root"),
                &["/root/.choriarc", "/etc/choria/client.conf"]
            ),
            "/root/.choriarc"
        );
    }

    #[test]
    fn user_config_then_etc_choria() {
        let existing = [
            "/etc/choria/client.conf",
            "/usr/local/etc/choria/client.conf",
        ];
        assert_eq!(
            user_config_with(Some("/home/u"), &existing),
            "/etc/choria/client.conf"
        );
    }

    #[test]
    fn user_config_then_usr_local() {
        assert_eq!(
            user_config_with(Some("/home/u"), &["/usr/local/etc/choria/client.conf"]),
            "/usr/local/etc/choria/client.conf"
        );
    }

    #[test]
    fn user_config_falls_back_to_the_puppetlabs_file_even_when_missing() {
        assert_eq!(
            user_config_with(Some("/home/u"), &[]),
            "/etc/puppetlabs/mcollective/client.cfg"
        );
    }

    #[test]
    fn user_config_skips_home_without_home() {
        // HOME unset or empty: the home files are not looked at.
        let existing = [
            "/.choriarc",
            ".choriarc",
            "/usr/local/etc/choria/client.conf",
        ];
        assert_eq!(
            user_config_with(None, &existing),
            "/usr/local/etc/choria/client.conf"
        );
        assert_eq!(
            user_config_with(Some(""), &existing),
            "/usr/local/etc/choria/client.conf"
        );
    }

    #[test]
    fn go_file_exist_counts_unreadable_as_existing() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        assert!(!go_file_exist(&f));
        std::fs::write(&f, "x").unwrap();
        assert!(go_file_exist(&f));
        // A path through a file fails with NotADirectory, not NotFound: Go's
        // os.IsNotExist is false for it too.
        assert!(go_file_exist(&f.join("below")));
    }

    #[test]
    fn the_rate_freezes_once_nothing_more_is_provisioned() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = RateWindow::default();
        r.observe(at(0), 0, false);
        assert_eq!(r.per_minute(), None);
        r.observe(at(1), 0, true);
        r.observe(at(2), 500, true);
        r.observe(at(3), 1000, false);
        let done = r.per_minute().unwrap();
        assert!((done - 30_000.0).abs() < 1e-6, "{done}");
        // Idle afterwards: the figure does not decay.
        for s in 4..60 {
            r.observe(at(s), 1000, false);
            assert_eq!(r.per_minute(), Some(done));
        }
    }
}
