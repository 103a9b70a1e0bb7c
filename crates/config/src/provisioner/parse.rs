//! Reading `provisioner.yaml` into [`ProvisionerConfig`]: one helper per
//! group of settings, each applying Go's default and check and ours (the
//! nested sections' in `sections`), in the order `parse` calls them.

use super::*;
use crate::ca::KeyRef;
use crate::day_two::{Lifetime, RecordsConfig, RenewalConfig};
use crate::schema::ProvisionerFile;
use crate::yaml::Node;
use choria_wire::security::csr::{compile_deny_list, compile_whole_name, DEFAULT_CERT_DENY_LIST};

mod sections;
use sections::{cert_manager, configuration_template, features};

impl ProvisionerConfig {
    /// Parses and validates YAML text without touching the file system; `file`
    /// is only used in messages. Settings are read in the file's order of
    /// concerns: the first error wins and the warnings come out in this
    /// order, so the order is behaviour.
    pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let file = file.as_ref();
        let mut warnings = Vec::new();
        let sec = document(text, file, &mut warnings)?;
        let w = &mut warnings;

        let workers = workers(&sec)?;
        let (interval_text, interval) = interval(&sec)?;
        let (logfile, loglevel) = logging(&sec, w)?;
        let configuration_template = configuration_template(file, &sec, w)?;
        let helper = helper(&sec, configuration_template.is_some())?;
        let creds = credentials(&sec, w)?;
        let lifecycle_component = lifecycle_component(&sec)?;
        let monitor_port = monitor_port(&sec, w)?;
        let broker_port = broker_port(&sec, w)?;
        let trust = trust(&sec)?;
        let rego_policy = non_empty(sec.string("rego_policy")?);
        let leader_election = sec.bool("leader_election")?.unwrap_or(false);
        let upgrades = upgrades(&sec)?;
        let features = features(file, &sec, w)?;
        let (cert_manager, ca, lifetime) = signers(file, &sec, w, &features, &helper, &trust)?;
        check_upgrades(&sec, w, &features, &upgrades);
        let timeouts = timeouts(&sec, w)?;
        let reply_window = window(&sec, "reply_window", DEFAULT_REPLY_WINDOW)?;
        let csr_allowed_dns_names = csr_allowed_dns_names(&sec)?;
        let (records, renewal) = day_two(file, &sec, &creds, lifetime, w)?;
        let admission = crate::admission::admission(file, &sec, rego_policy.as_deref(), w)?;
        let audit = crate::audit::audit(file, &sec, records.is_some(), w)?;
        let evidence = crate::evidence::evidence(file, &sec, records.is_some(), w)?;
        let election = election(file, &sec, leader_election, w)?;
        let telemetry = crate::telemetry::telemetry(file, &sec, w)?;

        Ok(ProvisionerConfig {
            file: file.to_path_buf(),
            workers,
            interval,
            interval_text,
            logfile,
            loglevel,
            helper,
            token: creds.token,
            token_file: creds.token_file,
            broker_provisioning_password_file: creds.password_file,
            lifecycle_component,
            choria_insecure: sec.bool("choria_insecure")?.unwrap_or(false),
            site: sec.string("site")?.unwrap_or_default(),
            monitor_port,
            broker_port,
            broker_provisioning_password: creds.password,
            cert_deny_list: trust.cert_deny_list,
            jwt_verify_cert: trust.jwt_verify_cert,
            jwt_signing_key: trust.jwt_signing_key,
            jwt_signing_token: trust.jwt_signing_token,
            server_jwt_validity: trust.server_jwt_validity,
            rego_policy,
            leader_election,
            upgrades_repository: upgrades.repository,
            upgrades_optional: upgrades.optional,
            features,
            election,
            discovery_timeout: timeouts.discovery_timeout,
            discovery_window: timeouts.discovery_window,
            helper_timeout: timeouts.helper_timeout,
            rpc_timeout: timeouts.rpc_timeout,
            reply_window,
            request_batch_window: timeouts.request_batch_window,
            csr_allowed_dns_names,
            configuration_template,
            cert_manager,
            ca,
            records,
            renewal,
            admission,
            audit,
            evidence,
            telemetry,
            warnings,
        })
    }
}

