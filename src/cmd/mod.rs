//! The command line: one file per subcommand, each owning its `clap` options
//! and the few lines that turn them into a call into the library.
//!
//! `run` is the default command, as in the Go provisioner (`app.Command("run",
//! …).Default()`): `choria-provisioner --config F --choria-config C` — what the
//! Choria Helm chart's Deployment passes — runs the provisioner unchanged.
//! `--debug` and the log options are accepted before or after the subcommand.

pub mod audit;
pub mod broker;
pub mod crd;
pub mod discover;
pub mod fleet;
pub mod fleet_helper;
pub mod nodes;
pub mod operator;
pub mod policy;
pub mod rebind;
pub mod revoke;
pub mod run;
pub mod table;
pub mod terminal;
pub mod token;

use crate::telemetry::{self, LogFormat};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
use std::ops::ControlFlow;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "choria-provisioner",
    version,
    about = "Provisioning service, operator and fleet simulator for Choria",
    long_about = "Provisioning service, operator and fleet simulator for Choria.\n\n\
                  Without a subcommand the options are run's: \
                  `choria-provisioner --config F` is `choria-provisioner run --config F`.",
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `run`'s options when no subcommand is given.
    #[command(flatten)]
    pub default_run: Option<run::RunArgs>,
}

/// Options every subcommand accepts, before or after its name.
#[derive(Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true, env = "CHORIA_PROVISIONER_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `choria_provisioner=debug`.
    /// Default: info; for `run`, the config's `loglevel` (Go's default: warn).
    #[arg(long, global = true, env = "CHORIA_PROVISIONER_LOG")]
    pub log: Option<String>,
    /// Log at debug level (the Go provisioner's `--debug`); `--log` wins.
    #[arg(long, global = true)]
    pub debug: bool,
}

impl GlobalArgs {
    /// What the long-running subcommands but `run` (`fleet`, `discover`,
    /// `operator`) log with: stderr, `info` unless told.
    pub fn init_stderr_logging(&self) -> anyhow::Result<telemetry::LogGuard> {
        self.init_stderr_logging_at("info")
    }

    /// What a read-only command (`nodes`) logs with: stderr, warnings only
    /// unless told, so its output is all a terminal shows.
    pub fn init_quiet_logging(&self) -> anyhow::Result<telemetry::LogGuard> {
        self.init_stderr_logging_at("warn")
    }

    fn init_stderr_logging_at(&self, default: &str) -> anyhow::Result<telemetry::LogGuard> {
        telemetry::init(
            self.log_format,
            &self.filter(default),
            &choria_config::LogTarget::Stderr,
        )
    }

    /// The log filter: `--log`, else `--debug`, else `default`.
    pub fn filter(&self, default: &str) -> String {
        match (&self.log, self.debug) {
            (Some(l), _) => l.clone(),
            (None, true) => "debug".into(),
            (None, false) => default.into(),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the provisioner (discovery, events, workers, helper). The default.
    Run(run::RunArgs),
    /// A reference helper for trying the provisioner against `fleet`: reads a
    /// node's details as JSON on stdin and prints its configuration.
    FleetHelper(fleet_helper::FleetHelperArgs),
    /// Simulate many Choria Servers in provisioning mode.
    Fleet(fleet::FleetArgs),
    /// Discover provisioning-mode servers and optionally fetch their inventory.
    Discover(discover::DiscoverArgs),
    /// Print the `Provisioner` CustomResourceDefinition as YAML.
    Crd,
    /// Run the Kubernetes operator for `Provisioner` resources.
    Operator(operator::OperatorArgs),
    /// List the records of provisioned nodes (`records:`), optionally only
    /// those whose credentials expire soon.
    Nodes(nodes::NodesArgs),
    /// Read the audit stream (`audit:`): every decision about a node,
    /// oldest first.
    Audit(audit::AuditArgs),
    /// Revoke a node's identity: never provisioned or renewed again
    /// (`records:`).
    Revoke(revoke::RevokeArgs),
    /// Lift a revocation made by mistake.
    Unrevoke(revoke::UnrevokeArgs),
    /// Move a node's name to another cloud instance, or free it for the
    /// next one (a replaced machine; `evidence:`).
    Rebind(rebind::RebindArgs),
    /// Mint provisioning JWTs: `token issue` binds one to a node's identity
    /// (a join token).
    Token(token::TokenArgs),
    /// Work with the admission policy: `policy eval` prints its decision
    /// for one node's input document.
    Policy(policy::PolicyArgs),
}

impl Cli {
    /// Parses `args` (the program name first), resolving the default command:
    /// `run`'s options without a subcommand mean `run`; together with another
    /// subcommand they are an error.
    pub fn try_parse_args<I, T>(args: I) -> Result<(GlobalArgs, Command), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut matches = match Cli::command().try_get_matches_from(args) {
            // clap's own message names the flag but not what it wants.
            Err(e)
                if e.kind() == clap::error::ErrorKind::MissingRequiredArgument
                    && e.to_string().contains("--config") =>
            {
                return Err(missing_config());
            }
            other => other?,
        };
        let cli = Cli::from_arg_matches_mut(&mut matches)?;
        match (cli.command, cli.default_run) {
            (Some(command), None) => Ok((cli.global, command)),
            (None, Some(run)) => Ok((cli.global, Command::Run(run))),
            (Some(_), Some(_)) => Err(Cli::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "run's options (--config, --choria-config, …) go after `run` or without a subcommand, not before another subcommand",
            )),
            // `subcommand_negates_reqs` lets an empty command line through.
            (None, None) => Err(missing_config()),
        }
    }
}

