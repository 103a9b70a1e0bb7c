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

impl ClientSetup {
    /// How the provisioner will connect and sign, for `run --check`.
    /// Credentials show only whether they are set.
    pub fn effective_settings(&self) -> Vec<(String, String)> {
        let c = &self.connect;
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or_else(|| "(unset)".to_string(), |p| p.display().to_string())
        };
        let signer = match &self.identity.signer {
            RequestSigner::V1Insecure => "none (choria_insecure: requests are not signed)",
            RequestSigner::V1Rsa { .. } => "x509 (RSA key of the file provider)",
            RequestSigner::V2 { .. } => "ed25519 seed + client JWT (choria provider)",
        };
        vec![
            ("protocol".into(), self.version.to_string()),
            ("identity".into(), self.identity.identity.clone()),
            ("caller".into(), self.identity.caller.clone()),
            ("collective".into(), self.collective.into()),
            ("brokers".into(), c.servers.join(" ")),
            ("connection_name".into(), c.name.clone()),
            ("request_signer".into(), signer.into()),
            ("tls.required".into(), c.tls.required.to_string()),
            (
                "tls.verify".into(),
                if c.tls.insecure_skip_verify {
                    "false (the broker's certificate is not verified)".into()
                } else {
                    format!("true (CA {})", path(&c.tls.ca_file))
                },
            ),
            (
                "tls.client_certificate".into(),
                c.tls
                    .client_cert
                    .as_ref()
                    .map_or_else(|| "(none)".into(), |(cert, _)| cert.display().to_string()),
            ),
            (
                "nats_user".into(),
                c.user.as_ref().map_or_else(
                    || "(none)".into(),
                    |(u, _)| format!("{u} (password redacted)"),
                ),
            ),
            (
                "nats_jwt".into(),
                if c.nats_jwt.is_some() {
                    "(set, redacted)"
                } else {
                    "(none)"
                }
                .into(),
            ),
        ]
    }
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
        let user = match broker_password.filter(|p| !p.is_empty()) {
            Some(p) => Some((PROVISIONER_NATS_USER.to_string(), p.expose().to_string())),
            None => match (&self.nats_user, &self.nats_pass) {
                (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => {
                    Some((u.clone(), p.expose().to_string()))
                }
                _ => None,
            },
        };
        let mut connect = ConnectOptions {
            servers: self.middleware_servers()?,
            name: String::new(),
            tls: TlsSettings::default(),
            token: None,
            user,
            nats_jwt: None,
            inbox_prefix: None,
        };
        let mut warnings = Vec::new();

        let (caller, signer) = match provider {
            SecurityProvider::File => {
                connect.name = self.certname(env);
                let signer = if insecure {
                    RequestSigner::V1Insecure
                } else {
                    let (signer, tls) = self.x509_credentials()?;
                    connect.tls = tls;
                    signer
                };
                (v1_caller(&connect.name), signer)
            }
            SecurityProvider::Choria => {
                let token = self.client_token(env)?;
                let seed = self.client_seed(&token)?;
                connect.tls = self.choria_tls(&mut warnings)?;
                connect.name = env.user.clone().unwrap_or_else(|| self.identity.clone());
                connect.token = Some(token.jwt.clone());
                connect.nats_jwt = Some((token.jwt.clone(), seed.clone()));
                let signer = RequestSigner::V2 {
                    seed: Box::new(seed),
                    jwt: token.jwt,
                };
                (token.caller, signer)
            }
        };

        let version = provider.protocol_version();
        connect.inbox_prefix = Some(subjects::inbox_prefix(
            PROVISIONING_COLLECTIVE,
            &caller,
            version == Version::V2,
        ));
        Ok(ClientSetup {
            version,
            connect,
            identity: Identity {
                identity: self.identity.clone(),
                caller,
                signer,
            },
            collective: PROVISIONING_COLLECTIVE,
            warnings,
        })
    }

    /// The `file` provider's request signer and mutual TLS settings.
    fn x509_credentials(&self) -> Result<(RequestSigner, TlsSettings), ConfigError> {
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
        let signer = RequestSigner::V1Rsa {
            key: Box::new(self.read_rsa_key(&key)?),
            cert_pem,
        };
        let tls = TlsSettings {
            required: true,
            ca_file: Some(ca),
            client_cert: Some((cert, key)),
            insecure_skip_verify: false,
        };
        Ok((signer, tls))
    }

    /// The `choria` provider's ed25519 seed, which must belong to `token`.
    fn client_seed(&self, token: &ClientToken) -> Result<ed25519_dalek::SigningKey, ConfigError> {
        let seed_path = self.seed_file()?;
        let seed_text = std::fs::read_to_string(&seed_path)
            .map_err(|e| self.err(KEY_CHORIA_SEED, format!("{}: {e}", seed_path.display())))?;
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
        Ok(signing)
    }

    /// The `choria` provider's TLS: always on, verified when a CA is set,
    /// mutual when a certificate and key are set.
    fn choria_tls(&self, warnings: &mut Vec<ConfigWarning>) -> Result<TlsSettings, ConfigError> {
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
        tls.client_cert = match (
            self.choria_certificate.as_deref(),
            self.choria_key.as_deref(),
        ) {
            (Some(c), Some(k)) => Some((
                self.existing_file(KEY_CHORIA_CERT, Some(c))?,
                self.existing_file(KEY_CHORIA_KEY, Some(k))?,
            )),
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
            (None, None) => None,
        };
        Ok(tls)
    }

    /// go-choria features a provisioner cannot use; erroring beats connecting
    /// in a way the broker then rejects.
    fn check_unsupported(&self, provider: SecurityProvider) -> Result<(), ConfigError> {
        // Values read are never empty, so a key that is set is in use.
        let is_true = |key: &str| self.option(key).and_then(str_to_bool) == Some(true);
        if self.option(KEY_NATS_CREDS).is_some() {
            return Err(self.err(KEY_NATS_CREDS, "NATS credentials files are not supported"));
        }
        if is_true(KEY_CLIENT_ANON_TLS) {
            return Err(self.err(
                KEY_CLIENT_ANON_TLS,
                "anonymous client TLS needs a remote request signer, which is not supported",
            ));
        }
        let remote_signer = if self.option(KEY_SIGNER_URL).is_some() {
            Some(KEY_SIGNER_URL)
        } else if is_true(KEY_SIGNER_SERVICE) {
            Some(KEY_SIGNER_SERVICE)
        } else {
            None
        };
        if let Some(key) = remote_signer {
            return Err(self.err(key, "remote request signers (aaasvc) are not supported"));
        }
        if provider == SecurityProvider::Choria {
            if let Some(key) = [KEY_SIGNER_TOKEN, KEY_SIGNER_SEED]
                .into_iter()
                .find(|k| self.option(k).is_some())
            {
                return Err(self.err(key, "can not be used with the choria security provider"));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choria::security::tokens::{ClientIdClaims, TokenSigningKey};
    use std::time::Duration;

    const NOW: i64 = 1_750_000_000;

    fn env() -> Environment {
        Environment {
            user: Some("choria".into()),
            certname: None,
            is_root: true,
            home: None,
            hostname: Some("host.example.net".into()),
            now_unix: NOW,
        }
    }

    fn parse(text: &str) -> ChoriaClientConfig {
        ChoriaClientConfig::parse(text, "choria.cfg", &env()).unwrap()
    }

    /// The error `client_setup_for(false, None, …)` gives for `text`.
    fn setup_err(text: &str) -> String {
        parse(text)
            .client_setup_for(false, None, &env())
            .unwrap_err()
            .to_string()
    }

    /// The error `caller_id(false, …)` gives for `text`.
    fn caller_err(text: &str) -> String {
        parse(text)
            .caller_id(false, &env())
            .unwrap_err()
            .to_string()
    }

    fn warnings(c: &ChoriaClientConfig) -> Vec<String> {
        c.warnings.iter().map(|w| w.to_string()).collect()
    }

    fn write(dir: &Path, name: &str, data: impl AsRef<[u8]>) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn line_format() {
        let c = parse(
            "# comment\n\n   identity   =   prov.example.net  \r\n\
             plugin.choria.middleware_hosts=nats://a:4222, b:4222 ,\n\
             loglevel = debug # not a comment\n\
             a b = c=d\n\
             =novalue\n\
             empty =\n\
             ; not a comment either\n\
             identity = later.example.net\n",
        );
        assert_eq!(c.identity, "later.example.net");
        assert_eq!(c.middleware_hosts, ["nats://a:4222", "b:4222"]);
        assert_eq!(c.option("loglevel"), Some("debug # not a comment"));
        assert_eq!(c.option("a b"), Some("c=d"));
        assert_eq!(c.option("empty"), None);
        assert_eq!(c.option("=novalue"), None);
        assert_eq!(
            warnings(&c),
            [
                "choria.cfg:7: =novalue: not a `key = value` line with a value, ignored",
                "choria.cfg:8: empty =: not a `key = value` line with a value, ignored",
                "choria.cfg:9: ; not a comment either: not a `key = value` line with a value, ignored",
            ]
        );
    }

    #[test]
    fn inline_comment_warning_on_used_keys() {
        let c = parse("identity = a.example.net # the provisioner\n");
        assert_eq!(c.identity, "a.example.net # the provisioner");
        assert_eq!(
            warnings(&c),
            ["choria.cfg:1: identity: the value contains ' #': comments must be on their own line, so it is part of the value"]
        );
    }

    #[test]
    fn booleans_and_defaults() {
        let c = parse("");
        assert!(c.use_srv);
        assert_eq!(c.identity, "host.example.net");
        assert_eq!(c.security_provider, None);
        for (v, want) in [
            ("1", true),
            ("0", false),
            ("yes", true),
            ("T", true),
            ("n", false),
            ("FALSE", false),
        ] {
            let c = parse(&format!("plugin.choria.use_srv = {v}\n"));
            assert_eq!(c.use_srv, want, "{v}");
            assert!(c.warnings.is_empty());
        }
        let c = parse("plugin.choria.use_srv = nope\n");
        assert!(!c.use_srv);
        assert!(warnings(&c)[0]
            .starts_with("choria.cfg:1: plugin.choria.use_srv: \"nope\" is not a boolean"));
        let e = ChoriaClientConfig::parse(
            "",
            "choria.cfg",
            &Environment {
                hostname: None,
                ..env()
            },
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "choria.cfg: identity: not set and the host name could not be determined; set identity"
        );
    }

    #[test]
    fn home_expansion() {
        let e = Environment {
            home: Some("/home/prov".into()),
            ..env()
        };
        let c = ChoriaClientConfig::parse(
            "plugin.security.file.key = ~/.ssl/key.pem\nplugin.security.file.ca = /etc/ca.pem\n",
            "choria.cfg",
            &e,
        )
        .unwrap();
        assert_eq!(
            c.file_key.as_deref(),
            Some(Path::new("/home/prov/.ssl/key.pem"))
        );
        assert_eq!(c.file_ca.as_deref(), Some(Path::new("/etc/ca.pem")));
    }

    #[test]
    fn plugin_d_choria_cfg_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(
            dir.path(),
            "choria.cfg",
            "identity = p.example.net\nplugin.choria.middleware_hosts = a:4222\n",
        );
        std::fs::create_dir(dir.path().join("plugin.d")).unwrap();
        write(
            &dir.path().join("plugin.d"),
            "choria.cfg",
            "middleware_hosts = b:4222\nuse_srv = false\n",
        );
        let c = ChoriaClientConfig::load_with(&main, &env()).unwrap();
        assert_eq!(c.middleware_hosts, ["b:4222"]);
        assert!(!c.use_srv);
        assert_eq!(c.files.len(), 2);
        // go-choria skips plugin.d for files under the home directory.
        let e = Environment {
            home: Some(dir.path().to_path_buf()),
            ..env()
        };
        let c = ChoriaClientConfig::load_with(&main, &e).unwrap();
        assert_eq!(c.middleware_hosts, ["a:4222"]);
        let e = ChoriaClientConfig::load_with(dir.path().join("missing.cfg"), &env())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing.cfg: could not read the configuration file"),
            "{e}"
        );
    }

    #[test]
    fn security_provider_and_protocol() {
        let e = parse("").security_provider(false).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "choria.cfg: plugin.security.provider: not set, so go-choria would use puppet"
            ),
            "{e}"
        );
        assert_eq!(
            parse("").security_provider(true).unwrap(),
            SecurityProvider::File
        );
        let c = parse("plugin.security.provider = file\n");
        assert_eq!(c.protocol_version(false).unwrap(), Version::V1);
        let c = parse("plugin.security.provider = choria\n");
        assert_eq!(c.protocol_version(false).unwrap(), Version::V2);
        // choria_insecure forces file, hence v1.
        assert_eq!(c.protocol_version(true).unwrap(), Version::V1);
        let e = parse("\nplugin.security.provider = puppet\n")
            .security_provider(false)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "choria.cfg:2: plugin.security.provider: puppet is not supported by this provisioner; use file (x509 certificates) or choria (ed25519 JWT)"
        );
        let e = parse("plugin.security.provider = File\n")
            .security_provider(false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"File\" is not a security provider"), "{e}");
    }

    #[test]
    fn certname_and_v1_caller() {
        let c = parse("identity = prov.example.net\n");
        assert_eq!(c.certname(&env()), "prov.example.net");
        assert_eq!(
            c.caller_id(true, &env()).unwrap(),
            "choria=prov.example.net"
        );
        let user = Environment {
            is_root: false,
            ..env()
        };
        assert_eq!(c.certname(&user), "choria.mcollective");
        let no_user = Environment {
            is_root: false,
            user: None,
            ..env()
        };
        assert_eq!(c.certname(&no_user), "prov.example.net");
        let forced = Environment {
            certname: Some("provisioner.mcollective".into()),
            is_root: false,
            ..env()
        };
        assert_eq!(c.certname(&forced), "provisioner.mcollective");
        assert_eq!(
            c.caller_id(true, &forced).unwrap(),
            "choria=provisioner.mcollective"
        );
    }

    #[test]
    fn middleware_servers() {
        let c = parse(
            "plugin.choria.middleware_hosts = b1.example.net:4222, nats://b2:4222,tls://b3:4223, [::1]:4222, wss://b4:443/\n",
        );
        assert_eq!(
            c.middleware_servers().unwrap(),
            [
                "nats://b1.example.net:4222",
                "nats://b2:4222",
                "tls://b3:4223",
                "nats://[::1]:4222",
                "wss://b4:443"
            ]
        );
        let e = parse("").middleware_servers().unwrap_err().to_string();
        assert_eq!(
            e,
            "choria.cfg: plugin.choria.middleware_hosts: not set; SRV lookups are not supported, list the brokers as host:port or nats://host:port"
        );
        let e = parse("plugin.choria.srv_domain = example.net\n")
            .middleware_servers()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SRV lookups (in example.net) are not supported"),
            "{e}"
        );
        let e = parse("plugin.choria.use_srv = false\n")
            .middleware_servers()
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("not set; list the brokers as host:port or nats://host:port"),
            "{e}"
        );
        for (bad, why) in [
            ("broker.example.net", "no port"),
            ("b:http", "not a port number"),
            ("b:70000", "not a port number"),
            ("http://b:80", "unsupported scheme"),
            (":4222", "not a host name"),
        ] {
            let e = parse(&format!("\n\nplugin.choria.middleware_hosts = {bad}\n"))
                .middleware_servers()
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "choria.cfg:3: plugin.choria.middleware_hosts: {bad:?}: "
                )) && e.contains(why),
                "{e}"
            );
        }
    }

    /// The insecure client configuration of the protocol notes (§12.5).
    #[test]
    fn insecure_setup() {
        let c = parse(
            "plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n\
             plugin.choria.use_srv = false\n\
             identity = provisioner.example.net\n\
             loglevel = debug\n",
        );
        let s = c.client_setup_for(true, None, &env()).unwrap();
        assert_eq!(s.version, Version::V1);
        assert!(matches!(s.identity.signer, RequestSigner::V1Insecure));
        assert_eq!(s.identity.identity, "provisioner.example.net");
        assert_eq!(s.identity.caller, "choria=provisioner.example.net");
        assert_eq!(s.connect.servers, ["nats://127.0.0.1:4222"]);
        assert!(!s.connect.tls.required && !s.connect.tls.is_custom());
        assert_eq!(
            s.connect.inbox_prefix.as_deref(),
            Some("provisioning.reply")
        );
        assert!(
            s.connect.user.is_none() && s.connect.token.is_none() && s.connect.nats_jwt.is_none()
        );
        assert_eq!(s.collective, "provisioning");

        let pw = Secret::new("s3cret");
        let s = c.client_setup_for(true, Some(&pw), &env()).unwrap();
        assert_eq!(
            s.connect.user,
            Some(("provisioner".to_string(), "s3cret".to_string()))
        );
        assert!(!format!("{s:?}").contains("s3cret"));

        // plugin.nats.user/pass are used when there is no provisioning password.
        let c2 = parse(
            "plugin.choria.middleware_hosts = a:4222\nplugin.nats.user = u\nplugin.nats.pass = hunter2\n",
        );
        let s = c2.client_setup_for(true, None, &env()).unwrap();
        assert_eq!(
            s.connect.user,
            Some(("u".to_string(), "hunter2".to_string()))
        );
        assert!(!format!("{c2:?}").contains("hunter2"));
        let s = c2.client_setup_for(true, Some(&pw), &env()).unwrap();
        assert_eq!(s.connect.user.unwrap().0, "provisioner");
    }

    #[test]
    fn file_provider_setup() {
        let dir = tempfile::tempdir().unwrap();
        let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 1024).unwrap();
        let key_pem = crate::choria::security::private_key_pkcs1_pem(&key).unwrap();
        let key_path = write(dir.path(), "key.pem", key_pem);
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let cert_path = write(dir.path(), "cert.pem", cert);
        let ca_path = write(dir.path(), "ca.pem", cert);
        let text = format!(
            "identity = provisioner.mcollective\n\
             plugin.choria.middleware_hosts = tls://broker:4222\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {}\n\
             plugin.security.file.key = {}\n\
             plugin.security.file.ca = {}\n",
            cert_path.display(),
            key_path.display(),
            ca_path.display()
        );
        let c = parse(&text);
        let s = c.client_setup_for(false, None, &env()).unwrap();
        assert_eq!(s.version, Version::V1);
        assert_eq!(s.identity.caller, "choria=provisioner.mcollective");
        match &s.identity.signer {
            RequestSigner::V1Rsa { key: k, cert_pem } => {
                assert_eq!(**k, key);
                assert_eq!(cert_pem, cert);
            }
            other => panic!("{other:?}"),
        }
        assert!(s.connect.tls.required && !s.connect.tls.insecure_skip_verify);
        assert_eq!(s.connect.tls.ca_file.as_deref(), Some(ca_path.as_path()));
        assert_eq!(
            s.connect.tls.client_cert,
            Some((cert_path.clone(), key_path.clone()))
        );
        assert_eq!(
            s.connect.inbox_prefix.as_deref(),
            Some("provisioning.reply")
        );
        assert_eq!(s.connect.name, "provisioner.mcollective");

        // PKCS#8 keys work too.
        use rsa::pkcs8::EncodePrivateKey;
        let p8 = key.to_pkcs8_pem(Default::default()).unwrap();
        write(dir.path(), "key.pem", p8.as_bytes());
        c.client_setup_for(false, None, &env()).unwrap();

        // Missing and broken files are named with key and path.
        let missing = dir.path().join("missing.pem");
        let c = parse(&text.replace(
            &ca_path.display().to_string(),
            &missing.display().to_string(),
        ));
        let e = c
            .client_setup_for(false, None, &env())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "choria.cfg:6: plugin.security.file.ca: {}: ",
                missing.display()
            )),
            "{e}"
        );
        write(dir.path(), "key.pem", "garbage");
        let e = setup_err(&text);
        assert!(
            e.starts_with("choria.cfg:5: plugin.security.file.key: ")
                && e.contains("holds no PEM private key"),
            "{e}"
        );
        let e =
            setup_err("plugin.security.provider = file\nplugin.choria.middleware_hosts = a:1\n");
        assert_eq!(
            e,
            "choria.cfg: plugin.security.file.certificate: not set; it is required by this security provider"
        );
    }

    struct V2Files {
        _dir: tempfile::TempDir,
        dir: PathBuf,
        seed: crate::choria::security::Ed25519KeyPair,
    }

    fn v2_files(purpose_client: bool, exp_offset: i64) -> V2Files {
        let dir = tempfile::tempdir().unwrap();
        let issuer = crate::choria::security::generate_keypair();
        let seed = crate::choria::security::generate_keypair();
        let claims = if purpose_client {
            let mut c = ClientIdClaims::new_at(
                NOW + exp_offset - 3600,
                "up=provisioner_signer",
                Some(&seed.public_hex()),
                "issuer",
                Duration::from_secs(3600),
            )
            .unwrap();
            c.standard.public_key = seed.public_hex();
            serde_json::to_value(c).unwrap()
        } else {
            serde_json::json!({"purpose": "choria_provisioning", "exp": NOW + 3600})
        };
        let jwt = TokenSigningKey::Ed25519(issuer.signing_key().clone())
            .sign(&claims)
            .unwrap();
        write(dir.path(), "signer.jwt", format!("{jwt}\n"));
        write(dir.path(), "signer.key", seed.seed_hex());
        V2Files {
            dir: dir.path().to_path_buf(),
            _dir: dir,
            seed,
        }
    }

    fn v2_text(f: &V2Files, extra: &str) -> String {
        format!(
            "plugin.security.provider = choria\n\
             plugin.security.choria.token_file = {}\n\
             identity = provisioner_signer\n\
             plugin.choria.middleware_hosts = broker:4222\n{extra}",
            f.dir.join("signer.jwt").display()
        )
    }

    #[test]
    fn choria_provider_setup() {
        let f = v2_files(true, 3600);
        let c = parse(&v2_text(&f, ""));
        assert_eq!(c.caller_id(false, &env()).unwrap(), "up=provisioner_signer");
        assert_eq!(c.seed_file().unwrap(), f.dir.join("signer.key"));
        let s = c
            .client_setup_for(false, Some(&Secret::new("pw")), &env())
            .unwrap();
        assert_eq!(s.version, Version::V2);
        assert_eq!(s.identity.identity, "provisioner_signer");
        assert_eq!(s.identity.caller, "up=provisioner_signer");
        let jwt = std::fs::read_to_string(f.dir.join("signer.jwt")).unwrap();
        match &s.identity.signer {
            RequestSigner::V2 { seed, jwt: j } => {
                assert_eq!(seed.to_bytes(), f.seed.signing_key().to_bytes());
                assert_eq!(j, jwt.trim());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s.connect.token.as_deref(), Some(jwt.trim()));
        let (nj, nk) = s.connect.nats_jwt.as_ref().unwrap();
        assert_eq!(nj, jwt.trim());
        assert_eq!(nk.to_bytes(), f.seed.signing_key().to_bytes());
        assert_eq!(
            s.connect.inbox_prefix.as_deref(),
            Some(
                format!(
                    "provisioning.reply.{}",
                    subjects::caller_hash("up=provisioner_signer")
                )
                .as_str()
            )
        );
        assert_eq!(s.connect.user, Some(("provisioner".into(), "pw".into())));
        // No CA: TLS without verification, as go-choria does, with a warning.
        assert!(s.connect.tls.required && s.connect.tls.insecure_skip_verify);
        assert_eq!(s.warnings.len(), 1);
        assert!(s.warnings[0]
            .to_string()
            .contains("plugin.security.choria.ca: not set"));

        // With a CA and mTLS files.
        let ca = write(&f.dir, "ca.pem", "x");
        let c = parse(&v2_text(
            &f,
            &format!(
                "plugin.security.choria.ca = {}\nplugin.security.choria.certificate = {}\nplugin.security.choria.key = {}\n",
                ca.display(),
                ca.display(),
                ca.display()
            ),
        ));
        let s = c.client_setup_for(false, None, &env()).unwrap();
        assert!(!s.connect.tls.insecure_skip_verify);
        assert_eq!(s.connect.tls.ca_file.as_deref(), Some(ca.as_path()));
        assert!(s.connect.tls.client_cert.is_some());
        assert!(s.warnings.is_empty());
        let e = setup_err(&v2_text(
            &f,
            "plugin.security.choria.ca = /nonexistent/ca.pem\n",
        ));
        assert!(
            e.starts_with("choria.cfg:5: plugin.security.choria.ca: /nonexistent/ca.pem: "),
            "{e}"
        );
        let e = setup_err(&v2_text(
            &f,
            &format!("plugin.security.choria.certificate = {}\n", ca.display()),
        ));
        assert!(
            e.contains(
                "plugin.security.choria.certificate: set without plugin.security.choria.key"
            ),
            "{e}"
        );

        // An explicit seed file, and a seed that does not match the token.
        let other = crate::choria::security::generate_keypair();
        let other_path = write(&f.dir, "other.seed", other.seed_hex());
        let e = setup_err(&v2_text(
            &f,
            &format!(
                "plugin.security.choria.seed_file = {}\n",
                other_path.display()
            ),
        ));
        assert!(
            e.starts_with("choria.cfg:5: plugin.security.choria.seed_file: ")
                && e.contains("does not belong to the token"),
            "{e}"
        );
        let bad = write(&f.dir, "bad.seed", "not hex");
        let e = setup_err(&v2_text(
            &f,
            &format!("plugin.security.choria.seed_file = {}\n", bad.display()),
        ));
        assert!(
            e.contains("is not an ed25519 seed") && !e.contains("not hex\""),
            "{e}"
        );
        std::fs::remove_file(f.dir.join("signer.key")).unwrap();
        let e = c.seed_file().unwrap_err().to_string();
        assert!(
            e.contains("plugin.security.choria.seed_file: not set, and the default")
                && e.contains("signer.key"),
            "{e}"
        );
    }

    #[test]
    fn choria_token_problems() {
        let expired = v2_files(true, -60);
        let e = caller_err(&v2_text(&expired, ""));
        assert!(
            e.starts_with("choria.cfg:2: plugin.security.choria.token_file: ")
                && e.contains("the token expired at"),
            "{e}"
        );

        let prov = v2_files(false, 0);
        let e = caller_err(&v2_text(&prov, ""));
        assert!(
            e.contains("is a \"choria_provisioning\" token, not a client token"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let junk = write(dir.path(), "junk.jwt", "junk");
        let e = caller_err(&format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {}\n",
            junk.display()
        ));
        assert!(e.contains("not a JWT"), "{e}");
        let e = caller_err("plugin.security.provider = choria\n");
        assert_eq!(
            e,
            "choria.cfg: plugin.security.choria.token_file: not set; it is required by this security provider"
        );
    }

    #[test]
    fn unsupported_features_are_errors() {
        let base = "plugin.choria.middleware_hosts = a:4222\n";
        let e = |extra: &str, insecure: bool| {
            parse(&format!("{base}{extra}"))
                .client_setup_for(insecure, None, &env())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e("plugin.nats.credentials = /x.creds\n", true),
            "choria.cfg:2: plugin.nats.credentials: NATS credentials files are not supported"
        );
        assert!(e("plugin.security.client_anon_tls = true\n", true)
            .starts_with("choria.cfg:2: plugin.security.client_anon_tls: "));
        assert!(e(
            "plugin.choria.security.request_signer.url = https://aaa\n",
            true
        )
        .contains("remote request signers (aaasvc) are not supported"));
        assert!(e(
            "plugin.choria.security.request_signer.service = yes\n",
            true
        )
        .contains("request_signer.service: remote request signers"));
        let f = v2_files(true, 3600);
        let e = setup_err(&v2_text(
            &f,
            "plugin.choria.security.request_signer.token_file = /t\n",
        ));
        assert!(
            e.contains(
                "request_signer.token_file: can not be used with the choria security provider"
            ),
            "{e}"
        );
    }

    #[test]
    fn from_process_environment() {
        let e = Environment::from_process();
        assert!(e.now_unix > 1_600_000_000);
        assert!(e.hostname.is_some());
    }
}
