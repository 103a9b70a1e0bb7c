//! Which nodes this replica works. In leader mode (or without an election)
//! every node it finds is its own; in shards mode a node is its own when
//! rendezvous hashing over the live members gives it to this replica (see
//! [`crate::election::shards`]).
//!
//! Ownership is read where a node enters (discovery, startup events), where
//! it is confirmed and taken off the queue, and at every checkpoint of its
//! sequence (with the pause gate and the term): a replica that stops owning
//! a node stops that node's sequence at its next checkpoint.

use crate::election::shards;
use std::sync::{Arc, RwLock};

/// The replica's share of the fleet.
#[derive(Clone, Debug)]
pub struct Ownership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Our member id; `None`: every node is ours (leader mode).
    me: Option<String>,
    members: RwLock<Arc<[String]>>,
}

impl Ownership {
    /// Every node is ours.
    pub fn everything() -> Self {
        Ownership {
            inner: Arc::new(Inner {
                me: None,
                members: RwLock::new(Arc::from(Vec::new())),
            }),
        }
    }

    /// Our share as member `me`; nothing until the first member list.
    pub fn shard(me: &str) -> Self {
        Ownership {
            inner: Arc::new(Inner {
                me: Some(me.to_string()),
                members: RwLock::new(Arc::from(Vec::new())),
            }),
        }
    }

    pub fn sharded(&self) -> bool {
        self.inner.me.is_some()
    }

    /// Whether `node` is ours now.
    pub fn owns(&self, node: &str) -> bool {
        let Some(me) = &self.inner.me else {
            return true;
        };
        let members = self.members();
        shards::owner(&members, node) == Some(me.as_str())
    }

    pub fn members(&self) -> Arc<[String]> {
        self.inner
            .members
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets the live members; true when we now own nodes we did not (a
    /// member left, or we joined).
    pub(crate) fn set_members(&self, members: &[String]) -> bool {
        let mut slot = self
            .inner
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let gained = slot.iter().any(|m| !members.contains(m)) || slot.is_empty();
        *slot = Arc::from(members.to_vec());
        gained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_leader_mode_every_node_is_ours() {
        let o = Ownership::everything();
        assert!(!o.sharded());
        assert!(o.owns("anything.example.net"));
    }

    #[test]
    fn in_shards_mode_a_node_is_ours_only_when_hashing_gives_it_to_us() {
        let o = Ownership::shard("b");
        assert!(!o.owns("n1"), "no members known yet: nothing is ours");
        let all: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        assert!(o.set_members(&all), "the first list is a gain");
        let nodes: Vec<String> = (0..300).map(|i| format!("n{i}")).collect();
        let ours = nodes.iter().filter(|n| o.owns(n)).count();
        assert!((75..=126).contains(&ours), "{ours} of 300");
        for n in &nodes {
            assert_eq!(o.owns(n), shards::owner(&all, n) == Some("b"), "{n}");
        }
        // c leaves: b gains; a joins again: no gain for b.
        assert!(o.set_members(&["a".into(), "b".into()]));
        assert!(!o.set_members(&all));
    }
}
