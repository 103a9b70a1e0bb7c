//! JSON output that is byte-compatible with Go's `encoding/json`.
//!
//! Choria hashes and signs the exact bytes of inner documents, and peers compare
//! nothing else, so strictly only our own hashes must match our own bytes. We still
//! produce what Go produces (compact, declaration-ordered struct fields, sorted map
//! keys, HTML-safe string escaping) so that test vectors taken from Go match byte
//! for byte and captured traffic can be compared directly.

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter};
use std::io;

/// A serde_json formatter that escapes strings the way Go's `encoding/json` does by
/// default: `<`, `>`, `&`, U+2028 and U+2029 become `\u003c`-style escapes.
#[derive(Clone, Copy, Debug, Default)]
pub struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        let bytes = fragment.as_bytes();
        let mut start = 0;
        for (i, ch) in fragment.char_indices() {
            let escape = match ch {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&bytes[start..i])?;
            writer.write_all(escape.as_bytes())?;
            start = i + ch.len_utf8();
        }
        writer.write_all(&bytes[start..])
    }

    fn write_f64<W>(&mut self, writer: &mut W, value: f64) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        writer.write_all(go_float(value).as_bytes())
    }

    fn write_char_escape<W>(&mut self, writer: &mut W, char_escape: CharEscape) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        // Go (since 1.22) writes \b and \f like serde_json; the only difference is the
        // case of hex digits in \u00XX escapes, which Go writes in lowercase too.
        let s: &[u8] = match char_escape {
            CharEscape::Quote => b"\\\"",
            CharEscape::ReverseSolidus => b"\\\\",
            CharEscape::Solidus => b"\\/",
            CharEscape::Backspace => b"\\b",
            CharEscape::FormFeed => b"\\f",
            CharEscape::LineFeed => b"\\n",
            CharEscape::CarriageReturn => b"\\r",
            CharEscape::Tab => b"\\t",
            CharEscape::AsciiControl(byte) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let buf = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[(byte >> 4) as usize],
                    HEX[(byte & 0xF) as usize],
                ];
                return writer.write_all(&buf);
            }
        };
        writer.write_all(s)
    }
}

/// Formats a float like Go's `encoding/json`: shortest round-trip digits,
/// plain decimal for 1e-6 <= |f| < 1e21, otherwise exponent form with an
/// explicit sign (`1e+21`, `1e-7`).
pub fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
            _ => s,
        }
    } else {
        format!("{f}")
    }
}

/// Serializes `value` to compact JSON exactly as Go's `json.Marshal` would.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    value.serialize(&mut ser)?;
    Ok(out)
}

/// Like [`to_vec`] but returns a `String` (the output is always UTF-8).
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    // serde_json only ever writes valid UTF-8.
    to_vec(value).map(|v| String::from_utf8(v).expect("serde_json writes UTF-8"))
}

/// `[]byte` fields: Go encodes them as standard, padded base64 and refuses unpadded input.
pub mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        // Go decodes `null` into a nil slice.
        let s: Option<std::borrow::Cow<'de, str>> = Option::deserialize(d)?;
        match s {
            None => Ok(Vec::new()),
            Some(s) => STANDARD
                .decode(s.as_bytes())
                .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn escapes_html_characters_like_go() {
        let s = to_string("a<b>&c\u{2028}\u{2029}").unwrap();
        assert_eq!(s, r#""a\u003cb\u003e\u0026c\u2028\u2029""#);
    }

    #[test]
    fn escapes_control_characters_like_go() {
        let s = to_string("\u{1}\n\t\"\\/").unwrap();
        assert_eq!(s, r#""\u0001\n\t\"\\/""#);
    }

    #[test]
    fn maps_are_sorted_and_compact() {
        let mut m = BTreeMap::new();
        m.insert("zeta", 1);
        m.insert("alpha", 2);
        assert_eq!(to_string(&m).unwrap(), r#"{"alpha":2,"zeta":1}"#);
    }
}
