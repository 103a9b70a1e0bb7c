//! What the provisioner derives from the Choria client configuration:
//! the NATS connection options (TLS, token, user, NATS JWT), the caller id
//! and the request signer, as the Go provisioner sets them up.

use super::*;

/// Everything needed to connect and to sign requests.
#[derive(Clone, Debug)]
pub struct ClientSetup {
    pub version: Version,
    pub connect: ConnectOptions,
    pub identity: Identity,
    /// Always `provisioning`: the Go provisioner forces its collectives.
    pub collective: &'static str,
    /// Notes on how the connection will be made (e.g. TLS not verified).
    pub warnings: Vec<ConfigWarning>,
}

impl ClientSetup {
    /// How the provisioner will connect and sign, for `run --check`.
    /// Credentials show only whether they are set.
    pub fn effective_settings(&self) -> Vec<(String, String)> {
        let c = &self.connect;
        let signer = match &self.identity.signer {
            RequestSigner::V1Insecure => "none (choria_insecure: requests are not signed)",
            RequestSigner::V1Rsa { .. } => "x509 (RSA key of the file provider)",
            RequestSigner::V2 { .. } => "ed25519 seed + client JWT (choria provider)",
        };
        vec![
            ("protocol".into(), self.version.to_string()),
            ("identity".into(), self.identity.identity.clone()),
            ("caller".into(), self.identity.caller.clone()),
            ("collective".into(), self.collective.into()),
            ("brokers".into(), c.servers.join(" ")),
            ("connection_name".into(), c.name.clone()),
            ("request_signer".into(), signer.into()),
            ("tls.required".into(), c.tls.required.to_string()),
            (
                "tls.verify".into(),
                match (c.tls.insecure_skip_verify, &c.tls.ca_file) {
                    (true, _) => "no: the broker's certificate is not checked".into(),
                    (false, Some(ca)) => format!("yes, against {}", ca.display()),
                    (false, None) => "yes, against the system's trusted CAs".into(),
                },
            ),
            (
                "tls.client_certificate".into(),
                c.tls
                    .client_cert
                    .as_ref()
                    .map_or_else(|| "(none)".into(), |(cert, _)| cert.display().to_string()),
            ),
            (
                "nats_user".into(),
                c.user.as_ref().map_or_else(
                    || "(none)".into(),
                    |(u, _)| format!("{u} (password redacted)"),
                ),
            ),
            (
                "nats_jwt".into(),
                if c.nats_jwt.is_some() {
                    "(set, redacted)"
                } else {
                    "(none)"
                }
                .into(),
            ),
        ]
    }
}
impl ChoriaClientConfig {
    /// Connection options, identity and signer, as the Go provisioner sets them
    /// up from this file and `provisioner.yaml`.
    pub fn client_setup(
        &self,
        prov: &crate::ProvisionerConfig,
        env: &Environment,
    ) -> Result<ClientSetup, ConfigError> {
        self.client_setup_for(
            prov.choria_insecure,
            prov.broker_provisioning_password.as_ref(),
            env,
        )
    }

    /// [`ChoriaClientConfig::client_setup`] with the two provisioner settings
    /// that matter given directly.
    pub fn client_setup_for(
        &self,
        insecure: bool,
        broker_password: Option<&Secret>,
        env: &Environment,
    ) -> Result<ClientSetup, ConfigError> {
        let provider = self.security_provider(insecure)?;
        self.check_unsupported(provider)?;
        let user = match broker_password.filter(|p| !p.is_empty()) {
            Some(p) => Some((PROVISIONER_NATS_USER.to_string(), p.expose().to_string())),
            None => match (&self.nats_user, &self.nats_pass) {
                (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => {
                    Some((u.clone(), p.expose().to_string()))
                }
                _ => None,
            },
        };
        let mut connect = ConnectOptions {
            servers: self.middleware_servers()?,
            name: String::new(),
            tls: TlsSettings::default(),
            token: None,
            user,
            nats_jwt: None,
            inbox_prefix: None,
        };
        let mut warnings = Vec::new();

        let (caller, signer) = match provider {
            SecurityProvider::File => {
                connect.name = self.certname(env);
                let signer = if insecure {
                    RequestSigner::V1Insecure
                } else {
                    let (signer, tls) = self.x509_credentials()?;
                    connect.tls = tls;
                    signer
                };
                (v1_caller(&connect.name), signer)
            }
            SecurityProvider::Choria => {
                let token = self.client_token(env)?;
                let seed = self.client_seed(&token)?;
                connect.tls = self.choria_tls(&mut warnings)?;
                connect.name = env.user.clone().unwrap_or_else(|| self.identity.clone());
                connect.token = Some(token.jwt.clone());
                connect.nats_jwt = Some((token.jwt.clone(), seed.clone()));
                let signer = RequestSigner::V2 {
                    seed: Box::new(seed),
                    jwt: token.jwt,
                };
                (token.caller, signer)
            }
        };

        let version = provider.protocol_version();
        connect.inbox_prefix = Some(subjects::inbox_prefix(
            PROVISIONING_COLLECTIVE,
            &caller,
            version == Version::V2,
        ));
        Ok(ClientSetup {
            version,
            connect,
            identity: Identity {
                identity: self.identity.clone(),
                caller,
                signer,
            },
            collective: PROVISIONING_COLLECTIVE,
            warnings,
        })
    }

    /// The `file` provider's request signer and mutual TLS settings.
    fn x509_credentials(&self) -> Result<(RequestSigner, TlsSettings), ConfigError> {
        let cert = self.existing_file(KEY_FILE_CERT, self.file_certificate.as_deref())?;
        let key = self.existing_file(KEY_FILE_KEY, self.file_key.as_deref())?;
        let ca = self.existing_file(KEY_FILE_CA, self.file_ca.as_deref())?;
        let cert_pem = std::fs::read_to_string(&cert)
            .map_err(|e| self.err(KEY_FILE_CERT, format!("{}: {e}", cert.display())))?;
        if !cert_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(self.err(
                KEY_FILE_CERT,
                format!("{} holds no PEM certificate", cert.display()),
            ));
        }
        let signer = RequestSigner::V1Rsa {
            key: choria_wire::security::rsa_signer::RsaSigningKey::new(self.read_rsa_key(&key)?),
            cert_pem,
        };
        let tls = TlsSettings {
            required: true,
            ca_file: Some(ca),
            client_cert: Some((cert, key)),
            insecure_skip_verify: false,
        };
        Ok((signer, tls))
    }

