//! Choria's duration syntax, as go-choria's `util.ParseDuration` reads it (used by
//! the Go provisioner for `interval` and `server_jwt_validity`).
//!
//! The *last character* picks the rule:
//!
//! * `w`/`W` weeks, `d`/`D` days, `M` months of 30 days, `y`/`Y` years of 365
//!   days: everything before it is one decimal number (`1.5d`); the result is
//!   truncated to whole hours, as Go does. These units cannot be combined
//!   (`1d12h` is an error, write `36h`).
//! * `s`, `m`, `h` (lower case): Go's `time.ParseDuration`, so combinations
//!   (`1h30m`), fractions (`1.5h`) and the small units (`500ms`, `10us`) work.
//!   `1H` and `1S` pass the first check but Go then rejects them, and so do we.
//! * anything else, including a bare number (`60`), is an error.
//!
//! Surrounding whitespace is ignored and an empty string is zero, both as in Go.
//! Negative durations are errors here (Go accepts `-1h`).

use std::time::Duration;

/// Why a duration did not parse. The message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationError(String);

const UNIT_HINT: &str = "use a number and a unit: s, m or h (combinable, like 1h30m), or one of d (days), w (weeks), M (30-day months), y (365-day years)";

const NANOS_PER_HOUR: u128 = 3_600_000_000_000;
const MAX_NANOS: u128 = i64::MAX as u128;

