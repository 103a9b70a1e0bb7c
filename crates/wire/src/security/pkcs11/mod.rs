//! Keys that stay in a PKCS#11 token (an HSM, a smart card, SoftHSM): the
//! CA's key ([`Pkcs11CaKey`], RSA or ECDSA P-256) and an ed25519 key
//! ([`Pkcs11Ed25519Key`]), named by an RFC 7512 URI ([`Pkcs11Uri`]).
//!
//! The private key never enters this process: we send the token what to
//! sign and get the signature back. `uri.rs` parses the URI; `token.rs`
//! loads each module once per process, keeps a few logged-in sessions per
//! key and reconnects when the token or the module was reset; `keys.rs` is
//! the key kinds and the DER around their signatures and public keys.
//!
//! Every call is a blocking FFI call, and a network HSM can take
//! milliseconds: async callers go through `tokio::task::spawn_blocking`.
//! PINs never appear in `Debug` output, `Display` or errors.

mod keys;
mod token;
mod uri;

pub use keys::{Pkcs11CaKey, Pkcs11Ed25519Key};
/// The module registry, for the SoftHSM test fixture: keys must be made
/// through the one initialization of the module this process may have.
#[cfg(any(test, feature = "testing"))]
pub(crate) use token::module as token_module;
pub use uri::Pkcs11Uri;

use cryptoki::error::{Error as CkError, RvError};
use std::path::PathBuf;

/// What can go wrong with a key in a token. Never contains the PIN.
#[derive(Debug, thiserror::Error)]
pub enum Pkcs11Error {
    /// The text does not start with `pkcs11:`.
    #[error("not a pkcs11: URI")]
    NotPkcs11Uri,
    /// An attribute of the URI is malformed, unknown or unsupported.
    #[error("pkcs11: URI attribute {attribute}: {reason}")]
    Uri {
        /// The attribute's name (never its value).
        attribute: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The URI has no `module-path`: we do not guess which library to load.
    #[error("pkcs11: URI has no module-path (the PKCS#11 library to load)")]
    MissingModulePath,
    /// The URI names no key: neither `object` nor `id`.
    #[error("pkcs11: URI names no key: give object= (its label) and/or id=")]
    NoKeySelector,
    /// The `pin-source` file cannot be read.
    #[error("cannot read the PIN file {path}")]
    PinFile {
        /// The file (a path, not a secret).
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No PIN was given and the token has no PIN pad.
    #[error("token {token}: no PIN given (pin-value or pin-source) and the token needs one")]
    MissingPin {
        /// The token's label.
        token: String,
    },
    /// The token refused the PIN.
    #[error("token {token}: the PIN is incorrect")]
    WrongPin {
        /// The token's label.
        token: String,
    },
    /// The token locked the PIN after too many wrong ones.
    #[error("token {token}: the PIN is locked")]
    PinLocked {
        /// The token's label.
        token: String,
    },
    /// The PKCS#11 library cannot be loaded or initialized.
    #[error("cannot load the PKCS#11 module {module}: {}", short(.source))]
    Module {
        /// The library.
        module: PathBuf,
        /// The loader's or the library's error.
        #[source]
        source: CkError,
    },
    /// No token matches the URI.
    #[error("no token matches {selector}")]
    TokenNotFound {
        /// The URI's token attributes.
        selector: String,
    },
    /// More than one token matches the URI: which one signs must not be a
    /// matter of slot order.
    #[error("{count} tokens match {selector}: add token=, serial= or slot-id=")]
    AmbiguousToken {
        /// The URI's token attributes.
        selector: String,
        /// How many matched.
        count: usize,
    },
    /// No private key in the token matches the URI.
    #[error("token {token}: no private key with {key}")]
    KeyNotFound {
        /// The token's label.
        token: String,
        /// The URI's key attributes.
        key: String,
    },
    /// More than one private key matches the URI.
    #[error("token {token}: {count} private keys match {key}: add id= or object=")]
    AmbiguousKey {
        /// The token's label.
        token: String,
        /// The URI's key attributes.
        key: String,
        /// How many matched.
        count: usize,
    },
    /// The key is not of a kind this use supports.
    #[error("unsupported key: {0}")]
    UnsupportedKey(String),
    /// An attribute the token returned is not what PKCS#11 says it is.
    #[error("the token's {attribute} is malformed: {reason}")]
    Attribute {
        /// Which attribute.
        attribute: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A PKCS#11 call failed.
    #[error("PKCS#11 {operation} failed: {}", short(.source))]
    Call {
        /// What we were doing.
        operation: &'static str,
        /// The library's error.
        #[source]
        source: CkError,
    },
    /// The call failed again after dropping the sessions and logging in
    /// anew (the token or the module was reset and did not come back).
    #[error("the key in the token is unavailable, even after reconnecting: {source}")]
    Unavailable {
        /// The second failure.
        #[source]
        source: Box<Pkcs11Error>,
    },
}

/// cryptoki's `Display` quotes the specification at length; the return
/// value's name and the function say what matters.
fn short(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(rv, function) => format!("{rv:?} in {function:?}"),
        other => other.to_string(),
    }
}

impl Pkcs11Error {
    fn call(operation: &'static str) -> impl Fn(CkError) -> Pkcs11Error {
        move |source| Pkcs11Error::Call { operation, source }
    }

    /// The PKCS#11 return value behind this error, if there is one.
    fn rv(&self) -> Option<RvError> {
        match self {
            Pkcs11Error::Call {
                source: CkError::Pkcs11(rv, _),
                ..
            } => Some(*rv),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
