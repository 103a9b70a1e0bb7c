//! The keys the provisioner verifies and signs with — `jwt_verify_cert`,
//! `jwt_signing_key`, `jwt_signing_token` — read once at start and read
//! again when their files change.
//!
//! The Go provisioner reads them for every node so that a rotated key takes
//! effect; doing that on the async path costs every node blocking file I/O
//! (and a slow disk stalls the workers). Here a background task looks at
//! the files' modification time and size every [`RELOAD_EVERY`], in the
//! blocking pool, and a node's sequence only clones an `Arc`.
//!
//! A `jwt_signing_key` in a PKCS#11 token is no file: it is opened once,
//! here, and kept (the token reconnects by itself when it was reset).

use choria_config::ca::KeyRef;
use choria_config::{ConfigError, ProvisionerConfig};
use choria_wire::security::tokens::{ClientIdClaims, TokenSigningKey, TokenVerifyKey};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the key files are looked at.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Modification time and size of a key file; `None` for a key given
/// inline, a setting that is not set, or a file that cannot be read.
type FileStamp = Option<(SystemTime, u64)>;

/// The chain-issuer token and its claims.
pub type SigningToken = Option<(String, ClientIdClaims)>;

/// A key that failed to load; shared by every node that needs it.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct KeyUnavailable(Arc<ConfigError>);

/// One key: where it comes from, how it is read, what was read last.
struct Watched<T> {
    path: Option<PathBuf>,
    load: fn(&ProvisionerConfig) -> Result<T, ConfigError>,
    current: RwLock<(FileStamp, Result<Arc<T>, KeyUnavailable>)>,
}

impl<T> Watched<T> {
    fn new(
        cfg: &ProvisionerConfig,
        path: Option<PathBuf>,
        load: fn(&ProvisionerConfig) -> Result<T, ConfigError>,
    ) -> Self {
        let stamp = stamp(path.as_ref());
        let value = read(cfg, load);
        Watched {
            path,
            load,
            current: RwLock::new((stamp, value)),
        }
    }

    fn get(&self) -> Result<Arc<T>, KeyUnavailable> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    /// Reads the key again when its file changed; blocking.
    fn refresh(&self, cfg: &ProvisionerConfig, setting: &str) {
        let Some(path) = &self.path else { return };
        let now = stamp(Some(path));
        let before = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
        if now == before {
            return;
        }
        let value = read(cfg, self.load);
        match &value {
            Ok(_) => info!(setting, file = %path.display(), "read the changed key file again"),
            Err(e) => warn!(setting, error = %e, "the changed key file cannot be used"),
        }
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (now, value);
    }
}

fn read<T>(
    cfg: &ProvisionerConfig,
    load: fn(&ProvisionerConfig) -> Result<T, ConfigError>,
) -> Result<Arc<T>, KeyUnavailable> {
    load(cfg)
        .map(Arc::new)
        .map_err(|e| KeyUnavailable(Arc::new(e)))
}

