//! Prometheus metrics with the Go provisioner's names (skeleton; being written).

use std::time::Duration;

/// All metrics of one provisioner process, labelled with its `site`.
pub struct Metrics {}

impl Metrics {
    pub fn new(_site: &str) -> Self {
        Metrics {}
    }
    pub fn observe_rpc(&self, _rpc: &str, _took: Duration) {}
    pub fn rpc_error(&self, _rpc: &str) {}
    pub fn observe_helper(&self, _took: Duration) {}
    pub fn helper_error(&self) {}
    pub fn helper_shutdown(&self) {}
    pub fn discovered(&self) {}
    pub fn event_discovered(&self) {}
    pub fn discover_cycle(&self) {}
    pub fn discovery_error(&self) {}
    pub fn provision_error(&self) {}
    pub fn provisioned(&self) {}
    pub fn set_paused(&self, _paused: bool) {}
    pub fn busy_worker(&self) -> BusyWorker<'_> {
        BusyWorker { _m: self }
    }
    pub fn set_work_queue_entries(&self, _n: usize) {}
    pub fn set_waiting_nodes(&self, _n: usize) {}
    pub fn encode_text(&self) -> String {
        String::new()
    }
}

/// Counts a busy worker while alive.
pub struct BusyWorker<'a> {
    _m: &'a Metrics,
}
