//! The `discovery` agent: go-choria answers "pong" to any payload that
//! contains "ping" (broadcast discovery), and nothing otherwise.

use super::*;

pub(super) fn handle(payload: &[u8]) -> Handled {
    if payload.windows(4).any(|w| w == b"ping") {
        return Handled {
            response: Response::Reply(b"pong".to_vec()),
            effects: Effects::default(),
            action: "ping".into(),
            statuscode: None,
            statusmsg: String::new(),
        };
    }
    Handled::no_reply("", "discovery request without ping")
}
