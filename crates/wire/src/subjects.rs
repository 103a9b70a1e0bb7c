//! NATS subjects of a Choria collective (`choria/connection.go`, `message/message.go`).

use md5::{Digest, Md5};

/// The collective every provisioning-mode server joins.
pub const PROVISIONING_COLLECTIVE: &str = "provisioning";

/// Directed requests to one node.
pub fn node(collective: &str, identity: &str) -> String {
    format!("{collective}.node.{identity}")
}

/// Broadcast requests to every node that has `agent`.
pub fn broadcast_agent(collective: &str, agent: &str) -> String {
    format!("{collective}.broadcast.agent.{agent}")
}

/// Lowercase hex MD5 of the caller id, the per-caller part of reply subjects.
pub fn caller_hash(caller: &str) -> String {
    hex::encode(Md5::digest(caller.as_bytes()))
}

/// Where replies to `request_id` go.
pub fn reply(collective: &str, caller: &str, request_id: &str) -> String {
    format!("{collective}.reply.{}.{request_id}", caller_hash(caller))
}

/// The NATS inbox prefix a client uses: JWT clients are confined to their own
/// caller's reply space by the broker, x509 clients share `<collective>.reply`.
pub fn inbox_prefix(collective: &str, caller: &str, jwt_auth: bool) -> String {
    if jwt_auth {
        format!("{collective}.reply.{}", caller_hash(caller))
    } else {
        format!("{collective}.reply")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_subject_uses_md5_of_the_caller() {
        assert_eq!(
            caller_hash("choria=provisioner.mcollective"),
            "344aa967e9f3339639bf1c959876175b"
        );
        assert_eq!(
            reply(
                "provisioning",
                "choria=provisioner.mcollective",
                "d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d"
            ),
            "provisioning.reply.344aa967e9f3339639bf1c959876175b.d4c5f9a2b1e34f6a8c7d9e0f1a2b3c4d"
        );
    }

    #[test]
    fn request_subjects() {
        assert_eq!(
            node("provisioning", "n1.example.net"),
            "provisioning.node.n1.example.net"
        );
        assert_eq!(
            broadcast_agent("provisioning", "discovery"),
            "provisioning.broadcast.agent.discovery"
        );
        assert_eq!(
            inbox_prefix("provisioning", "c", false),
            "provisioning.reply"
        );
        assert!(inbox_prefix("provisioning", "c", true).starts_with("provisioning.reply."));
    }
}
