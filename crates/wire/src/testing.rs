//! Helpers for tests, here and in the crates above (the `testing`
//! feature): one shared RSA key, and cross-checking our output with the
//! `openssl` CLI.
//! Checks that need it fail under CI (`CI` set, as `.ci/run` runs
//! `scripts/test.sh`, which installs openssl) and are skipped loudly, with
//! the marker `scripts/test.sh` counts, in a plain `cargo test` without it
//! (the rule of `tests/it/support/peers.rs`). `softhsm` makes a private
//! SoftHSM2 token with RSA, P-256 and Ed25519 keys for the PKCS#11 tests,
//! under the same rule.

use crate::security::csr::generate_rsa_key;
use rsa::RsaPrivateKey;
use std::process::{Command, Output};
use std::sync::OnceLock;

pub mod softhsm;

/// One 1024 bit key shared by tests where the size does not matter.
pub fn test_key() -> &'static RsaPrivateKey {
    static KEY: OnceLock<RsaPrivateKey> = OnceLock::new();
    KEY.get_or_init(|| generate_rsa_key(1024).unwrap())
}

/// True (after saying so on stderr) when `openssl` cannot be run, so the
/// caller should skip `what`; under CI the test fails instead.
pub fn skip_without_openssl(what: &str) -> bool {
    let missing = Command::new("openssl").arg("version").output().is_err();
    if missing {
        not_run("openssl", what);
    }
    missing
}

/// Fails the calling test under CI, where `tool` is installed by
/// `scripts/test.sh` and its absence is a broken run; otherwise says
/// loudly that `what` is not checked, with the marker `scripts/test.sh`
/// counts.
pub(crate) fn not_run(tool: &str, what: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"));
    assert!(
        !ci,
        "{tool} cannot be run and CI is set: {what} FAILS instead of passing unchecked"
    );
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "!!! {test}: NOT RUN — {tool} is not installed: {what} proves nothing\n\
         skipped: {tool} not installed\n\
         test-not-run: {test}: {tool} is not installed"
    );
}

/// A `Command` for the `openssl` binary.
pub fn openssl() -> Command {
    Command::new("openssl")
}

/// Runs `cmd` and returns its output, failing the test with the command's
/// stderr when it does not exit successfully.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("could not run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Fails the test unless `openssl verify` accepts `cert_pem` as issued by
/// `ca_pem` for TLS servers and clients both (what a Choria node's
/// certificate is used for).
#[cfg(test)]
pub(crate) fn openssl_verifies(ca_pem: &str, cert_pem: &str) {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let cert_file = dir.path().join("cert.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    std::fs::write(&cert_file, cert_pem).unwrap();
    for purpose in ["sslserver", "sslclient"] {
        let out = run_ok(
            openssl()
                .args(["verify", "-purpose", purpose, "-CAfile"])
                .arg(&ca_file)
                .arg(&cert_file),
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(": OK"));
    }
}
