//! A private SoftHSM2 token for tests of keys kept in a PKCS#11 token.
//!
//! SoftHSM reads `SOFTHSM2_CONF` once, at `C_Initialize`, and a process may
//! initialize a module only once: so there is one fixture per test binary,
//! made on first use (before any test loads the module) and shared. Its
//! token directory lives under the system temp directory, named by the
//! process id; a later run removes the directories of processes that are
//! gone (statics are never dropped, so nothing at exit would).
//!
//! Without SoftHSM (`softhsm2-util` and the module, by default Debian's
//! `/usr/lib/softhsm/libsofthsm2.so`, else `SOFTHSM2_MODULE`) a test fails
//! under CI and is skipped loudly without it, as the openssl checks are.

use super::not_run;
use crate::security::pkcs11::token_module;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::types::AuthPin;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Debian's path of the module; `SOFTHSM2_MODULE` overrides it.
pub const DEFAULT_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
/// The token with the test keys.
pub const TOKEN: &str = "choria-test";
/// A second token, never logged into but by the wrong-PIN test: login is
/// per token and process, so a wrong PIN on a token already logged in
/// would not be noticed.
pub const WRONG_PIN_TOKEN: &str = "choria-pin-test";
/// The user PIN of [`TOKEN`].
pub const USER_PIN: &str = "test-pin-1234";
/// The user PIN of [`WRONG_PIN_TOKEN`]: with a `+`, which a form decoder
/// would turn into a space.
pub const PLUS_PIN: &str = "pin+plus";
const SO_PIN: &str = "test-so-5678";
/// Labels (CKA_LABEL) of the key pairs in [`TOKEN`]; their CKA_IDs are 1,
/// 2 and 3.
pub const RSA_KEY: &str = "ca-rsa";
/// An ECDSA P-256 pair.
pub const P256_KEY: &str = "ca-p256";
/// An Ed25519 pair.
pub const ED25519_KEY: &str = "jwt-ed25519";
/// An Ed25519 pair imported from [`ED25519_SEED`] (CKA_ID 4): what the
/// token signs with it must be what `ed25519-dalek` signs with the seed.
pub const ED25519_SEED_KEY: &str = "jwt-ed25519-seed";
/// The seed of [`ED25519_SEED_KEY`].
pub const ED25519_SEED: [u8; 32] = *b"a known seed for the token test!";

/// What a `pkcs11:` URI may not hold unescaped.
const URI_ESCAPE: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'%')
    .add(b'&')
    .add(b';')
    .add(b'?')
    .add(b'#');

/// The shared SoftHSM token.
pub struct SoftHsm {
    module: PathBuf,
    /// Tests that reset the module or log the token out take it
    /// exclusively; the others share it.
    reset: RwLock<()>,
}

impl SoftHsm {
    /// The module's path.
    pub fn module(&self) -> &Path {
        &self.module
    }

    /// A URI for the key `object` in `token`, with the module and `pin`.
    pub fn uri_in(&self, token: &str, object: &str, pin: &str) -> String {
        let module = utf8_percent_encode(self.module.to_str().expect("UTF-8 path"), URI_ESCAPE);
        format!("pkcs11:token={token};object={object};type=private?module-path={module}&pin-value={pin}")
    }

    /// A URI for the key `object` in [`TOKEN`], with the right PIN.
    pub fn uri(&self, object: &str) -> String {
        self.uri_in(TOKEN, object, USER_PIN)
    }

