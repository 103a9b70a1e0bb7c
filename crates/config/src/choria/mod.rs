//! The Choria client configuration (`--choria-config`, e.g.
//! `/etc/choria-provisioner/choria.cfg`), read like go-choria's
//! `config.NewConfig`, and what the provisioner derives from it: protocol
//! version, caller id, NATS connection options and request signer.
//!
//! File format (go-choria `config/util.go`): one `key = value` per line;
//! surrounding whitespace is ignored; lines starting with `#` and blank lines
//! are skipped; there are no inline comments (`a = b # c` sets `a` to `b # c`);
//! the key ends at the first `=`; a line without a value is ignored; a later
//! line overrides an earlier one. Booleans are `1|yes|true|y|t` and
//! `0|no|false|n|f` (any case); other text is false. Path settings expand a
//! leading `~` to the home directory. As in go-choria, a `plugin.d/choria.cfg`
//! next to the file (unless the file is under the home directory) adds
//! `plugin.choria.*` settings, overriding the main file.
//!
//! Only what a provisioner client needs is interpreted; every other key is
//! accepted and ignored (go-choria has hundreds). `loglevel` and `logfile` are
//! ignored because the Go provisioner overrides them from `provisioner.yaml`.
//! Not supported, with an error naming the key: security providers other than
//! `file` and `choria`, SRV lookups for brokers, remote request signers,
//! anonymous client TLS and NATS credentials files. Project files
//! (`choria.conf` in the working directory and its parents) are not read.

use super::{ConfigError, ConfigWarning, Secret};
use choria_wire::client::{ConnectOptions, Identity};
use choria_wire::protocol::{RequestSigner, Version};
use choria_wire::security::ed25519::parse_seed_hex;
use choria_wire::security::tokens::{parse_unverified, ClientIdClaims, CLIENT_ID_PURPOSE};
use choria_wire::subjects::{self, PROVISIONING_COLLECTIVE};
use choria_wire::tls::TlsSettings;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The user the Choria broker maps to the provisioning account.
pub const PROVISIONER_NATS_USER: &str = "provisioner";

const KEY_IDENTITY: &str = "identity";
const KEY_HOSTS: &str = "plugin.choria.middleware_hosts";
const KEY_USE_SRV: &str = "plugin.choria.use_srv";
const KEY_SRV_DOMAIN: &str = "plugin.choria.srv_domain";
const KEY_PROVIDER: &str = "plugin.security.provider";
const KEY_FILE_CERT: &str = "plugin.security.file.certificate";
const KEY_FILE_KEY: &str = "plugin.security.file.key";
const KEY_FILE_CA: &str = "plugin.security.file.ca";
const KEY_CHORIA_TOKEN: &str = "plugin.security.choria.token_file";
const KEY_CHORIA_SEED: &str = "plugin.security.choria.seed_file";
const KEY_CHORIA_CA: &str = "plugin.security.choria.ca";
const KEY_CHORIA_CERT: &str = "plugin.security.choria.certificate";
const KEY_CHORIA_KEY: &str = "plugin.security.choria.key";
const KEY_NATS_USER: &str = "plugin.nats.user";
const KEY_NATS_PASS: &str = "plugin.nats.pass";
const KEY_NATS_CREDS: &str = "plugin.nats.credentials";
const KEY_SIGNER_URL: &str = "plugin.choria.security.request_signer.url";
const KEY_SIGNER_SERVICE: &str = "plugin.choria.security.request_signer.service";
const KEY_SIGNER_TOKEN: &str = "plugin.choria.security.request_signer.token_file";
const KEY_SIGNER_SEED: &str = "plugin.choria.security.request_signer.seed_file";
const KEY_CLIENT_ANON_TLS: &str = "plugin.security.client_anon_tls";

/// Keys this module reads; a value of one of these containing ` #` gets a
/// warning, since there are no inline comments.
const USED_KEYS: &[&str] = &[
    KEY_IDENTITY,
    KEY_HOSTS,
    KEY_USE_SRV,
    KEY_SRV_DOMAIN,
    KEY_PROVIDER,
    KEY_FILE_CERT,
    KEY_FILE_KEY,
    KEY_FILE_CA,
    KEY_CHORIA_TOKEN,
    KEY_CHORIA_SEED,
    KEY_CHORIA_CA,
    KEY_CHORIA_CERT,
    KEY_CHORIA_KEY,
    KEY_NATS_USER,
    KEY_NATS_PASS,
];

/// The security providers a provisioner can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityProvider {
    /// x509 from files: protocol v1.
    File,
    /// ed25519 + JWT: protocol v2.
    Choria,
}

