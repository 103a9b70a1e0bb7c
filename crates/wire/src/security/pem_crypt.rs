//! RFC 1423 ("OpenSSL traditional") PEM encryption of private keys.
//!
//! The Go provisioner encrypts a helper-supplied private key with
//! `x509.EncryptPEMBlock(rand, "RSA PRIVATE KEY", der, sharedSecret,
//! PEMCipherAES256)` and the server decrypts it with `x509.DecryptPEMBlock`
//! (`provisioner:host/host.go` `encryptPrivateKey`,
//! `go-choria:providers/agent/mcorpc/golang/provision/util.go`
//! `decryptPrivateKey`). The password is the raw 32 byte X25519 shared secret.
//! The scheme is weak by modern standards (MD5 key derivation, no MAC) but it
//! is what the wire protocol uses, so we implement it byte for byte:
//!
//! 1. `iv` = 16 random bytes, `salt` = `iv[..8]`;
//! 2. key = OpenSSL `EVP_BytesToKey(MD5, 1 round)`: `D1 = MD5(pw‖salt)`,
//!    `D2 = MD5(D1‖pw‖salt)`, key = `D1‖D2`;
//! 3. plaintext = DER padded with `n` bytes of value `n` (1..=16);
//! 4. AES-256-CBC;
//! 5. PEM `RSA PRIVATE KEY` with `Proc-Type: 4,ENCRYPTED` then
//!    `DEK-Info: AES-256-CBC,<iv as lowercase hex>` (Go uses
//!    `hex.EncodeToString`; OpenSSL writes uppercase, both are accepted on
//!    decryption), a blank line, base64 in 64 character lines, LF endings.

use aes::cipher::{
    block_padding::NoPadding, BlockCipher, BlockDecryptMut, BlockEncryptMut, KeyInit, KeyIvInit,
};
use md5::{Digest, Md5};
use rand::RngCore;

/// PEM label the encrypted key is always given (Go relabels whatever it got).
pub const ENCRYPTED_KEY_LABEL: &str = "RSA PRIVATE KEY";

const BLOCK: usize = 16;

/// Errors from encrypting or decrypting a private key PEM block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemCryptError {
    /// The text contained no decodable PEM block (Go: "bad key received").
    #[error("bad key received: {0}")]
    BadPem(&'static str),
    /// Decryption was asked of a block without a `DEK-Info` header.
    #[error("key is not encrypted: the PEM block has no DEK-Info header")]
    NotEncrypted,
    /// Encryption was asked of a block that already carries a `DEK-Info` header.
    #[error("key is already encrypted: the PEM block has a DEK-Info header")]
    AlreadyEncrypted,
    /// The `DEK-Info` header is not `<cipher>,<hex iv>`.
    #[error("malformed DEK-Info header: expected \"<cipher>,<hex iv>\"")]
    MalformedDekInfo,
    /// The cipher named in `DEK-Info` is not one we implement.
    #[error("unsupported DEK-Info cipher {0:?}: only AES-128-CBC, AES-192-CBC and AES-256-CBC are supported")]
    UnsupportedCipher(String),
    /// The IV in `DEK-Info` is not hex.
    #[error("DEK-Info IV is not valid hex")]
    IvNotHex,
    /// The IV has the wrong length.
    #[error("DEK-Info IV must be 16 bytes, got {0}")]
    IvLength(usize),
    /// The ciphertext is not whole cipher blocks.
    #[error("encrypted PEM data is {0} bytes, not a multiple of the 16 byte block size")]
    NotBlockMultiple(usize),
    /// The ciphertext is empty.
    #[error("invalid padding: encrypted PEM data is empty")]
    Empty,
    /// The padding is wrong after decryption; almost always the wrong shared
    /// secret (Go: `x509.IncorrectPasswordError`).
    #[error("decryption password incorrect: the padding of the decrypted key is invalid (wrong shared secret?)")]
    IncorrectPassword,
}

