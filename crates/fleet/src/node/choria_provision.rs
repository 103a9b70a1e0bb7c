//! The `choria_provision` agent: go-choria's provisioning actions with their
//! token check, provisioning lock and messages (`jwt`, `gen25519`, `gencsr`,
//! `configure`, `restart`, `shutdown`, `reprovision`, `release_update`).

use super::*;

impl Node {
    pub(super) fn parse<T: for<'de> Deserialize<'de>>(
        &self,
        action: &str,
        data: &str,
    ) -> Result<T, Box<Handled>> {
        serde_json::from_str(data).map_err(|e| {
            Box::new(self.reply_error(
                action,
                StatusCode::InvalidData,
                format!("Could not parse request data for choria_provision#{action}: {e}"),
            ))
        })
    }

    /// go-choria's `checkToken`: with no token in the provisioning JWT any token passes.
    pub(super) fn check_token(&self, action: &str, token: &str) -> Result<(), Box<Handled>> {
        if self.shared.token.is_empty() || token == self.shared.token {
            Ok(())
        } else {
            Err(Box::new(
                self.abort(action, "Incorrect provision token supplied"),
            ))
        }
    }

    /// The per-server provisioning lock keyed on `<senderid>.<callerid>`.
    pub(super) fn take_lock(&mut self, req: &Request) -> bool {
        let key = format!("{}.{}", req.sender, req.caller);
        let now = Instant::now();
        match &self.lock {
            Some((holder, until)) if *holder != key && *until > now => false,
            _ => {
                self.lock = Some((key, now + LOCK_WINDOW));
                true
            }
        }
    }

    pub(super) fn provision(&mut self, action: &str, data: &str, req: &Request) -> Handled {
        const LOCKED: &[&str] = &["configure", "gen25519", "gencsr", "jwt", "release_update"];
        const KNOWN: &[&str] = &[
            "configure",
            "gen25519",
            "gencsr",
            "jwt",
            "release_update",
            "reprovision",
            "restart",
            "shutdown",
        ];
        if !KNOWN.contains(&action) {
            return self.reply_error(
                action,
                StatusCode::UnknownAction,
                format!("Unknown action {action} for agent choria_provision"),
            );
        }
        if LOCKED.contains(&action) && !self.take_lock(req) {
            return self.abort(action, "Could not obtain provisioning lock");
        }
        let result = match action {
            "jwt" => self.jwt(data),
            "gen25519" => self.gen25519(data),
            "gencsr" => self.gencsr(data),
            "configure" => self.configure(data),
            "restart" => self.restart(data),
            "shutdown" => self.shutdown(data),
            "reprovision" => self.reprovision(data),
            "release_update" => self.release_update(data),
            _ => unreachable!("checked against KNOWN"),
        };
        result.unwrap_or_else(|boxed| *boxed)
    }