/// The file's top level, as YAML that is a mapping of settings.
fn document<'a>(
    text: &str,
    file: &'a Path,
    w: &mut Vec<ConfigWarning>,
) -> Result<Section<'a>, ConfigError> {
    let root = Node::parse(text).map_err(|message| ConfigError::Syntax {
        file: file.to_path_buf(),
        message: format!("not valid YAML: {message}"),
    })?;
    Section::new(file, "", root, ProvisionerFile::KEYS, w)
}

/// `workers`: Go's `runtime.NumCPU()` for 0 or unset.
fn workers(sec: &Section) -> Result<usize, ConfigError> {
    match sec.int("workers")? {
        None | Some(0) => Ok(default_workers()),
        Some(n) if n < 0 => Err(sec.error(
            "workers",
            format!("{n} is negative; use a positive number or 0 for one per CPU"),
        )),
        Some(n) => usize::try_from(n).map_err(|_| sec.error("workers", "too large")),
    }
}

/// `interval` as written and parsed: at least 1m.
fn interval(sec: &Section) -> Result<(String, Duration), ConfigError> {
    match sec.duration("interval")? {
        None => Ok(("1m".to_string(), DEFAULT_INTERVAL)),
        Some((raw, _)) if raw.trim().is_empty() => Err(sec.error(
            "interval",
            "is empty; use a duration of at least 1m, such as 10m or 1h",
        )),
        Some((raw, d)) if d < MIN_INTERVAL => Err(sec.error(
            "interval",
            format!("{raw} is below the minimum of 1m; use for example 10m or 1h"),
        )),
        Some((raw, d)) => Ok((raw, d)),
    }
}

