//! Which message on a request's reply subject is its answer.
//!
//! In the provisioning collective nothing authenticates a reply: any
//! connection may subscribe to another node's request subject, learn the
//! reply subject and publish there, under its own name or the node's. So a
//! reply is the answer only when it decodes, carries the request's id, and
//! both its transport sender and its own sender are the identity the request
//! went to. Anything else is ignored for that request — neither the answer
//! nor an attempt failure — and reported (see [`ReplyObserver`]).
//!
//! That still lets a node that claims the victim's name answer first. For
//! the steps whose answers later steps trust (a key to encrypt to, a CSR to
//! sign) the subject is watched for a short window after the first answer
//! ([`Confirmation`]): a second, different answer means two parties claim
//! the node, and the caller aborts it for this cycle.

use crate::protocol::{self, Reply};
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Where one request's candidate answers arrive: its own subscription to
/// its reply subject, or its share of a batch's (see `client::batch`: one
/// signed message to many nodes, one reply subject, each message handed to
/// the request of the node it names as its transport sender).
pub enum ReplyStream {
    Own(async_nats::Subscriber),
    Shared(mpsc::Receiver<async_nats::Message>),
}

impl ReplyStream {
    /// The next message, `None` once nothing more can come.
    pub async fn next(&mut self) -> Option<async_nats::Message> {
        match self {
            ReplyStream::Own(sub) => sub.next().await,
            ReplyStream::Shared(rx) => rx.recv().await,
        }
    }

    /// Stops listening: unsubscribes its own subscription; a share is
    /// given back by dropping it (the batch's subscription ends once every
    /// share is gone).
    pub async fn close(self) {
        if let ReplyStream::Own(mut sub) = self {
            let _ = sub.unsubscribe().await;
        }
    }
}

/// Why a message on a reply subject was not taken as the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// Not a reply in either protocol version, so nothing says who sent it.
    Undecodable,
    /// A reply to another request.
    WrongRequest,
    /// A reply from someone other than the node asked.
    OtherSender,
    /// The same answer again (harmless; counted).
    Duplicate,
    /// A reply beyond what its queue can hold: a discovery reply past the
    /// work queue, or a flood in one node's name on a batch's reply subject.
    Overflow,
}

impl Ignored {
    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            Ignored::Undecodable => "undecodable",
            Ignored::WrongRequest => "wrong_request",
            Ignored::OtherSender => "other_sender",
            Ignored::Duplicate => "duplicate",
            Ignored::Overflow => "overflow",
        }
    }

    pub const ALL: [Ignored; 5] = [
        Ignored::Undecodable,
        Ignored::WrongRequest,
        Ignored::OtherSender,
        Ignored::Duplicate,
        Ignored::Overflow,
    ];
}

/// How many messages on one request's reply subject were not taken as its
/// answer, by reason; shown in a timeout so "no reply" is not mistaken for a
/// silent node when the node (or someone) did answer, unacceptably.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IgnoredTally([u32; Ignored::ALL.len()]);

impl IgnoredTally {
    pub fn add(&mut self, why: Ignored) {
        let i = Ignored::ALL.iter().position(|w| *w == why).unwrap_or(0);
        self.0[i] = self.0[i].saturating_add(1);
    }

    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }

    pub fn count(&self, why: Ignored) -> u32 {
        Ignored::ALL
            .iter()
            .position(|w| *w == why)
            .map_or(0, |i| self.0[i])
    }
}

