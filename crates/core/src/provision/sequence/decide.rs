//! Deciding a node's configuration and signing for it: the template and
//! the helper, cert-manager, the server JWT and the key sent to the node.
//! Each takes a `workers` slot while it works.

use super::{HostSequence, ProvisionError};
use crate::provision::signing::certmanager::SignError;
use crate::provision::signing::credentials::SigningToken;
use crate::provision::signing::grants;
use crate::provision::signing::helper::{HelperInput, HelperResponse};
use crate::provision::signing::template;
use crate::provision::traces::traced;
use choria_wire::security::ecdh::EcdhKeyPair;
use choria_wire::security::pem_crypt::encrypt_private_key;
use choria_wire::security::tokens::{ServerClaims, TokenSigningKey, PROVISIONER_ISSUER};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

impl HostSequence {
    /// The node's configuration: the template's, the helper's, or the
    /// helper's merged over the template's (`template::merge`).
    /// A grant refused: counted, and the node fails.
    pub(super) fn refused(&self, e: grants::Refused) -> ProvisionError {
        self.ctx.metrics.refused_value(e.place);
        ProvisionError::Refused(e)
    }

    pub(super) async fn decide(&self) -> Result<HelperResponse, ProvisionError> {
        self.gate_check()?;
        let _working = self.working().await?;
        self.gate_check()?;
        let input = HelperInput {
            identity: &self.identity,
            csr: self.got.csr.as_ref(),
            ed25519_pubkey: self.got.ed25519.as_ref(),
            inventory: &self.got.inventory,
            jwt: self.got.jwt.as_ref(),
        };
        let templated = match &self.ctx.signing.template {
            Some(t) => {
                let span = self.trace.as_deref().map(|t| (t, t.start("template")));
                let rendered = t.render(&input);
                if let Some((trace, span)) = span {
                    let failed = rendered.as_ref().err();
                    trace.end(span, failed.map(|e| e as &dyn std::fmt::Display));
                }
                Some(rendered.map_err(|e| {
                    self.ctx.metrics.template_error();
                    if let Some(place) = e.refused {
                        self.ctx.metrics.refused_value(place.label());
                    }
                    ProvisionError::Template(e)
                })?)
            }
            None => None,
        };
        let Some(helper) = &self.ctx.signing.helper else {
            // The configuration says one of the two is there.
            return Ok(templated.unwrap_or_default());
        };
        let started = Instant::now();
        let run = async {
            tokio::select! {
                r = helper.run(&input) => r.map_err(ProvisionError::Helper),
                _ = self.ctx.abandon.cancelled() => Err(ProvisionError::Abandoned),
            }
        };
        let result = traced(self.trace.as_deref(), "helper", run).await;
        if matches!(result, Err(ProvisionError::Abandoned)) {
            return result;
        }
        self.ctx.metrics.observe_helper(started.elapsed());
        let helped = result.inspect_err(|_| self.ctx.metrics.helper_error())?;
        Ok(match templated {
            Some(t) => template::merge(t, helped),
            None => helped,
        })
    }

    /// The certificate and CA from cert-manager, when it is the signer and
    /// the helper (if any) gave no certificate.
    pub(super) async fn sign_with_cert_manager(
        &self,
        response: &mut HelperResponse,
    ) -> Result<(), ProvisionError> {
        let (Some(signer), Some(csr)) = (&self.ctx.signing.cert_manager, &self.got.csr) else {
            return Ok(());
        };
        self.gate_check()?;
        // Signing is work: `workers` bounds the requests cert-manager has
        // in hand from us at once.
        let _working = self.working().await?;
        let started = Instant::now();
        match signer
            .sign(&self.identity, &csr.csr, &self.ctx.gate, &self.ctx.abandon)
            .await
        {
            Ok(issued) => {
                self.ctx.metrics.cert_manager_request("issued");
                debug!(node = &*self.identity, took = ?started.elapsed(), "certificate issued by cert-manager");
                response.certificate = issued.certificate;
                if response.ca.is_empty() {
                    response.ca = issued.ca;
                }
                Ok(())
            }
            Err(SignError::Paused(p)) => Err(ProvisionError::Paused(p)),
            Err(SignError::Abandoned) => Err(ProvisionError::Abandoned),
            Err(e) => {
                self.ctx.metrics.cert_manager_request(e.outcome());
                Err(ProvisionError::CertManager(e))
            }
        }
    }

    /// The certificate and CA from the built-in CA, when it is the signer
    /// and the helper (if any) gave no certificate.
    pub(super) async fn sign_with_ca(
        &self,
        response: &mut HelperResponse,
    ) -> Result<(), ProvisionError> {
        let (Some(ca), Some(csr)) = (&self.ctx.signing.ca, &self.got.csr) else {
            return Ok(());
        };
        self.gate_check()?;
        let _working = self.working().await?;
        match ca.sign(&csr.csr).await {
            Ok(issued) => {
                self.ctx.metrics.ca_signature("issued");
                response.certificate = issued.certificate;
                if response.ca.is_empty() {
                    response.ca = issued.ca;
                }
                Ok(())
            }
            Err(e) => {
                self.ctx.metrics.ca_signature(e.outcome());
                Err(ProvisionError::Ca(e))
            }
        }
    }

