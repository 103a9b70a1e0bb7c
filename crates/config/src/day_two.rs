//! `records:` and `renewal:` (ours): a record of every provisioning in a
//! JetStream KV bucket, and credentials renewed before they expire.
//!
//! ```yaml
//! records:
//!   url: nats://broker.example.net:4222   # a JetStream the provisioner may use
//!   bucket: CHORIA_PROVISIONER_RECORDS
//!   history: 5
//!   user: provisioner-records
//!   password_file: /etc/choria-provisioner/records.password
//!   signing_key: /etc/choria-provisioner/records.seed   # openssl rand -hex 32
//! renewal:
//!   before: 20%            # or a duration such as 30d
//!   jitter: 1h
//!   rate: 100              # renewals per minute at most
//!   choria_config: /etc/choria-provisioner/renewal.cfg   # a client of the nodes' collective
//! ```
//!
//! The provisioning account of a stock Choria broker has no KV access, so
//! records are written through a connection of their own.

use super::duration::format_duration;
use super::schema::{RecordsFile, RenewalFile};
use super::yaml::{Node, Section};
use super::{ConfigError, ConfigWarning, Secret};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The bucket records go to when `records.bucket` is unset.
pub const DEFAULT_RECORDS_BUCKET: &str = "CHORIA_PROVISIONER_RECORDS";
/// Revisions kept per node when `records.history` is unset.
pub const DEFAULT_RECORDS_HISTORY: u8 = 5;
/// Renewals per minute at most when `renewal.rate` is unset.
pub const DEFAULT_RENEWAL_RATE: u32 = 100;
/// How long a node has to come back through provisioning after a
/// `reprovision` before it is asked again.
pub const DEFAULT_RENEWAL_RETRY: Duration = Duration::from_secs(600);

/// `records:`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordsConfig {
    /// NATS URLs of the JetStream holding the bucket.
    pub urls: Vec<String>,
    pub bucket: String,
    pub history: u8,
    /// Create the bucket (with `history`) when it is missing.
    pub create_bucket: bool,
    /// Servers holding a copy of each bucket we create.
    pub replicas: u8,
    pub user: Option<String>,
    pub password: Option<Secret>,
    pub password_file: Option<PathBuf>,
    pub token: Option<Secret>,
    pub token_file: Option<PathBuf>,
    /// A NATS `.creds` file (user JWT and seed).
    pub credentials_file: Option<PathBuf>,
    /// Verify the server's TLS certificate with this CA.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate and its key for mutual TLS.
    pub tls_client: Option<(PathBuf, PathBuf)>,
    /// The ed25519 seed file records are sealed with.
    pub signing_key: PathBuf,
    /// Public keys (hex) whose seals are trusted besides `signing_key`'s.
    pub verify_keys: Vec<String>,
    /// Refuse to provision an identity that still holds valid credentials
    /// on record which renewal did not ask it to replace (otherwise it is
    /// flagged and provisioned).
    pub exclusive: bool,
}

/// When a credential is due for renewal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Before {
    /// This long before it expires.
    Duration(Duration),
    /// When this share of its lifetime (0 < share < 1) is left.
    Share(f64),
}

