//! The one definition of `provisioner.yaml`'s keys: the reader
//! ([`super::provisioner`], [`super::election`]) takes its list of known keys
//! from here, and writers (the operator's ConfigMap, tests) build these
//! structs and serialize them. A key added here is known to both; a key the
//! reader reads but the struct lacks fails the round-trip test in
//! `provisioner/tests.rs` (every setting written from a parsed file parses
//! back to the same settings).
//!
//! Values are as written in the file (durations as text such as `10m`),
//! before defaults and checks: that is the reader's job.

use serde::Serialize;
use std::collections::BTreeMap;

/// One key of a section, for the book's generated reference
/// (`tests/it/book.rs` renders `docs/src/reference/configuration.md` from these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// As written in the file.
    pub key: &'static str,
    /// The Rust type of its value, as written in this file.
    pub ty: &'static str,
    /// Its doc comment: what it means; a last paragraph `Default: …` for a
    /// default the parser does not report in `effective_settings`.
    pub doc: &'static str,
}

/// Declares a file section: a struct of optional fields named exactly as the
/// YAML keys, serialized without the unset ones, `KEYS`, the key list, and
/// `FIELDS`, each key with its type and doc comment (the only attribute a
/// field takes: the book's reference is made from it).
macro_rules! file_section {
    ($(#[$meta:meta])* pub struct $name:ident { $( $(#[doc = $doc:literal])* $key:ident : $ty:ty ),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize)]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<$ty>,
            )*
        }

        impl $name {
            /// Every key of this section, as written in the file.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];
            /// Every key with its type and documentation.
            pub const FIELDS: &'static [Field] = &[$(Field {
                key: stringify!($key),
                ty: stringify!($ty),
                doc: concat!($($doc, "\n"),*),
            }),*];
        }
    };
}

