//! What a value interpolated into `configuration_template` may hold, by the
//! place it lands.
//!
//! Templates see what nodes report about themselves (facts, classes, the
//! provisioning JWT's claims), and nodes are untrusted: anyone can join the
//! provisioning collective and say anything. A node's own words must never
//! widen what it is granted, so every `{{ ... }}` is checked where it lands,
//! while the template's literal text is the author's and is left alone:
//!
//! | place | an interpolated value may not hold |
//! |---|---|
//! | a setting (`configuration.<key>`) | a line break or other control character (a setting is one `key = value` line) |
//! | a list-valued setting (`collectives`, `plugin.choria.middleware_hosts`, ... [`LIST_SETTINGS`]), or one that becomes part of a subject (`main_collective`, ...) | that, a `,` (`:` in `libdir`) or whitespace (each would add items) |
//! | an action policy (`action_policies.<file>`) | a control character (lines are rules) or whitespace (fields are whitespace-separated) |
//! | an OPA policy (`opa_policies.<file>`) | that, or `"`, `` ` ``, `\`, `#` (which end strings or start comments in Rego) |
//! | `upgrade` | a control character or whitespace |
//!
//! In a policy an interpolated value may also not be, or make a rule's
//! field, a wildcard or a pattern: a value that is `*`, `/…/` or only
//! wildcard characters (`.*`) is refused in both kinds of policy, and in an
//! action policy so is a field that owes its `*` or either `/` of a
//! `/…/` to a value, or a value that puts pattern characters inside a
//! `/…/` the author wrote (`/^{{ x }}$/` with `x` = `.*`) — each would let
//! every caller, action or node through where the author meant one.
//!
//! A template author who trusts a value opts in per use with a filter:
//! `{{ values.brokers | allow_separators }}` lets `,` and whitespace
//! through, `{{ values.rules | allow_line_breaks }}` lets line breaks into a
//! policy file, `{{ values.admins | allow_patterns }}` lets a wildcard or
//! pattern into one. Neither lets a line break into a setting: a Choria
//! configuration file cannot hold one. A value built in an expression
//! (`{{ a ~ "," ~ b }}`) is checked as a whole, so write literal separators
//! in the template text instead (`{{ a }},{{ b }}`).

// Templates by their names only: `template` uses this module (it installs
// the checks below into every environment), so this one does not use it.
use super::template_names::{ACTION_POLICIES, OPA_POLICIES, UPGRADE};
use minijinja::value::{Object, Value};
use minijinja::{Error, ErrorKind, Output, State};
use std::fmt;
use std::sync::Arc;

/// Settings go-choria v0.30.2 reads as lists (`config/config.go` and
/// `config/choria.go`: the `comma_split` and `path_split` keys), and the
/// single settings that become part of a NATS subject: a `,`, `:` or
/// whitespace in an interpolated value would add items of the node's
/// choosing, or a subject token.
pub const LIST_SETTINGS: &[&str] = &[
    // comma_split
    "registration",
    "collectives",
    "plugin.choria.federation.collectives",
    "plugin.choria.federation_middleware_hosts",
    "plugin.choria.middleware_hosts",
    "plugin.choria.network.client_hosts",
    "plugin.choria.network.client_signer_cert",
    "plugin.choria.network.gateway_remotes",
    "plugin.choria.network.leafnode_remotes",
    "plugin.choria.network.mapping.names",
    "plugin.choria.network.peers",
    "plugin.choria.network.server_signer_cert",
    "plugin.choria.adapters",
    "plugin.login.aaasvc.login.url",
    "plugin.security.cipher_suites",
    "plugin.security.ecc_curves",
    "plugin.security.issuer.names",
    "plugin.choria.security.privileged_users",
    "plugin.choria.security.certname_whitelist",
    "plugin.security.choria.trusted_signers",
    "plugin.security.certmanager.alt_names",
    "plugin.scout.goss.denied_local_resources",
    "plugin.scout.goss.denied_remote_resources",
    // path_split (on `:`)
    "libdir",
    "plugin.choria.agent_provider.mcorpc.libdir",
    // single values that end up in subjects
    "main_collective",
    "registration_collective",
    "plugin.choria.federation.cluster",
    "plugin.choria.registration.file_content.target",
    "plugin.choria.registration.inventory_content.target",
];

