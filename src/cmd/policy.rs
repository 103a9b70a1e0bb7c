//! `choria-provisioner policy eval`: the admission policy's decision for one
//! node's input document, so a fleet can test its policy in its own CI
//! with the documents it expects (`--input` is what the policy reads as
//! `input`; see the book's "Attested provisioning" guide for its fields).
//!
//! Prints the decision as JSON and exits 0 when allowed, 1 when denied or
//! deferred, 2 when the policy cannot be compiled or evaluated — the same
//! refusal the provisioner makes, so a test can assert on the exit status.

use anyhow::{Context, Result};
use choria_config::admission::AdmissionConfig;
use choria_core::admission::{Decision, Policy};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub command: PolicyCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum PolicyCommand {
    /// Evaluate the policy for one node's input document.
    Eval(EvalArgs),
}

#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// The Rego file (`admission.policy` or `rego_policy`).
    #[arg(long)]
    pub policy: PathBuf,
    /// A JSON file holding the node's input document.
    #[arg(long)]
    pub input: PathBuf,
    /// The file is Rego v0 (`admission.rego_v0`).
    #[arg(long)]
    pub rego_v0: bool,
}

pub fn run(args: PolicyArgs) -> ExitCode {
    let PolicyCommand::Eval(eval) = args.command;
    match decide(&eval) {
        Ok(decision) => {
            let out = serde_json::json!({
                "decision": decision.label(),
                "allow": decision == Decision::Allowed,
                "reason": decision.reason(),
            });
            println!("{out}");
            if decision == Decision::Allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("Error: {}", super::error_text(&e));
            ExitCode::from(2)
        }
    }
}

fn decide(args: &EvalArgs) -> Result<Decision> {
    let policy = Policy::load(&AdmissionConfig {
        policy: args.policy.clone(),
        rego_v0: args.rego_v0,
    })?;
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let input: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", args.input.display()))?;
    Ok(policy.evaluate(&input)?)
}