    /// The server JWT for ed25519 networks, as Go's `generateServerJWT`
    /// makes it. A key in a PKCS#11 token signs in the blocking pool: each
    /// signature is a blocking call into the token (a network HSM takes
    /// milliseconds), which must not hold up an async worker. A key in
    /// memory signs here, as cheaply as ever.
    pub(super) async fn sign_server_jwt(
        &self,
        response: &HelperResponse,
    ) -> Result<String, ProvisionError> {
        let claims = self.server_jwt_claims(response)?;
        // Rotated keys take effect: the watcher reads changed files again.
        let key = self.ctx.signing.credentials.signing_key()?;
        let signer = self.ctx.signing.credentials.signing_token()?;
        if !key.in_token() {
            return sign_server_claims(&key, &signer, claims);
        }
        tokio::task::spawn_blocking(move || sign_server_claims(&key, &signer, claims))
            .await
            .map_err(|_| ProvisionError::ServerJwtSetup("the token signing task failed"))?
    }

    /// The server JWT's claims, before they are signed.
    fn server_jwt_claims(&self, response: &HelperResponse) -> Result<ServerClaims, ProvisionError> {
        let cfg = &self.ctx.cfg;
        let Some(ed) = self.got.ed25519.as_ref() else {
            return Err(ProvisionError::ServerJwtSetup("no ed25519 public key set"));
        };
        let mut org = "choria".to_string();
        let mut validity = cfg.server_jwt_validity;
        let mut collectives = vec!["mcollective".to_string()];
        let mut pub_subjects = Vec::new();
        let mut permissions = None;
        // Choria switches its default collective with the v2 security provider.
        if response
            .configuration
            .get("plugin.security.provider")
            .is_some_and(|p| p == "choria")
        {
            collectives = vec!["choria".to_string()];
        }
        if let Some(c) = response.configuration.get("collectives") {
            collectives = grants::split_list(c);
        }
        if let Some(claims) = &response.server_claims {
            if !claims.organization_unit.is_empty() {
                org = claims.organization_unit.clone();
            }
            if let Some(exp) = claims.standard.expires_at.filter(|e| *e > 0) {
                let now = chrono::Utc::now().timestamp();
                validity = Duration::from_secs(exp.saturating_sub(now).max(0) as u64);
            }
            if !claims.collectives.is_empty() {
                collectives = claims.collectives.clone();
            }
            if !claims.additional_publish_subjects.is_empty() {
                pub_subjects = claims.additional_publish_subjects.clone();
            }
            if claims.permissions.is_some() {
                permissions = claims.permissions;
            }
        }
        grants::check_collectives("collectives", &collectives).map_err(|e| self.refused(e))?;
        grants::check_publish_subjects(&pub_subjects).map_err(|e| self.refused(e))?;
        if validity <= Duration::from_secs(3600) {
            warn!(node = &*self.identity, requested = ?validity, default = %cfg.server_jwt_validity_text(), "server JWT validity too short, using the default");
            validity = cfg.server_jwt_validity;
        }
        ServerClaims::new(
            &self.identity,
            collectives,
            &org,
            permissions,
            pub_subjects,
            &ed.public_key,
            PROVISIONER_ISSUER,
            validity,
        )
        .map_err(ProvisionError::ServerJwt)
    }

    /// Encrypts the helper's private key to the node (X25519 + AES-256 PEM);
    /// returns the encrypted PEM and our public half for the node.
    pub(super) fn encrypt_key(&self, key_pem: &str) -> Result<(String, String), ProvisionError> {
        let err = ProvisionError::KeyEncryption;
        if self.got.ecdh_public.is_empty() {
            return Err(err(
                "the helper returned a private key but the node did not start a Diffie-Hellman exchange (enable features.jwt so its jwt reply carries ecdh_public)".into(),
            ));
        }
        let ours = EcdhKeyPair::generate();
        let shared = ours
            .shared_secret(&self.got.ecdh_public)
            .map_err(|e| err(format!("the node's ecdh_public is unusable: {e}")))?;
        let encrypted = encrypt_private_key(key_pem, &shared).map_err(|e| err(e.to_string()))?;
        Ok((encrypted, ours.public_hex()))
    }
}

/// Chain-signs `claims` as `signer` when there is a chain issuer token, and
/// signs them with `key`: in a token, blocking.
fn sign_server_claims(
    key: &TokenSigningKey,
    signer: &SigningToken,
    mut claims: ServerClaims,
) -> Result<String, ProvisionError> {
    let err = ProvisionError::ServerJwt;
    if let Some((_, signer)) = signer {
        let Some(ed_key) = key.as_ed25519() else {
            return Err(ProvisionError::ServerJwtSetup(
                "jwt_signing_key must be an ed25519 key to chain-sign",
            ));
        };
        claims.add_chain_issuer_data(signer, ed_key).map_err(err)?;
    }
    key.sign(&claims).map_err(err)
}
