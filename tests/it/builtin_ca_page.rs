//! "x509 fleets with the built-in CA" (`docs/src/guides/builtin-ca.md`)
//! run from the page's own text, as its reader pastes it: its blocks in
//! order in one bash, the token steps included. What differs, and why:
//! * the binary this build made is on `PATH` and `REPO` is a copy of the
//!   files the page reads from the repository (the quick start's step 1
//!   sets both for the reader);
//! * the nats-server `ensure_nats_server` installs is in the fresh
//!   `HOME`'s cache already (linked: nothing is downloaded);
//! * step 4's `run` (`sh,step,running`), which the reader leaves running
//!   in its own shell, runs in the background of this one;
//! * the page's ports, 4222 and 8080, are free ones, in its text and in the
//!   example files it copies.
//!
//! Needs `openssl`, `curl`, `python3`, SoftHSM2 and OpenSC (the page's step
//! 3); without SoftHSM the test fails under CI and says skipped otherwise.

use crate::support::free_port;
use crate::support::page::{blocks, script, tail_of, Block, Shell};
use crate::support::provisioner::binary;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PAGE: &str = "docs/src/guides/builtin-ca.md";
const NODES: usize = 20;

#[test]
fn the_built_in_ca_guide_runs_as_written() {
    let tools = ["softhsm2-util", "pkcs11-tool"];
    if tools
        .iter()
        .any(|t| Command::new(t).arg("--help").output().is_err())
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tools:?} missing: scripts/test.sh installs softhsm2 and opensc"
        );
        eprintln!("skipped: softhsm2 or opensc not installed");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join(PAGE)).unwrap();
    let steps: Vec<Block> = blocks(&page)
        .into_iter()
        .filter(|b| b.is(&["step"]))
        .map(|mut b| {
            if b.is(&["running"]) {
                b.text = format!("{} &\n", b.text.trim_end());
            }
            b
        })
        .collect();
    assert!(
        steps.iter().filter(|b| b.is(&["token"])).count() == 2,
        "{PAGE}: the token steps"
    );
    let shell = Shell::new(&[("choria-provisioner", Path::new(binary()))]);
    let cache = shell.home().join(".cache/choria-provisioner-rs/bin");
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(crate::support::nats_server_bin(), cache.join("nats-server"))
        .unwrap();
    let ports = [
        ("4222", free_port().to_string()),
        ("8080", free_port().to_string()),
    ];
    let copy = shell.work.path().join("repo");
    for file in [
        "docs/src/examples/builtin-ca/provisioner.yaml",
        "docs/src/examples/local/choria.cfg",
        "scripts/lib.sh",
    ] {
        let mut text = std::fs::read_to_string(repo.join(file)).unwrap();
        for (from, to) in &ports {
            text = text.replace(from, to);
        }
        let target = copy.join(file);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, text).unwrap();
    }
    let ran = shell.run(
        &script(&steps, &ports, 120),
        &[("REPO", &copy)],
        Duration::from_secs(300),
    );
    let lab = shell.home().join("choria-ca");
    if let Err(e) = ran {
        panic!(
            "{PAGE}: {e}\nthe page's shell:\n{}\n--- provisioner.log:\n{}\n--- fleet.log:\n{}",
            tail_of(&shell.out(), 40),
            tail_of(&lab.join("provisioner.log"), 30),
            tail_of(&lab.join("fleet.log"), 10)
        );
    }
    then_the_key_lived_only_in_the_token(&lab);
    let out = std::fs::read_to_string(shell.out()).unwrap();
    for said in [
        "node.pem: OK",
        "the node trusts the CA",
        &format!("choria_provisioner_ca_signatures{{outcome=\"issued\",site=\"guide\"}} {NODES}"),
    ] {
        assert!(
            out.lines().any(|l| l.trim() == said),
            "{said:?} not said:\n{out}"
        );
    }
}

/// The page removed the key file and signed through the token: no key
/// file is left, the configuration names the token, and the PIN is in no
/// log.
fn then_the_key_lived_only_in_the_token(lab: &Path) {
    assert!(!lab.join("ca.key").exists(), "the key file is still there");
    let yaml = std::fs::read_to_string(lab.join("provisioner.yaml")).unwrap();
    assert!(
        yaml.contains("key: \"pkcs11:token=fleet;object=fleet-ca?"),
        "{yaml}"
    );
    let log = std::fs::read_to_string(lab.join("provisioner.log")).unwrap();
    assert!(!log.contains("hsm-user-pin"), "the PIN reached the log");
}
