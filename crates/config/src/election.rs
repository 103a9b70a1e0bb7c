//! Leader election settings: the `election:` block of `provisioner.yaml`.
//!
//! The Go provisioner only has `leader_election: true`, which campaigns in the
//! Choria Streams KV bucket `CHORIA_LEADER_ELECTION` for the key `provisioner`
//! through the imported JetStream API prefix `choria.streams`. The block is new
//! (the Go provisioner ignores it) and chooses between that and a Kubernetes
//! Lease:
//!
//! ```yaml
//! election:
//!   backend: streams          # none | streams | lease
//!   bucket: CHORIA_LEADER_ELECTION
//!   name: provisioner
//!   api_prefix: choria.streams   # "" for the account's own $JS.API
//! ```
//!
//! ```yaml
//! election:
//!   backend: lease
//!   lease_name: choria-provisioner
//!   lease_namespace: choria      # default: the pod's namespace
//!   lease_duration: 15s
//!   renew_deadline: 10s
//!   retry_period: 2s
//! ```
//!
//! Without the block, `leader_election: true` means `backend: streams` with the
//! defaults above, exactly what the Go provisioner does.
//!
//! `mode: shards` (ours) makes every replica work: each holds a membership
//! of its own (its own Lease, or heartbeats over the broker) and works the
//! nodes that rendezvous hashing of their identity gives it. Both backends
//! then take their timings from `lease_duration` (how long a member counts
//! without renewing), `renew_deadline` (a member that could not renew for
//! this long stops working) and `retry_period` (how often it renews):
//!
//! ```yaml
//! election:
//!   mode: shards             # leader (the default) | shards
//!   backend: streams         # heartbeats on choria.provisioner.shards.<name>
//!   name: provisioner
//!   lease_duration: 15s
//!   renew_deadline: 10s
//!   retry_period: 2s
//! ```

use super::duration::format_duration;
use super::schema::ElectionFile;
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning};
use crate::names::{is_dns_label, is_dns_subdomain};
use std::path::Path;
use std::time::Duration;

/// The Choria Streams bucket go-choria elections use.
pub const DEFAULT_STREAMS_BUCKET: &str = "CHORIA_LEADER_ELECTION";
/// The election (and KV key) the Go provisioner campaigns for.
pub const DEFAULT_STREAMS_NAME: &str = "provisioner";
/// The JetStream API prefix the Choria broker imports into the provisioning account.
pub const DEFAULT_STREAMS_API_PREFIX: &str = "choria.streams";
/// The TTL of a bucket we create (the Choria broker's default).
pub const DEFAULT_BUCKET_TTL: Duration = Duration::from_secs(60);
/// Default Kubernetes Lease name.
pub const DEFAULT_LEASE_NAME: &str = "choria-provisioner";
/// client-go's defaults.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
pub const DEFAULT_RENEW_DEADLINE: Duration = Duration::from_secs(10);
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(2);

/// Whether one replica leads or every replica works its share. The
/// `Provisioner` resource takes it by these names (`Leader`, `Shards`);
/// `provisioner.yaml` in lower case.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
pub enum ElectionMode {
    /// One elected replica provisions, the others stand by (the Go
    /// provisioner's way).
    #[default]
    Leader,
    /// Every replica provisions the nodes rendezvous hashing gives it among
    /// the live members (active-active); go-choria's provisioning lock is
    /// the last line against a double configure.
    Shards,
}

impl ElectionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ElectionMode::Leader => "leader",
            ElectionMode::Shards => "shards",
        }
    }
}

/// Which election mechanism decides the active provisioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElectionBackend {
    /// Every instance provisions.
    None,
    /// Choria Streams KV, compatible with Go provisioners in the same cluster.
    Streams,
    /// A Kubernetes `coordination.k8s.io/v1` Lease.
    Lease,
}

impl ElectionBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            ElectionBackend::None => "none",
            ElectionBackend::Streams => "streams",
            ElectionBackend::Lease => "lease",
        }
    }
}

