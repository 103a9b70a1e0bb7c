//! Running the user's helper for one node, with the same contract as the Go
//! provisioner: the node's details as JSON on stdin, a JSON response on
//! stdout, exit status 0, at most 10 seconds.
//!
//! The input is byte-compatible with Go's `json.Marshal` of its `Host`, and
//! the response is decoded as leniently as Go's `json.Unmarshal` decodes its
//! `ConfigResponse` (unknown keys ignored, keys matched case-insensitively,
//! `null` leaves the default), so existing helpers keep working unchanged.
//!
//! A helper is someone else's program run once per node, so it is fenced in:
//! it runs in a process group of its own, and that whole group is killed when
//! it runs over its time, when the node's work is abandoned, and after it
//! exits (anything it left running in the background goes too); its output
//! is capped at [`MAX_OUTPUT`]; what it wrote to stderr reaches our logs and
//! errors cut short and without control characters. Grandchildren that
//! escape the group (a helper that calls `setsid`) are reparented to PID 1:
//! the image runs an init (tini) that reaps them.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tracing::debug;

mod contract;
pub use contract::{CsrReply, Ed25519Reply, HelperInput, HelperResponse};

/// How long a helper may run, as in Go.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of the helper's stderr is kept for error messages and logs.
const STDERR_TAIL: usize = 2048;
/// The most a helper may print on stdout; a response is a few KiB.
pub const MAX_OUTPUT: usize = 1024 * 1024;
/// The longest stderr line quoted in an error.
const MAX_QUOTED_LINE: usize = 300;

/// Why running the helper failed. Every message names the helper command.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The command could not be started (missing, not executable...).
    #[error("could not start helper {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    /// The helper ran too long and was killed.
    #[error("helper {command} did not finish within {timeout:?} and was killed")]
    Timeout { command: String, timeout: Duration },
    /// The helper exited unsuccessfully; `stderr_tail` is the end of what
    /// it wrote to stderr, the message shows its last line.
    #[error("helper {command} {}{}", describe_status(.status), last_line_suffix(.stderr_tail))]
    Exit {
        command: String,
        status: ExitStatus,
        stderr_tail: String,
    },
    /// The helper exited 0 without printing anything.
    #[error("helper {command} exited successfully but printed nothing{}", last_line_suffix(.stderr_tail))]
    EmptyOutput {
        command: String,
        stderr_tail: String,
    },
    /// The helper printed more than [`MAX_OUTPUT`] bytes; it was killed.
    #[error("helper {command} printed more than {} bytes and was killed (a response is a JSON object of a few KiB)", MAX_OUTPUT)]
    OutputTooLarge { command: String },
    /// The output is not a valid response.
    #[error("helper {command} printed an invalid response: {source}")]
    Decode {
        command: String,
        #[source]
        source: serde_json::Error,
    },
    /// Talking to the helper over its pipes failed.
    #[error("helper {command}: could not {action}: {source}")]
    Io {
        command: String,
        action: &'static str,
        #[source]
        source: io::Error,
    },
}

fn describe_status(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("failed: {status}")
}

fn last_line_suffix(stderr: &str) -> String {
    match stderr.lines().rev().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => format!(": {}", sanitize_line(line)),
        None => String::new(),
    }
}

/// A line from the helper made safe to quote: control characters (escape
/// sequences, carriage returns that would forge log lines) dropped, cut to
/// [`MAX_QUOTED_LINE`] characters.
fn sanitize_line(line: &str) -> String {
    let mut out: String = line
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_QUOTED_LINE)
        .collect();
    if line.chars().filter(|c| !c.is_control()).count() > MAX_QUOTED_LINE {
        out.push('…');
    }
    out
}

