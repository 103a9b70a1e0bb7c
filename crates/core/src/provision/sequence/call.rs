//! Asking a node: one directed request with Go's tries and backoff, the
//! gate and term read before every attempt, and what an answer (or its
//! absence) says about the name.

use super::{HostSequence, ProvisionError};
use crate::provision::pipeline::lanes::Heard;
use crate::provision::suspects::Allow;
use crate::provision::traces::Kind;
use choria_wire::client::{ClientError, RpcOptions, RpcResult};
use choria_wire::replies::Confirmation;
use serde::Serialize;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// go-choria's answer when another `<senderid>.<callerid>` holds the node's
/// provisioning lock (statuscode 1, Aborted).
pub const LOCK_REFUSED: &str = "Could not obtain provisioning lock";

fn is_lock_refusal(r: &RpcResult) -> bool {
    r.body.statuscode == choria_wire::mcorpc::StatusCode::Aborted
        && r.body.statusmsg == LOCK_REFUSED
}

/// Go's `backoff.FiveSec` policy: the sleep after try n is `FIVE_SEC[n]`
/// milliseconds, jittered to 50–150 %.
const FIVE_SEC: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

fn backoff(try_number: u32) -> Duration {
    let base = FIVE_SEC[(try_number as usize).min(FIVE_SEC.len() - 1)];
    Duration::from_millis(base / 2 + rand::random::<u64>() % base)
}

