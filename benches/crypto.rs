//! Per-node crypto of the provisioner, one operation per iteration: what a
//! node costs in CPU before any network or helper time.
//!
//! * `jwt`: provisioning JWT verification (RS256 with a 2048-bit key, EdDSA),
//!   and reading `jwt_verify_cert` as the provisioner does for every node;
//! * `gen25519`: the nonce signature check of the `ed25519` feature;
//! * `pki`: CSR parsing and name checks (the provisioner's side of `pki`),
//!   the CSR signature check, and signing a CSR with a CA (the helper's side,
//!   as `fleet-helper --ca-cert` does);
//! * `ca_sign`: one signature of the built-in CA (`ca:`) per key kind,
//!   `CertificateAuthority::sign_csr` of a node's RSA 2048 CSR: RSA 2048 and
//!   ECDSA P-256 keys from files, and the same kinds kept in a SoftHSM2
//!   token (only when SoftHSM is installed);
//! * `key_delivery`: X25519 key agreement and the AES-256-CBC PEM encryption
//!   of a helper-supplied private key;
//! * `server_jwt`: `ServerClaims::new` + `TokenSigningKey::sign`, EdDSA with and
//!   without chain-issuer data, and RS256 for comparison.
//!
//! `cargo bench --bench crypto`

use choria_fleet::ca::CertificateAuthority;
use choria_wire::security::csr::{
    self, default_deny_list, make_csr, parse_csr, validate_csr_names, CsrSubject,
};
use choria_wire::security::ecdh::EcdhKeyPair;
use choria_wire::security::ed25519::{verify_nonce, Ed25519KeyPair};
use choria_wire::security::pem_crypt::encrypt_private_key;
use choria_wire::security::pkcs11::{Pkcs11CaKey, Pkcs11Uri};
use choria_wire::security::tokens::{
    parse_provisioning_token, ClientIdClaims, ProvisioningClaims, ServerClaims, TokenSigningKey,
    TokenVerifyKey, PROVISIONER_ISSUER,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ed25519_dalek::SigningKey;
use rsa::pkcs8::EncodePublicKey;
use std::hint::black_box;
use std::time::Duration;

const IDENTITY: &str = "node-0042.fleet.example.net";
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A provisioning JWT like the fleet's: token, broker URLs, default claims.
fn provisioning_token(key: &TokenSigningKey) -> String {
    let claims = ProvisioningClaims::new_at(
        "s3cret",
        "nats://broker.bench.example.net:4222",
        "",
        YEAR,
        now() - 10,
    )
    .unwrap();
    key.sign(&claims).unwrap()
}

fn jwt(c: &mut Criterion) {
    let mut g = c.benchmark_group("jwt");
    g.throughput(Throughput::Elements(1));

    let rsa_key = csr::generate_rsa_key(2048).unwrap();
    let rsa_signer = TokenSigningKey::Rsa(choria_wire::security::rsa_signer::RsaSigningKey::new(
        rsa_key.clone(),
    ));
    let rsa_token = provisioning_token(&rsa_signer);
    let rsa_verify = rsa_signer.verify_key();
    g.bench_function("provisioning_verify_rs256_2048", |b| {
        b.iter(|| black_box(parse_provisioning_token(black_box(&rsa_token), &rsa_verify).unwrap()))
    });

    let ed_signer = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[7; 32]));
    let ed_token = provisioning_token(&ed_signer);
    let ed_verify = ed_signer.verify_key();
    g.bench_function("provisioning_verify_eddsa", |b| {
        b.iter(|| black_box(parse_provisioning_token(black_box(&ed_token), &ed_verify).unwrap()))
    });

    // The provisioner re-reads jwt_verify_cert for every node (rotation).
    let dir = tempfile::tempdir().unwrap();
    let pub_pem = dir.path().join("signer.pub");
    std::fs::write(
        &pub_pem,
        rsa_key
            .to_public_key()
            .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
            .unwrap(),
    )
    .unwrap();
    let setting = pub_pem.to_str().unwrap().to_string();
    g.bench_function("load_verify_key_rsa_pem_file", |b| {
        b.iter(|| black_box(TokenVerifyKey::from_setting(black_box(&setting)).unwrap()))
    });
    g.bench_function("load_and_verify_rs256_per_node", |b| {
        b.iter(|| {
            let key = TokenVerifyKey::from_setting(&setting).unwrap();
            black_box(parse_provisioning_token(black_box(&rsa_token), &key).unwrap())
        })
    });
    g.finish();
}

