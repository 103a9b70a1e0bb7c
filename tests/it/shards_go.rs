//! Ours in shards mode and the real Go provisioner (un-elected) on the same
//! real go-choria 0.30.2 servers: go-choria's provisioning lock arbitrates,
//! and no server is configured twice (a real server publishes a
//! `provisioned` lifecycle event for every `configure` it carries out).

use crate::support::gopeers::{choria_bin, go_provisioner_bin, make_signers, GoServer};
use crate::support::provisioner::ProvisionerProcess;
use crate::support::NatsServer;
use choria_wire::lifecycle::{self, EventType};
use choria_wire::protocol::Version;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TOKEN: &str = "sh4rds-t0ken";
const SERVERS: usize = 8;

/// The scenario's fixture: a broker, the signers the real servers trust, a
/// work directory, and every lifecycle event since before anything started.
struct Mixed {
    // Fields drop in order: what started last stops first.
    events: async_nats::Subscriber,
    // Held: the subscription lives on its connection.
    _watcher: async_nats::Client,
    signers: crate::support::gopeers::Signers,
    nats: NatsServer,
    work: tempfile::TempDir,
    bin: std::path::PathBuf,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_in_shards_and_the_go_provisioner_never_configure_a_real_server_twice() {
    let test = "ours_in_shards_and_the_go_provisioner_never_configure_a_real_server_twice";
    let Some(bin) = choria_bin(test) else {
        return;
    };
    let Some(go_bin) = go_provisioner_bin(test) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let nats = NatsServer::start_tls_available();
    let signers = make_signers(&bin, dir);
    let watcher = nats.connect("watcher").await;
    let events = watcher.subscribe("choria.lifecycle.event.>").await.unwrap();
    watcher.flush().await.unwrap();
    let mut m = Mixed {
        events,
        _watcher: watcher,
        signers,
        nats,
        work,
        bin,
    };

    let (mut go, ours) = m
        .given_the_go_provisioner_and_two_of_ours_in_shards(&go_bin)
        .await;
    let (names, servers) = m.given_real_servers_in_provisioning_mode();
    let provisioned = m
        .when_every_server_is_configured_and_restarted(&names, &go, &ours)
        .await;
    m.then_each_was_configured_once(&names, &provisioned, &ours);
    for mut p in ours {
        p.signal("TERM");
        assert!(p.wait_exit(Duration::from_secs(5)).success());
    }
    go.signal("TERM");
    go.wait_exit(Duration::from_secs(10));
    drop(servers);
}

impl Mixed {
    /// The Go provisioner and ours, with the same helper and settings;
    /// ours both working before any server comes up.
    async fn given_the_go_provisioner_and_two_of_ours_in_shards(
        &self,
        go_bin: &std::path::Path,
    ) -> (ProvisionerProcess, Vec<ProvisionerProcess>) {
        let (dir, nats, signers) = (self.work.path(), &self.nats, &self.signers);
        // The same helper and settings for both; ours adds its shards block.
        // The helper takes 2 s, so whoever holds a server's lock holds it while
        // the other comes for it: both see refusals, whoever is faster.
        let helper = dir.join("slow-helper.sh");
        std::fs::write(
            &helper,
            format!(
                "#!/bin/sh\nsleep 2\nexec '{}'\n",
                std::env::current_dir()
                    .unwrap()
                    .join("examples/helper.sh")
                    .display()
            ),
        )
        .unwrap();
        std::process::Command::new("chmod")
            .arg("+x")
            .arg(&helper)
            .status()
            .unwrap();
        let common = format!(
        "workers: 4\ninterval: 1m\ntoken: {TOKEN}\nsite: mixed\nhelper: {}\nchoria_insecure: true\n\
         jwt_verify_cert: {}\nfeatures:\n  jwt: true\nloglevel: debug\n",
        helper.display(),
        signers.public_key(Version::V1).display()
    );
        let ccfg = |name: &str| {
            format!(
            "identity = {name}.mixed.example.net\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
            nats.url()
        )
        };
        let go = ProvisionerProcess::start_program(
            go_bin,
            dir,
            "go",
            &format!(
                "{common}logfile: {}\n",
                dir.join("go-provisioner.log").display()
            ),
            &ccfg("go"),
            &[],
            &[],
        );
        let shards = format!(
            "election:\n  mode: shards\n  backend: streams\n  name: mixed\n  \
         lease_duration: 6s\n  renew_deadline: 4s\n  retry_period: 1s\n  signing_key: {}\n",
            crate::support::signing_key(dir).display()
        );
        let mut ours: Vec<ProvisionerProcess> = ["r1", "r2"]
            .iter()
            .map(|n| {
                ProvisionerProcess::start_named(
                    dir,
                    n,
                    &format!("{common}{shards}"),
                    &ccfg("ours"),
                    &[],
                )
            })
            .collect();
        // Both working before the servers come up, so they race for each one.
        for p in &mut ours {
            p.wait_for_metric(
                "choria_provisioner_shard_members",
                2.0,
                Duration::from_secs(30),
            )
            .await;
        }

        (go, ours)
    }

