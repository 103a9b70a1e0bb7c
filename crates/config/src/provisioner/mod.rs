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
use super::schema::{CertManagerFile, ConfigurationTemplateFile, FeaturesFile, ProvisionerFile};
use super::template::ConfigurationTemplate;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning, Secret};
use choria_wire::security::csr::{compile_deny_list, DEFAULT_CERT_DENY_LIST};
use choria_wire::security::tokens::{
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
/// `reply_window` when unset: how long the reply subject of an answer later
/// steps trust (`jwt`, `gen25519`, `gencsr`) is watched for a second one.
pub const DEFAULT_REPLY_WINDOW: Duration = Duration::from_millis(500);

/// `cert_manager:`: a cert-manager issuer signs the nodes' CSRs through
/// `CertificateRequest`s (ours; see `provision::signing::certmanager`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertManagerConfig {
    /// The issuer's name, kind (`Issuer` or `ClusterIssuer`) and API group.
    pub issuer: String,
    pub issuer_kind: String,
    pub issuer_group: String,
    /// Where the requests are made (an `Issuer` must live there too).
    pub namespace: String,
    /// Requested certificate lifetime; `None`: the issuer's default.
    pub duration: Option<Duration>,
    pub usages: Vec<String>,
    /// How long a request may take to be issued.
    pub timeout: Duration,
    /// How long a used request is kept before it is deleted (zero: at once).
    pub keep: Duration,
}

/// `cert_manager.usages` when unset: a Choria server's certificate serves
/// TLS and is presented as a client to the broker.
pub const DEFAULT_CERT_MANAGER_USAGES: [&str; 4] = [
    "digital signature",
    "key encipherment",
    "server auth",
    "client auth",
];
/// `cert_manager.timeout` when unset.
pub const DEFAULT_CERT_MANAGER_TIMEOUT: Duration = Duration::from_secs(30);
/// cert-manager's key usages (`KeyUsage` in its API).
pub const CERT_MANAGER_USAGES: [&str; 22] = [
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
];

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