/// What `run` needs and how to give it, when `--config` is missing.
fn missing_config() -> clap::Error {
    Cli::command().error(
        clap::error::ErrorKind::MissingRequiredArgument,
        "--config is required: the provisioner's YAML, as the Go provisioner reads it, e.g.\n  \
         choria-provisioner run --config /etc/choria-provisioner/choria-provisioner.yaml \
         --choria-config /etc/choria-provisioner/choria.cfg\n\
         (`choria-provisioner --help` lists the other subcommands)",
    )
}

/// The binary's `main`: parse, then run the command.
pub fn main() -> ExitCode {
    let (global, command) = match Cli::try_parse_args(std::env::args_os()) {
        Ok(parsed) => parsed,
        Err(e) => e.exit(),
    };
    let command = match without_runtime(command, &global) {
        ControlFlow::Break(code) => return code,
        ControlFlow::Continue(command) => command,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(on_runtime(command, &global));
    // Whatever is still running (a reconnecting broker connection, a
    // blocking read) must not hold the process after the command returned.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    exit_code(result)
}

/// The commands that need no async runtime run here, before one is started:
/// their exit code, or the command back when it needs the runtime.
fn without_runtime(command: Command, global: &GlobalArgs) -> ControlFlow<ExitCode, Command> {
    match command {
        // The helper runs once per node: no runtime and no logging on stdout.
        Command::FleetHelper(args) => ControlFlow::Break(fleet_helper::run(args)),
        Command::Crd => ControlFlow::Break(crd::run()),
        Command::Policy(args) => ControlFlow::Break(policy::run(args)),
        Command::Token(args) => ControlFlow::Break(exit_code(token::run(args))),
        Command::Run(args) if args.check => ControlFlow::Break(run::check(&args, global)),
        command => ControlFlow::Continue(command),
    }
}

/// The commands that run on the async runtime, each with the logging it
/// wants: `run` sets up its own, the operator tools log to stderr, the
/// record tools only what goes wrong.
async fn on_runtime(command: Command, global: &GlobalArgs) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(args, global).await,
        Command::Fleet(args) => {
            let _log = global.init_stderr_logging()?;
            fleet::run(args).await
        }
        Command::Discover(args) => {
            let _log = global.init_stderr_logging()?;
            discover::run(args).await
        }
        Command::Operator(args) => {
            let _log = global.init_stderr_logging()?;
            operator::run(args).await
        }
        Command::Nodes(args) => {
            let _log = global.init_quiet_logging()?;
            nodes::run(args).await
        }
        Command::Revoke(args) => {
            let _log = global.init_quiet_logging()?;
            revoke::revoke(args).await
        }
        Command::Unrevoke(args) => {
            let _log = global.init_quiet_logging()?;
            revoke::unrevoke(args).await
        }
        Command::Rebind(args) => {
            let _log = global.init_quiet_logging()?;
            rebind::run(args).await
        }
        Command::Audit(args) => {
            let _log = global.init_quiet_logging()?;
            audit::run(args).await
        }
        Command::FleetHelper(_) | Command::Crd | Command::Policy(_) | Command::Token(_) => {
            unreachable!("run without a runtime")
        }
    }
}

