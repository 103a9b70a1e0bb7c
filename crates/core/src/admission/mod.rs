//! The admission policy: a Rego file every node is evaluated against after
//! it told us about itself and before anything is signed or configured for
//! it (the helper, the template, cert-manager and the server JWT all come
//! after).
//!
//! The contract, in package `choria.provisioner`:
//!
//! * `allow` (bool): the node may be provisioned. Undefined is `false`.
//! * `deny_reason` (string, optional): why not, shown in the log, the audit
//!   stream and `policy eval`.
//! * `defer` (bool, optional): not now, try again at the next discovery
//!   (the helper's `defer`); it wins over `allow`.
//!
//! The input is [`input::NodeInput`]'s document. A policy that fails to
//! evaluate (a runtime error, a value of the wrong type, or running past
//! [`EVALUATION_LIMIT`]) refuses the node: the policy is a gate, and a gate
//! that cannot be read stays shut.
//!
//! Evaluation is in-process (`regorus`); the compiled policy is shared and
//! each evaluation works on its own cheap copy, so sequences never wait for
//! one another here.

pub mod input;

use choria_config::admission::AdmissionConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// What regorus says of a rule the policy does not declare.
const UNDECLARED: &str = "not a valid rule path";

/// The package the rules are read from.
pub const PACKAGE: &str = "data.choria.provisioner";

/// How long one evaluation may run: a node's facts are bounded by the
/// reply size the broker accepts, but a policy that walks them in a loop
/// should cost one node a refusal, not the provisioner its workers.
pub const EVALUATION_LIMIT: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read the admission policy {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the admission policy {} does not compile: {reason}", .path.display())]
    Compile { path: PathBuf, reason: String },
    #[error("the admission policy {} has no package choria.provisioner (it has {found}); its rules would never be read", .path.display())]
    Package { path: PathBuf, found: String },
    #[error("the admission policy {} has no rule allow: it would refuse every node", .path.display())]
    NoAllow { path: PathBuf },
    #[error("the admission policy could not be evaluated: {0}")]
    Evaluate(String),
    #[error("the admission policy's {rule} is {found}, not a {expected}")]
    Type {
        rule: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("the node's details could not be given to the admission policy: {0}")]
    Input(String),
}

/// What the policy decided for one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Refused, with the policy's `deny_reason` (or a default).
    Denied(String),
    /// Not now (`defer`), with its `deny_reason` if it gave one.
    Deferred(String),
}

impl Decision {
    /// The `decision` label of `choria_provisioner_admission`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Denied(_) => "denied",
            Decision::Deferred(_) => "deferred",
        }
    }

    /// The reason, empty when allowed.
    pub fn reason(&self) -> &str {
        match self {
            Decision::Allowed => "",
            Decision::Denied(r) | Decision::Deferred(r) => r,
        }
    }
}

/// The reason given when the policy does not allow a node and says nothing.
pub const DEFAULT_DENY_REASON: &str = "the admission policy does not allow it";

/// A compiled admission policy.
///
/// Evaluating on a fresh copy of the compiled engine costs about half again
/// as much as on one that evaluated before (measured in
/// `benches/admission.rs`), so each policy keeps one engine per CPU and an
/// evaluation takes whichever is free.
pub struct Policy {
    engines: Vec<std::sync::Mutex<regorus::Engine>>,
    /// One per engine: evaluations past that wait here, as tasks, rather
    /// than on an engine's lock on a thread.
    permits: tokio::sync::Semaphore,
    next: std::sync::atomic::AtomicUsize,
    path: PathBuf,
    /// Which of `defer` and `deny_reason` the policy declares (regorus
    /// refuses to evaluate a rule that is not declared).
    has_defer: bool,
    has_reason: bool,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").field("path", &self.path).finish()
    }
}

