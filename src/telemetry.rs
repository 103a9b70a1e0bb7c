//! Tracing set-up: where log lines go and in which format.
//!
//! Lines are written by a thread of their own through a bounded buffer
//! (`tracing-appender`'s non-blocking writer): a stalled stdout (a full
//! pipe, a stuck log collector) must not stall the workers that log. When
//! the buffer is full, lines are dropped rather than waited for.

use anyhow::{Context, Result};
use choria_config::LogTarget;
use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Keeps the log writer thread; dropping it flushes what is buffered.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] WorkerGuard);

/// Lines buffered for the writer thread at most.
const BUFFERED_LINES: usize = 64 * 1024;

/// Installs the global subscriber: `filter` (EnvFilter syntax) to `target`.
/// Hold the guard until the process ends.
pub fn init(format: LogFormat, filter: &str, target: &LogTarget) -> Result<LogGuard> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).with_context(|| {
        format!(
            "log filter {filter:?} is not valid; use a level such as info or debug, or e.g. choria_provisioner=debug"
        )
    })?;
    use std::io::IsTerminal;
    // Colour only on a terminal: log files and collectors get plain text.
    let ansi = match target {
        LogTarget::Stdout => std::io::stdout().is_terminal(),
        LogTarget::Stderr => std::io::stderr().is_terminal(),
        LogTarget::Discard | LogTarget::File(_) => false,
    };
    let sink: Box<dyn std::io::Write + Send> = match target {
        LogTarget::Stdout => Box::new(std::io::stdout()),
        LogTarget::Stderr => Box::new(std::io::stderr()),
        LogTarget::Discard => Box::new(std::io::sink()),
        LogTarget::File(path) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file {}", path.display()))?,
        ),
    };
    let (writer, guard) = NonBlockingBuilder::default()
        .buffered_lines_limit(BUFFERED_LINES)
        .lossy(true)
        .thread_name("log-writer")
        .finish(sink);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(LogGuard(guard))
}