/// Parses a Choria duration (see the module docs).
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let s = input.trim();
    let Some(unit) = s.chars().last() else {
        return Ok(Duration::ZERO);
    };
    let hours_per_unit = match unit {
        'w' | 'W' => Some([7.0, 24.0]),
        'd' | 'D' => Some([24.0, 1.0]),
        'M' => Some([24.0, 30.0]),
        'y' | 'Y' => Some([24.0, 365.0]),
        _ => None,
    };
    let negative = || DurationError(format!("{input:?} is negative; durations must be positive"));
    if let Some([a, b]) = hours_per_unit {
        let number = &s[..s.len() - unit.len_utf8()];
        // Go parses with 32-bit precision, multiplies in 64 bits (in Go's
        // order, hence two factors) and truncates to whole hours.
        let value = Some(number)
            .filter(|n| *n == n.trim())
            .and_then(|n| n.parse::<f32>().ok())
            .filter(|v| v.is_finite())
            .ok_or_else(|| {
                DurationError(format!(
                    "{input:?} is not a valid duration: {number:?} is not a number"
                ))
            })?;
        if value < 0.0 {
            return Err(negative());
        }
        let hours = (f64::from(value) * a * b).trunc();
        let nanos = hours * NANOS_PER_HOUR as f64;
        if nanos > MAX_NANOS as f64 {
            return Err(DurationError(format!("{input:?} is too long")));
        }
        return Ok(Duration::from_secs(hours as u64 * 3600));
    }
    match unit {
        's' | 'S' | 'm' | 'h' | 'H' => {
            let nanos = parse_go_duration(s).map_err(|reason| {
                DurationError(format!("{input:?} is not a valid duration: {reason}"))
            })?;
            if nanos < 0 {
                return Err(negative());
            }
            Ok(Duration::from_nanos(nanos as u64))
        }
        c if c.is_ascii_digit() => {
            Err(DurationError(format!("{input:?} has no unit; {UNIT_HINT}")))
        }
        c => Err(DurationError(format!(
            "{input:?} has an unknown unit {c:?}; {UNIT_HINT}"
        ))),
    }
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` with units
/// ns, us, µs, μs, ms, s, m, h; returns signed nanoseconds.
fn parse_go_duration(s: &str) -> Result<i64, String> {
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err("no number".into());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let b = rest.as_bytes()[0];
        if !(b == b'.' || b.is_ascii_digit()) {
            return Err(format!("expected a number at {rest:?}"));
        }
        let (whole, int_len, after_int) = leading_int(rest)?;
        let (frac, after_frac) = leading_fraction(after_int);
        if int_len == 0 && frac.digits == 0 {
            return Err("a '.' needs digits".into());
        }
        let unit_len = after_frac
            .char_indices()
            .find(|(_, c)| *c == '.' || c.is_ascii_digit())
            .map_or(after_frac.len(), |(i, _)| i);
        let per = unit_nanos(&after_frac[..unit_len])?;
        rest = &after_frac[unit_len..];
        let mut v = whole
            .checked_mul(per)
            .filter(|v| *v <= MAX_NANOS + 1)
            .ok_or("too long")?;
        if frac.value > 0 {
            v += (frac.value as f64 * (per as f64 / frac.scale)) as u128;
        }
        total += v;
        if total > MAX_NANOS + 1 {
            return Err("too long".into());
        }
    }
    if neg {
        Ok((-(total as i128)) as i64)
    } else if total > MAX_NANOS {
        Err("too long".into())
    } else {
        Ok(total as i64)
    }
}

/// The integer part of one of Go's numbers: its value, its digit count and
/// what follows it. A value past the longest duration is refused here, before
/// it can overflow.
fn leading_int(s: &str) -> Result<(u128, usize, &str), String> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    let mut whole: u128 = 0;
    for d in s[..len].bytes() {
        whole = whole * 10 + u128::from(d - b'0');
        if whole > MAX_NANOS + 1 {
            return Err("too long".into());
        }
    }
    Ok((whole, len, &s[len..]))
}

/// The digits after a number's `.`: `value / scale` of the unit.
struct Fraction {
    value: u128,
    scale: f64,
    digits: usize,
}

/// The fraction at the start of `s`, if it starts with `.`, and what follows.
fn leading_fraction(s: &str) -> (Fraction, &str) {
    let mut frac = Fraction {
        value: 0,
        scale: 1.0,
        digits: 0,
    };
    let Some(after_dot) = s.strip_prefix('.') else {
        return (frac, s);
    };
    frac.digits = after_dot.bytes().take_while(u8::is_ascii_digit).count();
    // Digits past what fits are consumed but ignored, as in Go.
    for d in after_dot[..frac.digits].bytes() {
        let next = frac.value * 10 + u128::from(d - b'0');
        if next > MAX_NANOS {
            break;
        }
        frac.value = next;
        frac.scale *= 10.0;
    }
    let rest = &after_dot[frac.digits..];
    (frac, rest)
}

/// Nanoseconds in one of Go's units.
fn unit_nanos(unit: &str) -> Result<u128, String> {
    Ok(match unit {
        "ns" => 1,
        "us" | "\u{00b5}s" | "\u{03bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => NANOS_PER_HOUR,
        "" => return Err("a number has no unit".into()),
        other => {
            return Err(format!(
                "unknown unit {other:?} (valid: ns, us, ms, s, m, h)"
            ))
        }
    })
}

/// Formats a duration the way people write them in these files: the largest
/// whole unit among y, d, h, m, s, falling back to a compact Go-like form.
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() == 0 && secs > 0 {
        for (unit, size) in [("y", 365 * 86_400), ("d", 86_400), ("h", 3_600), ("m", 60)] {
            if secs.is_multiple_of(size) {
                return format!("{}{unit}", secs / size);
            }
        }
        return format!("{secs}s");
    }
    format!("{d:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Duration {
        parse_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    const H: u64 = 3600;

    #[test]
    fn choria_units() {
        assert_eq!(p("1y"), Duration::from_secs(365 * 24 * H));
        assert_eq!(p("1Y"), Duration::from_secs(365 * 24 * H));
        assert_eq!(p("2w"), Duration::from_secs(14 * 24 * H));
        assert_eq!(p("1W"), Duration::from_secs(7 * 24 * H));
        assert_eq!(p("1d"), Duration::from_secs(24 * H));
        assert_eq!(p("3D"), Duration::from_secs(72 * H));
        assert_eq!(p("1M"), Duration::from_secs(30 * 24 * H));
        assert_eq!(p("1.5d"), Duration::from_secs(36 * H));
        assert_eq!(p("365d"), p("1y"));
        // Go truncates to whole hours.
        assert_eq!(p("0.01d"), Duration::ZERO);
        assert_eq!(p("1.1w"), Duration::from_secs(184 * H));
    }

    #[test]
    fn go_units() {
        assert_eq!(p("1m"), Duration::from_secs(60));
        assert_eq!(p("10m"), Duration::from_secs(600));
        assert_eq!(p("1h"), Duration::from_secs(H));
        assert_eq!(p("1h30m"), Duration::from_secs(H + 1800));
        assert_eq!(p("1.5h"), Duration::from_secs(H + 1800));
        assert_eq!(p("90s"), Duration::from_secs(90));
        assert_eq!(p("500ms"), Duration::from_millis(500));
        assert_eq!(p("10us"), Duration::from_micros(10));
        assert_eq!(p("10µs"), Duration::from_micros(10));
        assert_eq!(p("1m0.5s"), Duration::from_millis(60_500));
        assert_eq!(p(".5m"), Duration::from_secs(30));
        assert_eq!(p("+1m"), Duration::from_secs(60));
        assert_eq!(p(" 1m "), Duration::from_secs(60));
    }

    #[test]
    fn empty_is_zero_like_go() {
        assert_eq!(p(""), Duration::ZERO);
        assert_eq!(p("   "), Duration::ZERO);
    }

    #[test]
    fn rejects() {
        for bad in [
            "60",
            "1",
            "0",
            "1x",
            "1H",
            "1S",
            "1d12h",
            "d",
            "y",
            "-1h",
            "-1d",
            "1..5h",
            ".h",
            "h",
            "1mh",
            "abc",
            "1 m",
            "nand",
            "infy",
            "9999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn messages_quote_the_input() {
        let e = parse_duration("60").unwrap_err().to_string();
        assert!(e.contains("\"60\" has no unit"), "{e}");
        let e = parse_duration("1x").unwrap_err().to_string();
        assert!(e.contains("unknown unit 'x'"), "{e}");
        let e = parse_duration("1H").unwrap_err().to_string();
        assert!(e.contains("unknown unit \"H\""), "{e}");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_duration(Duration::from_secs(60)), "1m");
        assert_eq!(format_duration(Duration::from_secs(365 * 86_400)), "1y");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(36 * 3600)), "36h");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
    }
}
