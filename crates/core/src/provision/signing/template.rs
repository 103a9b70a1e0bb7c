//! A node's configuration from `configuration_template` (see
//! `config::template`), and how it combines with the helper's answer.
//!
//! The templates see what the helper would read, as data rather than a JSON
//! string: `identity`, `inventory` (the node's `rpcutil#inventory` reply:
//! `facts`, `classes`, `agents`, `version`, `collectives`, ...), `jwt` (the
//! verified provisioning claims, without the provisioning token), `csr`
//! (`ssldir`, ...), `ed25519` (`directory`, ...), and the provisioner's own
//! `site` and `values`.
//!
//! Everything a node reports is untrusted, and a Choria setting is one
//! `key = value` line of the file the node writes: a rendered setting with
//! a line break or another control character could add settings of the
//! node's choosing, so it fails the node instead. Errors name the template
//! and are cut short; the node is retried on a later cycle like any other
//! failure.

use crate::provision::signing::helper::{HelperInput, HelperResponse};
use choria_config::interpolation::{self, Place};
use choria_config::template::{
    template_name, ConfigurationTemplate, TemplateSyntaxError, ACTION_POLICIES, CONFIGURATION,
    OPA_POLICIES, UPGRADE,
};
use minijinja::value::{Serde, Value};
use minijinja::Environment;
use serde_json::json;

/// The longest rendered setting or policy.
pub const MAX_RENDERED: usize = 64 * 1024;
/// The longest template error message kept.
const MAX_MESSAGE: usize = 300;

/// A template that failed for one node; `name` as in the file.
#[derive(Debug, thiserror::Error)]
#[error("configuration_template.{name}: {message}")]
pub struct TemplateError {
    pub name: String,
    pub message: String,
    /// Set when an interpolated value was refused for where it lands.
    pub refused: Option<Place>,
}

/// `configuration_template`, compiled once for every node.
pub struct NodeTemplate {
    /// Each template in an environment of its own, by name.
    envs: std::collections::BTreeMap<String, Environment<'static>>,
    template: ConfigurationTemplate,
    site: String,
}

impl std::fmt::Debug for NodeTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeTemplate")
            .field("configuration", &self.template.configuration.keys())
            .finish_non_exhaustive()
    }
}

impl NodeTemplate {
    pub fn new(template: &ConfigurationTemplate, site: &str) -> Result<Self, TemplateSyntaxError> {
        Ok(NodeTemplate {
            envs: template.environments()?,
            template: template.clone(),
            site: site.to_string(),
        })
    }

    /// The node's configuration, policies, claims and upgrade version.
    pub fn render(&self, input: &HelperInput<'_>) -> Result<HelperResponse, TemplateError> {
        let ctx = Value::from(Serde(self.context(input)));
        let render = |section: &str, key: &str, one_line: bool| -> Result<String, TemplateError> {
            let name = template_name(section, key);
            let fail = |message: String| TemplateError {
                name: name.clone(),
                message,
                refused: None,
            };
            let env = self
                .envs
                .get(&name)
                .expect("every template has its environment");
            let out = env
                .get_template(&name)
                .and_then(|t| t.render(&ctx))
                .map_err(|e| TemplateError {
                    refused: interpolation::refusal(&e).map(|r| r.place),
                    ..fail(clean(&e.to_string()))
                })?;
            // Interpolated values are marked in a policy: whether one made
            // a rule's field a wildcard or a pattern is only seen whole.
            let out = match Place::of(&name) {
                Place::ActionPolicy => {
                    interpolation::check_policy_fields(&out).map_err(|r| TemplateError {
                        refused: Some(r.place),
                        ..fail(clean(&r.to_string()))
                    })?
                }
                _ => out,
            };
            if out.len() > MAX_RENDERED {
                return Err(fail(format!(
                    "rendered to {} bytes, more than {MAX_RENDERED}",
                    out.len()
                )));
            }
            if one_line && out.chars().any(char::is_control) {
                return Err(fail(
                    "rendered to a value with a line break or control character, which a Choria setting cannot hold (does a value the node reported contain one?)"
                        .into(),
                ));
            }
            Ok(out)
        };
        let mut response = HelperResponse::default();
        for key in self.template.configuration.keys() {
            response
                .configuration
                .insert(key.clone(), render(CONFIGURATION, key, true)?);
        }
        for file in self.template.action_policies.keys() {
            response
                .action_policies
                .insert(file.clone(), render(ACTION_POLICIES, file, false)?);
        }
        for file in self.template.opa_policies.keys() {
            response
                .opa_policies
                .insert(file.clone(), render(OPA_POLICIES, file, false)?);
        }
        if self.template.upgrade.is_some() {
            let version = render(UPGRADE, "", false)?;
            let version = version.trim();
            if version.chars().any(char::is_control) {
                return Err(TemplateError {
                    name: UPGRADE.into(),
                    message: "rendered to a version with a control character".into(),
                    refused: None,
                });
            }
            response.upgrade = version.to_string();
        }
        response.server_claims = self.template.server_claims.clone();
        Ok(response)
    }

    /// What the templates see (module docs).
    fn context(&self, input: &HelperInput<'_>) -> serde_json::Value {
        let inventory: serde_json::Value =
            serde_json::from_str(input.inventory).unwrap_or_default();
        let jwt = input.jwt.map(|claims| {
            let mut v = serde_json::to_value(claims).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                // The provisioning token and the provisioning broker's
                // password are secrets shared by the fleet.
                o.remove("cht");
                o.remove("chpwd");
            }
            v
        });
        json!({
            "identity": input.identity,
            "inventory": inventory,
            "jwt": jwt,
            "csr": input.csr,
            "ed25519": input.ed25519_pubkey,
            "site": self.site,
            "values": self.template.values,
        })
    }
}

/// The helper's answer over the template's: a setting or policy the helper
/// gives replaces the template's of the same name, the others stay; its
/// `server_claims` and `upgrade` replace the template's when given;
/// `defer`, `shutdown`, `msg` and the key, certificate, CA and ssldir come
/// from the helper alone.
pub fn merge(template: HelperResponse, helper: HelperResponse) -> HelperResponse {
    let mut out = helper;
    for (k, v) in template.configuration {
        out.configuration.entry(k).or_insert(v);
    }
    for (k, v) in template.action_policies {
        out.action_policies.entry(k).or_insert(v);
    }
    for (k, v) in template.opa_policies {
        out.opa_policies.entry(k).or_insert(v);
    }
    if out.server_claims.is_none() {
        out.server_claims = template.server_claims;
    }
    if out.upgrade.is_empty() {
        out.upgrade = template.upgrade;
    }
    out
}

/// An error message without control characters, cut short.
fn clean(message: &str) -> String {
    crate::provision::text::one_line(message, MAX_MESSAGE)
}

#[cfg(test)]
mod tests;
