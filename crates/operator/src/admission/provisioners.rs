//! The policy bounding Provisioners at the API server: `spec.pod` may only
//! name a PriorityClass the admin allows (`--allowed-priority-class`) and
//! use the volume types the admin allows (`--allowed-volume-type`). The
//! CRD's own rules hold everything that does not depend on the admin.
//!
//! What was already stored is let by unchanged (a priority class or volume
//! equal to the old object's), so tightening the policy does not block
//! every later edit of a Provisioner, such as a pause or a label: the
//! operator refuses such a Provisioner (`Degraded`, `NotAllowed`) until it
//! is fixed.

use super::{cel, glob_regex, policy_and_binding, writes_of, Policy};
use choria_k8s::crd::{VolumeType, GROUP};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicySpec,
    Validation,
};

/// An update of a Provisioner that had `spec.pod`.
const UPDATE_WITH_POD: &str = "request.operation == 'UPDATE' && has(oldObject.spec.pod)";

/// The policy and its binding, for the admin's `policy`; `namespace`: only
/// there (an operator watching one namespace).
pub(super) fn provisioner_policy(
    name: &str,
    policy: &Policy,
    namespace: Option<&str>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let spec = ValidatingAdmissionPolicySpec {
        // Fail: it matches Provisioners only, so an error can block no one
        // else, and Ignore would let a spec by unchecked. Its checks are
        // written so they cannot fail to evaluate.
        failure_policy: Some("Fail".into()),
        match_constraints: Some(writes_of(GROUP, "provisioners")),
        validations: Some(validations(policy)),
        ..Default::default()
    };
    policy_and_binding(name, spec, None, namespace)
}

fn validations(policy: &Policy) -> Vec<Validation> {
    let check = |expression: String, message: String| Validation {
        expression,
        message: Some(message),
        reason: Some("Forbidden".into()),
        message_expression: None,
    };
    let mut all = vec![check(
        priority_class(policy),
        format!(
            "spec.pod.priorityClassName must be a PriorityClass the cluster admin lets Provisioners use (--allowed-priority-class): {}",
            allowed_priority_classes(policy)
        ),
    )];
    if let Some(expression) = volume_types(policy) {
        all.push(check(
            expression,
            format!(
                "spec.pod.volumes may only use the volume types the cluster admin allows (--allowed-volume-type): {}",
                policy.allowed_volume_types()
            ),
        ));
    }
    all
}

fn allowed_priority_classes(policy: &Policy) -> String {
    if policy.priority_classes.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = policy
        .priority_classes
        .iter()
        .map(|p| p.to_string())
        .collect();
    names.join(", ")
}

/// Unset, allowed, or as it was.
fn priority_class(policy: &Policy) -> String {
    let field = "object.spec.pod.priorityClassName";
    let allowed = policy
        .priority_classes
        .iter()
        .map(|p| format!("{field}.matches({})", cel(&glob_regex(&p.to_string()))))
        .collect::<Vec<_>>();
    let allowed = if allowed.is_empty() {
        "false".to_string()
    } else {
        allowed.join(" || ")
    };
    format!(
        "!has(object.spec.pod) || !has({field}) || {allowed} \
         || ({UPDATE_WITH_POD} && has(oldObject.spec.pod.priorityClassName) && oldObject.spec.pod.priorityClassName == {field})"
    )
}

/// Every volume of an allowed type, or as it was; `None` when every type
/// is allowed.
fn volume_types(policy: &Policy) -> Option<String> {
    let refused: Vec<String> = VolumeType::ALL
        .into_iter()
        .filter(|t| !policy.volume_types.contains(t))
        .map(|t| format!("!has(v.{t})"))
        .collect();
    if refused.is_empty() {
        return None;
    }
    Some(format!(
        "!has(object.spec.pod) || !has(object.spec.pod.volumes) || object.spec.pod.volumes.all(v, ({}) \
         || ({UPDATE_WITH_POD} && has(oldObject.spec.pod.volumes) && v in oldObject.spec.pod.volumes))",
        refused.join(" && ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Pattern;

    #[test]
    fn the_policy_bounds_priority_classes_and_volume_types_of_provisioners() {
        let mut policy = Policy::new("img");
        let (vap, binding) = provisioner_policy("p", &policy, None);
        let spec = vap.spec.unwrap();
        assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
        assert!(spec.param_kind.is_none());
        let rules = spec.match_constraints.unwrap().resource_rules.unwrap();
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["provisioners".to_string()][..])
        );
        let v = spec.validations.unwrap();
        assert_eq!(v.len(), 2);
        assert!(
            v[0].expression.contains(" || false || ("),
            "{}",
            v[0].expression
        );
        assert!(v[0]
            .message
            .as_ref()
            .unwrap()
            .ends_with("(--allowed-priority-class): none"));
        assert!(
            v[1].expression
                .contains("(!has(v.persistentVolumeClaim)) ||"),
            "{}",
            v[1].expression
        );
        let b = binding.spec.unwrap();
        assert!(b.param_ref.is_none() && b.match_resources.is_none());
        assert_eq!(b.validation_actions.unwrap(), ["Deny"]);

        policy.priority_classes = vec![Pattern::new("choria-*")];
        policy.volume_types = VolumeType::ALL.to_vec();
        let (vap, binding) = provisioner_policy("p", &policy, Some("ns1"));
        let v = vap.spec.unwrap().validations.unwrap();
        assert_eq!(v.len(), 1, "every volume type allowed: nothing to check");
        assert!(
            v[0].expression.contains(".matches('^choria-.*$')"),
            "{}",
            v[0].expression
        );
        assert!(
            serde_json::to_string(&binding.spec.unwrap().match_resources)
                .unwrap()
                .contains("ns1")
        );
    }
}
