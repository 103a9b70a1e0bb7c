//! The quick start without Kubernetes (`docs/src/quick-start/local.md`)
//! run from the page's own text, as its reader pastes it: its blocks in
//! order in one bash. What differs, and why:
//! * step 1's block (`sh,step,build`, `cargo build --release`) is not run:
//!   the binary this build made is on `PATH` and `REPO` is the repository;
//! * the nats-server step 2 installs is in the fresh `HOME`'s cache already
//!   (linked, so the page's `ensure_nats_server` finds it and downloads
//!   nothing);
//! * step 5's `run` (`sh,step,running`), which the reader leaves running in
//!   its own shell, runs in the background of this one;
//! * the page's ports, 4222 and 8080, are free ones, in its text and in
//!   the example files it copies (`REPO` is a copy of the files the page
//!   reads from the repository, with those ports changed).

use crate::support::free_port;
use crate::support::page::{blocks, script, tail_of, Block, Shell};
use crate::support::provisioner::binary;
use std::path::Path;
use std::time::Duration;

const PAGE: &str = "docs/src/quick-start/local.md";

#[test]
fn the_local_quick_start_runs_as_written() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(repo.join(PAGE)).unwrap();
    let steps: Vec<Block> = blocks(&page)
        .into_iter()
        .filter(|b| b.is(&["step"]) && !b.is(&["build"]))
        .map(|mut b| {
            if b.is(&["running"]) {
                b.text = format!("{} &\n", b.text.trim_end());
            }
            b
        })
        .collect();
    assert!(steps.len() >= 7, "{PAGE}: only {} step blocks", steps.len());
    assert!(
        steps.iter().any(|b| b.is(&["running"])),
        "{PAGE}: no running block"
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
        "docs/src/examples/local/provisioner.yaml",
        "docs/src/examples/local/choria.cfg",
        "examples/helper.sh",
        "scripts/lib.sh",
    ] {
        let mut text = std::fs::read_to_string(repo.join(file)).unwrap();
        for (from, to) in &ports {
            text = text.replace(from, to);
        }
        let target = copy.join(file);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, text).unwrap();
        let mode = std::fs::metadata(repo.join(file)).unwrap().permissions();
        std::fs::set_permissions(&target, mode).unwrap();
    }
    let ran = shell.run(
        &script(&steps, &ports, 120),
        &[("REPO", &copy)],
        Duration::from_secs(300),
    );
    let lab = shell.home().join("choria-quickstart");
    if let Err(e) = ran {
        panic!(
            "{PAGE}: {e}\nthe page's shell:\n{}\n--- provisioner.log:\n{}\n--- fleet.log:\n{}",
            tail_of(&shell.out(), 40),
            tail_of(&lab.join("provisioner.log"), 30),
            tail_of(&lab.join("fleet.log"), 10)
        );
    }
    // What step 6 tells the reader to expect: each node one configure and
    // one restart, and the count `grep -c` printed.
    let journal = crate::support::read_journal_so_far(&lab.join("fleet.jsonl"));
    for action in ["configure", "restart"] {
        let n = journal
            .iter()
            .filter(|e| e["kind"] == "action" && e["action"] == action && e["outcome"] == "ok")
            .count();
        assert_eq!(n, 100, "{action}s in the fleet's journal");
    }
    let out = std::fs::read_to_string(shell.out()).unwrap();
    assert!(out.lines().any(|l| l.trim() == "100"), "{out}");
}
