//! How a request goes out: encoded and signed with a TTL no longer than the
//! wait for its answer, then published only while the connection is up.

use super::{connected_url, ChoriaClient, ClientError};
use crate::filter::Filter;
use crate::protocol::{self, RequestSpec, Version};
use std::time::Duration;

/// How long after the connection was last seen up a directed request may
/// still be handed to the NATS client (see `publish_awaiting`): well inside
/// the margin between a cut-off leader's pause and a standby's first
/// request (1.2 s and more in tests/it/faults.rs), far above what a send takes
/// when the client keeps up (microseconds).
const SEND_WITHIN: Duration = Duration::from_millis(500);

impl ChoriaClient {
    /// The TTL of a request we wait `timeout` for: that long (rounded up),
    /// within what the protocol allows (v1's schema wants at least 30 s) and
    /// Go's 60 s. A node must not act on a request after we stopped waiting
    /// for it: a request buffered across a reconnect would otherwise reach a
    /// node up to 60 s late, after another leader started on it. Clocks of
    /// nodes and provisioner may differ by up to the TTL.
    pub fn ttl_for(&self, timeout: Duration) -> i64 {
        request_ttl(self.version(), timeout, self.ttl)
    }

    pub(super) fn encode(
        &self,
        id: &str,
        agent: &str,
        filter: &Filter,
        payload: &[u8],
        reply_to: &str,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let url = connected_url(&self.nats);
        let spec = RequestSpec {
            id,
            sender: &self.me.identity,
            caller: &self.me.caller,
            collective: &self.collective,
            agent,
            ttl: {
                let ttl = self.ttl_for(timeout);
                if let Some(f) = &self.fence {
                    f.sent(ttl);
                }
                ttl
            },
            time_nanos: now_nanos(),
            filter,
            payload,
            reply_to,
            connected_url: &url,
        };
        Ok(self.me.signer.encode_request(&spec)?)
    }

    /// Subscribes to `reply_to`, then publishes `msg` to `target`.
    pub(super) async fn publish_awaiting(
        &self,
        reply_to: &str,
        target: String,
        msg: Vec<u8>,
    ) -> Result<async_nats::Subscriber, ClientError> {
        let (sub, window) = self.subscribe_to_send(reply_to, &target).await?;
        self.publish_within(&window, target, msg.into()).await?;
        Ok(sub)
    }

    /// The first half of [`ChoriaClient::publish_awaiting`]: the reply
    /// subscription, made only while connected, and the window the request
    /// (or a batch's requests) may then go out in.
    ///
    /// While disconnected the NATS client buffers publishes and sends them
    /// on reconnect: a request queued during an outage would reach the node
    /// seconds later, possibly after this replica paused and another took
    /// the node over. A request that cannot go now fails now (an attempt
    /// failure, retried behind the pause gate).
    ///
    /// The check and the send are apart, and the client queues what it is
    /// handed while it has not yet noticed a connection is gone: with
    /// hundreds of sequences in flight the queue can be full, and a send
    /// waiting for room can outlast the outage. So a request goes only if it
    /// can within SEND_WITHIN of the check, on the same connection (no
    /// reconnect in between); otherwise it is not sent at all (a send not
    /// yet queued is dropped with its future), and the attempt fails.
    pub(super) async fn subscribe_to_send(
        &self,
        reply_to: &str,
        target: &str,
    ) -> Result<(async_nats::Subscriber, SendWindow), ClientError> {
        let window = SendWindow {
            connects: self.connects(),
            deadline: tokio::time::Instant::now() + SEND_WITHIN,
        };
        let not_sent = || ClientError::NotConnected {
            subject: target.to_string(),
        };
        if !self.connected() {
            return Err(not_sent());
        }
        match tokio::time::timeout_at(window.deadline, self.nats.subscribe(reply_to.to_string()))
            .await
        {
            Ok(sub) => Ok((
                sub.map_err(|source| ClientError::Subscribe {
                    subject: reply_to.to_string(),
                    source,
                })?,
                window,
            )),
            Err(_) => Err(not_sent()),
        }
    }

    /// Publishes `msg` to `target` if the connection `window` was opened on
    /// is still up and the send fits in the window (see
    /// [`ChoriaClient::subscribe_to_send`]).
    pub(super) async fn publish_within(
        &self,
        window: &SendWindow,
        target: String,
        msg: bytes::Bytes,
    ) -> Result<(), ClientError> {
        self.publish_by(window, window.deadline, target, msg).await
    }

    /// One of a batch's sends (see `batch`): on the connection `window` was
    /// opened on, within SEND_WITHIN of its own start, so a batch to
    /// hundreds of nodes on a busy client is not cut short by the time its
    /// first sends took.
    pub(super) async fn publish_next(
        &self,
        window: &SendWindow,
        target: String,
        msg: bytes::Bytes,
    ) -> Result<(), ClientError> {
        let deadline = tokio::time::Instant::now() + SEND_WITHIN;
        self.publish_by(window, deadline, target, msg).await
    }

    async fn publish_by(
        &self,
        window: &SendWindow,
        deadline: tokio::time::Instant,
        target: String,
        msg: bytes::Bytes,
    ) -> Result<(), ClientError> {
        if !self.connected() || self.connects() != window.connects {
            return Err(ClientError::NotConnected { subject: target });
        }
        match tokio::time::timeout_at(deadline, self.nats.publish(target.clone(), msg)).await {
            Ok(sent) => sent.map_err(|source| ClientError::Publish {
                subject: target,
                source,
            }),
            Err(_) => Err(ClientError::NotConnected { subject: target }),
        }
    }

    fn connects(&self) -> u64 {
        self.nats
            .statistics()
            .connects
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn connected(&self) -> bool {
        self.nats.connection_state() == async_nats::connection::State::Connected
    }
}

/// The connection and the time a request may still go out in.
pub(super) struct SendWindow {
    connects: u64,
    deadline: tokio::time::Instant,
}

pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// See [`ChoriaClient::ttl_for`]: `timeout` rounded up to whole seconds,
/// at least the version's minimum, at most `max` (Go's 60 s).
pub fn request_ttl(version: Version, timeout: Duration, max: i64) -> i64 {
    let wanted = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX)
        + i64::from(timeout.subsec_nanos() > 0);
    let min = match version {
        Version::V1 => protocol::v1::MIN_TTL,
        Version::V2 => 1,
    };
    wanted.clamp(min, max.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_live_as_long_as_we_wait_for_them() {
        let s = Duration::from_secs;
        // Go's default wait for choria_provision: 2 s + 20 s.
        assert_eq!(request_ttl(Version::V2, s(22), 60), 22);
        assert_eq!(request_ttl(Version::V2, Duration::from_millis(2500), 60), 3);
        assert_eq!(request_ttl(Version::V2, Duration::ZERO, 60), 1);
        assert_eq!(request_ttl(Version::V2, s(300), 60), 60);
        // v1 servers refuse a TTL under 30.
        assert_eq!(request_ttl(Version::V1, s(3), 60), 30);
        assert_eq!(request_ttl(Version::V1, s(45), 60), 45);
    }
}
