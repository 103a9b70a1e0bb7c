//! Request identifiers.
//!
//! v1 servers validate `requestid` against a schema that demands exactly 32
//! characters, which is what Go's UUIDv4-without-dashes gives. v2 uses KSUIDs
//! (27 base62 characters) and only requires a non-empty id.

use svix_ksuid::{Ksuid, KsuidLike};

/// A v1 request id: a random UUIDv4 in lowercase hex without dashes (32 chars).
pub fn v1_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A v2 request id: a KSUID for the current time.
pub fn v2_request_id() -> String {
    Ksuid::new(None, None).to_string()
}

/// A lifecycle event id: a UUIDv4 with dashes, as go-choria's lifecycle package makes.
pub fn event_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_ids_are_32_lowercase_hex_chars() {
        let id = v1_request_id();
        assert_eq!(id.len(), 32);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(id, v1_request_id());
    }

    #[test]
    fn v2_ids_are_27_char_ksuids() {
        let id = v2_request_id();
        assert_eq!(id.len(), 27);
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric()));
    }

    #[test]
    fn event_ids_are_dashed_uuids() {
        let id = event_id();
        assert_eq!(id.len(), 36);
        assert_eq!(id.matches('-').count(), 4);
    }
}
