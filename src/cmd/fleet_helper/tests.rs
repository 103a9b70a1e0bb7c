//! The command line of `fleet-helper`; what the helper does with its options
//! is tested beside it, in `choria_fleet::helper`.

use super::*;
use clap::{CommandFactory, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: FleetHelperArgs,
}

fn args(flags: &[&str]) -> FleetHelperOptions {
    let argv = std::iter::once("fleet-helper").chain(flags.iter().copied());
    Cli::try_parse_from(argv).unwrap().args.into()
}

#[test]
fn cli_definition_is_valid() {
    Cli::command().debug_assert();
    assert!(Cli::try_parse_from(["h", "--fail-match", "x"]).is_err());
    assert!(Cli::try_parse_from(["h", "--ca-cert", "c.pem"]).is_err());
    assert!(Cli::try_parse_from(["h", "--set", "novalue"]).is_err());
    assert!(Cli::try_parse_from(["h", "--set", "=v"]).is_err());
    assert!(Cli::try_parse_from(["h", "--shutdown-match", "("]).is_err());
    assert!(Cli::try_parse_from(["h", "--fail", "explode"]).is_err());
    assert_eq!(args(&["--fail", "exit1"]).fail, Some(FailMode::Exit1));
}

#[test]
fn the_empty_command_line_is_the_default() {
    // The regular expressions have no `PartialEq`; their `Debug` shows the pattern.
    assert_eq!(
        format!("{:?}", args(&[])),
        format!("{:?}", FleetHelperOptions::default())
    );
}

#[test]
fn flags_reach_the_options() {
    let a = args(&[
        "--broker",
        "nats://b1:4222,nats://b2:4222",
        "--set",
        "plugin.choria.srv_domain=example.net",
        "--set",
        " with.equals =a=b",
        "--collectives",
        "mcollective,prod",
        "--validity",
        "2m",
        "--shutdown-match",
        r"^bad-\d+\.",
        "--fail",
        "crash",
        "--fail-match",
        "^n1$",
    ]);
    // The broker list is passed to the nodes as written.
    assert_eq!(a.broker, "nats://b1:4222,nats://b2:4222");
    assert_eq!(
        a.settings,
        [
            ("plugin.choria.srv_domain".into(), "example.net".into()),
            ("with.equals".into(), "a=b".into()),
        ]
    );
    assert_eq!(a.collectives, ["mcollective", "prod"]);
    assert_eq!(a.validity, Duration::from_secs(120));
    assert!(a
        .shutdown_match
        .as_ref()
        .unwrap()
        .is_match("bad-1.example.net"));
    assert_eq!(a.failure_for("n1"), Some(FailMode::Crash));
    assert_eq!(a.failure_for("n10"), None);
}

#[test]
fn validity_takes_a_whole_number_and_a_unit() {
    for (text, secs) in [
        ("30s", 30),
        ("2m", 120),
        ("1h", 3600),
        ("1d", 86_400),
        ("1w", 7 * 86_400),
        (" 1y ", 365 * 86_400),
    ] {
        assert_eq!(validity(text), Ok(Duration::from_secs(secs)), "{text}");
    }
    for bad in ["", "y", "1", "1.5h", "1x", "-1d"] {
        assert!(validity(bad).is_err(), "{bad:?}");
    }
}
