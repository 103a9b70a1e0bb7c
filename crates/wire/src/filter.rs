//! Request filters (`protocol/filter.go`) and the server-side match used by the
//! simulator.
//!
//! Every array is always present: Go marshals a nil slice as `null`, which a v1
//! server's schema rejects, so the Go clients always send `[]` and so do we.

use regex::Regex;
use serde::{Deserialize, Serialize};

/// A fact filter. Field order matches Go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactFilter {
    pub fact: String,
    pub operator: String,
    pub value: String,
}

/// The filter carried in every request envelope. Key order as Go marshals it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Filter {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub fact: Vec<FactFilter>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub cf_class: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub agent: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub identity: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub compound: Vec<Vec<serde_json::Value>>,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// What a node knows about itself, for filter matching.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts<'a> {
    pub identity: &'a str,
    pub agents: &'a [&'a str],
    pub classes: &'a [String],
    pub facts: Option<&'a serde_json::Value>,
}

impl Filter {
    /// A filter that requires one agent, as the Go client builds for direct requests
    /// and for discovery of provisionable nodes.
    pub fn with_agent(agent: &str) -> Self {
        Filter {
            agent: vec![agent.to_string()],
            ..Default::default()
        }
    }

    /// True when no category holds an entry.
    pub fn is_empty(&self) -> bool {
        self.fact.is_empty()
            && self.cf_class.is_empty()
            && self.agent.is_empty()
            && self.identity.is_empty()
            && self.compound.is_empty()
    }

    /// Server-side match as `MatchServerRequest` does it: every non-empty category
    /// must match; identities are OR-ed, agents, classes and facts AND-ed.
    ///
    /// Compound (expr) filters are not evaluated: a provisioning-mode node has no
    /// facts worth querying and no Choria client sends them during provisioning, so
    /// a compound filter is treated as not matching rather than guessed at.
    pub fn matches(&self, node: &NodeFacts<'_>) -> bool {
        if !self.identity.is_empty()
            && !self
                .identity
                .iter()
                .any(|p| matches_pattern(p, node.identity))
        {
            return false;
        }
        if !self
            .agent
            .iter()
            .all(|p| node.agents.iter().any(|a| matches_pattern(p, a)))
        {
            return false;
        }
        if !self
            .cf_class
            .iter()
            .all(|p| node.classes.iter().any(|c| matches_pattern(p, c)))
        {
            return false;
        }
        if !self.fact.iter().all(|f| fact_matches(f, node.facts)) {
            return false;
        }
        self.compound.is_empty()
    }
}

/// An entry is either an exact string or a `/regex/`.
fn matches_pattern(pattern: &str, value: &str) -> bool {
    if pattern.len() >= 2 && pattern.starts_with('/') && pattern.ends_with('/') {
        match Regex::new(&pattern[1..pattern.len() - 1]) {
            Ok(re) => re.is_match(value),
            Err(_) => false,
        }
    } else {
        pattern == value
    }
}

fn fact_matches(filter: &FactFilter, facts: Option<&serde_json::Value>) -> bool {
    let Some(value) = facts.and_then(|f| lookup_fact(f, &filter.fact)) else {
        return false;
    };
    let actual = match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let numeric = actual
        .parse::<f64>()
        .ok()
        .zip(filter.value.parse::<f64>().ok());
    match filter.operator.as_str() {
        "==" => actual == filter.value,
        "!=" => actual != filter.value,
        "=~" => Regex::new(filter.value.trim_matches('/')).is_ok_and(|re| re.is_match(&actual)),
        op => match numeric {
            Some((a, b)) => match op {
                ">=" => a >= b,
                "<=" => a <= b,
                "<" => a < b,
                ">" => a > b,
                _ => false,
            },
            None => false,
        },
    }
}

/// Facts are looked up with dotted paths (`os.family`) as in go-choria's gjson use.
fn lookup_fact<'a>(facts: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(facts, |v, key| v.get(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENTS: &[&str] = &["choria_provision", "choria_util", "discovery", "rpcutil"];

    fn node(identity: &str) -> NodeFacts<'_> {
        NodeFacts {
            identity,
            agents: AGENTS,
            classes: &[],
            facts: None,
        }
    }

    #[test]
    fn serializes_in_go_key_order_with_empty_arrays() {
        let f = Filter::with_agent("choria_provision");
        assert_eq!(
            crate::json::to_string(&f).unwrap(),
            r#"{"fact":[],"cf_class":[],"agent":["choria_provision"],"identity":[],"compound":[]}"#
        );
    }

    #[test]
    fn null_arrays_decode_as_empty() {
        let f: Filter =
            serde_json::from_str(r#"{"fact":null,"cf_class":[],"identity":[],"compound":[]}"#)
                .unwrap();
        assert!(f.is_empty());
    }

    #[test]
    fn empty_filter_matches_every_node() {
        assert!(Filter::default().matches(&node("n1")));
    }

    #[test]
    fn agent_filter_requires_every_agent() {
        assert!(Filter::with_agent("choria_provision").matches(&node("n1")));
        let mut f = Filter::with_agent("choria_provision");
        f.agent.push("puppet".into());
        assert!(!f.matches(&node("n1")));
        assert!(Filter::with_agent("/^choria_/").matches(&node("n1")));
    }

    #[test]
    fn identity_filter_is_any_of_exact_or_regex() {
        let f = Filter {
            identity: vec!["other".into(), "/^web\\d+$/".into()],
            ..Default::default()
        };
        assert!(f.matches(&node("web12")));
        assert!(!f.matches(&node("db1")));
    }

    #[test]
    fn fact_filters_compare_values() {
        let facts = serde_json::json!({"os": {"family": "linux"}, "cpus": 4});
        let mut n = node("n1");
        n.facts = Some(&facts);
        let mk = |fact: &str, op: &str, value: &str| Filter {
            fact: vec![FactFilter {
                fact: fact.into(),
                operator: op.into(),
                value: value.into(),
            }],
            ..Default::default()
        };
        assert!(mk("os.family", "==", "linux").matches(&n));
        assert!(!mk("os.family", "!=", "linux").matches(&n));
        assert!(mk("cpus", ">=", "2").matches(&n));
        assert!(!mk("cpus", "<", "2").matches(&n));
        assert!(mk("os.family", "=~", "/^lin/").matches(&n));
        assert!(!mk("missing", "==", "x").matches(&n));
    }
}
