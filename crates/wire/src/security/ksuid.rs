//! KSUIDs (K-Sortable Unique IDs) as used for the `jti` claim of Choria JWTs.
//!
//! Chain-issued tokens are only accepted by brokers and servers when their `jti`
//! is a KSUID whose embedded timestamp equals the token's `iat`
//! (`tokens:standard.go` `verifyIssuerRequiredClaims`), so we must be able to
//! both mint a KSUID for an exact second and read the second back out.
//!
//! Generation delegates to `svix-ksuid` (Segment compatible encoding). Parsing is
//! our own because `svix-ksuid` accepts strings of any length and silently
//! truncates values above 160 bits, whereas Segment's `ksuid.Parse` (used by
//! the Go side) insists on exactly 27 characters and rejects overflow.

use rand::RngCore;
use svix_ksuid::Ksuid;

/// Start of the KSUID epoch in Unix seconds (2014-05-13T16:53:20Z).
pub const KSUID_EPOCH: i64 = 1_400_000_000;

/// Length of a base62 encoded KSUID.
pub const KSUID_STRING_LEN: usize = 27;

/// The largest possible KSUID; base62 strings of fixed width sort like numbers
/// because the alphabet is in ASCII order, so a string compare detects overflow.
const MAX_KSUID: &str = "aWgEPTl1tmebfsQzFP4bxwgy80V";

/// Latest Unix second a KSUID can represent.
pub const KSUID_MAX_UNIX: i64 = KSUID_EPOCH + u32::MAX as i64;

/// Errors from creating or parsing KSUIDs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KsuidError {
    /// The requested time cannot be stored in the 32-bit KSUID timestamp.
    #[error(
        "unix time {0} cannot be encoded in a KSUID (valid range {KSUID_EPOCH}..={KSUID_MAX_UNIX})"
    )]
    TimestampOutOfRange(i64),
    /// The string has the wrong length.
    #[error("a KSUID must be exactly 27 characters long, got {0} bytes")]
    Length(usize),
    /// The string has a character outside `0-9A-Za-z`.
    #[error("a KSUID may only contain the base62 characters 0-9, A-Z and a-z (bad byte at position {0})")]
    Alphabet(usize),
    /// The value does not fit into 160 bits.
    #[error("the KSUID value is larger than the maximum possible KSUID")]
    Overflow,
}

/// Creates a new random KSUID whose timestamp is `unix_secs`.
///
/// The 16 byte payload comes from the thread-local CSPRNG.
pub fn new_ksuid_at(unix_secs: i64) -> Result<String, KsuidError> {
    // The valid range is exactly the offsets from the epoch that fit in u32.
    let raw = unix_secs
        .checked_sub(KSUID_EPOCH)
        .and_then(|offset| u32::try_from(offset).ok())
        .ok_or(KsuidError::TimestampOutOfRange(unix_secs))?;
    let mut payload = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut payload);
    Ok(Ksuid::new_raw(raw, Some(&payload)).to_string())
}

/// Returns the Unix timestamp (seconds) embedded in a KSUID string.
///
/// Stricter than Segment's Go parser in one way: it rejects characters outside
/// the base62 alphabet (Go maps them to garbage digit values). Such strings
/// never come out of a KSUID generator, so nothing valid is lost.
pub fn ksuid_timestamp(s: &str) -> Result<i64, KsuidError> {
    if s.len() != KSUID_STRING_LEN {
        return Err(KsuidError::Length(s.len()));
    }
    if let Some(pos) = s.bytes().position(|b| !b.is_ascii_alphanumeric()) {
        return Err(KsuidError::Alphabet(pos));
    }
    if s > MAX_KSUID {
        return Err(KsuidError::Overflow);
    }
    let k: Ksuid = s.parse().map_err(|_| KsuidError::Overflow)?;
    Ok(i64::from(k.timestamp_raw()) + KSUID_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_timestamp() {
        for ts in [KSUID_EPOCH, 1_700_000_000, KSUID_MAX_UNIX] {
            let k = new_ksuid_at(ts).unwrap();
            assert_eq!(k.len(), 27);
            assert_eq!(ksuid_timestamp(&k).unwrap(), ts);
        }
    }

    #[test]
    fn two_ksuids_at_same_second_differ() {
        assert_ne!(
            new_ksuid_at(1_700_000_000).unwrap(),
            new_ksuid_at(1_700_000_000).unwrap()
        );
    }

    #[test]
    fn known_segment_vector() {
        // From segmentio/ksuid README: 0ujtsYcgvSTl8PAuAdqWYSMnLOv has
        // timestamp 107608047 (2017-10-10T04:00:47Z).
        assert_eq!(
            ksuid_timestamp("0ujtsYcgvSTl8PAuAdqWYSMnLOv").unwrap(),
            107_608_047 + KSUID_EPOCH
        );
        assert_eq!(ksuid_timestamp(MAX_KSUID).unwrap(), KSUID_MAX_UNIX);
        assert_eq!(
            ksuid_timestamp("000000000000000000000000000").unwrap(),
            KSUID_EPOCH
        );
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(
            new_ksuid_at(KSUID_EPOCH - 1),
            Err(KsuidError::TimestampOutOfRange(KSUID_EPOCH - 1))
        );
        assert_eq!(
            new_ksuid_at(KSUID_MAX_UNIX + 1),
            Err(KsuidError::TimestampOutOfRange(KSUID_MAX_UNIX + 1))
        );
        assert_eq!(ksuid_timestamp("abc"), Err(KsuidError::Length(3)));
        assert_eq!(
            ksuid_timestamp("0ujtsYcgvSTl8PAuAdqWYSMnLO-"),
            Err(KsuidError::Alphabet(26))
        );
        assert_eq!(
            ksuid_timestamp("aWgEPTl1tmebfsQzFP4bxwgy80W"),
            Err(KsuidError::Overflow)
        );
        assert_eq!(
            ksuid_timestamp("zzzzzzzzzzzzzzzzzzzzzzzzzzz"),
            Err(KsuidError::Overflow)
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".{0,40}") {
            let _ = ksuid_timestamp(&s);
        }

        #[test]
        fn parse_never_panics_on_base62(s in "[0-9A-Za-z]{27}") {
            if let Ok(ts) = ksuid_timestamp(&s) {
                prop_assert!((KSUID_EPOCH..=KSUID_MAX_UNIX).contains(&ts));
            }
        }

        #[test]
        fn any_valid_time_round_trips(ts in KSUID_EPOCH..=KSUID_MAX_UNIX) {
            let k = new_ksuid_at(ts).unwrap();
            prop_assert_eq!(ksuid_timestamp(&k).unwrap(), ts);
        }
    }
}
