//! The admission policy's decision for the node, once everything it told us
//! is in and every reply window was read, and before the template, the
//! helper or any signer sees it.

use super::{HostSequence, ProvisionError};
use crate::admission::input::NodeInput;
use crate::admission::Decision;
use tracing::warn;

/// How long a sequence waits for the revocations to be read once before it
/// refuses its node (retried later like any failure).
const REVOCATIONS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl HostSequence {
    /// Refuses a revoked identity (with `records:`), and every identity
    /// until the revocations were read once: a revocation holds from a
    /// replica's first node on.
    pub(super) async fn check_revoked(&self) -> Result<(), ProvisionError> {
        let Some(revoked) = &self.ctx.checks.revoked else {
            return Ok(());
        };
        let loaded = tokio::select! {
            l = revoked.wait_loaded(REVOCATIONS_WAIT) => l,
            _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
        };
        if !loaded {
            return Err(ProvisionError::RevocationsUnknown);
        }
        if let Some(r) = revoked.of(&self.identity) {
            self.ctx.metrics.revoked_refusal("provision");
            return Err(ProvisionError::Revoked {
                reason: crate::provision::text::one_line(&r.reason, 200),
            });
        }
        self.check_held().await
    }

    /// A node back while it holds valid credentials renewal did not ask it
    /// to replace: flagged (metric, audit, log), and refused with
    /// `records.exclusive`.
    async fn check_held(&self) -> Result<(), ProvisionError> {
        if let Some(held) = &self.ctx.checks.held {
            let loaded = tokio::select! {
                l = held.wait_loaded(REVOCATIONS_WAIT) => l,
                _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
            };
            if !loaded {
                return Err(ProvisionError::RevocationsUnknown);
            }
        }
        let now = chrono::Utc::now().timestamp();
        let Some(standing) = self.standing() else {
            return Ok(());
        };
        if !standing.holds_unasked(now) {
            return Ok(());
        }
        let exclusive = self.ctx.cfg.records.as_ref().is_some_and(|r| r.exclusive);
        let outcome = if exclusive { "refused" } else { "flagged" };
        self.ctx.metrics.held_reprovision(outcome);
        let expires = chrono::DateTime::from_timestamp(standing.expires_unix, 0)
            .map(|t| t.to_rfc3339())
            .unwrap_or_default();
        // Audited either way: refused or let through, someone arrived under
        // a name whose credentials are still good.
        self.ctx.trail.auditor.event(
            crate::audit::event::Kind::Held,
            &self.identity,
            serde_json::json!({"step": "records", "outcome": outcome, "reason": format!("still held valid credentials, expiring {expires}")}),
        );
        if exclusive {
            return Err(ProvisionError::HeldElsewhere { expires });
        }
        warn!(node = &*self.identity, credentials_expire = %expires, "SECURITY: provisioning a node that still holds valid credentials renewal did not ask it to replace: a reinstalled node, or someone else answering under its name (records.exclusive refuses these)");
        Ok(())
    }

    /// What the records say this identity holds, if anything.
    pub(super) fn standing(&self) -> Option<crate::held::Standing> {
        self.ctx.checks.held.as_ref()?.of(&self.identity)
    }

    /// Passes when there is no policy or it allows the node; a denial, a
    /// deferral and a policy that cannot be evaluated all stop the node
    /// here (counted by decision).
    pub(super) async fn admit(
        &self,
        evidence: Option<&crate::evidence::Evidence>,
    ) -> Result<(), ProvisionError> {
        let Some(policy) = &self.ctx.checks.admission else {
            return Ok(());
        };
        let protocol = self.client.version().to_string();
        let input = NodeInput {
            identity: &self.identity,
            protocol: &protocol,
            site: &self.ctx.cfg.site,
            inventory: &self.got.inventory,
            csr: self.got.csr.as_ref().map(|c| c.csr.as_str()),
            jwt: self.got.jwt.as_ref(),
            ed25519_public_key: self.got.ed25519.as_ref().map(|e| e.public_key.as_str()),
            record: self.standing(),
            evidence,
        };
        let decision = match input.value() {
            Ok(doc) => policy.decide(doc).await,
            Err(e) => Err(e),
        };
        let metrics = &self.ctx.metrics;
        match decision {
            Ok(Decision::Allowed) => {
                metrics.admission("allowed");
                self.step("admitted by the admission policy");
                Ok(())
            }
            Ok(Decision::Denied(reason)) => {
                metrics.admission("denied");
                Err(ProvisionError::PolicyDenied(reason))
            }
            Ok(Decision::Deferred(reason)) => {
                metrics.admission("deferred");
                Err(ProvisionError::PolicyDeferred(reason))
            }
            Err(e) => {
                metrics.admission("error");
                warn!(node = &*self.identity, error = %e, "the admission policy failed; refusing the node");
                Err(ProvisionError::Policy(e))
            }
        }
    }
}
