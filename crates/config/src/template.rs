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
//! templates is `provision::signing::template`'s job. The engine is `minijinja`
//! (Jinja2 syntax) with undefined values as errors: a misspelt fact fails its
//! node with the key's name instead of configuring an empty value.

// The names live in `template_names`, which `interpolation` reads too: this
// module uses `interpolation` (its checks go into every environment), never
// the other way round.
pub use super::template_names::{
    template_name, ACTION_POLICIES, CONFIGURATION, OPA_POLICIES, UPGRADE,
};
use choria_wire::security::tokens::ServerClaims;
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

/// A template that does not compile, named as in the file
/// (`configuration.identity`).
#[derive(Debug, thiserror::Error)]
#[error("{name}: {reason}")]
pub struct TemplateSyntaxError {
    pub name: String,
    pub reason: SyntaxProblem,
}

#[derive(Debug, thiserror::Error)]
pub enum SyntaxProblem {
    #[error("{0}")]
    Template(#[source] minijinja::Error),
    /// `{% include %}`, `{% import %}`, `{% from %}` or `{% extends %}`:
    /// another template's text would be rendered under this one's checks
    /// (or this one's under another's), so each stands alone.
    #[error("{{% {0} %}} is not supported: each setting and policy is rendered on its own, and checked for where it lands")]
    Reference(&'static str),
}

/// The tags that bring in another template.
const REFERENCES: [&str; 4] = ["include", "import", "from", "extends"];

/// The first tag of `source` that would bring in another template.
fn reference(source: &str) -> Option<&'static str> {
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        let tag = rest[i + 2..]
            .trim_start_matches(['-', '+', '~'])
            .trim_start();
        if let Some(r) = REFERENCES.iter().find(|r| {
            tag.strip_prefix(**r)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        }) {
            return Some(r);
        }
        rest = &rest[i + 2..];
    }
    None
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

    /// Compiles every template, each into an environment of its own under
    /// [`template_name`]: one template cannot include or import another
    /// (its text would be rendered under the other's checks for where it
    /// lands), and a tag that tries is refused here. Strict about undefined
    /// values; no HTML escaping (these are configuration values, not
    /// pages); a trailing newline is kept, as policy files end with one.
    pub fn environments(
        &self,
    ) -> Result<BTreeMap<String, Environment<'static>>, TemplateSyntaxError> {
        let mut out = BTreeMap::new();
        for (section, key, source) in self.templates() {
            let name = template_name(section, key);
            if let Some(tag) = reference(source) {
                return Err(TemplateSyntaxError {
                    name,
                    reason: SyntaxProblem::Reference(tag),
                });
            }
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
            env.add_template_owned(name.clone(), source.to_string())
                .map_err(|e| TemplateSyntaxError {
                    name: name.clone(),
                    reason: SyntaxProblem::Template(e),
                })?;
            out.insert(name, env);
        }
        Ok(out)
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
        let envs = t.environments().unwrap();
        let names: Vec<&str> = envs.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "configuration.identity",
                "opa_policies.default.rego",
                "upgrade"
            ]
        );
        for (name, env) in &envs {
            let inside: Vec<&str> = env.templates().map(|(n, _)| n).collect();
            assert_eq!(inside, [name.as_str()], "each template alone");
        }
        let out = envs["opa_policies.default.rego"]
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
        let e = t.environments().unwrap_err();
        assert_eq!(e.name, "configuration.plugin.choria.middleware_hosts");
        assert!(e
            .to_string()
            .starts_with("configuration.plugin.choria.middleware_hosts: "));
    }

    #[test]
    fn a_template_that_brings_in_another_is_refused() {
        for (source, tag) in [
            ("{% include 'configuration.identity' %}", "include"),
            ("{%- include \"x\" -%}", "include"),
            (
                "{% import 'configuration.identity' as m %}{{ m.x() }}",
                "import",
            ),
            ("{%+ from 'x' import y %}", "from"),
            ("{% extends 'x' %}", "extends"),
        ] {
            let t = ConfigurationTemplate {
                configuration: [
                    ("identity".to_string(), "{{ identity }}".to_string()),
                    ("collectives".to_string(), source.to_string()),
                ]
                .into(),
                ..Default::default()
            };
            let e = t.environments().unwrap_err();
            assert_eq!(e.name, "configuration.collectives", "{source}");
            assert!(
                matches!(e.reason, SyntaxProblem::Reference(t) if t == tag),
                "{source}: {e}"
            );
        }
        // Words that merely start like one are fine.
        let t = ConfigurationTemplate {
            configuration: [(
                "x".to_string(),
                "{% set included = 1 %}{% set imports = 2 %}{{ included }}{{ imports }}"
                    .to_string(),
            )]
            .into(),
            ..Default::default()
        };
        t.environments().unwrap();
    }
}