    /// `SERVERS` real go-choria servers: their names, and the servers.
    fn given_real_servers_in_provisioning_mode(&self) -> (Vec<String>, Vec<GoServer>) {
        let (bin, dir, nats, signers) = (&self.bin, self.work.path(), &self.nats, &self.signers);
        let names: Vec<String> = (0..SERVERS)
            .map(|i| format!("real-{i}.mixed.example.net"))
            .collect();
        let servers: Vec<GoServer> = names
            .iter()
            .map(|n| {
                GoServer::start(
                    bin,
                    signers,
                    &dir.join(n),
                    n,
                    &nats.url(),
                    Version::V1,
                    TOKEN,
                )
            })
            .collect();

        (names, servers)
    }

    /// How many `provisioned` events each server published.
    async fn when_every_server_is_configured_and_restarted(
        &mut self,
        names: &[String],
        go: &ProvisionerProcess,
        ours: &[ProvisionerProcess],
    ) -> BTreeMap<String, usize> {
        let events = &mut self.events;
        // Every server configured (a `provisioned` event) and told to restart
        // (its `shutdown` event). It does not come back: the helper's
        // configuration has no security settings for a normal-mode server, and
        // that is not what this test is about.
        let mut provisioned: BTreeMap<String, usize> = BTreeMap::new();
        let mut restarted: BTreeMap<String, usize> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(150);
        while restarted.len() < SERVERS {
            let Ok(Some(msg)) = tokio::time::timeout_at(deadline.into(), events.next()).await
            else {
                panic!(
                "provisioned {provisioned:?}, restarted {restarted:?} within 150 s; go log:\n{}\nours:\n{}",
                go.logs_tail(20),
                ours[0].logs_tail(20)
            );
            };
            let Ok((kind, event)) = lifecycle::parse(&msg.payload) else {
                continue;
            };
            if !names.contains(&event.identity) {
                continue;
            }
            match kind {
                EventType::Provisioned => *provisioned.entry(event.identity).or_default() += 1,
                EventType::Shutdown if provisioned.contains_key(&event.identity) => {
                    *restarted.entry(event.identity).or_default() += 1
                }
                _ => {}
            }
        }
        // Late duplicates would come within a discovery interval; the lock lasts
        // two minutes, so a second configure could only follow a refusal at
        // once: give in-flight work a few seconds.
        let settle = Instant::now() + Duration::from_secs(5);
        while let Ok(Some(msg)) = tokio::time::timeout_at(settle.into(), events.next()).await {
            if let Ok((EventType::Provisioned, event)) = lifecycle::parse(&msg.payload) {
                *provisioned.entry(event.identity).or_default() += 1;
            }
        }
        provisioned
    }

    fn then_each_was_configured_once(
        &self,
        names: &[String],
        provisioned: &BTreeMap<String, usize>,
        ours: &[ProvisionerProcess],
    ) {
        let dir = self.work.path();
        let ours_refused: f64 = ours
            .iter()
            .map(|p| p.metric("choria_provisioner_lock_refusals"))
            .sum();
        let go_log = std::fs::read_to_string(dir.join("go-provisioner.log")).unwrap_or_default();
        let go_refused = go_log.matches("Could not obtain provisioning lock").count();
        let ours_done: f64 = ours
            .iter()
            .map(|p| p.metric("choria_provisioner_provisioned"))
            .sum();
        println!(
        "{SERVERS} real servers: provisioned events {provisioned:?}; ours provisioned {ours_done}, \
         lock refusals seen by ours {ours_refused}, by Go (log lines) {go_refused}"
    );
        for n in names {
            assert_eq!(
                provisioned.get(n),
                Some(&1),
                "{n} configured {provisioned:?}"
            );
        }
    }
}
