//! `choria-provisioner fleet-helper`: a reference provisioning helper for the
//! simulated fleet.
//!
//! The provisioner runs its helper once per node with the node's details as
//! JSON on stdin and reads the configuration to ship from stdout. This helper
//! answers with a working configuration pointing at `--broker`, optionally
//! signs the node's CSR with a local CA, and can be told to defer, shut down
//! or misbehave for chosen nodes, so every branch of the provisioner can be
//! exercised against `choria-provisioner fleet` without touching real
//! infrastructure.
//!
//! It runs once per node (thousands of times in a benchmark), so it does no
//! network I/O and as little work as possible: the input's inventory and JWT
//! are never parsed.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::ca::{CertificateAuthority, PkiError};
use choria_wire::security::csr;

/// Where nodes are sent when `--broker` is not given.
pub const DEFAULT_BROKER: &str = "nats://broker.example.net:4222";
/// How long certificates signed with `--ca-cert` last.
pub const CERTIFICATE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
// (The default of `--validity`.)
/// How long `--fail hang` sleeps: far longer than any sane helper timeout.
pub const HANG_FOR: Duration = Duration::from_secs(3600);
/// Exit status for bad input, bad options and other real errors.
pub const EXIT_ERROR: u8 = 2;
/// Exit status of `--fail crash`.
pub const EXIT_CRASH: u8 = 3;

const DEFER_MSG: &str = "deferred once by fleet-helper";
const SHUTDOWN_MSG: &str = "shut down by fleet-helper: identity matches --shutdown-match";

/// Options of `choria-provisioner fleet-helper`.
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
    pub fail: Option<FailMode>,

    /// Only fail for identities matching this regular expression (unanchored;
    /// default: every node).
    #[arg(long, value_name = "REGEX", value_parser = Regex::new, requires = "fail")]
    pub fail_match: Option<Regex>,
}

/// The ways `--fail` makes the helper misbehave.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
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

impl FleetHelperArgs {
    /// The failure to simulate for `identity`, if any.
    pub fn failure_for(&self, identity: &str) -> Option<FailMode> {
        let mode = self.fail?;
        match &self.fail_match {
            Some(re) if !re.is_match(identity) => None,
            _ => Some(mode),
        }
    }
}

fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Why the helper could not answer. Never contains key material.
#[derive(Debug, thiserror::Error)]
pub enum FleetHelperError {
    /// stdin is not the provisioner's helper input.
    #[error("invalid input JSON: {0}")]
    Input(#[source] serde_json::Error),
    /// The identity is empty or unusable.
    #[error("invalid identity {identity:?}: {reason}")]
    Identity {
        /// The identity as received.
        identity: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The CSR is for another node.
    #[error("CSR common name {common_name:?} does not match identity {identity:?}")]
    CsrIdentity {
        /// The CSR's CN.
        common_name: String,
        /// The node's identity.
        identity: String,
    },
    /// The CSR could not be parsed, verified or signed.
    #[error("could not sign the CSR of {identity}: {source}")]
    Sign {
        /// The node's identity.
        identity: String,
        /// What went wrong.
        #[source]
        source: PkiError,
    },
    /// A file named on the command line could not be read.
    #[error("could not read {what} {}: {source}", path.display())]
    Read {
        /// Which option named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--ca-cert` / `--ca-key` do not make a usable CA.
    #[error("could not load the CA from {} and {}: {source}", cert.display(), key.display())]
    Ca {
        /// `--ca-cert`.
        cert: PathBuf,
        /// `--ca-key`.
        key: PathBuf,
        /// Why.
        #[source]
        source: PkiError,
    },
    /// The `--defer-once-dir` marker could not be created.
    #[error("--defer-once-dir: could not create {}: {source}", path.display())]
    DeferMarker {
        /// The marker file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The response could not be encoded.
    #[error("could not encode the response: {0}")]
    Output(#[source] serde_json::Error),
}

/// The parts of the provisioner's helper input this helper uses; other keys
/// (`inventory`, `jwt`, `ed25519_pubkey`, and any the provisioner adds later)
/// are skipped unparsed, like Go's `json.Unmarshal` would.
#[derive(Deserialize)]
struct Input {
    identity: String,
    #[serde(default)]
    csr: Option<CsrInput>,
}

#[derive(Deserialize)]
struct CsrInput {
    #[serde(default)]
    csr: Option<String>,
    #[serde(default)]
    ssldir: Option<String>,
}

/// The helper's answer; unset keys are left out.
#[derive(Serialize, Default)]
struct Output {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    defer: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shutdown: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    msg: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    certificate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ssldir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_claims: Option<ServerClaims>,
    /// `None` only in defer and shutdown answers, where it would be ignored.
    #[serde(skip_serializing_if = "Option::is_none")]
    configuration: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upgrade: Option<String>,
}

#[derive(Serialize)]
struct ServerClaims {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    collectives: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ou: Option<String>,
}

/// Answers one helper input (stdin bytes) with the response (stdout bytes,
/// newline terminated). `--fail` is not applied here: it is about the
/// process's streams and exit status, which [`main_with_stdio`] owns.
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

pub fn run(args: &FleetHelperArgs, input: &[u8]) -> Result<Vec<u8>, FleetHelperError> {
    respond(args, &parse_input(input)?)
}

fn parse_input(input: &[u8]) -> Result<Input, FleetHelperError> {
    let input: Input = serde_json::from_slice(input).map_err(FleetHelperError::Input)?;
    if input.identity.is_empty() {
        return Err(FleetHelperError::Identity {
            identity: input.identity,
            reason: "it is empty",
        });
    }
    Ok(input)
}

fn respond(args: &FleetHelperArgs, input: &Input) -> Result<Vec<u8>, FleetHelperError> {
    let identity = input.identity.as_str();
    let output = if args
        .shutdown_match
        .as_ref()
        .is_some_and(|re| re.is_match(identity))
    {
        Output {
            shutdown: true,
            msg: Some(SHUTDOWN_MSG),
            ..Default::default()
        }
    } else if first_sighting(args.defer_once_dir.as_deref(), identity)? {
        Output {
            defer: true,
            msg: Some(DEFER_MSG),
            ..Default::default()
        }
    } else {
        provision(args, input)?
    };
    let mut out = serde_json::to_vec(&output).map_err(FleetHelperError::Output)?;
    out.push(b'\n');
    Ok(out)
}

/// True the first time `identity` is seen with `--defer-once-dir`. The marker
/// is made with `create_new`, so of several concurrent runs exactly one
/// defers.
fn first_sighting(dir: Option<&Path>, identity: &str) -> Result<bool, FleetHelperError> {
    let Some(dir) = dir else {
        return Ok(false);
    };
    // The identity becomes a file name: nothing may lead outside `dir`.
    if identity == "." || identity == ".." || identity.contains(['/', '\\', '\0']) {
        return Err(FleetHelperError::Identity {
            identity: identity.to_string(),
            reason: "it cannot be used as a file name in --defer-once-dir",
        });
    }
    let path = dir.join(identity);
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(FleetHelperError::DeferMarker { path, source }),
    }
}

fn provision(args: &FleetHelperArgs, input: &Input) -> Result<Output, FleetHelperError> {
    let identity = &input.identity;
    let mut configuration = BTreeMap::from([
        ("identity".to_string(), identity.clone()),
        (
            "plugin.choria.server.provision".to_string(),
            "false".to_string(),
        ),
        (
            "plugin.choria.middleware_hosts".to_string(),
            args.broker.clone(),
        ),
        ("loglevel".to_string(), "info".to_string()),
    ]);
    configuration.extend(args.settings.iter().cloned());

    let mut output = Output {
        configuration: Some(configuration),
        upgrade: args.upgrade.clone(),
        ..Default::default()
    };
    if !args.collectives.is_empty() || args.org.is_some() {
        output.server_claims = Some(ServerClaims {
            collectives: args.collectives.clone(),
            ou: args.org.clone(),
        });
    }
    if let Some(path) = &args.key_file {
        output.key = Some(read(path, "--key-file")?);
    }

    let csr_input = input.csr.as_ref();
    let csr_pem = csr_input
        .and_then(|c| c.csr.as_deref())
        .filter(|c| !c.is_empty());
    if let (Some(csr_pem), Some(ca)) = (csr_pem, load_ca(args)?) {
        let sign_err = |source| FleetHelperError::Sign {
            identity: identity.clone(),
            source,
        };
        // A shared CA must not hand one node a certificate for another.
        let common_name = csr::parse_csr(csr_pem)
            .map_err(|e| sign_err(e.into()))?
            .common_name;
        if common_name != *identity {
            return Err(FleetHelperError::CsrIdentity {
                common_name,
                identity: identity.clone(),
            });
        }
        output.certificate = Some(ca.sign_csr(csr_pem, args.validity).map_err(sign_err)?);
        output.ca = Some(ca.cert_pem());
        output.ssldir = csr_input
            .and_then(|c| c.ssldir.clone())
            .filter(|s| !s.is_empty());
    }
    Ok(output)
}

fn read(path: &Path, what: &'static str) -> Result<String, FleetHelperError> {
    std::fs::read_to_string(path).map_err(|source| FleetHelperError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The `--ca-cert`/`--ca-key` CA, loaded once per process however often
/// [`run`] is called (benchmarks call it in a loop).
fn load_ca(args: &FleetHelperArgs) -> Result<Option<Arc<CertificateAuthority>>, FleetHelperError> {
    type Cache = Mutex<HashMap<(PathBuf, PathBuf), Arc<CertificateAuthority>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();

    let (Some(cert), Some(key)) = (&args.ca_cert, &args.ca_key) else {
        return Ok(None);
    };
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let slot = (cert.clone(), key.clone());
    if let Some(ca) = cache.get(&slot) {
        return Ok(Some(Arc::clone(ca)));
    }
    let ca = CertificateAuthority::from_pem(&read(cert, "--ca-cert")?, &read(key, "--ca-key")?)
        .map_err(|source| FleetHelperError::Ca {
            cert: cert.clone(),
            key: key.clone(),
            source,
        })?;
    let ca = Arc::new(ca);
    cache.insert(slot, Arc::clone(&ca));
    Ok(Some(ca))
}

/// The whole helper process: reads stdin, writes the answer to stdout,
/// applies `--fail`, and returns the exit status (2 for errors, reported on
/// stderr).
pub fn main_with_stdio(args: &FleetHelperArgs) -> ExitCode {
    let mut input = Vec::new();
    if let Err(e) = io::stdin().lock().read_to_end(&mut input) {
        eprintln!("fleet-helper: could not read stdin: {e}");
        return ExitCode::from(EXIT_ERROR);
    }
    let code = serve(
        args,
        &input,
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
        || std::thread::sleep(HANG_FOR),
    );
    ExitCode::from(code)
}

/// [`main_with_stdio`] with its streams and the hang passed in, for tests.
fn serve(
    args: &FleetHelperArgs,
    input: &[u8],
    out: &mut dyn Write,
    err: &mut dyn Write,
    hang: impl FnOnce(),
) -> u8 {
    // Writes to stderr are best effort: there is nowhere else to report.
    let input = match parse_input(input) {
        Ok(i) => i,
        Err(e) => {
            let _ = writeln!(err, "fleet-helper: {e}");
            return EXIT_ERROR;
        }
    };
    let mut code = 0;
    match args.failure_for(&input.identity) {
        Some(FailMode::Hang) => hang(),
        Some(FailMode::Crash) => {
            let _ = writeln!(
                err,
                "fleet-helper: simulated crash for {} (--fail crash)",
                input.identity
            );
            return EXIT_CRASH;
        }
        Some(FailMode::Garbage) => return write_out(out, err, b"this is not json\n", 0),
        Some(FailMode::Empty) => return 0,
        Some(FailMode::Exit1) => code = 1,
        None => {}
    }
    match respond(args, &input) {
        Ok(response) => write_out(out, err, &response, code),
        Err(e) => {
            let _ = writeln!(err, "fleet-helper: {}: {e}", input.identity);
            EXIT_ERROR
        }
    }
}

fn write_out(out: &mut dyn Write, err: &mut dyn Write, bytes: &[u8], code: u8) -> u8 {
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => code,
        Err(e) => {
            let _ = writeln!(err, "fleet-helper: could not write stdout: {e}");
            EXIT_ERROR
        }
    }
}

#[cfg(test)]
mod tests;
