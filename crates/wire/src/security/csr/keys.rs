//! RSA keys as go-choria's `gencsr` makes and writes them, and the pool of
//! pre-generated ones a simulator shares between its nodes.

use super::{enc_err, CsrError};
use crate::security::pem_crypt::go_pem_encode;
use rsa::pkcs1::{DecodeRsaPublicKey, EncodeRsaPrivateKey, EncodeRsaPublicKey};
use rsa::{RsaPrivateKey, RsaPublicKey};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Key size go-choria uses for `gencsr`.
pub const DEFAULT_RSA_BITS: usize = 2048;

/// Generates an RSA private key of `bits` bits (public exponent 65537).
pub fn generate_rsa_key(bits: usize) -> Result<RsaPrivateKey, CsrError> {
    RsaPrivateKey::new(&mut rand::rngs::OsRng, bits).map_err(|e| CsrError::KeyGeneration {
        bits,
        reason: e.to_string(),
    })
}

/// A fixed set of pre-generated RSA keys handed out round-robin or by index.
///
/// Sharing keys between simulated nodes is fine for load and protocol tests
/// (each node still gets its own CSR and certificate) and turns minutes of key
/// generation into a one-off cost. `Debug` never prints key material.
pub struct RsaKeyPool {
    keys: Vec<Arc<RsaPrivateKey>>,
    next: AtomicUsize,
}

impl fmt::Debug for RsaKeyPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RsaKeyPool")
            .field("keys", &self.keys.len())
            .field("next", &self.next.load(Ordering::Relaxed))
            .finish()
    }
}

impl RsaKeyPool {
    /// Generates `count` keys of `bits` bits using one thread per available
    /// core.
    pub fn generate(count: usize, bits: usize) -> Result<Self, CsrError> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::generate_with_threads(count, bits, threads)
    }

    /// Generates `count` keys of `bits` bits on `threads` scoped threads.
    pub fn generate_with_threads(
        count: usize,
        bits: usize,
        threads: usize,
    ) -> Result<Self, CsrError> {
        if count == 0 {
            return Err(CsrError::EmptyPool);
        }
        let threads = threads.clamp(1, count);
        let results: Vec<Result<Vec<RsaPrivateKey>, CsrError>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    // spread the remainder over the first threads
                    let n = count / threads + usize::from(t < count % threads);
                    s.spawn(move || (0..n).map(|_| generate_rsa_key(bits)).collect())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(CsrError::KeyGeneration {
                            bits,
                            reason: "key generation thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut keys = Vec::with_capacity(count);
        for r in results {
            keys.extend(r?.into_iter().map(Arc::new));
        }
        Ok(Self {
            keys,
            next: AtomicUsize::new(0),
        })
    }

    /// Builds a pool from existing keys.
    pub fn from_keys(keys: Vec<RsaPrivateKey>) -> Result<Self, CsrError> {
        if keys.is_empty() {
            return Err(CsrError::EmptyPool);
        }
        Ok(Self {
            keys: keys.into_iter().map(Arc::new).collect(),
            next: AtomicUsize::new(0),
        })
    }

    /// Number of distinct keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a pool has at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key for `index`, wrapping around (node N always gets the same key).
    pub fn get(&self, index: usize) -> Arc<RsaPrivateKey> {
        Arc::clone(&self.keys[index % self.keys.len()])
    }

    /// The next key in round-robin order (thread safe).
    pub fn next_key(&self) -> Arc<RsaPrivateKey> {
        self.get(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// PKCS#1 `RSA PRIVATE KEY` PEM, as written to `private.pem`.
pub fn private_key_pkcs1_pem(key: &RsaPrivateKey) -> Result<String, CsrError> {
    let der = key.to_pkcs1_der().map_err(enc_err("private key"))?;
    Ok(go_pem_encode("RSA PRIVATE KEY", &[], der.as_bytes()))
}

/// go-choria's `gencsr` `public_key`: a PEM block labelled `PUBLIC KEY` that
/// contains **PKCS#1** DER (`x509.MarshalPKCS1PublicKey`), not the SPKI that
/// the label normally implies. Kept byte-compatible on purpose.
pub fn public_key_pem_go_style(key: &RsaPublicKey) -> Result<String, CsrError> {
    let der = key.to_pkcs1_der().map_err(enc_err("public key"))?;
    Ok(go_pem_encode("PUBLIC KEY", &[], der.as_bytes()))
}

/// Parses an RSA public key from PKCS#1 DER (what
/// [`public_key_pem_go_style`] contains).
pub fn rsa_public_key_from_pkcs1_der(der: &[u8]) -> Result<RsaPublicKey, CsrError> {
    RsaPublicKey::from_pkcs1_der(der)
        .map_err(|e| CsrError::Parse(format!("invalid RSA public key: {e}")))
}
