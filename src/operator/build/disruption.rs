//! The PodDisruptionBudget: one replica kept through voluntary disruptions.

use super::*;

/// Keeps one replica through voluntary disruptions; `None` below two
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
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(&name)),
                match_expressions: None,
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }))
}
