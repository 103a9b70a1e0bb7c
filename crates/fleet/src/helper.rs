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
/// How long certificates signed with `--ca-cert` last unless `--validity`
/// says otherwise.
pub const CERTIFICATE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long `--fail hang` sleeps: far longer than any sane helper timeout.
pub const HANG_FOR: Duration = Duration::from_secs(3600);
/// Exit status for bad input, bad options and other real errors.
pub const EXIT_ERROR: u8 = 2;
/// Exit status of `--fail crash`.
pub const EXIT_CRASH: u8 = 3;

const DEFER_MSG: &str = "deferred once by fleet-helper";
const SHUTDOWN_MSG: &str = "shut down by fleet-helper: identity matches --shutdown-match";

/// What `choria-provisioner fleet-helper` can be told (`cmd::fleet_helper`
/// in the binary turns its command line into these).
#[derive(Debug, Clone)]
pub struct FleetHelperOptions {
    /// NATS broker the provisioned nodes connect to (`plugin.choria.middleware_hosts`).
    pub broker: String,
    /// Extra configuration settings for every node; they override the
    /// built-in settings of the same name.
    pub settings: Vec<(String, String)>,
    /// CA certificate (PEM) to sign node CSRs with; used with `ca_key`.
    pub ca_cert: Option<PathBuf>,
    /// Unencrypted RSA private key (PKCS#1 or PKCS#8 PEM) of `ca_cert`.
    pub ca_key: Option<PathBuf>,
    /// How long the certificates it signs are valid.
    pub validity: Duration,
    /// PEM private key to ship to every node as its `key`.
    pub key_file: Option<PathBuf>,
    /// Ask nodes to upgrade to this version before configuring them.
    pub upgrade: Option<String>,
    /// Collectives for the nodes' server JWT claims.
    pub collectives: Vec<String>,
    /// Organization unit (`ou`) for the nodes' server JWT claims.
    pub org: Option<String>,
    /// Defer each node once: its first run creates a file named after its
    /// identity in this directory and answers `defer`, later runs provision it.
    pub defer_once_dir: Option<PathBuf>,
    /// Tell nodes whose identity matches (unanchored) to shut down.
    pub shutdown_match: Option<Regex>,
    /// Misbehave like a broken helper (for the nodes selected by `fail_match`).
    pub fail: Option<FailMode>,
    /// Only fail for identities matching (unanchored; `None`: every node).
    pub fail_match: Option<Regex>,
}

impl Default for FleetHelperOptions {
    /// The command line's defaults (a test of `cmd::fleet_helper` keeps them
    /// equal): a working configuration pointing at [`DEFAULT_BROKER`], no
    /// CA, no misbehaviour.
    fn default() -> Self {
        FleetHelperOptions {
            broker: DEFAULT_BROKER.into(),
            settings: Vec::new(),
            ca_cert: None,
            ca_key: None,
            validity: CERTIFICATE_VALIDITY,
            key_file: None,
            upgrade: None,
            collectives: Vec::new(),
            org: None,
            defer_once_dir: None,
            shutdown_match: None,
            fail: None,
            fail_match: None,
        }
    }
}

/// The ways `--fail` makes the helper misbehave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    Exit1,
}

impl FleetHelperOptions {
    /// The failure to simulate for `identity`, if any.
    pub fn failure_for(&self, identity: &str) -> Option<FailMode> {
        let mode = self.fail?;
        match &self.fail_match {
            Some(re) if !re.is_match(identity) => None,
            _ => Some(mode),
        }
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
pub fn run(opts: &FleetHelperOptions, input: &[u8]) -> Result<Vec<u8>, FleetHelperError> {
    respond(opts, &parse_input(input)?)
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

fn respond(opts: &FleetHelperOptions, input: &Input) -> Result<Vec<u8>, FleetHelperError> {
    let identity = input.identity.as_str();
    let output = if opts
        .shutdown_match
        .as_ref()
        .is_some_and(|re| re.is_match(identity))
    {
        Output {
            shutdown: true,
            msg: Some(SHUTDOWN_MSG),
            ..Default::default()
        }
    } else if first_sighting(opts.defer_once_dir.as_deref(), identity)? {
        Output {
            defer: true,
            msg: Some(DEFER_MSG),
            ..Default::default()
        }
    } else {
        provision(opts, input)?
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

fn provision(opts: &FleetHelperOptions, input: &Input) -> Result<Output, FleetHelperError> {
    let identity = &input.identity;
    let mut configuration = BTreeMap::from([
        ("identity".to_string(), identity.clone()),
        (
            "plugin.choria.server.provision".to_string(),
            "false".to_string(),
        ),
        (
            "plugin.choria.middleware_hosts".to_string(),
            opts.broker.clone(),
        ),
        ("loglevel".to_string(), "info".to_string()),
    ]);
    configuration.extend(opts.settings.iter().cloned());

    let mut output = Output {
        configuration: Some(configuration),
        upgrade: opts.upgrade.clone(),
        ..Default::default()
    };
    if !opts.collectives.is_empty() || opts.org.is_some() {
        output.server_claims = Some(ServerClaims {
            collectives: opts.collectives.clone(),
            ou: opts.org.clone(),
        });
    }
    if let Some(path) = &opts.key_file {
        output.key = Some(read(path, "--key-file")?);
    }

    let csr_input = input.csr.as_ref();
    let csr_pem = csr_input
        .and_then(|c| c.csr.as_deref())
        .filter(|c| !c.is_empty());
    if let (Some(csr_pem), Some(ca)) = (csr_pem, load_ca(opts)?) {
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
        output.certificate = Some(ca.sign_csr(csr_pem, opts.validity).map_err(sign_err)?);
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
fn load_ca(
    opts: &FleetHelperOptions,
) -> Result<Option<Arc<CertificateAuthority>>, FleetHelperError> {
    type Cache = Mutex<HashMap<(PathBuf, PathBuf), Arc<CertificateAuthority>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();

    let (Some(cert), Some(key)) = (&opts.ca_cert, &opts.ca_key) else {
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
pub fn main_with_stdio(opts: &FleetHelperOptions) -> ExitCode {
    let mut input = Vec::new();
    if let Err(e) = io::stdin().lock().read_to_end(&mut input) {
        eprintln!("fleet-helper: could not read stdin: {e}");
        return ExitCode::from(EXIT_ERROR);
    }
    let code = serve(
        opts,
        &input,
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
        || std::thread::sleep(HANG_FOR),
    );
    ExitCode::from(code)
}

/// [`main_with_stdio`] with its streams and the hang passed in, for tests.
fn serve(
    opts: &FleetHelperOptions,
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
    match opts.failure_for(&input.identity) {
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
    match respond(opts, &input) {
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
