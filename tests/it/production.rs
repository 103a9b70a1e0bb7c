//! The production guide (`docs/src/guides/production.md`) run from the
//! page's own text, as a user pastes it into one shell: its code blocks in
//! order, in one bash. A ```` ```sh,step ```` block is part one (one
//! machine), ```` ```sh,step,wait ```` a check the user repeats until it
//! passes, ```` ```sh,k8s ```` part two (Kubernetes) and
//! ```` ```sh,k8s,pods ```` what needs the pods running (a kubelet) or part
//! one's processes: the node tier runs the whole page
//! ([`the_whole_page_on_a_real_kubelet`]). The real `choria` (broker, server, `jwt`, `req`,
//! `ping`), our binary and `kubectl` are on `PATH`, `HOME` is a fresh
//! directory (the page works in `~/choria-lab`), and the page's fixed ports
//! (4222 the broker, 9090 the provisioner's metrics) become free ones;
//! nothing else of the text changes.
//!
//! * Part one takes a real go-choria server from nothing to provisioned and
//!   renewed behind the real Choria broker, and none of the secrets the page
//!   makes reaches the provisioner's log.
//! * Part two's Secrets and Provisioner, made from part one's files, are
//!   accepted by the operator on a real API server, and the configuration it
//!   writes for the pods is part one's, with no secret in it.
//!
//! Needs `$CHORIA_BIN` (and the control plane for part two); under CI a
//! missing peer fails the test.

use crate::operator_e2e::SERIAL;
use crate::support::free_port;
use crate::support::gopeers::choria_bin;
use crate::support::kube::ControlPlane;
use crate::support::operator::{cond, pair, Cluster};
use crate::support::page::{blocks, tail_of, Block, Shell};
use crate::support::provisioner::binary;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PAGE: &str = "docs/src/guides/production.md";

/// How long a check block may take to pass. The slowest is the renewal:
/// half of a three-minute server JWT, plus the node's restart.
const CHECK_LIMIT_SECS: u32 = 240;

/// The whole of part one, generously (provisioning and one renewal take
/// about 2.5 minutes on a quiet machine).
const PAGE_LIMIT: Duration = Duration::from_secs(600);

/// The files part one makes that are secret.
const SECRETS: [&str; 6] = [
    "broker.password",
    "token",
    "records.seed",
    "signer.seed",
    "provisioner.seed",
    "issuer.seed",
];

/// [`crate::support::page::script`] with this page's check limit.
fn script<'a>(blocks: impl IntoIterator<Item = &'a Block>, ports: &[(&str, String)]) -> String {
    crate::support::page::script(blocks, ports, CHECK_LIMIT_SECS)
}

/// Where the page works: `~/choria-lab`.
fn lab(shell: &Shell) -> PathBuf {
    shell.home().join("choria-lab")
}

/// The ends of the page's output and of what it started, for a failure's
/// message.
fn tails(shell: &Shell) -> String {
    let lab = lab(shell);
    format!(
        "the page's shell:\n{}\n--- provisioner.log (part one):\n{}\n\
         --- node/server.out:\n{}\n--- broker.log:\n{}",
        tail_of(&shell.out(), 60),
        tail_of(&lab.join("provisioner.log"), 30),
        tail_of(&lab.join("node/server.out"), 20),
        tail_of(&lab.join("broker.log"), 20),
    )
}