impl Before {
    /// `renewal.before` as written: a positive Choria duration, or a share
    /// above 0% and below 100% written as a decimal number and `%` (`20%`,
    /// `12.5%`). The CRD's rule for `spec.renewal.before` accepts the same
    /// (`choria_k8s::crd::validation`; only the spaces around a duration,
    /// which Choria durations allow, it does not): a share of 100% would
    /// make every credential due as soon as it is issued.
    pub fn parse(raw: &str) -> Result<Before, String> {
        if let Some(number) = raw.strip_suffix('%') {
            return match decimal(number) {
                Some(v) if v > 0.0 && v < 100.0 => Ok(Before::Share(v / 100.0)),
                _ => Err(format!(
                    "{raw:?} is not a share above 0% and below 100% written as a decimal number, such as 20% (100% would renew every credential as soon as it is issued)"
                )),
            };
        }
        match super::duration::parse_duration(raw) {
            Ok(d) if !d.is_zero() => Ok(Before::Duration(d)),
            Ok(_) => Err(format!("{raw:?} is not a positive duration")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// How long before `expires` a credential issued at `issued` is due.
    pub fn lead(&self, issued: i64, expires: i64) -> Duration {
        match *self {
            Before::Duration(d) => d,
            Before::Share(share) => {
                let lifetime = expires.saturating_sub(issued).max(0) as f64;
                Duration::from_secs_f64(lifetime * share)
            }
        }
    }

    fn text(&self) -> String {
        match self {
            Before::Duration(d) => format_duration(*d),
            Before::Share(s) => format!("{}%", s * 100.0),
        }
    }
}

/// `renewal:`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct RenewalConfig {
    pub before: Before,
    /// Each node's due time moves earlier by a stable share of this
    /// (derived from its name), so a fleet provisioned at once is not
    /// renewed at once.
    pub jitter: Duration,
    /// Renewals sent per minute at most.
    pub rate: u32,
    /// The Choria client configuration that reaches provisioned nodes.
    pub choria_config: PathBuf,
    /// The collective `reprovision` is sent in when a record names none.
    pub collective: String,
    /// How long a node may take to come back through provisioning before
    /// it is asked again.
    pub retry: Duration,
}

impl RecordsConfig {
    pub fn to_file(&self) -> RecordsFile {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        RecordsFile {
            url: Some(self.urls.join(",")),
            bucket: Some(self.bucket.clone()),
            history: Some(i64::from(self.history)),
            create_bucket: Some(self.create_bucket),
            replicas: Some(i64::from(self.replicas)),
            user: self.user.clone(),
            password: None,
            password_file: path(&self.password_file),
            token: None,
            token_file: path(&self.token_file),
            credentials_file: path(&self.credentials_file),
            tls_ca: path(&self.tls_ca),
            tls_cert: self
                .tls_client
                .as_ref()
                .map(|(c, _)| c.display().to_string()),
            tls_key: self
                .tls_client
                .as_ref()
                .map(|(_, k)| k.display().to_string()),
            signing_key: Some(self.signing_key.display().to_string()),
            verify_keys: (!self.verify_keys.is_empty()).then(|| self.verify_keys.clone()),
            exclusive: Some(self.exclusive),
        }
    }

    /// `key: value` lines for `run --check` (secrets as set or not).
    pub fn effective(&self) -> String {
        format!(
            "{} bucket {} history {} replicas {}{}{}",
            self.urls.join(","),
            self.bucket,
            self.history,
            self.replicas,
            self.user
                .as_ref()
                .map(|u| format!(", user {u}"))
                .unwrap_or_default(),
            if self.credentials_file.is_some() {
                ", credentials file"
            } else {
                ""
            }
        ) + &format!(
            ", sealed with {}{}",
            self.signing_key.display(),
            match self.verify_keys.len() {
                0 => String::new(),
                n => format!(" (and {n} more trusted)"),
            }
        ) + if self.exclusive { ", exclusive" } else { "" }
    }
}

impl RenewalConfig {
    pub fn to_file(&self) -> RenewalFile {
        RenewalFile {
            before: Some(self.before.text()),
            jitter: Some(format_duration(self.jitter)),
            rate: Some(i64::from(self.rate)),
            choria_config: Some(self.choria_config.display().to_string()),
            collective: Some(self.collective.clone()),
            retry: Some(format_duration(self.retry)),
        }
    }

    pub fn effective(&self) -> String {
        format!(
            "{} before expiry, jitter {}, at most {}/min, through {} (collective {}), retry after {}",
            self.before.text(),
            format_duration(self.jitter),
            self.rate,
            self.choria_config.display(),
            self.collective,
            format_duration(self.retry)
        )
    }
}

fn section<'a>(
    file: &'a Path,
    sec: &Section,
    key: &str,
    keys: &'static [&'static str],
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<Section<'a>>, ConfigError> {
    if !sec.is_set(key) {
        return Ok(None);
    }
    Section::new(
        file,
        &format!("{}.", sec.key(key)),
        sec.node(key).cloned().unwrap_or(Node::Null),
        keys,
        w,
    )
    .map(Some)
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.trim().is_empty())
}

