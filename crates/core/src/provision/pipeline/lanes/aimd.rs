//! The rules a lane's in-flight bound follows: additive increase while
//! answers come quickly, multiplicative decrease when they come slowly or
//! the broker shows trouble (as TCP follows a path it cannot see into).
//!
//! Why: the broker queues what it cannot deliver yet; a client that keeps
//! more requests in flight than the broker and the nodes keep up with fills
//! those queues until the broker calls a connection a slow consumer and
//! drops it (go-choria #2363 reports it at ~500 concurrent requests). A
//! fixed bound is too high for a busy broker; this one comes down when the
//! answers say so and goes back when they recover.
//!
//! What anyone can make up must not talk the bound down:
//! - a request that gets no answer changes nothing (made-up names never
//!   answer, and anyone can announce them);
//! - slow answers count per round (one bound's worth of answers), and only
//!   a round in which most answers were slow cuts: a node, or a few
//!   hundred forged names answering late, cannot cut a lane whose other
//!   nodes answer in time;
//! - the bound never goes below a quarter of its ceiling.
//!
//! Pure rules: every call is told the time.

use std::time::{Duration, Instant};

/// An answer slower than this is the queues speaking: a provisioning
/// exchange answers in well under a second with hundreds in flight
/// (BENCHMARKS.md: ~0.3 s at 512 in flight through the Choria broker on 2
/// busy cores; a v1 `gencsr` makes its RSA key in ~0.2 s).
pub const SLOW_ANSWER: Duration = Duration::from_secs(2);
/// What a cut keeps of the bound.
const CUT: f64 = 0.7;
/// At most one cut per this long: one burst of trouble is one cut, not one
/// per request caught in it.
pub const COOLDOWN: Duration = Duration::from_secs(1);
/// The floor, as a share of the ceiling.
const FLOOR_SHARE: usize = 4;
/// A round of quick answers raises the bound by this share of the ceiling:
/// back from the floor in ~24 rounds (a few thousand answers), where one
/// per round would take hundreds.
const STEP_SHARE: usize = 32;

/// One lane's bound and the round of answers it is counting.
#[derive(Clone, Debug)]
pub struct Aimd {
    limit: usize,
    floor: usize,
    ceiling: usize,
    step: usize,
    answers: usize,
    slow: usize,
    last_cut: Option<Instant>,
}

/// What an observation did to the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Same,
    Raised(usize),
    Cut(usize),
}

impl Aimd {
    /// Starting at `ceiling`, the most it may be.
    pub fn new(ceiling: usize) -> Self {
        let ceiling = ceiling.max(1);
        Aimd {
            limit: ceiling,
            floor: (ceiling / FLOOR_SHARE).max(1),
            ceiling,
            step: (ceiling / STEP_SHARE).max(1),
            answers: 0,
            slow: 0,
            last_cut: None,
        }
    }

    /// The bound now.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn ceiling(&self) -> usize {
        self.ceiling
    }

    pub fn floor(&self) -> usize {
        self.floor
    }

    /// An answer took `took`. At the end of a round (a bound's worth of
    /// answers) the bound is cut when most of them were slow, raised
    /// otherwise.
    pub fn answered(&mut self, took: Duration, now: Instant) -> Change {
        self.answers += 1;
        if took > SLOW_ANSWER {
            self.slow += 1;
        }
        if self.answers < self.limit {
            return Change::Same;
        }
        let mostly_slow = self.slow * 2 > self.answers;
        self.answers = 0;
        self.slow = 0;
        if mostly_slow {
            return self.trouble(now);
        }
        if self.limit == self.ceiling {
            return Change::Same;
        }
        self.limit = (self.limit + self.step).min(self.ceiling);
        Change::Raised(self.limit)
    }

    /// The broker refused a send, called us a slow consumer, or the
    /// connection dropped: the bound is cut (once per [`COOLDOWN`]) and a
    /// new round begins.
    pub fn trouble(&mut self, now: Instant) -> Change {
        if self
            .last_cut
            .is_some_and(|at| now.saturating_duration_since(at) < COOLDOWN)
        {
            return Change::Same;
        }
        self.last_cut = Some(now);
        self.answers = 0;
        self.slow = 0;
        let cut = ((self.limit as f64 * CUT) as usize).max(self.floor);
        if cut == self.limit {
            return Change::Same;
        }
        self.limit = cut;
        Change::Cut(cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Duration = Duration::from_millis(50);
    const SLOW: Duration = Duration::from_secs(3);

    fn answers(rules: &mut Aimd, n: usize, took: Duration, now: Instant) -> Vec<Change> {
        (0..n)
            .map(|_| rules.answered(took, now))
            .filter(|c| *c != Change::Same)
            .collect()
    }

    #[test]
    fn a_round_of_mostly_slow_answers_cuts_the_bound() {
        let now = Instant::now();
        let mut rules = Aimd::new(100);
        assert_eq!(answers(&mut rules, 49, QUICK, now), vec![]);
        assert_eq!(answers(&mut rules, 51, SLOW, now), vec![Change::Cut(70)]);
        assert_eq!(rules.limit(), 70);
    }

    #[test]
    fn slow_answers_short_of_half_a_round_change_nothing() {
        // A node, or forged names answering late, among nodes answering
        // in time: the bound stays.
        let now = Instant::now();
        let mut rules = Aimd::new(100);
        for _ in 0..10 {
            assert_eq!(answers(&mut rules, 50, SLOW, now), vec![]);
            assert_eq!(answers(&mut rules, 50, QUICK, now), vec![]);
        }
        assert_eq!(rules.limit(), 100);
    }

    #[test]
    fn trouble_cuts_once_per_cooldown_and_never_below_the_floor() {
        let t0 = Instant::now();
        let mut rules = Aimd::new(100);
        assert_eq!(rules.trouble(t0), Change::Cut(70));
        assert_eq!(rules.trouble(t0 + COOLDOWN / 2), Change::Same);
        assert_eq!(rules.trouble(t0 + COOLDOWN), Change::Cut(49));
        let mut now = t0 + COOLDOWN;
        for _ in 0..10 {
            now += COOLDOWN;
            rules.trouble(now);
        }
        assert_eq!(rules.limit(), 25, "a quarter of the ceiling");
        assert_eq!(rules.trouble(now + COOLDOWN), Change::Same);
    }

    #[test]
    fn quick_rounds_raise_the_bound_back_to_its_ceiling() {
        let t0 = Instant::now();
        let mut rules = Aimd::new(512);
        let mut now = t0;
        for _ in 0..5 {
            now += COOLDOWN;
            rules.trouble(now);
        }
        assert_eq!(rules.limit(), 128);
        // Each round is a bound's worth of answers and adds 16.
        assert_eq!(answers(&mut rules, 127, QUICK, now), vec![]);
        assert_eq!(
            answers(&mut rules, 1, QUICK, now),
            vec![Change::Raised(144)]
        );
        let mut rounds = 1;
        while rules.limit() < 512 {
            let limit = rules.limit();
            answers(&mut rules, limit, QUICK, now);
            rounds += 1;
        }
        assert_eq!(rounds, 24);
        assert_eq!(answers(&mut rules, 2048, QUICK, now), vec![], "not past it");
        assert_eq!(rules.limit(), 512);
    }

    #[test]
    fn a_tiny_ceiling_still_moves() {
        let t0 = Instant::now();
        let mut rules = Aimd::new(2);
        assert_eq!((rules.floor(), rules.ceiling()), (1, 2));
        assert_eq!(rules.trouble(t0), Change::Cut(1));
        assert_eq!(rules.answered(QUICK, t0), Change::Raised(2));
    }
}