/// The resolved election settings. Fields of the backend not in use keep their
/// defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElectionConfig {
    pub mode: ElectionMode,
    pub backend: ElectionBackend,
    /// Streams: KV bucket.
    pub bucket: String,
    /// Streams: election name, the KV key.
    pub name: String,
    /// Streams: JetStream API prefix without a trailing dot; empty means the
    /// account's own `$JS.API`.
    pub api_prefix: String,
    /// Streams: create the bucket with `bucket_ttl` when it is missing
    /// (normally the Choria broker creates it).
    pub create_bucket: bool,
    /// Streams: the TTL of a bucket we create.
    pub bucket_ttl: Duration,
    /// Streams: servers holding a copy of a bucket we create.
    pub replicas: u8,
    /// Lease: object name.
    pub lease_name: String,
    /// Lease: namespace; `None` means the namespace the pod runs in.
    pub lease_namespace: Option<String>,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// Shards: the ed25519 seed file membership records are sealed with
    /// (the replicas share it); required in `mode: shards`.
    pub signing_key: Option<std::path::PathBuf>,
    /// Shards: public keys (hex) whose seals are trusted besides
    /// `signing_key`'s (the previous key, during a rotation).
    pub verify_keys: Vec<String>,
}

impl Default for ElectionConfig {
    fn default() -> Self {
        ElectionConfig {
            mode: ElectionMode::Leader,
            backend: ElectionBackend::None,
            bucket: DEFAULT_STREAMS_BUCKET.into(),
            name: DEFAULT_STREAMS_NAME.into(),
            api_prefix: DEFAULT_STREAMS_API_PREFIX.into(),
            create_bucket: false,
            bucket_ttl: DEFAULT_BUCKET_TTL,
            replicas: 1,
            lease_name: DEFAULT_LEASE_NAME.into(),
            lease_namespace: None,
            lease_duration: DEFAULT_LEASE_DURATION,
            renew_deadline: DEFAULT_RENEW_DEADLINE,
            retry_period: DEFAULT_RETRY_PERIOD,
            signing_key: None,
            verify_keys: Vec::new(),
        }
    }
}

const STREAMS_KEYS: &[&str] = &[
    "bucket",
    "name",
    "api_prefix",
    "create_bucket",
    "bucket_ttl",
    "replicas",
];
const LEASE_KEYS: &[&str] = &[
    "lease_name",
    "lease_namespace",
    "lease_duration",
    "renew_deadline",
    "retry_period",
];
/// The keys streams does not use in mode shards: its members heartbeat on
/// a subject named after `name` and take the lease timings.
const SHARDED_STREAMS_UNUSED: &[&str] = &[
    "bucket",
    "api_prefix",
    "create_bucket",
    "bucket_ttl",
    "replicas",
    "lease_name",
    "lease_namespace",
];

impl ElectionConfig {
    /// True unless the backend is `none`.
    pub fn enabled(&self) -> bool {
        self.backend != ElectionBackend::None
    }

    /// True in `mode: shards`.
    pub fn sharded(&self) -> bool {
        self.mode == ElectionMode::Shards && self.enabled()
    }

    /// The `election:` block that resolves to these settings: the backend
    /// and the keys it uses (the other backend's would only be warned about).
    pub fn to_file(&self) -> ElectionFile {
        let d = |d: Duration| Some(format_duration(d));
        let mut f = ElectionFile {
            backend: Some(self.backend.as_str().to_string()),
            mode: (self.mode != ElectionMode::Leader).then(|| self.mode.as_str().to_string()),
            signing_key: self.signing_key.as_ref().map(|p| p.display().to_string()),
            verify_keys: (!self.verify_keys.is_empty()).then(|| self.verify_keys.clone()),
            ..Default::default()
        };
        match self.backend {
            ElectionBackend::None => {}
            ElectionBackend::Streams if self.mode == ElectionMode::Shards => {
                f.name = Some(self.name.clone());
                f.lease_duration = d(self.lease_duration);
                f.renew_deadline = d(self.renew_deadline);
                f.retry_period = d(self.retry_period);
            }
            ElectionBackend::Streams => {
                f.bucket = Some(self.bucket.clone());
                f.name = Some(self.name.clone());
                f.api_prefix = Some(self.api_prefix.clone());
                f.create_bucket = Some(self.create_bucket);
                f.bucket_ttl = d(self.bucket_ttl);
                f.replicas = (self.replicas != 1).then_some(i64::from(self.replicas));
            }
            ElectionBackend::Lease => {
                f.lease_name = Some(self.lease_name.clone());
                f.lease_namespace = self.lease_namespace.clone();
                f.lease_duration = d(self.lease_duration);
                f.renew_deadline = d(self.renew_deadline);
                f.retry_period = d(self.retry_period);
            }
        }
        f
    }

