//! `choria-provisioner fleet-helper`: the reference helper, run once per node
//! (no async runtime, nothing logged on stdout).

use choria_fleet::helper::{self, FailMode, FleetHelperOptions, DEFAULT_BROKER};
use regex::Regex;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The command line of [`FleetHelperOptions`]; the defaults here and in
/// `FleetHelperOptions::default()` are kept equal by a test.
#[derive(clap::Args, Debug, Clone)]
pub struct FleetHelperArgs {
    /// NATS broker the provisioned nodes connect to (`plugin.choria.middleware_hosts`).
    #[arg(long, value_name = "URL", default_value = DEFAULT_BROKER)]
    pub broker: String,

    /// Extra configuration setting for every node; repeat for more. Overrides
    /// the built-in settings of the same name.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    pub settings: Vec<(String, String)>,

    /// CA certificate (PEM) to sign node CSRs with, valid for one year. Needs --ca-key.
    #[arg(long, value_name = "FILE", requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,

    /// Unencrypted RSA private key (PKCS#1 or PKCS#8 PEM) of --ca-cert.
    #[arg(long, value_name = "FILE", requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,

    /// How long the certificates it signs are valid (a Choria duration
    /// such as `1y` or `2m`: short ones exercise renewal).
    #[arg(long, value_name = "DURATION", value_parser = validity, default_value = "1y")]
    pub validity: Duration,

    /// PEM private key to ship to every node as its `key`.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Ask nodes to upgrade to this version before configuring them.
    #[arg(long, value_name = "VERSION")]
    pub upgrade: Option<String>,

    /// Collectives for the nodes' server JWT claims (comma separated).
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub collectives: Vec<String>,

    /// Organization unit (`ou`) for the nodes' server JWT claims.
    #[arg(long, value_name = "OU")]
    pub org: Option<String>,

    /// Defer each node once: its first run creates DIR/<identity> and answers
    /// `defer`, later runs provision it.
    #[arg(long, value_name = "DIR")]
    pub defer_once_dir: Option<PathBuf>,

    /// Tell nodes whose identity matches this regular expression (unanchored)
    /// to shut down.
    #[arg(long, value_name = "REGEX", value_parser = Regex::new)]
    pub shutdown_match: Option<Regex>,

    /// Misbehave like a broken helper (for the nodes selected by --fail-match).
    #[arg(long, value_name = "MODE", value_enum)]
    pub fail: Option<FailModeArg>,

    /// Only fail for identities matching this regular expression (unanchored;
    /// default: every node).
    #[arg(long, value_name = "REGEX", value_parser = Regex::new, requires = "fail")]
    pub fail_match: Option<Regex>,
}

/// [`FailMode`] as `--fail` spells it; the per-value docs are what `--help`
/// lists.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailModeArg {
    /// Sleep for an hour before answering (the provisioner's timeout should
    /// kill it first).
    Hang,
    /// Print an error to stderr and exit with status 3, no output.
    Crash,
    /// Print `this is not json` and exit 0.
    Garbage,
    /// Print nothing and exit 0.
    Empty,
    /// Print a valid response but exit with status 1.
    #[value(name = "exit1")]
    Exit1,
}

impl From<FailModeArg> for FailMode {
    fn from(arg: FailModeArg) -> Self {
        match arg {
            FailModeArg::Hang => FailMode::Hang,
            FailModeArg::Crash => FailMode::Crash,
            FailModeArg::Garbage => FailMode::Garbage,
            FailModeArg::Empty => FailMode::Empty,
            FailModeArg::Exit1 => FailMode::Exit1,
        }
    }
}

impl From<FleetHelperArgs> for FleetHelperOptions {
    fn from(args: FleetHelperArgs) -> Self {
        // Destructured so that a new flag cannot be left out of the options.
        let FleetHelperArgs {
            broker,
            settings,
            ca_cert,
            ca_key,
            validity,
            key_file,
            upgrade,
            collectives,
            org,
            defer_once_dir,
            shutdown_match,
            fail,
            fail_match,
        } = args;
        FleetHelperOptions {
            broker,
            settings,
            ca_cert,
            ca_key,
            validity,
            key_file,
            upgrade,
            collectives,
            org,
            defer_once_dir,
            shutdown_match,
            fail: fail.map(Into::into),
            fail_match,
        }
    }
}

/// `KEY=VALUE`, split at the first `=`: values may hold `=` themselves.
fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// A whole number and a unit: `s`, `m`, `h`, `d`, `w` or `y`.
fn validity(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 2m, 1h or 1y"))?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "y" => 365 * 86_400,
        _ => return Err(format!("{s:?}: the unit is one of s, m, h, d, w, y")),
    };
    Ok(Duration::from_secs(n * unit))
}

/// Answers the node on stdin; the exit status is the helper's own (see
/// `choria_fleet::helper::main_with_stdio`).
pub fn run(args: FleetHelperArgs) -> ExitCode {
    helper::main_with_stdio(&args.into())
}

#[cfg(test)]
mod tests;
