//! The node's cloud instance identity evidence (`evidence:`), checked once
//! everything it told us is in and before the admission policy, which reads
//! what it says as `input.evidence`.

use super::{HostSequence, ProvisionError};
use crate::evidence::bindings::Bound;
use crate::evidence::Evidence;
use tracing::{info, warn};

impl HostSequence {
    /// The verified evidence, bound to this identity; `None` without
    /// `evidence:`. Every refusal is counted by why
    /// (`choria_provisioner_evidence{outcome}`).
    pub(super) async fn check_evidence(&self) -> Result<Option<Evidence>, ProvisionError> {
        let Some(gate) = &self.shared.evidence else {
            return Ok(None);
        };
        let metrics = &self.shared.metrics;
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
        // Bound to another name already: refused before the policy. The
        // binding itself is written only once the node was admitted
        // ([`HostSequence::bind_evidence`]): a copy of the document under a
        // name the policy denies must not bind the instance to it.
        let instance = evidence.instance();
        match gate.check(&evidence, &self.identity).await {
            Ok(Some(bound)) => self.judge_binding(&instance, bound)?,
            Ok(None) => {}
            Err(e) => return Err(self.bindings_unknown(e)),
        }
        metrics.evidence("verified");
        info!(node = &*self.identity, instance = %instance, "instance identity evidence verified");
        Ok(Some(evidence))
    }

    /// Binds the verified instance to this identity, once the node passed
    /// every check and the admission policy, before anything is signed.
    pub(super) async fn bind_evidence(
        &self,
        evidence: Option<&Evidence>,
    ) -> Result<(), ProvisionError> {
        let (Some(gate), Some(evidence)) = (&self.shared.evidence, evidence) else {
            return Ok(());
        };
        let now = chrono::Utc::now().timestamp();
        match gate.bind(evidence, &self.identity, now).await {
            Ok(Some(bound)) => self.judge_binding(&evidence.instance(), bound),
            Ok(None) => Ok(()),
            Err(e) => Err(self.bindings_unknown(e)),
        }
    }

    /// What a binding found, counted: bound elsewhere refuses the node.
    fn judge_binding(&self, instance: &str, bound: Bound) -> Result<(), ProvisionError> {
        let metrics = &self.shared.metrics;
        match bound {
            Bound::New | Bound::Same => Ok(()),
            Bound::ReplacedForgery => {
                metrics.evidence("forged_binding");
                warn!(node = &*self.identity, instance = %instance, "SECURITY: the instance's binding was not sealed by this Provisioner; ours is written after it");
                Ok(())
            }
            Bound::Other(bound) => {
                metrics.evidence("bound_elsewhere");
                Err(ProvisionError::InstanceBound {
                    instance: instance.to_string(),
                    identity: crate::provision::text::one_line(&bound, 200),
                })
            }
        }
    }

    /// Not known is not "unbound": the node is refused, and tried again.
    fn bindings_unknown(&self, e: crate::records::store::RecordsError) -> ProvisionError {
        self.shared.metrics.evidence("error");
        self.shared.metrics.memory_read_error("bindings");
        ProvisionError::BindingsUnknown(e.to_string())
    }
}