fn stamp(path: Option<&PathBuf>) -> FileStamp {
    let meta = std::fs::metadata(path?).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The three keys, each current.
pub struct Credentials {
    cfg: Arc<ProvisionerConfig>,
    verify: Watched<TokenVerifyKey>,
    signing: Watched<TokenSigningKey>,
    token: Watched<SigningToken>,
}

impl Credentials {
    /// Reads every configured key (blocking: at start-up).
    pub fn load(cfg: Arc<ProvisionerConfig>) -> Self {
        // jwt_verify_cert may be a hex key rather than a file: then there
        // is nothing to watch.
        let verify_file = cfg
            .jwt_verify_cert
            .as_deref()
            .map(PathBuf::from)
            .filter(|p| p.is_file());
        let signing_file = match &cfg.jwt_signing_key {
            Some(KeyRef::File(path)) => Some(path.clone()),
            Some(KeyRef::Pkcs11(_)) | None => None,
        };
        Credentials {
            verify: Watched::new(&cfg, verify_file, ProvisionerConfig::load_verify_key),
            signing: Watched::new(&cfg, signing_file, ProvisionerConfig::load_signing_key),
            token: Watched::new(
                &cfg,
                cfg.jwt_signing_token.clone(),
                ProvisionerConfig::load_signing_token,
            ),
            cfg,
        }
    }

    pub fn verify_key(&self) -> Result<Arc<TokenVerifyKey>, KeyUnavailable> {
        self.verify.get()
    }

    pub fn signing_key(&self) -> Result<Arc<TokenSigningKey>, KeyUnavailable> {
        self.signing.get()
    }

    pub fn signing_token(&self) -> Result<Arc<SigningToken>, KeyUnavailable> {
        self.token.get()
    }

    /// Reads changed key files again (blocking).
    pub fn refresh(&self) {
        self.verify.refresh(&self.cfg, "jwt_verify_cert");
        self.signing.refresh(&self.cfg, "jwt_signing_key");
        self.token.refresh(&self.cfg, "jwt_signing_token");
    }

    /// Refreshes every [`RELOAD_EVERY`] in the blocking pool until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let me = self.clone();
            let _ = tokio::task::spawn_blocking(move || me.refresh()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use choria_wire::security::ed25519::Ed25519KeyPair;

    fn touch_later(path: &std::path::Path) {
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(later)
            .unwrap();
    }

    #[test]
    fn a_key_is_read_once_and_again_only_when_its_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("verify.key");
        let (a, b) = (Ed25519KeyPair::generate(), Ed25519KeyPair::generate());
        std::fs::write(&path, a.public_hex()).unwrap();
        let cfg = ProvisionerConfig::parse(
            &format!(
                "helper: /bin/true\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                path.display()
            ),
            "p.yaml",
        )
        .unwrap();
        let keys = Credentials::load(Arc::new(cfg));
        let first = keys.verify_key().unwrap();
        // A new key in the file does not matter until a refresh sees it.
        std::fs::write(&path, b.public_hex()).unwrap();
        assert!(
            Arc::ptr_eq(&first, &keys.verify_key().unwrap()),
            "no I/O per call"
        );
        touch_later(&path);
        keys.refresh();
        let second = keys.verify_key().unwrap();
        assert_ne!(
            *first, *second,
            "a replaced key takes effect after a refresh"
        );
        keys.refresh();
        assert!(
            Arc::ptr_eq(&second, &keys.verify_key().unwrap()),
            "unchanged: not read again"
        );
        // A broken replacement is reported to every node that needs it.
        // (A different size: the stamp differs whatever the clock does.)
        std::fs::write(&path, "not a key").unwrap();
        keys.refresh();
        let e = keys.verify_key().unwrap_err().to_string();
        assert!(e.contains("jwt_verify_cert"), "{e}");
    }

    #[test]
    fn an_inline_key_or_an_unset_setting_is_not_watched() {
        let a = Ed25519KeyPair::generate();
        let cfg = ProvisionerConfig::parse(
            &format!(
                "helper: /bin/true\nfeatures:\n  jwt: true\njwt_verify_cert: {}\n",
                a.public_hex()
            ),
            "p.yaml",
        )
        .unwrap();
        let keys = Credentials::load(Arc::new(cfg));
        assert!(keys.verify_key().is_ok());
        assert!(keys
            .signing_key()
            .unwrap_err()
            .to_string()
            .contains("jwt_signing_key"));
        assert!(keys.signing_token().unwrap().is_none());
        keys.refresh();
    }

    #[test]
    fn a_key_in_a_token_is_opened_once_and_kept() {
        use choria_wire::testing::softhsm::{softhsm, ED25519_SEED_KEY, USER_PIN};
        let Some(hsm) = softhsm() else { return };
        let _shared = hsm.shared();
        let a = Ed25519KeyPair::generate();
        let cfg = ProvisionerConfig::parse(
            &format!(
                "helper: /bin/true\nfeatures:\n  ed25519: true\njwt_verify_cert: {}\njwt_signing_key: {}\n",
                a.public_hex(),
                hsm.uri(ED25519_SEED_KEY)
            ),
            "p.yaml",
        )
        .unwrap();
        let keys = Credentials::load(Arc::new(cfg));
        let key = keys.signing_key().unwrap();
        assert!(key.in_token(), "{key:?}");
        assert!(!format!("{key:?}").contains(USER_PIN));
        keys.refresh();
        assert!(
            Arc::ptr_eq(&key, &keys.signing_key().unwrap()),
            "not opened again"
        );
    }
}