/// `logfile` and `loglevel`; an unknown level logs at warn, as in Go.
fn logging(
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<(Option<String>, Option<String>), ConfigError> {
    let logfile = non_empty(sec.string("logfile")?);
    let loglevel = non_empty(sec.string("loglevel")?);
    if let Some(l) = &loglevel {
        if LogLevel::from_go(l).is_none() {
            w.push(sec.warning(
                "loglevel",
                format!(
                    "{l:?} is not one of debug, info, warn, error, fatal; logging at warn as the Go provisioner does"
                ),
            ));
        }
    }
    Ok((logfile, loglevel))
}

/// `helper`: required unless a `configuration_template` configures the
/// nodes, and it must split like a shell command line.
fn helper(sec: &Section, templated: bool) -> Result<String, ConfigError> {
    let helper = sec.string("helper")?.unwrap_or_default();
    match crate::split_command_line(&helper) {
        Err(e) => Err(sec.error("helper", format!("{helper:?}: {e}"))),
        Ok(words) if words.is_empty() && templated => Ok(String::new()),
        Ok(words) if words.is_empty() => Err(sec.error(
            "helper",
            "required: the command that decides each node's configuration (or a configuration_template)",
        )),
        Ok(_) => Ok(helper),
    }
}

struct Credentials {
    token: Secret,
    token_file: Option<PathBuf>,
    password: Option<Secret>,
    password_file: Option<PathBuf>,
}

/// `token`/`token_file` and `broker_provisioning_password`/`…_file`: each
/// given at most one way.
fn credentials(sec: &Section, w: &mut Vec<ConfigWarning>) -> Result<Credentials, ConfigError> {
    let token = Secret::new(sec.string("token")?.unwrap_or_default());
    let token_file = non_empty(sec.string("token_file")?).map(PathBuf::from);
    if !token.is_empty() && token_file.is_some() {
        return Err(sec.error("token_file", "set together with token; use one of them"));
    }
    if token.is_empty() && token_file.is_none() {
        w.push(sec.warning(
            "token",
            "not set; requests carry an empty token, which only servers whose provisioning.jwt has no token accept",
        ));
    }
    let password = non_empty(sec.string("broker_provisioning_password")?).map(Secret::new);
    let password_file =
        non_empty(sec.string("broker_provisioning_password_file")?).map(PathBuf::from);
    if password.is_some() && password_file.is_some() {
        return Err(sec.error(
            "broker_provisioning_password_file",
            "set together with broker_provisioning_password; use one of them",
        ));
    }
    Ok(Credentials {
        token,
        token_file,
        password,
        password_file,
    })
}

/// `lifecycle_component`: it goes into a subject, so no `.`, `*`, `>` or space.
fn lifecycle_component(sec: &Section) -> Result<String, ConfigError> {
    let component = non_empty(sec.string("lifecycle_component")?)
        .unwrap_or_else(|| DEFAULT_LIFECYCLE_COMPONENT.to_string());
    if component.contains(['.', '*', '>']) || component.chars().any(char::is_whitespace) {
        return Err(sec.error(
            "lifecycle_component",
            format!("{component:?} is not valid: it must not contain '.', '*', '>' or spaces"),
        ));
    }
    Ok(component)
}

/// `monitor_port`: only ports above 0 listen, as in Go.
fn monitor_port(sec: &Section, w: &mut Vec<ConfigWarning>) -> Result<Option<u16>, ConfigError> {
    match sec.int("monitor_port")? {
        None | Some(0) => Ok(None),
        Some(p) if p < 0 => {
            w.push(sec.warning(
                "monitor_port",
                format!("{p} is negative; the metrics listener is disabled"),
            ));
            Ok(None)
        }
        Some(p) => u16::try_from(p)
            .map(Some)
            .map_err(|_| sec.error("monitor_port", format!("{p} is not a port (1-65535)"))),
    }
}

/// `broker_port`: read as Go reads it, and ignored as Go ignores it.
fn broker_port(sec: &Section, w: &mut Vec<ConfigWarning>) -> Result<Option<i64>, ConfigError> {
    let broker_port = sec.int("broker_port")?;
    if broker_port.is_some() {
        w.push(ignored(sec, "broker_port"));
    }
    Ok(broker_port)
}

/// `election:`, or the Go provisioner's `leader_election` when it is absent.
fn election(
    file: &Path,
    sec: &Section,
    leader_election: bool,
    w: &mut Vec<ConfigWarning>,
) -> Result<ElectionConfig, ConfigError> {
    ElectionConfig::resolve(
        file,
        sec.node("election").cloned(),
        leader_election,
        &sec.key("leader_election"),
        w,
    )
}

/// A key Go accepts and ignores.
fn ignored(sec: &Section, key: &str) -> ConfigWarning {
    sec.warning(
        key,
        "accepted for compatibility but not used (the Go provisioner ignores it too)",
    )
}

/// The settings that decide what is trusted and what is issued.
struct Trust {
    cert_deny_list: Vec<String>,
    jwt_verify_cert: Option<String>,
    jwt_signing_key: Option<KeyRef>,
    jwt_signing_token: Option<PathBuf>,
    server_jwt_validity: Duration,
}

/// `cert_deny_list`, the `jwt_*` keys and `server_jwt_validity`.
fn trust(sec: &Section) -> Result<Trust, ConfigError> {
    Ok(Trust {
        cert_deny_list: deny_list(sec)?,
        jwt_verify_cert: non_empty(sec.string("jwt_verify_cert")?),
        jwt_signing_key: non_empty(sec.string("jwt_signing_key")?).map(|k| KeyRef::parse(&k)),
        jwt_signing_token: non_empty(sec.string("jwt_signing_token")?).map(PathBuf::from),
        server_jwt_validity: server_jwt_validity(sec)?,
    })
}

/// `cert_deny_list`: Go's list when unset or empty; every pattern compiles.
fn deny_list(sec: &Section) -> Result<Vec<String>, ConfigError> {
    let list = match sec.string_list("cert_deny_list")? {
        Some(list) if !list.is_empty() => list,
        _ => DEFAULT_CERT_DENY_LIST
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    for (i, pattern) in list.iter().enumerate() {
        if let Err(e) = compile_deny_list(std::slice::from_ref(pattern)) {
            return Err(sec.item_error("cert_deny_list", i, e.to_string()));
        }
    }
    Ok(list)
}

/// `server_jwt_validity`: 1y when unset or empty; zero is refused.
fn server_jwt_validity(sec: &Section) -> Result<Duration, ConfigError> {
    match sec.duration("server_jwt_validity")? {
        None => Ok(DEFAULT_SERVER_JWT_VALIDITY),
        Some((raw, _)) if raw.is_empty() => Ok(DEFAULT_SERVER_JWT_VALIDITY),
        Some((raw, d)) if d.is_zero() => Err(sec.error(
            "server_jwt_validity",
            format!("{raw:?} is zero; use a duration such as 1y or 90d"),
        )),
        Some((_, d)) => Ok(d),
    }
}

struct Upgrades {
    repository: Option<String>,
    optional: bool,
}

/// `upgrades_repository` and `upgrades_optional`.
fn upgrades(sec: &Section) -> Result<Upgrades, ConfigError> {
    Ok(Upgrades {
        repository: non_empty(sec.string("upgrades_repository")?),
        optional: sec.bool("upgrades_optional")?.unwrap_or(false),
    })
}

/// `cert_manager`, `ca`, and the shortest lifetime of what is issued.
type SignerSettings = (
    Option<CertManagerConfig>,
    Option<crate::ca::CaConfig>,
    Option<Lifetime>,
);

/// `cert_manager:` and `ca:`, checked against the features and the
/// helper, and the shortest lifetime of what is issued.
fn signers(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
    features: &Features,
    helper: &str,
    trust: &Trust,
) -> Result<SignerSettings, ConfigError> {
    let cert_manager = cert_manager(file, sec, w)?;
    let ca = crate::ca::ca(file, sec, w)?;
    let signers = Signers {
        helper,
        cert_manager: cert_manager.as_ref(),
        ca: ca.as_ref(),
    };
    check_signers(sec, w, features, &signers, trust)?;
    let lifetime = shortest_lifetime(features, trust.server_jwt_validity, &signers);
    Ok((cert_manager, ca, lifetime))
}

/// Who may sign the nodes' certificates: the helper (its command line,
/// empty when there is none), cert-manager, the built-in CA.
struct Signers<'a> {
    helper: &'a str,
    cert_manager: Option<&'a CertManagerConfig>,
    ca: Option<&'a crate::ca::CaConfig>,
}

impl Signers<'_> {
    /// The lifetime of the certificates we sign, when we know it (a
    /// helper's certificates are its own business).
    fn certificate_lifetime(&self) -> Option<Lifetime> {
        let cert_manager = self
            .cert_manager
            .and_then(|c| c.duration)
            .map(|d| Lifetime {
                setting: "cert_manager.duration",
                lifetime: d,
            });
        let ca = self.ca.map(|c| Lifetime {
            setting: "ca.validity",
            lifetime: c.validity,
        });
        cert_manager.or(ca)
    }
}

