use super::keys::ecdsa_der;
use super::*;
use crate::security::ca::{verify_issued_by, CaKey, CertificateAuthority};
use crate::security::csr::{self, CsrSubject};
use crate::testing::softhsm::{
    softhsm, ED25519_KEY, ED25519_SEED, ED25519_SEED_KEY, P256_KEY, PLUS_PIN, RSA_KEY, TOKEN,
    USER_PIN, WRONG_PIN_TOKEN,
};
use crate::testing::{openssl_verifies, skip_without_openssl, test_key};
use cryptoki::session::Session;
use std::time::Duration;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn uri(text: &str) -> Pkcs11Uri {
    Pkcs11Uri::parse(text).unwrap()
}

#[test]
fn uri_path_and_query_attributes() {
    let u = uri(
        "pkcs11:token=Fleet%20CA;manufacturer=SoftHSM%20project;model=SoftHSM%20v2;\
         serial=1a2b;slot-id=7;object=issuer%2Brsa;id=%01%02%ff;type=private\
         ?module-path=/opt/hsm/lib%20x.so&pin-value=1234",
    );
    assert_eq!(u.module_path(), std::path::Path::new("/opt/hsm/lib x.so"));
    assert_eq!(u.token.label.as_deref(), Some("Fleet CA"));
    assert_eq!(u.token.manufacturer.as_deref(), Some("SoftHSM project"));
    assert_eq!(u.token.model.as_deref(), Some("SoftHSM v2"));
    assert_eq!(u.token.serial.as_deref(), Some("1a2b"));
    assert_eq!(u.token.slot_id, Some(7));
    assert_eq!(u.key.label.as_deref(), Some(&b"issuer+rsa"[..]));
    assert_eq!(u.key.id.as_deref(), Some(&[1u8, 2, 0xff][..]));
    assert!(matches!(u.pin, uri::PinSource::Value(_)));

    // `+` is a plus, not a space (form decoding is not RFC 7512's); the
    // scheme's letter case does not matter.
    let u = uri("PKCS11:object=a+b?module-path=/m.so");
    assert_eq!(u.key.label.as_deref(), Some(&b"a+b"[..]));
    assert!(matches!(u.pin, uri::PinSource::None));
    // id alone names a key too; pin-source is a file.
    for source in ["file:/etc/pin", "file:///etc/pin", "/etc/pin"] {
        let u = uri(&format!(
            "pkcs11:id=%03?module-path=/m.so&pin-source={source}"
        ));
        match &u.pin {
            uri::PinSource::File(p) => assert_eq!(p, std::path::Path::new("/etc/pin")),
            _ => panic!("{source}: not a pin file"),
        }
    }
}

