//! The PodDisruptionBudget: what voluntary disruptions (drains, evictions)
//! may take at once.

use super::*;

/// The PDB's `unhealthyPodEvictionPolicy`: pods that are not Ready may be
/// evicted whatever the budget. With the broker down every provisioner pod
/// is NotReady (its `/readyz` fails), and under the default
/// (`IfHealthyBudget`) no pod could then be evicted: node drains would hang
/// for as long as the broker is away.
pub const UNHEALTHY_POD_EVICTION_POLICY: &str = "AlwaysAllow";

/// `None` below two replicas, where it would block node drains. Otherwise:
///
/// * leader mode: one ready replica is kept (`minAvailable: 1`); the
///   others are standbys, any of them may go;
/// * shards mode: one replica goes at a time (`maxUnavailable: 1`). Every
///   replica works; a member that leaves costs only its share's in-flight
///   nodes and moves only its share, so one at a time keeps the rest of
///   the fleet where it was and the throughput of all but one replica.
pub fn pdb(p: &Provisioner) -> Result<Option<PodDisruptionBudget>, BuildError> {
    if p.spec.replicas < 2 {
        return Ok(None);
    }
    let (min_available, max_unavailable) = match p.spec.election.mode {
        ElectionMode::Leader => (Some(IntOrString::Int(1)), None),
        ElectionMode::Shards => (None, Some(IntOrString::Int(1))),
    };
    let name = p.name_any();
    Ok(Some(PodDisruptionBudget {
        metadata: meta(p, name.clone())?,
        spec: Some(PodDisruptionBudgetSpec {
            min_available,
            max_unavailable,
            unhealthy_pod_eviction_policy: Some(UNHEALTHY_POD_EVICTION_POLICY.into()),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
        }),
        status: None,
    }))
}
