//! Reading `provisioner.yaml` into [`ProvisionerConfig`]: one helper per
//! group of settings, each applying Go's default and check and ours.

use super::*;
use crate::schema::{CertManagerFile, ConfigurationTemplateFile, FeaturesFile, ProvisionerFile};
use crate::template::{ConfigurationTemplate, ACTION_POLICIES, CONFIGURATION, OPA_POLICIES};
use choria_wire::security::csr::compile_whole_name;
use std::collections::BTreeMap;

impl ProvisionerConfig {
    /// Parses and validates YAML text without touching the file system; `file`
    /// is only used in messages.
    pub fn parse(text: &str, file: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let file = file.as_ref();
        let root = Node::parse(text).map_err(|message| ConfigError::Syntax {
            file: file.to_path_buf(),
            message: format!("not valid YAML: {message}"),
        })?;
        let mut warnings = Vec::new();
        let sec = Section::new(file, "", root, ProvisionerFile::KEYS, &mut warnings)?;
        let w = &mut warnings;

        let workers = workers(&sec)?;
        let (interval_text, interval) = interval(&sec)?;
        let (logfile, loglevel) = logging(&sec, w)?;
        let configuration_template = configuration_template(file, &sec, w)?;
        let helper = helper(&sec, configuration_template.is_some())?;
        let creds = credentials(&sec, w)?;
        let lifecycle_component = lifecycle_component(&sec)?;
        let choria_insecure = sec.bool("choria_insecure")?.unwrap_or(false);
        let site = sec.string("site")?.unwrap_or_default();
        let monitor_port = monitor_port(&sec, w)?;
        let broker_port = sec.int("broker_port")?;
        if broker_port.is_some() {
            w.push(ignored(&sec, "broker_port"));
        }
        let cert_deny_list = deny_list(&sec)?;
        let jwt_verify_cert = non_empty(sec.string("jwt_verify_cert")?);
        let jwt_signing_key = non_empty(sec.string("jwt_signing_key")?).map(PathBuf::from);
        let jwt_signing_token = non_empty(sec.string("jwt_signing_token")?).map(PathBuf::from);
        let server_jwt_validity = server_jwt_validity(&sec)?;
        let rego_policy = non_empty(sec.string("rego_policy")?);
        if rego_policy.is_some() {
            w.push(ignored(&sec, "rego_policy"));
        }
        let leader_election = sec.bool("leader_election")?.unwrap_or(false);
        let upgrades_repository = non_empty(sec.string("upgrades_repository")?);
        let upgrades_optional = sec.bool("upgrades_optional")?.unwrap_or(false);
        let features = features(file, &sec, w)?;
        let cert_manager = cert_manager(file, &sec, w)?;
        if cert_manager.is_some() && !features.pki {
            w.push(sec.warning(
                "cert_manager",
                "set while features.pki is off: no CSR is fetched, so cert-manager signs nothing",
            ));
        }
        if features.pki && helper.is_empty() && cert_manager.is_none() {
            return Err(sec.error(
                "helper",
                "required with features.pki unless cert_manager is set: something has to sign the nodes' certificates (configuration_template only configures them)",
            ));
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
            w.push(sec.warning(
                "upgrades_repository",
                "not set while features.upgrades is enabled; nodes whose helper asks for an upgrade will fail (set it, or upgrades_optional: true)",
            ));
        }
        let timeouts = timeouts(&sec, w)?;
        let reply_window = match sec.duration("reply_window")? {
            Some((raw, d)) if !raw.trim().is_empty() => d,
            _ => DEFAULT_REPLY_WINDOW,
        };
        let csr_allowed_dns_names = sec
            .string_list("csr_allowed_dns_names")?
            .unwrap_or_default();
        for (i, pattern) in csr_allowed_dns_names.iter().enumerate() {
            if let Err(e) = compile_whole_name(pattern) {
                return Err(sec.item_error(
                    "csr_allowed_dns_names",
                    i,
                    format!("{pattern:?} is not a regular expression: {e}"),
                ));
            }
        }
        let records = crate::day_two::records(file, &sec, w)?;
        let renewal = crate::day_two::renewal(file, &sec, records.as_ref(), w)?;
        if renewal.is_some() && creds.token.is_empty() && creds.token_file.is_none() {
            return Err(sec.error(
                "renewal",
                "needs token (or token_file): reprovision carries the nodes' provisioning token, which records never hold",
            ));
        }
        if let Some(r) = &renewal {
            crate::day_two::check_lead(
                file,
                r,
                shortest_lifetime(&features, server_jwt_validity, cert_manager.as_ref()),
            )?;
        }
        let election = ElectionConfig::resolve(
            file,
            sec.node("election").cloned(),
            leader_election,
            &sec.key("leader_election"),
            w,
        )?;

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
            choria_insecure,
            site,
            monitor_port,
            broker_port,
            broker_provisioning_password: creds.password,
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
            discovery_timeout: timeouts.discovery_timeout,
            discovery_window: timeouts.discovery_window,
            helper_timeout: timeouts.helper_timeout,
            rpc_timeout: timeouts.rpc_timeout,
            reply_window,
            csr_allowed_dns_names,
            configuration_template,
            cert_manager,
            records,
            renewal,
            warnings,
        })
    }
}