/// `records:`.
pub(crate) fn records(
    file: &Path,
    sec: &Section,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<RecordsConfig>, ConfigError> {
    let Some(r) = section(file, sec, "records", RecordsFile::KEYS, w)? else {
        return Ok(None);
    };
    let urls = records_urls(&r)?;
    let bucket = records_bucket(&r)?;
    let history = match r.int("history")? {
        None => DEFAULT_RECORDS_HISTORY,
        Some(h) if (1..=64).contains(&h) => h as u8,
        Some(h) => return Err(r.error("history", format!("{h} is not between 1 and 64"))),
    };
    let replicas = replicas(&r, "replicas")?;
    let path = |key: &str| -> Result<Option<PathBuf>, ConfigError> {
        Ok(non_empty(r.string(key)?).map(PathBuf::from))
    };
    let secret = |key: &str| -> Result<Option<Secret>, ConfigError> {
        Ok(non_empty(r.string(key)?).map(Secret::new))
    };
    let cfg = RecordsConfig {
        urls,
        bucket,
        history,
        create_bucket: r.bool("create_bucket")?.unwrap_or(true),
        replicas,
        user: non_empty(r.string("user")?),
        password: secret("password")?,
        password_file: path("password_file")?,
        token: secret("token")?,
        token_file: path("token_file")?,
        credentials_file: path("credentials_file")?,
        tls_ca: path("tls_ca")?,
        tls_client: match (path("tls_cert")?, path("tls_key")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(r.error("tls_key", "tls_cert needs its key: set tls_key"))
            }
            (None, Some(_)) => {
                return Err(r.error("tls_cert", "tls_key without tls_cert: set both or neither"))
            }
        },
        signing_key: match path("signing_key")? {
            Some(p) => p,
            None => return Err(r.error(
                "signing_key",
                "required: the ed25519 seed file records are sealed with, shared by the Provisioner's replicas (make one with `openssl rand -hex 32 > records.seed`); anyone who may write the bucket could otherwise write what renewal acts on",
            )),
        },
        verify_keys: r.string_list("verify_keys")?.unwrap_or_default(),
        exclusive: r.bool("exclusive")?.unwrap_or(false),
    };
    check_records_keys(&r, &cfg)?;
    Ok(Some(cfg))
}

/// `records.url`: required, one URL or several separated by commas.
fn records_urls(r: &Section) -> Result<Vec<String>, ConfigError> {
    let Some(url) = non_empty(r.string("url")?) else {
        return Err(r.error(
            "url",
            "required: the NATS URL of a JetStream the records may be written to (the provisioning account of a Choria broker has no KV access)",
        ));
    };
    let urls: Vec<String> = url.split(',').map(|u| u.trim().to_string()).collect();
    if let Some(bad) = urls
        .iter()
        .find(|u| u.is_empty() || u.contains(char::is_whitespace))
    {
        return Err(r.error("url", format!("{bad:?} is not a URL")));
    }
    Ok(urls)
}

/// `records.bucket`, or the default bucket: a name JetStream takes.
fn records_bucket(r: &Section) -> Result<String, ConfigError> {
    let bucket = non_empty(r.string("bucket")?).unwrap_or_else(|| DEFAULT_RECORDS_BUCKET.into());
    if !bucket
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(r.error(
            "bucket",
            format!("{bucket:?} is not a bucket name (letters, digits, _ and -)"),
        ));
    }
    Ok(bucket)
}

/// What only the whole `records:` section shows wrong: verify keys that are
/// not keys, and a secret given both inline and as a file.
fn check_records_keys(r: &Section, cfg: &RecordsConfig) -> Result<(), ConfigError> {
    for (i, k) in cfg.verify_keys.iter().enumerate() {
        if choria_wire::security::parse_public_key_hex(k).is_err() {
            // Not echoed: a seed pasted here by mistake is a secret.
            return Err(r.item_error(
                "verify_keys",
                i,
                format!(
                    "not an ed25519 public key (64 hex characters; {} given)",
                    k.chars().count()
                ),
            ));
        }
    }
    if cfg.password.is_some() && cfg.password_file.is_some() {
        return Err(r.error("password_file", "set password or password_file, not both"));
    }
    if cfg.token.is_some() && cfg.token_file.is_some() {
        return Err(r.error("token_file", "set token or token_file, not both"));
    }
    Ok(())
}

