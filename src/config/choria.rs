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
use crate::choria::client::{ConnectOptions, Identity};
use crate::choria::protocol::{RequestSigner, Version};
use crate::choria::security::ed25519::parse_seed_hex;
use crate::choria::security::tokens::parse_unverified;
use crate::choria::subjects::{self, PROVISIONING_COLLECTIVE};
use crate::choria::tls::TlsSettings;
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

/// Keys whose values are paths (`type:"path_string"` in go-choria).
const PATH_KEYS: &[&str] = &[
    KEY_FILE_CERT,
    KEY_FILE_KEY,
    KEY_FILE_CA,
    KEY_CHORIA_TOKEN,
    KEY_CHORIA_SEED,
    KEY_CHORIA_CA,
    KEY_CHORIA_CERT,
    KEY_CHORIA_KEY,
    KEY_SIGNER_TOKEN,
    KEY_SIGNER_SEED,
];

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

/// Where a value came from.
#[derive(Clone, PartialEq, Eq)]
struct RawValue {
    value: String,
    file: PathBuf,
    line: usize,
}

/// All `key = value` pairs read, for [`ChoriaClientConfig::option`]. `Debug`
/// lists keys only, since values may be passwords.
#[derive(Clone, Default, PartialEq, Eq)]
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

/// Everything needed to connect and to sign requests.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub version: Version,
    pub connect: ConnectOptions,
    pub identity: Identity,
    /// Always `provisioning`: the Go provisioner forces its collectives.
    pub collective: &'static str,
    /// Notes on how the connection will be made (e.g. TLS not verified).
    pub warnings: Vec<ConfigWarning>,
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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        let mut options = RawOptions::default();
        let mut warnings = Vec::new();
        let mut files = vec![path.to_path_buf()];
        parse_lines(&text, path, "", &mut options, &mut warnings);

        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let under_home = env.home.as_ref().is_some_and(|h| {
            abs.to_string_lossy()
                .starts_with(h.to_string_lossy().as_ref())
        });
        if !under_home {
            if let Some(dir) = abs.parent() {
                let dotd = dir.join("plugin.d").join("choria.cfg");
                if dotd.is_file() {
                    let text =
                        std::fs::read_to_string(&dotd).map_err(|source| ConfigError::Read {
                            file: dotd.clone(),
                            source,
                        })?;
                    parse_lines(&text, &dotd, "plugin.choria.", &mut options, &mut warnings);
                    files.push(dotd);
                }
            }
        }
        Self::from_options(path, files, options, warnings, env)
    }

    /// Parses file text without reading anything else; `file` is used in
    /// messages.
    pub fn parse(text: &str, file: impl AsRef<Path>, env: &Environment) -> Result<Self, ConfigError> {
        let file = file.as_ref();
        let mut options = RawOptions::default();
        let mut warnings = Vec::new();
        parse_lines(text, file, "", &mut options, &mut warnings);
        Self::from_options(file, vec![file.to_path_buf()], options, warnings, env)
    }

    fn from_options(
        file: &Path,
        files: Vec<PathBuf>,
        options: RawOptions,
        mut warnings: Vec<ConfigWarning>,
        env: &Environment,
    ) -> Result<Self, ConfigError> {
        for key in USED_KEYS {
            if let Some(raw) = options.0.get(*key) {
                if raw.value.contains(" #") {
                    warnings.push(ConfigWarning::new(
                        &raw.file,
                        Some(raw.line),
                        *key,
                        "the value contains ' #': comments must be on their own line, so it is part of the value",
                    ));
                }
            }
        }
        let get = |key: &str| options.0.get(key).map(|r| r.value.clone());
        let path = |key: &str| {
            get(key).map(|v| {
                debug_assert!(PATH_KEYS.contains(&key));
                expand_home(&v, env.home.as_deref())
            })
        };
        let mut bool_opt = |key: &str, default: bool| match options.0.get(key) {
            None => default,
            Some(raw) => str_to_bool(&raw.value).unwrap_or_else(|| {
                warnings.push(ConfigWarning::new(
                    &raw.file,
                    Some(raw.line),
                    key,
                    format!(
                        "{:?} is not a boolean (1, yes, true, y, t / 0, no, false, n, f); treated as false like go-choria",
                        raw.value
                    ),
                ));
                false
            }),
        };
        let use_srv = bool_opt(KEY_USE_SRV, true);

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

    fn line(&self, key: &str) -> (PathBuf, Option<usize>) {
        match self.options.0.get(key) {
            Some(r) => (r.file.clone(), Some(r.line)),
            None => (self.file.clone(), None),
        }
    }

    fn err(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let (file, line) = self.line(key);
        ConfigError::invalid(&file, line, key, message)
    }

    fn warn(&self, key: &str, message: impl Into<String>) -> ConfigWarning {
        let (file, line) = self.line(key);
        ConfigWarning::new(&file, line, key, message)
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
        Ok(match self.security_provider(insecure)? {
            SecurityProvider::File => Version::V1,
            SecurityProvider::Choria => Version::V2,
        })
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
            SecurityProvider::File => Ok(format!("choria={}", self.certname(env))),
            SecurityProvider::Choria => Ok(self.client_token(env)?.caller),
        }
    }

    /// Broker URLs (`scheme://host:port`) from `plugin.choria.middleware_hosts`;
    /// entries without a scheme get `nats://`.
    pub fn middleware_servers(&self) -> Result<Vec<String>, ConfigError> {
        if self.middleware_hosts.is_empty() {
            let why = if self.use_srv {
                match &self.srv_domain {
                    Some(d) => format!(
                        "not set; SRV lookups (in {d}) are not supported, list the brokers as host:port or nats://host:port"
                    ),
                    None => "not set; SRV lookups are not supported, list the brokers as host:port or nats://host:port".to_string(),
                }
            } else {
                "not set; list the brokers as host:port or nats://host:port".to_string()
            };
            return Err(self.err(KEY_HOSTS, why));
        }
        self.middleware_hosts
            .iter()
            .map(|h| normalize_host(h).map_err(|e| self.err(KEY_HOSTS, format!("{h:?}: {e}"))))
            .collect()
    }

    /// Connection options, identity and signer, as the Go provisioner sets them
    /// up from this file and `provisioner.yaml`.
    pub fn client_setup(
        &self,
        prov: &super::ProvisionerConfig,
        env: &Environment,
    ) -> Result<ClientSetup, ConfigError> {
        self.client_setup_for(
            prov.choria_insecure,
            prov.broker_provisioning_password.as_ref(),
            env,
        )
    }

    /// [`ChoriaClientConfig::client_setup`] with the two provisioner settings
    /// that matter given directly.
    pub fn client_setup_for(
        &self,
        insecure: bool,
        broker_password: Option<&Secret>,
        env: &Environment,
    ) -> Result<ClientSetup, ConfigError> {
        let provider = self.security_provider(insecure)?;
        self.check_unsupported(provider)?;
        let servers = self.middleware_servers()?;
        let mut warnings = Vec::new();

        let user = match broker_password.filter(|p| !p.is_empty()) {
            Some(p) => Some((PROVISIONER_NATS_USER.to_string(), p.expose().to_string())),
            None => match (&self.nats_user, &self.nats_pass) {
                (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => {
                    Some((u.clone(), p.expose().to_string()))
                }
                _ => None,
            },
        };

        let (version, caller, signer, tls, token, nats_jwt, name) = match provider {
            SecurityProvider::File if insecure => (
                Version::V1,
                format!("choria={}", self.certname(env)),
                RequestSigner::V1Insecure,
                TlsSettings::default(),
                None,
                None,
                self.certname(env),
            ),
            SecurityProvider::File => {
                let cert = self.existing_file(KEY_FILE_CERT, self.file_certificate.as_deref())?;
                let key = self.existing_file(KEY_FILE_KEY, self.file_key.as_deref())?;
                let ca = self.existing_file(KEY_FILE_CA, self.file_ca.as_deref())?;
                let cert_pem = std::fs::read_to_string(&cert)
                    .map_err(|e| self.err(KEY_FILE_CERT, format!("{}: {e}", cert.display())))?;
                if !cert_pem.contains("-----BEGIN CERTIFICATE-----") {
                    return Err(self.err(
                        KEY_FILE_CERT,
                        format!("{} holds no PEM certificate", cert.display()),
                    ));
                }
                let rsa_key = self.read_rsa_key(&key)?;
                (
                    Version::V1,
                    format!("choria={}", self.certname(env)),
                    RequestSigner::V1Rsa {
                        key: Box::new(rsa_key),
                        cert_pem,
                    },
                    TlsSettings {
                        required: true,
                        ca_file: Some(ca),
                        client_cert: Some((cert, key)),
                        insecure_skip_verify: false,
                    },
                    None,
                    None,
                    self.certname(env),
                )
            }
            SecurityProvider::Choria => {
                let token = self.client_token(env)?;
                let seed_path = self.seed_file()?;
                let seed_text = std::fs::read_to_string(&seed_path).map_err(|e| {
                    self.err(KEY_CHORIA_SEED, format!("{}: {e}", seed_path.display()))
                })?;
                let seed = parse_seed_hex(&seed_text).map_err(|_| {
                    self.err(
                        KEY_CHORIA_SEED,
                        format!(
                            "{} is not an ed25519 seed (64 hex characters)",
                            seed_path.display()
                        ),
                    )
                })?;
                let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
                if let Some(pk) = &token.public_key {
                    let ours = hex::encode(signing.verifying_key().as_bytes());
                    if !pk.eq_ignore_ascii_case(&ours) {
                        return Err(self.err(
                            KEY_CHORIA_SEED,
                            format!(
                                "{} does not belong to the token in {}: its public key is {ours}, the token's public_key is {pk}",
                                seed_path.display(),
                                token.path.display()
                            ),
                        ));
                    }
                }
                let mut tls = TlsSettings {
                    required: true,
                    ..TlsSettings::default()
                };
                match self.choria_ca.as_deref() {
                    Some(ca) => tls.ca_file = Some(self.existing_file(KEY_CHORIA_CA, Some(ca))?),
                    None => {
                        tls.insecure_skip_verify = true;
                        warnings.push(self.warn(
                            KEY_CHORIA_CA,
                            "not set, so the broker's TLS certificate is not verified (as go-choria does)",
                        ));
                    }
                }
                match (
                    self.choria_certificate.as_deref(),
                    self.choria_key.as_deref(),
                ) {
                    (Some(c), Some(k)) => {
                        let c = self.existing_file(KEY_CHORIA_CERT, Some(c))?;
                        let k = self.existing_file(KEY_CHORIA_KEY, Some(k))?;
                        tls.client_cert = Some((c, k));
                    }
                    (Some(_), None) => {
                        return Err(self.err(
                            KEY_CHORIA_CERT,
                            format!("set without {KEY_CHORIA_KEY}; set both for mutual TLS"),
                        ))
                    }
                    (None, Some(_)) => {
                        return Err(self.err(
                            KEY_CHORIA_KEY,
                            format!("set without {KEY_CHORIA_CERT}; set both for mutual TLS"),
                        ))
                    }
                    (None, None) => {}
                }
                (
                    Version::V2,
                    token.caller.clone(),
                    RequestSigner::V2 {
                        seed: Box::new(signing.clone()),
                        jwt: token.jwt.clone(),
                    },
                    tls,
                    Some(token.jwt.clone()),
                    Some((token.jwt, signing)),
                    env.user.clone().unwrap_or_else(|| self.identity.clone()),
                )
            }
        };

        let inbox_prefix =
            subjects::inbox_prefix(PROVISIONING_COLLECTIVE, &caller, version == Version::V2);
        Ok(ClientSetup {
            version,
            connect: ConnectOptions {
                servers,
                name,
                tls,
                token,
                user,
                nats_jwt,
                inbox_prefix: Some(inbox_prefix),
            },
            identity: Identity {
                identity: self.identity.clone(),
                caller,
                signer,
            },
            collective: PROVISIONING_COLLECTIVE,
            warnings,
        })
    }

    /// go-choria features a provisioner cannot use; erroring beats connecting
    /// in a way the broker then rejects.
    fn check_unsupported(&self, provider: SecurityProvider) -> Result<(), ConfigError> {
        if self.option(KEY_NATS_CREDS).is_some_and(|v| !v.is_empty()) {
            return Err(self.err(KEY_NATS_CREDS, "NATS credentials files are not supported"));
        }
        if self.option(KEY_CLIENT_ANON_TLS).and_then(str_to_bool) == Some(true) {
            return Err(self.err(
                KEY_CLIENT_ANON_TLS,
                "anonymous client TLS needs a remote request signer, which is not supported",
            ));
        }
        if self.option(KEY_SIGNER_URL).is_some_and(|v| !v.is_empty())
            || self.option(KEY_SIGNER_SERVICE).and_then(str_to_bool) == Some(true)
        {
            let key = if self.option(KEY_SIGNER_URL).is_some() {
                KEY_SIGNER_URL
            } else {
                KEY_SIGNER_SERVICE
            };
            return Err(self.err(key, "remote request signers (aaasvc) are not supported"));
        }
        if provider == SecurityProvider::Choria {
            for key in [KEY_SIGNER_TOKEN, KEY_SIGNER_SEED] {
                if self.option(key).is_some_and(|v| !v.is_empty()) {
                    return Err(self.err(
                        key,
                        "can not be used with the choria security provider",
                    ));
                }
            }
        }
        Ok(())
    }

    fn existing_file(&self, key: &str, path: Option<&Path>) -> Result<PathBuf, ConfigError> {
        let Some(path) = path else {
            return Err(self.err(key, "not set; it is required by this security provider"));
        };
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(path.to_path_buf()),
            Ok(_) => Err(self.err(key, format!("{} is not a file", path.display()))),
            Err(e) => Err(self.err(key, format!("{}: {e}", path.display()))),
        }
    }

    fn read_rsa_key(&self, path: &Path) -> Result<rsa::RsaPrivateKey, ConfigError> {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        let data = std::fs::read(path)
            .map_err(|e| self.err(KEY_FILE_KEY, format!("{}: {e}", path.display())))?;
        let block = pem::parse(&data).map_err(|_| {
            self.err(
                KEY_FILE_KEY,
                format!("{} holds no PEM private key", path.display()),
            )
        })?;
        rsa::RsaPrivateKey::from_pkcs1_der(block.contents())
            .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_der(block.contents()))
            .map_err(|_| {
                self.err(
                    KEY_FILE_KEY,
                    format!(
                        "{} is not an RSA private key (PKCS#1 or PKCS#8 PEM)",
                        path.display()
                    ),
                )
            })
    }

    /// `plugin.security.choria.seed_file`, defaulting like go-choria to the
    /// token file with its extension replaced by `.key`.
    pub fn seed_file(&self) -> Result<PathBuf, ConfigError> {
        if let Some(s) = &self.choria_seed_file {
            return self.existing_file(KEY_CHORIA_SEED, Some(s));
        }
        let token = self.existing_file(KEY_CHORIA_TOKEN, self.choria_token_file.as_deref())?;
        let seed = token.with_extension("key");
        if seed.is_file() {
            Ok(seed)
        } else {
            Err(self.err(
                KEY_CHORIA_SEED,
                format!(
                    "not set, and the default {} (beside the token) does not exist",
                    seed.display()
                ),
            ))
        }
    }

    fn client_token(&self, env: &Environment) -> Result<ClientToken, ConfigError> {
        let path = self.existing_file(KEY_CHORIA_TOKEN, self.choria_token_file.as_deref())?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| self.err(KEY_CHORIA_TOKEN, format!("{}: {e}", path.display())))?;
        let jwt = text.trim().to_string();
        let bad = |what: String| self.err(KEY_CHORIA_TOKEN, format!("{}: {what}", path.display()));
        let claims: serde_json::Value =
            parse_unverified(&jwt).map_err(|e| bad(format!("not a JWT: {e}")))?;
        let purpose = claims.get("purpose").and_then(|p| p.as_str()).unwrap_or("");
        let caller = claims
            .get("callerid")
            .and_then(|c| c.as_str())
            .unwrap_or("")
            .to_string();
        if !(purpose == "choria_client_id" || (purpose.is_empty() && !caller.is_empty())) {
            return Err(bad(format!(
                "is a {purpose:?} token, not a client token (create one with `choria jwt client`)"
            )));
        }
        if caller.is_empty() {
            return Err(bad("the token has no callerid".into()));
        }
        if let Some(exp) = claims.get("exp").and_then(|e| e.as_i64()) {
            // go-choria validates with 5 seconds of leeway.
            if exp + 5 < env.now_unix {
                let when = chrono::DateTime::from_timestamp(exp, 0)
                    .map_or_else(|| exp.to_string(), |t| t.to_rfc3339());
                return Err(bad(format!("the token expired at {when}")));
            }
        }
        let public_key = claims
            .get("public_key")
            .and_then(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .map(str::to_string);
        Ok(ClientToken {
            path,
            jwt,
            caller,
            public_key,
        })
    }
}

struct ClientToken {
    path: PathBuf,
    jwt: String,
    caller: String,
    public_key: Option<String>,
}

/// go-choria's `parseConfigContents`: see the module docs.
fn parse_lines(
    text: &str,
    file: &Path,
    prefix: &str,
    options: &mut RawOptions,
    warnings: &mut Vec<ConfigWarning>,
) {
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
                options.0.insert(
                    format!("{prefix}{key}"),
                    RawValue {
                        value: value.to_string(),
                        file: file.to_path_buf(),
                        line: i + 1,
                    },
                );
            }
            None => warnings.push(ConfigWarning::new(
                file,
                Some(i + 1),
                line.split('=').next().unwrap_or(line).trim(),
                "not a `key = value` line with a value, ignored",
            )),
        }
    }
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