/// The shortest lifetime this configuration issues, when it knows one: the
/// server JWTs (`features.ed25519`) and cert-manager's certificates (with a
/// `duration`); a helper's certificates are its own business.
fn shortest_lifetime(
    features: &Features,
    server_jwt_validity: Duration,
    cert_manager: Option<&CertManagerConfig>,
) -> Option<crate::day_two::Lifetime> {
    use crate::day_two::Lifetime;
    let jwt = features.ed25519.then_some(Lifetime {
        setting: "server_jwt_validity",
        lifetime: server_jwt_validity,
    });
    let cert = cert_manager.and_then(|c| c.duration).map(|d| Lifetime {
        setting: "cert_manager.duration",
        lifetime: d,
    });
    match (jwt, cert) {
        (Some(j), Some(c)) => Some(if c.lifetime < j.lifetime { c } else { j }),
        (j, c) => j.or(c),
    }
}

/// A key Go accepts and ignores.
fn ignored(sec: &Section, key: &str) -> ConfigWarning {
    sec.warning(
        key,
        "accepted for compatibility but not used (the Go provisioner ignores it too)",
    )
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

/// `cert_manager:`: an issuer name, a namespace, known usages.
fn cert_manager(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<CertManagerConfig>, ConfigError> {
    if !sec.is_set("cert_manager") {
        return Ok(None);
    }
    let c = Section::new(
        file,
        &format!("{}.", sec.key("cert_manager")),
        sec.node("cert_manager").cloned().unwrap_or(Node::Null),
        CertManagerFile::KEYS,
        w,
    )?;
    let name = |key: &str, default: Option<&str>| -> Result<String, ConfigError> {
        match (non_empty(c.string(key)?), default) {
            (Some(v), _) if crate::names::is_dns_subdomain(&v) || key == "issuer_kind" => Ok(v),
            (Some(v), _) => Err(c.error(key, format!("{v:?} is not a Kubernetes name"))),
            (None, Some(d)) => Ok(d.to_string()),
            (None, None) => Err(c.error(
                key,
                match key {
                    "issuer" => "required: the name of the cert-manager Issuer (or, with issuer_kind: ClusterIssuer, ClusterIssuer) that signs the nodes' CSRs",
                    _ => "required: the namespace the CertificateRequests are made in (an Issuer must be there too; the operator sets its own)",
                },
            )),
        }
    };
    let issuer = name("issuer", None)?;
    let issuer_kind = name("issuer_kind", Some("Issuer"))?;
    if !issuer_kind.chars().all(|ch| ch.is_ascii_alphanumeric()) {
        return Err(c.error("issuer_kind", format!("{issuer_kind:?} is not a kind")));
    }
    let issuer_group = name("issuer_group", Some("cert-manager.io"))?;
    let namespace = name("namespace", None)?;
    if !crate::names::is_dns_label(&namespace) {
        return Err(c.error(
            "namespace",
            format!("{namespace:?} is not a namespace name"),
        ));
    }
    let duration = match c.duration("duration")? {
        Some((raw, d)) if !raw.trim().is_empty() => {
            if d < Duration::from_secs(3600) {
                return Err(c.error(
                    "duration",
                    format!("{raw} is shorter than cert-manager's minimum of 1h"),
                ));
            }
            Some(d)
        }
        _ => None,
    };
    let usages = c.string_list("usages")?.unwrap_or_else(|| {
        DEFAULT_CERT_MANAGER_USAGES
            .iter()
            .map(|u| u.to_string())
            .collect()
    });
    for (i, u) in usages.iter().enumerate() {
        if !CERT_MANAGER_USAGES.contains(&u.as_str()) {
            return Err(c.item_error(
                "usages",
                i,
                format!("{u:?} is not a cert-manager key usage (e.g. \"digital signature\", \"server auth\", \"client auth\")"),
            ));
        }
    }
    let timeout = positive_duration(&c, "timeout", DEFAULT_CERT_MANAGER_TIMEOUT)?;
    let keep = match c.duration("keep")? {
        Some((raw, d)) if !raw.trim().is_empty() => d,
        _ => Duration::ZERO,
    };
    Ok(Some(CertManagerConfig {
        issuer,
        issuer_kind,
        issuer_group,
        namespace,
        duration,
        usages,
        timeout,
        keep,
    }))
}

/// A policy file name as go-choria's `configure` writes it into the
/// node's policy directory: `<name><extension>`, the name of letters,
/// digits, `_`, `-` and `.` (no path, not hidden).
fn is_policy_file(name: &str, extension: &str) -> bool {
    name.strip_suffix(extension).is_some_and(|stem| {
        !stem.is_empty()
            && !stem.starts_with('.')
            && stem
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    })
}

/// `configuration_template:`: names that are safe where they end up (a
/// Choria setting is one `key = value` line; a policy is a file named after
/// its agent), every template compiles, `server_claims` are claims.
fn configuration_template(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<ConfigurationTemplate>, ConfigError> {
    if !sec.is_set("configuration_template") {
        return Ok(None);
    }
    let prefix = format!("{}.", sec.key("configuration_template"));
    let tsec = Section::new(
        file,
        &prefix,
        sec.node("configuration_template")
            .cloned()
            .unwrap_or(Node::Null),
        ConfigurationTemplateFile::KEYS,
        w,
    )?;
    let values = match tsec.node("values") {
        None => BTreeMap::new(),
        Some(n @ Node::Map(_)) => match n.to_json() {
            serde_json::Value::Object(m) => m.into_iter().collect(),
            _ => unreachable!("a mapping is a JSON object"),
        },
        Some(other) => {
            return Err(tsec.error(
                "values",
                format!("expected a mapping, found {}", other.kind()),
            ))
        }
    };
    let configuration = tsec.string_map(CONFIGURATION)?.unwrap_or_default();
    for key in configuration.keys() {
        if key.is_empty()
            || key.contains('=')
            || key.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(tsec.error(
                CONFIGURATION,
                format!(
                    "{key:?} is not a Choria setting name (no spaces, '=' or control characters)"
                ),
            ));
        }
    }
    // go-choria refuses other names ("expected %q to have .policy
    // extension") after writing the configuration: the node would be
    // configured without its policies.
    let policies = |section: &str, ext: &str| -> Result<BTreeMap<String, String>, ConfigError> {
        let map = tsec.string_map(section)?.unwrap_or_default();
        for file in map.keys() {
            if !is_policy_file(file, ext) {
                return Err(tsec.error(
                    section,
                    format!("{file:?} is not a policy file name such as rpcutil{ext} (letters, digits, _, - and ., ending {ext})"),
                ));
            }
        }
        Ok(map)
    };
    let action_policies = policies(ACTION_POLICIES, ".policy")?;
    let opa_policies = policies(OPA_POLICIES, ".rego")?;
    let server_claims = match tsec.node("server_claims") {
        None => None,
        Some(n) => Some(
            serde_json::from_value(n.to_json())
                .map_err(|e| tsec.error("server_claims", format!("not server claims: {e}")))?,
        ),
    };
    let upgrade = non_empty(tsec.string("upgrade")?);
    let template = ConfigurationTemplate {
        values,
        configuration,
        action_policies,
        opa_policies,
        server_claims,
        upgrade,
    };
    if let Err(e) = template.environments() {
        return Err(ConfigError::invalid(
            file,
            None,
            format!("{prefix}{}", e.name),
            format!("not a valid template: {}", e.reason),
        ));
    }
    if template.configuration.is_empty() && !sec.is_set("helper") {
        return Err(tsec.error(
            CONFIGURATION,
            "empty while no helper is set: nodes would get no configuration",
        ));
    }
    Ok(Some(template))
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

/// `features:`: `pki` and `ed25519` exclude each other; `ed25519` turns `jwt` on.
fn features(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Features, ConfigError> {
    let fsec = Section::new(
        file,
        &format!("{}.", sec.key("features")),
        sec.node("features").cloned().unwrap_or(Node::Null),
        FeaturesFile::KEYS,
        w,
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
            w.push(fsec.warning("jwt", "forced on because ed25519 is enabled"));
        }
        features.jwt = true;
    }
    Ok(features)
}

struct Timeouts {
    discovery_timeout: Duration,
    discovery_window: Duration,
    helper_timeout: Duration,
    rpc_timeout: Option<Duration>,
}

/// Our timeouts (Go fixes them): positive when set.
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
    })
}
