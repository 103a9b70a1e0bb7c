//! A YAML tree that keeps every mapping entry in order, duplicates included.
//!
//! The Go provisioner reads YAML through `ghodss/yaml` (yaml.v2, then
//! `encoding/json`): duplicate keys are allowed (the last one wins), keys match
//! struct fields case-insensitively, `null` leaves the default in place and
//! YAML 1.1 booleans (`yes`, `on`, …) are booleans. `serde_norway::Value`
//! rejects duplicate keys, so we build our own tree and apply those rules in
//! [`super::provisioner`].

use super::duration::parse_duration;
use super::{ConfigError, ConfigWarning};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Parses one YAML document. An empty document is `Null`.
    pub(crate) fn parse(text: &str) -> Result<Node, String> {
        let node: Node = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        Ok(node.apply_merge_keys())
    }

    /// What kind of value this is, for messages ("expected a string, found a list").
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::Float(_) => "a number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }

    /// The same value as JSON (mapping keys as their text).
    pub(crate) fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(i) => match i64::try_from(*i) {
                Ok(i) => Value::from(i),
                Err(_) => Value::from(i.to_string()),
            },
            Node::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Node::Str(s) => Value::String(s.clone()),
            Node::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.key_text(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// A short rendering for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Node::Null => "null".into(),
            Node::Bool(b) => b.to_string(),
            Node::Int(i) => i.to_string(),
            Node::Float(f) => f.to_string(),
            Node::Str(s) => format!("{s:?}"),
            Node::Seq(_) => "a list".into(),
            Node::Map(_) => "a mapping".into(),
        }
    }

    /// A mapping key as text (ghodss/yaml turns non-string keys into strings).
    pub(crate) fn key_text(&self) -> String {
        match self {
            Node::Str(s) => s.clone(),
            other => other.describe(),
        }
    }

    /// YAML merge keys (`<<: *anchor`), which yaml.v2 supports: the merged
    /// entries come first, so explicit keys after them win.
    fn apply_merge_keys(self) -> Node {
        match self {
            Node::Seq(items) => Node::Seq(items.into_iter().map(Node::apply_merge_keys).collect()),
            Node::Map(entries) => {
                let mut merged = Vec::new();
                let mut own = Vec::new();
                for (k, v) in entries {
                    let v = v.apply_merge_keys();
                    if matches!(&k, Node::Str(s) if s == "<<") {
                        match v {
                            Node::Map(inner) => merged.extend(inner),
                            Node::Seq(maps) => {
                                // Earlier maps in the list take precedence, so add
                                // them last.
                                for m in maps.into_iter().rev() {
                                    if let Node::Map(inner) = m {
                                        merged.extend(inner);
                                    }
                                }
                            }
                            other => own.push((k, other)),
                        }
                    } else {
                        own.push((k, v));
                    }
                }
                merged.extend(own);
                Node::Map(merged)
            }
            other => other,
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v)
            .map(Node::Int)
            .map_err(|_| E::custom("integer too large"))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }

    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<Node, Node>()? {
            entries.push((k, v));
        }
        Ok(Node::Map(entries))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Node, A::Error> {
        Err(de::Error::custom(
            "YAML tags (!name) are not supported in this file",
        ))
    }
}

/// The known keys of one mapping, matched like Go's `encoding/json` does
/// (exact name first, else case-insensitively; the last duplicate wins), with
/// typed accessors whose errors name the key. Unknown keys become warnings.
pub(crate) struct Section<'a> {
    file: &'a Path,
    /// `""` at the top level, `"features."` inside `features:`.
    prefix: String,
    values: BTreeMap<&'static str, (String, Node)>,
}

