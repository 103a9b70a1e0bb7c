//! Dialling the broker: where, with which TLS settings and credentials,
//! and what to tell the caller when the broker says no.

use super::ClientError;
use crate::tls::TlsSettings;
use std::time::Duration;

/// The broker dialled unless told otherwise: NATS on this machine, on its
/// default port.
pub const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// The broker options of the commands that dial like a provisioning-mode
/// server (`fleet`, `discover`): URLs and TLS, no credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerOptions {
    /// NATS server URLs.
    pub nats: Vec<String>,
    /// Verify the broker's TLS certificate against this CA (otherwise TLS, when
    /// used, does not verify, like a provisioning-mode server).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Always use TLS.
    pub tls_required: bool,
}

impl Default for BrokerOptions {
    /// The command line's defaults (a test of `cmd::broker` in the binary
    /// keeps them equal): a local broker, TLS only if it asks, unverified.
    fn default() -> Self {
        BrokerOptions::at([DEFAULT_NATS])
    }
}

impl BrokerOptions {
    /// Brokers at `urls` with the defaults otherwise.
    pub fn at(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        BrokerOptions {
            nats: urls.into_iter().map(Into::into).collect(),
            tls_ca: None,
            tls_required: false,
        }
    }

    /// TLS as a provisioning-mode server does it: unverified unless a CA is given.
    pub fn tls(&self) -> TlsSettings {
        TlsSettings {
            required: self.tls_required,
            insecure_skip_verify: self.tls_ca.is_none(),
            ca_file: self.tls_ca.clone(),
            client_cert: None,
        }
    }
}

/// How to reach and authenticate to the broker.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    pub servers: Vec<String>,
    pub name: String,
    pub tls: TlsSettings,
    pub token: Option<String>,
    pub user: Option<(String, String)>,
    /// NATS user-JWT auth: the JWT and the ed25519 seed that signs the server nonce.
    pub nats_jwt: Option<(String, ed25519_dalek::SigningKey)>,
    pub inbox_prefix: Option<String>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Credentials never reach logs.
        f.debug_struct("ConnectOptions")
            .field("servers", &self.servers)
            .field("name", &self.name)
            .field("tls", &self.tls)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("nats_jwt", &self.nats_jwt.as_ref().map(|_| "<redacted>"))
            .field("inbox_prefix", &self.inbox_prefix)
            .finish()
    }
}

/// Opens a NATS connection the way a Choria client or server does.
pub async fn connect(opts: &ConnectOptions) -> Result<async_nats::Client, ClientError> {
    connect_observed(opts, None, None).await
}

/// [`connect`], handing connection events (disconnected, connected again, slow
/// consumer...) to `events` so the caller can react, e.g. rediscover after the
/// broker came back.
///
/// With a `fence`, reconnects wait as it says (see [`crate::fence`])
/// and it follows whether the connection is up.
pub async fn connect_observed(
    opts: &ConnectOptions,
    events: Option<tokio::sync::mpsc::UnboundedSender<async_nats::Event>>,
    fence: Option<crate::fence::Fence>,
) -> Result<async_nats::Client, ClientError> {
    if opts.servers.is_empty() {
        return Err(ClientError::NoServers);
    }
    let o = observed(nats_options(opts)?, events, fence);
    let servers: Vec<async_nats::ServerAddr> = opts
        .servers
        .iter()
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .map_err(|e: std::io::Error| {
            connect_error(
                opts,
                async_nats::ConnectError::with_source(async_nats::ConnectErrorKind::ServerParse, e),
            )
        })?;
    // The first connection is made before connect() returns, so a bad address is
    // an error here and the server's INFO (its URL for network hops) is known;
    // later disconnects are retried for ever.
    let client = o
        .connect(servers)
        .await
        .map_err(|source| connect_error(opts, source))?;
    Ok(client)
}

/// The async-nats options `opts` asks for: the client's name, TLS and
/// credentials; reconnects are retried for ever.
fn nats_options(opts: &ConnectOptions) -> Result<async_nats::ConnectOptions, ClientError> {
    let mut o = async_nats::ConnectOptions::new()
        .name(if opts.name.is_empty() {
            "choria-provisioner"
        } else {
            &opts.name
        })
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None::<usize>);
    if opts.tls.is_custom() {
        o = o.tls_client_config(opts.tls.client_config()?);
    }
    if opts.tls.required {
        o = o.require_tls(true);
    }
    if let Some(token) = &opts.token {
        o = o.token(token.clone());
    }
    if let Some((user, pass)) = &opts.user {
        o = o.user_and_password(user.clone(), pass.clone());
    }
    if let Some((jwt, seed)) = &opts.nats_jwt {
        let seed = seed.clone();
        o = o.jwt(jwt.clone(), move |nonce| {
            let seed = seed.clone();
            async move {
                use ed25519_dalek::Signer;
                Ok(seed.sign(&nonce).to_bytes().to_vec())
            }
        });
    }
    if let Some(prefix) = &opts.inbox_prefix {
        o = o.custom_inbox_prefix(prefix);
    }
    Ok(o)
}