file_section! {
    /// The top level of `provisioner.yaml`: the Go provisioner's keys, then ours.
    pub struct ProvisionerFile {
        /// Nodes provisioned at once; `0` also means one per CPU.
        workers: i64,
        /// How often discovery runs, a Choria duration of at least `1m`.
        interval: String,
        /// Where logs go: `stdout`, `stderr`, `discard`, or a file appended
        /// to in JSON. Unset logs to stdout (Go writes a file named `info`).
        logfile: String,
        /// `debug`, `info`, `warn`, `error` or `fatal`; anything else logs at
        /// `warn`, as in Go. `--debug` and `--log` override it.
        loglevel: String,
        /// The helper's command line, split like a shell's (quotes work, no
        /// variables or pipes) and run once per node. Required unless
        /// `configuration_template` configures the nodes.
        helper: String,
        /// The provisioning token sent with every `choria_provision` request.
        /// Unset: the `cht` claim of each node's verified provisioning JWT.
        token: String,
        /// Ours: read `token` from this file (a mounted Secret); a trailing
        /// newline is removed.
        token_file: String,
        /// Ours: read `broker_provisioning_password` from this file.
        broker_provisioning_password_file: String,
        /// The lifecycle component whose `startup` events mean "needs
        /// provisioning"; no `.`, `*` or `>`.
        lifecycle_component: String,
        /// Speak protocol v1 without TLS or signatures (the `file` security
        /// provider): test networks only.
        choria_insecure: bool,
        /// The `site` label on every metric.
        site: String,
        /// Port of `/metrics`, `/healthz` and `/readyz`; unset or `0`: off.
        monitor_port: i64,
        /// Accepted and ignored, as in Go.
        broker_port: i64,
        /// Connect to the broker as user `provisioner` with this password.
        broker_provisioning_password: String,
        /// Regular expressions refused in CSR names and identities (a match
        /// anywhere refuses). Unset or empty: Go's list.
        cert_deny_list: Vec<String>,
        /// A PEM public key or certificate file, or a hex ed25519 public key,
        /// that verifies the nodes' provisioning JWTs. Required with
        /// `features.jwt` and `features.ed25519`.
        jwt_verify_cert: String,
        /// The key that signs server JWTs. Required with `features.ed25519`.
        /// A file (a hex ed25519 seed), or an ed25519 key that stays in a
        /// PKCS#11 token (an HSM), named by an RFC 7512 URI such as
        /// `pkcs11:token=fleet;object=issuer?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/choria-provisioner/pin`:
        /// opened once at start, the key never enters the provisioner.
        jwt_signing_key: String,
        /// Our chain-issuer client JWT file: adds chain-issuer data to the
        /// server JWTs (`jwt_signing_key` must then be an ed25519 key).
        jwt_signing_token: String,
        /// Validity of the server JWTs issued with `features.ed25519`, a
        /// Choria duration such as `1y`, `90d` or `12h`.
        server_jwt_validity: String,
        /// The admission policy's Rego file, the same as `admission.policy`
        /// (the Go provisioner reads this key and never uses it).
        rego_policy: String,
        /// Go's election switch: campaign in Choria Streams with Go's
        /// defaults (`election.backend: streams`).
        ///
        /// Default: `false`
        leader_election: bool,
        /// Where `release_update` tells nodes to download upgrades from.
        upgrades_repository: String,
        /// Provision a node even when its upgrade failed.
        upgrades_optional: bool,
        /// What is done for each node (below).
        features: FeaturesFile,
        /// Ours: the election, its backend and its timing (below).
        election: ElectionFile,
        /// Ours: the longest one broadcast discovery may take (Go: a fixed
        /// 2 s).
        discovery_timeout: String,
        /// Ours: discovery ends after this long without a reply (Go: 300 ms).
        discovery_window: String,
        /// Ours: how long the helper may run for one node (Go: a fixed 10 s).
        helper_timeout: String,
        /// Ours: how long one RPC attempt waits for its reply.
        rpc_timeout: String,
        /// Ours: how long the reply subject of a `jwt`, `gen25519` or
        /// `gencsr` answer stays watched for a second, different answer in
        /// the node's name (`0s`: off).
        reply_window: String,
        /// Ours: how long the same request to many nodes (`inventory`,
        /// `jwt`, `restart`: the same for every node) is gathered to go out
        /// as one signed message to each node's subject, as go-choria's
        /// direct mode sends (`0s`: each alone).
        request_batch_window: String,
        /// Ours: regular expressions of DNS names a CSR may ask for besides
        /// the node's identity; each matches whole names.
        csr_allowed_dns_names: Vec<String>,
        /// Ours: the nodes' configuration as templates, with or without a
        /// helper (below).
        configuration_template: ConfigurationTemplateFile,
        /// Ours: a cert-manager issuer signs the nodes' CSRs (below).
        cert_manager: CertManagerFile,
        /// Ours: the built-in CA signs the nodes' CSRs (below).
        ca: CaFile,
        /// Ours: a record of every provisioning in a JetStream KV bucket
        /// (below).
        records: RecordsFile,
        /// Ours: credentials renewed before they expire (below; needs
        /// `records`).
        renewal: RenewalFile,
        /// Ours: the Rego policy every node must pass before anything is
        /// signed or configured for it (below).
        admission: AdmissionFile,
        /// Ours: every decision about a node as a sealed event on a
        /// JetStream stream (below; needs `records`).
        audit: AuditFile,
        /// Ours: the cloud instance identity document every node must
        /// present, verified before the admission policy (below).
        evidence: EvidenceFile,
        /// Ours: each node's sequence as one trace over OTLP (below).
        telemetry: TelemetryFile,
    }
}

file_section! {
    /// `telemetry:` (ours).
    pub struct TelemetryFile {
        /// Where traces go: an OTLP/HTTP endpoint such as
        /// `http://127.0.0.1:4318` (a collector, an agent or Jaeger beside
        /// the provisioner), posted to `/v1/traces` unless a path is given;
        /// JSON encoding, plain HTTP only. Unset: nothing is traced.
        otlp_endpoint: String,
        /// The `service.name` of the traces.
        ///
        /// Default: `choria-provisioner`
        service_name: String,
        /// Of every hundred node sequences, how many are traced (1–100).
        ///
        /// Default: `100`
        sample_percent: i64,
    }
}