impl<'a> Section<'a> {
    /// `node` must be a mapping or null (an absent section).
    pub(crate) fn new(
        file: &'a Path,
        prefix: &str,
        node: Node,
        known: &[&'static str],
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<Self, ConfigError> {
        let entries = match node {
            Node::Null => Vec::new(),
            Node::Map(entries) => entries,
            other if prefix.is_empty() => {
                return Err(ConfigError::Syntax {
                    file: file.to_path_buf(),
                    message: format!(
                        "expected a mapping of settings (key: value) at the top level, found {}",
                        other.kind()
                    ),
                })
            }
            other => {
                return Err(ConfigError::invalid(
                    file,
                    None,
                    prefix.trim_end_matches('.'),
                    format!("expected a mapping of settings, found {}", other.kind()),
                ))
            }
        };
        let mut values: BTreeMap<&'static str, (String, Node)> = BTreeMap::new();
        for (k, v) in entries {
            let written = k.key_text();
            let canon = known
                .iter()
                .find(|c| **c == written)
                .or_else(|| known.iter().find(|c| c.eq_ignore_ascii_case(&written)));
            match canon {
                Some(canon) => {
                    if let Some((before, _)) = values.get(canon) {
                        warnings.push(ConfigWarning::new(
                            file,
                            None,
                            format!("{prefix}{written}"),
                            format!(
                                "set more than once (also as {prefix}{before}); the last value is used"
                            ),
                        ));
                    }
                    values.insert(canon, (written, v));
                }
                None => {
                    let hint = match super::suggest(&written, known.iter().copied()) {
                        Some(s) => format!("; did you mean {prefix}{s}?"),
                        None => String::new(),
                    };
                    warnings.push(ConfigWarning::new(
                        file,
                        None,
                        format!("{prefix}{written}"),
                        format!("unknown setting, ignored{hint}"),
                    ));
                }
            }
        }
        Ok(Section {
            file,
            prefix: prefix.to_string(),
            values,
        })
    }

    /// The key as the user wrote it, with the section prefix.
    pub(crate) fn key(&self, canon: &str) -> String {
        match self.values.get(canon) {
            Some((written, _)) => format!("{}{written}", self.prefix),
            None => format!("{}{canon}", self.prefix),
        }
    }

    pub(crate) fn is_set(&self, canon: &str) -> bool {
        matches!(self.values.get(canon), Some((_, n)) if *n != Node::Null)
    }

    pub(crate) fn error(&self, canon: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::invalid(self.file, None, self.key(canon), message)
    }

    /// An error about entry `index` of the list `canon`, keyed `canon[index]`.
    pub(crate) fn item_error(
        &self,
        canon: &str,
        index: usize,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::invalid(
            self.file,
            None,
            format!("{}[{index}]", self.key(canon)),
            message,
        )
    }

    pub(crate) fn warning(&self, canon: &str, message: impl Into<String>) -> ConfigWarning {
        ConfigWarning::new(self.file, None, self.key(canon), message)
    }

    /// The raw value; `None` when absent or null (null leaves Go's default).
    pub(crate) fn node(&self, canon: &str) -> Option<&Node> {
        match self.values.get(canon) {
            Some((_, Node::Null)) | None => None,
            Some((_, n)) => Some(n),
        }
    }

    pub(crate) fn string(&self, canon: &str) -> Result<Option<String>, ConfigError> {
        match self.node(canon) {
            None => Ok(None),
            Some(Node::Str(s)) => Ok(Some(s.clone())),
            Some(other @ (Node::Int(_) | Node::Float(_) | Node::Bool(_))) => Err(self.error(
                canon,
                format!(
                    "expected a string, found {} {}; put it in quotes if it is meant as text",
                    other.kind(),
                    other.describe()
                ),
            )),
            Some(other) => {
                Err(self.error(canon, format!("expected a string, found {}", other.kind())))
            }
        }
    }

    /// Booleans, including the YAML 1.1 spellings yaml.v2 accepts (`yes`, `no`,
    /// `on`, `off`, `y`, `n` in lower, title or upper case).
    pub(crate) fn bool(&self, canon: &str) -> Result<Option<bool>, ConfigError> {
        match self.node(canon) {
            None => Ok(None),
            Some(Node::Bool(b)) => Ok(Some(*b)),
            Some(Node::Str(s)) => match s.as_str() {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True"
                | "TRUE" => Ok(Some(true)),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False"
                | "FALSE" => Ok(Some(false)),
                _ => Err(self.error(canon, format!("expected true or false, found {s:?}"))),
            },
            Some(other) => Err(self.error(
                canon,
                format!(
                    "expected true or false, found {} {}",
                    other.kind(),
                    other.describe()
                ),
            )),
        }
    }

    /// Integers; a float with no fraction is accepted, as Go's YAML→JSON step
    /// writes `2.0` as `2`.
    pub(crate) fn int(&self, canon: &str) -> Result<Option<i64>, ConfigError> {
        match self.node(canon) {
            None => Ok(None),
            Some(Node::Int(i)) => i64::try_from(*i)
                .map(Some)
                .map_err(|_| self.error(canon, format!("{i} is too large"))),
            Some(Node::Float(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(*f as i64)),
            Some(other) => Err(self.error(
                canon,
                format!(
                    "expected a whole number, found {} {}",
                    other.kind(),
                    other.describe()
                ),
            )),
        }
    }

    pub(crate) fn string_list(&self, canon: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.node(canon) {
            None => Ok(None),
            Some(Node::Seq(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Node::Str(s) => Ok(s.clone()),
                    other => Err(self.item_error(
                        canon,
                        i,
                        format!(
                            "expected a string, found {} {}; put it in quotes",
                            other.kind(),
                            other.describe()
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => Err(self.error(
                canon,
                format!("expected a list of strings, found {}", other.kind()),
            )),
        }
    }

    /// A mapping of names to text. Numbers and booleans are taken as the
    /// text they are written as (`interval: 300` means "300"), as a Choria
    /// configuration file has no types; lists and mappings are errors.
    pub(crate) fn string_map(
        &self,
        canon: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ConfigError> {
        let entries = match self.node(canon) {
            None => return Ok(None),
            Some(Node::Map(entries)) => entries,
            Some(other) => {
                return Err(self.error(
                    canon,
                    format!(
                        "expected a mapping of names to text, found {}",
                        other.kind()
                    ),
                ))
            }
        };
        let mut out = BTreeMap::new();
        for (k, v) in entries {
            let key = k.key_text();
            let text = match v {
                Node::Str(s) => s.clone(),
                Node::Int(i) => i.to_string(),
                Node::Float(f) => f.to_string(),
                Node::Bool(b) => b.to_string(),
                Node::Null => String::new(),
                other => {
                    return Err(ConfigError::invalid(
                        self.file,
                        None,
                        format!("{}.{key}", self.key(canon)),
                        format!("expected text, found {}", other.kind()),
                    ))
                }
            };
            out.insert(key, text);
        }
        Ok(Some(out))
    }

    /// A Choria duration (see [`super::duration`]).
    pub(crate) fn duration(&self, canon: &str) -> Result<Option<(String, Duration)>, ConfigError> {
        if let Some(n @ (Node::Int(_) | Node::Float(_))) = self.node(canon) {
            return Err(self.error(
                canon,
                format!(
                    "expected a duration such as 30s, 10m, 1h or 1d, found the number {}, which has no unit",
                    n.describe()
                ),
            ));
        }
        let Some(raw) = self.string(canon)? else {
            return Ok(None);
        };
        let d = parse_duration(&raw).map_err(|e| self.error(canon, e.to_string()))?;
        Ok(Some((raw, d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Node {
        Node::Str(v.into())
    }

    #[test]
    fn scalars_and_empty_documents() {
        assert_eq!(Node::parse("").unwrap(), Node::Null);
        assert_eq!(Node::parse("# only a comment\n").unwrap(), Node::Null);
        assert_eq!(
            Node::parse("a: 1\nb: true\nc: x\nd: ~\ne: 1.5\nf: '1'\n").unwrap(),
            Node::Map(vec![
                (s("a"), Node::Int(1)),
                (s("b"), Node::Bool(true)),
                (s("c"), s("x")),
                (s("d"), Node::Null),
                (s("e"), Node::Float(1.5)),
                (s("f"), s("1")),
            ])
        );
    }

    #[test]
    fn duplicate_keys_are_kept_in_order() {
        assert_eq!(
            Node::parse("a: 1\na: 2\n").unwrap(),
            Node::Map(vec![(s("a"), Node::Int(1)), (s("a"), Node::Int(2))])
        );
    }

    #[test]
    fn merge_keys() {
        let n = Node::parse("base: &b\n  x: 1\n  y: 2\nover:\n  <<: *b\n  y: 3\n").unwrap();
        let Node::Map(top) = n else { panic!() };
        assert_eq!(
            top[1].1,
            Node::Map(vec![
                (s("x"), Node::Int(1)),
                (s("y"), Node::Int(2)),
                (s("y"), Node::Int(3)),
            ])
        );
    }

    #[test]
    fn syntax_errors_have_positions() {
        let e = Node::parse("a: [1, 2\n").unwrap_err();
        assert!(e.contains("line"), "{e}");
    }
}