    /// Resolves the `election:` block (`None` when absent) against the legacy
    /// `leader_election` flag. `leader_election_key` is the flag's key as written.
    pub(crate) fn resolve(
        file: &Path,
        block: Option<Node>,
        leader_election: bool,
        leader_election_key: &str,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<Self, ConfigError> {
        let mut cfg = ElectionConfig::default();
        let Some(block) = block else {
            if leader_election {
                cfg.backend = ElectionBackend::Streams;
            }
            return Ok(cfg);
        };
        let sec = Section::new(file, "election.", block, ElectionFile::KEYS, warnings)?;

        // The first error wins and warnings come out in this order: the
        // backend and mode first, as everything else depends on them.
        cfg.backend = backend(&sec)?;
        if leader_election && cfg.backend == ElectionBackend::None {
            return Err(sec.error(
                "backend",
                format!("none contradicts {leader_election_key}: true; remove one of them"),
            ));
        }
        cfg.mode = mode(&sec)?;
        if cfg.mode == ElectionMode::Shards && cfg.backend == ElectionBackend::None {
            return Err(sec.error(
                "mode",
                "shards needs a membership backend: streams or lease",
            ));
        }
        cfg.shard_keys(&sec, warnings)?;
        cfg.warn_unused(&sec, warnings);
        if cfg.backend == ElectionBackend::Streams {
            cfg.streams(&sec)?;
        }
        if cfg.backend == ElectionBackend::Lease || cfg.sharded() {
            cfg.timings(&sec)?;
        }
        if cfg.backend == ElectionBackend::Lease {
            cfg.lease(&sec)?;
        }
        Ok(cfg)
    }

    /// `signing_key` and `verify_keys`: the key is required in mode shards,
    /// and both are only warned about in mode leader. Verify keys must parse
    /// either way.
    fn shard_keys(
        &mut self,
        sec: &Section,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<(), ConfigError> {
        let signing_key = sec
            .string("signing_key")?
            .filter(|s| !s.trim().is_empty())
            .map(std::path::PathBuf::from);
        match (self.sharded(), signing_key) {
            (true, None) => {
                return Err(sec.error(
                    "signing_key",
                    "required in mode shards: the ed25519 seed file the replicas seal their membership with (make one with `openssl rand -hex 32 > signing.seed`; records.signing_key may be the same file); without it anyone who may publish on the membership subject could remove a working member or add made-up ones",
                ))
            }
            (true, Some(k)) => self.signing_key = Some(k),
            (false, Some(_)) => warnings.push(sec.warning("signing_key", "ignored in mode leader")),
            (false, None) => {}
        }
        let verify_keys = sec.string_list("verify_keys")?.unwrap_or_default();
        for (i, k) in verify_keys.iter().enumerate() {
            if choria_wire::security::parse_public_key_hex(k).is_err() {
                return Err(sec.item_error(
                    "verify_keys",
                    i,
                    format!(
                        "not an ed25519 public key (64 hex characters; {} given)",
                        k.chars().count()
                    ),
                ));
            }
        }
        if self.sharded() {
            self.verify_keys = verify_keys;
        } else if sec.is_set("verify_keys") {
            warnings.push(sec.warning("verify_keys", "ignored in mode leader"));
        }
        Ok(())
    }

    /// Warns about each key set that the backend (in this mode) does not use.
    fn warn_unused(&self, sec: &Section, warnings: &mut Vec<ConfigWarning>) {
        let unused: &[&str] = match (self.mode, self.backend) {
            (_, ElectionBackend::None) => ElectionFile::KEYS,
            (ElectionMode::Shards, ElectionBackend::Streams) => SHARDED_STREAMS_UNUSED,
            (_, ElectionBackend::Streams) => LEASE_KEYS,
            (_, ElectionBackend::Lease) => STREAMS_KEYS,
        };
        for key in unused
            .iter()
            .filter(|k| !matches!(**k, "backend" | "mode" | "signing_key" | "verify_keys"))
        {
            if sec.is_set(key) {
                warnings.push(sec.warning(
                    key,
                    format!(
                        "ignored with backend {}{}",
                        self.backend.as_str(),
                        if self.mode == ElectionMode::Shards {
                            " in mode shards"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
    }

    /// `bucket`, `name`, `api_prefix`, `create_bucket` and `bucket_ttl`.
    fn streams(&mut self, sec: &Section) -> Result<(), ConfigError> {
        if let Some(bucket) = valid_string(
            sec,
            "bucket",
            is_bucket_name,
            "bucket name (letters, digits, _ and -)",
        )? {
            self.bucket = bucket;
        }
        if let Some(name) = valid_string(
            sec,
            "name",
            is_kv_key,
            "key (letters, digits and -/_=., not starting or ending with .)",
        )? {
            self.name = name;
        }
        if let Some(prefix) = valid_string(sec, "api_prefix", is_subject_prefix, "subject prefix")?
        {
            self.api_prefix = strip_trailing_dot(&prefix).to_string();
        }
        self.create_bucket = sec.bool("create_bucket")?.unwrap_or(false);
        if let Some((raw, d)) = sec.duration("bucket_ttl")? {
            // Go refuses buckets whose TTL is outside 4 s..1 h.
            if d < Duration::from_secs(4) || d > Duration::from_secs(3600) {
                return Err(sec.error("bucket_ttl", format!("{raw:?} must be between 4s and 1h")));
            }
            self.bucket_ttl = d;
        }
        self.replicas = crate::day_two::replicas(sec, "replicas")?;
        Ok(())
    }

    /// `lease_duration`, `renew_deadline`, `retry_period` and their rules.
    fn timings(&mut self, sec: &Section) -> Result<(), ConfigError> {
        for (key, slot) in [
            ("lease_duration", &mut self.lease_duration),
            ("renew_deadline", &mut self.renew_deadline),
            ("retry_period", &mut self.retry_period),
        ] {
            if let Some((raw, d)) = sec.duration(key)? {
                if d.is_zero() {
                    return Err(sec.error(key, format!("{raw:?} must be greater than zero")));
                }
                *slot = d;
            }
        }
        // client-go's rule: LeaseDuration > RenewDeadline > 1.2 × RetryPeriod.
        if self.lease_duration <= self.renew_deadline {
            return Err(sec.error(
                "lease_duration",
                format!(
                    "{} must be longer than renew_deadline ({})",
                    format_duration(self.lease_duration),
                    format_duration(self.renew_deadline)
                ),
            ));
        }
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return Err(sec.error(
                "renew_deadline",
                format!(
                    "{} must be longer than 1.2 × retry_period ({})",
                    format_duration(self.renew_deadline),
                    format_duration(self.retry_period)
                ),
            ));
        }
        Ok(())
    }

    /// `lease_name` and `lease_namespace` (the timings are `timings`).
    fn lease(&mut self, sec: &Section) -> Result<(), ConfigError> {
        if let Some(name) = valid_string(
            sec,
            "lease_name",
            is_dns_subdomain,
            "Kubernetes object name (lower case letters, digits, - and ., at most 253 characters, starting and ending with a letter or digit)",
        )? {
            self.lease_name = name;
        }
        self.lease_namespace = valid_string(
            sec,
            "lease_namespace",
            is_dns_label,
            "namespace (lower case letters, digits and -, at most 63 characters)",
        )?;
        Ok(())
    }
}

/// `backend`: required in a block; case-insensitive.
fn backend(sec: &Section) -> Result<ElectionBackend, ConfigError> {
    let Some(b) = sec.string("backend")? else {
        return Err(sec.error(
            "backend",
            "required when an election block is present: none, streams or lease",
        ));
    };
    match b.to_ascii_lowercase().as_str() {
        "none" => Ok(ElectionBackend::None),
        "streams" => Ok(ElectionBackend::Streams),
        "lease" => Ok(ElectionBackend::Lease),
        _ => Err(sec.error(
            "backend",
            format!("{b:?} is not a known backend; use none, streams or lease"),
        )),
    }
}

/// `mode`: leader when unset; case-insensitive.
fn mode(sec: &Section) -> Result<ElectionMode, ConfigError> {
    match sec.string("mode")?.map(|m| m.to_ascii_lowercase()) {
        None => Ok(ElectionMode::Leader),
        Some(m) if m == "leader" => Ok(ElectionMode::Leader),
        Some(m) if m == "shards" => Ok(ElectionMode::Shards),
        Some(m) => Err(sec.error(
            "mode",
            format!("{m:?} is not a known mode; use leader or shards"),
        )),
    }
}

/// The string `key`, if set, when `valid` accepts it; otherwise an error
/// saying the value "is not a valid {what}".
fn valid_string(
    sec: &Section,
    key: &str,
    valid: fn(&str) -> bool,
    what: &str,
) -> Result<Option<String>, ConfigError> {
    match sec.string(key)? {
        Some(v) if !valid(&v) => Err(sec.error(key, format!("{v:?} is not a valid {what}"))),
        v => Ok(v),
    }
}

fn is_bucket_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn is_kv_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-/_=.".contains(c))
        && !s.starts_with('.')
        && !s.ends_with('.')
}

fn strip_trailing_dot(prefix: &str) -> &str {
    prefix.strip_suffix('.').unwrap_or(prefix)
}

/// A subject prefix, one trailing dot allowed; empty means none.
fn is_subject_prefix(prefix: &str) -> bool {
    let p = strip_trailing_dot(prefix);
    p.is_empty()
        || p.split('.')
            .all(|t| !t.is_empty() && !t.chars().any(|c| c.is_whitespace() || c == '*' || c == '>'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(
        yaml: &str,
        leader_election: bool,
    ) -> Result<(ElectionConfig, Vec<ConfigWarning>), ConfigError> {
        let mut w = Vec::new();
        let block = if yaml.is_empty() {
            None
        } else {
            Some(Node::parse(yaml).unwrap())
        };
        ElectionConfig::resolve(
            Path::new("p.yaml"),
            block,
            leader_election,
            "leader_election",
            &mut w,
        )
        .map(|c| (c, w))
    }

    #[test]
    fn legacy_flag() {
        assert_eq!(resolve("", false).unwrap().0.backend, ElectionBackend::None);
        let (c, w) = resolve("", true).unwrap();
        assert_eq!(c.backend, ElectionBackend::Streams);
        assert_eq!(c.bucket, "CHORIA_LEADER_ELECTION");
        assert_eq!(c.name, "provisioner");
        assert_eq!(c.api_prefix, "choria.streams");
        assert!(c.enabled());
        assert!(w.is_empty());
    }

    #[test]
    fn streams_block() {
        let (c, _) = resolve(
            "backend: streams\nbucket: OTHER\nname: prov-2\napi_prefix: 'js.'\n",
            false,
        )
        .unwrap();
        assert_eq!(c.backend, ElectionBackend::Streams);
        assert_eq!((c.bucket.as_str(), c.name.as_str()), ("OTHER", "prov-2"));
        assert_eq!(c.api_prefix, "js");
        let (c, _) = resolve("backend: streams\napi_prefix: ''\n", true).unwrap();
        assert_eq!(c.api_prefix, "");
    }

    #[test]
    fn lease_block_and_defaults() {
        let (c, w) = resolve("backend: lease\n", false).unwrap();
        assert_eq!(c.backend, ElectionBackend::Lease);
        assert_eq!(c.lease_name, "choria-provisioner");
        assert_eq!(c.lease_namespace, None);
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert!(w.is_empty());
        let (c, _) = resolve(
            "backend: lease\nlease_name: prov\nlease_namespace: choria\nlease_duration: 1m\nrenew_deadline: 30s\nretry_period: 5s\n",
            true,
        )
        .unwrap();
        assert_eq!(c.lease_name, "prov");
        assert_eq!(c.lease_namespace.as_deref(), Some("choria"));
        assert_eq!(c.lease_duration, Duration::from_secs(60));
    }

    #[test]
    fn errors() {
        let e = |y: &str, le: bool| resolve(y, le).unwrap_err().to_string();
        assert_eq!(
            e("bucket: X\n", false),
            "p.yaml: election.backend: required when an election block is present: none, streams or lease"
        );
        assert!(e("backend: zookeeper\n", false).contains("election.backend: \"zookeeper\""));
        assert!(e("backend: none\n", true).contains("contradicts leader_election: true"));
        assert!(e("backend: lease\nlease_name: Bad_Name\n", false).contains("election.lease_name:"));
        assert!(e("backend: lease\nlease_namespace: a.b\n", false)
            .contains("election.lease_namespace:"));
        assert!(e("backend: lease\nrenew_deadline: 20s\n", false)
            .contains("election.lease_duration: 15s must be longer than renew_deadline (20s)"));
        assert!(e("backend: lease\nretry_period: 9s\n", false)
            .contains("election.renew_deadline: 10s must be longer than 1.2 × retry_period (9s)"));
        assert!(e("backend: lease\nretry_period: 0s\n", false).contains("greater than zero"));
        assert!(e("backend: lease\nretry_period: 2\n", false).contains("election.retry_period:"));
        assert!(e("backend: streams\nbucket: 'a.b'\n", false).contains("election.bucket:"));
        assert!(e("backend: streams\nname: '.x'\n", false).contains("election.name:"));
        assert!(e("backend: streams\napi_prefix: 'a..b'\n", false).contains("election.api_prefix:"));
        assert!(e("[1]\n", false).contains("election: expected a mapping"));
    }

    #[test]
    fn shards_mode_takes_the_membership_timings_for_both_backends() {
        let (c, w) = resolve(
            "mode: shards\nbackend: streams\nlease_duration: 6s\nrenew_deadline: 4s\nretry_period: 1s\nbucket: X\nsigning_key: /k\n",
            false,
        )
        .unwrap();
        assert!(c.sharded());
        assert_eq!(c.mode, ElectionMode::Shards);
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period),
            (
                Duration::from_secs(6),
                Duration::from_secs(4),
                Duration::from_secs(1)
            )
        );
        let w: Vec<String> = w.iter().map(|w| w.to_string()).collect();
        assert_eq!(
            w,
            ["p.yaml: election.bucket: ignored with backend streams in mode shards"]
        );
        let (c, _) = resolve("mode: Shards\nbackend: lease\nsigning_key: /k\n", false).unwrap();
        assert!(c.sharded());
        assert_eq!(c.signing_key.as_deref(), Some(Path::new("/k")));
        assert!(resolve("mode: shards\nbackend: lease\n", false)
            .unwrap_err()
            .to_string()
            .contains("election.signing_key: required in mode shards"));
        let (_, w) = resolve("backend: lease\nsigning_key: /k\n", false).unwrap();
        assert!(w[0]
            .to_string()
            .contains("election.signing_key: ignored in mode leader"));
        let (c, _) = resolve("backend: lease\n", false).unwrap();
        assert_eq!(c.mode, ElectionMode::Leader);
        assert!(!c.sharded());
        let e = |y: &str| resolve(y, false).unwrap_err().to_string();
        assert!(e("mode: shards\nbackend: none\n")
            .contains("election.mode: shards needs a membership backend"));
        assert!(e("mode: herd\nbackend: lease\n")
            .contains("election.mode: \"herd\" is not a known mode"));
        assert!(
            e("mode: shards\nbackend: streams\nrenew_deadline: 20s\nsigning_key: /k\n")
                .contains("must be longer than renew_deadline")
        );
        // The block it writes reads back the same.
        let file = c.to_file();
        assert_eq!(file.mode, None, "leader is the default and is not written");
    }

    #[test]
    fn keys_for_the_other_backend_warn() {
        let (_, w) = resolve("backend: streams\nlease_name: x\nbogus: 1\n", false).unwrap();
        let w: Vec<String> = w.iter().map(|w| w.to_string()).collect();
        assert!(
            w.contains(&"p.yaml: election.lease_name: ignored with backend streams".to_string())
        );
        assert!(w
            .iter()
            .any(|m| m.starts_with("p.yaml: election.bogus: unknown setting")));
        let (_, w) = resolve("backend: none\nbucket: x\n", false).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(
            w[0].to_string(),
            "p.yaml: election.bucket: ignored with backend none"
        );
    }
}