/// List settings split on `:` rather than `,`.
const PATH_LISTS: &[&str] = &["libdir", "plugin.choria.agent_provider.mcorpc.libdir"];

/// The opt-in filter that lets `,` and whitespace through.
pub const ALLOW_SEPARATORS: &str = "allow_separators";
/// The opt-in filter that lets line breaks into a policy file.
pub const ALLOW_LINE_BREAKS: &str = "allow_line_breaks";
/// The opt-in filter that lets a wildcard or a pattern into a policy.
pub const ALLOW_PATTERNS: &str = "allow_patterns";

/// Where an interpolated value begins and ends in a rendered action
/// policy, until [`check_policy_fields`] has looked at its fields: a
/// private use character, a nonce of this process, and another (so no
/// value can forge one; private use characters are refused in values).
const MARK_OPEN: char = '\u{E000}';
const MARK_CLOSE: char = '\u{E001}';
const MARK_END: char = '\u{E002}';

/// The open and close tokens of this process.
fn tokens() -> &'static (String, String) {
    static TOKENS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    TOKENS.get_or_init(|| {
        let nonce = format!("{:016x}", rand::random::<u64>());
        (
            format!("{MARK_OPEN}{nonce}{MARK_END}"),
            format!("{MARK_CLOSE}{nonce}{MARK_END}"),
        )
    })
}

fn is_mark(c: char) -> bool {
    matches!(c, MARK_OPEN | MARK_CLOSE | MARK_END)
}

/// Whether `text` carries our tokens (the output of a template block that
/// captured marked values, such as `{% set x %}…{% endset %}`) and no mark
/// character outside them.
fn carries_tokens(text: &str) -> bool {
    let (open, close) = tokens();
    if !text.contains(open.as_str()) && !text.contains(close.as_str()) {
        return false;
    }
    !text
        .replace(open.as_str(), "")
        .replace(close.as_str(), "")
        .chars()
        .any(is_mark)
}
/// What a regular expression gives meaning to.
const REGEX_META: &[char] = &[
    '.', '^', '$', '*', '+', '?', '(', ')', '[', ']', '{', '}', '|', '\\',
];

/// Whether a value is by itself a wildcard or a pattern: `*`, `/…/`, or
/// only wildcard characters (`.*`, `**`, `.+`).
fn is_pattern(text: &str) -> bool {
    let t = text.trim();
    t == "*"
        || (t.len() >= 2 && t.starts_with('/') && t.ends_with('/'))
        || (!t.is_empty()
            && t.chars()
                .all(|c| matches!(c, '*' | '.' | '+' | '?' | '^' | '$')))
}

/// Where a rendered template lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Setting,
    ListSetting,
    /// A list split on `:` (`libdir`).
    PathList,
    ActionPolicy,
    OpaPolicy,
    Version,
}

impl Place {
    /// The place of the template named `section.key` (`upgrade` alone has
    /// no key).
    pub fn of(template_name: &str) -> Place {
        let (section, key) = template_name.split_once('.').unwrap_or((template_name, ""));
        match section {
            ACTION_POLICIES => Place::ActionPolicy,
            OPA_POLICIES => Place::OpaPolicy,
            UPGRADE => Place::Version,
            _ if PATH_LISTS.iter().any(|k| k.eq_ignore_ascii_case(key)) => Place::PathList,
            _ if is_list_setting(key) => Place::ListSetting,
            _ => Place::Setting,
        }
    }

