//! Go `encoding/json` compatibility: null-as-default, claim strings, numeric dates, sorted maps and Go's float rules.

use super::*;

pub(super) mod go_serde {
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::{Deserialize, Serializer};
    use std::fmt;

    /// JSON `null` (or a missing key, with `#[serde(default)]`) becomes the
    /// type's default, as Go's decoder leaves the zero value in place.
    pub fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de> + Default,
    {
        Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
    }

    pub fn is_false(b: &bool) -> bool {
        !*b
    }

    /// golang-jwt `*NumericDate`: integer seconds on output; any JSON number
    /// (or numeric string, as Go's `json.Number` allows) on input, fractions
    /// floored like `time.Truncate(time.Second)`.
    pub mod numeric_date {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(n) => s.serialize_i64(*n),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
            d.deserialize_any(NumericDateVisitor)
        }

        struct NumericDateVisitor;

        fn from_f64<E: de::Error>(f: f64) -> Result<Option<i64>, E> {
            // i64::MAX as f64 rounds up to 2^63, so use a strict bound
            if !f.is_finite() || f >= 9.2e18 || f <= -9.2e18 {
                return Err(E::custom("invalid NumericDate: number out of range"));
            }
            Ok(Some(f.floor() as i64))
        }

        impl<'de> Visitor<'de> for NumericDateVisitor {
            type Value = Option<i64>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a NumericDate (seconds since the Unix epoch)")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Some(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(Some)
                    .map_err(|_| E::custom("invalid NumericDate: number out of range"))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                from_f64(v)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let n: serde_json::Number = serde_json::from_str(v)
                    .map_err(|_| E::custom("invalid NumericDate: string is not a JSON number"))?;
                if let Some(i) = n.as_i64() {
                    Ok(Some(i))
                } else if let Some(f) = n.as_f64() {
                    from_f64(f)
                } else {
                    Err(E::custom("invalid NumericDate: number out of range"))
                }
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(NumericDateVisitor)
            }
        }
    }

    /// golang-jwt `ClaimStrings`: a string or an array of strings on input,
    /// always an array on output (`MarshalSingleStringAsArray` defaults to
    /// true in v5).
    pub mod claim_strings {
        use super::*;

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
            d.deserialize_any(ClaimStringsVisitor)
        }

        struct ClaimStringsVisitor;

        impl<'de> Visitor<'de> for ClaimStringsVisitor {
            type Value = Vec<String>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(vec![v.to_string()])
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(out)
            }

            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Vec::new())
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(ClaimStringsVisitor)
            }
        }
    }
}

pub(super) use go_serde::{claim_strings, is_false, null_default, numeric_date};

/// Serializes a JSON value the way Go re-marshals an `interface{}` it
/// decoded: object keys sorted (even if serde_json's `preserve_order` is
/// enabled somewhere in the build), every number treated as a float64 (so
/// `2.0` becomes `2`, huge integers lose precision like in Go). Integral
/// numbers within 2^53 are emitted as integers so plain `serde_json` output
/// stays natural too.
pub(super) struct GoValue<'a>(&'a serde_json::Value);

impl Serialize for GoValue<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde_json::Value;
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        match self.0 {
            Value::Number(n) => {
                let f = n.as_f64().unwrap_or_default();
                if f.fract() == 0.0 && f.abs() <= EXACT && !(f == 0.0 && f.is_sign_negative()) {
                    s.serialize_i64(f as i64)
                } else {
                    s.serialize_f64(f)
                }
            }
            Value::Array(a) => s.collect_seq(a.iter().map(GoValue)),
            Value::Object(m) => serialize_go_map(m, s),
            other => other.serialize(s),
        }
    }
}

/// A JSON object as Go re-marshals a `map[string]any`: keys sorted, values
/// as [`GoValue`].
pub(super) fn serialize_go_map<S: serde::Serializer>(
    m: &serde_json::Map<String, serde_json::Value>,
    s: S,
) -> Result<S::Ok, S::Error> {
    let mut entries: Vec<_> = m.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    s.collect_map(entries.into_iter().map(|(k, v)| (k, GoValue(v))))
}

pub(super) fn serialize_extensions<S: serde::Serializer>(
    v: &Option<serde_json::Map<String, serde_json::Value>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(m) => serialize_go_map(m, s),
    }
}

/// Serializes `value` to compact JSON exactly as Go's `json.Marshal` would for
/// the equivalent struct (given matching field order).
pub fn to_go_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    crate::json::to_vec(value)
}