fn gen25519(c: &mut Criterion) {
    let mut g = c.benchmark_group("gen25519");
    g.throughput(Throughput::Elements(1));
    let node = Ed25519KeyPair::generate();
    let nonce = "6202b111866149f4a2d963c6f3f195eb";
    let sig = node.sign_nonce_hex(nonce);
    let public = node.public_hex();
    g.bench_function("verify_nonce", |b| {
        b.iter(|| verify_nonce(black_box(&public), nonce, &sig).unwrap())
    });
    g.finish();
}

fn pki(c: &mut Criterion) {
    let mut g = c.benchmark_group("pki");
    g.throughput(Throughput::Elements(1));
    let node_key = csr::generate_rsa_key(2048).unwrap();
    let csr_pem = make_csr(&node_key, &CsrSubject::new(IDENTITY)).unwrap();
    let deny = default_deny_list();
    g.bench_function("parse_csr", |b| {
        b.iter(|| black_box(parse_csr(black_box(&csr_pem)).unwrap()))
    });
    g.bench_function("parse_csr_and_validate_names", |b| {
        b.iter(|| {
            let info = parse_csr(black_box(&csr_pem)).unwrap();
            validate_csr_names(&info, IDENTITY, &deny).unwrap();
            black_box(info)
        })
    });
    let info = parse_csr(&csr_pem).unwrap();
    g.bench_function("csr_verify_signature", |b| {
        b.iter(|| black_box(&info).verify_signature().unwrap())
    });
    // The helper's side (fleet-helper --ca-cert): sign the CSR with the CA.
    let ca = CertificateAuthority::generate("bench CA").unwrap();
    g.bench_function("ca_sign_csr_helper_side", |b| {
        b.iter(|| black_box(ca.sign_csr(black_box(&csr_pem), YEAR).unwrap()))
    });
    g.finish();
}

/// The built-in CA's cost per node: `sign_csr` checks the CSR's signature,
/// builds the certificate and signs it with the CA's key, wherever it is.
fn ca_sign(c: &mut Criterion) {
    let mut g = c.benchmark_group("ca_sign");
    g.throughput(Throughput::Elements(1));
    let csr_pem = make_csr(
        &csr::generate_rsa_key(2048).unwrap(),
        &CsrSubject::new(IDENTITY),
    )
    .unwrap();
    let mut cases = vec![
        (
            "rsa2048_file",
            CertificateAuthority::generate("bench CA").unwrap(),
        ),
        (
            "p256_file",
            CertificateAuthority::generate_p256("bench CA").unwrap(),
        ),
    ];
    match softhsm_fixture() {
        Some(hsm) => {
            use choria_wire::testing::softhsm::{P256_KEY, RSA_KEY};
            for (name, object) in [("p256_softhsm", P256_KEY), ("rsa2048_softhsm", RSA_KEY)] {
                let uri = Pkcs11Uri::parse(&hsm.uri(object)).unwrap();
                let key = Pkcs11CaKey::open(&uri).unwrap();
                let ca = CertificateAuthority::self_signed("bench CA", Box::new(key)).unwrap();
                cases.push((name, ca));
            }
        }
        None => eprintln!("ca_sign: SoftHSM2 is not installed, the *_softhsm cases are not run"),
    }
    for (name, ca) in &cases {
        g.bench_function(*name, |b| {
            b.iter(|| black_box(ca.sign_csr(black_box(&csr_pem), YEAR).unwrap()))
        });
    }
    g.finish();
}