    /// The `choria` provider's ed25519 seed, which must belong to `token`.
    fn client_seed(&self, token: &ClientToken) -> Result<ed25519_dalek::SigningKey, ConfigError> {
        let seed_path = self.seed_file()?;
        let seed_text = std::fs::read_to_string(&seed_path)
            .map_err(|e| self.err(KEY_CHORIA_SEED, format!("{}: {e}", seed_path.display())))?;
        let seed = parse_seed_hex(&seed_text).map_err(|_| {
            self.err(
                KEY_CHORIA_SEED,
                format!(
                    "{} is not an ed25519 seed (64 hex characters)",
                    seed_path.display()
                ),
            )
        })?;
        let signing = ed25519_dalek::SigningKey::from_bytes(&seed);
        if let Some(pk) = &token.public_key {
            let ours = hex::encode(signing.verifying_key().as_bytes());
            if !pk.eq_ignore_ascii_case(&ours) {
                return Err(self.err(
                    KEY_CHORIA_SEED,
                    format!(
                        "{} does not belong to the token in {}: its public key is {ours}, the token's public_key is {pk}",
                        seed_path.display(),
                        token.path.display()
                    ),
                ));
            }
        }
        Ok(signing)
    }

    /// The `choria` provider's TLS: always on, verified when a CA is set,
    /// mutual when a certificate and key are set.
    fn choria_tls(&self, warnings: &mut Vec<ConfigWarning>) -> Result<TlsSettings, ConfigError> {
        let mut tls = TlsSettings {
            required: true,
            ..TlsSettings::default()
        };
        match self.choria_ca.as_deref() {
            Some(ca) => tls.ca_file = Some(self.existing_file(KEY_CHORIA_CA, Some(ca))?),
            None => {
                tls.insecure_skip_verify = true;
                warnings.push(self.warn(
                    KEY_CHORIA_CA,
                    "not set, so the broker's TLS certificate is not verified (as go-choria does)",
                ));
            }
        }
        tls.client_cert = match (
            self.choria_certificate.as_deref(),
            self.choria_key.as_deref(),
        ) {
            (Some(c), Some(k)) => Some((
                self.existing_file(KEY_CHORIA_CERT, Some(c))?,
                self.existing_file(KEY_CHORIA_KEY, Some(k))?,
            )),
            (Some(_), None) => {
                return Err(self.err(
                    KEY_CHORIA_CERT,
                    format!("set without {KEY_CHORIA_KEY}; set both for mutual TLS"),
                ))
            }
            (None, Some(_)) => {
                return Err(self.err(
                    KEY_CHORIA_KEY,
                    format!("set without {KEY_CHORIA_CERT}; set both for mutual TLS"),
                ))
            }
            (None, None) => None,
        };
        Ok(tls)
    }

