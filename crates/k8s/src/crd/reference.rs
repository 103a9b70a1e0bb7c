//! A reference to one `Provisioner`, as a pod names the resource it runs
//! as (`run --provisioner NAMESPACE/NAME`), and the owner reference that
//! makes what its pods create (their Lease, their CertificateRequests) its
//! own.

use super::Provisioner;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;

/// `NAMESPACE/NAME` of a Provisioner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRef {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ResourceRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ResourceRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not NAMESPACE/NAME")),
        }
    }
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl ResourceRef {
    /// The Provisioners of its namespace.
    pub fn api(&self, client: kube::Client) -> Api<Provisioner> {
        Api::namespaced(client, &self.namespace)
    }

    /// The Provisioner as the owner of what its pods make (their Lease,
    /// their CertificateRequests), so deleting it collects them.
    pub async fn owner(&self, client: kube::Client) -> Result<OwnerReference, String> {
        let p =
            self.api(client).get(&self.name).await.map_err(|e| {
                format!("reading Provisioner {self}: {}", crate::describe_error(&e))
            })?;
        owner_reference(&p).ok_or_else(|| format!("Provisioner {self} has no uid"))
    }
}

/// Not its controller (the operator's objects have that), and not blocking
/// its deletion (which would need `provisioners/finalizers` under the
/// OwnerReferencesPermissionEnforcement admission plugin).
pub fn owner_reference(p: &Provisioner) -> Option<OwnerReference> {
    use kube::Resource;
    let mut o = p.controller_owner_ref(&())?;
    o.controller = Some(false);
    o.block_owner_deletion = Some(false);
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_refs_parse_namespace_and_name() {
        let r: ResourceRef = "choria/prov-a".parse().unwrap();
        assert_eq!(r.namespace, "choria");
        assert_eq!(r.name, "prov-a");
        assert_eq!(r.to_string(), "choria/prov-a");
        for bad in ["", "x", "/x", "x/", "a/b/c"] {
            assert!(bad.parse::<ResourceRef>().is_err(), "{bad:?}");
        }
    }
}