/// What the enabled features need to work at all: someone to sign the
/// nodes' certificates (`pki`), a key to verify their JWTs (`jwt`), a key to
/// sign theirs (`ed25519`). A signer with nothing to sign is a warning; two
/// signers of ours are one too many.
fn check_signers(
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
    features: &Features,
    signers: &Signers,
    trust: &Trust,
) -> Result<(), ConfigError> {
    if signers.cert_manager.is_some() && signers.ca.is_some() {
        return Err(sec.error(
            "ca",
            "set together with cert_manager: choose one signer for the nodes' certificates",
        ));
    }
    for (key, set) in [
        ("cert_manager", signers.cert_manager.is_some()),
        ("ca", signers.ca.is_some()),
    ] {
        if set && !features.pki {
            w.push(sec.warning(
                key,
                "set while features.pki is off: no CSR is fetched, so nothing is signed",
            ));
        }
    }
    if features.pki
        && signers.helper.is_empty()
        && signers.cert_manager.is_none()
        && signers.ca.is_none()
    {
        return Err(sec.error(
            "helper",
            "required with features.pki unless cert_manager or ca is set: something has to sign the nodes' certificates (configuration_template only configures them)",
        ));
    }
    if features.jwt && trust.jwt_verify_cert.is_none() {
        return Err(sec.error(
            "jwt_verify_cert",
            format!(
                "required when {} is enabled: the file or hex ed25519 public key that verifies the nodes' provisioning.jwt",
                if features.ed25519 { "features.ed25519" } else { "features.jwt" }
            ),
        ));
    }
    if features.ed25519 && trust.jwt_signing_key.is_none() {
        return Err(sec.error(
            "jwt_signing_key",
            "required when features.ed25519 is enabled: the ed25519 seed file, or pkcs11: URI, that signs server JWTs",
        ));
    }
    Ok(())
}

/// `features.upgrades` without a repository fails each node whose helper
/// asks for an upgrade, unless upgrades are optional: a warning.
fn check_upgrades(
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
    features: &Features,
    upgrades: &Upgrades,
) {
    if features.upgrades && upgrades.repository.is_none() && !upgrades.optional {
        w.push(sec.warning(
            "upgrades_repository",
            "not set while features.upgrades is enabled; nodes whose helper asks for an upgrade will fail (set it, or upgrades_optional: true)",
        ));
    }
}

struct Timeouts {
    discovery_timeout: Duration,
    discovery_window: Duration,
    helper_timeout: Duration,
    rpc_timeout: Option<Duration>,
    request_batch_window: Duration,
}

