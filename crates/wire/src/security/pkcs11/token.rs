//! The connection to one key in a token: the module, loaded and
//! initialized once per process; a few logged-in sessions; and the policy
//! for a token or module that was reset under us.
//!
//! Why it is shaped this way:
//! * `C_Initialize` may run once per process and module: a second one fails
//!   (`CKR_CRYPTOKI_ALREADY_INITIALIZED`), and parallel initializations have
//!   crashed SoftHSM (rust-cryptoki#260). So modules live in a process-wide
//!   registry keyed by path, shared by every key that uses them.
//! * A `Session` may move between threads but not be shared (`Send`, not
//!   `Sync`), so each signer takes a session out of a small pool, signs, and
//!   puts it back; concurrent signers each get their own.
//! * A token can be reset, unplugged, logged out by another session, or its
//!   module finalized. Such failures are recognised by their return value:
//!   we drop what became stale, re-initialize the module if it was
//!   finalized, log in again, look the key up again (handles change), and
//!   retry once. A second failure is returned.

use super::uri::{KeySelector, PinSource, Pkcs11Uri, TokenSelector};
use super::Pkcs11Error;
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::{Slot, TokenInfo};
use cryptoki::types::AuthPin;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// Idle sessions kept per key; more concurrent signers open more sessions,
/// closed again when they are done.
const MAX_IDLE_SESSIONS: usize = 4;

/// A PKCS#11 library, loaded and initialized.
pub(crate) struct Module {
    ctx: Pkcs11,
    path: PathBuf,
    /// Bumped by each re-initialization: sessions and object handles from
    /// an earlier generation are meaningless (the module may hand out the
    /// same numbers again, for other sessions and other objects).
    generation: Mutex<u64>,
}

/// The module at `path`, loaded and initialized on first use.
pub(crate) fn module(path: &Path) -> Result<Arc<Module>, Pkcs11Error> {
    static MODULES: OnceLock<Mutex<HashMap<PathBuf, Arc<Module>>>> = OnceLock::new();
    // A symlink and its target are one library to the dynamic loader, so
    // one initialization too.
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut modules = lock(MODULES.get_or_init(Default::default));
    if let Some(m) = modules.get(&key) {
        return Ok(m.clone());
    }
    let module_err = |source| Pkcs11Error::Module {
        module: path.to_path_buf(),
        source,
    };
    let ctx = Pkcs11::new(path).map_err(module_err)?;
    initialize(&ctx).map_err(module_err)?;
    let m = Arc::new(Module {
        ctx,
        path: path.to_path_buf(),
        generation: Mutex::new(0),
    });
    modules.insert(key, m.clone());
    Ok(m)
}

/// `C_Initialize` with the OS's locking (we call from several threads).
/// Already initialized is fine: someone else in the process (another
/// library, or a key that recovered first) did it.
fn initialize(ctx: &Pkcs11) -> Result<(), CkError> {
    match ctx.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => Ok(()),
        Err(e) => Err(e),
    }
}