/// `renewal:`; needs `records:` (the schedule is read from them).
pub(crate) fn renewal(
    file: &Path,
    sec: &Section,
    records: Option<&RecordsConfig>,
    w: &mut Vec<ConfigWarning>,
) -> Result<Option<RenewalConfig>, ConfigError> {
    let Some(r) = section(file, sec, "renewal", RenewalFile::KEYS, w)? else {
        return Ok(None);
    };
    if records.is_none() {
        return Err(r.error(
            "before",
            "renewal needs records: it renews what the records say is expiring",
        ));
    }
    let Some(raw) = non_empty(r.string("before")?) else {
        return Err(r.error(
            "before",
            "required: how long before expiry (a duration such as 30d) or which share of the lifetime left (such as 20%)",
        ));
    };
    let before = Before::parse(&raw).map_err(|e| r.error("before", e))?;
    let jitter = match r.duration("jitter")? {
        Some((raw, d)) if !raw.trim().is_empty() => d,
        _ => Duration::ZERO,
    };
    let rate = match r.int("rate")? {
        None => DEFAULT_RENEWAL_RATE,
        Some(n) if (1..=100_000).contains(&n) => n as u32,
        Some(n) => return Err(r.error("rate", format!("{n} is not between 1 and 100000"))),
    };
    let Some(choria_config) = non_empty(r.string("choria_config")?) else {
        return Err(r.error(
            "choria_config",
            "required: a Choria client configuration that reaches the provisioned nodes in their collective (with a caller their policies let call choria_provision#reprovision)",
        ));
    };
    let collective = non_empty(r.string("collective")?).unwrap_or_else(|| "mcollective".into());
    if choria_wire::identity::validate(&collective).is_err() || collective.contains('.') {
        return Err(r.error(
            "collective",
            format!("{collective:?} is not a collective name"),
        ));
    }
    let retry = match r.duration("retry")? {
        Some((raw, d)) if !raw.trim().is_empty() && !d.is_zero() => d,
        _ => DEFAULT_RENEWAL_RETRY,
    };
    Ok(Some(RenewalConfig {
        before,
        jitter,
        rate,
        choria_config: PathBuf::from(choria_config),
        collective,
        retry,
    }))
}

/// A number written as digits with an optional decimal point (`20`, `12.5`,
/// `.5`, `5.`): no sign, exponent, space or name such as `inf`.
fn decimal(s: &str) -> Option<f64> {
    let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !digits(whole) || !digits(fraction) {
        return None;
    }
    s.parse().ok()
}

/// A lifetime the configuration issues, and the setting that says so.
pub struct Lifetime {
    pub setting: &'static str,
    pub lifetime: Duration,
}

/// Refuses a `renewal` whose lead (`before` plus `jitter`) is not shorter
/// than `shortest`, the shortest lifetime the configuration issues: every
/// node would be due as soon as it is provisioned, and asked to reprovision
/// again and again.
pub(crate) fn check_lead(
    file: &Path,
    renewal: &RenewalConfig,
    shortest: Option<Lifetime>,
) -> Result<(), ConfigError> {
    let Some(Lifetime { setting, lifetime }) = shortest else {
        return Ok(());
    };
    let issued = 0i64;
    let expires = lifetime.as_secs() as i64;
    let lead = renewal.before.lead(issued, expires) + renewal.jitter;
    if lead < lifetime {
        return Ok(());
    }
    let key = match renewal.before {
        Before::Share(_) => "renewal.jitter",
        Before::Duration(_) => "renewal.before",
    };
    Err(ConfigError::invalid(
        file,
        None,
        key,
        format!(
            "{} before expiry plus a jitter of {} is not shorter than the {} credentials live ({setting}): every node would be asked to renew as soon as it is provisioned",
            renewal.before.text(),
            format_duration(renewal.jitter),
            format_duration(lifetime),
        ),
    ))
}