/// Empty when nothing was ignored, else `; ignored 2 messages (1 undecodable, 1 other_sender)`.
impl std::fmt::Display for IgnoredTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total = self.total();
        if total == 0 {
            return Ok(());
        }
        let plural = if total == 1 { "" } else { "s" };
        write!(f, "; ignored {total} message{plural} (")?;
        let mut first = true;
        for (why, n) in Ignored::ALL.iter().zip(self.0) {
            if n > 0 {
                if !first {
                    f.write_str(", ")?;
                }
                write!(f, "{n} {}", why.reason())?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// What to do with one message on a reply subject.
#[derive(Debug)]
pub enum Verdict {
    Answer(Reply),
    /// Not the answer; `claimed` is the sender the message names, if it
    /// decoded (untrusted text: log it through `identity::preview`).
    Ignore {
        why: Ignored,
        claimed: Option<String>,
    },
}

/// The acceptance rule of the module documentation.
pub fn classify(payload: &[u8], request_id: &str, identity: &str) -> Verdict {
    let reply = match protocol::decode_reply(payload) {
        Ok(r) => r,
        Err(_) => {
            return Verdict::Ignore {
                why: Ignored::Undecodable,
                claimed: protocol::transport_sender(payload).ok(),
            }
        }
    };
    if reply.request_id != request_id {
        return Verdict::Ignore {
            why: Ignored::WrongRequest,
            claimed: Some(reply.transport_sender),
        };
    }
    if reply.transport_sender != identity || reply.sender != identity {
        let claimed = if reply.transport_sender != identity {
            reply.transport_sender
        } else {
            reply.sender
        };
        return Verdict::Ignore {
            why: Ignored::OtherSender,
            claimed: Some(claimed),
        };
    }
    Verdict::Answer(reply)
}

/// Told about every message that was not an answer, so the caller can count
/// and log it (the client itself has no metrics).
pub trait ReplyObserver: Send + Sync {
    /// A message on the reply subject of a request to `node` (`rpc` is
    /// `agent#action`, or `discovery`) was not its answer.
    fn ignored(&self, node: &str, rpc: &str, why: Ignored, claimed: Option<&str>);
    /// An identity from `source` (`discovery`, `event`) failed
    /// [`crate::identity::validate`]; `raw` is untrusted.
    fn rejected_identity(&self, source: &str, error: &crate::identity::IdentityError, raw: &str);
    /// One signed request (`agent#action`) went out to `targets` nodes
    /// (more than one when requests were batched, see `client::batch`).
    fn batched(&self, _rpc: &str, _targets: usize) {}
}

/// Two different answers to one request, both claiming to be the node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("two different answers to {rpc} claiming to come from the node (first from {first_sender}, then from {second_sender} {after:?} later); someone else answers in its name")]
pub struct Conflict {
    pub rpc: String,
    pub first_sender: String,
    pub second_sender: String,
    pub after: Duration,
}

/// The watch kept on a reply subject after its first answer.
#[derive(Debug)]
pub struct Confirmation {
    task: JoinHandle<Result<(), Conflict>>,
}

impl Confirmation {
    /// Watches `sub` for `window` after `first` arrived; a different answer
    /// in that time is a [`Conflict`].
    pub(crate) fn watch(
        mut sub: ReplyStream,
        first: Reply,
        request_id: String,
        identity: String,
        rpc: String,
        window: Duration,
        observer: Option<Arc<dyn ReplyObserver>>,
    ) -> Self {
        let task = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let deadline = started + window;
            let mut outcome = Ok(());
            while let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await {
                match classify(&m.payload, &request_id, &identity) {
                    Verdict::Answer(r) if r.message == first.message => {
                        if let Some(o) = &observer {
                            o.ignored(&identity, &rpc, Ignored::Duplicate, Some(&r.sender));
                        }
                    }
                    Verdict::Answer(r) => {
                        outcome = Err(Conflict {
                            rpc: rpc.clone(),
                            first_sender: first.transport_sender.clone(),
                            second_sender: r.transport_sender,
                            after: started.elapsed(),
                        });
                        break;
                    }
                    Verdict::Ignore { why, claimed } => {
                        if let Some(o) = &observer {
                            o.ignored(&identity, &rpc, why, claimed.as_deref());
                        }
                    }
                }
            }
            sub.close().await;
            outcome
        });
        Confirmation { task }
    }

    /// Resolves once the window is over: `Err` when a conflicting answer came.
    pub async fn wait(self) -> Result<(), Conflict> {
        // The task only ends by itself; a panic in it would be a bug here,
        // and is no reason to trust the answer.
        self.task.await.unwrap_or_else(|e| {
            Err(Conflict {
                rpc: format!("(the confirmation watch failed: {e})"),
                first_sender: String::new(),
                second_sender: String::new(),
                after: Duration::ZERO,
            })
        })
    }

    /// Whether the window is over already.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ReplySpec, Version};

    fn reply(version: Version, request_id: &str, sender: &str, body: &[u8]) -> Vec<u8> {
        let spec = ReplySpec {
            request_id,
            sender,
            agent: "choria_provision",
            time_nanos: 1,
            body,
            connected_url: "nats://broker:4222",
        };
        match version {
            Version::V1 => protocol::v1::encode_reply(&spec).unwrap(),
            Version::V2 => protocol::v2::encode_reply(&spec).unwrap(),
        }
    }

    #[test]
    fn a_timeout_names_what_was_ignored_and_nothing_when_nothing_was() {
        let mut t = IgnoredTally::default();
        assert_eq!(t.to_string(), "");
        t.add(Ignored::Undecodable);
        assert_eq!(t.to_string(), "; ignored 1 message (1 undecodable)");
        t.add(Ignored::OtherSender);
        t.add(Ignored::OtherSender);
        assert_eq!(
            t.to_string(),
            "; ignored 3 messages (1 undecodable, 2 other_sender)"
        );
        assert_eq!((t.total(), t.count(Ignored::OtherSender)), (3, 2));
    }

    #[test]
    fn the_answer_comes_from_the_node_asked_with_the_request_id() {
        for v in [Version::V1, Version::V2] {
            let ok = reply(v, "req1", "node-1.example.net", b"{}");
            assert!(matches!(
                classify(&ok, "req1", "node-1.example.net"),
                Verdict::Answer(_)
            ));
        }
    }

    #[test]
    fn a_reply_under_another_name_is_ignored_and_names_its_sender() {
        let impostor = reply(Version::V1, "req1", "impostor.example.net", b"{}");
        match classify(&impostor, "req1", "node-1.example.net") {
            Verdict::Ignore { why, claimed } => {
                assert_eq!(why, Ignored::OtherSender);
                assert_eq!(claimed.as_deref(), Some("impostor.example.net"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_requests_reply_and_garbage_are_ignored() {
        let other = reply(Version::V2, "req2", "node-1.example.net", b"{}");
        assert!(matches!(
            classify(&other, "req1", "node-1.example.net"),
            Verdict::Ignore {
                why: Ignored::WrongRequest,
                ..
            }
        ));
        assert!(matches!(
            classify(b"not a reply", "req1", "node-1.example.net"),
            Verdict::Ignore {
                why: Ignored::Undecodable,
                claimed: None
            }
        ));
    }
}
