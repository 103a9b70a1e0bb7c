//! The pipeline: how nodes reach their sequences. `broker` connects and
//! follows the connection; `discovery` and `events` offer names to the
//! `registry`, which holds them in lanes; `lanes` are the lanes' in-flight
//! budgets, each a `lanes::budget` whose bound follows the `lanes::aimd`
//! rules; `dispatch` takes each lane's names and runs their sequences;
//! `leadership` is the election's steering of all of it (won: resume and
//! discover; lost: pause and forget); `context` is what intake and
//! dispatch work with.

pub mod broker;
pub mod context;
pub mod discovery;
pub mod dispatch;
pub mod events;
pub mod lanes;
pub mod leadership;
pub mod registry;

pub use context::Context;
