//! The CertificateRequests a signer made, followed through one watch: a
//! node waiting for its request wakes when cert-manager writes it (no GET
//! per node and per look), and every request is deleted when it is due —
//! after use, or `keep` after — by one task that also deletes, when the
//! process stops, every request still waiting for its time. Run as a
//! Provisioner's pod, the first list also schedules what an earlier process
//! left behind (crashed before its deletions), for when it would have
//! been deleted.

use choria_k8s::certificate_request::CertificateRequest;
use futures::StreamExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, warn};

/// How many deletions run at once when the process stops.
const FINAL_DELETIONS: usize = 16;

/// The requests and their deletions. Dropping it stops its tasks (what is
/// due then is left to [`Requests::finish`]).
pub struct Requests {
    api: Api<CertificateRequest>,
    store: Store<CertificateRequest>,
    pending: Arc<Pending>,
    tasks: Vec<JoinHandle<()>>,
}

/// The requests under way: who waits for which, and when each is deleted.
#[derive(Default)]
struct Pending {
    /// Who waits for which request.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// When each request is to be deleted.
    due: Mutex<HashMap<String, Instant>>,
    /// A new, earlier deletion.
    scheduled: Notify,
}

impl Pending {
    fn wake(&self, name: &str) {
        if let Some(n) = self.waiters.lock().expect("never poisoned").get(name) {
            n.notify_one();
        }
    }

    fn wake_all(&self) {
        for n in self.waiters.lock().expect("never poisoned").values() {
            n.notify_one();
        }
    }

    fn schedule(&self, name: &str, at: Instant) {
        let mut due = self.due.lock().expect("never poisoned");
        let at = due.get(name).map_or(at, |t| (*t).min(at));
        due.insert(name.to_string(), at);
        self.scheduled.notify_one();
    }

    /// The names due by `now`, taken off the schedule, and when the next
    /// one is.
    fn take_due(&self, now: Instant) -> (Vec<String>, Option<Instant>) {
        let mut due = self.due.lock().expect("never poisoned");
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for n in &ready {
            due.remove(n);
        }
        (ready, due.values().min().copied())
    }
}

/// A registration to be woken when a request changes; unregisters on drop.
pub struct Waiter {
    name: String,
    notify: Arc<Notify>,
    pending: Arc<Pending>,
}

impl Waiter {
    /// Returns when the request changed since the last call (or since the
    /// registration).
    pub async fn changed(&self) {
        self.notify.notified().await
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.pending
            .waiters
            .lock()
            .expect("never poisoned")
            .remove(&self.name);
    }
}

impl Requests {
    /// Watches the requests matching `selector` through `api`. `leftovers`:
    /// how long after its creation a request found on the first list is
    /// deleted (`None`: only what this process made is deleted).
    pub fn start(
        api: Api<CertificateRequest>,
        selector: &str,
        leftovers: Option<Duration>,
    ) -> Self {
        let pending = Arc::new(Pending::default());
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        let config = watcher::Config::default().labels(selector);
        let events = watcher(api.clone(), config)
            .default_backoff()
            .reflect(writer);
        let tasks = vec![
            tokio::spawn(follow(events, pending.clone(), leftovers)),
            tokio::spawn(delete_when_due(api.clone(), pending.clone())),
        ];
        Requests {
            api,
            store,
            pending,
            tasks,
        }
    }

    /// The request as last seen.
    pub fn get(&self, name: &str) -> Option<Arc<CertificateRequest>> {
        let key = ObjectRef::<CertificateRequest>::new(name)
            .within(self.api.namespace().unwrap_or_default());
        self.store.get(&key)
    }

    /// Registers interest in `name`: look at [`Requests::get`] after this,
    /// then wait for [`Waiter::changed`].
    pub fn waiter(&self, name: &str) -> Waiter {
        let notify = Arc::new(Notify::new());
        self.pending
            .waiters
            .lock()
            .expect("never poisoned")
            .insert(name.to_string(), notify.clone());
        Waiter {
            name: name.to_string(),
            notify,
            pending: self.pending.clone(),
        }
    }

    /// Deletes `name` `after` from now.
    pub fn delete_after(&self, name: &str, after: Duration) {
        self.pending.schedule(name, Instant::now() + after);
    }

    /// How many deletions are waiting for their time.
    pub fn pending(&self) -> usize {
        self.pending.due.lock().expect("never poisoned").len()
    }

