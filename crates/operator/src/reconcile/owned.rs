//! The owned objects against what is there: read from the controller's
//! reflector stores (no GET while an object is known), written only where
//! they differ.
//!
//! An object needs an apply when it is missing, when its
//! [`APPLIED_ANNOTATION`] does not carry the hash of what we would apply now
//! (our desired state changed, which also catches fields we stopped
//! setting), or when one of the fields we set differs (someone edited it: the
//! apply, forced, puts it back). Anything else is left alone, so an unchanged
//! Provisioner costs the API server no write at all.

use super::{api_error, Error};
use crate::build::{Owned, MANAGED_BY, MANAGED_BY_LABEL};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The hash of the state last applied, on every owned object.
pub const APPLIED_ANNOTATION: &str = "provisioning.choria.io/applied";

/// The controller's caches of what the operator owns (the objects with its
/// label), kept current by its watches.
#[derive(Clone)]
pub struct Stores {
    pub service_accounts: Store<ServiceAccount>,
    pub roles: Store<Role>,
    pub role_bindings: Store<RoleBinding>,
    pub config_maps: Store<ConfigMap>,
    pub services: Store<Service>,
    pub deployments: Store<Deployment>,
    pub pdbs: Store<PodDisruptionBudget>,
}

impl Stores {
    /// Until every watch has listed once, an object missing from a store
    /// may only be not listed yet.
    pub async fn ready(&self) {
        // A store whose writer is gone (the controller is stopping) is as
        // ready as it will get.
        let _ = futures::join!(
            self.service_accounts.wait_until_ready(),
            self.roles.wait_until_ready(),
            self.role_bindings.wait_until_ready(),
            self.config_maps.wait_until_ready(),
            self.services.wait_until_ready(),
            self.deployments.wait_until_ready(),
            self.pdbs.wait_until_ready(),
        );
    }

    /// The Deployment `name`, as last seen.
    pub fn deployment(&self, ns: &str, name: &str) -> Option<Deployment> {
        self.deployments
            .get(&ObjectRef::new(name).within(ns))
            .map(|d| (*d).clone())
    }

    /// Our PodDisruptionBudget `name`, when the store has one.
    fn our_pdb(&self, ns: &str, name: &str, uid: &str) -> bool {
        PodDisruptionBudget::cached(self, ns, name).is_some_and(|o| owned_by(&o, uid))
    }
}

/// A kind of object the operator owns: the controller watches it (by our
/// label) into its store in [`Stores`], and a [`Desired`] object of the kind
/// is compared with what that store holds. The bounds are what a watch, a
/// store and the comparison need.
pub trait OwnedKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The store the controller's watch of this kind fills.
    fn store(stores: &Stores) -> &Store<Self>;

    /// The object `ns/name` as the watch last saw it, as JSON: compared
    /// field by field with the desired one (see [`up_to_date`]).
    fn cached(stores: &Stores, ns: &str, name: &str) -> Option<Value> {
        Self::store(stores)
            .get(&ObjectRef::new(name).within(ns))
            .and_then(|o| serde_json::to_value(&*o).ok())
    }
}

/// Ties each owned kind to its field of [`Stores`].
macro_rules! owned_kinds {
    ($($kind:ty => $store:ident),* $(,)?) => {$(
        impl OwnedKind for $kind {
            fn store(stores: &Stores) -> &Store<Self> {
                &stores.$store
            }
        }
    )*};
}

owned_kinds! {
    ServiceAccount => service_accounts,
    Role => roles,
    RoleBinding => role_bindings,
    ConfigMap => config_maps,
    Service => services,
    Deployment => deployments,
    PodDisruptionBudget => pdbs,
}

/// One object as we want it, with its hash annotation.
pub struct Desired {
    pub resource: ApiResource,
    pub name: String,
    pub object: Value,
    /// Its kind's [`OwnedKind::cached`]: where the live object is known.
    cached: fn(&Stores, &str, &str) -> Option<Value>,
}

fn desired<K: OwnedKind>(obj: &K) -> Desired {
    let mut object = serde_json::to_value(obj).expect("built objects serialize");
    let hash = hex::encode(Sha256::digest(object.to_string().as_bytes()));
    object["metadata"]["annotations"][APPLIED_ANNOTATION] = Value::String(hash);
    object["apiVersion"] = K::api_version(&()).into();
    object["kind"] = K::kind(&()).into();
    Desired {
        resource: ApiResource::erase::<K>(&()),
        name: obj.meta().name.clone().unwrap_or_default(),
        object,
        cached: K::cached,
    }
}

/// Every owned object as we want it, the ones others depend on first.
pub fn all_desired(o: &Owned) -> Vec<Desired> {
    let mut all = vec![
        desired(&o.service_account),
        desired(&o.role),
        desired(&o.role_binding),
        desired(&o.lease_binding),
        desired(&o.cert_manager_binding),
        desired(&o.config_map),
        desired(&o.service),
        desired(&o.deployment),
    ];
    if let Some(pdb) = &o.pdb {
        all.push(desired(pdb));
    }
    all
}

fn owned_by(obj: &Value, uid: &str) -> bool {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
}

/// Whether every field of `want` is in `have` with the same value. Lists
/// compare item by item; an empty list or object in `want` matches a
/// missing one (the API server drops them).
pub fn contains(have: &Value, want: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match (have, want) {
        (_, w) if empty(w) => empty(have) || have == w,
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).map_or(empty(wv), |hv| contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| contains(hv, wv))
        }
        (h, w) => h == w,
    }
}