/// Kills the helper's whole process group when dropped: whatever it left
/// running, on every way out of [`Helper::run`] (done, timed out, abandoned).
struct GroupKiller(Option<u32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pgid) = self
            .0
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 1)
        {
            // SAFETY: kill(2) with a negative pid signals that process group;
            // it touches no memory. The group is the helper's own (made by
            // `process_group(0)`), never ours.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// A helper command and how long it may run.
#[derive(Clone, Debug)]
pub struct Helper {
    argv: Vec<String>,
    timeout: Duration,
}

impl Helper {
    /// `argv` is the already split command line (see
    /// `choria_config::split_command_line`); the timeout is 10 seconds.
    pub fn new(argv: Vec<String>) -> Self {
        Helper {
            argv,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Overrides the time limit (tests, simulations).
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Helper { timeout, ..self }
    }

    /// The command line, shell-quoted, for messages.
    pub fn command_line(&self) -> String {
        shell_words::join(&self.argv)
    }

    /// Runs the helper once for `input`.
    ///
    /// Dropping the returned future (e.g. on shutdown) kills the helper;
    /// tokio reaps it in the background.
    pub async fn run(&self, input: &HelperInput<'_>) -> Result<HelperResponse, HelperError> {
        let command = self.command_line();
        let mut child = self.spawn(&command)?;
        let _group = GroupKiller(child.id());

        let io_err = |action: &'static str| {
            let command = command.clone();
            move |source| HelperError::Io {
                command,
                action,
                source,
            }
        };

        let input = input.to_json();
        // All three pipes are serviced at once: a helper that writes while
        // we are still feeding it a large input must not deadlock.
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let exchange = async {
            let write = async {
                if let Some(mut stdin) = stdin {
                    match stdin.write_all(&input).await {
                        // A helper may stop reading early; only its output
                        // and exit status matter.
                        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                        other => other?,
                    }
                    // Dropping stdin here closes it so the helper sees EOF.
                }
                Ok::<(), io::Error>(())
            };
            let read = async {
                let mut out: Vec<u8> = Vec::new();
                if let Some(stdout) = stdout {
                    // One byte more than allowed tells "too much" from "just enough".
                    stdout
                        .take(MAX_OUTPUT as u64 + 1)
                        .read_to_end(&mut out)
                        .await?;
                }
                Ok::<_, io::Error>(out)
            };
            let (written, out, err) = tokio::join!(write, read, read_tail(stderr));
            written.map_err(io_err("write its input"))?;
            let out = out.map_err(io_err("read its output"))?;
            if out.len() > MAX_OUTPUT {
                return Err(HelperError::OutputTooLarge {
                    command: command.clone(),
                });
            }
            let status = child.wait().await.map_err(io_err("wait for it"))?;
            Ok::<_, HelperError>((status, out, err))
        };

        // Bound first so the exchange, which borrows the child, is dropped
        // before the child is killed.
        let finished = tokio::time::timeout(self.timeout, exchange).await;
        let (status, out, stderr_tail) = match finished {
            Ok(done) => done?,
            Err(_) => {
                // kill() also waits, so no zombie is left behind; it can only
                // fail if the child is already gone.
                if let Err(e) = child.kill().await {
                    debug!(helper = %command, error = %e, "could not kill the timed out helper");
                }
                return Err(HelperError::Timeout {
                    command,
                    timeout: self.timeout,
                });
            }
        };

        verdict(command, status, &out, stderr_tail)
    }

    /// The helper started in a process group of its own, its three pipes
    /// ours, killed if its handle is dropped.
    fn spawn(&self, command: &str) -> Result<Child, HelperError> {
        let Some((program, args)) = self.argv.split_first() else {
            return Err(HelperError::Spawn {
                command: command.to_string(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "empty command line"),
            });
        };
        Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .map_err(|source| HelperError::Spawn {
                command: command.to_string(),
                source,
            })
    }
}

/// What a finished helper's exit status and output amount to.
fn verdict(
    command: String,
    status: std::process::ExitStatus,
    out: &[u8],
    stderr_tail: String,
) -> Result<HelperResponse, HelperError> {
    if !stderr_tail.is_empty() {
        let last = stderr_tail
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty());
        debug!(helper = %command, stderr_last_line = %sanitize_line(last.unwrap_or_default()), "helper wrote to stderr");
    }
    if !status.success() {
        return Err(HelperError::Exit {
            command,
            status,
            stderr_tail,
        });
    }
    if out.iter().all(u8::is_ascii_whitespace) {
        return Err(HelperError::EmptyOutput {
            command,
            stderr_tail,
        });
    }
    HelperResponse::from_json(out).map_err(|source| HelperError::Decode { command, source })
}

/// Reads a pipe to its end keeping only the last [`STDERR_TAIL`] bytes.
/// Read errors just end the capture: stderr is only diagnostics.
async fn read_tail(pipe: Option<impl AsyncRead + Unpin>) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut tail = Vec::with_capacity(STDERR_TAIL);
    let mut buf = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.extend_from_slice(&buf[..n]);
        // Trim in batches rather than on every read.
        if tail.len() > 2 * STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
    if tail.len() > STDERR_TAIL {
        tail.drain(..tail.len() - STDERR_TAIL);
    }
    String::from_utf8_lossy(&tail).into_owned()
}

#[cfg(test)]
mod tests;
