//! The nested sections of `provisioner.yaml` (`features:`, `cert_manager:`,
//! `configuration_template:`), each read as a section of its own so its
//! keys are matched, warned about and named in errors with its prefix.

use super::super::{
    non_empty, positive_duration, CertManagerConfig, Features, CERT_MANAGER_USAGES,
    DEFAULT_CERT_MANAGER_TIMEOUT, DEFAULT_CERT_MANAGER_USAGES,
};
use crate::schema::{CertManagerFile, ConfigurationTemplateFile, FeaturesFile};
use crate::template::{ConfigurationTemplate, ACTION_POLICIES, CONFIGURATION, OPA_POLICIES};
use crate::yaml::Node;
use crate::yaml::Section;
use crate::{ConfigError, ConfigWarning};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// `features:`: `pki` and `ed25519` exclude each other; `ed25519` turns `jwt` on.
pub(super) fn features(
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

/// `cert_manager:`: an issuer name, a namespace, known usages.
pub(super) fn cert_manager(
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
    let duration = certificate_duration(&c)?;
    let usages = usages(&c)?;
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

/// `cert_manager.duration`: unset leaves the lifetime to the issuer, and
/// cert-manager refuses one under an hour.
fn certificate_duration(c: &Section) -> Result<Option<Duration>, ConfigError> {
    Ok(match c.duration("duration")? {
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
    })
}

/// `cert_manager.usages`, or the defaults: each one cert-manager knows.
fn usages(c: &Section) -> Result<Vec<String>, ConfigError> {
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
    Ok(usages)
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
pub(super) fn configuration_template(
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
    let values = template_values(&tsec)?;
    let configuration = settings(&tsec)?;
    let action_policies = policies(&tsec, ACTION_POLICIES, ".policy")?;
    let opa_policies = policies(&tsec, OPA_POLICIES, ".rego")?;
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

/// `configuration_template.values`: any mapping, as the templates see it.
fn template_values(tsec: &Section) -> Result<BTreeMap<String, serde_json::Value>, ConfigError> {
    Ok(match tsec.node("values") {
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
    })
}

/// `configuration_template.configuration`: each name one a `key = value`
/// line can hold.
fn settings(tsec: &Section) -> Result<BTreeMap<String, String>, ConfigError> {
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
    Ok(configuration)
}

/// The policies of one kind, each named as go-choria names a policy file.
fn policies(
    tsec: &Section,
    section: &str,
    ext: &str,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let map = tsec.string_map(section)?.unwrap_or_default();
    // go-choria refuses other names ("expected %q to have .policy
    // extension") after writing the configuration: the node would be
    // configured without its policies.
    for file in map.keys() {
        if !is_policy_file(file, ext) {
            return Err(tsec.error(
                section,
                format!("{file:?} is not a policy file name such as rpcutil{ext} (letters, digits, _, - and ., ending {ext})"),
            ));
        }
    }
    Ok(map)
}