impl SecurityProvider {
    fn protocol_version(self) -> Version {
        match self {
            SecurityProvider::File => Version::V1,
            SecurityProvider::Choria => Version::V2,
        }
    }
}

/// What the process environment contributes, so derivations are testable.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    /// `$USER`.
    pub user: Option<String>,
    /// `$MCOLLECTIVE_CERTNAME`.
    pub certname: Option<String>,
    /// Running as uid 0.
    pub is_root: bool,
    /// The home directory, for `~` in paths and the `plugin.d` rule.
    pub home: Option<PathBuf>,
    /// The host name, the default identity.
    pub hostname: Option<String>,
    /// Unix time, for the client token's expiry.
    pub now_unix: i64,
}

impl Environment {
    /// Reads the current process's environment.
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var(k).ok();
        Environment {
            user: var("USER"),
            certname: var("MCOLLECTIVE_CERTNAME"),
            is_root: real_uid() == Some(0),
            home: var("HOME").filter(|h| !h.is_empty()).map(PathBuf::from),
            hostname: hostname(),
            now_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64),
        }
    }
}

fn real_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
}

/// A value (never empty) and where it came from.
#[derive(Clone)]
struct RawValue {
    value: String,
    file: PathBuf,
    line: usize,
}

impl RawValue {
    fn warning(&self, key: &str, message: impl Into<String>) -> ConfigWarning {
        ConfigWarning::new(&self.file, Some(self.line), key, message)
    }
}

/// All `key = value` pairs read, for [`ChoriaClientConfig::option`]. `Debug`
/// lists keys only, since values may be passwords.
#[derive(Clone, Default)]
struct RawOptions(BTreeMap<String, RawValue>);

impl fmt::Debug for RawOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// The parts of a Choria client configuration a provisioner uses.
#[derive(Clone, Debug)]
pub struct ChoriaClientConfig {
    /// The main file.
    pub file: PathBuf,
    /// Every file read, in order (the main file, then `plugin.d/choria.cfg`).
    pub files: Vec<PathBuf>,
    /// `identity`, or the host name when unset.
    pub identity: String,
    /// `plugin.choria.middleware_hosts`, as listed.
    pub middleware_hosts: Vec<String>,
    /// `plugin.choria.use_srv` (default true; SRV lookups are not done).
    pub use_srv: bool,
    pub srv_domain: Option<String>,
    /// `plugin.security.provider` as written; go-choria's default is `puppet`.
    pub security_provider: Option<String>,
    pub file_certificate: Option<PathBuf>,
    pub file_key: Option<PathBuf>,
    pub file_ca: Option<PathBuf>,
    pub choria_token_file: Option<PathBuf>,
    pub choria_seed_file: Option<PathBuf>,
    pub choria_ca: Option<PathBuf>,
    pub choria_certificate: Option<PathBuf>,
    pub choria_key: Option<PathBuf>,
    pub nats_user: Option<String>,
    pub nats_pass: Option<Secret>,
    /// Things worth a look (unparseable lines, inline comments …).
    pub warnings: Vec<ConfigWarning>,
    options: RawOptions,
}

