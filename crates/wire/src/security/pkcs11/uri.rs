//! RFC 7512 `pkcs11:` URIs, the way a key in a token is named in
//! configuration: which module to load, which token, which key, and where
//! the PIN comes from.
//!
//! Parsed by hand: no crate in the tree does it, and `url`'s query parser
//! decodes `+` as a space (form encoding), which RFC 7512 does not do; a PIN
//! `a+b` would silently become `a b`.

use super::Pkcs11Error;
use cryptoki::types::AuthPin;
use percent_encoding::percent_decode_str;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A parsed `pkcs11:` URI naming one private key.
///
/// `Debug` and `Display` print the URI with any `pin-value` replaced by
/// `***`, so a URI can be logged.
#[derive(Clone)]
pub struct Pkcs11Uri {
    /// `module-path`: the PKCS#11 library to load.
    pub(super) module_path: PathBuf,
    pub(super) token: TokenSelector,
    pub(super) key: KeySelector,
    pub(super) pin: PinSource,
    /// The URI as given, its `pin-value` redacted.
    redacted: String,
}

/// The path attributes that pick a token; absent ones match any token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct TokenSelector {
    pub label: Option<String>,
    pub serial: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub slot_id: Option<u64>,
}

/// The path attributes that pick the key in the token: its label
/// (`object`, CKA_LABEL) and/or its id (`id`, CKA_ID).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct KeySelector {
    pub label: Option<Vec<u8>>,
    pub id: Option<Vec<u8>>,
}

/// Where the user PIN comes from. The value itself is a secret string that
/// prints as `[REDACTED]`.
#[derive(Clone, Default)]
pub(super) enum PinSource {
    /// No PIN: only tokens with a protected authentication path (a PIN pad)
    /// can log in.
    #[default]
    None,
    /// `pin-value`, inline.
    Value(AuthPin),
    /// `pin-source=file:...`, read each time the key is opened, so a
    /// rotated PIN file takes effect on the next open.
    File(PathBuf),
}

impl Pkcs11Uri {
    /// Parses a `pkcs11:` URI. `module-path` and one of `object` or `id` are
    /// required; unknown attributes are refused, so a typo does not select
    /// another key.
    pub fn parse(text: &str) -> Result<Self, Pkcs11Error> {
        // A URI's scheme is case-insensitive (RFC 3986 §3.1).
        let rest = match (text.get(..7), text.get(7..)) {
            (Some(scheme), Some(rest)) if scheme.eq_ignore_ascii_case("pkcs11:") => rest,
            _ => return Err(Pkcs11Error::NotPkcs11Uri),
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut token = TokenSelector::default();
        let mut key = KeySelector::default();
        for (name, value) in attributes(path, ';')? {
            match name {
                "token" => token.label = Some(text_value(name, &value)?),
                "serial" => token.serial = Some(text_value(name, &value)?),
                "manufacturer" => token.manufacturer = Some(text_value(name, &value)?),
                "model" => token.model = Some(text_value(name, &value)?),
                "slot-id" => {
                    let id = text_value(name, &value)?;
                    token.slot_id = Some(id.parse().map_err(|_| bad(name, "not a number"))?);
                }
                "object" => key.label = Some(value),
                "id" => key.id = Some(value),
                // We only sign, so the URI can only mean the private key.
                "type" if value == b"private" => {}
                "type" => return Err(bad(name, "only type=private names a signing key")),
                // Accepted and ignored as RFC 7512 allows: they describe
                // the library, which module-path already picks.
                "library-manufacturer"
                | "library-description"
                | "library-version"
                | "slot-description"
                | "slot-manufacturer" => {}
                other => return Err(bad_name(other)),
            }
        }
        let mut module_path = None;
        let mut pin = PinSource::None;
        for (name, value) in attributes(query, '&')? {
            match name {
                "module-path" => module_path = Some(PathBuf::from(text_value(name, &value)?)),
                "pin-value" => pin = PinSource::Value(AuthPin::from(text_value(name, &value)?)),
                "pin-source" => pin = PinSource::File(pin_file(&text_value(name, &value)?)?),
                "module-name" => return Err(bad(name, "give module-path instead")),
                other => return Err(bad_name(other)),
            }
        }
        if key.label.is_none() && key.id.is_none() {
            return Err(Pkcs11Error::NoKeySelector);
        }
        Ok(Pkcs11Uri {
            module_path: module_path.ok_or(Pkcs11Error::MissingModulePath)?,
            token,
            key,
            pin,
            redacted: redact(text),
        })
    }

    /// The PKCS#11 library the key is reached through.
    pub fn module_path(&self) -> &std::path::Path {
        &self.module_path
    }
}

impl FromStr for Pkcs11Uri {
    type Err = Pkcs11Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for Pkcs11Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for Pkcs11Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pkcs11Uri({:?})", self.redacted)
    }
}