impl Module {
    /// The library's context, for the test fixture (key generation, and
    /// resetting the module under a key).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn context(&self) -> &Pkcs11 {
        &self.ctx
    }

    fn generation(&self) -> u64 {
        *lock(&self.generation)
    }

    /// Initializes the module again after it was finalized, unless another
    /// key already did since `seen`.
    fn reinitialize(&self, seen: u64) -> Result<(), Pkcs11Error> {
        let mut generation = lock(&self.generation);
        if *generation == seen {
            initialize(&self.ctx).map_err(|source| Pkcs11Error::Module {
                module: self.path.clone(),
                source,
            })?;
            *generation += 1;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps and pools inconsistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a failure calls for before the one retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// The module was finalized: initialize it again, then as `Reopen`.
    Reinitialize,
    /// The sessions are gone (closed, token removed or reset): open new
    /// ones and find the token and key again.
    Reopen,
    /// Logged out, or the key's handle is stale: log in and find the key
    /// again. SoftHSM reports a logout as an invalid object handle, since
    /// it hides private objects from public sessions.
    Relogin,
}

fn recovery(rv: RvError) -> Option<Recovery> {
    match rv {
        RvError::CryptokiNotInitialized => Some(Recovery::Reinitialize),
        RvError::SessionHandleInvalid
        | RvError::SessionClosed
        | RvError::DeviceRemoved
        | RvError::DeviceError
        | RvError::TokenNotPresent
        | RvError::TokenNotRecognized => Some(Recovery::Reopen),
        RvError::UserNotLoggedIn | RvError::ObjectHandleInvalid | RvError::KeyHandleInvalid => {
            Some(Recovery::Relogin)
        }
        _ => None,
    }
}

/// The token and key as last found.
#[derive(Clone)]
struct Found {
    slot: Slot,
    /// The token's label, for errors.
    label: String,
    /// A PIN pad: log in without a PIN.
    pin_pad: bool,
    key: Option<ObjectHandle>,
}

#[derive(Default)]
struct State {
    /// The module generation `found` and `idle` belong to.
    generation: u64,
    found: Option<Found>,
    idle: Vec<Session>,
}

/// One private key in a token, reached through a pool of sessions.
pub(crate) struct TokenKey {
    module: Arc<Module>,
    token: TokenSelector,
    key: KeySelector,
    pin: Option<AuthPin>,
    state: Mutex<State>,
}

impl TokenKey {
    /// Loads the URI's module and reads its PIN. The token is reached on
    /// the first [`TokenKey::with_key`].
    pub(crate) fn open(uri: &Pkcs11Uri) -> Result<Self, Pkcs11Error> {
        let pin = match &uri.pin {
            PinSource::None => None,
            PinSource::Value(pin) => Some(pin.clone()),
            PinSource::File(path) => Some(read_pin(path)?),
        };
        let module = module(&uri.module_path)?;
        let state = Mutex::new(State {
            generation: module.generation(),
            ..State::default()
        });
        Ok(TokenKey {
            module,
            token: uri.token.clone(),
            key: uri.key.clone(),
            pin,
            state,
        })
    }

    /// Runs `op` with a logged-in session and the private key's handle;
    /// after a failure that reconnecting can cure, reconnects and runs it
    /// once more.
    pub(crate) fn with_key<T>(
        &self,
        operation: &'static str,
        op: impl Fn(&Session, ObjectHandle) -> Result<T, CkError>,
    ) -> Result<T, Pkcs11Error> {
        let first = match self.attempt(operation, &op) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let Some(how) = first.rv().and_then(recovery) else {
            return Err(first);
        };
        tracing::warn!(rv = ?first.rv(), operation, "PKCS#11 key: reconnecting to the token");
        self.recover(how)?;
        self.attempt(operation, &op)
            .map_err(|e| Pkcs11Error::Unavailable {
                source: Box::new(e),
            })
    }

    fn attempt<T>(
        &self,
        operation: &'static str,
        op: &impl Fn(&Session, ObjectHandle) -> Result<T, CkError>,
    ) -> Result<T, Pkcs11Error> {
        let (session, key, generation) = self.checkout()?;
        match op(&session, key) {
            Ok(v) => {
                self.checkin(session, generation, None);
                Ok(v)
            }
            Err(source) => {
                let err = Pkcs11Error::Call { operation, source };
                self.checkin(session, generation, err.rv().and_then(recovery));
                Err(err)
            }
        }
    }

    /// An idle session (or a new one) and the key's handle (found again if
    /// it is not known), with the module generation they belong to.
    fn checkout(&self) -> Result<(Session, ObjectHandle, u64), Pkcs11Error> {
        let generation = self.module.generation();
        let (idle, found) = {
            let mut state = lock(&self.state);
            if state.generation != generation {
                forget_all(&mut state.idle);
                state.found = None;
                state.generation = generation;
            }
            (state.idle.pop(), state.found.clone())
        };
        let mut found = match found {
            Some(found) => found,
            None => self.find_token()?,
        };
        let session = match idle {
            Some(session) => session,
            None => self.open_session(&found)?,
        };
        let key = match found.key {
            Some(key) => key,
            None => match self.find_key(&session, &found) {
                Ok(key) => key,
                Err(e) => {
                    self.checkin(session, generation, e.rv().and_then(recovery));
                    return Err(e);
                }
            },
        };
        found.key = Some(key);
        let mut state = lock(&self.state);
        if state.generation == generation {
            state.found = Some(found);
        }
        Ok((session, key, generation))
    }

    /// Puts a session back after use, unless `failure` says it is stale.
    fn checkin(&self, session: Session, generation: u64, failure: Option<Recovery>) {
        let mut state = lock(&self.state);
        let stale = state.generation != generation
            || matches!(failure, Some(Recovery::Reopen | Recovery::Reinitialize));
        if stale {
            forget(session);
        } else if state.idle.len() < MAX_IDLE_SESSIONS {
            state.idle.push(session);
        }
    }

    /// Drops what a failure made stale; re-initializes a finalized module.
    fn recover(&self, how: Recovery) -> Result<(), Pkcs11Error> {
        let mut state = lock(&self.state);
        match how {
            Recovery::Relogin => {
                // The sessions are fine; the next checkout logs in before
                // it looks the key up again.
                if let Some(found) = &mut state.found {
                    found.key = None;
                }
            }
            Recovery::Reopen | Recovery::Reinitialize => {
                forget_all(&mut state.idle);
                state.found = None;
            }
        }
        let seen = state.generation;
        drop(state);
        if how == Recovery::Reinitialize {
            self.module.reinitialize(seen)?;
        }
        Ok(())
    }

    /// The one initialized token the URI's attributes match.
    fn find_token(&self) -> Result<Found, Pkcs11Error> {
        let ctx = &self.module.ctx;
        let slots = ctx
            .get_slots_with_token()
            .map_err(Pkcs11Error::call("list the slots"))?;
        let mut matches = Vec::new();
        for slot in slots {
            if self.token.slot_id.is_some_and(|id| id != slot.id()) {
                continue;
            }
            let info = ctx
                .get_token_info(slot)
                .map_err(Pkcs11Error::call("read the token information"))?;
            if info.token_initialized() && token_matches(&self.token, &info) {
                matches.push(Found {
                    slot,
                    label: info.label().to_owned(),
                    pin_pad: info.protected_authentication_path(),
                    key: None,
                });
            }
        }
        match matches.len() {
            1 => Ok(matches.remove(0)),
            0 => Err(Pkcs11Error::TokenNotFound {
                selector: self.token.to_string(),
            }),
            count => Err(Pkcs11Error::AmbiguousToken {
                selector: self.token.to_string(),
                count,
            }),
        }
    }

    fn open_session(&self, found: &Found) -> Result<Session, Pkcs11Error> {
        // Signing needs no writes.
        let session = self
            .module
            .ctx
            .open_ro_session(found.slot)
            .map_err(Pkcs11Error::call("open a session"))?;
        self.login(&session, found)?;
        Ok(session)
    }

    /// Logs the application in. Login belongs to the application and the
    /// token, not the session: already logged in (through another session
    /// or another key on the same token) is success, which also means a
    /// second key with a wrong PIN is not caught while the first is in use.
    fn login(&self, session: &Session, found: &Found) -> Result<(), Pkcs11Error> {
        let token = || found.label.clone();
        if self.pin.is_none() && !found.pin_pad {
            return Err(Pkcs11Error::MissingPin { token: token() });
        }
        match session.login(UserType::User, self.pin.as_ref()) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok(()),
            Err(CkError::Pkcs11(RvError::PinIncorrect | RvError::PinLenRange, _)) => {
                Err(Pkcs11Error::WrongPin { token: token() })
            }
            Err(CkError::Pkcs11(RvError::PinLocked, _)) => {
                Err(Pkcs11Error::PinLocked { token: token() })
            }
            Err(e) => Err(Pkcs11Error::call("log in")(e)),
        }
    }

    /// The one private key the URI's `object`/`id` match. Logs in first:
    /// a pooled session may have been logged out, and then the key is
    /// invisible rather than refused.
    fn find_key(&self, session: &Session, found: &Found) -> Result<ObjectHandle, Pkcs11Error> {
        self.login(session, found)?;
        let mut keys = session
            .find_objects(&self.template(ObjectClass::PRIVATE_KEY))
            .map_err(Pkcs11Error::call("find the key"))?;
        match keys.len() {
            1 => Ok(keys.remove(0)),
            0 => Err(Pkcs11Error::KeyNotFound {
                token: found.label.clone(),
                key: self.key.to_string(),
            }),
            count => Err(Pkcs11Error::AmbiguousKey {
                token: found.label.clone(),
                key: self.key.to_string(),
                count,
            }),
        }
    }

    /// A search template for the URI's key in `class`.
    pub(crate) fn template(&self, class: ObjectClass) -> Vec<Attribute> {
        let mut template = vec![Attribute::Class(class)];
        if let Some(label) = &self.key.label {
            template.push(Attribute::Label(label.clone()));
        }
        if let Some(id) = &self.key.id {
            template.push(Attribute::Id(id.clone()));
        }
        template
    }
}