/// The wire's SoftHSM token (RSA and P-256 keys made in it), when SoftHSM
/// is installed; asked first so that a bench under `CI` without it skips
/// those cases rather than failing as a test would.
fn softhsm_fixture() -> Option<&'static choria_wire::testing::softhsm::SoftHsm> {
    use choria_wire::testing::softhsm::{softhsm, DEFAULT_MODULE};
    let module = std::env::var_os("SOFTHSM2_MODULE").unwrap_or_else(|| DEFAULT_MODULE.into());
    let util = std::process::Command::new("softhsm2-util")
        .arg("--version")
        .output();
    if !std::path::Path::new(&module).exists() || util.is_err() {
        return None;
    }
    softhsm()
}

fn key_delivery(c: &mut Criterion) {
    let mut g = c.benchmark_group("key_delivery");
    g.throughput(Throughput::Elements(1));
    let node = EcdhKeyPair::generate();
    let node_public = node.public_hex();
    let key_pem = csr::private_key_pkcs1_pem(&csr::generate_rsa_key(2048).unwrap()).unwrap();
    g.bench_function("x25519_generate_and_agree", |b| {
        b.iter(|| {
            let ours = EcdhKeyPair::generate();
            black_box((
                ours.shared_secret(black_box(&node_public)).unwrap(),
                ours.public_hex(),
            ))
        })
    });
    let shared = EcdhKeyPair::generate().shared_secret(&node_public).unwrap();
    g.bench_function("encrypt_private_key_rsa2048_pem", |b| {
        b.iter(|| black_box(encrypt_private_key(black_box(&key_pem), &shared).unwrap()))
    });
    g.bench_function("x25519_and_encrypt_per_node", |b| {
        b.iter(|| {
            let ours = EcdhKeyPair::generate();
            let shared = ours.shared_secret(&node_public).unwrap();
            black_box((
                encrypt_private_key(&key_pem, &shared).unwrap(),
                ours.public_hex(),
            ))
        })
    });
    g.finish();
}

fn server_jwt(c: &mut Criterion) {
    let mut g = c.benchmark_group("server_jwt");
    g.throughput(Throughput::Elements(1));
    let node_public = Ed25519KeyPair::generate().public_hex();
    let claims = || {
        ServerClaims::new(
            IDENTITY,
            vec!["choria".to_string()],
            "choria",
            None,
            Vec::new(),
            &node_public,
            PROVISIONER_ISSUER,
            YEAR,
        )
        .unwrap()
    };
    let ed = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[2; 32]));
    g.bench_function("claims_and_sign_eddsa", |b| {
        b.iter(|| black_box(ed.sign(&claims()).unwrap()))
    });

    // Chain: Org Issuer -> our jwt_signing_token (a client id token with tcs)
    // -> the server token, signed with jwt_signing_key.
    let org = SigningKey::from_bytes(&[1; 32]);
    let signer_key = SigningKey::from_bytes(&[2; 32]);
    let mut signer = ClientIdClaims::new_at(
        now() - 10,
        "provisioner=bench",
        Some(&hex::encode(signer_key.verifying_key().as_bytes())),
        "",
        YEAR,
    )
    .unwrap();
    signer.standard.add_org_issuer_data(&org).unwrap();
    g.bench_function("claims_chain_data_and_sign_eddsa", |b| {
        b.iter(|| {
            let mut c = claims();
            c.add_chain_issuer_data(&signer, &signer_key).unwrap();
            black_box(ed.sign(&c).unwrap())
        })
    });

    let rsa = TokenSigningKey::Rsa(choria_wire::security::rsa_signer::RsaSigningKey::new(
        csr::generate_rsa_key(2048).unwrap(),
    ));
    g.bench_function("claims_and_sign_rs256_2048", |b| {
        b.iter(|| black_box(rsa.sign(&claims()).unwrap()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = jwt, gen25519, pki, ca_sign, key_delivery, server_jwt
}
criterion_main!(benches);
