//! The Attested provisioning guide's "Try it on one machine" run from the
//! page's own text (`docs/src/guides/attested-provisioning.md`), as its
//! reader pastes it into one shell: our binary and `nats-server` on `PATH`,
//! a fresh `HOME`, and the page's fixed ports (4222 the broker, 9090 the
//! provisioner's metrics) free ones; nothing else of the text changes.
//! Simulated nodes present instance evidence of instances of their own
//! (`fleet --evidence-key`): the policy denies one, a revocation holds
//! across the fleet's restart, and nodes of another account under the same
//! names are refused as bound elsewhere, none configured.

use crate::support::free_port;
use crate::support::page::{blocks, script, tail_of, Block, Shell};
use crate::support::provisioner::binary;
use std::path::Path;
use std::time::Duration;

const PAGE: &str = "docs/src/guides/attested-provisioning.md";
const SECTION: &str = "## Try it on one machine";

/// The section's blocks: from its heading to the next `##` heading.
fn section(page: &str) -> Vec<Block> {
    let mut inside = false;
    blocks(page)
        .into_iter()
        .filter(|b| {
            if b.section.starts_with("## ") {
                inside = b.section == SECTION;
            }
            inside && b.is(&["step"])
        })
        .collect()
}

#[test]
fn the_try_it_section_runs_as_written() {
    let page = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE)).unwrap();
    let steps = section(&page);
    assert!(
        steps.len() >= 10,
        "{PAGE}: only {} step blocks in {SECTION}",
        steps.len()
    );
    let nats = crate::support::nats_server_bin();
    let shell = Shell::new(&[
        ("choria-provisioner", Path::new(binary())),
        ("nats-server", &nats),
    ]);
    let ports = [
        ("4222", free_port().to_string()),
        ("9090", free_port().to_string()),
    ];
    // The slowest check waits out the minute a provisioned node is
    // remembered before it is taken again.
    let ran = shell.run(&script(&steps, &ports, 180), &[], Duration::from_secs(420));
    let lab = shell.home().join("attested-lab");
    if let Err(e) = ran {
        panic!(
            "{PAGE}, {SECTION}: {e}\nthe page's shell:\n{}\n--- provisioner.log:\n{}",
            tail_of(&shell.out(), 60),
            tail_of(&lab.join("provisioner.log"), 40)
        );
    }
    // What the reader was told to expect: `nodes` shows the revocation,
    // and the journal of the impostors no configure.
    let out = std::fs::read_to_string(shell.out()).unwrap();
    assert!(
        out.contains("REVOKED: lab: reported stolen"),
        "{}",
        tail_of(&shell.out(), 20)
    );
    assert!(
        out.lines().any(|l| l == "4 nodes: 1 revoked"),
        "{}",
        tail_of(&shell.out(), 20)
    );
    let impostors = crate::support::read_journal_so_far(&lab.join("impostors.jsonl"));
    assert!(!impostors.is_empty(), "the impostors' journal is empty");
    let configured = impostors
        .iter()
        .filter(|e| e["kind"] == "action" && e["action"] == "configure")
        .count();
    assert_eq!(configured, 0, "an impostor was configured");
}
