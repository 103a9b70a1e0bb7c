//! The node's cloud instance identity evidence (`evidence:`), checked once
//! everything it told us is in and before the admission policy, which reads
//! what it says as `input.evidence`.

use super::{HostSequence, ProvisionError};
use crate::evidence::{Evidence, Verdict};
use tracing::{info, warn};

impl HostSequence {
    /// The verified evidence, bound to this identity; `None` without
    /// `evidence:`. Every refusal is counted by why
    /// (`choria_provisioner_evidence{outcome}`).
    pub(super) async fn check_evidence(&self) -> Result<Option<Evidence>, ProvisionError> {
        let Some(gate) = &self.ctx.checks.evidence else {
            return Ok(None);
        };
        let metrics = &self.ctx.metrics;
        let now = chrono::Utc::now().timestamp();
        let facts: serde_json::Value =
            serde_json::from_str::<serde_json::Value>(&self.got.inventory)
                .ok()
                .and_then(|inv| inv.get("facts").cloned())
                .unwrap_or_default();
        let evidence = gate
            .verifier
            .verify(&self.identity, &facts, now)
            .map_err(|e| {
                metrics.evidence(e.label());
                ProvisionError::Evidence(e)
            })?;
        // Bound otherwise already: refused before the policy. The binding
        // itself is written only once the node was admitted
        // ([`HostSequence::bind_evidence`]): a copy of the document under a
        // name the policy denies must not bind the instance to it.
        match gate.check(&evidence, &self.identity).await {
            Ok(verdict) => {
                self.judge_binding(&evidence, verdict, now)?;
            }
            Err(e) => return Err(self.bindings_unknown(e)),
        }
        metrics.evidence("verified");
        info!(node = &*self.identity, instance = %evidence.instance(), "instance identity evidence verified");
        Ok(Some(evidence))
    }

    /// Binds the verified instance and this identity to each other, once
    /// the node passed every check and the admission policy, before
    /// anything is signed.
    pub(super) async fn bind_evidence(
        &self,
        evidence: Option<&Evidence>,
    ) -> Result<(), ProvisionError> {
        let (Some(gate), Some(evidence)) = (&self.ctx.checks.evidence, evidence) else {
            return Ok(());
        };
        let now = chrono::Utc::now().timestamp();
        let verdict = gate
            .check(evidence, &self.identity)
            .await
            .map_err(|e| self.bindings_unknown(e))?;
        let take_name = self.judge_binding(evidence, verdict, now)?;
        match gate.bind(evidence, &self.identity, take_name, now).await {
            Ok(Ok(written)) => {
                if written.forgery_replaced {
                    self.ctx.metrics.evidence("forged_binding");
                    warn!(node = &*self.identity, instance = %evidence.instance(), "SECURITY: a binding of the instance or the name was not sealed by this Provisioner; ours is written after it");
                }
                Ok(())
            }
            // Another replica bound one of them meanwhile.
            Ok(Err(verdict)) => self.judge_binding(evidence, verdict, now).map(|_| ()),
            Err(e) => Err(self.bindings_unknown(e)),
        }
    }

    /// What the bindings' verdict means for this node: refused (counted
    /// `bound_elsewhere`), or fine — `true` when its name may move to this
    /// instance (`rebind_after_expiry`, and the credentials on record for
    /// the name expired).
    fn judge_binding(
        &self,
        evidence: &Evidence,
        verdict: Verdict,
        now: i64,
    ) -> Result<bool, ProvisionError> {
        let instance = evidence.instance();
        match verdict {
            Verdict::Fits => Ok(false),
            Verdict::InstanceElsewhere(bound) => {
                self.ctx.metrics.evidence("bound_elsewhere");
                Err(ProvisionError::InstanceBound {
                    instance,
                    identity: crate::provision::text::one_line(&bound, 200),
                })
            }
            Verdict::NameElsewhere(other) if self.may_take_name(now) => {
                warn!(node = &*self.identity, from = %other, to = %instance, "the name moves to a new instance: its credentials on record expired (evidence.rebind_after_expiry)");
                Ok(true)
            }
            Verdict::NameElsewhere(other) => {
                self.ctx.metrics.evidence("bound_elsewhere");
                warn!(node = &*self.identity, bound = %other, presented = %instance, "SECURITY: the name was provisioned from another instance; refusing evidence of this one under it");
                Err(ProvisionError::NameBound {
                    instance: crate::provision::text::one_line(&other, 200),
                })
            }
        }
    }

    /// With `rebind_after_expiry`: whether what the name holds on record
    /// expired (or nothing is on record for it).
    fn may_take_name(&self, now: i64) -> bool {
        let allowed = self
            .ctx
            .cfg
            .evidence
            .as_ref()
            .is_some_and(|e| e.rebind_after_expiry);
        allowed && self.standing().is_none_or(|s| s.expires_unix <= now)
    }

    /// Not known is not "unbound": the node is refused, and tried again.
    fn bindings_unknown(&self, e: crate::records::store::RecordsError) -> ProvisionError {
        self.ctx.metrics.evidence("error");
        self.ctx.metrics.memory_read_error("bindings");
        ProvisionError::BindingsUnknown(e.to_string())
    }
}
