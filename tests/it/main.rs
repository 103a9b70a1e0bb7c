//! The integration tests: one binary, each tier a module, the support
//! harnesses compiled once. Every tier runs against real parts (nats-server,
//! go-choria, the Go provisioner, the real Choria broker, etcd and
//! kube-apiserver, cert-manager); see `docs/src/contributing.md` for what
//! each needs and `scripts/test.sh` for how CI runs them.
//!
//! cargo test --test it                 every tier
//! cargo test --test it provision::     one tier
//! cargo test --test it alone::         the tests that want the machine to themselves

mod attested;
mod attested_page;
mod batched_requests;
mod behaviour_go;
mod book;
mod broker;
mod builtin_ca;
mod builtin_ca_page;
mod cert_manager;
mod cli;
mod cluster;
mod dashboard;
mod decoder_properties;
mod discover;
mod election;
mod election_go;
mod election_streams;
mod faults;
mod fleet;
mod go_captures;
mod host;
mod hostile;
mod in_flight_bound;
mod interop_go;
mod issuer_in_token;
mod kube_apiserver;
mod kubernetes_quick_start;
mod memory;
mod node_tier;
mod operator_bindings;
mod operator_e2e;
mod operator_lifecycle;
mod pipeline;
mod production;
mod provision;
mod provision_go;
mod quick_start;
mod renewal;
mod shards;
mod shards_go;
mod shutdown;
mod support;
mod traces;
