//! The token kinds a provisioner handles: provisioning, server and client id claims.

use super::*;

/// `tokens.ProvisioningClaims`. Field order is Go's marshal order. `Debug`
/// redacts `cht` and `chpwd`.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisioningClaims {
    /// `cht`: the shared secret sent as `token` in every provisioning RPC.
    #[serde(rename = "cht", default, deserialize_with = "null_default")]
    pub token: String,
    /// `chs`: protocol security during provisioning.
    #[serde(rename = "chs", default, deserialize_with = "null_default")]
    pub secure: bool,
    /// `chu`: comma separated broker URLs.
    #[serde(
        rename = "chu",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub urls: String,
    /// `chsrv`: SRV domain.
    #[serde(
        rename = "chsrv",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub srv_domain: String,
    /// `chpd`: provision by default (must be true for provisioning to happen).
    #[serde(rename = "chpd", default, deserialize_with = "null_default")]
    pub prov_default: bool,
    /// `chrd`: registration data file.
    #[serde(
        rename = "chrd",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_reg_data: String,
    /// `chf`: facts file.
    #[serde(
        rename = "chf",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_facts: String,
    /// `chusr`: broker user for the provisioning connection.
    #[serde(
        rename = "chusr",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_nats_user: String,
    /// `chpwd`: broker password for the provisioning connection.
    #[serde(
        rename = "chpwd",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub prov_nats_pass: String,
    /// `extensions`: free-form object, **not** omitempty (`null` when unset,
    /// `{}` when an empty map was given, as in Go).
    #[serde(default, serialize_with = "serialize_extensions")]
    pub extensions: Option<serde_json::Map<String, serde_json::Value>>,
    /// `ou`: organization (parsers default it to `choria`).
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `v2`: provision with protocol v2 / choria security.
    #[serde(
        rename = "v2",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub proto_v2: bool,
    /// `update`: allow `release_update`.
    #[serde(
        rename = "update",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub allow_update: bool,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl fmt::Debug for ProvisioningClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &str| if s.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("ProvisioningClaims")
            .field("token", &redact(&self.token))
            .field("secure", &self.secure)
            .field("urls", &self.urls)
            .field("srv_domain", &self.srv_domain)
            .field("prov_default", &self.prov_default)
            .field("prov_reg_data", &self.prov_reg_data)
            .field("prov_facts", &self.prov_facts)
            .field("prov_nats_user", &self.prov_nats_user)
            .field("prov_nats_pass", &redact(&self.prov_nats_pass))
            .field("extensions", &self.extensions)
            .field("organization_unit", &self.organization_unit)
            .field("proto_v2", &self.proto_v2)
            .field("allow_update", &self.allow_update)
            .field("standard", &self.standard)
            .finish()
    }
}

/// The `extensions` key of a provisioning JWT minted for one node (a join
/// token): the identity it may be used under.
pub const BOUND_IDENTITY: &str = "identity";

impl ProvisioningClaims {
    /// The identity this JWT is bound to (`extensions.identity`), when it
    /// is a join token; an `identity` that is not a non-empty string is an
    /// error, never "unbound".
    pub fn bound_identity(&self) -> Result<Option<&str>, TokenError> {
        match self.extensions.as_ref().and_then(|e| e.get(BOUND_IDENTITY)) {
            None => Ok(None),
            Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(Some(s)),
            Some(_) => Err(TokenError::InvalidClaims(format!(
                "extensions.{BOUND_IDENTITY} must be a node's identity"
            ))),
        }
    }

    /// Binds this JWT to one node's identity (`token issue`).
    pub fn bind_identity(&mut self, identity: &str) {
        self.extensions
            .get_or_insert_with(serde_json::Map::new)
            .insert(BOUND_IDENTITY.into(), identity.into());
    }

    /// `tokens.NewProvisioningClaims` for tests and simulators: `chpd` true,
    /// `chs` false, `ou` `choria`, `purpose` and `sub` `choria_provisioning`,
    /// default issuer. Set other public fields afterwards as needed. One of
    /// `urls` / `srv_domain` is required, as in Go.
    pub fn new_at(
        token: &str,
        urls: &str,
        srv_domain: &str,
        validity: Duration,
        now: i64,
    ) -> Result<Self, TokenError> {
        if urls.is_empty() && srv_domain.is_empty() {
            return Err(TokenError::InvalidClaims(
                "srv domain or urls required".into(),
            ));
        }
        Ok(Self {
            token: token.to_string(),
            urls: urls.to_string(),
            srv_domain: srv_domain.to_string(),
            prov_default: true,
            organization_unit: DEFAULT_ORG.to_string(),
            standard: StandardClaims::new_at("", PROVISIONING_PURPOSE, validity, now, true)?,
            ..Self::default()
        })
    }
}

/// `tokens.ServerPermissions`; every flag is omitempty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerPermissions {
    /// Access to `<collective>.submission.in.>`.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub submission: bool,
    /// Choria Streams access.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams: bool,
    /// Governor access.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub governor: bool,
    /// May host services.
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub service_host: bool,
}