    /// Its metric label and the words for errors.
    pub fn label(self) -> &'static str {
        match self {
            Place::Setting => "setting",
            Place::ListSetting | Place::PathList => "list_setting",
            Place::ActionPolicy => "action_policy",
            Place::OpaPolicy => "opa_policy",
            Place::Version => "version",
        }
    }

    /// Why `c` may not appear in an interpolated value here, given what
    /// the author vouched for; `None` when it may.
    fn forbids(self, c: char, vouched: Vouch) -> Option<&'static str> {
        let line_break = c == '\n' || c == '\r';
        let policy = matches!(self, Place::ActionPolicy | Place::OpaPolicy);
        if policy && is_mark(c) {
            return Some("private use characters have no place in a policy");
        }
        if c.is_control() {
            let policy = matches!(self, Place::ActionPolicy | Place::OpaPolicy);
            return match () {
                _ if policy && line_break && vouched.line_breaks => None,
                _ if policy && c == '\t' && vouched.separators => None,
                _ if line_break && policy => Some("it would add lines to the policy"),
                _ if line_break => Some("it would add settings to the node's configuration"),
                _ => Some("control characters have no place in a configuration"),
            };
        }
        let separator = c == ',' || c.is_whitespace();
        match self {
            Place::ListSetting if separator && !vouched.separators => {
                Some("it would add items to a list setting")
            }
            Place::PathList if (separator || c == ':') && !vouched.separators => {
                Some("it would add items to a list setting")
            }
            Place::ActionPolicy | Place::OpaPolicy if c.is_whitespace() && !vouched.separators => {
                Some("it would add fields to a policy rule")
            }
            Place::OpaPolicy if matches!(c, '"' | '`' | '\\' | '#') => {
                Some("it would end a Rego string or start a comment")
            }
            Place::Version if c.is_whitespace() => Some("a version is one word"),
            _ => None,
        }
    }

    /// Checks one interpolated value.
    pub fn check(self, text: &str, vouched: Vouch) -> Result<(), Refused> {
        let length = text.chars().count();
        let policy = matches!(self, Place::ActionPolicy | Place::OpaPolicy);
        if policy && !vouched.patterns && is_pattern(text) {
            return Err(Refused {
                place: self,
                character: text.trim().chars().next().unwrap_or('*'),
                position: 1,
                length,
                why: "it is a wildcard or a pattern, which would match more than one caller, action or node",
            });
        }
        for (i, c) in text.chars().enumerate() {
            if let Some(why) = self.forbids(c, vouched) {
                return Err(Refused {
                    place: self,
                    character: c,
                    position: i + 1,
                    length,
                    why,
                });
            }
        }
        Ok(())
    }
}

/// The refusal behind a render error, when an interpolated value was refused.
pub fn refusal(error: &Error) -> Option<&Refused> {
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        if let Some(r) = e.downcast_ref::<Refused>() {
            return Some(r);
        }
        source = e.source();
    }
    None
}

/// Whether `key` is a list-valued Choria setting (keys are case-insensitive).
pub fn is_list_setting(key: &str) -> bool {
    LIST_SETTINGS.iter().any(|k| k.eq_ignore_ascii_case(key))
}

/// What the template author vouched for with the opt-in filters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vouch {
    pub separators: bool,
    pub line_breaks: bool,
    pub patterns: bool,
}

/// Checks a rendered action policy whose interpolated values are marked
/// (see [`format_checked`]): no field may owe a wildcard, or the slashes or
/// pattern characters of a `/…/`, to a value. Returns the policy without
/// the marks.
pub fn check_policy_fields(rendered: &str) -> Result<String, Refused> {
    let (open, close) = tokens();
    if !rendered.contains(open.as_str()) {
        return Ok(rendered.to_string());
    }
    // The tokens as one character each; values hold no mark characters.
    let rendered = rendered
        .replace(open.as_str(), &MARK_OPEN.to_string())
        .replace(close.as_str(), &MARK_CLOSE.to_string());
    // Each character of the current field, and whether a value put it there.
    let mut field: Vec<(char, bool)> = Vec::new();
    let mut inside = false;
    for c in rendered.chars().chain(std::iter::once(' ')) {
        match c {
            MARK_OPEN => inside = true,
            MARK_CLOSE => inside = false,
            c if c.is_whitespace() => {
                check_field(&field)?;
                if let Some(eq) = field.iter().position(|(c, _)| *c == '=') {
                    check_field(&field[eq + 1..])?;
                }
                field.clear();
            }
            c => field.push((c, inside)),
        }
    }
    Ok(rendered.replace([MARK_OPEN, MARK_CLOSE, MARK_END], ""))
}

