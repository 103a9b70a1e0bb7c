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
use crate::support::provisioner::binary;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// A code block of the page: the heading it is under, its info string's
/// words and its text.
#[derive(Debug, PartialEq)]
struct Block {
    section: String,
    info: Vec<String>,
    text: String,
}

impl Block {
    fn is(&self, words: &[&str]) -> bool {
        self.info.first().map(String::as_str) == Some("sh")
            && words.iter().all(|w| self.info.iter().any(|i| i == w))
    }
}

/// The fenced code blocks of `page`, in order.
fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    let mut section = String::new();
    for line in page.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    section: section.clone(),
                    info: info.split(',').map(|w| w.trim().to_string()).collect(),
                    text: String::new(),
                })
            }
            (Some(_), Some("")) => out.extend(open.take()),
            (Some(b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, None) if line.starts_with('#') => section = line.to_string(),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{PAGE}: a code block is never closed");
    out
}

/// One bash script of `blocks`: commands as they are, checks (`wait`)
/// retried every 2 s until they pass or [`CHECK_LIMIT_SECS`] ran out.
fn script<'a>(blocks: impl IntoIterator<Item = &'a Block>, ports: &[(&str, String)]) -> String {
    let mut s = String::from("set -euo pipefail\n");
    for b in blocks {
        let mut text = b.text.clone();
        for (from, to) in ports {
            text = text.replace(from, to);
        }
        if b.info.iter().any(|w| w == "wait") {
            // A bash of its own: `set -e` holds for every line of the
            // check (in an `until` condition it would not).
            s.push_str(&format!(
                "start=$SECONDS\nuntil bash -euo pipefail -s <<'CHECK_EOF'\n{text}CHECK_EOF\ndo\n  \
                 if [ $((SECONDS - start)) -ge {CHECK_LIMIT_SECS} ]; then\n    \
                 echo 'CHECK NEVER PASSED:' >&2; cat >&2 <<'CHECK_EOF'\n{text}CHECK_EOF\n    exit 1\n  fi\n  sleep 2\ndone\n"
            ));
        } else {
            s.push_str(&text);
        }
    }
    s
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn page() -> String {
    std::fs::read_to_string(repo().join(PAGE)).unwrap()
}

/// The last `n` lines of a file, or why there are none.
fn tail_of(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({}: {e})", path.display()),
    }
}

/// A shell as the page's reader has: a fresh `HOME`, `tools` first on
/// `PATH` (each linked under its own name), and `env` besides.
struct Shell {
    work: tempfile::TempDir,
}

impl Shell {
    fn new(tools: &[(&str, &Path)]) -> Shell {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(work.path().join("home")).unwrap();
        let bin = work.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, path) in tools {
            std::os::unix::fs::symlink(path, bin.join(name)).unwrap();
        }
        Shell { work }
    }

    fn home(&self) -> PathBuf {
        self.work.path().join("home")
    }

    /// Where the page works: `~/choria-lab`.
    fn lab(&self) -> PathBuf {
        self.home().join("choria-lab")
    }

    fn out(&self) -> PathBuf {
        self.work.path().join("page.out")
    }

    /// Runs `script` in `~` (its first block makes and enters the lab);
    /// `Ok` when it exits 0 within `limit`, else what it said. Whatever it
    /// left running in the background is killed on return.
    fn run(&self, script: &str, env: &[(&str, &Path)], limit: Duration) -> Result<(), String> {
        let path = format!(
            "{}:{}",
            self.work.path().join("bin").display(),
            std::env::var("PATH").unwrap()
        );
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.out())
            .unwrap();
        let started = Instant::now();
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(script)
            .current_dir(self.home())
            .env_clear()
            .env("HOME", self.home())
            .env("USER", "lab")
            .env("PATH", path)
            .env("LANG", "C.UTF-8")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap();
        // The page leaves the broker, the server and the provisioner running
        // in the background of its shell: they are in its process group.
        let _group = Group(child.id());
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                println!("{PAGE}: ran for {:.1?}: {status}", started.elapsed());
                return match status.success() {
                    true => Ok(()),
                    false => Err(format!("exited {status}")),
                };
            }
            if started.elapsed() > limit {
                return Err(format!("still running after {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The ends of the page's output and of what it started, for a
    /// failure's message.
    fn tails(&self) -> String {
        let lab = self.lab();
        format!(
            "the page's shell:\n{}\n--- provisioner.log (part one):\n{}\n\
             --- node/server.out:\n{}\n--- broker.log:\n{}",
            tail_of(&self.out(), 60),
            tail_of(&lab.join("provisioner.log"), 30),
            tail_of(&lab.join("node/server.out"), 20),
            tail_of(&lab.join("broker.log"), 20),
        )
    }

    /// The secrets part one made, as their files hold them.
    fn secrets(&self) -> Vec<(&'static str, String)> {
        SECRETS
            .iter()
            .map(|name| {
                let value = std::fs::read_to_string(self.lab().join(name)).unwrap();
                let value = value.trim().to_string();
                assert!(value.len() >= 32, "{name}: {value:?}");
                (*name, value)
            })
            .collect()
    }
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
    let lab = shell.lab();
    let ran = shell.run(&script(&steps, &ports), &[], PAGE_LIMIT);
    if let Err(e) = ran {
        panic!("{PAGE} part one: {e}\n{}", shell.tails());
    }

    // Nothing the page made secret reached the provisioner's log.
    let log = std::fs::read_to_string(lab.join("provisioner.log")).unwrap();
    assert!(log.contains("provisioned"), "{log}");
    for (name, value) in shell.secrets() {
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
    for (name, value) in shell.secrets() {
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
/// differs from the text: the ports (as in part one), the broker listening
/// on every address with a certificate for the bridge's address too (the
/// pods reach the host there), and the Provisioner's broker name and CA path
/// made this machine's (`REPO` holds the example with them, as the page
/// tells a reader on one machine to do).
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
    let lab = shell.lab();
    let port = free_port().to_string();
    let example = "docs/src/examples/kubernetes/provisioner-production.yaml";
    let copy = shell.work.path().join("repo");
    let yaml = std::fs::read_to_string(repo().join(example))
        .unwrap()
        .replace(
            "choria-broker.example.net:4222",
            &format!("{address}:{port}"),
        )
        .replace(
            "/etc/choria/ca.pem",
            &lab.join("ca.pem").display().to_string(),
        );
    let target = copy.join(example);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, yaml).unwrap();
    let edits = [
        ("4222", port),
        ("9090", free_port().to_string()),
        ("IP:127.0.0.1", format!("IP:127.0.0.1,IP:{address}")),
        (
            "listen_address = 127.0.0.1",
            "listen_address = 0.0.0.0".into(),
        ),
    ];
    let ran = shell.run(
        &script(all, &edits),
        &[("REPO", &copy), ("KUBECONFIG", &kubeconfig)],
        Duration::from_secs(1200),
    );
    if let Err(e) = ran {
        panic!("{PAGE} on a kubelet: {e}\n{}", shell.tails());
    }
    // What the reader saw last: `kubectl get prov` and the node's answer.
    println!("{}", tail_of(&shell.out(), 12));
}

/// Kills a process group when dropped (the test failing included).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        for signal in ["TERM", "KILL"] {
            let _ = Command::new("kill")
                .args(["-s", signal, "--", &format!("-{}", self.0)])
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_millis(300));
        }
    }
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
