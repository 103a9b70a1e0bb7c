//! The lanes' in-flight budgets: how many sequences exchange requests at
//! once per lane, and the place a sequence holds in one (given back while
//! it only waits, moved to the suspects' budget when a request fails).

use crate::provision::pipeline::registry::Lane;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

/// Sequences exchanging requests at once per lane: events, discovery,
/// suspects. A sequence waiting out its reply windows gives its place back
/// (that wait is pure waiting, and bounded by itself: the sequences that
/// enter it in one window), so these bound the requests in flight, and so
/// the queueing a reply meets on a busy machine: with thousands in flight a
/// debug build on 2 cores answered late enough for `rpc_timeout` to call
/// real nodes' replies lost. 512 made-up names that never answer are worked
/// through per request timeout (event-announced nodes meanwhile go through
/// their own lane); a flood of made-up `startup` events costs no more than
/// 256 requests per timeout (the events lane holds 10,000 more; past that
/// they are dropped and counted).
pub const IN_FLIGHT: [(Lane, usize); 3] = [
    (Lane::Events, 256),
    (Lane::Discovery, 512),
    (Lane::Suspect, 512),
];

/// The budgets sequences run under.
#[derive(Clone)]
pub(crate) struct Pool {
    /// Each lane's in-flight budget, by [`Lane::ALL`] order.
    pub(crate) lanes: Arc<[Arc<Semaphore>; 3]>,
    pub(crate) tracker: TaskTracker,
}

impl Pool {
    /// Each lane with its budget ([`IN_FLIGHT`]).
    pub(crate) fn new() -> Self {
        let budget = |lane: Lane| {
            let n = IN_FLIGHT
                .iter()
                .find(|(l, _)| *l == lane)
                .map_or(1, |(_, n)| *n);
            Arc::new(Semaphore::new(n))
        };
        Pool {
            lanes: Arc::new(Lane::ALL.map(budget)),
            tracker: TaskTracker::new(),
        }
    }

    pub(crate) fn lane(&self, lane: Lane) -> &Arc<Semaphore> {
        &self.lanes[Lane::ALL.iter().position(|l| *l == lane).unwrap_or(0)]
    }
}

/// A place in a lane's in-flight budget, held by one sequence.
pub struct LanePlace {
    permit: Option<OwnedSemaphorePermit>,
    lane: Lane,
    /// The budget of the lane it is in now.
    budget: Arc<Semaphore>,
    suspect: Arc<Semaphore>,
}

impl LanePlace {
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        lane: Lane,
        budget: Arc<Semaphore>,
        suspect: Arc<Semaphore>,
    ) -> Self {
        LanePlace {
            permit: Some(permit),
            lane,
            budget,
            suspect,
        }
    }

    /// A place outside any budget (a sequence run on its own, as in tests).
    pub fn unbounded() -> Self {
        let none = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
        LanePlace {
            permit: None,
            lane: Lane::Suspect,
            budget: none.clone(),
            suspect: none,
        }
    }

    /// Gives the place back while the sequence only waits (its reply
    /// windows); [`LanePlace::budget`] is where it takes one again.
    pub fn release(&mut self) {
        self.permit = None;
    }

    /// The budget of its lane, to take a place in again.
    pub fn budget(&self) -> Arc<Semaphore> {
        self.budget.clone()
    }

    /// Holds `permit` (of [`LanePlace::budget`]) again.
    pub fn hold(&mut self, permit: OwnedSemaphorePermit) {
        self.permit = Some(permit);
    }

    /// A request went unanswered: the place in the names' own lane goes to
    /// the next name, and the rest runs in a place among the suspects —
    /// if one is free; false when none is (the sequence ends, and the name
    /// is retried at the next discovery).
    pub fn demote(&mut self) -> bool {
        if self.lane == Lane::Suspect {
            return true;
        }
        match self.suspect.clone().try_acquire_owned() {
            Ok(permit) => {
                self.permit = Some(permit);
                self.lane = Lane::Suspect;
                self.budget = self.suspect.clone();
                true
            }
            Err(_) => false,
        }
    }
}