/// One field (or a fact's value) of an action policy rule.
fn check_field(chars: &[(char, bool)]) -> Result<(), Refused> {
    let n = chars.len();
    let refuse = |i: usize, why: &'static str| Refused {
        place: Place::ActionPolicy,
        character: chars[i].0,
        position: i + 1,
        length: n,
        why,
    };
    let from_value = |i: usize| chars[i].1;
    if n == 1 && chars[0].0 == '*' && from_value(0) {
        return Err(refuse(0, "it makes a field a wildcard"));
    }
    let pattern = n >= 2 && chars[0].0 == '/' && chars[n - 1].0 == '/';
    if pattern {
        if from_value(0) || from_value(n - 1) {
            let i = if from_value(0) { 0 } else { n - 1 };
            return Err(refuse(i, "it makes a field a regular expression"));
        }
        if let Some(i) = (1..n - 1).find(|&i| from_value(i) && REGEX_META.contains(&chars[i].0)) {
            return Err(refuse(
                i,
                "it gives meaning to a character of the regular expression around it",
            ));
        }
    }
    Ok(())
}

/// An interpolated value refused for its place. The value itself is not
/// shown: it may come from `values`, which can hold secrets.
#[derive(Debug, thiserror::Error)]
#[error("an interpolated value holds {} (character {position} of {length}), refused in {}: {why}{}", describe(*.character), place_words(*.place), hint(*.place, *.character))]
pub struct Refused {
    pub place: Place,
    pub character: char,
    pub position: usize,
    pub length: usize,
    pub why: &'static str,
}

fn describe(c: char) -> String {
    match c {
        '\n' => "a line break".into(),
        '\r' => "a carriage return".into(),
        '\t' => "a tab".into(),
        c if c.is_control() => format!("the control character U+{:04X}", c as u32),
        c if c.is_whitespace() => "whitespace".into(),
        c => format!("{c:?}"),
    }
}

fn place_words(place: Place) -> &'static str {
    match place {
        Place::Setting => "a setting",
        Place::ListSetting | Place::PathList => "a list-valued setting",
        Place::ActionPolicy => "an action policy",
        Place::OpaPolicy => "an OPA policy",
        Place::Version => "the upgrade version",
    }
}

fn hint(place: Place, c: char) -> String {
    let line_break = c == '\n' || c == '\r';
    let policy = matches!(place, Place::ActionPolicy | Place::OpaPolicy);
    if policy && line_break {
        format!(" (does a value the node reported hold one? if this value is trusted, use `| {ALLOW_LINE_BREAKS}`)")
    } else if (c == ',' || c.is_whitespace())
        && matches!(
            place,
            Place::ListSetting | Place::PathList | Place::ActionPolicy | Place::OpaPolicy
        )
    {
        format!(" (does a value the node reported hold one? if this value is trusted, use `| {ALLOW_SEPARATORS}`)")
    } else {
        " (does a value the node reported hold one?)".into()
    }
}

/// A value the author passed through an opt-in filter.
#[derive(Debug)]
struct Vouched {
    text: String,
    vouch: Vouch,
}

