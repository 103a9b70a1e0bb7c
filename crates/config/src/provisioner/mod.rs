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
//!
//! The parts: [`ProvisionerConfig`] and the defaults here; the value types of
//! its sections in `types`; reading the file in `parse`; the files the
//! settings point at in `files`; what the code uses instead of the raw
//! settings in `derived`; the settings written back (`to_file`) and reported
//! (`report`, for `run --check`).

use super::duration::format_duration;
use super::election::ElectionConfig;
use super::template::ConfigurationTemplate;
use super::yaml::Section;
use super::{ConfigError, ConfigWarning, Secret};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod derived;
mod files;
mod parse;
mod report;
mod to_file;
mod types;

pub use types::{
    CertManagerConfig, Features, LogLevel, LogTarget, CERT_MANAGER_USAGES,
    DEFAULT_CERT_MANAGER_TIMEOUT, DEFAULT_CERT_MANAGER_USAGES,
};

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
/// `request_batch_window` when unset: how long the same request to many
/// nodes is gathered to go out under one signature. Small beside any RPC's
/// wait; at a few hundred nodes a second it puts several in each message.
pub const DEFAULT_REQUEST_BATCH_WINDOW: Duration = Duration::from_millis(20);

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
    /// Key that signs server JWTs: a file (ed25519 seed, or RSA PEM), or
    /// an ed25519 key in a PKCS#11 token (a `pkcs11:` URI).
    pub jwt_signing_key: Option<crate::ca::KeyRef>,
    /// Our chain-issuer client JWT, for Organization Issuer server JWTs.
    pub jwt_signing_token: Option<PathBuf>,
    /// Validity of issued server JWTs; default 1y.
    pub server_jwt_validity: Duration,
    /// Go's key for the admission policy's file, as written (see
    /// [`ProvisionerConfig::admission`]).
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
    /// How long the same directed request to many nodes is gathered to go
    /// out as one signed message (ours); zero sends each alone.
    pub request_batch_window: Duration,
    /// DNS names besides the identity a node's CSR may ask for (ours).
    pub csr_allowed_dns_names: Vec<String>,
    /// The nodes' configuration as templates (ours); with it the helper is
    /// optional, and its answer is merged over the template's.
    pub configuration_template: Option<ConfigurationTemplate>,
    /// cert-manager as the signer of the nodes' certificates (ours).
    pub cert_manager: Option<CertManagerConfig>,
    /// The built-in CA as the signer of the nodes' certificates (ours).
    pub ca: Option<crate::ca::CaConfig>,
    /// Where every provisioning is recorded (ours).
    pub records: Option<crate::day_two::RecordsConfig>,
    /// Credentials renewed before they expire (ours).
    pub renewal: Option<crate::day_two::RenewalConfig>,
    /// The admission policy (ours; `admission:` or `rego_policy`).
    pub admission: Option<crate::admission::AdmissionConfig>,
    /// Every decision as a sealed event on a stream (ours; needs records).
    pub audit: Option<crate::audit::AuditConfig>,
    /// The instance identity evidence every node must present (ours).
    pub evidence: Option<crate::evidence::EvidenceConfig>,
    /// Each node's sequence as a trace over OTLP (ours).
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
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

    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(&self.file, None, key, message)
    }
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Go's `runtime.NumCPU()`.
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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
mod tests;
