//! SimpleRPC (mcorpc) request and reply bodies and status codes
//! (`providers/agent/mcorpc`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::fmt;

/// Status codes of an mcorpc reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "u8", try_from = "i64")]
pub enum StatusCode {
    Ok = 0,
    Aborted = 1,
    UnknownAction = 2,
    MissingData = 3,
    InvalidData = 4,
    UnknownError = 5,
}

impl From<StatusCode> for u8 {
    fn from(s: StatusCode) -> u8 {
        s as u8
    }
}

impl TryFrom<i64> for StatusCode {
    type Error = String;
    fn try_from(v: i64) -> Result<Self, Self::Error> {
        Ok(match v {
            0 => StatusCode::Ok,
            1 => StatusCode::Aborted,
            2 => StatusCode::UnknownAction,
            3 => StatusCode::MissingData,
            4 => StatusCode::InvalidData,
            5 => StatusCode::UnknownError,
            other => return Err(format!("unknown mcorpc status code {other}")),
        })
    }
}

impl fmt::Display for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", *self as u8)
    }
}

/// An RPC request body: `{"agent":…,"action":…,"data":…}` in that order.
#[derive(Debug, Serialize)]
pub struct RpcRequest<'a, T: Serialize> {
    pub agent: &'a str,
    pub action: &'a str,
    pub data: &'a T,
}

/// An RPC request as a server parses it; `data` is kept raw so each action parses
/// its own inputs and can answer `InvalidData` precisely.
#[derive(Debug, Deserialize)]
pub struct IncomingRpcRequest {
    pub agent: String,
    pub action: String,
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// An RPC reply body: `{"action":…,"statuscode":…,"statusmsg":…,"data":…}`.
#[derive(Debug, Serialize, Deserialize, Clone)]
pub struct RpcReply {
    #[serde(default)]
    pub action: String,
    pub statuscode: StatusCode,
    #[serde(default)]
    pub statusmsg: String,
    #[serde(default)]
    pub data: serde_json::Value,
}

impl RpcReply {
    pub fn is_ok(&self) -> bool {
        self.statuscode == StatusCode::Ok
    }
}

/// A reply body as a server writes it. `data` is any serializable value so that
/// typed replies keep Go's struct field order.
#[derive(Debug, Serialize)]
pub struct RpcReplyOut<'a, T: Serialize> {
    pub action: &'a str,
    pub statuscode: StatusCode,
    pub statusmsg: &'a str,
    pub data: &'a T,
}

/// Encodes a successful reply.
pub fn ok_reply<T: Serialize>(action: &str, data: &T) -> Vec<u8> {
    encode_reply(action, StatusCode::Ok, "OK", data)
}

/// Encodes a failed reply; go-choria still sends `data: {}` with a failure.
pub fn error_reply(action: &str, code: StatusCode, msg: &str) -> Vec<u8> {
    encode_reply(action, code, msg, &serde_json::Map::new())
}

pub fn encode_reply<T: Serialize>(action: &str, code: StatusCode, msg: &str, data: &T) -> Vec<u8> {
    let out = RpcReplyOut {
        action,
        statuscode: code,
        statusmsg: msg,
        data,
    };
    crate::json::to_vec(&out).expect("reply bodies always serialize")
}

/// The DDL timeouts of the agents a provisioner talks to (seconds).
pub fn agent_timeout_secs(agent: &str) -> u64 {
    match agent {
        "choria_provision" => 20,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_body_keeps_go_field_order_and_sorted_data_keys() {
        let mut data = std::collections::BTreeMap::new();
        data.insert("token", "s3cret");
        data.insert("nonce", "abc");
        let body = RpcRequest {
            agent: "choria_provision",
            action: "gen25519",
            data: &data,
        };
        assert_eq!(
            crate::json::to_string(&body).unwrap(),
            r#"{"agent":"choria_provision","action":"gen25519","data":{"nonce":"abc","token":"s3cret"}}"#
        );
    }

    #[test]
    fn reply_body_keeps_go_field_order() {
        #[derive(Serialize)]
        struct JwtReply {
            jwt: &'static str,
            ecdh_public: &'static str,
        }
        let r = ok_reply(
            "jwt",
            &JwtReply {
                jwt: "x",
                ecdh_public: "y",
            },
        );
        assert_eq!(
            String::from_utf8(r).unwrap(),
            r#"{"action":"jwt","statuscode":0,"statusmsg":"OK","data":{"jwt":"x","ecdh_public":"y"}}"#
        );
        let e = error_reply(
            "jwt",
            StatusCode::Aborted,
            "Incorrect provision token supplied",
        );
        assert_eq!(
            String::from_utf8(e).unwrap(),
            r#"{"action":"jwt","statuscode":1,"statusmsg":"Incorrect provision token supplied","data":{}}"#
        );
    }

    #[test]
    fn unknown_status_codes_are_rejected() {
        assert!(serde_json::from_str::<RpcReply>(
            r#"{"action":"x","statuscode":9,"statusmsg":"","data":{}}"#
        )
        .is_err());
        let r: RpcReply = serde_json::from_str(r#"{"statuscode":4,"statusmsg":"bad"}"#).unwrap();
        assert_eq!(r.statuscode, StatusCode::InvalidData);
    }
}
