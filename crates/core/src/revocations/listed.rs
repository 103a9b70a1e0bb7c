//! `spec.revocations`: revocation through the `Provisioner` resource.
//!
//! The pods write what the resource lists as sealed revocations into the
//! records' revocations bucket, exactly as `choria-provisioner revoke`
//! does: only they hold the records' key (the operator may not even read
//! Secrets), so the operator cannot. An identity that leaves the list is
//! lifted again, but only when the list revoked it: a revocation written
//! with the command stays until `unrevoke`. While an identity is listed it
//! is revoked, whoever lifts it meanwhile.
//!
//! One replica applies the list: the leader, or in shards mode the first
//! member by name (as it prunes `status.members`), so two replicas with
//! different versions of the resource never undo each other's writes. A
//! write is conditional on the key's revision as read just before: a
//! revocation written meanwhile by someone else (`choria-provisioner
//! revoke`) is never lifted by a view that had not seen it.

use super::{Revocation, RevocationStore};
use choria_k8s::crd::{ResourceRef, RevokedNode};
use std::collections::HashMap;

/// Who the revocations the list writes name as their writer: how a lifting
/// knows the list revoked the identity.
pub fn writer(resource: &ResourceRef) -> String {
    format!("Provisioner {}/{}", resource.namespace, resource.name)
}

/// When a write is made: RFC 3339 and Unix seconds.
#[derive(Clone, Debug)]
pub struct Now {
    pub time: String,
    pub unix: i64,
}

impl Now {
    pub fn current() -> Self {
        let now = chrono::Utc::now();
        Now {
            time: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            unix: now.timestamp(),
        }
    }
}

/// The writes that make the bucket agree with `listed`, given what it
/// holds now (`current`, every identity's latest value, lifted ones too):
///
/// * a listed identity that is not revoked is revoked, with the list's
///   reason; one the list revoked with another reason gets the new one;
///   one revoked by someone else is left as it is;
/// * an identity the list revoked (`writer`) that it no longer lists is
///   lifted;
/// * a listed identity that is not a valid identity is skipped (the API
///   server's rules and the operator refuse it first).
///
/// A write is never older than the value it replaces: replicas take the
/// newer of two values, and a clock behind another replica's must not
/// make a lifting lose to the revocation it lifts.
pub fn plan(
    listed: &[RevokedNode],
    current: &HashMap<String, Revocation>,
    writer: &str,
    site: &str,
    now: &Now,
) -> Vec<Revocation> {
    let write = |identity: &str, revoked: bool, reason: String| {
        let after = current.get(identity).map_or(i64::MIN, |r| r.time_unix);
        Revocation {
            identity: identity.to_string(),
            revoked,
            reason,
            time: now.time.clone(),
            time_unix: now.unix.max(after),
            by: writer.to_string(),
            site: site.to_string(),
            // The store numbers the word when it writes it.
            n: 0,
        }
    };
    let mut out = Vec::new();
    for n in listed {
        if choria_wire::identity::validate(&n.identity).is_err() {
            continue;
        }
        let reason = crate::provision::text::one_line(&n.reason, 500);
        match current.get(&n.identity) {
            Some(r) if r.revoked && (r.by != writer || r.reason == reason) => {}
            _ => out.push(write(&n.identity, true, reason)),
        }
    }
    let mut lifted: Vec<&Revocation> = current
        .values()
        .filter(|r| r.revoked && r.by == writer)
        .filter(|r| !listed.iter().any(|n| n.identity == r.identity))
        .collect();
    lifted.sort_by(|a, b| a.identity.cmp(&b.identity));
    for r in lifted {
        out.push(write(
            &r.identity,
            false,
            format!("no longer listed in spec.revocations of {writer}"),
        ));
    }
    out
}

