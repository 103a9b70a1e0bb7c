//! The provisioner's side of leader election: which backend to campaign
//! with, and what winning and losing do to a running provisioner (the
//! election itself, in [`crate::election`], knows nothing of provisioning).
//!
//! Won: count the transition, set the leader gauge, lift the election pause
//! (which discovers at once). Lost: the same in reverse, and the registry and
//! queue are emptied so nothing stale is worked after a later win. Failed
//! attempts count in `choria_provisioner_election_errors` and fail the
//! `election` check of `/readyz` until one works.

use crate::election::lease::LeaseBackend;
use crate::election::machine::LossReason;
use crate::election::shards::ShardSteer;
use crate::election::streams::StreamsBackend;
use crate::election::{self, ElectionError, Steer, HEALTH_CHECK};
use crate::provision::gate::PauseReason;
use crate::provision::steering::Steering;
use choria_config::{ElectionBackend, ElectionConfig};
use choria_k8s::crd::ResourceRef;
use choria_k8s::Kube;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

impl Steer for Steering {
    fn won(&self, me: &str) {
        self.metrics.leadership_transition();
        self.metrics.set_leader(true);
        warn!(identity = me, "became leader; resuming and discovering");
        self.resume(PauseReason::Election);
    }

    fn lost(&self, me: &str, reason: &LossReason) {
        self.metrics.leadership_transition();
        self.metrics.set_leader(false);
        warn!(identity = me, %reason, "lost leadership; pausing and dropping queued nodes");
        self.pause(PauseReason::Election, true);
        if let Some(hold) = self.fence.lost_leadership(std::time::Instant::now()) {
            warn!(
                identity = me,
                hold = ?hold,
                "lost leadership while disconnected from the broker: not reconnecting until every request queued before has expired (nodes refuse them then)"
            );
        }
    }

    fn failed(&self, error: &str) {
        self.election_failed(error);
    }

    fn worked(&self) {
        self.election_worked();
    }
}

impl Steering {
    /// The election (or the shards' membership) failed: counted, and
    /// `/readyz` says why. Both election modes report through here.
    fn election_failed(&self, error: &str) {
        self.metrics.election_error();
        self.health.set(HEALTH_CHECK, Err(error.to_string()));
    }

    /// It works again: `/readyz` clears.
    fn election_worked(&self) {
        self.health.set(HEALTH_CHECK, Ok(()));
    }
}

/// In shards mode the membership steers: our share, and whether we work.
impl ShardSteer for Steering {
    fn members(&self, members: &[String]) {
        self.metrics.set_shard_members(members.len());
        if self.ownership.set_members(members) && !self.gate.is_paused() {
            // Nodes that were another member's are ours now: find them.
            info!(members = members.len(), "our share grew; discovering");
            self.trigger_discovery();
        }
    }

    fn working(&self, working: bool) {
        self.metrics.set_leader(working);
        self.metrics.leadership_transition();
        if working {
            warn!("working our share of the fleet");
            self.resume(PauseReason::Election);
        } else {
            warn!("not working: our membership is not renewed; pausing and dropping queued nodes");
            self.pause(PauseReason::Election, true);
        }
    }

    fn failed(&self, error: &str) {
        self.election_failed(error);
    }
    fn refused(&self, reason: &'static str) {
        self.metrics.shard_record_refused(reason);
    }

    fn worked(&self) {
        self.election_worked();
    }
}

/// Who campaigns, and where: what the election needs besides what it
/// steers.
pub(crate) struct Campaign {
    pub(crate) cfg: ElectionConfig,
    /// The name we campaign under (see `provision::candidate_identity`).
    pub(crate) me: String,
    /// For a Lease election, or the shards' Lease membership.
    pub(crate) kube: Kube,
    /// A pod's own `Provisioner`, which owns its Lease.
    pub(crate) resource: Option<ResourceRef>,
}

