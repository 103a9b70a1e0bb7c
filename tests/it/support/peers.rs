//! The one rule for a test whose real peer (go-choria, the election
//! candidate, the Go provisioner, etcd/kube-apiserver/kubectl, cert-manager)
//! is missing: under CI (`CI` set, as `.ci/run` runs `scripts/test.sh`) the
//! test FAILS with the reason; in a plain `cargo test` it says loudly that it
//! proves nothing, prints [`NOT_RUN_MARKER`] for `scripts/test.sh`'s closing
//! summary to count it as skipped, and returns `None` so the test returns.
//!
//! Every helper that looks a peer up (`gopeers::choria_bin`,
//! `gopeers::go_provisioner_bin`, `gopeers::candidate_bin`,
//! `kube::ControlPlane::available`, `certmanager::available`) ends here.

use std::io::Write;
use std::path::PathBuf;

/// Starts the line `scripts/test.sh` counts: `test-not-run: <test>: <why>`.
pub const NOT_RUN_MARKER: &str = "test-not-run:";

/// True under CI: `CI` is set to anything but empty, `0` or `false`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// The name libtest gave this test's thread (the test's name), for helpers
/// that are not told it.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string()
}

/// What is missing and what to do about it.
pub struct Missing<'a> {
    /// The test that needed it.
    pub test: &'a str,
    /// What is wrong, e.g. `CHORIA_BIN=/x does not exist`.
    pub problem: String,
    /// What this run then proves nothing about.
    pub unproven: &'a str,
    /// How to get the peer (one or more lines).
    pub advice: &'a str,
    /// The variable `scripts/test.sh` fills with the build error.
    pub build_log_var: Option<&'a str>,
}

impl Missing<'_> {
    /// Fails the test under CI; otherwise prints the banner and the marker
    /// and returns `None`.
    pub fn skip<T>(self) -> Option<T> {
        let why = self.build_log_var.map(|var| {
            let log = std::env::var(var)
                .unwrap_or_else(|_| format!("({var} is not set: run scripts/test.sh)"));
            format!("{var}:\n{log}")
        });
        let why = why.unwrap_or_default();
        assert!(
            !in_ci(),
            "{}: a peer is missing and CI is set, so this test FAILS instead of passing \
             without proof: {}.\n{} is not proven.\n{}\n{why}",
            self.test,
            self.problem,
            self.unproven,
            self.advice
        );
        let bar = "!".repeat(78);
        // Straight to the process's stderr (one locked write): libtest
        // captures `eprintln!` of passing tests, and this must be seen in a
        // plain `cargo test` run and counted by scripts/test.sh.
        let _ = writeln!(
            std::io::stderr(),
            "\n{bar}\n!!! {}: NOT RUN — {}.\n!!! {} is proven NOTHING in this run.\n{}\n{why}\n{bar}\n{NOT_RUN_MARKER} {}: {}",
            self.test,
            self.problem,
            self.unproven,
            self.advice
                .lines()
                .map(|l| format!("!!! {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
            self.test,
            self.problem,
        );
        None
    }
}

/// `$var` when it names a file; otherwise what is wrong with it.
pub fn file_from_env(var: &str) -> Result<PathBuf, String> {
    match std::env::var_os(var).map(PathBuf::from) {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(format!("{var}={} does not exist", p.display())),
        None => Err(format!("{var} is not set")),
    }
}
