//! The settings on disk: checking at start-up that the helper and the key
//! files exist and parse, reading the secrets kept in files, and loading the
//! keys and token on every use (so a replaced file takes effect).

use super::ProvisionerConfig;
use crate::ca::KeyRef;
use crate::{ConfigError, Secret};
use choria_wire::security::pkcs11::{Pkcs11Ed25519Key, Pkcs11Error, Pkcs11Uri};
use choria_wire::security::tokens::{
    parse_client_id_token_unverified, ClientIdClaims, KeyError, TokenSigningKey, TokenVerifyKey,
};
use std::path::Path;
use std::sync::Arc;

impl ProvisionerConfig {
    /// Checks that the helper program and the key files in use exist and
    /// parse. The Go provisioner only finds out when it provisions a node.
    pub fn check_files(&self) -> Result<(), ConfigError> {
        self.check_helper()?;
        if self.features.pki && self.ca.is_some() {
            self.load_ca()?;
        }
        if self.features.jwt {
            self.load_verify_key()?;
        }
        if self.features.ed25519 {
            let key = self.load_signing_key()?;
            if self.jwt_signing_token.is_some() {
                if key.as_ed25519().is_none() {
                    return Err(self.err(
                        "jwt_signing_key",
                        "must be an ed25519 seed, or an ed25519 key in a token, when jwt_signing_token is set",
                    ));
                }
                self.load_signing_token()?;
            }
        }
        Ok(())
    }

    /// Reads `token_file` and `broker_provisioning_password_file` into
    /// `token` and `broker_provisioning_password` (trailing newline removed).
    pub fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.token_file {
            self.token = self.read_secret("token_file", path)?;
        }
        if let Some(path) = &self.broker_provisioning_password_file {
            let password = self.read_secret("broker_provisioning_password_file", path)?;
            self.broker_provisioning_password = (!password.is_empty()).then_some(password);
        }
        Ok(())
    }

    fn read_secret(&self, key: &str, path: &Path) -> Result<Secret, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.err(key, format!("{}: {e}", path.display())))?;
        Ok(Secret::new(text.trim_end_matches(['\r', '\n']).to_string()))
    }

    fn check_helper(&self) -> Result<(), ConfigError> {
        let words = self.helper_command()?;
        let Some(program) = words.first() else {
            if self.configuration_template.is_some() {
                return Ok(());
            }
            return Err(self.err("helper", "required"));
        };
        if program.contains('/') {
            let p = Path::new(program);
            match std::fs::metadata(p) {
                Err(e) => Err(self.err("helper", format!("{program}: {e}"))),
                Ok(m) if !m.is_file() => {
                    Err(self.err("helper", format!("{program} is not a file")))
                }
                Ok(m) if !is_executable(&m) => {
                    Err(self.err("helper", format!("{program} is not executable")))
                }
                Ok(_) => Ok(()),
            }
        } else {
            let found = std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| {
                    std::fs::metadata(dir.join(program))
                        .is_ok_and(|m| m.is_file() && is_executable(&m))
                })
            });
            if found {
                Ok(())
            } else {
                Err(self.err(
                    "helper",
                    format!("{program:?} was not found in PATH; give the full path"),
                ))
            }
        }
    }

    /// The key that verifies nodes' `provisioning.jwt` (`jwt_verify_cert`):
    /// an existing file is read, anything else must be a hex ed25519 public
    /// key, like Go's `validateJWT`. Read on every call, as Go does, so a
    /// replaced file takes effect.
    pub fn load_verify_key(&self) -> Result<TokenVerifyKey, ConfigError> {
        let Some(setting) = self.jwt_verify_cert.as_deref().filter(|s| !s.is_empty()) else {
            return Err(self.err(
                "jwt_verify_cert",
                "not set; set it to the file or hex ed25519 public key that verifies the nodes' provisioning.jwt",
            ));
        };
        TokenVerifyKey::from_setting(setting).map_err(|e| {
            let message = match e {
                // from_setting only parses the setting itself as hex when no
                // such file exists.
                KeyError::Ed25519PublicKey(_) if !Path::new(setting).exists() => format!(
                    "{setting} is neither an existing file nor a hex encoded ed25519 public key ({e})"
                ),
                e => key_error(Path::new(setting), e),
            };
            self.err("jwt_verify_cert", message)
        })
    }

    /// The built-in CA (`ca:`) from its files, its errors named by the
    /// setting at fault.
    pub fn load_ca(&self) -> Result<choria_wire::security::ca::CertificateAuthority, ConfigError> {
        let Some(ca) = &self.ca else {
            return Err(self.err("ca", "not set"));
        };
        ca.load()
            .map_err(|e| self.err(&format!("ca.{}", e.key), e.message))
    }

    /// The key that signs server JWTs (`jwt_signing_key`): a file read on
    /// every call, or an ed25519 key in a PKCS#11 token, opened here.
    pub fn load_signing_key(&self) -> Result<TokenSigningKey, ConfigError> {
        let path = match &self.jwt_signing_key {
            None => return Err(self.err("jwt_signing_key", "not set")),
            Some(KeyRef::File(path)) => path,
            Some(KeyRef::Pkcs11(uri)) => return self.open_signing_key(uri),
        };
        TokenSigningKey::from_file(path)
            .map_err(|e| self.err("jwt_signing_key", key_error(path, e)))
    }

    /// The ed25519 key a `pkcs11:` URI names, opened in its token; its
    /// errors show the URI without a PIN, and the token's errors hold none.
    fn open_signing_key(&self, uri: &str) -> Result<TokenSigningKey, ConfigError> {
        let shown = KeyRef::Pkcs11(uri.to_string());
        let error = |e: Pkcs11Error| self.err("jwt_signing_key", format!("{shown}: {e}"));
        let key = Pkcs11Ed25519Key::open(&Pkcs11Uri::parse(uri).map_err(error)?).map_err(error)?;
        Ok(TokenSigningKey::Ed25519Token(Arc::new(key)))
    }

    /// Our chain-issuer token (`jwt_signing_token`) and its claims, read on
    /// every call; `None` when not configured. It must carry a trust chain
    /// signature (`tcs`), as the Go provisioner requires.
    pub fn load_signing_token(&self) -> Result<Option<(String, ClientIdClaims)>, ConfigError> {
        let Some(path) = self.jwt_signing_token.as_deref() else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.err("jwt_signing_token", format!("{}: {e}", path.display())))?;
        let token = text.trim().to_string();
        let claims = parse_client_id_token_unverified(&token)
            .map_err(|e| self.err("jwt_signing_token", format!("{}: {e}", path.display())))?;
        if claims.standard.trust_chain_signature.is_empty() {
            return Err(self.err(
                "jwt_signing_token",
                format!(
                    "{} has no trust chain signature (tcs claim); create it with `choria jwt client ... --issuer`",
                    path.display()
                ),
            ));
        }
        Ok(Some((token, claims)))
    }
}

/// `<path>: <problem>`, without repeating the path the error already holds.
fn key_error(path: &Path, e: KeyError) -> String {
    match e {
        KeyError::Read { source, .. } => format!("{}: {source}", path.display()),
        other => format!("{}: {other}", path.display()),
    }
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}
