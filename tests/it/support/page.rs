//! A page of the book run from its own text, as its reader pastes it into
//! one shell: its code blocks in order, in one bash. A ```` ```sh,step ````
//! block is a command, ```` ```sh,step,wait ```` a check the reader
//! repeats until it passes; a test picks the blocks it runs by their
//! words. The shell has a fresh `HOME` and the tools the test links onto
//! `PATH`; what the test substitutes in the text (free ports for fixed
//! ones) it says.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A code block of the page: the heading it is under, its info string's
/// words and its text.
#[derive(Debug, PartialEq)]
pub struct Block {
    pub section: String,
    pub info: Vec<String>,
    pub text: String,
}

impl Block {
    pub fn is(&self, words: &[&str]) -> bool {
        self.info.first().map(String::as_str) == Some("sh")
            && words.iter().all(|w| self.info.iter().any(|i| i == w))
    }
}

/// The fenced code blocks of `page`, in order.
pub fn blocks(page: &str) -> Vec<Block> {
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
    assert!(open.is_none(), "a code block is never closed");
    out
}

/// One bash script of `blocks`: commands as they are, checks (`wait`)
/// retried every 2 s until they pass or `check_limit_secs` ran out.
pub fn script<'a>(
    blocks: impl IntoIterator<Item = &'a Block>,
    ports: &[(&str, String)],
    check_limit_secs: u32,
) -> String {
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
                 if [ $((SECONDS - start)) -ge {check_limit_secs} ]; then\n    \
                 echo 'CHECK NEVER PASSED:' >&2; cat >&2 <<'CHECK_EOF'\n{text}CHECK_EOF\n    exit 1\n  fi\n  sleep 2\ndone\n"
            ));
        } else {
            s.push_str(&text);
        }
    }
    s
}

/// The last `n` lines of a file, or why there are none.
pub fn tail_of(path: &Path, n: usize) -> String {
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
pub struct Shell {
    pub work: tempfile::TempDir,
}

impl Shell {
    pub fn new(tools: &[(&str, &Path)]) -> Shell {
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(work.path().join("home")).unwrap();
        let bin = work.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, path) in tools {
            std::os::unix::fs::symlink(path, bin.join(name)).unwrap();
        }
        Shell { work }
    }

    pub fn home(&self) -> PathBuf {
        self.work.path().join("home")
    }

    pub fn out(&self) -> PathBuf {
        self.work.path().join("page.out")
    }

    /// Runs `script` in `~` (its first block makes and enters the lab);
    /// `Ok` when it exits 0 within `limit`, else what it said. Whatever it
    /// left running in the background is killed on return.
    pub fn run(&self, script: &str, env: &[(&str, &Path)], limit: Duration) -> Result<(), String> {
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
                println!("the page ran for {:.1?}: {status}", started.elapsed());
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
