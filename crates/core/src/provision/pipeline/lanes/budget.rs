//! One lane's in-flight budget: a semaphore whose size follows the lane's
//! [`Aimd`] rules. Growing adds permits; shrinking forgets free ones and
//! carries the rest as a debt, paid as places are given back (a sequence
//! holding a place is never interrupted).

use crate::provision::pipeline::lanes::aimd::{Aimd, Change};
use crate::provision::pipeline::registry::Lane;
use prometheus::IntGauge;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

pub struct Budget {
    lane: Lane,
    permits: Arc<Semaphore>,
    state: Mutex<State>,
    /// `choria_provisioner_in_flight_bound{lane}`.
    gauge: IntGauge,
}

struct State {
    rules: Aimd,
    /// Places the semaphore should hold, free and taken: the bound.
    capacity: usize,
    /// Places over `capacity` still to be forgotten as they come back.
    debt: usize,
}

impl Budget {
    pub fn new(lane: Lane, ceiling: usize, gauge: IntGauge) -> Self {
        let rules = Aimd::new(ceiling);
        let capacity = rules.limit();
        gauge.set(capacity as i64);
        Budget {
            lane,
            permits: Arc::new(Semaphore::new(capacity)),
            state: Mutex::new(State {
                rules,
                capacity,
                debt: 0,
            }),
            gauge,
        }
    }

    /// A budget no sequence waits on (a sequence run alone, as in tests).
    pub fn unbounded() -> Self {
        Budget::new(
            Lane::Suspect,
            Semaphore::MAX_PERMITS,
            IntGauge::new("unbounded", "-").expect("a valid name"),
        )
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a place.
    pub async fn acquire(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        self.permits.clone().acquire_owned().await
    }

    /// A place if one is free now.
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// The bound now.
    pub fn bound(&self) -> usize {
        self.state().capacity
    }

    /// A request of this lane was answered after `took`.
    pub fn answered(&self, took: Duration) {
        let change = self.state().rules.answered(took, Instant::now());
        self.follow(change);
    }

    /// The broker refused a send, dropped the connection or called it a
    /// slow consumer.
    pub fn trouble(&self) {
        let change = self.state().rules.trouble(Instant::now());
        self.follow(change);
    }

    /// A place was given back: a debt is paid from it.
    pub fn given_back(&self) {
        let mut state = self.state();
        self.pay(&mut state);
    }

    /// Sizes the semaphore to the rules' bound.
    fn follow(&self, change: Change) {
        if change == Change::Same {
            return;
        }
        let mut state = self.state();
        let target = state.rules.limit();
        if target < state.capacity {
            state.debt += state.capacity - target;
        } else {
            let grow = target - state.capacity;
            let cancelled = grow.min(state.debt);
            state.debt -= cancelled;
            self.permits.add_permits(grow - cancelled);
        }
        state.capacity = target;
        self.pay(&mut state);
        self.gauge.set(target as i64);
        let (ceiling, floor) = (state.rules.ceiling(), state.rules.floor());
        drop(state);
        match change {
            Change::Cut(bound) => {
                warn!(
                    lane = self.lane.name(),
                    bound,
                    floor,
                    ceiling,
                    "in-flight bound cut: answers came slowly, or the broker dropped or refused us"
                )
            }
            Change::Raised(bound) if bound == ceiling => {
                info!(
                    lane = self.lane.name(),
                    bound, "in-flight bound back at its ceiling"
                )
            }
            _ => {}
        }
    }

    fn pay(&self, state: &mut State) {
        if state.debt > 0 {
            state.debt -= self.permits.forget_permits(state.debt);
        }
    }
}

/// The lanes' budgets by [`Lane::ALL`] order.
pub type Budgets = Arc<[Arc<Budget>; 3]>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::pipeline::lanes::aimd::COOLDOWN;

    fn budget(ceiling: usize) -> Budget {
        Budget::new(
            Lane::Discovery,
            ceiling,
            IntGauge::new("bound", "test").unwrap(),
        )
    }

    #[tokio::test]
    async fn a_cut_takes_free_places_at_once_and_held_ones_as_they_come_back() {
        let b = budget(10);
        let mut held: Vec<_> = (0..6).map(|_| b.try_acquire().unwrap()).collect();
        b.trouble();
        assert_eq!((b.bound(), b.gauge.get()), (7, 7));
        // 3 of the 4 free places were forgotten at once.
        held.push(b.try_acquire().expect("the 7th place"));
        assert!(b.try_acquire().is_none(), "7 held: the bound");

        std::thread::sleep(COOLDOWN);
        b.trouble();
        assert_eq!(b.bound(), 4);
        // None free: the 3 owed are paid by the first 3 given back.
        for _ in 0..3 {
            drop(held.pop());
            b.given_back();
            assert!(
                b.try_acquire().is_none(),
                "a place given back pays the debt"
            );
        }
        drop(held.pop());
        b.given_back();
        assert!(b.try_acquire().is_some(), "3 held under a bound of 4");
    }

    #[tokio::test]
    async fn raising_the_bound_cancels_an_unpaid_debt_before_adding_places() {
        let b = budget(100);
        let held: Vec<_> = (0..100).map(|_| b.try_acquire().unwrap()).collect();
        b.trouble();
        assert_eq!((b.bound(), b.state().debt), (70, 30));
        // Quick rounds until the bound is back at 100: the 30 owed
        // are cancelled, none added.
        while b.bound() < 100 {
            for _ in 0..b.bound() {
                b.answered(Duration::from_millis(10));
            }
        }
        assert_eq!(b.state().debt, 0);
        assert!(b.try_acquire().is_none(), "still 100 places, all held");
        drop(held);
        assert_eq!(b.permits.available_permits(), 100);
    }

    #[tokio::test]
    async fn a_round_of_slow_answers_cuts_the_bound() {
        let b = budget(64);
        for _ in 0..64 {
            b.answered(Duration::from_secs(5));
        }
        assert_eq!(b.bound(), 44);
    }
}