/// Starts the configured election (none: `None`) steering `steering`. The
/// provisioner paused itself for [`PauseReason::Election`] when it was made.
/// A pod's Lease is owned by its Provisioner (`resource`), so deleting the
/// Provisioner collects it.
pub(crate) fn spawn(
    nats: &async_nats::Client,
    campaign: Campaign,
    steering: Arc<Steering>,
    stop: CancellationToken,
    leader_tx: watch::Sender<Option<String>>,
) -> Option<JoinHandle<()>> {
    let Campaign {
        cfg,
        me: identity,
        kube,
        resource,
    } = campaign;
    if cfg.sharded() {
        let nats = nats.clone();
        return Some(tokio::spawn(shards(
            cfg, identity, kube, nats, steering, stop,
        )));
    }
    match cfg.backend {
        ElectionBackend::None => None,
        ElectionBackend::Streams => {
            let nats = nats.clone();
            let create = cfg.create_bucket.then_some(cfg.bucket_ttl);
            let setup = move || {
                let (nats, cfg, identity) = (nats.clone(), cfg.clone(), identity.clone());
                async move {
                    let b = StreamsBackend::connect(nats, &cfg, &identity, create).await?;
                    info!(bucket = %cfg.bucket, key = %cfg.name, ttl = ?b.ttl(), "streams election ready");
                    Ok::<_, ElectionError>(b)
                }
            };
            Some(tokio::spawn(election::run(
                setup, steering, stop, leader_tx,
            )))
        }
        ElectionBackend::Lease => {
            let setup = move || {
                let (cfg, identity, kube, resource) = (
                    cfg.clone(),
                    identity.clone(),
                    kube.clone(),
                    resource.clone(),
                );
                async move {
                    let mut b = LeaseBackend::connect(&kube, &cfg, &identity)?;
                    if let Some(r) = resource.filter(|r| r.namespace == b.namespace()) {
                        let client = kube.client().map_err(ElectionError::Other)?;
                        let owner = r.owner(client).await.map_err(ElectionError::Other)?;
                        b = b.with_owner(owner);
                    }
                    info!(lease = %format!("{}/{}", b.namespace(), cfg.lease_name), lease_duration = ?cfg.lease_duration, "lease election ready");
                    Ok::<_, ElectionError>(b)
                }
            };
            Some(tokio::spawn(election::run(
                setup, steering, stop, leader_tx,
            )))
        }
    }
}

/// `mode: shards`: joins the membership (retrying while it cannot be set
/// up) and drives it until `stop`.
async fn shards(
    cfg: ElectionConfig,
    me: String,
    kube: Kube,
    nats: async_nats::Client,
    steering: Arc<Steering>,
    stop: CancellationToken,
) {
    let me = &me;
    use crate::election::shards::{self, heartbeats::Heartbeats, lease::LeaseMembership};
    let timings = shards::ShardTimings {
        ttl: cfg.lease_duration,
        renew_deadline: cfg.renew_deadline,
        renew_period: cfg.retry_period,
    };
    let mut backoff = crate::backoff::Backoff::new(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(30),
    );
    loop {
        let set_up = async {
            let key = signing_key(&cfg)?;
            let mut verifier = key.verifier();
            for k in &cfg.verify_keys {
                verifier = verifier
                    .trusting(k)
                    .map_err(|e| ElectionError::Other(format!("election.verify_keys: {e}")))?;
            }
            match cfg.backend {
                ElectionBackend::Lease => LeaseMembership::connect(&kube, &cfg, me, key, verifier)
                    .map(ShardBackend::Lease),
                _ => Heartbeats::connect(
                    nats.clone(),
                    &cfg.name,
                    me,
                    key,
                    verifier,
                    timings.ttl,
                    timings.renew_period * 3 / 4,
                )
                .await
                .map(ShardBackend::Heartbeats),
            }
        }
        .await;
        match set_up {
            Ok(ShardBackend::Lease(b)) => return shards::drive(b, timings, steering, stop).await,
            Ok(ShardBackend::Heartbeats(b)) => {
                return shards::drive(b, timings, steering, stop).await
            }
            Err(e) => {
                crate::election::shards::ShardSteer::failed(&steering, &e.to_string());
                tracing::error!(error = %e, "cannot join the shards; staying paused and retrying");
                if !backoff.wait(&stop).await {
                    return;
                }
            }
        }
    }
}

/// `election.signing_key`, read now (a rotated file takes effect when the
/// membership is set up again).
fn signing_key(
    cfg: &ElectionConfig,
) -> Result<choria_wire::security::seal::SealKey, ElectionError> {
    let path = cfg.signing_key.as_deref().ok_or_else(|| {
        ElectionError::Other("election.signing_key is required in mode shards".into())
    })?;
    choria_wire::security::seal::SealKey::from_file(path)
        .map_err(|e| ElectionError::Other(format!("election.signing_key: {e}")))
}

enum ShardBackend {
    Lease(crate::election::shards::lease::LeaseMembership),
    Heartbeats(crate::election::shards::heartbeats::Heartbeats),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::Exposition;
    use crate::provision::{Options, Provisioner};
    use choria_config::{ChoriaClientConfig, Environment, ProvisionerConfig};
    use std::time::Duration;

