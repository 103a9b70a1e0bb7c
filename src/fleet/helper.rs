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

use crate::choria::security::csr;
use crate::fleet::ca::{CertificateAuthority, PkiError};

/// Where nodes are sent when `--broker` is not given.
pub const DEFAULT_BROKER: &str = "nats://broker.example.net:4222";
/// How long certificates signed with `--ca-cert` last.
pub const CERTIFICATE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
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
        output.certificate = Some(
            ca.sign_csr(csr_pem, CERTIFICATE_VALIDITY)
                .map_err(sign_err)?,
        );
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
mod tests {
    use super::*;
    use crate::choria::security::csr::{make_csr, CsrSubject};
    use crate::fleet::ca::{certificate_common_name, verify_issued_by};
    use crate::provision::helper::HelperResponse;
    use clap::{CommandFactory, Parser};
    use serde_json::{json, Value};
    use std::sync::OnceLock;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FleetHelperArgs,
    }

    fn args(flags: &[&str]) -> FleetHelperArgs {
        let argv = std::iter::once("fleet-helper").chain(flags.iter().copied());
        Cli::try_parse_from(argv).unwrap().args
    }

    fn node_key() -> &'static rsa::RsaPrivateKey {
        crate::choria::security::csr::tests::test_key()
    }

    fn csr_for(cn: &str) -> String {
        make_csr(node_key(), &CsrSubject::new(cn)).unwrap()
    }

    /// Input shaped like the provisioner's, with every optional part set.
    fn full_input(identity: &str, csr: Option<&str>) -> Vec<u8> {
        json!({
            "identity": identity,
            "csr": csr.map(|c| json!({"csr": c, "public_key": "-----BEGIN PUBLIC KEY-----\n...", "ssldir": "/etc/choria/ssl"})),
            "ed25519_pubkey": {"public_key": "ab", "directory": "/etc/choria", "signature": "cd"},
            "inventory": "{\"agents\":[\"rpcutil\"]}",
            "jwt": {"chu": "nats://p:4222", "purl": ""},
        })
        .to_string()
        .into_bytes()
    }

    fn answer(args: &FleetHelperArgs, input: &[u8]) -> Value {
        let out = run(args, input).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        serde_json::from_slice(&out).unwrap()
    }

    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    /// A CA written to `dir`, as the files `--ca-cert`/`--ca-key` name.
    fn ca_files(dir: &Path) -> (PathBuf, PathBuf, String) {
        static CA: OnceLock<CertificateAuthority> = OnceLock::new();
        let ca = CA.get_or_init(|| {
            let key = csr::generate_rsa_key(1024).unwrap();
            CertificateAuthority::from_key("Fleet Test CA", key).unwrap()
        });
        let cert = dir.join("ca.pem");
        let key = dir.join("ca.key");
        std::fs::write(&cert, ca.cert_pem()).unwrap();
        std::fs::write(&key, ca.key_pem()).unwrap();
        (cert, key, ca.cert_pem())
    }

    fn path(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
        assert!(Cli::try_parse_from(["h", "--fail-match", "x"]).is_err());
        assert!(Cli::try_parse_from(["h", "--ca-cert", "c.pem"]).is_err());
        assert!(Cli::try_parse_from(["h", "--set", "novalue"]).is_err());
        assert!(Cli::try_parse_from(["h", "--set", "=v"]).is_err());
        assert!(Cli::try_parse_from(["h", "--shutdown-match", "("]).is_err());
        assert!(Cli::try_parse_from(["h", "--fail", "explode"]).is_err());
        assert_eq!(args(&["--fail", "exit1"]).fail, Some(FailMode::Exit1));
    }

    #[test]
    fn default_configuration_only() {
        let v = answer(&args(&[]), &full_input("node-000.example.net", None));
        assert_eq!(
            v,
            json!({"configuration": {
                "identity": "node-000.example.net",
                "loglevel": "info",
                "plugin.choria.middleware_hosts": DEFAULT_BROKER,
                "plugin.choria.server.provision": "false",
            }})
        );
    }

    #[test]
    fn input_without_csr_or_with_null_fields() {
        let a = args(&[]);
        for input in [
            json!({"identity": "n1"}),
            json!({"identity": "n1", "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null}),
            json!({"identity": "n1", "csr": {"csr": "", "public_key": "", "ssldir": ""}}),
            json!({"identity": "n1", "csr": {"csr": null, "ssldir": null}, "future_field": [1]}),
        ] {
            let v = answer(&a, input.to_string().as_bytes());
            assert_eq!(keys(&v), ["configuration"], "{input}");
            assert_eq!(v["configuration"]["identity"], "n1");
        }
    }

    #[test]
    fn invalid_input_is_an_error_naming_the_problem() {
        let a = args(&[]);
        for (input, expect) in [
            (
                &b"<html>"[..],
                "invalid input JSON: expected value at line 1 column 1",
            ),
            (b"{}", "missing field `identity`"),
            (br#"{"identity": 7}"#, "invalid type: integer `7`"),
            (
                br#"{"identity": "n1", "csr": "pem"}"#,
                "invalid type: string",
            ),
            (br#"{"identity": ""}"#, "invalid identity \"\": it is empty"),
        ] {
            let err = run(&a, input).unwrap_err().to_string();
            assert!(err.contains(expect), "{err}");
            let (code, out, stderr) = serve_capture(&a, input);
            assert_eq!(code, EXIT_ERROR);
            assert!(out.is_empty());
            assert!(stderr.contains(expect), "{stderr}");
        }
    }

    #[test]
    fn broker_and_settings() {
        let a = args(&[
            "--broker",
            "nats://b1:4222,nats://b2:4222",
            "--set",
            "plugin.choria.srv_domain=example.net",
            "--set",
            "loglevel=debug",
            "--set",
            "with.equals=a=b",
        ]);
        let v = answer(&a, &full_input("n1", None));
        let c = &v["configuration"];
        assert_eq!(
            c["plugin.choria.middleware_hosts"],
            "nats://b1:4222,nats://b2:4222"
        );
        assert_eq!(c["plugin.choria.srv_domain"], "example.net");
        assert_eq!(c["loglevel"], "debug");
        assert_eq!(c["with.equals"], "a=b");
        assert_eq!(c["plugin.choria.server.provision"], "false");
    }

    #[test]
    fn upgrade_and_server_claims() {
        let a = args(&[
            "--upgrade",
            "0.31.0",
            "--collectives",
            "mcollective,prod",
            "--org",
            "acme",
        ]);
        let out = run(&a, &full_input("n1", None)).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["upgrade"], "0.31.0");
        assert_eq!(
            v["server_claims"],
            json!({"collectives": ["mcollective", "prod"], "ou": "acme"})
        );
        // the provisioner reads it back as intended
        let r = HelperResponse::from_json(&out).unwrap();
        assert_eq!(r.upgrade, "0.31.0");
        let claims = r.server_claims.unwrap();
        assert_eq!(claims.collectives, ["mcollective", "prod"]);
        assert_eq!(claims.organization_unit, "acme");

        let only_org = answer(&args(&["--org", "acme"]), &full_input("n1", None));
        assert_eq!(only_org["server_claims"], json!({"ou": "acme"}));
    }

    #[test]
    fn key_file_is_shipped() {
        let dir = tempfile::tempdir().unwrap();
        let key_path = dir.path().join("node.key");
        let key_pem = csr::private_key_pkcs1_pem(node_key()).unwrap();
        std::fs::write(&key_path, &key_pem).unwrap();
        let v = answer(
            &args(&["--key-file", path(&key_path)]),
            &full_input("n1", None),
        );
        assert_eq!(v["key"], key_pem.as_str());

        let missing = dir.path().join("missing.key");
        let err = run(
            &args(&["--key-file", path(&missing)]),
            &full_input("n1", None),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(&format!("could not read --key-file {}", missing.display())),
            "{err}"
        );
    }

    #[test]
    fn ca_signs_the_node_csr() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, ca_pem) = ca_files(dir.path());
        let a = args(&["--ca-cert", path(&cert), "--ca-key", path(&key)]);
        let identity = "node-001.example.net";
        let out = run(&a, &full_input(identity, Some(&csr_for(identity)))).unwrap();
        let r = HelperResponse::from_json(&out).unwrap();
        verify_issued_by(&r.certificate, &ca_pem).unwrap();
        assert_eq!(certificate_common_name(&r.certificate).unwrap(), identity);
        assert_eq!(r.ca, ca_pem);
        assert_eq!(r.ssldir, "/etc/choria/ssl");
        assert_eq!(r.configuration["identity"], identity);
        assert!(r.key.is_empty());

        // loaded once: later runs use the cached CA even if the files go away
        std::fs::remove_file(&key).unwrap();
        let again = run(&a, &full_input("n2", Some(&csr_for("n2")))).unwrap();
        let r = HelperResponse::from_json(&again).unwrap();
        assert_eq!(certificate_common_name(&r.certificate).unwrap(), "n2");

        // no CSR, nothing to sign
        let v = answer(&a, &full_input("n3", None));
        assert_eq!(keys(&v), ["configuration"]);
    }

    #[test]
    fn ca_refuses_bad_csrs() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, _) = ca_files(dir.path());
        let a = args(&["--ca-cert", path(&cert), "--ca-key", path(&key)]);
        let err = run(&a, &full_input("n1", Some(&csr_for("other.example.net"))))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "CSR common name \"other.example.net\" does not match identity \"n1\""
        );
        let err = run(&a, &full_input("n1", Some("garbage")))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("could not sign the CSR of n1: "), "{err}");
    }

    #[test]
    fn unusable_ca_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _, _) = ca_files(dir.path());
        let input = full_input("n1", Some(&csr_for("n1")));
        let wrong_key = dir.path().join("wrong.key");
        std::fs::write(&wrong_key, csr::private_key_pkcs1_pem(node_key()).unwrap()).unwrap();
        let err = run(
            &args(&["--ca-cert", path(&cert), "--ca-key", path(&wrong_key)]),
            &input,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                FleetHelperError::Ca {
                    source: PkiError::KeyMismatch,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.to_string().contains("PRIVATE KEY"), "{err}");
        let missing = dir.path().join("nope.pem");
        let err = run(
            &args(&["--ca-cert", path(&missing), "--ca-key", path(&wrong_key)]),
            &input,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            FleetHelperError::Read {
                what: "--ca-cert",
                ..
            }
        ));
    }

    #[test]
    fn defer_once_then_provision() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(&["--defer-once-dir", path(dir.path())]);
        let first = answer(&a, &full_input("n1", None));
        assert_eq!(first, json!({"defer": true, "msg": DEFER_MSG}));
        assert!(dir.path().join("n1").exists());
        let second = answer(&a, &full_input("n1", None));
        assert_eq!(keys(&second), ["configuration"]);
        // other identities are deferred on their own first run
        assert_eq!(answer(&a, &full_input("n2", None))["defer"], true);

        let r = HelperResponse::from_json(&run(&a, &full_input("n3", None)).unwrap()).unwrap();
        assert!(r.defer && !r.shutdown && r.msg == DEFER_MSG);
    }

    #[test]
    fn defer_once_is_safe_for_concurrent_runs() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(&["--defer-once-dir", path(dir.path())]);
        let input = full_input("n1", None);
        let deferred = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| answer(&a, &input)["defer"] == true))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .filter(|d| *d)
                .count()
        });
        assert_eq!(deferred, 1);
    }

    #[test]
    fn defer_once_refuses_identities_that_are_not_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(&["--defer-once-dir", path(dir.path())]);
        for bad in ["../escape", "..", "a/b", "a\\b"] {
            let err = run(&a, &full_input(bad, None)).unwrap_err();
            assert!(matches!(err, FleetHelperError::Identity { .. }), "{err}");
        }
        assert!(!dir.path().parent().unwrap().join("escape").exists());
        let err = run(
            &args(&["--defer-once-dir", path(&dir.path().join("missing"))]),
            &full_input("n1", None),
        )
        .unwrap_err();
        assert!(matches!(err, FleetHelperError::DeferMarker { .. }), "{err}");
    }

    #[test]
    fn shutdown_match() {
        let dir = tempfile::tempdir().unwrap();
        let a = args(&[
            "--shutdown-match",
            r"^bad-\d+\.",
            "--defer-once-dir",
            path(dir.path()),
        ]);
        let v = answer(&a, &full_input("bad-1.example.net", None));
        assert_eq!(v, json!({"shutdown": true, "msg": SHUTDOWN_MSG}));
        // shutdown wins over deferring
        assert!(!dir.path().join("bad-1.example.net").exists());
        let v = answer(&a, &full_input("notbad-1.example.net", None));
        assert_eq!(v["defer"], true);
    }

    fn serve_capture(args: &FleetHelperArgs, input: &[u8]) -> (u8, Vec<u8>, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = serve(args, input, &mut out, &mut err, || {
            panic!("hang was not asked for")
        });
        (code, out, String::from_utf8(err).unwrap())
    }

    #[test]
    fn failure_modes() {
        let input = full_input("n1", None);
        let (code, out, err) = serve_capture(&args(&["--fail", "crash"]), &input);
        assert_eq!((code, out.as_slice()), (EXIT_CRASH, &b""[..]));
        assert!(err.contains("simulated crash for n1"), "{err}");

        let (code, out, _) = serve_capture(&args(&["--fail", "garbage"]), &input);
        assert_eq!((code, out.as_slice()), (0, &b"this is not json\n"[..]));

        let (code, out, err) = serve_capture(&args(&["--fail", "empty"]), &input);
        assert_eq!((code, out.len(), err.len()), (0, 0, 0));

        let (code, out, _) = serve_capture(&args(&["--fail", "exit1"]), &input);
        assert_eq!(code, 1);
        assert_eq!(
            HelperResponse::from_json(&out).unwrap().configuration["identity"],
            "n1"
        );

        let mut hung = false;
        let mut out = Vec::new();
        let code = serve(
            &args(&["--fail", "hang"]),
            &input,
            &mut out,
            &mut Vec::new(),
            || hung = true,
        );
        assert!(hung);
        assert_eq!(code, 0);
        assert!(HelperResponse::from_json(&out).is_ok());
    }

    #[test]
    fn fail_match_selects_nodes() {
        let a = args(&["--fail", "crash", "--fail-match", "^n1$"]);
        assert_eq!(a.failure_for("n1"), Some(FailMode::Crash));
        assert_eq!(a.failure_for("n10"), None);
        assert_eq!(
            args(&["--fail", "empty"]).failure_for("x"),
            Some(FailMode::Empty)
        );
        assert_eq!(args(&[]).failure_for("x"), None);

        let (code, out, _) = serve_capture(&a, &full_input("n10", None));
        assert_eq!(code, 0);
        assert!(HelperResponse::from_json(&out).is_ok());
        assert_eq!(serve_capture(&a, &full_input("n1", None)).0, EXIT_CRASH);
    }
}