/// Our timeouts (Go fixes them): positive when set; and how long requests
/// gather into one signed message (zero: not at all).
fn timeouts(sec: &Section, w: &mut Vec<ConfigWarning>) -> Result<Timeouts, ConfigError> {
    let discovery_timeout = positive_duration(sec, "discovery_timeout", DEFAULT_DISCOVERY_TIMEOUT)?;
    let discovery_window = positive_duration(sec, "discovery_window", DEFAULT_DISCOVERY_WINDOW)?;
    if discovery_window > discovery_timeout {
        w.push(sec.warning(
            "discovery_window",
            "is longer than discovery_timeout, so every discovery runs for the full timeout",
        ));
    }
    let helper_timeout = positive_duration(sec, "helper_timeout", DEFAULT_HELPER_TIMEOUT)?;
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
    Ok(Timeouts {
        discovery_timeout,
        discovery_window,
        helper_timeout,
        rpc_timeout,
        request_batch_window: window(sec, "request_batch_window", DEFAULT_REQUEST_BATCH_WINDOW)?,
    })
}

/// A window (`reply_window`, `request_batch_window`): `default` when unset
/// or empty; zero turns what it times off.
fn window(sec: &Section, key: &str, default: Duration) -> Result<Duration, ConfigError> {
    Ok(match sec.duration(key)? {
        Some((raw, d)) if !raw.trim().is_empty() => d,
        _ => default,
    })
}

/// `csr_allowed_dns_names`: every pattern compiles.
fn csr_allowed_dns_names(sec: &Section) -> Result<Vec<String>, ConfigError> {
    let names = sec
        .string_list("csr_allowed_dns_names")?
        .unwrap_or_default();
    for (i, pattern) in names.iter().enumerate() {
        if let Err(e) = compile_whole_name(pattern) {
            return Err(sec.item_error(
                "csr_allowed_dns_names",
                i,
                format!("{pattern:?} is not a regular expression: {e}"),
            ));
        }
    }
    Ok(names)
}

/// `records:` and `renewal:`; a renewal needs the provisioning token, and a
/// lead shorter than the shortest `lifetime` issued.
fn day_two(
    file: &Path,
    sec: &Section,
    creds: &Credentials,
    lifetime: Option<Lifetime>,
    w: &mut Vec<ConfigWarning>,
) -> Result<(Option<RecordsConfig>, Option<RenewalConfig>), ConfigError> {
    let records = crate::day_two::records(file, sec, w)?;
    let renewal = crate::day_two::renewal(file, sec, records.as_ref(), w)?;
    if renewal.is_some() && creds.token.is_empty() && creds.token_file.is_none() {
        return Err(sec.error(
            "renewal",
            "needs token (or token_file): reprovision carries the nodes' provisioning token, which records never hold",
        ));
    }
    if let Some(r) = &renewal {
        crate::day_two::check_lead(file, r, lifetime)?;
    }
    Ok((records, renewal))
}

impl super::ProvisionerConfig {
    /// The longest lifetime of the credentials this configuration issues,
    /// when it knows one (as [`shortest_lifetime`]): how long a node must
    /// be able to come back to renew them.
    pub fn issued_lifetime_longest(&self) -> Option<Lifetime> {
        let jwt = self.features.ed25519.then_some(Lifetime {
            setting: "server_jwt_validity",
            lifetime: self.server_jwt_validity,
        });
        let signers = Signers {
            helper: &self.helper,
            cert_manager: self.cert_manager.as_ref(),
            ca: self.ca.as_ref(),
        };
        match (jwt, signers.certificate_lifetime()) {
            (Some(j), Some(c)) => Some(if c.lifetime > j.lifetime { c } else { j }),
            (j, c) => j.or(c),
        }
    }
}

/// The shortest lifetime this configuration issues, when it knows one: the
/// server JWTs (`features.ed25519`) and the certificates we sign
/// (cert-manager's with a `duration`, the built-in CA's); a helper's
/// certificates are its own business.
fn shortest_lifetime(
    features: &Features,
    server_jwt_validity: Duration,
    signers: &Signers,
) -> Option<Lifetime> {
    let jwt = features.ed25519.then_some(Lifetime {
        setting: "server_jwt_validity",
        lifetime: server_jwt_validity,
    });
    match (jwt, signers.certificate_lifetime()) {
        (Some(j), Some(c)) => Some(if c.lifetime < j.lifetime { c } else { j }),
        (j, c) => j.or(c),
    }
}