impl ChoriaClientConfig {
    /// Reads `path` (and `plugin.d/choria.cfg` beside it) with the process
    /// environment.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        Self::load_with(path, &Environment::from_process())
    }

    /// [`ChoriaClientConfig::load`] with a given environment.
    pub fn load_with(path: impl AsRef<Path>, env: &Environment) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let mut sources = Sources::default();
        sources.add(&super::read_file(path)?, path, "");
        if let Some(dotd) = plugin_d_file(path, env.home.as_deref()) {
            sources.add(&super::read_file(&dotd)?, &dotd, "plugin.choria.");
        }
        Self::from_sources(path, sources, env)
    }

    /// Parses file text without reading anything else; `file` is used in
    /// messages.
    pub fn parse(
        text: &str,
        file: impl AsRef<Path>,
        env: &Environment,
    ) -> Result<Self, ConfigError> {
        let file = file.as_ref();
        let mut sources = Sources::default();
        sources.add(text, file, "");
        Self::from_sources(file, sources, env)
    }

    fn from_sources(file: &Path, sources: Sources, env: &Environment) -> Result<Self, ConfigError> {
        let Sources {
            files,
            options,
            mut warnings,
        } = sources;
        for key in USED_KEYS {
            if let Some(raw) = options.0.get(*key).filter(|r| r.value.contains(" #")) {
                warnings.push(raw.warning(
                    key,
                    "the value contains ' #': comments must be on their own line, so it is part of the value",
                ));
            }
        }
        let get = |key: &str| options.0.get(key).map(|r| r.value.clone());
        // The `type:"path_string"` keys of go-choria.
        let path = |key: &str| get(key).map(|v| expand_home(&v, env.home.as_deref()));
        let use_srv = match options.0.get(KEY_USE_SRV) {
            None => true,
            Some(raw) => str_to_bool(&raw.value).unwrap_or_else(|| {
                warnings.push(raw.warning(
                    KEY_USE_SRV,
                    format!(
                        "{:?} is not a boolean (1, yes, true, y, t / 0, no, false, n, f); treated as false like go-choria",
                        raw.value
                    ),
                ));
                false
            }),
        };

        let identity = match get(KEY_IDENTITY) {
            Some(i) => i,
            None => env.hostname.clone().ok_or_else(|| {
                ConfigError::invalid(
                    file,
                    None,
                    KEY_IDENTITY,
                    "not set and the host name could not be determined; set identity",
                )
            })?,
        };

        let middleware_hosts = get(KEY_HOSTS)
            .map(|v| {
                v.split(',')
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .collect()
            })
            .unwrap_or_default();

        Ok(ChoriaClientConfig {
            file: file.to_path_buf(),
            files,
            identity,
            middleware_hosts,
            use_srv,
            srv_domain: get(KEY_SRV_DOMAIN),
            security_provider: get(KEY_PROVIDER),
            file_certificate: path(KEY_FILE_CERT),
            file_key: path(KEY_FILE_KEY),
            file_ca: path(KEY_FILE_CA),
            choria_token_file: path(KEY_CHORIA_TOKEN),
            choria_seed_file: path(KEY_CHORIA_SEED),
            choria_ca: path(KEY_CHORIA_CA),
            choria_certificate: path(KEY_CHORIA_CERT),
            choria_key: path(KEY_CHORIA_KEY),
            nats_user: get(KEY_NATS_USER),
            nats_pass: get(KEY_NATS_PASS).map(Secret::new),
            warnings,
            options,
        })
    }

    /// A raw setting as read (any key).
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.0.get(key).map(|r| r.value.as_str())
    }

    /// Where `key` was set, or the main file when it was not.
    fn line(&self, key: &str) -> (&Path, Option<usize>) {
        match self.options.0.get(key) {
            Some(r) => (&r.file, Some(r.line)),
            None => (&self.file, None),
        }
    }

    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let (file, line) = self.line(key);
        ConfigError::invalid(file, line, key, message)
    }

    fn warn(&self, key: &str, message: impl Into<String>) -> ConfigWarning {
        let (file, line) = self.line(key);
        ConfigWarning::new(file, line, key, message)
    }

    /// The security provider in effect. `choria_insecure` forces `file`, as
    /// the Go provisioner does.
    pub fn security_provider(&self, insecure: bool) -> Result<SecurityProvider, ConfigError> {
        if insecure {
            return Ok(SecurityProvider::File);
        }
        match self.security_provider.as_deref() {
            Some("file") => Ok(SecurityProvider::File),
            Some("choria") => Ok(SecurityProvider::Choria),
            None => Err(self.err(
                KEY_PROVIDER,
                "not set, so go-choria would use puppet, which this provisioner does not support; set it to file (x509 certificates) or choria (ed25519 JWT), or use choria_insecure: true",
            )),
            Some(p @ ("puppet" | "pkcs11" | "certmanager")) => Err(self.err(
                KEY_PROVIDER,
                format!("{p} is not supported by this provisioner; use file (x509 certificates) or choria (ed25519 JWT)"),
            )),
            Some(other) => Err(self.err(
                KEY_PROVIDER,
                format!("{other:?} is not a security provider; use file (x509 certificates) or choria (ed25519 JWT)"),
            )),
        }
    }

    /// Protocol v1 for `file`, v2 for `choria`.
    pub fn protocol_version(&self, insecure: bool) -> Result<Version, ConfigError> {
        Ok(self.security_provider(insecure)?.protocol_version())
    }

    /// The x509 certificate name (go-choria's file provider): the
    /// `MCOLLECTIVE_CERTNAME` environment variable if set; otherwise, when not
    /// root and `USER` is set, `<user>.mcollective`; otherwise the identity.
    pub fn certname(&self, env: &Environment) -> String {
        if let Some(c) = env.certname.as_deref().filter(|c| !c.is_empty()) {
            return c.to_string();
        }
        if !env.is_root {
            if let Some(u) = &env.user {
                return format!("{u}.mcollective");
            }
        }
        self.identity.clone()
    }

    /// The caller id: `choria=<certname>` in v1, the client token's `callerid`
    /// in v2.
    pub fn caller_id(&self, insecure: bool, env: &Environment) -> Result<String, ConfigError> {
        match self.security_provider(insecure)? {
            SecurityProvider::File => Ok(v1_caller(&self.certname(env))),
            SecurityProvider::Choria => Ok(self.client_token(env)?.caller),
        }
    }

    /// Broker URLs (`scheme://host:port`) from `plugin.choria.middleware_hosts`;
    /// entries without a scheme get `nats://`.
    pub fn middleware_servers(&self) -> Result<Vec<String>, ConfigError> {
        if self.middleware_hosts.is_empty() {
            let srv = match (self.use_srv, &self.srv_domain) {
                (false, _) => String::new(),
                (true, Some(d)) => format!(" SRV lookups (in {d}) are not supported,"),
                (true, None) => " SRV lookups are not supported,".to_string(),
            };
            return Err(self.err(
                KEY_HOSTS,
                format!("not set;{srv} list the brokers as host:port or nats://host:port"),
            ));
        }
        self.middleware_hosts
            .iter()
            .map(|h| normalize_host(h).map_err(|e| self.err(KEY_HOSTS, format!("{h:?}: {e}"))))
            .collect()
    }
}

