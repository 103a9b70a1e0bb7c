//! Test-only helpers for cross-checking our output with the `openssl` CLI.
//! Checks that need it are skipped, not failed, where it is not installed.

use std::process::{Command, Output};

/// True (after saying so on stderr) when `openssl` cannot be run, so the
/// caller should skip `what`.
pub(crate) fn skip_without_openssl(what: &str) -> bool {
    let missing = Command::new("openssl").arg("version").output().is_err();
    if missing {
        eprintln!("openssl not installed, skipping {what}");
    }
    missing
}

/// A `Command` for the `openssl` binary.
pub(crate) fn openssl() -> Command {
    Command::new("openssl")
}

/// Runs `cmd` and returns its output, failing the test with the command's
/// stderr when it does not exit successfully.
pub(crate) fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("could not run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
