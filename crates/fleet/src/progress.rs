//! What `fleet` shows while it runs: a line a second on stderr, how many
//! nodes have left provisioning and how many requests were answered,
//! rewritten in place on a terminal (the command turns it on there only:
//! into a file or a pipe the summary at the end is the output).

use crate::context::Ctx;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How the fleet reports while it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Progress {
    /// Nothing until the summary.
    #[default]
    Off,
    /// One line on stderr, rewritten every second (a terminal).
    InPlace,
}

/// The line: seconds since the start, healthy nodes that left provisioning
/// of all healthy ones, and requests answered.
pub fn line(
    elapsed: Duration,
    healthy: usize,
    remaining: usize,
    replies: u64,
    requests: u64,
) -> String {
    let left = healthy.saturating_sub(remaining);
    format!(
        "[{:>5.1}s] {left} of {healthy} nodes left provisioning  {remaining} waiting  {replies} of {requests} requests answered",
        elapsed.as_secs_f64()
    )
}

/// Shows the line every second until dropped (the caller aborts it).
pub(crate) async fn show(ctx: Ctx, healthy: usize) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let text = line(
            started.elapsed(),
            healthy,
            ctx.remaining.load(Ordering::Relaxed),
            ctx.counters.replies.load(Ordering::Relaxed),
            ctx.counters.requests.load(Ordering::Relaxed),
        );
        let mut err = std::io::stderr().lock();
        // Back to the line's start, the old one cleared.
        let _ = write!(err, "\r\x1b[2K{text}");
        let _ = err.flush();
    }
}

/// Ends the line so what follows starts on a line of its own.
pub(crate) fn finish() {
    eprintln!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_nodes_that_left_and_requests_answered() {
        assert_eq!(
            line(Duration::from_millis(2500), 1000, 360, 1234, 1240),
            "[  2.5s] 640 of 1000 nodes left provisioning  360 waiting  1234 of 1240 requests answered"
        );
    }
}
