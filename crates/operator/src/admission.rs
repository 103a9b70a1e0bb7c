//! What a Provisioner's pods may ask cert-manager for, bounded at the API
//! server: a ValidatingAdmissionPolicy and its binding, applied by the
//! operator when it starts leading.
//!
//! The operator's policy ([`super::policy`]) bounds the spec, but a pod runs
//! a helper the Provisioner's creator chose, and anything in the pod can
//! read its ServiceAccount token and create CertificateRequests with it —
//! for any issuer, any usage, `isCA: true`. The policy admits a
//! CertificateRequest made by a Provisioner's ServiceAccount only when it
//! names that Provisioner's own issuer, an issuer the cluster admin allows
//! (`--allowed-cluster-issuer`; a namespaced `Issuer` otherwise), only
//! usages both the spec and the admin allow (`--allowed-usage`), and never
//! `isCA`. It takes each Provisioner of the request's namespace as its
//! parameter (a Provisioner's ServiceAccount is named after it), so one
//! policy serves them all; requests by anyone else are left alone.
//!
//! A second policy ([`provisioners`]) bounds the Provisioners themselves:
//! what of `spec.pod` depends on the admin's choice (priority classes,
//! volume types) is refused when the Provisioner is written, not only
//! reported by the operator once it is stored.
//!
//! Needs Kubernetes 1.30 (admissionregistration.k8s.io/v1).

mod provisioners;

use super::policy::{Policy, CERT_MANAGER_GROUP};
use choria_config::provisioner::DEFAULT_CERT_MANAGER_USAGES;
use choria_k8s::crd::{API_VERSION, KIND};
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use std::collections::BTreeMap;

/// The policy's (and its binding's) name unless the operator is told
/// another (`--admission-policy`).
pub const DEFAULT_POLICY_NAME: &str = "choria-provisioner-certificaterequests";
/// The name of the policy (and binding) bounding Provisioners unless the
/// operator is told another (`--provisioner-admission-policy`).
pub const DEFAULT_PROVISIONER_POLICY_NAME: &str = "choria-provisioner-provisioners";

/// What an admission policy of the operator bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bounded {
    /// The CertificateRequests a Provisioner's pods make.
    CertificateRequests,
    /// The Provisioners' `spec.pod`.
    Provisioners,
}

impl Bounded {
    /// The flag that names its policy.
    pub fn flag(self) -> &'static str {
        match self {
            Bounded::CertificateRequests => "--admission-policy",
            Bounded::Provisioners => "--provisioner-admission-policy",
        }
    }

    /// What it bounds, for the log.
    pub fn what(self) -> &'static str {
        match self {
            Bounded::CertificateRequests => "the CertificateRequests of Provisioner pods",
            Bounded::Provisioners => {
                "the priority classes and volume types of Provisioners' spec.pod"
            }
        }
    }

    /// What goes unbounded without it, for the log.
    pub fn without(self) -> &'static str {
        match self {
            Bounded::CertificateRequests => {
                "a Provisioner's pods may ask cert-manager for any issuer, usage or a CA certificate"
            }
            Bounded::Provisioners => {
                "a Provisioner asking for a priority class or volume type the policy does not allow is stored, and only refused by the operator"
            }
        }
    }

    /// The policy and its binding named `name`.
    pub fn objects(
        self,
        name: &str,
        policy: &Policy,
        namespace: Option<&str>,
    ) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
        match self {
            Bounded::CertificateRequests => certificate_request_policy(name, policy, namespace),
            Bounded::Provisioners => provisioners::provisioner_policy(name, policy, namespace),
        }
    }
}

/// A CEL string literal.
fn cel(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A CEL list of string literals.
fn cel_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(cel).collect();
    format!("[{}]", items.join(", "))
}

/// An anchored RE2 expression for a `*` glob.
fn glob_regex(glob: &str) -> String {
    let mut out = String::from("^");
    for c in glob.chars() {
        match c {
            '*' => out.push_str(".*"),
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => out.push(c),
            c => {
                out.push('\\');
                out.push(c);
            }
        }
    }
    out.push('$');
    out
}

/// What the object's issuerRef resolves to, with cert-manager's defaults.
const ISSUER_KIND: &str = "has(object.spec.issuerRef.kind) && object.spec.issuerRef.kind != '' ? object.spec.issuerRef.kind : 'Issuer'";
const ISSUER_GROUP: &str = "has(object.spec.issuerRef.group) && object.spec.issuerRef.group != '' ? object.spec.issuerRef.group : 'cert-manager.io'";

/// The policy and its binding, for the admin's `policy`; `namespace`: only
/// there (an operator watching one namespace).
pub fn certificate_request_policy(
    name: &str,
    policy: &Policy,
    namespace: Option<&str>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    // Every Provisioner of the request's namespace is a parameter; a
    // namespace without one has no Provisioner ServiceAccounts.
    let params = ParamRef {
        selector: Some(LabelSelector::default()),
        parameter_not_found_action: Some("Allow".into()),
        ..Default::default()
    };
    policy_and_binding(name, policy_spec(policy), Some(params), namespace)
}