/// `tokens.ServerClaims`. `collectives` is not omitempty; an empty list is
/// written as `[]` (Go writes `null` for a nil slice; issued tokens always
/// have at least one collective).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerClaims {
    /// Server identity.
    #[serde(default, deserialize_with = "null_default")]
    pub identity: String,
    /// Collectives the server belongs to.
    #[serde(default, deserialize_with = "null_default")]
    pub collectives: Vec<String>,
    /// Extra permissions (`{}` when present but all false, as in Go).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<ServerPermissions>,
    /// `ou`.
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `pub_subjects`.
    #[serde(
        rename = "pub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_publish_subjects: Vec<String>,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl ServerClaims {
    /// `tokens.NewServerClaims` as called by the Go provisioner: `purpose`
    /// `choria_server`, no `sub`, `iat = nbf = now`, `exp = now + validity`,
    /// `jti` = KSUID(now), `public_key` = the server's ed25519 key from
    /// `gen25519` (normalised to lowercase hex), `ou` defaulted to `choria`,
    /// `iss` defaulted to [`DEFAULT_ISSUER`] (the provisioner passes
    /// [`PROVISIONER_ISSUER`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        identity: &str,
        collectives: Vec<String>,
        ou: &str,
        permissions: Option<ServerPermissions>,
        pub_subjects: Vec<String>,
        server_public_key_hex: &str,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        Self::new_at(
            unix_now(),
            identity,
            collectives,
            ou,
            permissions,
            pub_subjects,
            server_public_key_hex,
            issuer,
            validity,
        )
    }

    /// [`ServerClaims::new`] at a fixed time (Unix seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn new_at(
        now: i64,
        identity: &str,
        collectives: Vec<String>,
        ou: &str,
        permissions: Option<ServerPermissions>,
        pub_subjects: Vec<String>,
        server_public_key_hex: &str,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        if identity.is_empty() {
            return Err(TokenError::InvalidClaims("identity is required".into()));
        }
        if collectives.is_empty() {
            return Err(TokenError::InvalidClaims(
                "at least one collective is required".into(),
            ));
        }
        if server_public_key_hex.is_empty() {
            return Err(TokenError::InvalidClaims("public key is required".into()));
        }
        let pk = decode_hex_array::<32>(server_public_key_hex).map_err(|e| {
            TokenError::InvalidClaims(format!("server public key is not a hex ed25519 key: {e}"))
        })?;
        if validity.is_zero() {
            return Err(TokenError::InvalidClaims("validity is required".into()));
        }
        let mut standard = StandardClaims::new_at(issuer, SERVER_PURPOSE, validity, now, false)?;
        standard.public_key = hex::encode(pk);
        Ok(Self {
            identity: identity.to_string(),
            collectives,
            permissions,
            organization_unit: if ou.is_empty() {
                DEFAULT_ORG.to_string()
            } else {
                ou.to_string()
            },
            additional_publish_subjects: pub_subjects,
            standard,
        })
    }

    /// Chain-signs this token with the provisioner's `jwt_signing_token` and
    /// `jwt_signing_key` (see [`StandardClaims::add_chain_issuer_data`]).
    pub fn add_chain_issuer_data<K: Ed25519Signer + ?Sized>(
        &mut self,
        signer_token: &ClientIdClaims,
        signer_key: &K,
    ) -> Result<(), TokenError> {
        self.standard
            .add_chain_issuer_data(&signer_token.standard, signer_key)
    }
}

/// `tokens.ClientPermissions`; every flag is omitempty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ClientPermissions {
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams_admin: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub streams_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub events_viewer: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub election_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub system_user: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub governor: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub org_admin: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub fleet_management: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub signed_fleet_management: bool,
    /// `service`: extended service lifetime.
    #[serde(
        rename = "service",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub extended_service_lifetime: bool,
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub authentication_delegator: bool,
    /// `provisioner`: may connect to the provisioning account.
    #[serde(
        rename = "provisioner",
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "null_default"
    )]
    pub server_provisioner: bool,
}

/// `tokens.ClientIDClaims`, used for the provisioner's `jwt_signing_token`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientIdClaims {
    /// `callerid` (not omitempty).
    #[serde(rename = "callerid", default, deserialize_with = "null_default")]
    pub caller_id: String,
    /// `agents`.
    #[serde(
        rename = "agents",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub allowed_agents: Vec<String>,
    /// `ou`.
    #[serde(
        rename = "ou",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub organization_unit: String,
    /// `user_properties` (sorted on output like a Go map).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_default"
    )]
    pub user_properties: BTreeMap<String, String>,
    /// `opa_policy`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "null_default"
    )]
    pub opa_policy: String,
    /// `permissions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<ClientPermissions>,
    /// `pub_subjects`.
    #[serde(
        rename = "pub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_publish_subjects: Vec<String>,
    /// `sub_subjects`.
    #[serde(
        rename = "sub_subjects",
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub additional_subscribe_subjects: Vec<String>,
    /// Embedded standard claims.
    #[serde(flatten)]
    pub standard: StandardClaims,
}

impl ClientIdClaims {
    /// `tokens.NewClientIDClaims` (subset) for tests: `purpose`
    /// `choria_client_id`, `ou` defaulted to `choria`.
    pub fn new_at(
        now: i64,
        caller_id: &str,
        public_key_hex: Option<&str>,
        issuer: &str,
        validity: Duration,
    ) -> Result<Self, TokenError> {
        if caller_id.is_empty() {
            return Err(TokenError::InvalidClaims("caller id is required".into()));
        }
        let mut standard = StandardClaims::new_at(issuer, CLIENT_ID_PURPOSE, validity, now, false)?;
        standard.public_key = public_key_hex.unwrap_or_default().to_string();
        Ok(Self {
            caller_id: caller_id.to_string(),
            organization_unit: DEFAULT_ORG.to_string(),
            standard,
            ..Self::default()
        })
    }
}

// ---------------------------------------------------------------------------

/// The token kinds that embed [`StandardClaims`] as `standard`.
macro_rules! has_standard_claims {
    ($($t:ty),*) => {
        $(impl HasStandardClaims for $t {
            fn standard(&self) -> &StandardClaims {
                &self.standard
            }
        })*
    };
}
has_standard_claims!(ProvisioningClaims, ServerClaims, ClientIdClaims);
