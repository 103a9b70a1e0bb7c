//! Running on a host (`docs/src/guides/host.md`): the systemd unit the
//! repository ships is one systemd accepts without a warning, runs the
//! binary the page installs with the files the page makes, and is the
//! unit the page shows.

use crate::support::peers::Missing;
use crate::support::provisioner::binary;
use std::path::PathBuf;
use std::process::Command;

const UNIT: &str = "deploy/host/choria-provisioner-rs.service";
/// Where the page installs the binary.
const INSTALLED: &str = "/usr/local/bin/choria-provisioner";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `systemd-analyze verify` of the shipped unit, with `ExecStart` and
/// `ExecStartPre` pointing at the binary this build made instead of
/// `/usr/local/bin` (the one thing substituted: verify refuses a command
/// that is not there): no error and no warning (an unknown or misspelt
/// key, a value systemd would ignore, is a warning only).
#[test]
fn the_shipped_unit_passes_systemd_analyze_verify_without_a_warning() {
    let Ok(out) = Command::new("systemd-analyze").arg("--version").output() else {
        return Missing {
            test: "host::the_shipped_unit_passes_systemd_analyze_verify_without_a_warning",
            problem: "systemd-analyze is not on PATH".into(),
            unproven: "the shipped systemd unit",
            advice: "install systemd (Debian: apt-get install systemd)",
            build_log_var: None,
        }
        .skip()
        .unwrap_or(());
    };
    assert!(out.status.success());
    let text = std::fs::read_to_string(repo().join(UNIT)).unwrap();
    assert_eq!(
        text.matches(INSTALLED).count(),
        2,
        "ExecStartPre and ExecStart run {INSTALLED}, where the page installs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("choria-provisioner-rs.service");
    std::fs::write(&unit, text.replace(INSTALLED, binary())).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");

    // Without the substitution systemd refuses it: verify is not vacuous.
    let missing = dir.path().join("missing.service");
    std::fs::write(
        &missing,
        text.replace(INSTALLED, "/nonexistent/choria-provisioner"),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a unit whose binary is missing passed"
    );
}

/// The page shows the shipped unit (by inclusion), and every file the unit
/// names is one the page tells the reader to make, in the directory the
/// page makes.
#[test]
fn the_host_page_shows_the_shipped_unit_and_makes_what_it_names() {
    let page = std::fs::read_to_string(repo().join("docs/src/guides/host.md")).unwrap();
    assert!(
        page.contains("{{#include ../../../deploy/host/choria-provisioner-rs.service}}"),
        "the page does not include the shipped unit"
    );
    let unit = std::fs::read_to_string(repo().join(UNIT)).unwrap();
    for line in unit.lines().filter(|l| l.starts_with("ExecStart")) {
        for file in line.split_whitespace().filter(|w| w.starts_with("/etc/")) {
            assert!(
                page.contains(file),
                "the unit reads {file}, which the page never makes"
            );
        }
    }
    for needed in [
        "useradd --system --user-group",
        "install -d -o root -g choria-provisioner -m 0750 /etc/choria-provisioner-rs",
        &format!("target/release/choria-provisioner {INSTALLED}"),
        "systemctl enable --now choria-provisioner-rs",
    ] {
        assert!(page.contains(needed), "the page lacks {needed:?}");
    }
    let user = unit.lines().find_map(|l| l.strip_prefix("User=")).unwrap();
    assert!(
        page.contains(&format!("nologin {user}")),
        "the page makes no user {user}"
    );
}
