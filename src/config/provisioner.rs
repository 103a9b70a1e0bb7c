//! `provisioner.yaml`, as the Go provisioner's `config.Load` reads it.
//!
//! Same keys, same defaults, same checks (interval ≥ 1m, lifecycle component
//! without `.`, `*`, `>`, `pki` and `ed25519` mutually exclusive, `ed25519`
//! turning `jwt` on, the default certificate deny list, `server_jwt_validity`
//! defaulting to 1y). Read like Go reads it: keys match case-insensitively, the
//! last duplicate wins, `null` keeps the default, YAML 1.1 booleans (`yes`,
//! `on`) work, unknown keys are ignored — and reported as warnings.
//!
//! On top of Go's checks, settings without which no node could ever be
//! provisioned are errors at start-up instead of failures on every node:
//! `helper` is required, `jwt_verify_cert` is required with `features.jwt`,
//! `jwt_signing_key` with `features.ed25519`, deny-list patterns must compile,
//! `workers` must not be negative. [`ProvisionerConfig::check_files`] (part of
//! [`ProvisionerConfig::load`]) additionally checks that the helper and the key
//! files exist and parse.
//!
//! Two Go behaviours are deliberately not copied: an unset `logfile` logs to
//! stdout (Go writes to a file called `info` in the working directory), and
//! `server_jwt_validity` must be positive.

use super::duration::format_duration;
use super::election::ElectionConfig;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning, Secret};
use crate::choria::security::csr::{compile_deny_list, DEFAULT_CERT_DENY_LIST};
use crate::choria::security::tokens::{
    parse_client_id_token_unverified, ClientIdClaims, KeyError, TokenSigningKey, TokenVerifyKey,
};
use regex::Regex;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `lifecycle_component` when unset or empty.
pub const DEFAULT_LIFECYCLE_COMPONENT: &str = "provision_mode_server";
/// `interval` when unset.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest `interval` the Go provisioner accepts.
pub const MIN_INTERVAL: Duration = Duration::from_secs(60);
/// `server_jwt_validity` when unset or empty (`1y`).
pub const DEFAULT_SERVER_JWT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// `discovery_timeout` when unset: the longest one broadcast discovery may
/// take. Go fixes it at 2 s, which a large fleet can outlast.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// `discovery_window` when unset: discovery ends once no reply came for this
/// long (Go: 300 ms, too tight when a big fleet answers a broadcast).
pub const DEFAULT_DISCOVERY_WINDOW: Duration = Duration::from_secs(1);
/// `helper_timeout` when unset (Go's fixed value).
pub const DEFAULT_HELPER_TIMEOUT: Duration = Duration::from_secs(10);

const KEYS: &[&str] = &[
    "workers",
    "interval",
    "logfile",
    "loglevel",
    "helper",
    "token",
    "token_file",
    "broker_provisioning_password_file",
    "lifecycle_component",
    "choria_insecure",
    "site",
    "monitor_port",
    "broker_port",
    "broker_provisioning_password",
    "cert_deny_list",
    "jwt_verify_cert",
    "jwt_signing_key",
    "jwt_signing_token",
    "server_jwt_validity",
    "rego_policy",
    "leader_election",
    "upgrades_repository",
    "upgrades_optional",
    "features",
    "election",
    "discovery_timeout",
    "discovery_window",
    "helper_timeout",
    "rpc_timeout",
];

const FEATURE_KEYS: &[&str] = &["pki", "jwt", "ed25519", "upgrades"];

/// `features:`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// x509 enrollment: fetch a CSR, let the helper sign it.
    pub pki: bool,
    /// Fetch and verify the node's `provisioning.jwt`. Forced on by `ed25519`.
    pub jwt: bool,
    /// Organization Issuer networks: issue server JWTs.
    pub ed25519: bool,
    /// Version upgrades through `release_update`.
    pub upgrades: bool,
}

/// Log verbosity. go-choria maps exactly `debug`, `info`, `warn`, `error` and
/// `fatal`; anything else, including an unset `loglevel`, logs at `warn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    Fatal,
}

impl LogLevel {
    fn from_go(s: &str) -> Option<Self> {
        match s {
            "debug" => Some(LogLevel::Debug),
            "info" => Some(LogLevel::Info),
            "warn" => Some(LogLevel::Warn),
            "error" => Some(LogLevel::Error),
            "fatal" => Some(LogLevel::Fatal),
            _ => None,
        }
    }

    /// A `tracing` level directive (`fatal` becomes `error`).
    pub fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error | LogLevel::Fatal => "error",
        }
    }
}

/// Where logs go. go-choria treats `stdout`, `stderr` and `discard` (any case)
/// specially; anything else is a file that is appended to, in JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    Stderr,
    Discard,
    File(PathBuf),
}

/// The provisioner's settings.
#[derive(Clone, Debug)]
pub struct ProvisionerConfig {
    /// The file these came from.
    pub file: PathBuf,
    /// Concurrent provisioning workers; default: number of CPUs.
    pub workers: usize,
    /// Discovery interval, at least 1m.
    pub interval: Duration,
    /// `interval` as written (Go logs it that way).
    pub interval_text: String,
    pub logfile: Option<String>,
    pub loglevel: Option<String>,
    /// The helper command line, split shell-style when run.
    pub helper: String,
    /// Provisioning token sent with every `choria_provision` request.
    pub token: Secret,
    /// Ours: read `token` from this file (a mounted Kubernetes Secret), at load.
    pub token_file: Option<PathBuf>,
    /// Ours: read `broker_provisioning_password` from this file, at load.
    pub broker_provisioning_password_file: Option<PathBuf>,
    /// Lifecycle component whose startup events mean "needs provisioning".
    pub lifecycle_component: String,
    /// Speak protocol v1 without TLS or signatures.
    pub choria_insecure: bool,
    /// Name of this installation, a label on every metric.
    pub site: String,
    /// Port for `/metrics`; `None` disables it (Go: only ports > 0 listen).
    pub monitor_port: Option<u16>,
    /// Accepted and ignored, as in Go.
    pub broker_port: Option<i64>,
    /// Connect as user `provisioner` with this password.
    pub broker_provisioning_password: Option<Secret>,
    /// Patterns CSR names must not match; Go's default list when unset or empty.
    pub cert_deny_list: Vec<String>,
    /// File (PEM certificate/public key, or hex ed25519 key) or hex ed25519
    /// public key that verifies `provisioning.jwt`.
    pub jwt_verify_cert: Option<String>,
    /// Key that signs server JWTs (ed25519 seed file, or RSA PEM).
    pub jwt_signing_key: Option<PathBuf>,
    /// Our chain-issuer client JWT, for Organization Issuer server JWTs.
    pub jwt_signing_token: Option<PathBuf>,
    /// Validity of issued server JWTs; default 1y.
    pub server_jwt_validity: Duration,
    /// Accepted and ignored, as in Go.
    pub rego_policy: Option<String>,
    /// The legacy election switch; see [`ProvisionerConfig::election`].
    pub leader_election: bool,
    pub upgrades_repository: Option<String>,
    pub upgrades_optional: bool,
    pub features: Features,
    /// Resolved election settings (`election:` block or `leader_election`).
    pub election: ElectionConfig,
    /// Longest broadcast discovery (ours; Go: fixed 2 s).
    pub discovery_timeout: Duration,
    /// Discovery ends after this long without a reply (ours; Go: 300 ms).
    pub discovery_window: Duration,
    /// How long the helper may run (ours; Go: fixed 10 s).
    pub helper_timeout: Duration,
    /// How long one RPC attempt waits for its reply (ours); unset means Go's
    /// 2 s discovery timeout plus the agent's DDL timeout.
    pub rpc_timeout: Option<Duration>,
    /// Things accepted for compatibility that deserve a look (unknown keys …).
    pub warnings: Vec<ConfigWarning>,
}