file_section! {
    /// `evidence:` (ours).
    pub struct EvidenceFile {
        /// PEM certificates (one per AWS region, from AWS's "public
        /// certificates" page: the RSA ones for the `signature` form, the
        /// RSA-2048 ones for the `rsa2048` form) that verify the instance
        /// identity documents nodes present.
        aws_certificates: String,
        /// AWS account ids (12 digits) whose instances may be provisioned.
        ///
        /// Default: any
        aws_accounts: Vec<String>,
        /// Google's signing certificates for GCP instance identity tokens:
        /// the JSON `{"kid": "PEM", ...}` that
        /// `https://www.googleapis.com/oauth2/v1/certs` serves, or a PEM
        /// bundle. Google rotates them: refresh the file.
        gcp_certificates: String,
        /// The audience a GCP token must be for; `{identity}` is the
        /// node's name, so a token is good under one name only.
        ///
        /// Default: `choria:{identity}`
        gcp_audience: String,
        /// GCP project ids whose instances may be provisioned.
        ///
        /// Default: any
        gcp_projects: Vec<String>,
        /// PEM certificates of the Microsoft intermediates that issue the
        /// `metadata.azure.com` certificate Azure signs attested documents
        /// with.
        azure_certificates: String,
        /// Azure subscription ids whose virtual machines may be
        /// provisioned.
        ///
        /// Default: any
        azure_subscriptions: Vec<String>,
        /// Refuse instances launched longer ago than this (AWS
        /// `pendingTime`, GCP `instance_creation_timestamp`).
        ///
        /// Default: any age
        max_age: String,
        /// What of the instance the node's identity must name:
        /// `instance_id` (one of its dot-separated labels is the instance
        /// id, as in `i-0abc123.web.example.net`) or `instance_name` (GCP:
        /// its first label is the instance's name).
        ///
        /// Default: not compared (one instance, one identity still holds)
        node_name: String,
        /// An instance is provisioned under one identity only, and an
        /// identity from one instance only: the first pairing is kept beside
        /// the records (needs `records`); the instance's evidence is refused
        /// under any other name, and the name is refused from any other
        /// instance until it is rebound (`choria-provisioner rebind`).
        ///
        /// Default: `true`
        one_identity_per_instance: bool,
        /// A name bound to an instance may be taken by another instance once
        /// the credentials on record for the name have expired; otherwise
        /// only `choria-provisioner rebind` moves a name to a new instance
        /// (a replaced machine).
        ///
        /// Default: `false`
        rebind_after_expiry: bool,
    }
}

file_section! {
    /// `audit:` (ours).
    pub struct AuditFile {
        /// The JetStream stream.
        ///
        /// Default: `CHORIA_PROVISIONER_AUDIT`
        stream: String,
        /// Events are published on `<subject>.<site>.<type>` (`_` for no
        /// site).
        ///
        /// Default: `choria.provisioner.audit`
        subject: String,
        /// How long events are kept.
        ///
        /// Default: `90d`
        max_age: String,
        /// The most the stream keeps, in bytes (at least 1 MiB); the oldest
        /// events go first.
        ///
        /// Default: `1073741824` (1 GiB)
        max_bytes: i64,
        /// Create the stream when it is missing.
        ///
        /// Default: `true`
        create_stream: bool,
        /// Servers that hold a copy of the stream the provisioner creates
        /// (1–5).
        ///
        /// Default: `1`
        replicas: i64,
    }
}

file_section! {
    /// `admission:` (ours).
    pub struct AdmissionFile {
        /// The Rego file: package `choria.provisioner`, rules `allow`
        /// (bool), `deny_reason` (string) and `defer` (bool). Required
        /// unless `rego_policy` names it.
        policy: String,
        /// The file is Rego v0 (rules without `if`, as OPA wrote them before
        /// 1.0 and go-choria's own policies are).
        ///
        /// Default: `false`
        rego_v0: bool,
    }
}

