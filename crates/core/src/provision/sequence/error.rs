//! How a node's sequence fails: one error per step, each naming it.

use crate::provision::gate::Paused;
use crate::provision::signing::ca::CaSignError;
use crate::provision::signing::certmanager::SignError;
use crate::provision::signing::helper::HelperError;
use crate::provision::signing::template::TemplateError;
use choria_config::ConfigError;
use choria_wire::replies::Conflict;
use choria_wire::security::csr::CsrError;
use choria_wire::security::tokens::TokenError;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("{0}")]
    Paused(#[from] Paused),
    #[error("skipping node that has been waiting {0:?}, more than twice the discovery interval")]
    Stale(Duration),
    #[error("shutting down")]
    Abandoned,
    #[error("{rpc} failed after {tries} {}: {last}", if *.tries == 1 { "try" } else { "tries" })]
    Rpc {
        rpc: &'static str,
        tries: u32,
        last: String,
    },
    /// The first request never got an answer in the node's name: nothing
    /// confirms the name exists.
    #[error("{rpc} got no answer in {tries} {}, so nothing confirms the node: {last}", if *.tries == 1 { "try" } else { "tries" })]
    Unconfirmed {
        rpc: &'static str,
        tries: u32,
        last: String,
    },
    #[error("could not validate JWT: {0}")]
    Jwt(#[source] TokenError),
    #[error("could not validate JWT: the node's provisioning JWT was issued for {bound}, not for this name")]
    IdentityBound { bound: String },
    #[error("could not validate JWT: the node's provisioning JWT expects a different token (its cht claim) than `token` in the provisioner configuration")]
    TokenMismatch,
    #[error("could not verify the ed25519 public key: {0}")]
    Ed25519(String),
    #[error("could not validate CSR: {0}")]
    Csr(#[source] CsrError),
    #[error("could not validate CSR: no CSR received")]
    NoCsr,
    #[error("the helper failed: {0}")]
    Helper(#[from] HelperError),
    #[error("{0}")]
    Template(#[source] TemplateError),
    #[error("cert-manager: {0}")]
    CertManager(#[source] SignError),
    #[error("built-in CA: {0}")]
    Ca(#[source] CaSignError),
    #[error("configuration deferred by the helper: {0}")]
    Deferred(String),
    #[error("could not sign the server JWT: {0}")]
    ServerJwt(#[source] TokenError),
    #[error("could not sign the server JWT: {0}")]
    ServerJwtSetup(&'static str),
    #[error("could not encrypt the private key for the node: {0}")]
    KeyEncryption(String),
    #[error("upgrade to {version} failed: {reason}")]
    Upgrade { version: String, reason: String },
    #[error("the helper returned an empty configuration")]
    EmptyConfiguration,
    #[error("the identity is revoked: {reason}")]
    Revoked { reason: String },
    #[error("the identity still holds valid credentials (until {expires}) that renewal did not ask it to replace; refused as records.exclusive is set")]
    HeldElsewhere { expires: String },
    #[error("the revocations and records could not be read yet; not provisioning until they are")]
    RevocationsUnknown,
    #[error("{0}")]
    Evidence(#[source] crate::evidence::EvidenceError),
    #[error("instance {instance} was provisioned as {identity}: one instance, one identity")]
    InstanceBound { instance: String, identity: String },
    #[error("the identity was provisioned from instance {instance}: one identity, one instance (a replaced machine is moved with `choria-provisioner rebind`)")]
    NameBound { instance: String },
    #[error("the instances' identities could not be read: {0}")]
    BindingsUnknown(String),
    #[error("refused by the admission policy: {0}")]
    PolicyDenied(String),
    #[error("deferred by the admission policy: {0}")]
    PolicyDeferred(String),
    #[error("refused: {0}")]
    Policy(#[source] crate::admission::PolicyError),
    #[error("the node's identity matches the deny list pattern {0:?}")]
    DeniedIdentity(String),
    #[error("{0}")]
    Refused(#[source] crate::provision::signing::grants::Refused),
    #[error(
        "{rpc}: another provisioner holds the node's provisioning lock; leaving the node to it"
    )]
    Locked { rpc: &'static str },
    #[error("{0}")]
    Conflict(#[source] Conflict),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Key(#[from] crate::provision::signing::credentials::KeyUnavailable),
}

impl ProvisionError {
    /// The step, for logs (`choria_provision#jwt`, `helper`...).
    pub fn step(&self) -> &'static str {
        match self {
            ProvisionError::Rpc { rpc, .. } | ProvisionError::Unconfirmed { rpc, .. } => rpc,
            ProvisionError::Paused(_) | ProvisionError::Abandoned => "pause",
            ProvisionError::Stale(_) => "queue",
            ProvisionError::Jwt(_)
            | ProvisionError::TokenMismatch
            | ProvisionError::IdentityBound { .. } => "choria_provision#jwt",
            ProvisionError::Ed25519(_) => "choria_provision#gen25519",
            ProvisionError::Csr(_) | ProvisionError::NoCsr => "choria_provision#gencsr",
            ProvisionError::Helper(_) | ProvisionError::Deferred(_) => "helper",
            ProvisionError::Template(_) => "template",
            ProvisionError::CertManager(_) => "cert_manager",
            ProvisionError::Ca(_) => "ca",
            ProvisionError::ServerJwt(_) | ProvisionError::ServerJwtSetup(_) => "server_jwt",
            ProvisionError::KeyEncryption(_) => "key_encryption",
            ProvisionError::Upgrade { .. } => "choria_provision#release_update",
            ProvisionError::EmptyConfiguration => "choria_provision#configure",
            ProvisionError::Config(_) | ProvisionError::Key(_) => "config",
            ProvisionError::DeniedIdentity(_) => "deny_list",
            ProvisionError::PolicyDenied(_)
            | ProvisionError::PolicyDeferred(_)
            | ProvisionError::Policy(_) => "admission",
            ProvisionError::Revoked { .. } | ProvisionError::RevocationsUnknown => "revocation",
            ProvisionError::HeldElsewhere { .. } => "records",
            ProvisionError::Evidence(_)
            | ProvisionError::InstanceBound { .. }
            | ProvisionError::NameBound { .. }
            | ProvisionError::BindingsUnknown(_) => "evidence",
            ProvisionError::Refused(_) => "grant",
            ProvisionError::Locked { rpc } => rpc,
            ProvisionError::Conflict(_) => "reply_window",
        }
    }

    /// A pause or shutdown rather than a fault of the node.
    pub fn is_pause(&self) -> bool {
        matches!(self, ProvisionError::Paused(_) | ProvisionError::Abandoned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_step() {
        let e = ProvisionError::Rpc {
            rpc: "choria_provision#jwt",
            tries: 3,
            last: "no reply within 2s".into(),
        };
        assert_eq!(e.step(), "choria_provision#jwt");
        assert_eq!(
            e.to_string(),
            "choria_provision#jwt failed after 3 tries: no reply within 2s"
        );
        assert!(ProvisionError::Paused(Paused("x".into())).is_pause());
    }
}
