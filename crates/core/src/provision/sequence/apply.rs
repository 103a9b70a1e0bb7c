//! Applying what was decided: `release_update`, `configure` and
//! `restart`, or `shutdown` when the helper asked for it.

use super::call::require_ok;
use super::version::Version;
use super::{HostSequence, ProvisionError};
use crate::provision::signing::helper::HelperResponse;
use serde::Serialize;
use std::collections::BTreeMap;
use tracing::{info, warn};

impl HostSequence {
    pub(super) async fn shutdown(&self) -> Result<(), ProvisionError> {
        let identity: &str = &self.identity;
        let metrics = &self.ctx.metrics;
        // A shutdown the node refuses is only logged and not retried, as in
        // Go: the helper wants the node gone either way.
        let accepted = self
            .call("choria_provision#shutdown", 3, &self.token_data(), |r| {
                if !r.body.is_ok() {
                    warn!(node = identity, sender = %r.reply.sender, status = %r.body.statusmsg, "the node refused to shut down");
                }
                Ok(r.body.is_ok())
            })
            .await?;
        if accepted {
            metrics.helper_shutdown();
            info!(node = identity, "node is shutting down");
        }
        Ok(())
    }
    /// `Ok(true)` when no upgrade is needed, `Ok(false)` when one was started.
    pub(super) async fn upgrade(&self, target: &str) -> Result<bool, ProvisionError> {
        let cfg = &self.ctx.cfg;
        let fail = |reason: &str| ProvisionError::Upgrade {
            version: target.to_string(),
            reason: reason.to_string(),
        };
        let Some(repository) = cfg.upgrades_repository.as_deref() else {
            return Err(fail("upgrades_repository is not configured"));
        };
        if self.got.version.is_empty() {
            return Err(fail("the node's inventory has no version"));
        }
        if !self.got.upgradable {
            return Err(fail("the node does not support upgrades"));
        }
        if Version::parse(&self.got.version).equal(&Version::parse(target)) {
            return Ok(true);
        }
        warn!(node = &*self.identity, from = %self.got.version, to = target, "updating the node's version");
        #[derive(Serialize)]
        struct Args<'t> {
            repository: &'t str,
            token: &'t str,
            version: &'t str,
        }
        self.call(
            "choria_provision#release_update",
            3,
            &Args {
                repository,
                token: self.token.expose(),
                version: target,
            },
            require_ok,
        )
        .await?;
        Ok(false)
    }

    pub(super) async fn configure(
        &self,
        response: &HelperResponse,
        key: &str,
        ecdh_public: &str,
        server_jwt: &str,
    ) -> Result<String, ProvisionError> {
        if response.configuration.is_empty() {
            return Err(ProvisionError::EmptyConfiguration);
        }
        let config = String::from_utf8(
            choria_wire::json::to_vec(&response.configuration).expect("a string map encodes"),
        )
        .expect("JSON is UTF-8");
        // The CSR's ssldir wins over the helper's, as in Go.
        let ssldir = match &self.got.csr {
            Some(csr) if !csr.ssldir.is_empty() => csr.ssldir.as_str(),
            _ => response.ssldir.as_str(),
        };
        // Go's generated client sends every input, in key order.
        let args = ConfigureArgs {
            action_policies: &response.action_policies,
            ca: &response.ca,
            certificate: &response.certificate,
            config: &config,
            ecdh_public,
            key,
            opa_policies: &response.opa_policies,
            server_jwt,
            ssldir,
            token: self.token.expose(),
        };
        info!(node = &*self.identity, "configuring node");
        self.call("choria_provision#configure", 5, &args, require_ok)
            .await?;
        Ok(config)
    }

    pub(super) async fn restart(&self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            splay: u32,
            token: &'t str,
        }
        info!(node = &*self.identity, "restarting node");
        self.call(
            "choria_provision#restart",
            3,
            &Args {
                splay: 1,
                token: self.token.expose(),
            },
            require_ok,
        )
        .await
    }
}

/// `choria_provision#configure` inputs, fields in the order Go's map encodes them.
#[derive(Serialize)]
struct ConfigureArgs<'t> {
    action_policies: &'t BTreeMap<String, String>,
    ca: &'t str,
    certificate: &'t str,
    config: &'t str,
    ecdh_public: &'t str,
    key: &'t str,
    opa_policies: &'t BTreeMap<String, String>,
    server_jwt: &'t str,
    ssldir: &'t str,
    token: &'t str,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configure_inputs_encode_in_go_map_order() {
        let empty = BTreeMap::new();
        let args = ConfigureArgs {
            action_policies: &empty,
            ca: "",
            certificate: "",
            config: "{\"a\":\"b\"}",
            ecdh_public: "",
            key: "",
            opa_policies: &empty,
            server_jwt: "",
            ssldir: "",
            token: "t",
        };
        let json = String::from_utf8(choria_wire::json::to_vec(&args).unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"action_policies":{},"ca":"","certificate":"","config":"{\"a\":\"b\"}","ecdh_public":"","key":"","opa_policies":{},"server_jwt":"","ssldir":"","token":"t"}"#
        );
    }
}
