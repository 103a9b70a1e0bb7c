//! What the node tells about itself: its provisioning JWT, ed25519 key,
//! inventory and CSR, each checked before anything trusts it.

use super::call::{decode, require_ok};
use super::{HostSequence, ProvisionError};
use crate::provision::signing::helper::{CsrReply, Ed25519Reply};
use choria_config::Secret;
use choria_wire::security::csr::{check_csr, parse_csr};
use choria_wire::security::ed25519::verify_nonce;
use choria_wire::security::tokens::parse_provisioning_token;
use serde::Serialize;

impl HostSequence {
    pub(super) fn token_data(&self) -> TokenOnly<'_> {
        TokenOnly {
            token: self.token.expose(),
        }
    }

    pub(super) async fn fetch_jwt(&mut self) -> Result<(), ProvisionError> {
        #[derive(serde::Deserialize)]
        struct Reply {
            #[serde(default)]
            jwt: String,
            #[serde(default)]
            ecdh_public: String,
        }
        self.step("fetching JWT");
        let token = self.token.expose().to_string();
        let (jwt, ecdh) = self
            .call_trusted(
                "choria_provision#jwt",
                3,
                &TokenOnly { token: &token },
                |r| {
                    require_ok(r)?;
                    let reply: Reply = decode(&r.body.data)?;
                    if reply.jwt.is_empty() {
                        return Err("the reply holds no JWT".into());
                    }
                    Ok((reply.jwt, reply.ecdh_public))
                },
            )
            .await?;
        self.got.raw_jwt = jwt;
        self.got.ecdh_public = ecdh;
        Ok(())
    }

    /// Verifies the provisioning JWT with `jwt_verify_cert` (re-read each time
    /// so a rotated key takes effect) and settles the token to use.
    pub(super) fn validate_jwt(&mut self) -> Result<(), ProvisionError> {
        let key = self.ctx.signing.credentials.verify_key()?;
        let claims =
            parse_provisioning_token(&self.got.raw_jwt, &key).map_err(ProvisionError::Jwt)?;
        if !claims.token.is_empty() {
            if self.token.is_empty() {
                // The JWT is signed by the organisation: its `cht` is the token
                // this node expects, so use it when we were given none.
                self.token = Secret::new(claims.token.clone());
            } else if self.token.expose() != claims.token {
                return Err(ProvisionError::TokenMismatch);
            }
        }
        // A join token names the one node it was minted for: under any
        // other name it is someone else's (a copied file, a stolen token).
        match claims.bound_identity().map_err(ProvisionError::Jwt)? {
            Some(bound) if bound != &*self.identity => {
                return Err(ProvisionError::IdentityBound {
                    bound: choria_wire::identity::shown(bound),
                })
            }
            _ => {}
        }
        self.got.jwt = Some(claims);
        Ok(())
    }

    pub(super) async fn fetch_ed25519(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            nonce: &'t str,
            token: &'t str,
        }
        let nonce = choria_wire::ids::v1_request_id();
        self.step("fetching ED25519 public key");
        let token = self.token.expose().to_string();
        let reply = self
            .call_trusted(
                "choria_provision#gen25519",
                5,
                &Args {
                    nonce: &nonce,
                    token: &token,
                },
                |r| {
                    require_ok(r)?;
                    let reply: Ed25519Reply = decode(&r.body.data)?;
                    if reply.public_key.is_empty() {
                        return Err("no public key received".into());
                    }
                    if reply.signature.is_empty() {
                        return Err("no signature received".into());
                    }
                    verify_nonce(&reply.public_key, &nonce, &reply.signature)
                        .map_err(|e| format!("nonce signature check failed: {e}"))?;
                    Ok(reply)
                },
            )
            .await?;
        self.got.ed25519 = Some(reply);
        Ok(())
    }

    pub(super) async fn fetch_inventory(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Empty {}
        self.step("fetching inventory");
        // Its facts (and the instance evidence among them) decide the
        // node's configuration and admission: taken only when no second,
        // different answer in the node's name follows within the window.
        let (inventory, version, upgradable) = self
            .call_trusted("rpcutil#inventory", 5, &Empty {}, |r| {
                require_ok(r)?;
                let data = &r.body.data;
                if !data.is_object() {
                    return Err("the inventory reply holds no data".into());
                }
                let json = choria_wire::json::to_vec(data)
                    .map_err(|e| format!("could not encode the inventory: {e}"))?;
                let version = data
                    .get("version")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                let upgradable = data
                    .get("upgradable")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false);
                Ok((
                    String::from_utf8(json).expect("JSON is UTF-8"),
                    version,
                    upgradable,
                ))
            })
            .await?;
        self.got.inventory = inventory;
        self.got.version = version;
        self.got.upgradable = upgradable;
        Ok(())
    }

    pub(super) async fn fetch_csr(&mut self) -> Result<(), ProvisionError> {
        #[derive(Serialize)]
        struct Args<'t> {
            cn: &'t str,
            token: &'t str,
        }
        self.step("fetching CSR");
        let token = self.token.expose().to_string();
        let identity = self.identity.clone();
        let reply = self
            .call_trusted(
                "choria_provision#gencsr",
                1,
                &Args {
                    cn: &identity,
                    token: &token,
                },
                |r| {
                    require_ok(r)?;
                    decode::<CsrReply>(&r.body.data)
                },
            )
            .await?;
        if reply.csr.is_empty() {
            return Err(ProvisionError::NoCsr);
        }
        let checked = parse_csr(&reply.csr).and_then(|info| {
            check_csr(
                &info,
                &self.identity,
                &self.ctx.signing.deny_list,
                &self.ctx.signing.csr_allowed_dns,
            )
        });
        if let Err(e) = checked {
            self.ctx.metrics.rejected_csr(e.reason());
            return Err(ProvisionError::Csr(e));
        }
        self.got.csr = Some(reply);
        Ok(())
    }
}

/// Requests whose only input is the token.
#[derive(Serialize)]
pub(super) struct TokenOnly<'t> {
    pub(super) token: &'t str,
}