    /// For tests that only use the token.
    pub fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.reset.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// For a test that disturbs everyone else's sessions.
    pub fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        self.reset.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The token, made on the first call; `None` (after saying why) when
/// SoftHSM is not installed and `CI` is not set.
pub fn softhsm() -> Option<&'static SoftHsm> {
    static HSM: OnceLock<Option<SoftHsm>> = OnceLock::new();
    let hsm = HSM.get_or_init(|| {
        let module = std::env::var_os("SOFTHSM2_MODULE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_MODULE));
        let util = Command::new("softhsm2-util").arg("--version").output();
        if !module.exists() || util.is_err() {
            return None;
        }
        Some(make(module))
    });
    if hsm.is_none() {
        // SOFTHSM2_MODULE names another module path when Debian's is not it.
        not_run("softhsm2", "the PKCS#11 key check");
    }
    hsm.as_ref()
}

fn make(module: PathBuf) -> SoftHsm {
    let dir = token_dir();
    let conf = dir.join("softhsm2.conf");
    std::fs::create_dir_all(dir.join("tokens")).unwrap();
    let text = format!(
        "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n",
        dir.join("tokens").display()
    );
    std::fs::write(&conf, text).unwrap();
    // Once, before the module is first initialized (below), which is when
    // SoftHSM reads it.
    std::env::set_var("SOFTHSM2_CONF", &conf);
    for (label, pin) in [(TOKEN, USER_PIN), (WRONG_PIN_TOKEN, PLUS_PIN)] {
        let out = Command::new("softhsm2-util")
            .args(["--init-token", "--free", "--label", label])
            .args(["--pin", pin, "--so-pin", SO_PIN])
            .output()
            .expect("softhsm2-util");
        assert!(
            out.status.success(),
            "softhsm2-util --init-token: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    generate_keys(&module);
    SoftHsm {
        module,
        reset: RwLock::new(()),
    }
}

/// `<tmp>/choria-rs-softhsm.<pid>`, emptied; directories of processes that
/// have ended are removed.
fn token_dir() -> PathBuf {
    const PREFIX: &str = "choria-rs-softhsm.";
    let tmp = std::env::temp_dir();
    for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix(PREFIX) {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tmp.join(format!("{PREFIX}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The key pairs in [`TOKEN`]: three made by the token itself, one
/// imported from a known seed.
fn generate_keys(module: &Path) {
    let module = token_module(module).expect("load SoftHSM");
    let ctx = module.context();
    let slot = ctx
        .get_slots_with_token()
        .unwrap()
        .into_iter()
        .find(|s| ctx.get_token_info(*s).is_ok_and(|t| t.label() == TOKEN))
        .expect("the test token");
    let session = ctx.open_rw_session(slot).unwrap();
    session
        .login(UserType::User, Some(&AuthPin::from(USER_PIN)))
        .unwrap();
    let rsa = [
        Attribute::ModulusBits(2048.into()),
        Attribute::PublicExponent(vec![1, 0, 1]),
    ];
    pair(&session, &Mechanism::RsaPkcsKeyPairGen, &rsa, RSA_KEY, 1);
    // DER of the OID prime256v1.
    let p256 = [Attribute::EcParams(
        b"\x06\x08\x2a\x86\x48\xce\x3d\x03\x01\x07".to_vec(),
    )];
    pair(&session, &Mechanism::EccKeyPairGen, &p256, P256_KEY, 2);
    // The curve by name, as pkcs11-tool asks SoftHSM for it.
    let ed = [Attribute::EcParams(b"\x13\x0cedwards25519".to_vec())];
    pair(
        &session,
        &Mechanism::EccEdwardsKeyPairGen,
        &ed,
        ED25519_KEY,
        3,
    );
    import_ed25519(&session, &ED25519_SEED, ED25519_SEED_KEY, 4);
}

/// Stores an Ed25519 pair from `seed` in the token, as `softhsm2-util
/// --import` stores a PKCS#8 key: CKA_VALUE is the seed, CKA_EC_POINT the
/// public key (as a DER OCTET STRING).
fn import_ed25519(session: &Session, seed: &[u8; 32], label: &str, id: u8) {
    let public = ed25519_dalek::SigningKey::from_bytes(seed).verifying_key();
    let common = [
        Attribute::Token(true),
        Attribute::Label(label.as_bytes().to_vec()),
        Attribute::Id(vec![id]),
        Attribute::KeyType(KeyType::EC_EDWARDS),
        // DER of the OID 1.3.101.112 (Ed25519).
        Attribute::EcParams(b"\x06\x03\x2b\x65\x70".to_vec()),
    ];
    let mut point = vec![0x04, 0x20];
    point.extend_from_slice(public.as_bytes());
    let mut public = common.to_vec();
    public.extend([
        Attribute::Class(ObjectClass::PUBLIC_KEY),
        Attribute::Verify(true),
        Attribute::EcPoint(point),
    ]);
    let mut private = common.to_vec();
    private.extend([
        Attribute::Class(ObjectClass::PRIVATE_KEY),
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Sign(true),
        Attribute::Value(seed.to_vec()),
    ]);
    for template in [public, private] {
        session
            .create_object(&template)
            .unwrap_or_else(|e| panic!("importing {label}: {e}"));
    }
}

fn pair(
    session: &Session,
    mechanism: &Mechanism,
    public_extra: &[Attribute],
    label: &str,
    id: u8,
) -> (ObjectHandle, ObjectHandle) {
    let common = [
        Attribute::Token(true),
        Attribute::Label(label.as_bytes().to_vec()),
        Attribute::Id(vec![id]),
    ];
    let mut public = common.to_vec();
    public.push(Attribute::Verify(true));
    public.extend_from_slice(public_extra);
    let mut private = common.to_vec();
    private.extend([
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Extractable(false),
        Attribute::Sign(true),
    ]);
    session
        .generate_key_pair(mechanism, &public, &private)
        .unwrap_or_else(|e| panic!("generating {label}: {e}"))
}
