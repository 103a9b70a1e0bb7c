//! Cryptography and tokens for the Choria provisioning protocol.
//!
//! Everything a provisioner (and a provisioning-mode server simulator) needs
//! to interoperate byte for byte with go-choria and `choria-io/tokens`:
//!
//! * [`tokens`]: provisioning, server and client JWTs, signing keys,
//!   verification and Org Issuer trust chains;
//! * [`ecdh`]: X25519 key agreement for shipping private keys;
//! * [`pem_crypt`]: RFC 1423 PEM encryption with the shared secret;
//! * [`csr`]: RSA keys, CSRs and the `cert_deny_list` rules;
//! * [`ca`]: a certificate authority that signs node CSRs (the built-in CA
//!   of `features.pki`, the simulator's and the reference helper's), its key
//!   a file's or a PKCS#11 token's;
//! * [`pkcs11`]: keys that stay in a PKCS#11 token (`pkcs11:` URIs), the
//!   CA's and an ed25519 signer;
//! * [`ed25519`]: `gen25519` keys and nonce signatures;
//! * [`ksuid`]: KSUID `jti` values bound to `iat`;
//! * [`seal`]: ed25519 seals over what we write to the bus and read back.
//!
//! Secrets never appear in `Debug` output or error messages.
//!
//! The unit tests compare our output byte for byte with vectors produced by
//! the real Go code (`go_vectors`, test-only) and, where the `openssl` CLI is
//! installed, cross-check PEM encryption and CSRs with it.

pub mod ca;
pub mod csr;
pub mod ecdh;
pub mod ed25519;
#[cfg(test)]
mod go_vectors;
pub mod ksuid;
pub mod pem_crypt;
pub mod pkcs11;
pub mod rsa_signer;
pub mod seal;
pub mod tokens;

pub use csr::{
    compile_deny_list, default_deny_list, generate_rsa_key, make_csr, parse_csr, parse_csr_der,
    private_key_pkcs1_pem, public_key_pem_go_style, validate_csr_names, CsrError, CsrInfo,
    CsrSubject, RsaKeyPool, DEFAULT_CERT_DENY_LIST, DEFAULT_RSA_BITS,
};
pub use ecdh::{EcdhError, EcdhKeyPair};
pub use ed25519::{
    generate_keypair, parse_public_key_hex, parse_seed_hex, seed_hex, sign_nonce_hex, verify_nonce,
    Ed25519Error, Ed25519KeyPair,
};
pub use ksuid::{ksuid_timestamp, new_ksuid_at, KsuidError};
pub use pem_crypt::{
    decrypt_private_key, decrypt_private_key_to_pem, encrypt_private_key,
    encrypt_private_key_with_iv, PemCryptError,
};
pub use tokens::{
    parse_client_id_token_at, parse_client_id_token_unverified, parse_provisioning_token,
    parse_provisioning_token_at, parse_provisioning_token_unverified, parse_server_token,
    parse_server_token_at, parse_unverified, to_go_json, token_algorithm,
    verify_chain_issued_server_token, verify_chain_issued_server_token_at, ClientIdClaims,
    ClientPermissions, HasStandardClaims, KeyError, ProvisioningClaims, ServerClaims,
    ServerPermissions, StandardClaims, TokenError, TokenSigningKey, TokenVerifyKey,
};
