//! The value types of the settings: `features:`, `cert_manager:`, the log
//! level and the log target.

use std::path::PathBuf;
use std::time::Duration;

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
    pub(super) fn from_go(s: &str) -> Option<Self> {
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