impl HostSequence {
    /// One RPC with retries. `check` turns a reply into the caller's value or a
    /// retryable error (most start with [`require_ok`]).
    pub(super) async fn call<T: Serialize, R>(
        &self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<R, ProvisionError> {
        Ok(self.call_with(rpc, tries, data, false, check).await?.0)
    }

    /// [`HostSequence::call`] for an answer later steps trust: its reply
    /// subject stays watched for `reply_window` (settled before the helper).
    pub(super) async fn call_trusted<T: Serialize, R>(
        &mut self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<R, ProvisionError> {
        let (value, confirmation) = self.call_with(rpc, tries, data, true, check).await?;
        self.pending.extend(confirmation);
        Ok(value)
    }

    /// One RPC with its tries, a span of the node's trace when it has one.
    pub(super) async fn call_with<T: Serialize, R>(
        &self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        trusted: bool,
        check: impl FnMut(&RpcResult) -> Result<R, String>,
    ) -> Result<(R, Option<Confirmation>), ProvisionError> {
        let Some(trace) = self.trace.as_deref() else {
            return self.tries(rpc, tries, data, trusted, check, &mut 0).await;
        };
        let (agent, action) = rpc.split_once('#').expect("rpc names are agent#action");
        let mut span = trace.start(rpc).kind(Kind::Client);
        span.attr("rpc.system", "choria");
        span.attr("rpc.service", agent);
        span.attr("rpc.method", action);
        let mut tried = 0;
        let result = self
            .tries(rpc, tries, data, trusted, check, &mut tried)
            .await;
        span.attr("choria.attempts", i64::from(tried));
        trace.end(
            span,
            result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
        );
        result
    }

    /// The tries of one RPC; `tried` counts the attempts made.
    async fn tries<T: Serialize, R>(
        &self,
        rpc: &'static str,
        tries: u32,
        data: &T,
        trusted: bool,
        mut check: impl FnMut(&RpcResult) -> Result<R, String>,
        tried: &mut u32,
    ) -> Result<(R, Option<Confirmation>), ProvisionError> {
        let (agent, _) = rpc.split_once('#').expect("rpc names are agent#action");
        self.gate_check()?;
        let mut last = String::new();
        let opts = RpcOptions {
            timeout: self
                .ctx
                .cfg
                .rpc_timeout
                .unwrap_or_else(|| self.client.rpc_timeout(agent)),
            confirm: trusted.then_some(self.ctx.cfg.reply_window),
        };
        for attempt in 1..=tries {
            // Pausing mid-sequence stops the node here, at an attempt boundary.
            self.gate_check()?;
            *tried = attempt;
            debug!(node = &*self.identity, rpc, attempt, tries, "calling");
            let outcome = match self.attempt(rpc, data, opts).await? {
                Ok((r, confirmation)) => check(&r).map(|v| (v, confirmation)),
                Err(ClientError::Timeout { timeout, .. }) => {
                    Err(format!("no reply within {timeout:?}"))
                }
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(value) => return Ok(value),
                Err(e) => {
                    self.log_failed_attempt(rpc, attempt, tries, &e);
                    last = e;
                }
            }
            // A name that never answered is not asked again now: one
            // request is what a made-up name costs (a real node that
            // missed it is found again by the next discovery).
            if !self.is_answered() || (attempt < tries && !self.wait_to_retry(attempt).await?) {
                break;
            }
        }
        self.ctx.metrics.rpc_error(rpc);
        let tries = *tried;
        if !self.is_answered() {
            return Err(ProvisionError::Unconfirmed { rpc, tries, last });
        }
        Err(ProvisionError::Rpc { rpc, tries, last })
    }

    /// One attempt: the request and its answer (or why there is none).
    /// An answer in the node's own name confirms it; another provisioner's
    /// lock ends the sequence.
    async fn attempt<T: Serialize>(
        &self,
        rpc: &'static str,
        data: &T,
        opts: RpcOptions,
    ) -> Result<Result<(RpcResult, Option<Confirmation>), ClientError>, ProvisionError> {
        let (agent, action) = rpc.split_once('#').expect("rpc names are agent#action");
        let started = Instant::now();
        let request = self
            .client
            .request(&self.identity, agent, action, data, opts);
        let result = tokio::select! {
            r = request => r,
            _ = self.ctx.abandon.cancelled() => return Err(ProvisionError::Abandoned),
        };
        let took = started.elapsed();
        let trace = self.trace.as_deref().map(|t| t.trace_id());
        self.ctx.metrics.observe_rpc(rpc, took, trace);
        self.place
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .heard(heard(&result, took));
        // An answer in the node's own name confirms it, even one whose
        // body is not what we asked for.
        if matches!(&result, Ok(_) | Err(ClientError::BadReply { .. })) {
            self.confirmed();
        }
        if let Ok((r, _)) = &result {
            if is_lock_refusal(r) {
                // Another provisioner holds this node (go-choria's
                // per-node lock): not a failure to retry in a storm;
                // the node is left to its holder until it shows up again.
                self.ctx.metrics.lock_refusal();
                return Err(ProvisionError::Locked { rpc });
            }
        }
        Ok(result)
    }

    /// Before attempt `attempt + 1`: moves to the suspect lane and waits
    /// out the backoff; `false` when there is no room there now (the name
    /// is retried at the next discovery, behind the names that have not
    /// failed).
    async fn wait_to_retry(&self, attempt: u32) -> Result<bool, ProvisionError> {
        let demoted = self
            .place
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .demote();
        if !demoted {
            return Ok(false);
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff(attempt)) => Ok(true),
            _ = self.ctx.abandon.cancelled() => Err(ProvisionError::Abandoned),
        }
    }

    /// A failed attempt's log line: a warning (at a bounded rate) once the
    /// name is confirmed; before, nothing says the name is real, and a
    /// made-up one must not cost a log line per attempt.
    fn log_failed_attempt(&self, rpc: &'static str, attempt: u32, tries: u32, e: &str) {
        if !self.is_answered() {
            debug!(node = &*self.identity, rpc, attempt, tries, error = %e, "RPC attempt failed");
            return;
        }
        if let Allow::Yes { suppressed } = self.ctx.logs.check("rpc attempt", Instant::now()) {
            warn!(node = &*self.identity, rpc, attempt, tries, error = %e, suppressed_before = suppressed, "RPC attempt failed");
        }
    }
}

/// What a request's end tells its lane's in-flight bound: an answer in
/// the node's name and how long it took, or that the broker would not take
/// the request. Nothing else: no answer is what made-up names give, and
/// they must not talk the bound down.
fn heard<T>(result: &Result<T, ClientError>, took: Duration) -> Heard {
    match result {
        Ok(_) | Err(ClientError::BadReply { .. }) => Heard::Answer(took),
        Err(
            ClientError::NotConnected { .. }
            | ClientError::NotSent { .. }
            | ClientError::Publish { .. }
            | ClientError::Flush(_),
        ) => Heard::Refused,
        Err(_) => Heard::Nothing,
    }
}

/// A reply with a status other than OK is a failed attempt, with Go's message.
pub(super) fn require_ok(r: &RpcResult) -> Result<(), String> {
    if r.body.is_ok() {
        Ok(())
    } else {
        Err(format!(
            "invalid response from {}: {} ({})",
            r.reply.sender, r.body.statusmsg, r.body.statuscode as u8
        ))
    }
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(
    data: &serde_json::Value,
) -> Result<T, String> {
    serde_json::from_value(data.clone())
        .map_err(|e| format!("could not decode the reply data: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_and_refused_sends_reach_the_bound() {
        let took = Duration::from_secs(3);
        let answer: Result<(), ClientError> = Ok(());
        assert_eq!(heard(&answer, took), Heard::Answer(took));
        let bad = Err::<(), _>(ClientError::BadReply {
            identity: "n1".into(),
            reason: "undecodable".into(),
        });
        assert_eq!(heard(&bad, took), Heard::Answer(took));
        let timeout = Err::<(), _>(ClientError::Timeout {
            identity: "made-up.example.net".into(),
            agent: "choria_provision".into(),
            action: "jwt".into(),
            timeout: took,
            ignored: Default::default(),
        });
        assert_eq!(heard(&timeout, took), Heard::Nothing);
        let refused = Err::<(), _>(ClientError::NotSent {
            reason: "reconnected".into(),
        });
        assert_eq!(heard(&refused, took), Heard::Refused);
    }

    #[test]
    fn backoff_follows_go_five_sec_policy_with_jitter() {
        for (try_number, base) in [(1u32, 750u64), (2, 1000), (3, 1500), (50, 5000)] {
            for _ in 0..50 {
                let d = backoff(try_number).as_millis() as u64;
                assert!(
                    d >= base / 2 && d < base / 2 + base,
                    "try {try_number}: {d} ms outside [{}, {})",
                    base / 2,
                    base / 2 + base
                );
            }
        }
    }
}