    pub(super) fn jwt(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
        }
        let args: Args = self.parse("jwt", data)?;
        self.check_token("jwt", &args.token)?;
        let Some(jwt) = self.shared.provisioning_jwt.clone() else {
            return Ok(self.abort("jwt", "No Provisioning JWT file has been configured"));
        };
        // A new X25519 pair per call, replacing any earlier one, as go-choria does.
        let ecdh = EcdhKeyPair::generate();
        #[derive(Serialize)]
        struct Reply {
            jwt: String,
            ecdh_public: String,
        }
        let reply = Reply {
            jwt,
            ecdh_public: ecdh.public_hex(),
        };
        self.ecdh = Some(ecdh);
        Ok(self.reply_ok("jwt", &reply))
    }

    pub(super) fn gen25519(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            nonce: String,
        }
        let args: Args = self.parse("gen25519", data)?;
        self.check_token("gen25519", &args.token)?;
        let pair = Ed25519KeyPair::generate();
        #[derive(Serialize)]
        struct Reply {
            public_key: String,
            directory: String,
            signature: String,
        }
        let reply = Reply {
            public_key: pair.public_hex(),
            directory: self.config_dir(),
            signature: pair.sign_nonce_hex(&args.nonce),
        };
        // A new seed invalidates any server JWT issued for the old one.
        self.written.server_jwt = None;
        self.written.ed25519_public = Some(reply.public_key.clone());
        Ok(self.reply_ok("gen25519", &reply))
    }

    pub(super) fn gencsr(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            cn: String,
            #[serde(default, rename = "C")]
            country: String,
            #[serde(default, rename = "L")]
            locality: String,
            #[serde(default, rename = "O")]
            organization: String,
            #[serde(default, rename = "OU")]
            organizational_unit: String,
            #[serde(default, rename = "ST")]
            state: String,
        }
        let args: Args = self.parse("gencsr", data)?;
        self.check_token("gencsr", &args.token)?;
        let key = self.shared.key_pool.get(self.index);
        let default_subject = (args.cn.is_empty() || args.cn == self.identity)
            && args.country.is_empty()
            && args.locality.is_empty()
            && args.organization.is_empty()
            && args.organizational_unit.is_empty();
        let presigned = self
            .shared
            .presigned_csrs
            .get(self.index)
            .filter(|_| default_subject)
            .cloned();
        let mut subject = CsrSubject::new(if args.cn.is_empty() {
            self.identity.clone()
        } else {
            args.cn
        });
        let opt = |s: String| (!s.is_empty()).then_some(s);
        subject.country = opt(args.country);
        subject.locality = opt(args.locality);
        subject.organization = opt(args.organization);
        subject.organizational_unit = opt(args.organizational_unit);
        // go-choria accepts ST but never puts it into the subject.
        let _ = args.state;
        let made = match presigned {
            Some(pem) => Ok(pem),
            None => csr::make_csr(&key, &subject),
        };
        let csr_pem = match made {
            Ok(c) => c,
            Err(e) => return Ok(self.abort("gencsr", format!("Could not create CSR: {e}"))),
        };
        let public_key = match csr::public_key_pem_go_style(&key.to_public_key()) {
            Ok(p) => p,
            Err(e) => return Ok(self.abort("gencsr", format!("Could not encode public key: {e}"))),
        };
        #[derive(Serialize)]
        struct Reply {
            csr: String,
            public_key: String,
            ssldir: String,
        }
        Ok(self.reply_ok(
            "gencsr",
            &Reply {
                csr: csr_pem,
                public_key,
                ssldir: self.ssl_dir(),
            },
        ))
    }

    pub(super) fn configure(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        let a = "configure";
        let args: ConfigureArgs = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        if args.config.is_empty() {
            return Ok(self.abort(
                a,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            ));
        }
        if !args.key.is_empty() && args.ecdh_public.is_empty() {
            return Ok(self.abort(
                a,
                "EDCH Public Key not supplied while providing a private key",
            ));
        }
        let settings: BTreeMap<String, String> = match serde_json::from_str(&args.config) {
            Ok(s) => s,
            Err(e) => return Ok(self.abort(a, format!("Could not decode configuration data: {e}"))),
        };

        if !args.certificate.is_empty() && !args.ssldir.is_empty() && !args.ca.is_empty() {
            if let Err(failed) = self.write_tls(&args) {
                return Ok(self.abort(a, format!("TLS Setup Failed: {failed}")));
            }
        }
        if !args.server_jwt.is_empty() {
            self.written.server_jwt = Some(args.server_jwt.clone());
        }
        if let Err(e) = validate_config(&settings) {
            return Ok(self.abort(
                a,
                format!("Could not write config: generated configuration could not be parsed: {e}"),
            ));
        }
        if let Err(refused) = check_policy_names(&args) {
            return Ok(self.abort(a, refused));
        }
        let lines = settings.len() + 1;
        self.written.config = Some(settings);
        self.configured += 1;
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Wrote {lines} lines to {}", self.config_file()),
            },
        );
        handled.effects.events.push(EventType::Provisioned);
        Ok(handled)
    }

    /// `configure`'s TLS material as the node writes it: the private key
    /// decrypted with the ECDH secret shared with the provisioner (when one
    /// is sent), then the certificate and CA; none of them when the key
    /// cannot be decrypted.
    fn write_tls(&mut self, args: &ConfigureArgs) -> Result<(), String> {
        if !args.key.is_empty() {
            let Some(ecdh) = &self.ecdh else {
                return Err("private key not set".into());
            };
            let shared = ecdh
                .shared_secret(&args.ecdh_public)
                .map_err(|e| e.to_string())?;
            let der =
                pem_crypt::decrypt_private_key(&args.key, &shared).map_err(|e| e.to_string())?;
            self.written.private_key = Some(der);
        }
        self.written.certificate = Some(args.certificate.clone());
        self.written.ca = Some(args.ca.clone());
        Ok(())
    }

    /// Whether the written configuration turns provisioning off.
    pub fn provision_disabled(&self) -> bool {
        self.written
            .config
            .as_ref()
            .and_then(|c| c.get("plugin.choria.server.provision"))
            .is_some_and(|v| parse_bool(v) == Some(false))
    }

    pub(super) fn provision_enabled_in_config(&self) -> bool {
        self.written
            .config
            .as_ref()
            .and_then(|c| c.get("plugin.choria.server.provision"))
            .is_some_and(|v| parse_bool(v) == Some(true))
    }

    pub(super) fn restart(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            splay: i64,
        }
        let a = "restart";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        if self.provision_enabled_in_config() {
            return Ok(self.abort(
                a,
                format!(
                    "Configuration {} enables provisioning, restart cannot continue",
                    self.config_file()
                ),
            ));
        }
        let splay = if args.splay <= 0 { 10 } else { args.splay };
        let delay = Duration::from_secs(rand::random::<u64>() % splay as u64 + 2);
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Restarting Choria Server after {}s", delay.as_secs()),
            },
        );
        // go-choria allows one restart per process; later requests still get the
        // reply but nothing more happens.
        if !self.restart_scheduled {
            self.restart_scheduled = true;
            handled.effects.events.push(EventType::Shutdown);
            handled.effects.restart_after = Some(delay);
        }
        Ok(handled)
    }

    pub(super) fn shutdown(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
        }
        let a = "shutdown";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        let delay = Duration::from_secs(rand::random::<u64>() % 10);
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Shutting Choria Server down after {}s", delay.as_secs()),
            },
        );
        handled.effects.shutdown_after = Some(delay);
        Ok(handled)
    }

    pub(super) fn reprovision(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            #[allow(dead_code)]
            token: String,
        }
        let _args: Args = self.parse("reprovision", data)?;
        Ok(self.abort(
            "reprovision",
            "Server is already in provisioning mode, cannot enable provisioning mode again",
        ))
    }

    /// `reprovision` on a provisioned node (go-choria's
    /// `reprovision_action.go`): token-checked, not locked; rewrites the
    /// configuration to provisioning mode and restarts after 2–11 s.
    pub(super) fn reprovision_provisioned(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
        }
        let a = "reprovision";
        let args: Args = self.parse(a, data)?;
        self.check_token(a, &args.token)?;
        self.written.config = Some(
            [
                ("plugin.choria.server.provision", "1"),
                ("loglevel", "debug"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        let delay = Duration::from_secs(rand::random::<u64>() % 10 + 2);
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: format!("Restarting after {}s", delay.as_secs()),
            },
        );
        if !self.restart_scheduled {
            self.restart_scheduled = true;
            handled.effects.events.push(EventType::Shutdown);
            handled.effects.restart_after = Some(delay);
        }
        Ok(handled)
    }

    pub(super) fn release_update(&mut self, data: &str) -> Result<Handled, Box<Handled>> {
        #[derive(Deserialize)]
        struct Args {
            #[serde(default)]
            token: String,
            #[serde(default)]
            repository: String,
            #[serde(default)]
            version: String,
        }
        let a = "release_update";
        let args: Args = self.parse(a, data)?;
        if !self.shared.upgradable {
            return Ok(self.abort(a, "Version updates is not enabled in the configuration"));
        }
        self.check_token(a, &args.token)?;
        if !(args.repository.starts_with("http://") || args.repository.starts_with("https://"))
            || args.version.is_empty()
        {
            return Ok(self.abort(
                a,
                format!(
                    "Update to version {} failed, release rolled back: invalid repository {:?}",
                    args.version, args.repository
                ),
            ));
        }
        // The simulator cannot download a release; it behaves as a successful
        // update: the new version is reported after the restart.
        self.version = args.version;
        let mut handled = self.reply_ok(
            a,
            &MessageReply {
                message: "Restarting Choria Server after 2s".into(),
            },
        );
        handled.effects.events.push(EventType::Upgraded);
        if !self.restart_scheduled {
            self.restart_scheduled = true;
            handled.effects.restart_after = Some(Duration::from_secs(2));
        }
        Ok(handled)
    }
}

/// The arguments of `configure`, each empty when not sent.
#[derive(Deserialize)]
struct ConfigureArgs {
    #[serde(default)]
    token: String,
    #[serde(default)]
    config: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    certificate: String,
    #[serde(default)]
    ca: String,
    #[serde(default)]
    ssldir: String,
    #[serde(default)]
    ecdh_public: String,
    #[serde(default)]
    server_jwt: String,
    #[serde(default)]
    action_policies: BTreeMap<String, String>,
    #[serde(default)]
    opa_policies: BTreeMap<String, String>,
}

/// The policy file names go-choria refuses, with its message: action
/// policies end `.policy`, OPA policies `.rego`.
fn check_policy_names(args: &ConfigureArgs) -> Result<(), String> {
    for name in args.action_policies.keys() {
        if !name.ends_with(".policy") {
            return Err(format!(
                "Could not save Action Policies: expected {name:?} to have .policy extension"
            ));
        }
    }
    for name in args.opa_policies.keys() {
        if !name.ends_with(".rego") {
            return Err(format!(
                "Could not save OPA Policies: expected {name:?} to have .rego extension"
            ));
        }
    }
    Ok(())
}