impl Drop for TokenKey {
    fn drop(&mut self) {
        let generation = self.module.generation();
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if state.generation != generation {
            forget_all(&mut state.idle);
        }
    }
}

fn token_matches(want: &TokenSelector, info: &TokenInfo) -> bool {
    let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
    same(&want.label, info.label())
        && same(&want.serial, info.serial_number())
        && same(&want.manufacturer, info.manufacturer_id())
        && same(&want.model, info.model())
}

/// Leaves a stale session unclosed: its handle may since have been given to
/// another session (handles are reused after the module is initialized
/// again), which closing it would end. What leaks is a few bytes and a
/// reference to a module that stays loaded anyway.
fn forget(session: Session) {
    std::mem::forget(session);
}

fn forget_all(sessions: &mut Vec<Session>) {
    sessions.drain(..).for_each(forget);
}

/// The PIN from a `pin-source` file, without its trailing newline.
fn read_pin(path: &Path) -> Result<AuthPin, Pkcs11Error> {
    let mut text = std::fs::read_to_string(path).map_err(|source| Pkcs11Error::PinFile {
        path: path.to_path_buf(),
        source,
    })?;
    let len = text.trim_end_matches(['\r', '\n']).len();
    text.truncate(len);
    Ok(AuthPin::from(text))
}
