//! A reader of the PromQL that dashboards hold, enough to find what they
//! select: metric names with their `{…}` matchers, the labels of `by`/
//! `without`, and the functions around each selector. Strings, numbers,
//! ranges (`[5m]`, `[$__interval]`), operators and keywords are skipped;
//! labels named by `on`/`ignoring`/`group_left` and inside string
//! arguments (`label_replace`) are not read.

use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Re,
    NotRe,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    pub op: Op,
    pub value: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    /// Empty for `{…}` without `__name__`: any metric.
    pub metric: String,
    pub matchers: Vec<Matcher>,
    /// Labels of every enclosing `by (…)` / `without (…)`.
    pub grouping: BTreeSet<String>,
    /// Enclosing functions and aggregations, outermost first.
    pub functions: Vec<String>,
}

impl Selector {
    pub fn any() -> Self {
        Selector {
            metric: String::new(),
            matchers: Vec::new(),
            grouping: BTreeSet::new(),
            functions: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Open,
    Close,
    Comma,
    Braces(Vec<Matcher>),
    /// Numbers, strings, operators, Grafana variables.
    Other,
}

const GROUPING: [&str; 2] = ["by", "without"];
const VECTOR_MATCHING: [&str; 4] = ["on", "ignoring", "group_left", "group_right"];
const KEYWORDS: [&str; 8] = [
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn ident(chars: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while i < chars.len() && is_ident(chars[i]) {
        i += 1;
    }
    (chars[start..i].iter().collect(), i)
}

fn skip_ws(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

/// A quoted string at `i`: its value and the index after it.
fn string(chars: &[char], i: usize) -> Result<(String, usize), String> {
    let quote = chars[i];
    let mut value = String::new();
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            c if c == quote => return Ok((value, j + 1)),
            '\\' if quote != '`' => {
                j += 1;
                match chars.get(j) {
                    Some('n') => value.push('\n'),
                    Some('t') => value.push('\t'),
                    Some(c) => value.push(*c),
                    None => break,
                }
            }
            c => value.push(c),
        }
        j += 1;
    }
    Err(format!("unterminated string from offset {i}"))
}

/// The matchers of a `{…}` whose `{` is just before `i`.
fn matchers(chars: &[char], mut i: usize) -> Result<(Vec<Matcher>, usize), String> {
    let mut out = Vec::new();
    loop {
        i = skip_ws(chars, i);
        match chars.get(i) {
            Some('}') => return Ok((out, i + 1)),
            Some(c) if is_ident_start(*c) => {}
            _ => return Err(format!("expected a label name at offset {i}")),
        }
        let (label, next) = ident(chars, i);
        i = skip_ws(chars, next);
        let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
        let (op, len) = match two.as_str() {
            "=~" => (Op::Re, 2),
            "!~" => (Op::NotRe, 2),
            "!=" => (Op::Ne, 2),
            _ if two.starts_with('=') => (Op::Eq, 1),
            _ => return Err(format!("expected a matcher operator after {label}")),
        };
        i = skip_ws(chars, i + len);
        if !matches!(chars.get(i), Some('"' | '\'' | '`')) {
            return Err(format!("expected a quoted value for {label}"));
        }
        let (value, next) = string(chars, i)?;
        out.push(Matcher { label, op, value });
        i = skip_ws(chars, next);
        if chars.get(i) == Some(&',') {
            i += 1;
        }
    }
}

fn lex(expr: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i = match c {
            c if c.is_whitespace() => i + 1,
            '#' => chars[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(chars.len(), |n| i + n),
            '(' | ')' | ',' => {
                out.push(match c {
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    _ => Tok::Comma,
                });
                i + 1
            }
            // A range or subquery: durations and Grafana variables only.
            '[' => {
                let end = chars[i..]
                    .iter()
                    .position(|c| *c == ']')
                    .ok_or_else(|| format!("unterminated [ at offset {i}"))?;
                i + end + 1
            }
            '{' => {
                let (m, next) = matchers(&chars, i + 1)?;
                out.push(Tok::Braces(m));
                next
            }
            '"' | '\'' | '`' => {
                out.push(Tok::Other);
                string(&chars, i)?.1
            }
            c if is_ident_start(c) => {
                let (word, next) = ident(&chars, i);
                out.push(Tok::Ident(word));
                next
            }
            '$' => {
                out.push(Tok::Other);
                if chars.get(i + 1) == Some(&'{') {
                    chars[i..]
                        .iter()
                        .position(|c| *c == '}')
                        .map_or(chars.len(), |n| i + n + 1)
                } else {
                    ident(&chars, i + 1).1
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                out.push(Tok::Other);
                let mut j = i;
                while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == '.') {
                    j += 1;
                }
                j
            }
            _ => {
                out.push(Tok::Other);
                i + 1
            }
        };
    }
    Ok(out)
}

/// `( label, … )` at `i`: the labels and the index after `)`.
fn label_list(toks: &[Tok], mut i: usize) -> Result<(BTreeSet<String>, usize), String> {
    if toks.get(i) != Some(&Tok::Open) {
        return Err("expected ( after by/without/on/ignoring".into());
    }
    let mut labels = BTreeSet::new();
    i += 1;
    loop {
        match toks.get(i) {
            Some(Tok::Ident(l)) => {
                labels.insert(l.clone());
            }
            Some(Tok::Comma) => {}
            Some(Tok::Close) => return Ok((labels, i + 1)),
            other => return Err(format!("unexpected {other:?} in a label list")),
        }
        i += 1;
    }
}

/// Every vector selector of `expr`, in order.
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    struct Frame {
        function: Option<String>,
        /// Index of its first selector in `out`.
        start: usize,
        /// From `sum by (x) (…)`: the grouping comes before the parenthesis.
        grouping: Option<BTreeSet<String>>,
    }
    let toks = lex(expr)?;
    let mut out: Vec<Selector> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    // An aggregation whose `by (…)` comes before its argument.
    let mut pending: Option<(String, Option<BTreeSet<String>>)> = None;
    // The start of the group the previous token closed (for `sum (…) by (x)`).
    let mut closed: Option<usize> = None;
    let mut i = 0;
    let new = |metric: String, matchers: Vec<Matcher>, stack: &[Frame]| Selector {
        metric,
        matchers,
        grouping: BTreeSet::new(),
        functions: stack.iter().filter_map(|f| f.function.clone()).collect(),
    };
    while i < toks.len() {
        let just_closed = closed.take();
        match &toks[i] {
            Tok::Ident(w) if GROUPING.contains(&w.as_str()) => {
                let (labels, next) = label_list(&toks, i + 1)?;
                match (just_closed, &mut pending) {
                    (Some(start), _) => {
                        for s in &mut out[start..] {
                            s.grouping.extend(labels.iter().cloned());
                        }
                    }
                    (None, Some((_, grouping @ None))) => *grouping = Some(labels),
                    _ => return Err(format!("{w} (…) without an aggregation")),
                }
                i = next;
                continue;
            }
            Tok::Ident(w) if VECTOR_MATCHING.contains(&w.as_str()) => {
                if toks.get(i + 1) == Some(&Tok::Open) {
                    i = label_list(&toks, i + 1)?.1;
                    continue;
                }
            }
            Tok::Ident(w) if KEYWORDS.contains(&w.to_ascii_lowercase().as_str()) => {}
            Tok::Ident(w) if toks.get(i + 1) == Some(&Tok::Open) => {
                let grouping = pending.take().and_then(|(_, g)| g);
                stack.push(Frame {
                    function: Some(w.clone()),
                    start: out.len(),
                    grouping,
                });
                i += 2;
                continue;
            }
            Tok::Ident(w) if AGGREGATIONS.contains(&w.as_str()) => {
                pending = Some((w.clone(), None));
            }
            Tok::Ident(w) => {
                let matchers = match toks.get(i + 1) {
                    Some(Tok::Braces(m)) => {
                        i += 1;
                        m.clone()
                    }
                    _ => Vec::new(),
                };
                out.push(new(w.clone(), matchers, &stack));
            }
            Tok::Braces(m) => {
                let name = m
                    .iter()
                    .position(|m| m.label == "__name__" && m.op == Op::Eq);
                let mut rest = m.clone();
                let metric = name.map(|n| rest.remove(n).value).unwrap_or_default();
                out.push(new(metric, rest, &stack));
            }
            Tok::Open => {
                let (function, grouping) = match pending.take() {
                    Some((f, g)) => (Some(f), g),
                    None => (None, None),
                };
                stack.push(Frame {
                    function,
                    start: out.len(),
                    grouping,
                });
            }
            Tok::Close => {
                let frame = stack
                    .pop()
                    .ok_or_else(|| format!("unbalanced ) in {expr:?}"))?;
                if let Some(g) = frame.grouping {
                    for s in &mut out[frame.start..] {
                        s.grouping.extend(g.iter().cloned());
                    }
                }
                closed = Some(frame.start);
            }
            Tok::Comma | Tok::Other => {}
        }
        i += 1;
    }
    if !stack.is_empty() {
        return Err(format!("unbalanced ( in {expr:?}"));
    }
    if pending.is_some() {
        return Err(format!("an aggregation without its argument in {expr:?}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_parser_reads_metrics_matchers_grouping_and_functions() {
        let sels = selectors(
            r#"sum(rate(choria_provisioner_rpc_time_sum{site=~"${instance}"}[1m])) by (rpc) / sum by (rpc, site) (rate(choria_provisioner_rpc_time_count{site="a\"b", rpc!='x'}[$__rate_interval]))"#,
        )
        .unwrap();
        assert_eq!(sels.len(), 2);
        assert_eq!(sels[0].metric, "choria_provisioner_rpc_time_sum");
        assert_eq!(
            sels[0].matchers,
            vec![Matcher {
                label: "site".into(),
                op: Op::Re,
                value: "${instance}".into()
            }]
        );
        assert_eq!(sels[0].grouping, BTreeSet::from(["rpc".to_string()]));
        assert_eq!(sels[0].functions, vec!["sum", "rate"]);
        assert_eq!(sels[1].metric, "choria_provisioner_rpc_time_count");
        assert_eq!(
            sels[1].grouping,
            BTreeSet::from(["rpc".to_string(), "site".to_string()])
        );
        assert_eq!(sels[1].matchers[0].value, "a\"b");
        assert_eq!(sels[1].matchers[1].op, Op::Ne);

        // Keywords, numbers, offsets, vector matching and __name__ are no metrics.
        let sels = selectors(
            r#"increase(a_total{job="x"}[5m] offset 1h) > 0.5 and on (job) b == bool 1e3 unless {__name__="c", site!~"d|e"} or max without (pod) (d) # note"#,
        )
        .unwrap();
        let names: Vec<&str> = sels.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, ["a_total", "b", "c", "d"]);
        assert_eq!(sels[0].functions, vec!["increase"]);
        assert!(sels[1].grouping.is_empty(), "on (job) is not grouping");
        assert_eq!(sels[2].matchers.len(), 1);
        assert_eq!(sels[2].matchers[0].op, Op::NotRe);
        assert_eq!(sels[3].grouping, BTreeSet::from(["pod".to_string()]));

        for bad in ["sum(x", "x)", r#"x{site="a}"#, "x{site}", "sum by x"] {
            assert!(selectors(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn strings_vector_matching_and_grafana_ranges_select_no_metric() {
        // label_replace's string arguments, `on`/`group_left` and a Grafana
        // range variable are read past; a backquoted string is raw.
        let sels = selectors(
            r#"label_replace(up{job=`a\b`}, "dst", "$1", "src", "(.*)") * on (job) group_left topk(5, rate(x_total[$__rate_interval]))"#,
        )
        .unwrap();
        let names: Vec<&str> = sels.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, ["up", "x_total"]);
        assert_eq!(sels[0].matchers[0].value, r"a\b");
        assert_eq!(sels[0].functions, vec!["label_replace"]);
        assert_eq!(sels[1].functions, vec!["topk", "rate"]);
        assert!(sels[1].grouping.is_empty(), "on (job) is not grouping");
    }
}
