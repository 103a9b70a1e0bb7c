//! The lanes' in-flight budgets: how many sequences exchange requests at
//! once per lane, and the place a sequence holds in one (given back while
//! it only waits, moved to the suspects' budget when a request fails).
//! Each lane's budget (`budget`) is a semaphore sized by the `aimd` rules:
//! cut while the broker or the nodes are slow, raised as they keep up.

pub mod aimd;
pub mod budget;

use crate::provision::pipeline::registry::Lane;
use budget::{Budget, Budgets};
use prometheus::IntGauge;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;

/// Sequences exchanging requests at once per lane at most (the ceilings
/// of their [`Budget`]s, which cut them while the broker or the nodes are
/// slow): events, discovery, suspects. A sequence waiting out its reply windows gives its place back
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
    pub(crate) lanes: Budgets,
    pub(crate) tracker: TaskTracker,
}

impl Pool {
    /// Each lane with its budget ([`IN_FLIGHT`] its ceiling), its bound
    /// shown by `gauge(lane)`.
    pub(crate) fn new(gauge: impl Fn(Lane) -> IntGauge) -> Self {
        let budget = |lane: Lane| {
            let n = IN_FLIGHT
                .iter()
                .find(|(l, _)| *l == lane)
                .map_or(1, |(_, n)| *n);
            Arc::new(Budget::new(lane, n, gauge(lane)))
        };
        Pool {
            lanes: Arc::new(Lane::ALL.map(budget)),
            tracker: TaskTracker::new(),
        }
    }

    pub(crate) fn lane(&self, lane: Lane) -> &Arc<Budget> {
        &self.lanes[Lane::ALL.iter().position(|l| *l == lane).unwrap_or(0)]
    }

    /// The broker is in trouble: every lane's bound is cut.
    pub(crate) fn trouble(&self) {
        for budget in self.lanes.iter() {
            budget.trouble();
        }
    }

    /// Each lane's bound now, for the log at shutdown.
    pub(crate) fn bounds(&self) -> String {
        Lane::ALL
            .iter()
            .map(|l| format!("{}={}", l.name(), self.lane(*l).bound()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What a request's end tells its lane's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// An answer in the node's name, after this long.
    Answer(Duration),
    /// The broker would not take the request (not connected, a refused
    /// publish).
    Refused,
    /// Nothing that speaks of the broker: no answer (made-up names never
    /// answer), an error of our own.
    Nothing,
}

/// A place in a lane's in-flight budget, held by one sequence.
pub struct LanePlace {
    permit: Option<OwnedSemaphorePermit>,
    lane: Lane,
    /// The budget of the lane it is in now.
    budget: Arc<Budget>,
    suspect: Arc<Budget>,
}

impl LanePlace {
    pub(crate) fn new(
        permit: OwnedSemaphorePermit,
        lane: Lane,
        budget: Arc<Budget>,
        suspect: Arc<Budget>,
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
        let none = Arc::new(Budget::unbounded());
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
        if self.permit.take().is_some() {
            self.budget.given_back();
        }
    }

    /// The budget of its lane, to take a place in again.
    pub fn budget(&self) -> Arc<Budget> {
        self.budget.clone()
    }

    /// Holds `permit` (of [`LanePlace::budget`]) again.
    pub fn hold(&mut self, permit: OwnedSemaphorePermit) {
        self.permit = Some(permit);
    }

    /// Tells the lane's budget how a request ended.
    pub fn heard(&self, heard: Heard) {
        match heard {
            Heard::Answer(took) => self.budget.answered(took),
            Heard::Refused => self.budget.trouble(),
            Heard::Nothing => {}
        }
    }

    /// A request went unanswered: the place in the names' own lane goes to
    /// the next name, and the rest runs in a place among the suspects —
    /// if one is free; false when none is (the sequence ends, and the name
    /// is retried at the next discovery).
    pub fn demote(&mut self) -> bool {
        if self.lane == Lane::Suspect {
            return true;
        }
        match self.suspect.try_acquire() {
            Some(permit) => {
                self.release();
                self.permit = Some(permit);
                self.lane = Lane::Suspect;
                self.budget = self.suspect.clone();
                true
            }
            None => false,
        }
    }
}

impl Drop for LanePlace {
    fn drop(&mut self) {
        self.release();
    }
}