/// The provisioner's log level.
///
/// go-choria maps exactly `debug`, `info`, `warn`, `error` and `fatal`;
/// anything else, including an unset `loglevel`, logs at `warn`. The
/// operator's `spec.logLevel` is this type too.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
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

    /// As written in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Fatal => "fatal",
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
#[derive(Clone, Debug, PartialEq)]
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
    /// How long the reply subject of a trusted answer stays watched for a
    /// second, different answer (ours); zero turns the watch off.
    pub reply_window: Duration,
    /// DNS names besides the identity a node's CSR may ask for (ours).
    pub csr_allowed_dns_names: Vec<String>,
    /// The nodes' configuration as templates (ours); with it the helper is
    /// optional, and its answer is merged over the template's.
    pub configuration_template: Option<ConfigurationTemplate>,
    /// cert-manager as the signer of the nodes' certificates (ours).
    pub cert_manager: Option<CertManagerConfig>,
    /// Where every provisioning is recorded (ours).
    pub records: Option<crate::day_two::RecordsConfig>,
    /// Credentials renewed before they expire (ours).
    pub renewal: Option<crate::day_two::RenewalConfig>,
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
            if self.configuration_template.is_some() {
                return Ok(());
            }
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

    /// The compiled `csr_allowed_dns_names` (validated when parsed), each
    /// matching whole names only.
    pub fn csr_allowed_dns_regexes(&self) -> Result<Vec<Regex>, ConfigError> {
        self.csr_allowed_dns_names
            .iter()
            .map(|p| {
                choria_wire::security::csr::compile_whole_name(p)
                    .map_err(|e| self.err("csr_allowed_dns_names", format!("{p:?}: {e}")))
            })
            .collect()
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

    /// The settings as a `provisioner.yaml` that parses back to them
    /// (defaults written out). It holds the secrets themselves: for writing
    /// files, never for logs.
    pub fn to_file(&self) -> ProvisionerFile {
        let d = |d: Duration| Some(format_duration(d));
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        ProvisionerFile {
            workers: Some(self.workers as i64),
            interval: Some(self.interval_text.clone()),
            logfile: self.logfile.clone(),
            loglevel: self.loglevel.clone(),
            helper: (!self.helper.is_empty()).then(|| self.helper.clone()),
            token: (!self.token.is_empty()).then(|| self.token.expose().to_string()),
            token_file: path(&self.token_file),
            broker_provisioning_password_file: path(&self.broker_provisioning_password_file),
            lifecycle_component: Some(self.lifecycle_component.clone()),
            choria_insecure: Some(self.choria_insecure),
            site: Some(self.site.clone()),
            monitor_port: Some(self.monitor_port.map_or(0, i64::from)),
            broker_port: self.broker_port,
            broker_provisioning_password: self
                .broker_provisioning_password
                .as_ref()
                .map(|p| p.expose().to_string()),
            cert_deny_list: Some(self.cert_deny_list.clone()),
            jwt_verify_cert: self.jwt_verify_cert.clone(),
            jwt_signing_key: path(&self.jwt_signing_key),
            jwt_signing_token: path(&self.jwt_signing_token),
            server_jwt_validity: d(self.server_jwt_validity),
            rego_policy: self.rego_policy.clone(),
            leader_election: Some(self.leader_election),
            upgrades_repository: self.upgrades_repository.clone(),
            upgrades_optional: Some(self.upgrades_optional),
            features: Some(FeaturesFile {
                pki: Some(self.features.pki),
                jwt: Some(self.features.jwt),
                ed25519: Some(self.features.ed25519),
                upgrades: Some(self.features.upgrades),
            }),
            election: Some(self.election.to_file()),
            discovery_timeout: d(self.discovery_timeout),
            discovery_window: d(self.discovery_window),
            helper_timeout: d(self.helper_timeout),
            rpc_timeout: self.rpc_timeout.and_then(d),
            reply_window: Some(if self.reply_window.is_zero() {
                "0s".to_string()
            } else {
                format_duration(self.reply_window)
            }),
            csr_allowed_dns_names: Some(self.csr_allowed_dns_names.clone()),
            configuration_template: self.configuration_template.as_ref().map(|t| {
                ConfigurationTemplateFile {
                    values: Some(t.values.clone()),
                    configuration: Some(t.configuration.clone()),
                    action_policies: Some(t.action_policies.clone()),
                    opa_policies: Some(t.opa_policies.clone()),
                    server_claims: t
                        .server_claims
                        .as_ref()
                        .map(|c| serde_json::to_value(c).expect("claims serialize")),
                    upgrade: t.upgrade.clone(),
                }
            }),
            records: self.records.as_ref().map(|r| r.to_file()),
            renewal: self.renewal.as_ref().map(|r| r.to_file()),
            cert_manager: self.cert_manager.as_ref().map(|c| CertManagerFile {
                issuer: Some(c.issuer.clone()),
                issuer_kind: Some(c.issuer_kind.clone()),
                issuer_group: Some(c.issuer_group.clone()),
                namespace: Some(c.namespace.clone()),
                duration: c.duration.map(format_duration),
                usages: Some(c.usages.clone()),
                timeout: d(c.timeout),
                keep: Some(if c.keep.is_zero() {
                    "0s".to_string()
                } else {
                    format_duration(c.keep)
                }),
            }),
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
        if let Some(k) = &e.signing_key {
            out.push(("election.signing_key".into(), k.display().to_string()));
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
            ("reply_window".into(), d(self.reply_window)),
            (
                "csr_allowed_dns_names".into(),
                self.csr_allowed_dns_names.join(" "),
            ),
        ]);
        if let Some(r) = &self.records {
            out.push(("records".into(), r.effective()));
        }
        if let Some(r) = &self.renewal {
            out.push(("renewal".into(), r.effective()));
        }
        if let Some(c) = &self.cert_manager {
            out.push((
                "cert_manager".into(),
                format!(
                    "{} {}.{} in {}, duration {}, usages {}, timeout {}, keep {}",
                    c.issuer_kind,
                    c.issuer,
                    c.issuer_group,
                    c.namespace,
                    c.duration.map_or("(issuer default)".into(), d),
                    c.usages.join(", "),
                    d(c.timeout),
                    d(c.keep)
                ),
            ));
        }
        if let Some(t) = &self.configuration_template {
            // Templates may hold secrets the operator wrote in: only names.
            out.push((
                "configuration_template".into(),
                format!(
                    "{} settings ({}), {} action and {} OPA policies{}{}",
                    t.configuration.len(),
                    t.configuration
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(" "),
                    t.action_policies.len(),
                    t.opa_policies.len(),
                    if t.server_claims.is_some() {
                        ", server claims"
                    } else {
                        ""
                    },
                    if t.upgrade.is_some() { ", upgrade" } else { "" },
                ),
            ));
        }
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

mod parse;

#[cfg(test)]
mod tests;
