//! The keys a value may be stored under: its own (a node's identity, an
//! instance), or an overflow key of it when its own holds all it may (see
//! [`super::ledger`]).

/// Hex digits after the `.` of an overflow key.
pub const OVERFLOW_HEX: usize = 16;

/// Whether `key` is `natural` itself or one of its overflow keys.
pub fn is_key_of(natural: &str, key: &str) -> bool {
    if key == natural {
        return true;
    }
    key.strip_prefix(natural)
        .and_then(|rest| rest.strip_prefix('.'))
        .is_some_and(|h| {
            h.len() == OVERFLOW_HEX && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// A fresh overflow key of `natural`.
pub fn overflow_key(natural: &str) -> String {
    let n: u64 = rand::random();
    format!("{natural}.{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_keys_belong_to_their_key_only() {
        let k = overflow_key("web-1.example.net");
        assert!(is_key_of("web-1.example.net", &k));
        assert!(is_key_of("web-1.example.net", "web-1.example.net"));
        assert!(!is_key_of("web-1.example", &k), "not a prefix's");
        assert!(!is_key_of("web-1.example.net", "web-1.example.net.mail"));
        assert!(!is_key_of(
            "web-1.example.net",
            "web-1.example.net.0123456789ABCDEF"
        ));
        assert!(!is_key_of(
            "web-1.example.net",
            "web-1.example.netx0123456789abcdef"
        ));
        assert_ne!(k, overflow_key("web-1.example.net"));
    }
}