/// go-choria reads `plugin.d/choria.cfg` beside the main file unless that
/// file is under the home directory.
fn plugin_d_file(path: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let under_home = home.is_some_and(|h| {
        abs.to_string_lossy()
            .starts_with(h.to_string_lossy().as_ref())
    });
    if under_home {
        return None;
    }
    let dotd = abs.parent()?.join("plugin.d").join("choria.cfg");
    dotd.is_file().then_some(dotd)
}

/// What the files read so far hold.
#[derive(Default)]
struct Sources {
    files: Vec<PathBuf>,
    options: RawOptions,
    warnings: Vec<ConfigWarning>,
}

impl Sources {
    /// Adds `file`'s lines, each key prefixed with `prefix`, as go-choria's
    /// `parseConfigContents` reads them: see the module docs.
    fn add(&mut self, text: &str, file: &Path, prefix: &str) {
        self.files.push(file.to_path_buf());
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // The key is everything before the first '=' that is not the first
            // character, the value everything after it; both trimmed; the value
            // must not be empty.
            let parsed = line
                .char_indices()
                .skip(1)
                .find(|(_, c)| *c == '=')
                .map(|(pos, _)| (line[..pos].trim_end(), line[pos + 1..].trim_start()))
                .filter(|(_, v)| !v.is_empty());
            match parsed {
                Some((key, value)) => {
                    self.options.0.insert(
                        format!("{prefix}{key}"),
                        RawValue {
                            value: value.to_string(),
                            file: file.to_path_buf(),
                            line: i + 1,
                        },
                    );
                }
                None => self.warnings.push(ConfigWarning::new(
                    file,
                    Some(i + 1),
                    line.chars().take(60).collect::<String>(),
                    "not a `key = value` line with a value, ignored",
                )),
            }
        }
    }
}

/// go-choria's v1 caller id for an x509 certificate name.
fn v1_caller(certname: &str) -> String {
    format!("choria={certname}")
}

/// go-choria's `strToBool`.
fn str_to_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "y" | "t" => Some(true),
        "0" | "no" | "false" | "n" | "f" => Some(false),
        _ => None,
    }
}

/// go-choria's `ExpandPath`: a leading `~` becomes the home directory.
fn expand_home(value: &str, home: Option<&Path>) -> PathBuf {
    let v = value.trim();
    match (v.strip_prefix('~'), home) {
        (Some(rest), Some(home)) => PathBuf::from(format!("{}{rest}", home.display())),
        _ => PathBuf::from(v),
    }
}

/// One `middleware_hosts` entry to `scheme://host:port`.
fn normalize_host(entry: &str) -> Result<String, String> {
    let (scheme, rest) = match entry.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => ("nats".to_string(), entry),
    };
    if !matches!(scheme.as_str(), "nats" | "tls" | "ws" | "wss") {
        return Err(format!(
            "unsupported scheme {scheme:?}; use nats://, tls://, ws:// or wss://"
        ));
    }
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or("no port; write host:port, e.g. broker.example.net:4222")?;
    let host_ok = if let Some(inner) = host.strip_prefix('[') {
        inner.ends_with(']')
    } else {
        !host.is_empty() && !host.contains([':', '/', '@', ' '])
    };
    if !host_ok {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port number"))?;
    Ok(format!("{scheme}://{host}:{port}"))
}

mod setup;
pub use setup::*;

#[cfg(test)]
mod tests;