file_section! {
    /// `records:` (ours).
    pub struct RecordsFile {
        /// NATS URL(s) of a JetStream the records may be written to,
        /// comma-separated. Required. (The provisioning account of a Choria
        /// broker has no KV access: use the broker's `choria` account with a
        /// client certificate, `tls_cert`, or another server.)
        url: String,
        /// The KV bucket.
        ///
        /// Default: `CHORIA_PROVISIONER_RECORDS`
        bucket: String,
        /// Records a node's key holds (1–64); later ones go to an overflow
        /// key of it, and none is ever pushed out (see What survives what in
        /// the Day two guide).
        ///
        /// Default: `5`
        history: i64,
        /// Create the buckets when they are missing (the records, revocations
        /// and instance bindings), and protect buckets an earlier version
        /// made (no delete, purge or roll-up; a key's values are never
        /// pushed out).
        ///
        /// Default: `true`
        create_bucket: bool,
        /// Servers that hold a copy of each bucket the provisioner creates
        /// (1–5; a JetStream cluster of at least that many servers): with
        /// 3, the records, revocations and bindings survive a lost server.
        ///
        /// Default: `1`
        replicas: i64,
        /// NATS user name.
        user: String,
        /// NATS password (prefer `password_file`).
        password: String,
        /// Read the NATS password from this file.
        password_file: String,
        /// NATS token (prefer `token_file`).
        token: String,
        /// Read the NATS token from this file.
        token_file: String,
        /// A NATS `.creds` file (user JWT and seed).
        credentials_file: String,
        /// Verify the server's TLS certificate with this CA file.
        tls_ca: String,
        /// A client certificate for mutual TLS, with `tls_key`: how a
        /// client reaches a Choria broker's own Streams (its `choria`
        /// account admits clients whose certificate its CA signed).
        tls_cert: String,
        /// The private key of `tls_cert`.
        tls_key: String,
        /// The ed25519 seed file (64 hex characters, `openssl rand -hex 32`)
        /// every record is sealed with; the Provisioner's replicas share it.
        /// Records are acted on (renewal, `nodes`, counts) only when their
        /// seal verifies with it (or with `verify_keys`). Required.
        signing_key: String,
        /// Public keys (64 hex characters each) whose seals are trusted too:
        /// the previous key, while records sealed with it remain.
        verify_keys: Vec<String>,
        /// Refuse to provision a node whose identity still holds valid
        /// credentials on record that renewal did not ask it to replace
        /// (someone else answering under its name; a reinstalled node is
        /// the honest case, see the Attested provisioning guide). Off: such
        /// a provisioning is flagged (metric, audit event, log) and goes on.
        ///
        /// Default: `false`
        exclusive: bool,
    }
}

file_section! {
    /// `renewal:` (ours).
    pub struct RenewalFile {
        /// When a credential is due: this long before it expires (`30d`, a
        /// positive duration), or when this share of its lifetime is left
        /// (`20%`, above 0% and below 100%). Required.
        before: String,
        /// Due times move earlier by a stable share of this per node, so a
        /// fleet provisioned at once is not renewed at once.
        ///
        /// Default: `0s`
        jitter: String,
        /// Renewals (`reprovision` requests) per minute at most.
        ///
        /// Default: `100`
        rate: i64,
        /// A Choria client configuration that reaches the provisioned nodes
        /// in their collective, as a caller their policies allow to call
        /// `choria_provision#reprovision`. Required.
        choria_config: String,
        /// The collective `reprovision` goes to when a node's record names
        /// none (a server JWT names its collectives).
        ///
        /// Default: `mcollective`
        collective: String,
        /// How long a node may take to come back through provisioning
        /// before it is asked again.
        ///
        /// Default: `10m`
        retry: String,
    }
}

file_section! {
    /// `cert_manager:` (ours).
    pub struct CertManagerFile {
        /// The name of the `Issuer` or `ClusterIssuer` that signs. Required.
        issuer: String,
        /// `Issuer` or `ClusterIssuer`.
        ///
        /// Default: `Issuer`
        issuer_kind: String,
        /// The issuer's API group.
        ///
        /// Default: `cert-manager.io`
        issuer_group: String,
        /// Where the `CertificateRequest`s are made (an `Issuer` lives there
        /// too). Required.
        namespace: String,
        /// The certificates' lifetime, at least `1h`.
        ///
        /// Default: the issuer's
        duration: String,
        /// cert-manager key usages.
        ///
        /// Default: `digital signature`, `key encipherment`, `server auth`,
        /// `client auth`
        usages: Vec<String>,
        /// The longest a request may take to be issued.
        ///
        /// Default: `30s`
        timeout: String,
        /// How long a used request is kept before it is deleted.
        ///
        /// Default: `0s`
        keep: String,
    }
}

file_section! {
    /// `ca:` (ours).
    pub struct CaFile {
        /// The CA certificate (PEM) that signs the nodes' CSRs, followed by
        /// its chain up to the root when it is an intermediate. Required.
        certificate: String,
        /// The CA's private key: an unencrypted PEM file (RSA or ECDSA
        /// P-256, PKCS#1, SEC1 or PKCS#8), or a PKCS#11 URI (RFC 7512) such
        /// as `pkcs11:token=fleet;object=ca?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/choria-provisioner/pin`.
        /// Required.
        key: String,
        /// The lifetime of each certificate it signs (at least `1h`; never
        /// past the CA's own expiry).
        ///
        /// Default: `90d`
        validity: String,
    }
}