    /// go-choria features a provisioner cannot use; erroring beats connecting
    /// in a way the broker then rejects.
    fn check_unsupported(&self, provider: SecurityProvider) -> Result<(), ConfigError> {
        // Values read are never empty, so a key that is set is in use.
        let is_true = |key: &str| self.option(key).and_then(str_to_bool) == Some(true);
        if self.option(KEY_NATS_CREDS).is_some() {
            return Err(self.err(KEY_NATS_CREDS, "NATS credentials files are not supported"));
        }
        if is_true(KEY_CLIENT_ANON_TLS) {
            return Err(self.err(
                KEY_CLIENT_ANON_TLS,
                "anonymous client TLS needs a remote request signer, which is not supported",
            ));
        }
        let remote_signer = if self.option(KEY_SIGNER_URL).is_some() {
            Some(KEY_SIGNER_URL)
        } else if is_true(KEY_SIGNER_SERVICE) {
            Some(KEY_SIGNER_SERVICE)
        } else {
            None
        };
        if let Some(key) = remote_signer {
            return Err(self.err(key, "remote request signers (aaasvc) are not supported"));
        }
        if provider == SecurityProvider::Choria {
            if let Some(key) = [KEY_SIGNER_TOKEN, KEY_SIGNER_SEED]
                .into_iter()
                .find(|k| self.option(k).is_some())
            {
                return Err(self.err(key, "can not be used with the choria security provider"));
            }
        }
        Ok(())
    }

    fn existing_file(&self, key: &str, path: Option<&Path>) -> Result<PathBuf, ConfigError> {
        let Some(path) = path else {
            return Err(self.err(key, "not set; it is required by this security provider"));
        };
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => Ok(path.to_path_buf()),
            Ok(_) => Err(self.err(key, format!("{} is not a file", path.display()))),
            Err(e) => Err(self.err(key, format!("{}: {e}", path.display()))),
        }
    }

    fn read_rsa_key(&self, path: &Path) -> Result<rsa::RsaPrivateKey, ConfigError> {
        use rsa::pkcs1::DecodeRsaPrivateKey;
        use rsa::pkcs8::DecodePrivateKey;
        let data = std::fs::read(path)
            .map_err(|e| self.err(KEY_FILE_KEY, format!("{}: {e}", path.display())))?;
        let block = pem::parse(&data).map_err(|_| {
            self.err(
                KEY_FILE_KEY,
                format!("{} holds no PEM private key", path.display()),
            )
        })?;
        rsa::RsaPrivateKey::from_pkcs1_der(block.contents())
            .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_der(block.contents()))
            .map_err(|_| {
                self.err(
                    KEY_FILE_KEY,
                    format!(
                        "{} is not an RSA private key (PKCS#1 or PKCS#8 PEM)",
                        path.display()
                    ),
                )
            })
    }

    /// `plugin.security.choria.seed_file`, defaulting like go-choria to the
    /// token file with its extension replaced by `.key`.
    pub fn seed_file(&self) -> Result<PathBuf, ConfigError> {
        if let Some(s) = &self.choria_seed_file {
            return self.existing_file(KEY_CHORIA_SEED, Some(s));
        }
        let token = self.existing_file(KEY_CHORIA_TOKEN, self.choria_token_file.as_deref())?;
        let seed = token.with_extension("key");
        if seed.is_file() {
            Ok(seed)
        } else {
            Err(self.err(
                KEY_CHORIA_SEED,
                format!(
                    "not set, and the default {} (beside the token) does not exist",
                    seed.display()
                ),
            ))
        }
    }

    pub(super) fn client_token(&self, env: &Environment) -> Result<ClientToken, ConfigError> {
        let path = self.existing_file(KEY_CHORIA_TOKEN, self.choria_token_file.as_deref())?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| self.err(KEY_CHORIA_TOKEN, format!("{}: {e}", path.display())))?;
        let jwt = text.trim().to_string();
        let bad = |what: String| self.err(KEY_CHORIA_TOKEN, format!("{}: {what}", path.display()));
        let claims: ClientIdClaims =
            parse_unverified(&jwt).map_err(|e| bad(format!("not a JWT: {e}")))?;
        let purpose = claims.standard.purpose.as_str();
        let caller = claims.caller_id.clone();
        // go-choria also takes a token without `purpose` that has a caller.
        if !(purpose == CLIENT_ID_PURPOSE || (purpose.is_empty() && !caller.is_empty())) {
            return Err(bad(format!(
                "is a {purpose:?} token, not a client token (create one with `choria jwt client`)"
            )));
        }
        if caller.is_empty() {
            return Err(bad("the token has no callerid".into()));
        }
        if let Some(exp) = claims.standard.expires_at {
            // go-choria validates with 5 seconds of leeway.
            if exp + 5 < env.now_unix {
                let when = chrono::DateTime::from_timestamp(exp, 0)
                    .map_or_else(|| exp.to_string(), |t| t.to_rfc3339());
                return Err(bad(format!("the token expired at {when}")));
            }
        }
        let public_key = Some(claims.standard.public_key).filter(|p| !p.is_empty());
        Ok(ClientToken {
            path,
            jwt,
            caller,
            public_key,
        })
    }
}

pub(super) struct ClientToken {
    path: PathBuf,
    jwt: String,
    pub(super) caller: String,
    public_key: Option<String>,
}
