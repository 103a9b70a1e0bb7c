//! rpm-style version comparison, matching the rules the Go provisioner uses
//! (its `host/version.go`, itself taken from go-rpm-version) to decide
//! whether a node already runs the version the helper asked for.
//!
//! A version is `[epoch:]version[-release]`. Equality is rpm equality, not
//! string equality: `0.30.2` equals `0.30_2` because separators are ignored.

use std::cmp::Ordering;
use std::fmt;

/// A parsed `[epoch:]version[-release]` string.
#[derive(Clone, Debug)]
pub struct Version {
    epoch: i64,
    version: String,
    release: String,
}

impl Version {
    /// Parses leniently, never failing: a missing or unparsable epoch is 0,
    /// the version/release split is at the first `-` after the epoch.
    pub fn parse(s: &str) -> Version {
        let (epoch, rest) = match s.split_once(':') {
            // Go trims only leading space before `strconv.Atoi`, which takes
            // an optional sign like `i64::from_str`.
            Some((e, rest)) => (e.trim_start().parse().unwrap_or(0), rest),
            None => (0, s),
        };
        let (version, release) = rest.split_once('-').unwrap_or((rest, ""));
        Version {
            epoch,
            version: version.to_string(),
            release: release.to_string(),
        }
    }

    /// True when both sides are the same version by rpm rules.
    pub fn equal(&self, other: &Version) -> bool {
        self.cmp(other) == Ordering::Equal
    }

    /// The epoch (0 when absent).
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    /// The part between the epoch and the first `-`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The part after the first `-` (empty when absent).
    pub fn release(&self) -> &str {
        &self.release
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.epoch > 0 {
            write!(f, "{}:", self.epoch)?;
        }
        f.write_str(&self.version)?;
        if !self.release.is_empty() {
            write!(f, "-{}", self.release)?;
        }
        Ok(())
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| rpmvercmp(&self.version, &other.version))
            .then_with(|| rpmvercmp(&self.release, &other.release))
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

// Equality must agree with `Ord`, so it is rpm equality rather than a
// field-by-field comparison.
impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.equal(other)
    }
}

impl Eq for Version {}

/// One comparable piece of a version string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Segment<'a> {
    Tilde,
    Alpha(&'a str),
    Numeric(&'a str),
}

/// Splits into runs of ASCII letters, runs of ASCII digits and single `~`;
/// everything else only separates segments.
fn segments(s: &str) -> Vec<Segment<'_>> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'~' {
            out.push(Segment::Tilde);
            i += 1;
        } else if b.is_ascii_alphabetic() || b.is_ascii_digit() {
            let digit = b.is_ascii_digit();
            let start = i;
            while i < bytes.len()
                && (if digit {
                    bytes[i].is_ascii_digit()
                } else {
                    bytes[i].is_ascii_alphabetic()
                })
            {
                i += 1;
            }
            // Runs are ASCII, so these are char boundaries.
            let run = &s[start..i];
            out.push(if digit {
                Segment::Numeric(run)
            } else {
                Segment::Alpha(run)
            });
        } else {
            i += 1;
        }
    }
    out
}

fn compare_segment(a: Segment<'_>, b: Segment<'_>) -> Ordering {
    use Segment::*;
    match (a, b) {
        (Tilde, Tilde) => Ordering::Equal,
        // `~` sorts before anything, so `1.0~rc1` is older than `1.0`.
        (Tilde, _) => Ordering::Less,
        (_, Tilde) => Ordering::Greater,
        (Numeric(x), Numeric(y)) => {
            let x = x.trim_start_matches('0');
            let y = y.trim_start_matches('0');
            // Without leading zeros a longer run is a bigger number.
            x.len().cmp(&y.len()).then_with(|| x.cmp(y))
        }
        (Numeric(_), Alpha(_)) => Ordering::Greater,
        (Alpha(_), Numeric(_)) => Ordering::Less,
        (Alpha(x), Alpha(y)) => x.cmp(y),
    }
}