impl fmt::Display for TokenSelector {
    /// Names the token as the URI did, for errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        let texts = [
            ("token", &self.label),
            ("serial", &self.serial),
            ("manufacturer", &self.manufacturer),
            ("model", &self.model),
        ];
        for (name, value) in texts {
            if let Some(v) = value {
                parts.push(format!("{name}={v:?}"));
            }
        }
        if let Some(id) = self.slot_id {
            parts.push(format!("slot-id={id}"));
        }
        if parts.is_empty() {
            return f.write_str("any token");
        }
        f.write_str(&parts.join(" "))
    }
}

impl fmt::Display for KeySelector {
    /// Names the key as the URI did, for errors (labels lossily as text, ids
    /// in hex).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(label) = &self.label {
            parts.push(format!("object={:?}", String::from_utf8_lossy(label)));
        }
        if let Some(id) = &self.id {
            parts.push(format!("id={}", hex::encode(id)));
        }
        f.write_str(&parts.join(" "))
    }
}

/// `name=value` pairs separated by `sep`, values percent-decoded to bytes
/// (an `id` is binary). Empty segments (`;;`, a trailing `&`) are skipped.
fn attributes(part: &str, sep: char) -> Result<Vec<(&str, Vec<u8>)>, Pkcs11Error> {
    part.split(sep)
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(n, segment)| {
            // Named by position, not text: the text might be a PIN.
            let (name, value) = segment.split_once('=').ok_or_else(|| Pkcs11Error::Uri {
                attribute: format!("#{} of the '{sep}'-separated attributes", n + 1),
                reason: "has no '=' and value",
            })?;
            Ok((name, percent_decode_str(value).collect()))
        })
        .collect()
}

fn text_value(name: &str, value: &[u8]) -> Result<String, Pkcs11Error> {
    String::from_utf8(value.to_vec()).map_err(|_| bad(name, "is not UTF-8 text"))
}

/// `pin-source` is a URI; we read `file:` ones (`file:/p`, `file:///p`) and
/// bare absolute paths, as p11-kit does. Other schemes (a command, `|...`)
/// would run something on the provisioner's behalf: refused.
fn pin_file(source: &str) -> Result<PathBuf, Pkcs11Error> {
    let path = match source.strip_prefix("file:") {
        Some(rest) => rest.strip_prefix("//").unwrap_or(rest),
        None => source,
    };
    if !path.starts_with('/') {
        return Err(bad("pin-source", "must be a file: URI or an absolute path"));
    }
    Ok(PathBuf::from(path))
}

/// The URI with `pin-value`'s value replaced, for Debug, Display and errors.
fn redact(text: &str) -> String {
    let Some((path, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|segment| match segment.split_once('=') {
            Some(("pin-value", _)) => "pin-value=***".to_owned(),
            _ => segment.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

fn bad(attribute: &str, reason: &'static str) -> Pkcs11Error {
    Pkcs11Error::Uri {
        attribute: attribute.to_owned(),
        reason,
    }
}

fn bad_name(attribute: &str) -> Pkcs11Error {
    bad(attribute, "is not a pkcs11: URI attribute we know")
}
