//! Deciding a node's configuration and signing for it: the user's helper
//! and `configuration_template`, the checks on what they grant, cert-manager
//! and the built-in CA as signers, and the keys we verify and sign with.

pub mod ca;
pub mod certmanager;
pub mod credentials;
pub mod grants;
pub mod helper;
pub mod template;

use choria_config::{ConfigError, ProvisionerConfig};
use choria_k8s::crd::ResourceRef;
use choria_k8s::Kube;
use regex::Regex;
use std::sync::Arc;

/// What deciding and signing a node's configuration needs, made once from
/// the configuration (everything here was checked by `prepare`).
pub struct Signing {
    /// The user's helper; `None` when `configuration_template` alone
    /// configures the nodes.
    pub helper: Option<helper::Helper>,
    /// `configuration_template`, compiled.
    pub template: Option<template::NodeTemplate>,
    /// `cert_manager`: signs the nodes' CSRs when the helper did not.
    pub cert_manager: Option<certmanager::Signer>,
    /// `ca`: the built-in CA, signing the nodes' CSRs when the helper did
    /// not.
    pub ca: Option<Arc<ca::BuiltinCa>>,
    /// `cert_deny_list`: identities and CSR names never signed for.
    pub deny_list: Vec<Regex>,
    /// DNS names besides the identity a CSR may ask for.
    pub csr_allowed_dns: Vec<Regex>,
    /// The keys we verify and sign with, kept current by a watcher.
    pub credentials: Arc<credentials::Credentials>,
}

impl Signing {
    /// From the configuration; cert-manager's requests are made with `kube`
    /// and owned by `provisioner` (the resource we run as, if any).
    pub fn new(
        cfg: &Arc<ProvisionerConfig>,
        kube: &Kube,
        provisioner: Option<&ResourceRef>,
    ) -> Result<Self, ConfigError> {
        let argv = cfg.helper_command()?;
        let helper =
            (!argv.is_empty()).then(|| helper::Helper::new(argv).with_timeout(cfg.helper_timeout));
        let template = match &cfg.configuration_template {
            Some(t) => Some(template::NodeTemplate::new(t, &cfg.site).map_err(|e| {
                ConfigError::invalid(
                    &cfg.file,
                    None,
                    format!("configuration_template.{}", e.name),
                    e.reason.to_string(),
                )
            })?),
            None => None,
        };
        Ok(Signing {
            helper,
            template,
            cert_manager: cfg
                .cert_manager
                .clone()
                .map(|c| certmanager::Signer::new(c, kube.clone(), provisioner.cloned())),
            ca: match (&cfg.ca, cfg.features.pki) {
                (Some(c), true) => Some(Arc::new(ca::BuiltinCa::new(cfg.load_ca()?, c.validity))),
                _ => None,
            },
            deny_list: cfg.cert_deny_regexes()?,
            csr_allowed_dns: cfg.csr_allowed_dns_regexes()?,
            credentials: Arc::new(credentials::Credentials::load(cfg.clone())),
        })
    }
}