file_section! {
    /// `configuration_template:` (ours).
    pub struct ConfigurationTemplateFile {
        /// A mapping of your own, seen by every template as `values`.
        values: BTreeMap<String, serde_json::Value>,
        /// Choria setting → template of its value.
        configuration: BTreeMap<String, String>,
        /// Policy file name (`<agent>.policy`) → template of its text.
        action_policies: BTreeMap<String, String>,
        /// Rego file name (`<agent>.rego`, `default.rego`) → template of its
        /// text.
        opa_policies: BTreeMap<String, String>,
        /// Static claims the server JWT is based on (`features.ed25519`), as
        /// the helper's `server_claims`.
        server_claims: serde_json::Value,
        /// Template of the version nodes must run (`features.upgrades`).
        upgrade: String,
    }
}

file_section! {
    /// `features:`.
    pub struct FeaturesFile {
        /// Fetch each node's CSR for the helper (or `cert_manager`) to sign;
        /// not with `ed25519`.
        pki: bool,
        /// Fetch and verify each node's provisioning JWT.
        jwt: bool,
        /// Fetch each node's ed25519 key and sign a server JWT for it (turns
        /// `jwt` on).
        ed25519: bool,
        /// Honour the helper's (or template's) `upgrade` version.
        upgrades: bool,
    }
}

file_section! {
    /// `election:` (ours; the Go provisioner only has `leader_election`).
    pub struct ElectionFile {
        /// `leader`: one replica works, the others stand by; `shards`: every
        /// replica works the nodes rendezvous hashing gives it.
        ///
        /// Default: `leader`
        mode: String,
        /// `none`, `streams` (Choria Streams, Go-compatible) or `lease` (a
        /// Kubernetes Lease).
        backend: String,
        /// Streams: the KV bucket.
        bucket: String,
        /// Streams: the election name, the bucket's key (with `mode:
        /// shards`, the name in the heartbeat subject).
        name: String,
        /// Streams: the JetStream API prefix; `""` is the account's own
        /// `$JS.API`.
        api_prefix: String,
        /// Streams: create the bucket when it is missing (normally the
        /// Choria broker creates it).
        create_bucket: bool,
        /// Streams: the TTL of a bucket we create.
        bucket_ttl: String,
        /// Streams: servers that hold a copy of a bucket we create (1–5).
        replicas: i64,
        /// Lease: the Lease's name.
        lease_name: String,
        /// Lease: its namespace; unset: the pod's.
        lease_namespace: String,
        /// Lease, and both backends with `mode: shards`: how long a record
        /// counts without being renewed; more than `renew_deadline`.
        lease_duration: String,
        /// Lease, and `mode: shards`: a leader (a member) that could not
        /// renew for this long stops working; more than 1.2 × `retry_period`.
        renew_deadline: String,
        /// Lease, and `mode: shards`: how often a candidate campaigns and a
        /// member renews.
        retry_period: String,
        /// `mode: shards`: the ed25519 seed file (64 hex characters) every
        /// member seals its membership records with; the replicas share it
        /// (it may be `records.signing_key`'s file). Required in shards
        /// mode.
        signing_key: String,
        /// `mode: shards`: public keys (64 hex characters each) whose seals
        /// are trusted too: the previous key while the replicas change to a
        /// new one.
        verify_keys: Vec<String>,
    }
}

impl ProvisionerFile {
    /// The YAML text of this file.
    pub fn to_yaml(&self) -> Result<String, serde_norway::Error> {
        serde_norway::to_string(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_serialized_names() {
        let f = ProvisionerFile {
            workers: Some(1),
            features: Some(FeaturesFile {
                pki: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let yaml = f.to_yaml().unwrap();
        assert_eq!(yaml, "workers: 1\nfeatures:\n  pki: true\n");
        assert!(ProvisionerFile::KEYS.contains(&"broker_provisioning_password_file"));
        assert_eq!(FeaturesFile::KEYS, ["pki", "jwt", "ed25519", "upgrades"]);
        assert_eq!(ElectionFile::KEYS.len(), 15);
        assert_eq!(ElectionFile::KEYS[0], "mode");
        assert_eq!(ElectionFile::FIELDS[0].key, "mode");
        assert_eq!(FeaturesFile::FIELDS[0].ty, "bool");
        assert!(FeaturesFile::FIELDS[0].doc.contains("CSR"));
    }
}