/// The secrets part one made, as their files hold them.
fn secrets(shell: &Shell) -> Vec<(&'static str, String)> {
    SECRETS
        .iter()
        .map(|name| {
            let value = std::fs::read_to_string(lab(shell).join(name)).unwrap();
            let value = value.trim().to_string();
            assert!(value.len() >= 32, "{name}: {value:?}");
            (*name, value)
        })
        .collect()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What part two reads through `$REPO` (the Provisioner example), in a
/// directory of `shell`'s with the page's ports changed as in its text: the
/// pods must reach the broker where part one's blocks started it.
fn repo_with_ports(shell: &Shell, ports: &[(&str, String)]) -> PathBuf {
    const READ: &str = "docs/src/examples/kubernetes/provisioner-production.yaml";
    let copy = shell.work.path().join("repo");
    let mut text = std::fs::read_to_string(repo().join(READ)).unwrap();
    for (from, to) in ports {
        text = text.replace(from, to);
    }
    std::fs::create_dir_all(copy.join(READ).parent().unwrap()).unwrap();
    std::fs::write(copy.join(READ), text).unwrap();
    copy
}

fn page() -> String {
    std::fs::read_to_string(repo().join(PAGE)).unwrap()
}

#[test]
fn part_one_provisions_and_renews_a_real_server_behind_the_choria_broker() {
    let Some(choria) =
        choria_bin("part_one_provisions_and_renews_a_real_server_behind_the_choria_broker")
    else {
        return;
    };
    let page = page();
    let steps: Vec<Block> = blocks(&page)
        .into_iter()
        .filter(|b| b.is(&["step"]))
        .collect();
    assert!(
        steps.len() >= 15,
        "{PAGE}: only {} step blocks",
        steps.len()
    );
    let ports = [
        ("4222", free_port().to_string()),
        ("9090", free_port().to_string()),
    ];
    let shell = Shell::new(&[
        ("choria", &choria),
        ("choria-provisioner", Path::new(binary())),
    ]);
    let lab = lab(&shell);
    let ran = shell.run(&script(&steps, &ports), &[], PAGE_LIMIT);
    if let Err(e) = ran {
        panic!("{PAGE} part one: {e}\n{}", tails(&shell));
    }

    // Nothing the page made secret reached the provisioner's log.
    let log = std::fs::read_to_string(lab.join("provisioner.log")).unwrap();
    assert!(log.contains("provisioned"), "{log}");
    for (name, value) in secrets(&shell) {
        assert!(!log.contains(&value), "{name} is in provisioner.log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn part_two_secrets_and_provisioner_are_what_the_operator_runs() {
    let test = "part_two_secrets_and_provisioner_are_what_the_operator_runs";
    let Some(choria) = choria_bin(test) else {
        return;
    };
    let Some(bins) = ControlPlane::available() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(&bins);
    let page = page();
    let blocks = blocks(&page);
    // Part one's keys, then part two's commands short of the pods.
    let keys = blocks
        .iter()
        .filter(|b| b.is(&["step"]))
        .take_while(|b| !b.section.starts_with("## 2."));
    let k8s: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.is(&["k8s"]) && !b.is(&["pods"]))
        .collect();
    assert!(k8s.len() >= 3, "{PAGE}: only {} k8s blocks", k8s.len());
    let shell = Shell::new(&[
        ("choria", &choria),
        ("choria-provisioner", Path::new(binary())),
        ("kubectl", &bins.kubectl),
    ]);
    let ran = shell.run(
        &script(keys.chain(k8s), &[]),
        &[("REPO", repo()), ("KUBECONFIG", c.cp.admin_kubeconfig())],
        Duration::from_secs(180),
    );
    assert!(
        ran.is_ok(),
        "{PAGE} part two: {}\n{}",
        ran.unwrap_err(),
        tail_of(&shell.out(), 40)
    );

    let p = c.observed("lab");
    assert_eq!(cond(&p, "Degraded"), pair("False", "AsExpected"), "{p}");
    let config = crate::support::operator::get(&c.cp, "configmap", "choria", "lab-config");
    let file = |name: &str| {
        config["data"][name]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let yaml = file("provisioner.yaml");
    for line in [
        "ed25519: true",
        "jwt_signing_token: /etc/choria-provisioner/secrets/lab-signer/jwt",
        "server_jwt_validity: 30d",
        "tls_cert: /etc/choria-provisioner/secrets/lab-tls/tls.crt",
        "choria_config: /etc/choria-provisioner/config/renewal.cfg",
    ] {
        assert!(
            yaml.contains(line),
            "{line:?} not in provisioner.yaml:\n{yaml}"
        );
    }
    let renewal = file("renewal.cfg");
    assert!(
        renewal.contains("plugin.security.provider = choria"),
        "{renewal}"
    );
    // The pods' own login carries the password; renewal's must not.
    assert!(yaml.contains("broker_provisioning_password_file"), "{yaml}");
    let text = format!("{config}{p}");
    for (name, value) in secrets(&shell) {
        assert!(
            !text.contains(&value),
            "{name} is in the ConfigMap or status"
        );
    }
}

/// The whole page on the node tier's cluster (`scripts/node-tier.sh` runs
/// it, with `NODE_TIER_ADDRESS`, `NODE_TIER_KUBECONFIG`, `NODE_TIER_KUBECTL`
/// and `CHORIA_BIN`): part one on the host, then part two to the end, its
/// pods on a real kubelet taking over part one's node and renewing it. What
/// differs from the text: the ports (as in part one, and in the Provisioner
/// example part two applies, which `REPO` holds a copy of); `BROKER_ADDRESS` is
/// set to the bridge's address (the pods reach the host there), as the page
/// tells a reader whose first `hostname -I` address is not the one.
#[test]
#[ignore = "run by scripts/node-tier.sh on its cluster"]
fn the_whole_page_on_a_real_kubelet() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let address = var("NODE_TIER_ADDRESS");
    let kubeconfig = PathBuf::from(var("NODE_TIER_KUBECONFIG"));
    let kubectl = PathBuf::from(var("NODE_TIER_KUBECTL"));
    let choria = choria_bin("the_whole_page_on_a_real_kubelet")
        .expect("scripts/node-tier.sh sets CHORIA_BIN to the choria it built");
    let page = page();
    let blocks = blocks(&page);
    let all: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.is(&["step"]) || b.is(&["k8s"]))
        .collect();
    assert!(
        all.iter().any(|b| b.is(&["pods", "wait"])),
        "{PAGE}: no check after the pods start"
    );
    let shell = Shell::new(&[
        ("choria", &choria),
        ("choria-provisioner", Path::new(binary())),
        ("kubectl", &kubectl),
    ]);
    // The page's own commands give the broker a certificate for, and a
    // listener on, the address the pods reach (`BROKER_ADDRESS`, which
    // the page asks the reader to set when `hostname -I` does not give
    // it): here the bridge's. Nothing else of the text changes but ports.
    let edits = [
        ("4222", free_port().to_string()),
        ("9090", free_port().to_string()),
    ];
    let copy = repo_with_ports(&shell, &edits);
    let ran = shell.run(
        &script(all, &edits),
        &[
            ("REPO", &copy),
            ("KUBECONFIG", &kubeconfig),
            ("BROKER_ADDRESS", Path::new(&address)),
        ],
        Duration::from_secs(1200),
    );
    if let Err(e) = ran {
        panic!("{PAGE} on a kubelet: {e}\n{}", tails(&shell));
    }
    // What the reader saw last: `kubectl get prov` and the node's answer.
    println!("{}", tail_of(&shell.out(), 12));
}

#[test]
fn blocks_keep_their_order_section_and_words() {
    let page = "# P\n```sh,step\necho one 4222\n```\n## 2. B\n```yaml\nnot: run\n```\n\
                ```sh\nnot run either\n```\n```sh,k8s,pods\ntrue\n```\n";
    let b = blocks(page);
    assert_eq!(b.len(), 4);
    assert_eq!(
        (b[0].section.as_str(), b[0].text.as_str()),
        ("# P", "echo one 4222\n")
    );
    assert!(b[0].is(&["step"]) && !b[1].is(&["step"]) && !b[2].is(&["step"]));
    assert!(b[3].is(&["k8s"]) && b[3].is(&["pods"]) && b[3].section == "## 2. B");
    let s = script(&b[..1], &[("4222", "5000".into())]);
    assert!(s.ends_with("echo one 5000\n"), "{s}");
}
