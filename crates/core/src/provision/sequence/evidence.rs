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
        let instance = evidence.instance();
        match gate.bind(&evidence, &self.identity, now).await {
            Ok(None | Some(Bound::New | Bound::Same)) => {}
            Ok(Some(Bound::ReplacedForgery)) => {
                metrics.evidence("forged_binding");
                warn!(node = &*self.identity, instance = %instance, "SECURITY: the instance's binding was not sealed by this Provisioner; replaced by this node's");
            }
            Ok(Some(Bound::Other(bound))) => {
                metrics.evidence("bound_elsewhere");
                return Err(ProvisionError::InstanceBound {
                    instance,
                    identity: crate::provision::text::one_line(&bound, 200),
                });
            }
            // Not known is not "unbound": the node is refused, and tried again.
            Err(e) => {
                metrics.evidence("error");
                metrics.memory_read_error("bindings");
                return Err(ProvisionError::BindingsUnknown(e.to_string()));
            }
        }
        metrics.evidence("verified");
        info!(node = &*self.identity, instance = %instance, "instance identity evidence verified");
        Ok(Some(evidence))
    }
}
