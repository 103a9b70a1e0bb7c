//! The PodDisruptionBudget: one replica kept through voluntary disruptions.

use super::*;

/// The PDB's `unhealthyPodEvictionPolicy`: pods that are not Ready may be
/// evicted whatever the budget. With the broker down every provisioner pod
/// is NotReady (its `/readyz` fails), and under the default
/// (`IfHealthyBudget`) no pod could then be evicted: node drains would hang
/// for as long as the broker is away.
pub const UNHEALTHY_POD_EVICTION_POLICY: &str = "AlwaysAllow";

/// Keeps one ready replica through voluntary disruptions; `None` below two
/// replicas, where it would block node drains.
pub fn pdb(p: &Provisioner) -> Result<Option<PodDisruptionBudget>, BuildError> {
    if p.spec.replicas < 2 {
        return Ok(None);
    }
    let name = p.name_any();
    Ok(Some(PodDisruptionBudget {
        metadata: meta(p, name.clone())?,
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            unhealthy_pod_eviction_policy: Some(UNHEALTHY_POD_EVICTION_POLICY.into()),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}