impl Policy {
    /// Reads and compiles the file `cfg` names.
    pub fn load(cfg: &AdmissionConfig) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(&cfg.policy).map_err(|source| PolicyError::Read {
            path: cfg.policy.clone(),
            source,
        })?;
        Self::compile(&cfg.policy, &text, cfg.rego_v0)
    }

    /// Compiles `text` (named `path` in messages).
    pub fn compile(path: &Path, text: &str, rego_v0: bool) -> Result<Self, PolicyError> {
        let compile = |e: &dyn std::fmt::Display| PolicyError::Compile {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut engine = regorus::Engine::new();
        engine.set_rego_v0(rego_v0);
        engine.set_strict_builtin_errors(true);
        engine
            .add_policy(path.display().to_string(), text.to_string())
            .map_err(|e| compile(&e))?;
        let packages = engine.get_packages().map_err(|e| compile(&e))?;
        if !packages.iter().any(|p| p == PACKAGE) {
            return Err(PolicyError::Package {
                path: path.to_path_buf(),
                found: if packages.is_empty() {
                    "none".into()
                } else {
                    packages.join(", ")
                },
            });
        }
        engine.set_execution_timer_config(regorus::utils::limits::ExecutionTimerConfig {
            limit: EVALUATION_LIMIT,
            check_interval: std::num::NonZeroU32::new(64).expect("not zero"),
        });
        let mut probe = engine.clone();
        probe.set_input(regorus::Value::new_object());
        let mut declared = |name: &str| match probe.eval_rule(format!("{PACKAGE}.{name}")) {
            Err(e) => !e.to_string().contains(UNDECLARED),
            Ok(_) => true,
        };
        if !declared("allow") {
            return Err(PolicyError::NoAllow {
                path: path.to_path_buf(),
            });
        }
        let (has_defer, has_reason) = (declared("defer"), declared("deny_reason"));
        let copies = std::thread::available_parallelism().map_or(2, |n| n.get());
        Ok(Policy {
            permits: tokio::sync::Semaphore::new(copies),
            engines: (0..copies)
                .map(|_| std::sync::Mutex::new(engine.clone()))
                .collect(),
            next: std::sync::atomic::AtomicUsize::new(0),
            path: path.to_path_buf(),
            has_defer,
            has_reason,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// [`Policy::evaluate_owned`] for a node's sequence: on a thread of
    /// the blocking pool, never on the async runtime's (a policy may walk
    /// a large fact for its whole time limit, up to three rules a node,
    /// while leases are renewed and other nodes answered), and at most one
    /// evaluation per engine at once.
    pub async fn decide(self: &Arc<Self>, input: regorus::Value) -> Result<Decision, PolicyError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| PolicyError::Evaluate(e.to_string()))?;
        let policy = self.clone();
        tokio::task::spawn_blocking(move || policy.evaluate_owned(input))
            .await
            .map_err(|e| PolicyError::Evaluate(format!("the evaluation stopped: {e}")))?
    }

    /// The decision for one node's input document.
    pub fn evaluate(&self, input: &serde_json::Value) -> Result<Decision, PolicyError> {
        self.evaluate_owned(regorus::Value::from(input.clone()))
    }

    /// [`Policy::evaluate`], taking the document (a node's is made for
    /// this one evaluation: no copy of it is needed). `deny_reason` is
    /// evaluated only for a node that is not allowed: each rule costs a
    /// third of an evaluation, and an allowed node has no use for it.
    pub fn evaluate_owned(&self, input: regorus::Value) -> Result<Decision, PolicyError> {
        let mut engine = self.engine();
        engine.set_input(input);
        let allow = boolean("allow", &rule(&mut engine, "allow")?)?;
        let defer = if self.has_defer {
            boolean("defer", &rule(&mut engine, "defer")?)?
        } else {
            false
        };
        let reason = if self.has_reason && (defer || !allow) {
            rule(&mut engine, "deny_reason")?
        } else {
            regorus::Value::Undefined
        };
        let reason = match &reason {
            regorus::Value::Undefined | regorus::Value::Null => None,
            regorus::Value::String(s) => Some(crate::provision::text::one_line(s, 500)),
            other => {
                return Err(PolicyError::Type {
                    rule: "deny_reason",
                    expected: "string",
                    found: kind(other).into(),
                })
            }
        };
        Ok(match (defer, allow) {
            (true, _) => Decision::Deferred(
                reason.unwrap_or_else(|| "the admission policy defers it".into()),
            ),
            (false, true) => Decision::Allowed,
            (false, false) => {
                Decision::Denied(reason.unwrap_or_else(|| DEFAULT_DENY_REASON.into()))
            }
        })
    }
}

impl Policy {
    /// A free engine, or (all busy) the next one in turn.
    fn engine(&self) -> std::sync::MutexGuard<'_, regorus::Engine> {
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let n = self.engines.len();
        for i in 0..n {
            if let Ok(e) = self.engines[(start + i) % n].try_lock() {
                return e;
            }
        }
        // A panic inside regorus poisons one engine; its state is reset by
        // the next evaluation's `set_input`.
        self.engines[start % n]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn rule(engine: &mut regorus::Engine, name: &str) -> Result<regorus::Value, PolicyError> {
    engine
        .eval_rule(format!("{PACKAGE}.{name}"))
        .map_err(|e| PolicyError::Evaluate(crate::provision::text::one_line(&e.to_string(), 500)))
}

/// A rule that must be a bool when defined; undefined is `false`.
fn boolean(name: &'static str, v: &regorus::Value) -> Result<bool, PolicyError> {
    match v {
        regorus::Value::Undefined => Ok(false),
        regorus::Value::Bool(b) => Ok(*b),
        other => Err(PolicyError::Type {
            rule: name,
            expected: "bool",
            found: kind(other).into(),
        }),
    }
}

fn kind(v: &regorus::Value) -> &'static str {
    match v {
        regorus::Value::Null => "null",
        regorus::Value::Bool(_) => "a bool",
        regorus::Value::Number(_) => "a number",
        regorus::Value::String(_) => "a string",
        regorus::Value::Array(_) => "an array",
        regorus::Value::Set(_) => "a set",
        regorus::Value::Object(_) => "an object",
        regorus::Value::Undefined => "undefined",
    }
}

#[cfg(test)]
mod tests;
