//! What a node is granted, checked before it is configured or signed for,
//! whoever decided it (a template, the helper, or both).
//!
//! go-choria validates neither collective names nor a server JWT's publish
//! subjects anywhere (not at config load, not in the tokens package, not
//! in the broker), and the broker turns both into NATS permissions
//! verbatim: a collective `*` subscribes its server to every collective's
//! requests, `a.b` overlaps other collectives' subjects, `a b` becomes a
//! subscription with a queue group. So the provisioner, which signs the
//! server JWT, checks them itself:
//!
//! * a collective name is one NATS subject token of letters, digits, `_`
//!   and `-` ([`COLLECTIVE`]);
//! * a publish subject is tokens of those characters joined by `.`, where
//!   `*` may stand for a whole token and `>` for the last one, and which
//!   names at least one token literally (`*`, `>` or `*.>` alone would let
//!   the node publish anywhere).
//!
//! A refusal fails the node with an error naming the setting, counted in
//! `choria_provisioner_refused_values{place}`.

use std::collections::BTreeMap;

/// A collective name, as this provisioner requires it (not a go-choria
/// rule: it has none).
pub const COLLECTIVE: &str = "letters, digits, '_' and '-', at least one";

/// Settings whose value names a collective.
const COLLECTIVE_SETTINGS: [&str; 2] = ["main_collective", "registration_collective"];

/// A grant refused; `place` is a label of
/// `choria_provisioner_refused_values`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {value} is not {expected}; refusing to configure or sign for it")]
pub struct Refused {
    pub place: &'static str,
    pub setting: String,
    /// The offending item, escaped and cut short.
    pub value: String,
    pub expected: &'static str,
}

fn refuse(place: &'static str, setting: &str, value: &str, expected: &'static str) -> Refused {
    Refused {
        place,
        setting: setting.to_string(),
        value: format!("{:?}", crate::provision::text::one_line(value, 80)),
        expected,
    }
}

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// Whether `name` is a valid collective name.
pub fn is_collective(name: &str) -> bool {
    !name.is_empty() && name.chars().all(token_char)
}

/// go-choria's reading of a list setting (`confkey`'s `comma_split`): split
/// on `,`, each item trimmed, empty items kept (and refused by the checks).
/// The Go provisioner does not trim when it signs, so `a, b` gave the node
/// a JWT for `" b"` it could receive in but not reply from.
pub fn split_list(value: &str) -> Vec<String> {
    value.split(',').map(|s| s.trim().to_string()).collect()
}

/// Checks the collective settings of a node's configuration.
pub fn check_configuration(configuration: &BTreeMap<String, String>) -> Result<(), Refused> {
    for (key, value) in configuration {
        if key.eq_ignore_ascii_case("collectives") {
            check_collectives("collectives", &split_list(value))?;
        } else if let Some(setting) = COLLECTIVE_SETTINGS
            .iter()
            .find(|s| s.eq_ignore_ascii_case(key))
        {
            let name = value.trim();
            if !is_collective(name) {
                return Err(refuse("main_collective", setting, name, COLLECTIVE));
            }
        }
    }
    Ok(())
}

/// Checks the collectives a server JWT grants.
pub fn check_collectives(setting: &str, collectives: &[String]) -> Result<(), Refused> {
    if collectives.is_empty() {
        return Err(refuse("collectives", setting, "", COLLECTIVE));
    }
    match collectives.iter().find(|c| !is_collective(c)) {
        Some(bad) => Err(refuse("collectives", setting, bad, COLLECTIVE)),
        None => Ok(()),
    }
}

/// What a publish subject must be.
const SUBJECT: &str =
    "a NATS subject of letters, digits, '_' and '-' tokens ('*' for a token, '>' last) naming at least one token";

/// Whether `subject` is a publish subject we sign for.
pub fn is_publish_subject(subject: &str) -> bool {
    let tokens: Vec<&str> = subject.split('.').collect();
    let last = tokens.len() - 1;
    let valid = tokens.iter().enumerate().all(|(i, t)| {
        (!t.is_empty() && t.chars().all(token_char)) || *t == "*" || (*t == ">" && i == last)
    });
    valid && tokens.iter().any(|t| *t != "*" && *t != ">")
}

/// Checks the server JWT's additional publish subjects.
pub fn check_publish_subjects(subjects: &[String]) -> Result<(), Refused> {
    match subjects.iter().find(|s| !is_publish_subject(s)) {
        Some(bad) => Err(refuse(
            "pub_subjects",
            "server_claims.pub_subjects",
            bad,
            SUBJECT,
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn collective_names_are_single_subject_tokens() {
        for ok in ["mcollective", "lon", "eu-west_1", "A1"] {
            assert!(is_collective(ok), "{ok}");
        }
        for bad in ["", "*", ">", "a.b", "a b", "a,b", " lon", "lon\n", "ä"] {
            assert!(!is_collective(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_configuration_naming_a_bad_collective_is_refused_with_its_setting() {
        assert!(check_configuration(&config(&[("collectives", "mcollective, lon")])).is_ok());
        for (key, value, place) in [
            ("collectives", "lon,*", "collectives"),
            ("collectives", "lon,,admin", "collectives"),
            ("Collectives", "a.b", "collectives"),
            ("main_collective", "*", "main_collective"),
            ("registration_collective", "x y", "main_collective"),
        ] {
            let e = check_configuration(&config(&[(key, value)])).unwrap_err();
            assert_eq!(e.place, place, "{key}={value}");
            assert!(
                e.to_string().starts_with(key.to_lowercase().as_str()) || e.setting == key,
                "{e}"
            );
        }
    }

    #[test]
    fn the_list_is_read_as_go_choria_reads_it() {
        assert_eq!(split_list("a, b ,c"), ["a", "b", "c"]);
        assert_eq!(split_list("a,,b"), ["a", "", "b"]);
    }

    #[test]
    fn publish_subjects_must_name_something_and_be_well_formed() {
        for ok in ["acme.registration", "acme.*.events", "acme.>", "x"] {
            assert!(is_publish_subject(ok), "{ok}");
        }
        for bad in [
            ">", "*", "*.>", "*.*", "a..b", "a.>.b", "a b", "a,b", "", "a.", "a\nb",
        ] {
            assert!(!is_publish_subject(bad), "{bad:?}");
        }
        let e = check_publish_subjects(&["ok.x".into(), ">".into()]).unwrap_err();
        assert_eq!(e.place, "pub_subjects");
        assert!(e.to_string().contains("\">\""), "{e}");
    }
}