/// Servers that hold a copy of a stream we create: what JetStream allows.
pub const MAX_REPLICAS: u8 = 5;

/// `key` as a number of replicas (1 when unset).
pub(crate) fn replicas(sec: &Section, key: &str) -> Result<u8, ConfigError> {
    match sec.int(key)? {
        None => Ok(1),
        Some(n) if (1..=i64::from(MAX_REPLICAS)).contains(&n) => Ok(n as u8),
        Some(n) => Err(sec.error(
            key,
            format!("{n} is not between 1 and {MAX_REPLICAS} (servers holding a copy)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_is_a_positive_duration_or_a_share_below_100_percent() {
        let share = |raw: &str| match Before::parse(raw) {
            Ok(Before::Share(s)) => s,
            other => panic!("{raw}: {other:?}"),
        };
        assert_eq!(share("20%"), 0.2);
        assert_eq!(share("12.5%"), 0.125);
        assert_eq!(share(".5%"), 0.005);
        assert!((share("99.9%") - 0.999).abs() < 1e-12);
        assert_eq!(
            Before::parse("30d").unwrap(),
            Before::Duration(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(
            Before::parse("1h30m").unwrap(),
            Before::Duration(Duration::from_secs(5400))
        );
        // What the CRD's rule refuses too.
        for raw in [
            "100%", "0%", "150%", "%", "-5%", "+20%", "1e1%", "20 %", "inf%", "NaN%", "20%%",
        ] {
            let e = Before::parse(raw).unwrap_err();
            assert!(e.contains("above 0% and below 100%"), "{raw}: {e}");
        }
        for raw in ["0s", "0d", "0.01d"] {
            let e = Before::parse(raw).unwrap_err();
            assert!(e.contains("not a positive duration"), "{raw}: {e}");
        }
        assert!(Before::parse("soon").is_err());
        assert!(Before::parse("20").is_err(), "a number without a unit or %");
    }

    #[test]
    fn before_as_a_share_follows_the_lifetime() {
        let b = Before::Share(0.2);
        assert_eq!(b.lead(0, 1000), Duration::from_secs(200));
        assert_eq!(
            Before::Duration(Duration::from_secs(5)).lead(0, 1000),
            Duration::from_secs(5)
        );
        assert_eq!(
            b.lead(1000, 0),
            Duration::ZERO,
            "a broken lifetime leads by nothing"
        );
    }

    fn renewal(before: Before, jitter: u64) -> RenewalConfig {
        RenewalConfig {
            before,
            jitter: Duration::from_secs(jitter),
            rate: 100,
            choria_config: "c".into(),
            collective: "mcollective".into(),
            retry: DEFAULT_RENEWAL_RETRY,
        }
    }

    #[test]
    fn a_lead_not_shorter_than_the_shortest_lifetime_is_refused() {
        let day = Duration::from_secs(86_400);
        let week = || {
            Some(Lifetime {
                setting: "server_jwt_validity",
                lifetime: 7 * day,
            })
        };
        let f = Path::new("p.yaml");
        assert!(check_lead(f, &renewal(Before::Duration(day), 3600), week()).is_ok());
        assert!(check_lead(f, &renewal(Before::Duration(30 * day), 0), None).is_ok());
        let e = check_lead(f, &renewal(Before::Duration(7 * day), 0), week())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("renewal.before") && e.contains("7d") && e.contains("server_jwt_validity"),
            "{e}"
        );
        let e = check_lead(f, &renewal(Before::Duration(6 * day), 86_400), week())
            .unwrap_err()
            .to_string();
        assert!(e.contains("renewal.before"), "{e}");
        assert!(check_lead(f, &renewal(Before::Share(0.5), 3600), week()).is_ok());
        let e = check_lead(f, &renewal(Before::Share(0.5), 4 * 86_400), week())
            .unwrap_err()
            .to_string();
        assert!(e.contains("renewal.jitter"), "{e}");
    }
}