/// Plans `r`'s identity again from its value in the bucket now and writes
/// what that plan says, conditionally on the revision read: what was
/// written, if anything.
pub async fn write_if_still_due(
    store: &RevocationStore,
    listed: &[RevokedNode],
    writer: &str,
    site: &str,
    r: Revocation,
) -> Result<Option<Revocation>, crate::records::store::RecordsError> {
    let (current, at) = store.current(&r.identity).await?;
    let mine: Vec<RevokedNode> = listed
        .iter()
        .filter(|n| n.identity == r.identity)
        .cloned()
        .collect();
    let now = Now {
        time: r.time.clone(),
        unix: r.time_unix,
    };
    let held: HashMap<String, Revocation> = current
        .into_iter()
        .map(|c| (c.identity.clone(), c))
        .collect();
    let Some(w) = plan(&mine, &held, writer, site, &now).into_iter().next() else {
        return Ok(None);
    };
    store.put_at(&w, at).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const WRITER: &str = "Provisioner ns/p";

    fn now(unix: i64) -> Now {
        Now {
            time: format!("t{unix}"),
            unix,
        }
    }

    fn listed(items: &[(&str, &str)]) -> Vec<RevokedNode> {
        items
            .iter()
            .map(|(i, r)| RevokedNode {
                identity: i.to_string(),
                reason: r.to_string(),
            })
            .collect()
    }

    fn held(items: &[(&str, bool, &str, &str, i64)]) -> HashMap<String, Revocation> {
        items
            .iter()
            .map(|(i, revoked, reason, by, t)| {
                (
                    i.to_string(),
                    Revocation {
                        identity: i.to_string(),
                        revoked: *revoked,
                        reason: reason.to_string(),
                        time: String::new(),
                        time_unix: *t,
                        by: by.to_string(),
                        site: "s".into(),
                        n: 0,
                    },
                )
            })
            .collect()
    }

    fn brief(w: &[Revocation]) -> Vec<(String, bool, String, String)> {
        w.iter()
            .map(|r| {
                (
                    r.identity.clone(),
                    r.revoked,
                    r.reason.clone(),
                    r.by.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn a_listed_identity_is_revoked_once_with_the_lists_reason() {
        let l = listed(&[("n1.example", "stolen laptop")]);
        let w = plan(&l, &HashMap::new(), WRITER, "s", &now(100));
        assert_eq!(
            brief(&w),
            [(
                "n1.example".into(),
                true,
                "stolen laptop".into(),
                WRITER.into()
            )]
        );
        assert_eq!((w[0].time_unix, w[0].site.as_str()), (100, "s"));
        // Once the bucket holds it, nothing more is written.
        let h = held(&[("n1.example", true, "stolen laptop", WRITER, 100)]);
        assert!(plan(&l, &h, WRITER, "s", &now(110)).is_empty());
    }

    #[test]
    fn a_new_reason_is_written_but_anothers_revocation_is_left_alone() {
        let l = listed(&[("a", "new reason"), ("b", "listed too")]);
        let h = held(&[
            ("a", true, "old reason", WRITER, 100),
            ("b", true, "by hand", "ops@host", 100),
        ]);
        let w = plan(&l, &h, WRITER, "s", &now(110));
        assert_eq!(
            brief(&w),
            [("a".into(), true, "new reason".into(), WRITER.into())]
        );
    }

    #[test]
    fn a_listed_identity_lifted_by_hand_is_revoked_again() {
        let l = listed(&[("a", "listed")]);
        let h = held(&[("a", false, "unrevoked", "ops@host", 100)]);
        let w = plan(&l, &h, WRITER, "s", &now(110));
        assert_eq!(
            brief(&w),
            [("a".into(), true, "listed".into(), WRITER.into())]
        );
    }

    #[test]
    fn only_what_the_list_revoked_is_lifted_when_it_leaves_the_list() {
        let h = held(&[
            ("mine", true, "x", WRITER, 100),
            ("cli", true, "y", "ops@host", 100),
            ("other-list", true, "z", "Provisioner ns/q", 100),
            ("lifted", false, "x", WRITER, 100),
        ]);
        let w = plan(&[], &h, WRITER, "s", &now(110));
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].identity.as_str(), w[0].revoked), ("mine", false));
        assert!(w[0].reason.contains("no longer listed"), "{}", w[0].reason);
    }

    #[test]
    fn a_write_is_never_older_than_what_it_replaces() {
        // This replica's clock is behind the one that revoked: the lifting
        // still wins, as replicas keep the newer value.
        let h = held(&[("a", true, "x", WRITER, 500)]);
        let w = plan(&[], &h, WRITER, "s", &now(100));
        assert_eq!(w[0].time_unix, 500);
    }

    #[test]
    fn invalid_identities_and_multi_line_reasons_write_nothing_unsafe() {
        let l = listed(&[("bad name", "x"), ("ok", "line one\nline two")]);
        let w = plan(&l, &HashMap::new(), WRITER, "s", &now(1));
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].identity, "ok");
        assert!(!w[0].reason.contains('\n'), "{:?}", w[0].reason);
    }
}