impl Object for Vouched {
    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn vouch(value: Value, add: Vouch) -> Value {
    let (text, had) = match value.downcast_object_ref::<Vouched>() {
        Some(v) => (v.text.clone(), v.vouch),
        None => (value.to_string(), Vouch::default()),
    };
    Value::from_object(Vouched {
        text,
        vouch: Vouch {
            separators: had.separators || add.separators,
            line_breaks: had.line_breaks || add.line_breaks,
            patterns: had.patterns || add.patterns,
        },
    })
}

/// Adds the opt-in filters and the checking formatter to `env`.
pub fn install(env: &mut minijinja::Environment<'_>) {
    env.add_filter(ALLOW_SEPARATORS, |v: Value| {
        vouch(
            v,
            Vouch {
                separators: true,
                ..Vouch::default()
            },
        )
    });
    env.add_filter(ALLOW_LINE_BREAKS, |v: Value| {
        vouch(
            v,
            Vouch {
                line_breaks: true,
                ..Vouch::default()
            },
        )
    });
    env.add_filter(ALLOW_PATTERNS, |v: Value| {
        vouch(
            v,
            Vouch {
                patterns: true,
                ..Vouch::default()
            },
        )
    });
    env.set_formatter(format_checked);
}

/// The formatter: every `{{ ... }}` passes [`Place::check`] for the
/// template being rendered before it is written.
fn format_checked(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    let (text, vouched) = match value.downcast_object_ref::<Vouched>() {
        Some(v) => (v.text.clone(), v.vouch),
        None => (value.to_string(), Vouch::default()),
    };
    let place = Place::of(state.name());
    if place == Place::ActionPolicy && carries_tokens(&text) {
        // What a block of this template captured: its values were checked
        // and marked as they were written into it, the rest is the
        // template's own text.
        return out.write_str(&text).map_err(Error::from);
    }
    place
        .check(&text, vouched)
        .map_err(|r| Error::new(ErrorKind::InvalidOperation, r.to_string()).with_source(r))?;
    // A block of rules the author vouched for (`allow_line_breaks`) is the
    // author's text, wildcards included; every other value is marked for
    // check_policy_fields, which removes the marks.
    if place == Place::ActionPolicy && !vouched.patterns && !vouched.line_breaks {
        let (open, close) = tokens();
        out.write_str(open).map_err(Error::from)?;
        out.write_str(&text).map_err(Error::from)?;
        out.write_str(close).map_err(Error::from)
    } else {
        out.write_str(&text).map_err(Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_follow_the_template_name() {
        assert_eq!(Place::of("configuration.identity"), Place::Setting);
        assert_eq!(Place::of("configuration.collectives"), Place::ListSetting);
        assert_eq!(Place::of("configuration.Collectives"), Place::ListSetting);
        assert_eq!(
            Place::of("configuration.plugin.choria.middleware_hosts"),
            Place::ListSetting
        );
        assert_eq!(
            Place::of("action_policies.rpcutil.policy"),
            Place::ActionPolicy
        );
        assert_eq!(Place::of("opa_policies.default.rego"), Place::OpaPolicy);
        assert_eq!(Place::of("upgrade"), Place::Version);
        assert_eq!(Place::of("configuration.libdir"), Place::PathList);
        assert_eq!(
            Place::of("configuration.main_collective"),
            Place::ListSetting
        );
    }

    #[test]
    fn each_place_refuses_what_would_widen_it() {
        let none = Vouch::default();
        for (place, text, ok) in [
            (Place::Setting, "lon", true),
            (Place::Setting, "a b,c", true),
            (Place::Setting, "a\nb", false),
            (Place::Setting, "a\u{1b}b", false),
            (Place::ListSetting, "lon", true),
            (Place::ListSetting, "lon,admin", false),
            (Place::ListSetting, "lon admin", false),
            (Place::ListSetting, "lon\u{a0}admin", false),
            (Place::ActionPolicy, "web", true),
            (Place::ActionPolicy, "x * * *", false),
            (Place::ActionPolicy, "x\nallow * * * *", false),
            (Place::OpaPolicy, "web", true),
            (Place::OpaPolicy, "x\" } allow { true } #", false),
            (Place::PathList, "/opt/x", true),
            (Place::PathList, "/opt/x:/evil", false),
            (Place::Version, "0.30.2", true),
            (Place::Version, "0.30.2 x", false),
        ] {
            assert_eq!(place.check(text, none).is_ok(), ok, "{place:?} {text:?}");
        }
    }

    #[test]
    fn the_opt_in_filters_lift_only_what_they_name() {
        let sep = Vouch {
            separators: true,
            ..Vouch::default()
        };
        let lines = Vouch {
            line_breaks: true,
            ..Vouch::default()
        };
        assert!(Place::ListSetting.check("a, b", sep).is_ok());
        assert!(Place::ListSetting.check("a\nb", sep).is_err());
        assert!(
            Place::Setting.check("a\nb", lines).is_err(),
            "a setting is one line, whatever the author says"
        );
        assert!(Place::ActionPolicy.check("a\nb", lines).is_ok());
        assert!(Place::ActionPolicy.check("a b", lines).is_err());
        assert!(Place::OpaPolicy.check("a\"", sep).is_err());
    }

    #[test]
    fn a_value_may_not_be_a_wildcard_or_pattern_in_a_policy() {
        let none = Vouch::default();
        for place in [Place::ActionPolicy, Place::OpaPolicy] {
            for text in ["*", "/.*/", "/^choria=/", ".*", "**", ".+"] {
                let e = place.check(text, none).unwrap_err();
                assert!(
                    e.to_string().contains("wildcard or a pattern"),
                    "{place:?} {text:?}: {e}"
                );
            }
            for text in ["web01.example.net", "choria=ops", "a*b", "/etc/x"] {
                assert!(place.check(text, none).is_ok(), "{place:?} {text:?}");
            }
            let patterns = Vouch {
                patterns: true,
                ..Vouch::default()
            };
            assert!(place.check("*", patterns).is_ok());
        }
        assert!(Place::Setting.check("*", none).is_ok(), "only policies");
        assert!(
            Place::ActionPolicy.check("a\u{E000}b", none).is_err(),
            "no marks"
        );
    }

    #[test]
    fn a_field_may_not_owe_its_wildcard_or_pattern_to_a_value() {
        let (open, close) = tokens();
        let m = |s: &str| s.replace('[', open).replace(']', close);
        for (policy, ok) in [
            ("allow\tchoria=[ops]\t*\t*\t*\n", true),
            ("allow\t[choria=ops]\tstatus [restart]\t*\t*\n", true),
            // The author's regex around a plain value.
            ("allow\t/^choria=[ops]$/\t*\t*\t*\n", true),
            ("allow\t/^choria=[ops.*]$/\t*\t*\t*\n", false),
            // Slashes from two values make a regex.
            ("allow\t[/]x[/]\t*\t*\t*\n", false),
            ("allow\t[/]choria=ops/\t*\t*\t*\n", false),
            // A fact's value: `dc=` then a pattern.
            ("allow\t*\t*\tdc=[/]lon/\t*\n", false),
            ("allow\t*\t*\tdc=/[lon]/\t*\n", true),
            ("allow\t*\t*\tdc=[*]\t*\n", false),
            ("allow\t*\t*\tdc=[lon]\t*\n", true),
        ] {
            let r = check_policy_fields(&m(policy));
            assert_eq!(r.is_ok(), ok, "{policy:?}: {r:?}");
            if let Ok(text) = r {
                assert_eq!(text, policy.replace(['[', ']'], ""), "the marks are gone");
            }
        }
    }

    #[test]
    fn a_refusal_says_where_and_what_but_not_the_value() {
        let e = Place::ListSetting
            .check("secret-ish,x", Vouch::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("','"), "{e}");
        assert!(e.contains("character 11 of 12"), "{e}");
        assert!(e.contains("list-valued setting"), "{e}");
        assert!(e.contains(ALLOW_SEPARATORS), "{e}");
        assert!(!e.contains("secret-ish"), "{e}");
    }
}