impl ProvisionerConfig {
    /// Reads, validates and checks the files the settings point at
    /// ([`ProvisionerConfig::check_files`]).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let mut cfg = Self::parse(&super::read_file(path)?, path)?;
        cfg.read_secret_files()?;
        cfg.check_files()?;
        Ok(cfg)
    }

    /// Parses and validates YAML text without touching the file system; `file`
    /// is only used in messages.
    pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let file = file.as_ref();
        let root = Node::parse(text).map_err(|message| ConfigError::Syntax {
            file: file.to_path_buf(),
            message: format!("not valid YAML: {message}"),
        })?;
        let mut warnings = Vec::new();
        let sec = Section::new(file, "", root, KEYS, &mut warnings)?;

        let workers = match sec.int("workers")? {
            None | Some(0) => default_workers(),
            Some(n) if n < 0 => {
                return Err(sec.error(
                    "workers",
                    format!("{n} is negative; use a positive number or 0 for one per CPU"),
                ))
            }
            Some(n) => usize::try_from(n).map_err(|_| sec.error("workers", "too large"))?,
        };

        let (interval_text, interval) = match sec.duration("interval")? {
            None => ("1m".to_string(), DEFAULT_INTERVAL),
            Some((raw, _)) if raw.trim().is_empty() => {
                return Err(sec.error(
                    "interval",
                    "is empty; use a duration of at least 1m, such as 10m or 1h",
                ))
            }
            Some((raw, d)) if d < MIN_INTERVAL => {
                return Err(sec.error(
                    "interval",
                    format!("{raw} is below the minimum of 1m; use for example 10m or 1h"),
                ))
            }
            Some((raw, d)) => (raw, d),
        };

        let logfile = non_empty(sec.string("logfile")?);
        let loglevel = non_empty(sec.string("loglevel")?);
        if let Some(l) = &loglevel {
            if LogLevel::from_go(l).is_none() {
                warnings.push(sec.warning(
                    "loglevel",
                    format!(
                        "{l:?} is not one of debug, info, warn, error, fatal; logging at warn as the Go provisioner does"
                    ),
                ));
            }
        }

        let helper = sec.string("helper")?.unwrap_or_default();
        match super::split_command_line(&helper) {
            Err(e) => return Err(sec.error("helper", format!("{helper:?}: {e}"))),
            Ok(words) if words.is_empty() => {
                return Err(sec.error(
                    "helper",
                    "required: the command that decides each node's configuration",
                ))
            }
            Ok(_) => {}
        }

        let token = Secret::new(sec.string("token")?.unwrap_or_default());
        let token_file = non_empty(sec.string("token_file")?).map(PathBuf::from);
        if !token.is_empty() && token_file.is_some() {
            return Err(sec.error("token_file", "set together with token; use one of them"));
        }
        if token.is_empty() && token_file.is_none() {
            warnings.push(sec.warning(
                "token",
                "not set; requests carry an empty token, which only servers whose provisioning.jwt has no token accept",
            ));
        }

        let lifecycle_component = non_empty(sec.string("lifecycle_component")?)
            .unwrap_or_else(|| DEFAULT_LIFECYCLE_COMPONENT.to_string());
        if lifecycle_component.contains(['.', '*', '>'])
            || lifecycle_component.chars().any(char::is_whitespace)
        {
            return Err(sec.error(
                "lifecycle_component",
                format!(
                    "{lifecycle_component:?} is not valid: it must not contain '.', '*', '>' or spaces"
                ),
            ));
        }

        let choria_insecure = sec.bool("choria_insecure")?.unwrap_or(false);
        let site = sec.string("site")?.unwrap_or_default();

        let monitor_port =
            match sec.int("monitor_port")? {
                None | Some(0) => None,
                Some(p) if p < 0 => {
                    warnings.push(sec.warning(
                        "monitor_port",
                        format!("{p} is negative; the metrics listener is disabled"),
                    ));
                    None
                }
                Some(p) => Some(u16::try_from(p).map_err(|_| {
                    sec.error("monitor_port", format!("{p} is not a port (1-65535)"))
                })?),
            };

        let broker_port = sec.int("broker_port")?;
        if broker_port.is_some() {
            warnings.push(sec.warning(
                "broker_port",
                "accepted for compatibility but not used (the Go provisioner ignores it too)",
            ));
        }
        let broker_provisioning_password =
            non_empty(sec.string("broker_provisioning_password")?).map(Secret::new);
        let broker_provisioning_password_file =
            non_empty(sec.string("broker_provisioning_password_file")?).map(PathBuf::from);
        if broker_provisioning_password.is_some() && broker_provisioning_password_file.is_some() {
            return Err(sec.error(
                "broker_provisioning_password_file",
                "set together with broker_provisioning_password; use one of them",
            ));
        }

        let cert_deny_list = match sec.string_list("cert_deny_list")? {
            Some(list) if !list.is_empty() => list,
            _ => DEFAULT_CERT_DENY_LIST
                .iter()
                .map(|s| s.to_string())
                .collect(),
        };
        for (i, pattern) in cert_deny_list.iter().enumerate() {
            if let Err(e) = compile_deny_list(std::slice::from_ref(pattern)) {
                return Err(sec.item_error("cert_deny_list", i, e.to_string()));
            }
        }

        let jwt_verify_cert = non_empty(sec.string("jwt_verify_cert")?);
        let jwt_signing_key = non_empty(sec.string("jwt_signing_key")?).map(PathBuf::from);
        let jwt_signing_token = non_empty(sec.string("jwt_signing_token")?).map(PathBuf::from);

        let server_jwt_validity = match sec.duration("server_jwt_validity")? {
            None => DEFAULT_SERVER_JWT_VALIDITY,
            Some((raw, _)) if raw.is_empty() => DEFAULT_SERVER_JWT_VALIDITY,
            Some((raw, d)) if d.is_zero() => {
                return Err(sec.error(
                    "server_jwt_validity",
                    format!("{raw:?} is zero; use a duration such as 1y or 90d"),
                ))
            }
            Some((_, d)) => d,
        };

        let rego_policy = non_empty(sec.string("rego_policy")?);
        if rego_policy.is_some() {
            warnings.push(sec.warning(
                "rego_policy",
                "accepted for compatibility but not used (the Go provisioner ignores it too)",
            ));
        }

        let leader_election = sec.bool("leader_election")?.unwrap_or(false);
        let upgrades_repository = non_empty(sec.string("upgrades_repository")?);
        let upgrades_optional = sec.bool("upgrades_optional")?.unwrap_or(false);

        let fsec = Section::new(
            file,
            &format!("{}.", sec.key("features")),
            sec.node("features").cloned().unwrap_or(Node::Null),
            FEATURE_KEYS,
            &mut warnings,
        )?;
        let mut features = Features {
            pki: fsec.bool("pki")?.unwrap_or(false),
            jwt: fsec.bool("jwt")?.unwrap_or(false),
            ed25519: fsec.bool("ed25519")?.unwrap_or(false),
            upgrades: fsec.bool("upgrades")?.unwrap_or(false),
        };
        if features.pki && features.ed25519 {
            return Err(sec.error(
                "features",
                "pki and ed25519 cannot both be enabled; enable only one",
            ));
        }
        if features.ed25519 {
            if fsec.bool("jwt")? == Some(false) {
                warnings.push(fsec.warning("jwt", "forced on because ed25519 is enabled"));
            }
            features.jwt = true;
        }

        if features.jwt && jwt_verify_cert.is_none() {
            return Err(sec.error(
                "jwt_verify_cert",
                format!(
                    "required when {} is enabled: the file or hex ed25519 public key that verifies the nodes' provisioning.jwt",
                    if features.ed25519 { "features.ed25519" } else { "features.jwt" }
                ),
            ));
        }
        if features.ed25519 && jwt_signing_key.is_none() {
            return Err(sec.error(
                "jwt_signing_key",
                "required when features.ed25519 is enabled: the ed25519 seed file that signs server JWTs",
            ));
        }
        if features.upgrades && upgrades_repository.is_none() && !upgrades_optional {
            warnings.push(sec.warning(
                "upgrades_repository",
                "not set while features.upgrades is enabled; nodes whose helper asks for an upgrade will fail (set it, or upgrades_optional: true)",
            ));
        }

        let discovery_timeout =
            positive_duration(&sec, "discovery_timeout", DEFAULT_DISCOVERY_TIMEOUT)?;
        let discovery_window =
            positive_duration(&sec, "discovery_window", DEFAULT_DISCOVERY_WINDOW)?;
        if discovery_window > discovery_timeout {
            warnings.push(sec.warning(
                "discovery_window",
                "is longer than discovery_timeout, so every discovery runs for the full timeout",
            ));
        }
        let helper_timeout = positive_duration(&sec, "helper_timeout", DEFAULT_HELPER_TIMEOUT)?;
        let rpc_timeout = match sec.duration("rpc_timeout")? {
            Some((raw, d)) if !raw.trim().is_empty() => {
                if d.is_zero() {
                    return Err(sec.error(
                        "rpc_timeout",
                        format!("{raw:?} is zero; use a positive duration such as 5s"),
                    ));
                }
                Some(d)
            }
            _ => None,
        };

        let election = ElectionConfig::resolve(
            file,
            sec.node("election").cloned(),
            leader_election,
            &sec.key("leader_election"),
            &mut warnings,
        )?;

        Ok(ProvisionerConfig {
            file: file.to_path_buf(),
            workers,
            interval,
            interval_text,
            logfile,
            loglevel,
            helper,
            token,
            token_file,
            broker_provisioning_password_file,
            lifecycle_component,
            choria_insecure,
            site,
            monitor_port,
            broker_port,
            broker_provisioning_password,
            cert_deny_list,
            jwt_verify_cert,
            jwt_signing_key,
            jwt_signing_token,
            server_jwt_validity,
            rego_policy,
            leader_election,
            upgrades_repository,
            upgrades_optional,
            features,
            election,
            discovery_timeout,
            discovery_window,
            helper_timeout,
            rpc_timeout,
            warnings,
        })
    }

    /// Checks that the helper program and the key files in use exist and
    /// parse. The Go provisioner only finds out when it provisions a node.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        self.check_helper()?;
        if self.features.jwt {
            self.load_verify_key()?;
        }
        if self.features.ed25519 {
            let key = self.load_signing_key()?;
            if self.jwt_signing_token.is_some() {
                if key.as_ed25519().is_none() {
                    return Err(self.err(
                        "jwt_signing_key",
                        "must be an ed25519 seed when jwt_signing_token is set",
                    ));
                }
                self.load_signing_token()?;
            }
        }
        Ok(())
    }

    /// Reads `token_file` and `broker_provisioning_password_file` into
    /// `token` and `broker_provisioning_password` (trailing newline removed).
    pub fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.token_file {
            self.token = self.read_secret("token_file", path)?;
        }
        if let Some(path) = &self.broker_provisioning_password_file {
            let password = self.read_secret("broker_provisioning_password_file", path)?;
            self.broker_provisioning_password = (!password.is_empty()).then_some(password);
        }
        Ok(())
    }

    fn read_secret(&self, key: &str, path: &Path) -> Result<Secret, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.err(key, format!("{}: {e}", path.display())))?;
        Ok(Secret::new(text.trim_end_matches(['\r', '\n']).to_string()))
    }

    /// The helper command line split into program and arguments.
    pub fn helper_command(&self) -> Result<Vec<String>, ConfigError> {
        super::split_command_line(&self.helper).map_err(|e| self.err("helper", e))
    }

    fn check_helper(&self) -> Result<(), ConfigError> {
        let words = self.helper_command()?;
        let Some(program) = words.first() else {
            return Err(self.err("helper", "required"));
        };
        if program.contains('/') {
            let p = Path::new(program);
            match std::fs::metadata(p) {
                Err(e) => Err(self.err("helper", format!("{program}: {e}"))),
                Ok(m) if !m.is_file() => {
                    Err(self.err("helper", format!("{program} is not a file")))
                }
                Ok(m) if !is_executable(&m) => {
                    Err(self.err("helper", format!("{program} is not executable")))
                }
                Ok(_) => Ok(()),
            }
        } else {
            let found = std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| {
                    std::fs::metadata(dir.join(program))
                        .is_ok_and(|m| m.is_file() && is_executable(&m))
                })
            });
            if found {
                Ok(())
            } else {
                Err(self.err(
                    "helper",
                    format!("{program:?} was not found in PATH; give the full path"),
                ))
            }
        }
    }

    /// The key that verifies nodes' `provisioning.jwt` (`jwt_verify_cert`):
    /// an existing file is read, anything else must be a hex ed25519 public
    /// key, like Go's `validateJWT`. Read on every call, as Go does, so a
    /// replaced file takes effect.
    pub fn load_verify_key(&self) -> Result<TokenVerifyKey, ConfigError> {
        let Some(setting) = self.jwt_verify_cert.as_deref().filter(|s| !s.is_empty()) else {
            return Err(self.err(
                "jwt_verify_cert",
                "not set; set it to the file or hex ed25519 public key that verifies the nodes' provisioning.jwt",
            ));
        };
        TokenVerifyKey::from_setting(setting).map_err(|e| {
            let message = match e {
                // from_setting only parses the setting itself as hex when no
                // such file exists.
                KeyError::Ed25519PublicKey(_) if !Path::new(setting).exists() => format!(
                    "{setting} is neither an existing file nor a hex encoded ed25519 public key ({e})"
                ),
                e => key_error(Path::new(setting), e),
            };
            self.err("jwt_verify_cert", message)
        })
    }

    /// The key that signs server JWTs (`jwt_signing_key`), read on every call.
    pub fn load_signing_key(&self) -> Result<TokenSigningKey, ConfigError> {
        let Some(path) = self.jwt_signing_key.as_deref() else {
            return Err(self.err("jwt_signing_key", "not set"));
        };
        TokenSigningKey::from_file(path)
            .map_err(|e| self.err("jwt_signing_key", key_error(path, e)))
    }

    /// Our chain-issuer token (`jwt_signing_token`) and its claims, read on
    /// every call; `None` when not configured. It must carry a trust chain
    /// signature (`tcs`), as the Go provisioner requires.
    pub fn load_signing_token(&self) -> Result<Option<(String, ClientIdClaims)>, ConfigError> {
        let Some(path) = self.jwt_signing_token.as_deref() else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.err("jwt_signing_token", format!("{}: {e}", path.display())))?;
        let token = text.trim().to_string();
        let claims = parse_client_id_token_unverified(&token)
            .map_err(|e| self.err("jwt_signing_token", format!("{}: {e}", path.display())))?;
        if claims.standard.trust_chain_signature.is_empty() {
            return Err(self.err(
                "jwt_signing_token",
                format!(
                    "{} has no trust chain signature (tcs claim); create it with `choria jwt client ... --issuer`",
                    path.display()
                ),
            ));
        }
        Ok(Some((token, claims)))
    }

    /// The compiled `cert_deny_list` (validated when parsed).
    pub fn cert_deny_regexes(&self) -> Result<Vec<Regex>, ConfigError> {
        compile_deny_list(&self.cert_deny_list)
            .map_err(|e| self.err("cert_deny_list", e.to_string()))
    }

    /// The effective log level (see [`LogLevel`]).
    pub fn log_level(&self) -> LogLevel {
        self.loglevel
            .as_deref()
            .and_then(LogLevel::from_go)
            .unwrap_or(LogLevel::Warn)
    }

    /// The effective log destination; unset means stdout.
    pub fn log_target(&self) -> LogTarget {
        match self.logfile.as_deref() {
            None => LogTarget::Stdout,
            Some(f) if f.eq_ignore_ascii_case("stdout") => LogTarget::Stdout,
            Some(f) if f.eq_ignore_ascii_case("stderr") => LogTarget::Stderr,
            Some(f) if f.eq_ignore_ascii_case("discard") => LogTarget::Discard,
            Some(f) => LogTarget::File(PathBuf::from(f)),
        }
    }

    /// Every setting as it takes effect (defaults filled in), keyed as in the
    /// file, for `run --check`. Secrets show only whether they are set.
    pub fn effective_settings(&self) -> Vec<(String, String)> {
        let d = |d: Duration| format_duration(d);
        let opt = |v: Option<&str>| v.map_or_else(|| "(unset)".to_string(), str::to_string);
        let path = |p: Option<&PathBuf>| opt(p.map(|p| p.to_string_lossy()).as_deref());
        let secret = |s: Option<&Secret>| match s {
            Some(s) if !s.is_empty() => "(set, redacted)".to_string(),
            _ => "(unset)".to_string(),
        };
        let mut out: Vec<(String, String)> = vec![
            ("workers".into(), self.workers.to_string()),
            ("interval".into(), self.interval_text.clone()),
            (
                "logfile".into(),
                match self.log_target() {
                    LogTarget::Stdout => "stdout".into(),
                    LogTarget::Stderr => "stderr".into(),
                    LogTarget::Discard => "discard".into(),
                    LogTarget::File(f) => f.display().to_string(),
                },
            ),
            ("loglevel".into(), self.log_level().as_filter().into()),
            ("helper".into(), self.helper.clone()),
            ("token".into(), secret(Some(&self.token))),
            ("token_file".into(), path(self.token_file.as_ref())),
            (
                "lifecycle_component".into(),
                self.lifecycle_component.clone(),
            ),
            ("choria_insecure".into(), self.choria_insecure.to_string()),
            ("site".into(), self.site.clone()),
            (
                "monitor_port".into(),
                self.monitor_port
                    .map_or_else(|| "(off)".into(), |p| p.to_string()),
            ),
            (
                "broker_provisioning_password".into(),
                secret(self.broker_provisioning_password.as_ref()),
            ),
            (
                "broker_provisioning_password_file".into(),
                path(self.broker_provisioning_password_file.as_ref()),
            ),
            ("cert_deny_list".into(), self.cert_deny_list.join(" ")),
            (
                "jwt_verify_cert".into(),
                opt(self.jwt_verify_cert.as_deref()),
            ),
            (
                "jwt_signing_key".into(),
                path(self.jwt_signing_key.as_ref()),
            ),
            (
                "jwt_signing_token".into(),
                path(self.jwt_signing_token.as_ref()),
            ),
            (
                "server_jwt_validity".into(),
                self.server_jwt_validity_text(),
            ),
            (
                "upgrades_repository".into(),
                opt(self.upgrades_repository.as_deref()),
            ),
            (
                "upgrades_optional".into(),
                self.upgrades_optional.to_string(),
            ),
            ("features.pki".into(), self.features.pki.to_string()),
            ("features.jwt".into(), self.features.jwt.to_string()),
            ("features.ed25519".into(), self.features.ed25519.to_string()),
            (
                "features.upgrades".into(),
                self.features.upgrades.to_string(),
            ),
            (
                "election.backend".into(),
                self.election.backend.as_str().into(),
            ),
        ];
        let e = &self.election;
        match e.backend {
            super::ElectionBackend::None => {}
            super::ElectionBackend::Streams => out.extend([
                ("election.bucket".into(), e.bucket.clone()),
                ("election.name".into(), e.name.clone()),
                ("election.api_prefix".into(), e.api_prefix.clone()),
                ("election.create_bucket".into(), e.create_bucket.to_string()),
                ("election.bucket_ttl".into(), d(e.bucket_ttl)),
            ]),
            super::ElectionBackend::Lease => out.extend([
                ("election.lease_name".into(), e.lease_name.clone()),
                (
                    "election.lease_namespace".into(),
                    opt(e.lease_namespace.as_deref()).replace("(unset)", "(the pod's)"),
                ),
                ("election.lease_duration".into(), d(e.lease_duration)),
                ("election.renew_deadline".into(), d(e.renew_deadline)),
                ("election.retry_period".into(), d(e.retry_period)),
            ]),
        }
        out.extend([
            ("discovery_timeout".into(), d(self.discovery_timeout)),
            ("discovery_window".into(), d(self.discovery_window)),
            ("helper_timeout".into(), d(self.helper_timeout)),
            (
                "rpc_timeout".into(),
                self.rpc_timeout
                    .map_or_else(|| "(Go's: 2s + the agent's timeout)".into(), d),
            ),
        ]);
        out
    }

    /// `server_jwt_validity` as people write it (`1y`).
    pub fn server_jwt_validity_text(&self) -> String {
        format_duration(self.server_jwt_validity)
    }

    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(&self.file, None, key, message)
    }
}