/// Whether `live` already is what an apply of `want` would make it.
pub fn up_to_date(live: &Value, want: &Value) -> bool {
    live["metadata"]["annotations"][APPLIED_ANNOTATION]
        == want["metadata"]["annotations"][APPLIED_ANNOTATION]
        && contains(live, want)
}

/// What is to be done with one desired object.
pub enum Step {
    /// Already so.
    Current,
    /// Missing or different: apply.
    Apply,
    /// Its name is taken by an object of someone else: a message.
    Foreign(String),
}

/// Compares `d` with the store, or, when the store does not have it (not
/// ours, or not labelled as ours), with what the API server has.
pub async fn step(
    stores: &Stores,
    client: &Client,
    ns: &str,
    uid: &str,
    d: &Desired,
) -> Result<Step, Error> {
    let kind = d.resource.kind.as_str();
    let live = match (d.cached)(stores, ns, &d.name) {
        Some(live) => Some(live),
        None => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &d.resource)
            .get_opt(&d.name)
            .await
            .map_err(|e| api_error(kind, "get", &d.name, &e))?
            .map(|o| serde_json::to_value(o).expect("objects serialize")),
    };
    Ok(match live {
        None => Step::Apply,
        Some(live) if !owned_by(&live, uid) => Step::Foreign(format!(
            "{kind} {ns}/{} exists and is {}; rename the Provisioner or remove that object (nothing was changed)",
            d.name,
            describe_owner(&live)
        )),
        Some(live) if up_to_date(&live, &d.object) => Step::Current,
        Some(_) => Step::Apply,
    })
}

/// Who owns an existing object, for messages: its owner references, else
/// the managers of its fields, else nobody named.
fn describe_owner(obj: &Value) -> String {
    let meta = &obj["metadata"];
    let names = |list: &Value, f: &dyn Fn(&Value) -> Option<String>| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(f)
            .collect()
    };
    let owners = names(&meta["ownerReferences"], &|o| {
        Some(format!("{} {}", o["kind"].as_str()?, o["name"].as_str()?))
    });
    if !owners.is_empty() {
        return format!("owned by {}", owners.join(", "));
    }
    let managers = names(&meta["managedFields"], &|m| {
        m["manager"].as_str().map(str::to_string)
    });
    if managers.is_empty() {
        "not owned by this Provisioner".into()
    } else {
        format!(
            "not owned by this Provisioner (managed by {})",
            managers.join(", ")
        )
    }
}

fn apply_params() -> PatchParams {
    // Force: this operator owns these fields, even if someone edited them.
    PatchParams::apply(crate::FIELD_MANAGER).force()
}

/// Server-side applies `d`; returns what the API server made of it.
pub async fn apply(client: &Client, ns: &str, d: &Desired) -> Result<Value, Error> {
    let kind = d.resource.kind.as_str();
    let obj: DynamicObject = serde_json::from_value(d.object.clone())
        .map_err(|e| api_error(kind, "apply", &d.name, &e))?;
    let applied = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &d.resource)
        .patch(&d.name, &apply_params(), &Patch::Apply(&obj))
        .await
        .map_err(|e| api_error(kind, "apply", &d.name, &e))?;
    Ok(serde_json::to_value(applied).expect("objects serialize"))
}

/// Deletes our PodDisruptionBudget `name` when there is one (below two
/// replicas it would block node drains). Someone else's is left alone.
pub async fn remove_pdb(
    stores: &Stores,
    client: &Client,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<bool, Error> {
    if !stores.our_pdb(ns, name, uid) {
        return Ok(false);
    }
    let api = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
        Err(e) => Err(api_error("PodDisruptionBudget", "delete", name, &e)),
    }
}

/// The label selector of the owned objects' watches.
pub fn owned_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_we_set_must_be_there_and_the_rest_may_differ() {
        let want = json!({"a": 1, "b": {"c": [1, {"d": "x"}]}, "e": [], "f": {}});
        let have = json!({"a": 1, "b": {"c": [1, {"d": "x", "extra": 2}], "z": 3}, "y": 0});
        assert!(
            contains(&have, &want),
            "defaults and others' fields are allowed"
        );
        assert!(!contains(
            &json!({"a": 2, "b": {"c": [1, {"d": "x"}]}}),
            &want
        ));
        assert!(
            !contains(&json!({"a": 1, "b": {"c": [1]}}), &want),
            "list length"
        );
        assert!(!contains(
            &json!({"a": 1, "b": {"c": [1, {"d": "x"}]}, "e": [1]}),
            &want
        ));
        assert!(
            !contains(&json!({"b": {"c": [1, {"d": "x"}]}}), &want),
            "missing"
        );
    }

    #[test]
    fn an_object_is_current_only_with_our_hash_and_our_fields() {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            data: Some([("k".to_string(), "v".to_string())].into()),
            ..Default::default()
        };
        let d = desired(&cm);
        assert_eq!(d.object["kind"], "ConfigMap");
        let mut live = d.object.clone();
        live["metadata"]["resourceVersion"] = json!("7");
        assert!(up_to_date(&live, &d.object));
        live["data"]["k"] = json!("edited");
        assert!(!up_to_date(&live, &d.object), "an edit is drift");
        let mut other = d.object.clone();
        other["metadata"]["annotations"][APPLIED_ANNOTATION] = json!("older");
        assert!(!up_to_date(&other, &d.object), "what we want changed");
        let mut cm2 = cm.clone();
        cm2.data = None;
        assert_ne!(
            desired(&cm2).object["metadata"]["annotations"][APPLIED_ANNOTATION],
            d.object["metadata"]["annotations"][APPLIED_ANNOTATION],
            "a field we stop setting changes the hash"
        );
    }
}