/// OpenSSL `EVP_BytesToKey` with MD5 and one iteration, producing `key_len`
/// bytes. Exposed for test vectors.
pub fn evp_bytes_to_key_md5(password: &[u8], salt: &[u8], key_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(key_len + 16);
    let mut digest: Vec<u8> = Vec::new();
    while out.len() < key_len {
        let mut h = Md5::new();
        h.update(&digest);
        h.update(password);
        h.update(salt);
        digest = h.finalize().to_vec();
        out.extend_from_slice(&digest);
    }
    out.truncate(key_len);
    out
}

/// Encrypts the first PEM block in `pem_text` (usually the helper's
/// `RSA PRIVATE KEY`) with a random IV. The block's DER is encrypted as-is and
/// relabelled `RSA PRIVATE KEY`, as Go does, even when it was PKCS#8
/// (go-choria's TLS loader accepts PKCS#8 DER under either label).
pub fn encrypt_private_key(pem_text: &str, shared: &[u8; 32]) -> Result<String, PemCryptError> {
    let mut iv = [0u8; BLOCK];
    rand::rngs::OsRng.fill_bytes(&mut iv);
    encrypt_private_key_with_iv(pem_text, shared, iv)
}

/// [`encrypt_private_key`] with a caller-chosen IV, for test vectors.
pub fn encrypt_private_key_with_iv(
    pem_text: &str,
    shared: &[u8; 32],
    iv: [u8; 16],
) -> Result<String, PemCryptError> {
    let block = parse_pem(pem_text)?;
    if block.headers().get("DEK-Info").is_some() {
        return Err(PemCryptError::AlreadyEncrypted);
    }
    Ok(encrypt_der_with_iv(block.contents(), shared, iv))
}

/// Encrypts raw DER into the Go `x509.EncryptPEMBlock` + `pem.Encode` text.
pub fn encrypt_der_with_iv(der: &[u8], shared: &[u8; 32], iv: [u8; 16]) -> String {
    let key = evp_bytes_to_key_md5(shared, &iv[..8], 32);
    let pad = BLOCK - der.len() % BLOCK;
    let mut buf = Vec::with_capacity(der.len() + pad);
    buf.extend_from_slice(der);
    buf.resize(der.len() + pad, pad as u8);
    let len = buf.len();
    cbc::Encryptor::<aes::Aes256>::new_from_slices(&key, &iv)
        .expect("AES-256 key is 32 bytes and IV 16 bytes")
        .encrypt_padded_mut::<NoPadding>(&mut buf, len)
        .expect("buffer is a whole number of blocks");
    let headers = [
        ("Proc-Type", "4,ENCRYPTED".to_string()),
        ("DEK-Info", format!("AES-256-CBC,{}", hex::encode(iv))),
    ];
    go_pem_encode(ENCRYPTED_KEY_LABEL, &headers, &buf)
}

/// Encodes like Go's `pem.Encode`: headers in the given order (callers put
/// `Proc-Type` first as Go does), blank line, 64 column base64, LF endings.
pub fn go_pem_encode(label: &str, headers: &[(&str, String)], der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 128);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    if !headers.is_empty() {
        for (k, v) in headers {
            out.push_str(k);
            out.push_str(": ");
            out.push_str(v);
            out.push('\n');
        }
        out.push('\n');
    }
    for chunk in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so any byte boundary is a char boundary
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// Says what is wrong with a PEM text without echoing it (it may hold a key).
/// Shared by every PEM reader in this module tree.
pub fn pem_error_text(e: &pem::PemError) -> &'static str {
    match e {
        pem::PemError::MismatchedTags(..) => "PEM BEGIN and END labels differ",
        pem::PemError::MalformedFraming => "no complete -----BEGIN/-----END PEM block",
        pem::PemError::MissingBeginTag => "PEM BEGIN label missing",
        pem::PemError::MissingEndTag => "PEM END label missing",
        pem::PemError::MissingData => "PEM block has no data",
        pem::PemError::InvalidData(_) => "PEM body is not valid base64",
        pem::PemError::InvalidHeader(_) => "a PEM header line is not \"Key: value\"",
        pem::PemError::NotUtf8(_) => "PEM text is not UTF-8",
    }
}