/// `<path>: <problem>`, without repeating the path the error already holds.
fn key_error(path: &Path, e: KeyError) -> String {
    match e {
        KeyError::Read { source, .. } => format!("{}: {source}", path.display()),
        other => format!("{}: {other}", path.display()),
    }
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Go's `runtime.NumCPU()`.
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}

/// A duration key that must be positive when set; `default` when unset or empty.
fn positive_duration(sec: &Section, key: &str, default: Duration) -> Result<Duration, ConfigError> {
    match sec.duration(key)? {
        None => Ok(default),
        Some((raw, _)) if raw.trim().is_empty() => Ok(default),
        Some((raw, d)) if d.is_zero() => Err(sec.error(
            key,
            format!(
                "{raw:?} is zero; use a positive duration such as {}",
                format_duration(default)
            ),
        )),
        Some((_, d)) => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ElectionBackend;
    use std::io::Write;

    const FILE: &str = "provisioner.yaml";

    fn parse(yaml: &str) -> Result<ProvisionerConfig, ConfigError> {
        ProvisionerConfig::parse(yaml, FILE)
    }

    fn ok(yaml: &str) -> ProvisionerConfig {
        parse(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    fn err(yaml: &str) -> String {
        match parse(yaml) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn warnings(c: &ProvisionerConfig) -> Vec<String> {
        c.warnings.iter().map(|w| w.to_string()).collect()
    }

    /// `helper:` plus whatever the test needs.
    fn with_helper(rest: &str) -> String {
        format!("helper: /usr/bin/helper\ntoken: t\n{rest}")
    }

    /// The example from the Go provisioner's documentation
    /// (docs/content/configuration/provisioner/_index.md), unchanged.
    const GO_DOCS_EXAMPLE: &str = "workers: 4
interval: 1m
logfile: /dev/stdout
loglevel: warn
helper: /etc/choria-provisioner/provisioner/helper.rb
token: s3cret
site: testing
broker_provisioning_password: s3cret
jwt_verify_cert: e72cba5268b34627b75c5ceae9449ad16d62f15f862c30d4e0e7d2588e2e6259
jwt_signing_key: /etc/choria-provisioner/credentials/signer.seed
jwt_signing_token: /etc/choria-provisioner/credentials/signer.jwt

features:
  jwt: true
  ed25519: true
";

    #[test]
    fn go_documentation_example() {
        let c = ok(GO_DOCS_EXAMPLE);
        assert_eq!(c.workers, 4);
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(c.interval_text, "1m");
        assert_eq!(c.logfile.as_deref(), Some("/dev/stdout"));
        assert_eq!(c.log_target(), LogTarget::File("/dev/stdout".into()));
        assert_eq!(c.log_level(), LogLevel::Warn);
        assert_eq!(c.helper, "/etc/choria-provisioner/provisioner/helper.rb");
        assert_eq!(c.token.expose(), "s3cret");
        assert_eq!(c.site, "testing");
        assert_eq!(
            c.broker_provisioning_password.as_ref().map(Secret::expose),
            Some("s3cret")
        );
        assert_eq!(
            c.jwt_verify_cert.as_deref(),
            Some("e72cba5268b34627b75c5ceae9449ad16d62f15f862c30d4e0e7d2588e2e6259")
        );
        assert_eq!(
            c.jwt_signing_key.as_deref(),
            Some(Path::new("/etc/choria-provisioner/credentials/signer.seed"))
        );
        assert_eq!(
            c.jwt_signing_token.as_deref(),
            Some(Path::new("/etc/choria-provisioner/credentials/signer.jwt"))
        );
        assert_eq!(
            c.features,
            Features {
                pki: false,
                jwt: true,
                ed25519: true,
                upgrades: false
            }
        );
        assert_eq!(c.lifecycle_component, "provision_mode_server");
        assert_eq!(c.server_jwt_validity, DEFAULT_SERVER_JWT_VALIDITY);
        assert_eq!(c.election.backend, ElectionBackend::None);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    /// The insecure test configuration of the protocol notes (§12.5).
    #[test]
    fn insecure_test_example() {
        let c = ok("workers: 2
interval: 1m          # minimum allowed
logfile: /dev/stdout
loglevel: debug
helper: /abs/test/helper.sh
token: s3cret
site: test
choria_insecure: true
jwt_verify_cert: /abs/test/prov-signer-public.pem   # or hex ed25519 issuer public key
leader_election: false
features:
  jwt: true
");
        assert!(c.choria_insecure);
        assert_eq!(c.workers, 2);
        assert_eq!(c.log_level(), LogLevel::Debug);
        assert!(c.features.jwt && !c.features.ed25519);
        assert_eq!(
            c.jwt_verify_cert.as_deref(),
            Some("/abs/test/prov-signer-public.pem")
        );
        assert!(!c.election.enabled());
    }

    #[test]
    fn defaults() {
        let c = ok("helper: /usr/bin/helper\n");
        assert_eq!(c.workers, default_workers());
        assert!(c.workers >= 1);
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(c.interval_text, "1m");
        assert_eq!(c.lifecycle_component, "provision_mode_server");
        assert_eq!(
            c.cert_deny_list,
            [
                r"\.privileged.mcollective$",
                r"\.privileged.choria$",
                r"\.mcollective$",
                r"\.choria$"
            ]
        );
        assert_eq!(c.server_jwt_validity, Duration::from_secs(365 * 86_400));
        assert_eq!(c.server_jwt_validity_text(), "1y");
        assert_eq!(c.features, Features::default());
        assert!(!c.choria_insecure && !c.leader_election && !c.upgrades_optional);
        assert_eq!(c.monitor_port, None);
        assert_eq!(c.broker_port, None);
        assert_eq!(c.broker_provisioning_password, None);
        assert_eq!(c.site, "");
        assert_eq!(c.election.backend, ElectionBackend::None);
        // Go: an unset loglevel is not one go-choria knows, so it logs at warn.
        assert_eq!(c.log_level(), LogLevel::Warn);
        assert_eq!(c.log_target(), LogTarget::Stdout);
        assert_eq!(c.cert_deny_regexes().unwrap().len(), 4);
        assert_eq!(
            warnings(&c),
            ["provisioner.yaml: token: not set; requests carry an empty token, which only servers whose provisioning.jwt has no token accept"]
        );
    }

    #[test]
    fn interval_rules() {
        assert_eq!(
            err(&with_helper("interval: 30s\n")),
            "provisioner.yaml: interval: 30s is below the minimum of 1m; use for example 10m or 1h"
        );
        assert!(err(&with_helper("interval: 59s\n")).contains("below the minimum of 1m"));
        assert!(err(&with_helper("interval: ''\n")).contains("interval: is empty"));
        assert!(err(&with_helper("interval: 60\n")).contains(
            "interval: expected a duration such as 30s, 10m, 1h or 1d, found the number 60"
        ));
        assert!(err(&with_helper("interval: '10'\n")).contains("interval: \"10\" has no unit"));
        assert!(err(&with_helper("interval: 1H\n"))
            .contains("interval: \"1H\" is not a valid duration"));
        for (text, secs) in [
            ("1m", 60),
            ("60s", 60),
            ("10m", 600),
            ("1h30m", 5400),
            ("1.5h", 5400),
            ("1d", 86_400),
            ("2w", 14 * 86_400),
            ("1M", 30 * 86_400),
            ("1y", 365 * 86_400),
        ] {
            let c = ok(&with_helper(&format!("interval: {text}\n")));
            assert_eq!(c.interval, Duration::from_secs(secs), "{text}");
            assert_eq!(c.interval_text, text);
        }
        // null keeps the default, as in Go.
        assert_eq!(ok(&with_helper("interval: ~\n")).interval, DEFAULT_INTERVAL);
    }

    #[test]
    fn server_jwt_validity_rules() {
        let v = |y: &str| ok(&with_helper(y)).server_jwt_validity;
        assert_eq!(v("server_jwt_validity: ''\n"), DEFAULT_SERVER_JWT_VALIDITY);
        assert_eq!(
            v("server_jwt_validity: 90d\n"),
            Duration::from_secs(90 * 86_400)
        );
        assert_eq!(
            v("server_jwt_validity: 2y\n"),
            Duration::from_secs(730 * 86_400)
        );
        assert_eq!(
            v("server_jwt_validity: 36h\n"),
            Duration::from_secs(36 * 3600)
        );
        assert!(err(&with_helper("server_jwt_validity: 0s\n"))
            .starts_with("provisioner.yaml: server_jwt_validity: \"0s\" is zero"));
        assert!(err(&with_helper("server_jwt_validity: forever\n"))
            .starts_with("provisioner.yaml: server_jwt_validity: \"forever\""));
    }

    #[test]
    fn lifecycle_component_rules() {
        for bad in ["a.b", "a*", "a>", "with space"] {
            let e = err(&with_helper(&format!("lifecycle_component: '{bad}'\n")));
            assert!(
                e.starts_with(&format!(
                    "provisioner.yaml: lifecycle_component: {bad:?} is not valid"
                )),
                "{e}"
            );
        }
        assert_eq!(
            ok(&with_helper("lifecycle_component: ''\n")).lifecycle_component,
            "provision_mode_server"
        );
        assert_eq!(
            ok(&with_helper("lifecycle_component: custom_mode\n")).lifecycle_component,
            "custom_mode"
        );
    }

    #[test]
    fn feature_rules() {
        assert_eq!(
            err(&with_helper(
                "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  pki: true\n  ed25519: true\n"
            )),
            "provisioner.yaml: features: pki and ed25519 cannot both be enabled; enable only one"
        );
        let c = ok(&with_helper(
            "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  ed25519: true\n",
        ));
        assert!(c.features.jwt && c.features.ed25519);
        assert!(c.warnings.is_empty());
        let c = ok(&with_helper(
            "jwt_verify_cert: x\njwt_signing_key: k\nfeatures:\n  ed25519: true\n  jwt: false\n",
        ));
        assert!(c.features.jwt);
        assert_eq!(
            warnings(&c),
            ["provisioner.yaml: features.jwt: forced on because ed25519 is enabled"]
        );
        let c = ok(&with_helper("features:\n  pki: true\n  upgrades: true\n"));
        assert!(c.features.pki && c.features.upgrades && !c.features.jwt);
        assert!(warnings(&c)[0]
            .starts_with("provisioner.yaml: upgrades_repository: not set while features.upgrades"));
        let c = ok(&with_helper(
            "features:\n  upgrades: true\nupgrades_optional: true\n",
        ));
        assert!(c.warnings.is_empty());
        let c = ok(&with_helper(
            "features:\n  upgrades: true\nupgrades_repository: https://repo.example.net\n",
        ));
        assert_eq!(
            c.upgrades_repository.as_deref(),
            Some("https://repo.example.net")
        );
        assert!(c.warnings.is_empty());
        assert!(err(&with_helper("features: [jwt]\n"))
            .contains("provisioner.yaml: features: expected a mapping of settings, found a list"));
        assert!(err(&with_helper("features:\n  jwt: maybe\n"))
            .contains("provisioner.yaml: features.jwt: expected true or false, found \"maybe\""));
        let c = ok(&with_helper("features:\n  pkix: true\n"));
        assert_eq!(
            warnings(&c),
            ["provisioner.yaml: features.pkix: unknown setting, ignored; did you mean features.pki?"]
        );
    }

    #[test]
    fn settings_required_by_features() {
        assert_eq!(
            err(&with_helper("features:\n  jwt: true\n")),
            "provisioner.yaml: jwt_verify_cert: required when features.jwt is enabled: the file or hex ed25519 public key that verifies the nodes' provisioning.jwt"
        );
        assert!(err(&with_helper(
            "jwt_verify_cert: x\nfeatures:\n  ed25519: true\n"
        ))
        .starts_with("provisioner.yaml: jwt_signing_key: required when features.ed25519"));
        assert!(err(&with_helper(
            "jwt_signing_key: k\nfeatures:\n  ed25519: true\n"
        ))
        .starts_with("provisioner.yaml: jwt_verify_cert: required when features.ed25519"));
    }

    #[test]
    fn helper_rules() {
        assert_eq!(
            err("token: t\n"),
            "provisioner.yaml: helper: required: the command that decides each node's configuration"
        );
        assert!(err("helper: '   '\n").contains("helper: required"));
        assert!(err("helper: \"ruby '/x\"\n").contains(
            "helper: \"ruby '/x\": cannot split the command line: missing closing quote"
        ));
        let c = ok("helper: ruby '/opt/my helper.rb' --site test\n");
        assert_eq!(
            c.helper_command().unwrap(),
            ["ruby", "/opt/my helper.rb", "--site", "test"]
        );
    }

    #[test]
    fn workers_and_ports() {
        assert_eq!(ok(&with_helper("workers: 0\n")).workers, default_workers());
        assert_eq!(ok(&with_helper("workers: 16\n")).workers, 16);
        assert_eq!(ok(&with_helper("workers: 2.0\n")).workers, 2);
        assert!(err(&with_helper("workers: -1\n"))
            .starts_with("provisioner.yaml: workers: -1 is negative"));
        assert!(err(&with_helper("workers: '4'\n"))
            .contains("workers: expected a whole number, found a string \"4\""));
        assert!(err(&with_helper("workers: 2.5\n")).contains("workers: expected a whole number"));
        assert_eq!(
            ok(&with_helper("monitor_port: 8080\n")).monitor_port,
            Some(8080)
        );
        assert_eq!(ok(&with_helper("monitor_port: 0\n")).monitor_port, None);
        let c = ok(&with_helper("monitor_port: -1\n"));
        assert_eq!(c.monitor_port, None);
        assert!(warnings(&c)[0].contains("monitor_port: -1 is negative"));
        assert!(err(&with_helper("monitor_port: 70000\n"))
            .contains("provisioner.yaml: monitor_port: 70000 is not a port"));
    }

    #[test]
    fn unused_keys_are_accepted_with_a_warning() {
        let c = ok(&with_helper(
            "broker_port: 4222\nrego_policy: /etc/x.rego\n",
        ));
        assert_eq!(c.broker_port, Some(4222));
        assert_eq!(c.rego_policy.as_deref(), Some("/etc/x.rego"));
        assert_eq!(
            warnings(&c),
            [
                "provisioner.yaml: broker_port: accepted for compatibility but not used (the Go provisioner ignores it too)",
                "provisioner.yaml: rego_policy: accepted for compatibility but not used (the Go provisioner ignores it too)"
            ]
        );
    }

    #[test]
    fn unknown_keys_warn_with_suggestions() {
        let c = ok(&with_helper("worker: 3\nintreval: 5m\nsomething: else\n"));
        assert_eq!(c.workers, default_workers());
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        assert_eq!(
            warnings(&c),
            [
                "provisioner.yaml: worker: unknown setting, ignored; did you mean workers?",
                "provisioner.yaml: intreval: unknown setting, ignored; did you mean interval?",
                "provisioner.yaml: something: unknown setting, ignored",
            ]
        );
    }

    #[test]
    fn go_json_key_matching() {
        // encoding/json matches field names case-insensitively.
        let c = ok("Helper: /usr/bin/helper\nTOKEN: t\nWorkers: 3\nFeatures:\n  PKI: true\n");
        assert_eq!(c.workers, 3);
        assert!(c.features.pki);
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // The last duplicate wins.
        let c = ok(&with_helper("workers: 3\nworkers: 5\n"));
        assert_eq!(c.workers, 5);
        assert_eq!(
            warnings(&c),
            ["provisioner.yaml: workers: set more than once (also as workers); the last value is used"]
        );
        // Errors name the key as written.
        assert!(err("Helper: /usr/bin/helper\nWorkers: -2\n")
            .starts_with("provisioner.yaml: Workers: -2"));
    }

    #[test]
    fn yaml_1_1_booleans_and_nulls() {
        let c = ok(&with_helper(
            "choria_insecure: yes\nleader_election: on\nupgrades_optional: Y\nfeatures:\n  pki: TRUE\n",
        ));
        assert!(c.choria_insecure && c.leader_election && c.upgrades_optional && c.features.pki);
        let c = ok(&with_helper("choria_insecure: no\nleader_election: off\n"));
        assert!(!c.choria_insecure && !c.leader_election);
        let c = ok(&with_helper(
            "lifecycle_component:\ncert_deny_list: ~\nfeatures:\nlogfile: ''\n",
        ));
        assert_eq!(c.lifecycle_component, DEFAULT_LIFECYCLE_COMPONENT);
        assert_eq!(c.cert_deny_list.len(), 4);
        assert_eq!(c.logfile, None);
        assert!(err(&with_helper("choria_insecure: 1\n"))
            .contains("choria_insecure: expected true or false, found a number 1"));
    }

    #[test]
    fn strings_must_be_strings() {
        assert_eq!(
            err("helper: /usr/bin/helper\ntoken: 12345\n"),
            "provisioner.yaml: token: expected a string, found a number 12345; put it in quotes if it is meant as text"
        );
        assert_eq!(
            ok("helper: /usr/bin/helper\ntoken: '12345'\n")
                .token
                .expose(),
            "12345"
        );
        assert!(err(&with_helper("site: [a]\n")).contains("site: expected a string, found a list"));
    }

    #[test]
    fn cert_deny_list_rules() {
        let c = ok(&with_helper("cert_deny_list: ['\\.bad$', '/^evil/']\n"));
        assert_eq!(c.cert_deny_list, [r"\.bad$", "/^evil/"]);
        assert_eq!(c.cert_deny_regexes().unwrap().len(), 2);
        assert_eq!(
            ok(&with_helper("cert_deny_list: []\n"))
                .cert_deny_list
                .len(),
            4
        );
        let e = err(&with_helper("cert_deny_list: ['ok', '(']\n"));
        assert!(
            e.starts_with("provisioner.yaml: cert_deny_list[1]: "),
            "{e}"
        );
        assert!(err(&with_helper("cert_deny_list: [1]\n"))
            .contains("cert_deny_list[0]: expected a string"));
        assert!(err(&with_helper("cert_deny_list: x\n"))
            .contains("cert_deny_list: expected a list of strings"));
    }

    #[test]
    fn logging() {
        let l = |y: &str| ok(&with_helper(y)).log_level();
        assert_eq!(l("loglevel: debug\n"), LogLevel::Debug);
        assert_eq!(l("loglevel: info\n"), LogLevel::Info);
        assert_eq!(l("loglevel: error\n"), LogLevel::Error);
        assert_eq!(l("loglevel: fatal\n"), LogLevel::Fatal);
        assert_eq!(LogLevel::Fatal.as_filter(), "error");
        let c = ok(&with_helper("loglevel: INFO\n"));
        assert_eq!(c.log_level(), LogLevel::Warn);
        assert!(warnings(&c)[0].starts_with("provisioner.yaml: loglevel: \"INFO\" is not one of"));
        let t = |y: &str| ok(&with_helper(y)).log_target();
        assert_eq!(t("logfile: STDOUT\n"), LogTarget::Stdout);
        assert_eq!(t("logfile: stderr\n"), LogTarget::Stderr);
        assert_eq!(t("logfile: discard\n"), LogTarget::Discard);
        assert_eq!(
            t("logfile: /var/log/p.log\n"),
            LogTarget::File("/var/log/p.log".into())
        );
    }

    #[test]
    fn election_from_legacy_flag_and_block() {
        let c = ok(&with_helper("leader_election: true\n"));
        assert_eq!(c.election.backend, ElectionBackend::Streams);
        assert_eq!(c.election.bucket, "CHORIA_LEADER_ELECTION");
        let c = ok(&with_helper(
            "election:\n  backend: lease\n  lease_namespace: choria\n",
        ));
        assert_eq!(c.election.backend, ElectionBackend::Lease);
        assert!(err(&with_helper(
            "leader_election: true\nelection:\n  backend: none\n"
        ))
        .contains("election.backend: none contradicts leader_election: true"));
    }

    #[test]
    fn syntax_errors() {
        let e = err("workers: [1, 2\n");
        assert!(e.starts_with("provisioner.yaml: not valid YAML: "), "{e}");
        assert_eq!(
            err("- a\n- b\n"),
            "provisioner.yaml: expected a mapping of settings (key: value) at the top level, found a list"
        );
        assert!(err("").contains("helper: required"));
        assert!(err("helper: !custom x\n").contains("not valid YAML"));
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let c = ok(GO_DOCS_EXAMPLE);
        let d = format!("{c:?}");
        assert!(!d.contains("s3cret"), "{d}");
        assert!(d.contains("<redacted>"));
    }

    // ----- files -----------------------------------------------------------

    fn write(dir: &Path, name: &str, data: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(data).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn load_reads_the_file_and_checks_the_helper() {
        let dir = tempfile::tempdir().unwrap();
        let helper = write(dir.path(), "helper.sh", b"#!/bin/sh\n", 0o755);
        let cfg = write(
            dir.path(),
            "provisioner.yaml",
            format!("helper: {}\ntoken: t\nworkers: 2\n", helper.display()).as_bytes(),
            0o644,
        );
        let c = ProvisionerConfig::load(&cfg).unwrap();
        assert_eq!(c.workers, 2);
        assert_eq!(c.file, cfg);

        let missing = dir.path().join("nope.yaml");
        let e = ProvisionerConfig::load(&missing).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: could not read", missing.display())),
            "{e}"
        );

        let cfg = write(
            dir.path(),
            "p2.yaml",
            b"helper: /nonexistent/helper.rb --x\n",
            0o644,
        );
        let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "{}: helper: /nonexistent/helper.rb: ",
                cfg.display()
            )),
            "{e}"
        );

        let noexec = write(dir.path(), "noexec.sh", b"#!/bin/sh\n", 0o644);
        let cfg = write(
            dir.path(),
            "p3.yaml",
            format!("helper: {}\n", noexec.display()).as_bytes(),
            0o644,
        );
        let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
        assert!(e.ends_with("is not executable"), "{e}");

        // A bare program name is looked up in PATH.
        let cfg = write(dir.path(), "p4.yaml", b"helper: sh -c true\n", 0o644);
        ProvisionerConfig::load(&cfg).unwrap();
        let cfg = write(
            dir.path(),
            "p5.yaml",
            b"helper: no-such-helper-program\n",
            0o644,
        );
        let e = ProvisionerConfig::load(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("helper: \"no-such-helper-program\" was not found in PATH"),
            "{e}"
        );
    }

    #[test]
    fn jwt_verify_cert_file_or_hex() {
        let dir = tempfile::tempdir().unwrap();
        let pair = crate::choria::security::generate_keypair();
        let hex_pub = pair.public_hex();
        let base = "helper: /bin/sh\nfeatures:\n  jwt: true\n";

        let c = ok(&format!("{base}jwt_verify_cert: {hex_pub}\n"));
        c.check_files().unwrap();
        assert!(matches!(
            c.load_verify_key().unwrap(),
            TokenVerifyKey::Ed25519(_)
        ));

        let f = write(dir.path(), "issuer.pub", hex_pub.as_bytes(), 0o644);
        let c = ok(&format!("{base}jwt_verify_cert: {}\n", f.display()));
        c.check_files().unwrap();

        let c = ok(&format!("{base}jwt_verify_cert: /etc/missing/signer.pem\n"));
        let e = c.check_files().unwrap_err().to_string();
        assert!(
            e.starts_with("provisioner.yaml: jwt_verify_cert: /etc/missing/signer.pem is neither an existing file nor a hex encoded ed25519 public key"),
            "{e}"
        );

        let f = write(dir.path(), "garbage.pem", b"not a key", 0o644);
        let c = ok(&format!("{base}jwt_verify_cert: {}\n", f.display()));
        let e = c.check_files().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "provisioner.yaml: jwt_verify_cert: {}: ",
                f.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn signing_key_and_chain_token() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = crate::choria::security::generate_keypair();
        let signer = crate::choria::security::generate_keypair();
        let seed = write(
            dir.path(),
            "signer.seed",
            signer.seed_hex().as_bytes(),
            0o600,
        );
        let yaml_with_key = |key: &Path, extra: &str| {
            format!(
                "helper: /bin/sh\njwt_verify_cert: {}\njwt_signing_key: {}\nfeatures:\n  ed25519: true\n{extra}",
                issuer.public_hex(),
                key.display()
            )
        };
        let yaml = |extra: &str| yaml_with_key(&seed, extra);
        let c = ok(&yaml(""));
        c.check_files().unwrap();
        assert!(c.load_signing_key().unwrap().as_ed25519().is_some());
        assert!(c.load_signing_token().unwrap().is_none());

        // A chain issuer token made by the Org Issuer.
        let now = chrono::Utc::now().timestamp();
        let mut claims = ClientIdClaims::new_at(
            now,
            "provisioner_signer",
            Some(&signer.public_hex()),
            "issuer",
            Duration::from_secs(3600),
        )
        .unwrap();
        let unchained = TokenSigningKey::Ed25519(issuer.signing_key().clone())
            .sign(&claims)
            .unwrap();
        claims
            .standard
            .add_org_issuer_data(issuer.signing_key())
            .unwrap();
        let chained = TokenSigningKey::Ed25519(issuer.signing_key().clone())
            .sign(&claims)
            .unwrap();
        let tok = write(
            dir.path(),
            "signer.jwt",
            format!("{chained}\n").as_bytes(),
            0o600,
        );
        let c = ok(&yaml(&format!("jwt_signing_token: {}\n", tok.display())));
        c.check_files().unwrap();
        let (raw, parsed) = c.load_signing_token().unwrap().unwrap();
        assert_eq!(raw, chained);
        assert_eq!(parsed.caller_id, "provisioner_signer");

        let tok2 = write(dir.path(), "plain.jwt", unchained.as_bytes(), 0o600);
        let c = ok(&yaml(&format!("jwt_signing_token: {}\n", tok2.display())));
        let e = c.check_files().unwrap_err().to_string();
        assert!(
            e.contains("jwt_signing_token: ") && e.contains("has no trust chain signature"),
            "{e}"
        );

        let missing = dir.path().join("missing.seed");
        let c = ok(&yaml_with_key(&missing, ""));
        let e = c.check_files().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "provisioner.yaml: jwt_signing_key: {}: ",
                missing.display()
            )),
            "{e}"
        );
        let bad = write(dir.path(), "bad.seed", b"zz", 0o600);
        let e = ok(&yaml_with_key(&bad, ""))
            .check_files()
            .unwrap_err()
            .to_string();
        assert!(e.contains("jwt_signing_key: "));
        assert!(
            e.starts_with(&format!(
                "provisioner.yaml: jwt_signing_key: {}: unsupported signing key",
                bad.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn secrets_can_come_from_files_but_not_twice() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        let pass = dir.path().join("pass");
        std::fs::write(&token, "t0ken\n").unwrap();
        std::fs::write(&pass, "pa55").unwrap();
        let mut cfg = ok(&format!(
            "helper: /bin/true\ntoken_file: {}\nbroker_provisioning_password_file: {}\n",
            token.display(),
            pass.display()
        ));
        assert!(cfg.token.is_empty(), "parse does not read files");
        cfg.read_secret_files().unwrap();
        assert_eq!(cfg.token.expose(), "t0ken");
        assert_eq!(
            cfg.broker_provisioning_password
                .as_ref()
                .map(|p| p.expose()),
            Some("pa55")
        );
        let both = parse("helper: /bin/true\ntoken: a\ntoken_file: /x\n").unwrap_err();
        assert!(both.to_string().contains("token_file"), "{both}");
        let mut missing = ok("helper: /bin/true\ntoken_file: /nonexistent/token\n");
        let e = missing.read_secret_files().unwrap_err().to_string();
        assert!(
            e.contains("token_file") && e.contains("/nonexistent/token"),
            "{e}"
        );
    }
}
