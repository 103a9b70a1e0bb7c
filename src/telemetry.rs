//! Tracing set-up: where log lines go and in which format.

use crate::config::LogTarget;
use anyhow::{Context, Result};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

/// Installs the global subscriber: `filter` (EnvFilter syntax) to `target`.
pub fn init(format: LogFormat, filter: &str, target: &LogTarget) -> Result<()> {
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
    let writer = match target {
        LogTarget::Stdout => BoxMakeWriter::new(std::io::stdout),
        LogTarget::Stderr => BoxMakeWriter::new(std::io::stderr),
        LogTarget::Discard => BoxMakeWriter::new(std::io::sink),
        LogTarget::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file {}", path.display()))?;
            BoxMakeWriter::new(std::sync::Mutex::new(file))
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}