/// A command's result as the process's exit code, its error on stderr.
fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, as `{e:#}` writes them, without the
/// repeats: the library's errors name their source in their own message
/// (`bad.yaml: interval: …`), which anyhow's chain would print again.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<(GlobalArgs, Command), String> {
        Cli::try_parse_args(std::iter::once("choria-provisioner").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    fn run_args(args: &[&str]) -> (GlobalArgs, run::RunArgs) {
        match parse(args) {
            Ok((g, Command::Run(r))) => (g, r),
            other => panic!("{args:?} did not parse as run: {other:?}"),
        }
    }

    #[test]
    fn a_missing_config_says_what_to_pass() {
        for args in [
            &[][..],
            &["run"][..],
            &["run", "--check"][..],
            &["--debug"][..],
        ] {
            let e = parse(args).expect_err("no --config");
            assert!(
                e.contains("--config is required: the provisioner's YAML")
                    && e.contains("run --config /etc/choria-provisioner/choria-provisioner.yaml"),
                "{args:?}: {e}"
            );
        }
    }

    #[test]
    fn the_helm_charts_command_line_runs_the_provisioner() {
        // Exactly what the Choria Helm chart's provisioner Deployment passes.
        let (g, r) = run_args(&[
            "--config",
            "/etc/choria-provisioner/choria-provisioner.yaml",
            "--choria-config",
            "/etc/choria-provisioner/choria.cfg",
        ]);
        assert_eq!(
            r.config.to_str(),
            Some("/etc/choria-provisioner/choria-provisioner.yaml")
        );
        assert_eq!(
            r.choria_config.as_deref().and_then(|p| p.to_str()),
            Some("/etc/choria-provisioner/choria.cfg")
        );
        assert!(!g.debug);
    }

    #[test]
    fn debug_is_accepted_before_and_after_the_subcommand() {
        for args in [
            &["--debug", "--config", "p.yaml"][..],
            &["--config", "p.yaml", "--debug"],
            &["--debug", "run", "--config", "p.yaml"],
            &["run", "--debug", "--config", "p.yaml"],
            &["run", "--config", "p.yaml", "--debug"],
        ] {
            let (g, r) = run_args(args);
            assert!(g.debug, "{args:?}");
            assert_eq!(r.config.to_str(), Some("p.yaml"), "{args:?}");
            assert_eq!(g.filter("warn"), "debug");
        }
        match parse(&["--debug", "fleet", "--nodes", "3"]) {
            Ok((g, Command::Fleet(f))) => {
                assert!(g.debug);
                assert_eq!(f.nodes, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn log_wins_over_debug() {
        let (g, _) = run_args(&["--debug", "--log", "info", "--config", "p.yaml"]);
        assert_eq!(g.filter("warn"), "info");
        let (g, _) = run_args(&["--config", "p.yaml"]);
        assert_eq!(g.filter("warn"), "warn");
    }

    #[test]
    fn run_and_its_default_form_take_the_same_options() {
        let (_, explicit) = run_args(&["run", "--config", "p", "--pid", "x.pid", "--check"]);
        let (_, implicit) = run_args(&["--config", "p", "--pid", "x.pid", "--check"]);
        assert_eq!(format!("{explicit:?}"), format!("{implicit:?}"));
        assert!(implicit.check);
    }

    #[test]
    fn run_options_before_another_subcommand_are_refused() {
        let e = parse(&["--config", "p.yaml", "fleet"]).unwrap_err();
        assert!(e.contains("go after `run`"), "{e}");
    }

    #[test]
    fn no_arguments_asks_for_the_config() {
        let e = parse(&[]).unwrap_err();
        assert!(e.contains("--config"), "{e}");
        let e = parse(&["run"]).unwrap_err();
        assert!(e.contains("--config"), "{e}");
    }

    #[test]
    fn the_other_subcommands_still_parse() {
        assert!(matches!(parse(&["crd"]), Ok((_, Command::Crd))));
        assert!(matches!(
            parse(&["operator", "--metrics-port", "0"]),
            Ok((_, Command::Operator(_)))
        ));
        assert!(matches!(
            parse(&["discover", "--inventory", "2"]),
            Ok((_, Command::Discover(_)))
        ));
        assert!(matches!(
            parse(&["fleet-helper", "--shutdown-match", "x"]),
            Ok((_, Command::FleetHelper(_)))
        ));
    }

    #[test]
    fn an_error_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let inner = anyhow::Error::new(io).context("p.yaml: could not read the file: gone");
        let outer = inner.context(
            "the provisioner could not be configured: p.yaml: could not read the file: gone",
        );
        assert_eq!(
            error_text(&outer),
            "the provisioner could not be configured: p.yaml: could not read the file: gone"
        );
        let plain = anyhow::anyhow!("cause").context("outer");
        assert_eq!(error_text(&plain), "outer: cause");
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