#[test]
fn uri_errors_name_the_attribute() {
    let err = |text: &str| Pkcs11Uri::parse(text).unwrap_err();
    assert!(matches!(err("file:/x"), Pkcs11Error::NotPkcs11Uri));
    assert!(matches!(
        err("pkcs11:object=k?pin-value=1"),
        Pkcs11Error::MissingModulePath
    ));
    assert!(matches!(
        err("pkcs11:token=t?module-path=/m.so"),
        Pkcs11Error::NoKeySelector
    ));
    for (text, attribute) in [
        ("pkcs11:object=k;slot-id=x?module-path=/m.so", "slot-id"),
        ("pkcs11:object=k;colour=blue?module-path=/m.so", "colour"),
        ("pkcs11:object=k;type=cert?module-path=/m.so", "type"),
        (
            "pkcs11:object=k?module-path=/m.so&pin-source=|cat",
            "pin-source",
        ),
        (
            "pkcs11:object=k?module-path=/m.so&module-name=softhsm2",
            "module-name",
        ),
        ("pkcs11:token=%ff;object=k?module-path=/m.so", "token"),
    ] {
        match err(text) {
            Pkcs11Error::Uri { attribute: a, .. } => assert_eq!(a, attribute, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    let e = err("pkcs11:object=k?module-path=/m.so&pin-value=1&bogus");
    assert!(e.to_string().contains("#3"), "{e}");
}

#[test]
fn the_pin_never_shows() {
    let pin = "Sup3r-Secret-PIN";
    let text = format!("pkcs11:token=t;object=k?module-path=/m.so&pin-value={pin}");
    let u = uri(&text);
    for shown in [format!("{u}"), format!("{u:?}")] {
        assert!(!shown.contains(pin), "{shown}");
        assert!(shown.contains("pin-value=***"), "{shown}");
        assert!(shown.contains("module-path=/m.so"), "{shown}");
    }
    // Malformed URIs carrying a PIN: the error names positions and
    // attribute names, never values.
    for bad in [
        format!("pkcs11:object=k?module-path=/m.so&{pin}"),
        format!("pkcs11:object=k;slot-id={pin}?module-path=/m.so"),
        format!("pkcs11:object=k?module-path=/m.so&pin-value={pin}&pin-source={pin}"),
    ] {
        let e = Pkcs11Uri::parse(&bad).unwrap_err();
        for shown in [e.to_string(), format!("{e:?}")] {
            assert!(!shown.contains(pin), "{shown}");
        }
    }
}

#[test]
fn ecdsa_signatures_become_der_integers() {
    // r with its top bit set gains a zero byte; s's leading zeros go.
    let mut raw = vec![0x80; 32];
    raw.extend([0u8; 31]);
    raw.push(1);
    let der = ecdsa_der(&raw).unwrap();
    let mut want = vec![0x30, 38, 0x02, 33, 0x00];
    want.extend([0x80; 32]);
    want.extend([0x02, 1, 1]);
    assert_eq!(der, want);
    assert!(ecdsa_der(&[1, 2, 3]).is_err());
}

#[test]
fn a_missing_module_is_a_typed_error() {
    let u = uri("pkcs11:object=k?module-path=/nonexistent/libnothing.so&pin-value=1");
    let e = Pkcs11CaKey::open(&u).unwrap_err();
    assert!(matches!(e, Pkcs11Error::Module { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/libnothing.so"), "{e}");
}

fn node_csr(cn: &str) -> String {
    csr::make_csr(test_key(), &CsrSubject::new(cn)).unwrap()
}

fn certificate(pem_text: &str) -> x509_cert::Certificate {
    use x509_cert::der::Decode;
    x509_cert::Certificate::from_der(&pem::parse(pem_text).unwrap().into_contents()).unwrap()
}

/// A CA over the token's key signs a node CSR; we and OpenSSL accept it,
/// and its algorithms are those of a CA with a file key of the same kind.
fn token_ca_signs_csrs(object: &str, file_ca: CertificateAuthority) {
    let Some(hsm) = softhsm() else { return };
    let _shared = hsm.shared();
    let key = Pkcs11CaKey::open(&uri(&hsm.uri(object))).unwrap();
    assert!(key.pem().is_none());
    let ca = CertificateAuthority::self_signed("Token CA", Box::new(key)).unwrap();
    assert!(ca.key_pem().is_empty());
    let (ours, theirs) = (
        certificate(&ca.cert_pem()),
        certificate(&file_ca.cert_pem()),
    );
    assert_eq!(ours.signature_algorithm, theirs.signature_algorithm);
    assert_eq!(
        ours.tbs_certificate.subject_public_key_info.algorithm,
        theirs.tbs_certificate.subject_public_key_info.algorithm
    );
    verify_issued_by(&ca.cert_pem(), &ca.cert_pem()).unwrap();
    let cert = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    verify_issued_by(&cert, &ca.cert_pem()).unwrap();
    // A CA loaded from its certificate and the same token key agrees: the
    // public key read from the token is the certificate's.
    let again = Pkcs11CaKey::open(&uri(&hsm.uri(object))).unwrap();
    CertificateAuthority::from_certificate(ours, Box::new(again)).unwrap();

    if skip_without_openssl("token CA chain check") {
        return;
    }
    openssl_verifies(&ca.cert_pem(), &cert);
}

#[test]
fn an_rsa_ca_key_in_the_token_signs_node_certificates() {
    let file_ca = CertificateAuthority::from_key("File CA", test_key().clone()).unwrap();
    token_ca_signs_csrs(RSA_KEY, file_ca);
}

#[test]
fn a_p256_ca_key_in_the_token_signs_node_certificates() {
    token_ca_signs_csrs(
        P256_KEY,
        CertificateAuthority::generate_p256("File CA").unwrap(),
    );
}

#[test]
fn an_ed25519_key_in_the_token_signs_as_dalek_verifies() {
    use ed25519_dalek::{Signature, Verifier, VerifyingKey};
    let Some(hsm) = softhsm() else { return };
    let _shared = hsm.shared();
    let key = Pkcs11Ed25519Key::open(&uri(&hsm.uri(ED25519_KEY))).unwrap();
    let public = VerifyingKey::from_bytes(&key.public_key()).unwrap();
    let message = b"header.claims";
    let sig = Signature::from_bytes(&key.sign(message).unwrap());
    public.verify(message, &sig).unwrap();
    assert!(public.verify(b"header.other", &sig).is_err());
    // By id alone, the same key.
    let by_id = hsm
        .uri(ED25519_KEY)
        .replace(&format!("object={ED25519_KEY}"), "id=%03");
    let same = Pkcs11Ed25519Key::open(&uri(&by_id)).unwrap();
    assert_eq!(same.public_key(), key.public_key());
    // Not an ed25519 key, and no key at all.
    let e = Pkcs11Ed25519Key::open(&uri(&hsm.uri(RSA_KEY))).unwrap_err();
    assert!(matches!(e, Pkcs11Error::UnsupportedKey(_)), "{e:?}");
    let e = Pkcs11CaKey::open(&uri(&hsm.uri(ED25519_KEY))).unwrap_err();
    assert!(matches!(e, Pkcs11Error::UnsupportedKey(_)), "{e:?}");
    let e = Pkcs11CaKey::open(&uri(&hsm.uri("no-such-key"))).unwrap_err();
    assert!(matches!(e, Pkcs11Error::KeyNotFound { .. }), "{e:?}");
}

/// A JWT key in the token signs server JWTs, and chain-signs them, byte
/// for byte as the same seed in memory does; nothing shows its PIN.
#[test]
fn a_jwt_key_in_the_token_signs_as_its_seed_does() {
    use crate::security::tokens::{
        verify_chain_issued_server_token, ClientIdClaims, ServerClaims, TokenSigningKey,
    };
    use std::sync::Arc;
    let Some(hsm) = softhsm() else { return };
    let _shared = hsm.shared();
    let in_memory = ed25519_dalek::SigningKey::from_bytes(&ED25519_SEED);
    let token_key = Pkcs11Ed25519Key::open(&uri(&hsm.uri(ED25519_SEED_KEY))).unwrap();
    assert_eq!(token_key.public_key(), in_memory.verifying_key().to_bytes());
    let in_token = TokenSigningKey::Ed25519Token(Arc::new(token_key));
    let file = TokenSigningKey::Ed25519(in_memory.clone());
    assert!(in_token.in_token() && !file.in_token());
    assert_eq!(in_token.algorithm(), "EdDSA");
    assert_eq!(in_token.verify_key(), file.verify_key());

    // The chain issuer's client token, issued by an org issuer.
    let org = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let public = hex::encode(in_memory.verifying_key().as_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut signer = ClientIdClaims::new_at(now, "signer", Some(&public), "", DAY).unwrap();
    signer.standard.add_org_issuer_data(&org).unwrap();
    let node = hex::encode([7u8; 32]);
    let server = ServerClaims::new(
        "node.example.net",
        vec!["choria".into()],
        "choria",
        None,
        vec![],
        &node,
        "Choria Provisioner",
        DAY,
    )
    .unwrap();
    let signed = [&in_token, &file].map(|key| {
        let mut claims = server.clone();
        let signer_key = key.as_ed25519().unwrap();
        claims.add_chain_issuer_data(&signer, signer_key).unwrap();
        key.sign(&claims).unwrap()
    });
    assert_eq!(signed[0], signed[1], "Ed25519 is deterministic");
    let claims = verify_chain_issued_server_token(&signed[0], &org.verifying_key()).unwrap();
    assert_eq!(claims.identity, "node.example.net");

    let shown = format!("{in_token:?}");
    assert!(
        shown.contains(ED25519_SEED_KEY) && shown.contains(&public),
        "{shown}"
    );
    assert!(!shown.contains(USER_PIN), "{shown}");
}

fn token_session(module: &cryptoki::context::Pkcs11) -> Session {
    let slot = module
        .get_slots_with_token()
        .unwrap()
        .into_iter()
        .find(|s| module.get_token_info(*s).is_ok_and(|t| t.label() == TOKEN))
        .unwrap();
    module.open_ro_session(slot).unwrap()
}

#[test]
fn a_lost_session_is_recovered() {
    let Some(hsm) = softhsm() else { return };
    let _exclusive = hsm.exclusive();
    let key = Pkcs11CaKey::open(&uri(&hsm.uri(P256_KEY))).unwrap();
    let other = Pkcs11CaKey::open(&uri(&hsm.uri(RSA_KEY))).unwrap();
    let ca = CertificateAuthority::self_signed("Token CA", Box::new(key)).unwrap();
    let other_ca = CertificateAuthority::self_signed("Other CA", Box::new(other)).unwrap();
    let signs = |ca: &CertificateAuthority| {
        let cert = ca.sign_csr(&node_csr("n.example.net"), DAY).unwrap();
        verify_issued_by(&cert, &ca.cert_pem()).unwrap();
    };
    signs(&ca);
    signs(&other_ca);
    let module = token_module(hsm.module()).unwrap();

    // Logged out through another session: the key's handle goes stale.
    token_session(module.context()).logout().unwrap();
    signs(&ca);

    // The module finalized under the keys: initialized again, sessions and
    // handles made anew, for every key.
    module.context().clone().finalize().unwrap();
    signs(&other_ca);
    signs(&ca);
    // Once more, the other key first. SoftHSM numbers sessions and objects
    // from 1 again, so the first key now holds the numbers the second one
    // had: the second must not take the first's session and key for its
    // own (it signed with the wrong key before the generation check).
    module.context().clone().finalize().unwrap();
    signs(&ca);
    signs(&other_ca);
}

#[test]
fn a_wrong_pin_is_a_typed_error_without_the_pin() {
    let Some(hsm) = softhsm() else { return };
    let _shared = hsm.shared();
    let dir = tempfile::tempdir().unwrap();
    let pin_file = dir.path().join("pin");
    let open = |pin_uri: &str| {
        let text = format!(
            "pkcs11:token={WRONG_PIN_TOKEN};object=none?module-path={}&{pin_uri}",
            hsm.module().display()
        );
        Pkcs11CaKey::open(&uri(&text)).unwrap_err()
    };
    // `pin+plus` with the plus decoded as a space, as a form would.
    let wrong = "pin plus";
    std::fs::write(&pin_file, format!("{wrong}\n")).unwrap();
    for e in [
        open("pin-value=pin%20plus"),
        open(&format!("pin-source=file:{}", pin_file.display())),
    ] {
        assert!(matches!(&e, Pkcs11Error::WrongPin { token } if token == WRONG_PIN_TOKEN));
        for shown in [e.to_string(), format!("{e:?}")] {
            assert!(!shown.contains(wrong), "{shown}");
        }
    }
    // The right PIN, `+` kept and the file's newline dropped, logs in: the
    // token has no such key.
    std::fs::write(&pin_file, format!("{PLUS_PIN}\n")).unwrap();
    let e = open(&format!("pin-source=file:{}", pin_file.display()));
    assert!(matches!(e, Pkcs11Error::KeyNotFound { .. }), "{e:?}");
    let e = open(&format!("pin-value={PLUS_PIN}"));
    assert!(matches!(e, Pkcs11Error::KeyNotFound { .. }), "{e:?}");
    // A PIN file that cannot be read names the file.
    let e = open("pin-source=file:/nonexistent/pin");
    assert!(matches!(e, Pkcs11Error::PinFile { .. }), "{e:?}");
}