/// What a policy matches: creates and updates of `resource` in `group`,
/// in any version.
fn writes_of(group: &str, resource: &str) -> MatchResources {
    MatchResources {
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: Some(vec![group.into()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(vec![resource.into()]),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// A policy named `name` and its binding, labelled as the operator's.
fn policy_and_binding(
    name: &str,
    spec: ValidatingAdmissionPolicySpec,
    params: Option<ParamRef>,
    namespace: Option<&str>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let meta = ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([(
            super::build::MANAGED_BY_LABEL.to_string(),
            super::build::MANAGED_BY.to_string(),
        )])),
        ..Default::default()
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: meta.clone(),
        spec: Some(binding_spec(name, params, namespace)),
    };
    (
        ValidatingAdmissionPolicy {
            metadata: meta,
            spec: Some(spec),
            status: None,
        },
        binding,
    )
}

/// What the policy matches (CertificateRequests made by ServiceAccounts),
/// its parameter (the Provisioners) and its checks.
fn policy_spec(policy: &Policy) -> ValidatingAdmissionPolicySpec {
    let var = |name: &str, expression: &str| Variable {
        name: name.into(),
        expression: expression.into(),
    };
    ValidatingAdmissionPolicySpec {
        // Ignore, not Fail: with the Provisioner CRD gone (its parameter
        // kind) a failing policy would deny every CertificateRequest of every
        // ServiceAccount in the cluster, cert-manager's own included. The
        // checks below are written so they cannot fail to evaluate.
        failure_policy: Some("Ignore".into()),
        param_kind: Some(ParamKind {
            api_version: Some(API_VERSION.into()),
            kind: Some(KIND.into()),
        }),
        match_constraints: Some(writes_of(CERT_MANAGER_GROUP, "certificaterequests")),
        match_conditions: Some(vec![MatchCondition {
            name: "service-accounts".into(),
            expression: "request.userInfo.username.startsWith('system:serviceaccount:')".into(),
        }]),
        variables: Some(vec![
            // A Provisioner's pods run as the ServiceAccount of its name.
            var(
                "mine",
                "request.userInfo.username == 'system:serviceaccount:' + params.metadata.namespace + ':' + params.metadata.name",
            ),
            var("kind", ISSUER_KIND),
            var("group", ISSUER_GROUP),
            // No usages asks for the issuer's (cert-manager's) defaults.
            var(
                "usages",
                "has(object.spec.usages) && size(object.spec.usages) > 0 ? object.spec.usages : ['digital signature', 'key encipherment']",
            ),
        ]),
        validations: Some(validations(policy)),
        ..Default::default()
    }
}

/// The checks, each passing anyone but the parameter Provisioner's own
/// ServiceAccount (`variables.mine`).
fn validations(policy: &Policy) -> Vec<Validation> {
    let check = |expression: String, message: &str| Validation {
        expression: format!("!variables.mine || ({expression})"),
        message_expression: Some(format!(
            "'CertificateRequests of Provisioner ' + params.metadata.name + ' ' + {}",
            cel(message)
        )),
        reason: Some("Forbidden".into()),
        message: None,
    };
    let spec_cm = "params.spec.pki.certManager";
    let has_cm = "has(params.spec.pki) && has(params.spec.pki.certManager)";
    let spec_usages = format!(
        "has({spec_cm}.usages) && size({spec_cm}.usages) > 0 ? {spec_cm}.usages : {}",
        cel_list(DEFAULT_CERT_MANAGER_USAGES)
    );
    vec![
        check(
            "!has(object.spec.isCA) || object.spec.isCA == false".into(),
            "may not ask for a CA certificate (isCA)",
        ),
        check(
            format!(
                "{has_cm} && object.spec.issuerRef.name == {spec_cm}.issuerRef.name \
                 && variables.kind == (has({spec_cm}.issuerRef.kind) && {spec_cm}.issuerRef.kind != '' ? {spec_cm}.issuerRef.kind : 'Issuer') \
                 && variables.group == (has({spec_cm}.issuerRef.group) && {spec_cm}.issuerRef.group != '' ? {spec_cm}.issuerRef.group : 'cert-manager.io')"
            ),
            "may only name the issuer of its spec.pki.certManager.issuerRef",
        ),
        check(
            admin_issuer(policy),
            "may only name an Issuer in its namespace or an issuer the cluster admin allows (--allowed-cluster-issuer)",
        ),
        check(
            format!(
                "variables.usages.all(u, u in {}) && (!({has_cm}) || variables.usages.all(u, u in ({spec_usages})))",
                cel_list(policy.usages.iter().map(String::as_str))
            ),
            "may only ask for the key usages its spec and the cluster admin allow (--allowed-usage)",
        ),
    ]
}

/// Whether the request's issuer is one the admin allows: a namespaced
/// Issuer, or one matching `--allowed-cluster-issuer`.
fn admin_issuer(policy: &Policy) -> String {
    let allowed_issuers = policy.cluster_issuers.iter().map(|p| {
        let (kind, group, name) = p.parts();
        format!(
            "(variables.kind == {} && variables.group == {} && object.spec.issuerRef.name.matches({}))",
            cel(kind),
            cel(group),
            cel(&glob_regex(name))
        )
    });
    std::iter::once(format!(
        "(variables.kind == 'Issuer' && variables.group == {})",
        cel(CERT_MANAGER_GROUP)
    ))
    .chain(allowed_issuers)
    .collect::<Vec<_>>()
    .join(" || ")
}

/// The binding: denying, with `params`, in `namespace` only when given.
fn binding_spec(
    name: &str,
    params: Option<ParamRef>,
    namespace: Option<&str>,
) -> ValidatingAdmissionPolicyBindingSpec {
    ValidatingAdmissionPolicyBindingSpec {
        policy_name: Some(name.into()),
        param_ref: params,
        match_resources: namespace.map(|ns| MatchResources {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_string(),
                    ns.to_string(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        validation_actions: Some(vec!["Deny".into()]),
    }
}

/// Applies the policy of `bounded` and its binding (server-side, forced:
/// they are the operator's), the policy first; one that already carries
/// the hash of what it would apply is left alone, so a restarted operator
/// writes nothing.
pub async fn apply(
    client: &kube::Client,
    bounded: Bounded,
    name: &str,
    policy: &Policy,
    namespace: Option<&str>,
) -> Result<(), kube::Error> {
    let (vap, binding) = bounded.objects(name, policy, namespace);
    apply_one(client, name, &vap).await?;
    apply_one(client, name, &binding).await
}

async fn apply_one<K>(client: &kube::Client, name: &str, obj: &K) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
{
    use kube::api::{Api, Patch, PatchParams};
    use sha2::{Digest, Sha256};
    let mut body = typed(obj);
    let hash = hex::encode(Sha256::digest(body.to_string().as_bytes()));
    body["metadata"]["annotations"][super::reconcile::APPLIED_ANNOTATION] = hash.clone().into();
    let api = Api::<K>::all(client.clone());
    let current = api.get_opt(name).await?;
    let applied = current
        .as_ref()
        .and_then(|c| c.meta().annotations.as_ref())
        .and_then(|a| a.get(super::reconcile::APPLIED_ANNOTATION));
    if applied == Some(&hash) {
        return Ok(());
    }
    let params = PatchParams::apply(super::FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(body)).await?;
    Ok(())
}

/// The object with its apiVersion and kind, as server-side apply wants it.
fn typed<K: kube::Resource<DynamicType = ()> + serde::Serialize>(obj: &K) -> serde_json::Value {
    let mut v = serde_json::to_value(obj).expect("built objects serialize");
    v["apiVersion"] = K::api_version(&()).into();
    v["kind"] = K::kind(&()).into();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_become_anchored_expressions_and_strings_are_quoted() {
        assert_eq!(glob_regex("ca-*"), "^ca-.*$");
        assert_eq!(glob_regex("a.b"), "^a\\.b$");
        assert_eq!(cel("it's"), "'it\\'s'");
        assert_eq!(cel_list(["a", "b"]), "['a', 'b']");
    }

    #[test]
    fn the_policy_bounds_issuers_usages_and_is_ca_for_provisioner_service_accounts_only() {
        let mut policy = Policy::new("img");
        policy.cluster_issuers = vec!["fleet-*".parse().unwrap()];
        let (vap, binding) = certificate_request_policy(DEFAULT_POLICY_NAME, &policy, Some("ns1"));
        let spec = vap.spec.unwrap();
        let text = serde_json::to_string(&spec).unwrap();
        assert!(text.contains("isCA"), "{text}");
        assert!(text.contains("^fleet-.*$"), "{text}");
        assert!(text.contains("'client auth'"), "{text}");
        assert_eq!(
            spec.param_kind.unwrap().kind.as_deref(),
            Some("Provisioner")
        );
        assert_eq!(spec.failure_policy.as_deref(), Some("Ignore"));
        // Every check lets everyone but the Provisioner's own account by.
        for v in spec.validations.unwrap() {
            assert!(
                v.expression.starts_with("!variables.mine || ("),
                "{}",
                v.expression
            );
        }
        let b = binding.spec.unwrap();
        assert_eq!(b.validation_actions.unwrap(), ["Deny"]);
        assert_eq!(b.policy_name.as_deref(), Some(DEFAULT_POLICY_NAME));
        assert!(serde_json::to_string(&b.match_resources)
            .unwrap()
            .contains("ns1"));
    }
}
