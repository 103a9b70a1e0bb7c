//! Kubernetes' name rules, which configuration checks before anything
//! reaches the API server.

/// An RFC 1123 label: namespaces, most object names' parts.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An RFC 1123 subdomain: names of Leases, ConfigMaps and most objects.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns_label("a-1"));
        assert!(!is_dns_label("-a") && !is_dns_label("A") && !is_dns_label("a.b"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("a.b-c.d"));
        assert!(!is_dns_subdomain(".a") && !is_dns_subdomain("a_b"));
    }
}