/// rpm's `rpmvercmp` for one version or release string.
fn rpmvercmp(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let sa = segments(a);
    let sb = segments(b);
    for (x, y) in sa.iter().zip(&sb) {
        match compare_segment(*x, *y) {
            Ordering::Equal => {}
            other => return other,
        }
    }
    let common = sa.len().min(sb.len());
    match (sa.get(common), sb.get(common)) {
        // All segments equal; only separators differed.
        (None, None) => Ordering::Equal,
        // An extra `~` part makes that side older (`1.0~rc1 < 1.0`); any
        // other extra part makes it newer (`1.0 < 1.0.0`).
        (Some(Segment::Tilde), _) => Ordering::Less,
        (_, Some(Segment::Tilde)) => Ordering::Greater,
        (Some(_), None) => Ordering::Greater,
        (None, Some(_)) => Ordering::Less,
        // Unreachable: `common` is the shorter length, so one side is None.
        (Some(_), Some(_)) => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cmp(a: &str, b: &str) -> Ordering {
        Version::parse(a).cmp(&Version::parse(b))
    }

    #[test]
    fn compares_like_go_rpm_version() {
        use Ordering::*;
        let cases: &[(&str, &str, Ordering)] = &[
            ("0.30.2", "0.30.2", Equal),
            ("0.30.2", "0.30.1", Greater),
            ("0.30.1", "0.30.2", Less),
            ("0.30.10", "0.30.9", Greater),
            ("0.30.2", "0.30_2", Equal),
            ("0.30.2", "0.30.02", Equal),
            ("1.0~rc1", "1.0", Less),
            ("1.0~rc1", "1.0~rc2", Less),
            ("1.0~rc1", "1.0~", Greater),
            ("1.0.a", "1.0.1", Less),
            ("1.0", "1.0.0", Less),
            ("1.0a", "1.0", Greater),
            ("1.0", "1.0a", Less),
            ("a", "B", Greater),
            ("1:0.1", "0:9.9", Greater),
            ("1:0.1", "9.9", Greater),
            ("0:1.0", "1.0", Equal),
            ("1.0-2", "1.0-1", Greater),
            ("1.0-1", "1.0", Greater),
            ("1.0-1.el8", "1.0-1.el9", Less),
            ("0.99.0.20221129", "0.28.0", Greater),
            // The split is at the first `-`; the rest is all release.
            ("1.0-1-2", "1.0-1.2", Equal),
            // Only leading space is trimmed from the epoch; a bad epoch is 0.
            (" 1:1.0", "1:1.0", Equal),
            ("1 :1.0", "0:1.0", Equal),
            ("x:2.0", "2.0", Equal),
            ("-1:9.0", "0:1.0", Less),
            ("+2:1.0", "2:1.0", Equal),
            // No comparable segments at all.
            ("", "", Equal),
            ("...", "", Equal),
            ("", "0", Less),
        ];
        for (a, b, want) in cases {
            assert_eq!(cmp(a, b), *want, "{a:?} vs {b:?}");
            assert_eq!(cmp(b, a), want.reverse(), "{b:?} vs {a:?}");
            assert_eq!(
                Version::parse(a).equal(&Version::parse(b)),
                *want == Equal,
                "{a:?} equal {b:?}"
            );
        }
    }

    #[test]
    fn parses_epoch_version_and_release() {
        let v = Version::parse("3:1.2.3-4.el9-x");
        assert_eq!(
            (v.epoch(), v.version(), v.release()),
            (3, "1.2.3", "4.el9-x")
        );
        assert_eq!(v.to_string(), "3:1.2.3-4.el9-x");

        let v = Version::parse("0.30.2");
        assert_eq!((v.epoch(), v.version(), v.release()), (0, "0.30.2", ""));
        assert_eq!(v.to_string(), "0.30.2");

        let v = Version::parse("99999999999999999999:1");
        assert_eq!(v.epoch(), 0, "an overflowing epoch is 0 like a failed Atoi");
    }

    fn version_string() -> impl Strategy<Value = String> {
        "[0-9a-c.~_:-]{0,10}"
    }

    proptest! {
        #[test]
        fn ordering_is_reflexive(a in version_string()) {
            prop_assert_eq!(cmp(&a, &a), Ordering::Equal);
        }

        #[test]
        fn ordering_is_antisymmetric(a in version_string(), b in version_string()) {
            prop_assert_eq!(cmp(&a, &b), cmp(&b, &a).reverse());
        }

        #[test]
        fn ordering_is_transitive(
            a in version_string(),
            b in version_string(),
            c in version_string(),
        ) {
            if cmp(&a, &b) != Ordering::Greater && cmp(&b, &c) != Ordering::Greater {
                prop_assert_ne!(cmp(&a, &c), Ordering::Greater);
            }
        }
    }
}