/// `o` with reconnects paced by `fence`, and connection events handed to
/// `fence` (whether the connection is up) and to `events`.
fn observed(
    mut o: async_nats::ConnectOptions,
    events: Option<tokio::sync::mpsc::UnboundedSender<async_nats::Event>>,
    fence: Option<crate::fence::Fence>,
) -> async_nats::ConnectOptions {
    if let Some(fence) = &fence {
        let f = fence.clone();
        o = o
            .reconnect_delay_callback(move |attempts| f.delay(attempts, std::time::Instant::now()));
    }
    if events.is_some() || fence.is_some() {
        o = o.event_callback(move |event| {
            let tx = events.clone();
            let fence = fence.clone();
            async move {
                if let Some(f) = &fence {
                    match event {
                        async_nats::Event::Disconnected => f.set_connected(false),
                        async_nats::Event::Connected => f.set_connected(true),
                        _ => {}
                    }
                }
                if let Some(tx) = tx {
                    let _ = tx.send(event);
                }
            }
        });
    }
    o
}

/// The error for a connection that failed, with a hint of what to check.
fn connect_error(opts: &ConnectOptions, source: async_nats::ConnectError) -> ClientError {
    let text = format!("{source:?} {source}");
    let hint = if source.kind() == async_nats::ConnectErrorKind::AuthorizationViolation {
        refusal_hint(opts)
    } else {
        crate::tls::explain(&text).unwrap_or("check the broker URL and that the broker is running")
    };
    ClientError::Connect {
        servers: opts.servers.join(","),
        source,
        hint,
    }
}

/// Why a broker refuses these credentials, as a Choria broker decides
/// (go-choria `broker/network/choria_auth.go`): it gives no reason on the
/// wire, so the hint names what it checks for this kind of connection.
fn refusal_hint(opts: &ConnectOptions) -> &'static str {
    match (&opts.user, &opts.token) {
        (Some((user, _)), _) if user == "provisioner" => {
            "the broker refused user provisioner: a Choria broker admits it only over TLS, with \
             broker_provisioning_password equal to its plugin.choria.network.provisioning.client_password, \
             and with a client certificate it verifies (x509 networks: plugin.security.file.certificate \
             and .key in the Choria configuration) or, on an Organization Issuer network, a client JWT \
             with the provisioner permission (`choria jwt client ... --server-provisioner`)"
        }
        (None, Some(_)) if opts.nats_jwt.is_none() => {
            "the broker refused the provisioning JWT: a Choria broker admits a provisioning-mode \
             server only over TLS, with a provisioning JWT signed by the key whose public half is its \
             plugin.choria.network.provisioning.signer_cert (RSA) or by the Organization Issuer named \
             in the JWT's ou (ed25519), and only when the broker has a provisioning password set"
        }
        (_, Some(_)) => {
            "the broker refused the client JWT: it must be issued by an issuer (or signer) the broker \
             trusts, unexpired, and signed for with the seed of its public key"
        }
        _ => "the broker refused the credentials (authorization violation): check the user, \
              password or certificate the broker expects",
    }
}

/// The URL of the server a connection is on, as Go records it in network hops
/// (`seen-by` / `trace`); empty before the first connection.
pub fn connected_url(nats: &async_nats::Client) -> String {
    let info = nats.server_info();
    if info.host.is_empty() {
        String::new()
    } else {
        format!("nats://{}:{}", info.host, info.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_what_a_choria_broker_checks_for_that_kind_of_login() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let provisioner = ConnectOptions {
            user: Some(("provisioner".into(), "secret".into())),
            ..Default::default()
        };
        let hint = refusal_hint(&provisioner);
        assert!(hint.contains("client_password") && hint.contains("client certificate"));
        assert!(!hint.contains("secret"), "never the password");
        let v2_provisioner = ConnectOptions {
            token: Some("jwt".into()),
            nats_jwt: Some(("jwt".into(), key.clone())),
            ..provisioner
        };
        assert_eq!(refusal_hint(&v2_provisioner), hint);
        let node = ConnectOptions {
            token: Some("jwt".into()),
            ..Default::default()
        };
        assert!(refusal_hint(&node).contains("signer_cert"));
        let client = ConnectOptions {
            token: Some("jwt".into()),
            nats_jwt: Some(("jwt".into(), key)),
            ..Default::default()
        };
        assert!(refusal_hint(&client).contains("client JWT"));
        assert!(refusal_hint(&ConnectOptions::default()).contains("authorization violation"));
    }
}