    /// Stops following, and deletes every request still scheduled, now.
    pub async fn finish(&self) {
        for t in &self.tasks {
            t.abort();
        }
        let names: Vec<String> = {
            let mut due = self.pending.due.lock().expect("never poisoned");
            due.drain().map(|(n, _)| n).collect()
        };
        futures::stream::iter(names)
            .for_each_concurrent(FINAL_DELETIONS, |n| delete(&self.api, n))
            .await;
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Passes every change on to its waiter, and schedules what the first
/// list finds when `leftovers` says so.
async fn follow(
    events: impl futures::Stream<Item = Result<watcher::Event<CertificateRequest>, watcher::Error>>,
    pending: Arc<Pending>,
    leftovers: Option<Duration>,
) {
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                pending.wake(&o.metadata.name.clone().unwrap_or_default())
            }
            Ok(watcher::Event::InitApply(o)) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(after) = leftovers {
                    pending.schedule(&name, due_after_creation(&o, after));
                }
                pending.wake(&name);
            }
            // What a (re)list found is in the store only now: the reflector
            // holds a listing back until it is whole, so a waiter woken by
            // its InitApply looked and did not find it. A request created
            // as the watch started and issued before its first list (the
            // first nodes of a run) would wait out its timeout unseen.
            Ok(watcher::Event::InitDone) => pending.wake_all(),
            Ok(watcher::Event::Init) => {}
            // The watcher backs off and retries by itself; a waiter's
            // deadline bounds what a broken watch costs it.
            Err(e) => warn!(error = %e, "watching the CertificateRequests failed; retrying"),
        }
    }
}

/// When a request found on the first list is due: `after` its creation.
fn due_after_creation(o: &CertificateRequest, after: Duration) -> Instant {
    let age = o
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0))
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    Instant::now() + after.saturating_sub(age)
}

/// Deletes each request when it is due.
async fn delete_when_due(api: Api<CertificateRequest>, pending: Arc<Pending>) {
    loop {
        let (ready, next) = pending.take_due(Instant::now());
        for name in ready {
            delete(&api, name).await;
        }
        let scheduled = pending.scheduled.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = scheduled => {}
                }
            }
            None => scheduled.await,
        }
    }
}

async fn delete(api: &Api<CertificateRequest>, name: String) {
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => debug!(request = %name, "CertificateRequest deleted"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            warn!(request = %name, error = %choria_k8s::describe_error(&e), "could not delete the CertificateRequest")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deletions_come_due_in_time_and_earliest_wins() {
        let s = Pending::default();
        let t = Instant::now();
        s.schedule("a", t + Duration::from_secs(10));
        s.schedule("b", t + Duration::from_secs(5));
        s.schedule("a", t + Duration::from_secs(20));
        let (ready, next) = s.take_due(t);
        assert!(ready.is_empty());
        assert_eq!(next, Some(t + Duration::from_secs(5)));
        let (ready, next) = s.take_due(t + Duration::from_secs(10));
        let mut ready = ready;
        ready.sort();
        assert_eq!(ready, ["a", "b"], "the earlier time of a kept");
        assert_eq!(next, None);
    }

    /// A request the first list finds is seen by its waiter, which was
    /// woken (and looked) before the listing reached the store.
    #[tokio::test]
    async fn a_request_in_the_first_list_wakes_its_waiter_once_it_is_in_the_store() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let writer = reflector::store::Writer::default();
        let store = writer.as_reader();
        let pending = Arc::new(Pending::default());
        let notify = Arc::new(Notify::new());
        pending
            .waiters
            .lock()
            .unwrap()
            .insert("node-1-x".into(), notify.clone());
        let follower = tokio::spawn(follow(rx.reflect(writer), pending.clone(), None));
        let mut cr: CertificateRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "CertificateRequest",
            "metadata": {"name": "node-1-x", "namespace": "choria"},
            "spec": {"request": "", "issuerRef": {"name": "ca"}},
        }))
        .unwrap();
        cr.metadata.resource_version = Some("1".into());
        let key = ObjectRef::<CertificateRequest>::new("node-1-x").within("choria");
        tx.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        tx.unbounded_send(Ok(watcher::Event::InitApply(cr)))
            .unwrap();
        // Woken by the InitApply: the store does not hold the listing yet.
        tokio::time::timeout(Duration::from_secs(1), notify.notified())
            .await
            .expect("woken by InitApply");
        assert!(
            store.get(&key).is_none(),
            "a listing is held back until whole"
        );
        tx.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        tokio::time::timeout(Duration::from_secs(1), notify.notified())
            .await
            .expect("woken again once the listing is in the store");
        assert!(store.get(&key).is_some());
        drop(tx);
        follower.await.unwrap();
    }

    #[tokio::test]
    async fn a_waiter_is_woken_for_its_request_only() {
        let s = Arc::new(Pending::default());
        let n = Arc::new(Notify::new());
        s.waiters.lock().unwrap().insert("a".into(), n.clone());
        s.wake("b");
        s.wake("a");
        // The wake before the wait is kept.
        tokio::time::timeout(Duration::from_secs(1), n.notified())
            .await
            .expect("woken");
    }
}
