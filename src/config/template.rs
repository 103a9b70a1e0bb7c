//! `configuration_template:`: a node's configuration written as templates in
//! `provisioner.yaml`, for fleets whose helper would only fill the node's
//! name into the same few keys (ours; the Go provisioner always runs a
//! helper).
//!
//! ```yaml
//! configuration_template:
//!   values:                      # anything; {{ values.* }} in templates
//!     broker: nats://broker.example.net:4222
//!   configuration:               # Choria key: template
//!     identity: "{{ identity }}"
//!     plugin.choria.middleware_hosts: "{{ values.broker }}"
//!     classes: "{{ inventory.classes | join(',') }}"
//!   action_policies: {}          # rpcutil.policy: template of that file
//!   opa_policies: {}             # default.rego: template of that file
//!   server_claims: {}            # static, as the helper's server_claims
//!   upgrade: ""                  # template: version to upgrade to
//! ```
//!
//! This module holds the settings and builds the template environment, so a
//! syntax error is a configuration error at start-up; rendering a node's
//! templates is `provision::template`'s job. The engine is `minijinja`
//! (Jinja2 syntax) with undefined values as errors: a misspelt fact fails its
//! node with the key's name instead of configuring an empty value.

use crate::choria::security::tokens::ServerClaims;
use minijinja::{Environment, UndefinedBehavior};
use std::collections::BTreeMap;

/// The parsed `configuration_template:` section.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigurationTemplate {
    /// The operator's own values, `{{ values.* }}`.
    pub values: BTreeMap<String, serde_json::Value>,
    /// Choria setting → template of its value.
    pub configuration: BTreeMap<String, String>,
    /// Policy file name (`<agent>.policy`) → template of its text.
    pub action_policies: BTreeMap<String, String>,
    /// Rego file name (`<agent>.rego`, `default.rego`) → template of its text.
    pub opa_policies: BTreeMap<String, String>,
    /// Claims the node's server JWT is based on (`features.ed25519`).
    pub server_claims: Option<ServerClaims>,
    /// Template of the version to upgrade nodes to (`features.upgrades`).
    pub upgrade: Option<String>,
}

/// The template sections, as they are named in the file and in errors.
pub const CONFIGURATION: &str = "configuration";
pub const ACTION_POLICIES: &str = "action_policies";
pub const OPA_POLICIES: &str = "opa_policies";
pub const UPGRADE: &str = "upgrade";

/// A template that does not compile, named as in the file
/// (`configuration.identity`).
#[derive(Debug, thiserror::Error)]
#[error("{name}: {source}")]
pub struct TemplateSyntaxError {
    pub name: String,
    #[source]
    pub source: minijinja::Error,
}

/// The environment's name of one template: `section.key`.
pub fn template_name(section: &str, key: &str) -> String {
    if key.is_empty() {
        section.to_string()
    } else {
        format!("{section}.{key}")
    }
}

impl ConfigurationTemplate {
    /// Every template, `(section, key, source)`.
    pub fn templates(&self) -> impl Iterator<Item = (&'static str, &str, &str)> {
        self.configuration
            .iter()
            .map(|(k, v)| (CONFIGURATION, k.as_str(), v.as_str()))
            .chain(
                self.action_policies
                    .iter()
                    .map(|(k, v)| (ACTION_POLICIES, k.as_str(), v.as_str())),
            )
            .chain(
                self.opa_policies
                    .iter()
                    .map(|(k, v)| (OPA_POLICIES, k.as_str(), v.as_str())),
            )
            .chain(self.upgrade.iter().map(|v| (UPGRADE, "", v.as_str())))
    }

    /// Compiles every template into one environment, each under
    /// [`template_name`]. Strict about undefined values; no HTML escaping
    /// (these are configuration values, not pages); a trailing newline is
    /// kept, as policy files end with one.
    pub fn environment(&self) -> Result<Environment<'static>, TemplateSyntaxError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .keep_trailing_newline(true)
                .build()
                .expect("the default delimiters are valid"),
        );
        super::interpolation::install(&mut env);
        for (section, key, source) in self.templates() {
            let name = template_name(section, key);
            env.add_template_owned(name.clone(), source.to_string())
                .map_err(|source| TemplateSyntaxError { name, source })?;
        }
        Ok(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_is_compiled_under_its_name() {
        let t = ConfigurationTemplate {
            configuration: [("identity".to_string(), "{{ identity }}".to_string())].into(),
            opa_policies: [("default.rego".to_string(), "package x\n".to_string())].into(),
            upgrade: Some("0.30.{{ 1 + 1 }}".into()),
            ..Default::default()
        };
        let env = t.environment().unwrap();
        let mut names: Vec<&str> = env.templates().map(|(n, _)| n).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "configuration.identity",
                "opa_policies.default.rego",
                "upgrade"
            ]
        );
        let out = env
            .get_template("opa_policies.default.rego")
            .unwrap()
            .render(())
            .unwrap();
        assert_eq!(out, "package x\n", "the trailing newline is kept");
    }

    #[test]
    fn a_syntax_error_names_the_template() {
        let t = ConfigurationTemplate {
            configuration: [(
                "plugin.choria.middleware_hosts".to_string(),
                "{{ values.broker".to_string(),
            )]
            .into(),
            ..Default::default()
        };
        let e = t.environment().unwrap_err();
        assert_eq!(e.name, "configuration.plugin.choria.middleware_hosts");
        assert!(e
            .to_string()
            .starts_with("configuration.plugin.choria.middleware_hosts: "));
    }
}