    /// The configuration and client set-up read from these two files' texts.
    fn load(
        dir: &std::path::Path,
        yaml: &str,
        choria_cfg: &str,
    ) -> (ProvisionerConfig, choria_config::ClientSetup) {
        let yaml_path = dir.join("provisioner.yaml");
        std::fs::write(&yaml_path, yaml).unwrap();
        let ccfg = dir.join("choria.cfg");
        std::fs::write(&ccfg, choria_cfg).unwrap();
        let cfg = ProvisionerConfig::load(&yaml_path).unwrap();
        let env = Environment::from_process();
        let setup = ChoriaClientConfig::load_with(&ccfg, &env)
            .unwrap()
            .client_setup(&cfg, &env)
            .unwrap();
        (cfg, setup)
    }

    /// A provisioner with a streams election configured, not running.
    fn provisioner(dir: &std::path::Path) -> Provisioner {
        let (cfg, setup) = load(
            dir,
            "choria_insecure: true\nsite: lead\nhelper: /bin/true\nleader_election: true\n",
            "identity = provisioner.lead\nplugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
        );
        Provisioner::new(cfg, setup, Options::new("test")).unwrap()
    }

    #[test]
    fn winning_resumes_and_losing_pauses_and_empties_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let p = provisioner(dir.path());
        let h = p.steering();
        let m = |name: &str| h.metrics.value(name).unwrap();
        assert!(h.gate.is_paused(), "an elected provisioner starts paused");

        h.won("me");
        assert!(!h.gate.is_paused(), "the winner works");
        assert_eq!(m("choria_provisioner_leader"), 1.0);
        assert_eq!(m("choria_provisioner_leadership_transitions"), 1.0);
        h.registry.offer(
            "node-1.example.net",
            crate::provision::pipeline::registry::Source::Discovery,
        );
        assert_eq!(h.registry.queued(), 1);

        h.lost("me", &LossReason::RenewDeadline(Duration::from_secs(3)));
        assert!(h.gate.is_paused());
        assert_eq!(m("choria_provisioner_leader"), 0.0);
        assert_eq!(m("choria_provisioner_leadership_transitions"), 2.0);
        assert_eq!(h.registry.queued(), 0, "nothing stale after a later win");
        assert!(h.registry.is_empty());
    }

    #[test]
    fn a_pod_following_its_provisioner_works_only_once_it_knows_spec_paused() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, setup) = load(
            dir.path(),
            "choria_insecure: true\nhelper: /bin/true\n",
            "plugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
        );
        let plain = Provisioner::new(cfg.clone(), setup.clone(), Options::new("test")).unwrap();
        assert!(
            !plain.steering().is_paused(),
            "no election, no resource: works at once"
        );
        let as_resource = Options {
            resource: Some("ns/prov".parse().unwrap()),
            ..Options::new("test")
        };
        let pod = Provisioner::new(cfg, setup, as_resource).unwrap();
        assert!(
            pod.steering().is_paused(),
            "paused until the watch reports spec.paused"
        );
    }

    #[test]
    fn two_processes_with_one_configuration_campaign_under_different_names() {
        use crate::provision::candidate_identity;
        let a = candidate_identity("provisioner.example.net", None);
        let b = candidate_identity("provisioner.example.net", None);
        assert_ne!(
            a, b,
            "replicas sharing a Choria identity must not share a candidate name"
        );
        assert!(a.starts_with("provisioner.example.net-"), "{a}");
        let pod = candidate_identity("provisioner.example.net", Some("prov-7b9f-x2"));
        assert!(pod.starts_with("prov-7b9f-x2-"), "{pod}");
        assert_eq!(pod.len(), "prov-7b9f-x2-".len() + 6);
        // An empty POD_NAME is no pod name.
        assert!(candidate_identity("i", Some("")).starts_with("i-"));
    }

    #[test]
    fn failures_are_counted_and_fail_readiness_until_an_attempt_works() {
        let dir = tempfile::tempdir().unwrap();
        let p = provisioner(dir.path());
        let h = p.steering();
        Steer::failed(&h, "bucket unreachable");
        Steer::failed(&h, "bucket unreachable");
        assert_eq!(
            h.metrics.value("choria_provisioner_election_errors"),
            Some(2.0)
        );
        let failing = h.health.ready().unwrap_err();
        assert_eq!(failing[0].0, HEALTH_CHECK);
        assert!(failing[0].1.contains("bucket unreachable"));
        Steer::worked(&h);
        assert!(h.health.ready().is_ok());
    }
}
