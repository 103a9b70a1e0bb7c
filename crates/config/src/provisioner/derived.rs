//! What the code uses instead of the raw settings: the helper's words, the
//! compiled patterns, the effective log level and target, durations as
//! people write them.

use super::{LogLevel, LogTarget, ProvisionerConfig};
use crate::duration::format_duration;
use crate::ConfigError;
use choria_wire::security::csr::compile_deny_list;
use regex::Regex;
use std::path::PathBuf;

impl ProvisionerConfig {
    /// The helper command line split into program and arguments.
    pub fn helper_command(&self) -> Result<Vec<String>, ConfigError> {
        crate::split_command_line(&self.helper).map_err(|e| self.err("helper", e))
    }

    /// The compiled `csr_allowed_dns_names` (validated when parsed), each
    /// matching whole names only.
    pub fn csr_allowed_dns_regexes(&self) -> Result<Vec<Regex>, ConfigError> {
        self.csr_allowed_dns_names
            .iter()
            .map(|p| {
                choria_wire::security::csr::compile_whole_name(p)
                    .map_err(|e| self.err("csr_allowed_dns_names", format!("{p:?}: {e}")))
            })
            .collect()
    }

    /// The compiled `cert_deny_list` (validated when parsed).
    pub fn cert_deny_regexes(&self) -> Result<Vec<Regex>, ConfigError> {
        compile_deny_list(&self.cert_deny_list)
            .map_err(|e| self.err("cert_deny_list", e.to_string()))
    }

    /// The effective log level (see [`LogLevel`]).
    pub fn log_level(&self) -> LogLevel {
        self.loglevel
            .as_deref()
            .and_then(LogLevel::from_go)
            .unwrap_or(LogLevel::Warn)
    }

    /// The effective log destination; unset means stdout.
    pub fn log_target(&self) -> LogTarget {
        match self.logfile.as_deref() {
            None => LogTarget::Stdout,
            Some(f) if f.eq_ignore_ascii_case("stdout") => LogTarget::Stdout,
            Some(f) if f.eq_ignore_ascii_case("stderr") => LogTarget::Stderr,
            Some(f) if f.eq_ignore_ascii_case("discard") => LogTarget::Discard,
            Some(f) => LogTarget::File(PathBuf::from(f)),
        }
    }

    /// `server_jwt_validity` as people write it (`1y`).
    pub fn server_jwt_validity_text(&self) -> String {
        format_duration(self.server_jwt_validity)
    }
}