fn parse_pem(text: &str) -> Result<pem::Pem, PemCryptError> {
    pem::parse(text).map_err(|e| PemCryptError::BadPem(pem_error_text(&e)))
}

/// Decrypts whole AES-CBC blocks in place; false only if the key or IV
/// length is wrong or `buf` is not whole blocks.
fn cbc_decrypt_in_place<C>(key: &[u8], iv: &[u8], buf: &mut [u8]) -> bool
where
    C: BlockCipher + BlockDecryptMut + KeyInit,
{
    cbc::Decryptor::<C>::new_from_slices(key, iv)
        .is_ok_and(|d| d.decrypt_padded_mut::<NoPadding>(buf).is_ok())
}

/// Decrypts an encrypted private key PEM the way go-choria's `configure`
/// action does and returns the plaintext DER.
///
/// Requires a `DEK-Info` header; accepts AES-128/192/256-CBC (Go also knows
/// DES and 3DES, which no provisioner ever sends); the IV hex may be either
/// case; padding is fully checked.
pub fn decrypt_private_key(pem_text: &str, shared: &[u8; 32]) -> Result<Vec<u8>, PemCryptError> {
    let block = parse_pem(pem_text)?;
    let dek = block
        .headers()
        .get("DEK-Info")
        .ok_or(PemCryptError::NotEncrypted)?;
    let (mode, iv_hex) = dek.split_once(',').ok_or(PemCryptError::MalformedDekInfo)?;
    type CbcDecrypt = fn(&[u8], &[u8], &mut [u8]) -> bool;
    let (key_len, cbc_decrypt): (usize, CbcDecrypt) = match mode {
        "AES-128-CBC" => (16, cbc_decrypt_in_place::<aes::Aes128>),
        "AES-192-CBC" => (24, cbc_decrypt_in_place::<aes::Aes192>),
        "AES-256-CBC" => (32, cbc_decrypt_in_place::<aes::Aes256>),
        other => {
            let shown: String = other.chars().take(32).collect();
            return Err(PemCryptError::UnsupportedCipher(shown));
        }
    };
    let iv = hex::decode(iv_hex).map_err(|_| PemCryptError::IvNotHex)?;
    if iv.len() != BLOCK {
        return Err(PemCryptError::IvLength(iv.len()));
    }
    let ct = block.contents();
    if ct.len() % BLOCK != 0 {
        return Err(PemCryptError::NotBlockMultiple(ct.len()));
    }
    if ct.is_empty() {
        return Err(PemCryptError::Empty);
    }
    let key = evp_bytes_to_key_md5(shared, &iv[..8], key_len);
    let mut buf = ct.to_vec();
    if !cbc_decrypt(&key, &iv, &mut buf) {
        // Cannot happen: key/iv lengths and block multiple were checked above.
        return Err(PemCryptError::NotBlockMultiple(ct.len()));
    }
    // `buf` is at least one block, so the padding length `last` (1..=16)
    // always fits inside it.
    let last = usize::from(buf[buf.len() - 1]);
    let pad_ok = (1..=BLOCK).contains(&last)
        && buf[buf.len() - last..]
            .iter()
            .all(|&b| usize::from(b) == last);
    if !pad_ok {
        return Err(PemCryptError::IncorrectPassword);
    }
    buf.truncate(buf.len() - last);
    Ok(buf)
}

/// [`decrypt_private_key`] followed by re-encoding as an unencrypted
/// `RSA PRIVATE KEY` PEM, which is what go-choria writes to `private.pem`.
pub fn decrypt_private_key_to_pem(
    pem_text: &str,
    shared: &[u8; 32],
) -> Result<String, PemCryptError> {
    let der = decrypt_private_key(pem_text, shared)?;
    Ok(go_pem_encode(ENCRYPTED_KEY_LABEL, &[], &der))
}

#[cfg(test)]
mod tests;
