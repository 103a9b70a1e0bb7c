use super::key::OID_ECDSA_SHA256;
use super::load::{parse_chain, parse_private_key};
use super::*;
use crate::security::csr::{CsrSubject, OID_RSA_ENCRYPTION};
use crate::testing::test_key;
use crate::testing::{openssl, openssl_verifies, run_ok, skip_without_openssl};
use rsa::pkcs1::LineEnding;
use rsa::pkcs1v15::Signature as RsaSignature;
use rsa::pkcs1v15::SigningKey;
use rsa::traits::PublicKeyParts;
use sha2::Sha256;
use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// One real (2048 bit) CA for the whole test run: key generation is slow.
fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| CertificateAuthority::generate("Test CA").unwrap())
}

fn node_csr(cn: &str) -> String {
    csr::make_csr(test_key(), &CsrSubject::new(cn)).unwrap()
}

fn parse(cert_pem: &str) -> Certificate {
    parse_certificate(cert_pem, "test certificate").unwrap()
}

fn dns_sans(cert: &Certificate) -> Vec<String> {
    let (_, san) = cert
        .tbs_certificate
        .get::<SubjectAltName>()
        .unwrap()
        .expect("SAN extension");
    san.0
        .iter()
        .map(|n| match n {
            GeneralName::DnsName(s) => s.to_string(),
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect()
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn ca_certificate_is_a_self_signed_ca() {
    let ca = ca();
    let pem_text = ca.cert_pem();
    assert!(pem_text.starts_with("-----BEGIN CERTIFICATE-----\n"));
    verify_issued_by(&pem_text, &pem_text).unwrap();
    assert_eq!(certificate_common_name(&pem_text).unwrap(), "Test CA");
    assert_eq!(ca.common_name().as_deref(), Some("Test CA"));

    let cert = parse(&pem_text);
    let tbs = &cert.tbs_certificate;
    let (critical, bc) = tbs.get::<BasicConstraints>().unwrap().unwrap();
    assert!(critical && bc.ca);
    let (_, ku) = tbs.get::<KeyUsage>().unwrap().unwrap();
    assert!(ku.0.contains(KeyUsages::KeyCertSign));
    assert!(tbs.get::<SubjectKeyIdentifier>().unwrap().is_some());
    let v = &tbs.validity;
    let lifetime = v.not_after.to_unix_duration() - v.not_before.to_unix_duration();
    assert_eq!(lifetime, CA_VALIDITY + BACKDATE);
    assert_eq!(
        rsa_public_key(&tbs.subject_public_key_info)
            .unwrap()
            .n()
            .bits(),
        CA_KEY_BITS
    );
}

#[test]
fn signs_a_csr_for_server_and_client_auth() {
    let ca = ca();
    let cert_pem = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    verify_issued_by(&cert_pem, &ca.cert_pem()).unwrap();
    assert_eq!(
        certificate_common_name(&cert_pem).unwrap(),
        "node1.example.net"
    );

    let cert = parse(&cert_pem);
    let tbs = &cert.tbs_certificate;
    assert_eq!(
        rsa_public_key(&tbs.subject_public_key_info).unwrap(),
        test_key().to_public_key()
    );
    assert_eq!(dns_sans(&cert), vec!["node1.example.net"]);
    let (_, eku) = tbs.get::<ExtendedKeyUsage>().unwrap().unwrap();
    assert_eq!(eku.0, vec![OID_KP_SERVER_AUTH, OID_KP_CLIENT_AUTH]);
    let (_, bc) = tbs.get::<BasicConstraints>().unwrap().unwrap();
    assert!(!bc.ca);
    let (_, aki) = tbs.get::<AuthorityKeyIdentifier>().unwrap().unwrap();
    assert_eq!(aki.key_identifier.unwrap().as_bytes(), ca.key_id.as_slice());
    let v = &tbs.validity;
    assert_eq!(
        v.not_after.to_unix_duration() - v.not_before.to_unix_duration(),
        DAY + BACKDATE
    );
    // positive, 16 bytes, and fresh for every certificate
    assert_eq!(tbs.serial_number.as_bytes().len(), 16);
    let again = parse(&ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap());
    assert_ne!(tbs.serial_number, again.tbs_certificate.serial_number);
}

#[test]
fn csr_dns_names_become_sans_after_the_cn() {
    use x509_cert::builder::{Builder, RequestBuilder};
    let signer = SigningKey::<Sha256>::new(test_key().clone());
    let subject = Name::from_str("CN=node1.example.net,O=Acme").unwrap();
    let mut builder = RequestBuilder::new(subject.clone(), &signer).unwrap();
    let names = ["alias.example.net", "node1.example.net"];
    builder
        .add_extension(&SubjectAltName(
            names
                .iter()
                .map(|n| GeneralName::DnsName(Ia5String::new(n).unwrap()))
                .collect(),
        ))
        .unwrap();
    let req = builder
        .build_with_rng::<RsaSignature>(&mut rand::rngs::OsRng)
        .unwrap();
    let csr_pem = go_pem_encode("CERTIFICATE REQUEST", &[], &req.to_der().unwrap());

    let cert = parse(&ca().sign_csr(&csr_pem, DAY).unwrap());
    assert_eq!(cert.tbs_certificate.subject, subject);
    assert_eq!(
        dns_sans(&cert),
        vec!["node1.example.net", "alias.example.net"]
    );
}

#[test]
fn validity_never_outlives_the_ca() {
    let ca = ca();
    let ca_expiry = parse(&ca.cert_pem()).tbs_certificate.validity.not_after;
    for long in [Duration::from_secs(100 * 365 * 24 * 3600), Duration::MAX] {
        let cert = parse(&ca.sign_csr(&node_csr("n.example.net"), long).unwrap());
        assert_eq!(cert.tbs_certificate.validity.not_after, ca_expiry);
    }
}

#[test]
fn certificates_from_another_ca_fail() {
    let cert = ca().sign_csr(&node_csr("n.example.net"), DAY).unwrap();
    // A different name is caught by the issuer check...
    let other = CertificateAuthority::from_key("Other CA", test_key().clone()).unwrap();
    assert!(matches!(
        verify_issued_by(&cert, &other.cert_pem()),
        Err(PkiError::IssuerMismatch { .. })
    ));
    // ...the same name with another key by the signature.
    let impostor = CertificateAuthority::from_key("Test CA", test_key().clone()).unwrap();
    assert_eq!(
        verify_issued_by(&cert, &impostor.cert_pem()),
        Err(PkiError::InvalidSignature)
    );
    let forged = impostor.sign_csr(&node_csr("n.example.net"), DAY).unwrap();
    assert_eq!(
        verify_issued_by(&forged, &ca().cert_pem()),
        Err(PkiError::InvalidSignature)
    );
}

#[test]
fn tampered_certificate_fails() {
    let cert_pem = ca().sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    let mut der = pem::parse(&cert_pem).unwrap().into_contents();
    let pos = der.windows(5).position(|w| w == b"node1").unwrap();
    der[pos] = b'm';
    let tampered = go_pem_encode("CERTIFICATE", &[], &der);
    assert_eq!(
        certificate_common_name(&tampered).unwrap(),
        "mode1.example.net"
    );
    assert_eq!(
        verify_issued_by(&tampered, &ca().cert_pem()),
        Err(PkiError::InvalidSignature)
    );
}

#[test]
fn tampered_csr_is_refused() {
    let mut der = pem::parse(node_csr("node1.example.net"))
        .unwrap()
        .into_contents();
    let pos = der.windows(5).position(|w| w == b"node1").unwrap();
    der[pos] = b'm';
    let tampered = go_pem_encode("CERTIFICATE REQUEST", &[], &der);
    assert_eq!(
        ca().sign_csr(&tampered, DAY),
        Err(PkiError::Csr(CsrError::InvalidSignature))
    );
    assert!(matches!(
        ca().sign_csr("not a csr", DAY),
        Err(PkiError::Csr(CsrError::BadPem(_)))
    ));
}

#[test]
fn from_pem_round_trips_pkcs1_and_pkcs8_keys() {
    use rsa::pkcs8::EncodePrivateKey;
    let ca = ca();
    let pkcs1 = ca.key_pem();
    assert!(pkcs1.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
    let pkcs8 = parse_private_key(&pkcs1)
        .unwrap()
        .to_pkcs8_pem(LineEnding::LF)
        .unwrap();
    for key in [pkcs1.as_str(), pkcs8.as_str()] {
        let loaded = CertificateAuthority::from_pem(&ca.cert_pem(), key).unwrap();
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        assert_eq!(loaded.key_id, ca.key_id);
        let cert = loaded.sign_csr(&node_csr("n.example.net"), DAY).unwrap();
        verify_issued_by(&cert, &ca.cert_pem()).unwrap();
    }
}

#[test]
fn from_pem_refuses_bad_input() {
    let ca = ca();
    let cert = ca.cert_pem();
    let other_key = csr::private_key_pkcs1_pem(test_key()).unwrap();
    assert_eq!(
        CertificateAuthority::from_pem(&cert, &other_key).unwrap_err(),
        PkiError::KeyMismatch
    );
    let encrypted = crate::security::encrypt_private_key(&ca.key_pem(), &[7; 32]).unwrap();
    assert_eq!(
        CertificateAuthority::from_pem(&cert, &encrypted).unwrap_err(),
        PkiError::EncryptedKey
    );
    assert_eq!(
        CertificateAuthority::from_pem(&cert, &cert).unwrap_err(),
        PkiError::MissingPemBlock {
            what: "CA private key",
            expected: "RSA PRIVATE KEY or PRIVATE KEY"
        }
    );
    assert_eq!(
        CertificateAuthority::from_pem(&ca.key_pem(), &ca.key_pem())
            .unwrap_err()
            .to_string(),
        "CA certificate: no CERTIFICATE PEM block found"
    );
    let err = CertificateAuthority::from_pem("garbage", &ca.key_pem()).unwrap_err();
    assert!(matches!(err, PkiError::MissingPemBlock { .. }), "{err}");
    let bad_base64 = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
    assert_eq!(
        CertificateAuthority::from_pem(bad_base64, &ca.key_pem()).unwrap_err(),
        PkiError::BadPem {
            what: "CA certificate",
            reason: "PEM body is not valid base64"
        }
    );
}

#[test]
fn debug_and_errors_never_show_the_key() {
    let ca = ca();
    let debug = format!("{ca:?}");
    assert!(debug.contains("Test CA"), "{debug}");
    assert!(!debug.contains("PRIVATE"), "{debug}");
    let body: String = ca.key_pem().lines().nth(1).unwrap().into();
    let err = CertificateAuthority::from_pem(&ca.cert_pem(), &ca.key_pem()[..200])
        .unwrap_err()
        .to_string();
    assert!(!err.contains(&body[..20]), "{err}");
}

#[test]
fn openssl_verifies_our_certificates() {
    if skip_without_openssl("certificate chain check") {
        return;
    }
    let ca = ca();
    let cert = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    openssl_verifies(&ca.cert_pem(), &cert);
    // and refuses one from another CA
    let dir = tempfile::tempdir().unwrap();
    let ca_file = write(dir.path(), "ca.pem", &ca.cert_pem());
    let other = CertificateAuthority::from_key("Test CA", test_key().clone()).unwrap();
    let forged = write(
        dir.path(),
        "forged.pem",
        &other.sign_csr(&node_csr("node1.example.net"), DAY).unwrap(),
    );
    let out = openssl()
        .args(["verify", "-CAfile"])
        .arg(&ca_file)
        .arg(&forged)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn signs_with_an_openssl_made_ca() {
    if skip_without_openssl("OpenSSL CA check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("ca.key");
    let ca_file = dir.path().join("ca.pem");
    run_ok(
        openssl()
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/O=Acme/CN=OpenSSL CA", "-keyout"])
            .arg(&key_file)
            .arg("-out")
            .arg(&ca_file),
    );
    let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
    let key_pem = std::fs::read_to_string(&key_file).unwrap();
    let ca = CertificateAuthority::from_pem(&ca_pem, &key_pem).unwrap();
    let cert = ca
        .sign_csr(&node_csr("node1.example.net"), 30 * DAY)
        .unwrap();
    verify_issued_by(&cert, &ca_pem).unwrap();
    // clamped to the CA's two days
    let not_after = parse(&cert).tbs_certificate.validity.not_after;
    assert_eq!(not_after, parse(&ca_pem).tbs_certificate.validity.not_after);
    let cert_file = write(dir.path(), "cert.pem", &cert);
    run_ok(
        openssl()
            .args(["verify", "-purpose", "sslserver", "-CAfile"])
            .arg(&ca_file)
            .arg(&cert_file),
    );
}

#[test]
fn an_ecdsa_p256_ca_signs_csrs_that_verify_here_and_in_openssl() {
    let ca = CertificateAuthority::generate_p256("EC Test CA").unwrap();
    let cert = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    verify_issued_by(&cert, &ca.cert_pem()).unwrap();
    let parsed = parse(&cert);
    assert_eq!(parsed.signature_algorithm.oid, OID_ECDSA_SHA256);
    // The node's own RSA key, not the CA's, is what the certificate carries.
    assert_eq!(
        parsed.tbs_certificate.subject_public_key_info.algorithm.oid,
        OID_RSA_ENCRYPTION
    );
    // Another P-256 CA of the same name did not issue it.
    let other = CertificateAuthority::generate_p256("EC Test CA").unwrap();
    assert_eq!(
        verify_issued_by(&cert, &other.cert_pem()).unwrap_err(),
        PkiError::InvalidSignature
    );
    // Its key, written out and read back, is the same CA.
    let again = CertificateAuthority::from_pem(&ca.cert_pem(), &ca.key_pem()).unwrap();
    let cert2 = again.sign_csr(&node_csr("node2.example.net"), DAY).unwrap();
    verify_issued_by(&cert2, &ca.cert_pem()).unwrap();
    assert_eq!(
        CertificateAuthority::from_pem(&ca.cert_pem(), &other.key_pem()).unwrap_err(),
        PkiError::KeyMismatch
    );
    if skip_without_openssl("ECDSA chain check") {
        return;
    }
    openssl_verifies(&ca.cert_pem(), &cert);
}

#[test]
fn signs_with_an_openssl_made_ecdsa_p256_ca() {
    if skip_without_openssl("OpenSSL EC CA check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("ca.key");
    let ca_file = dir.path().join("ca.pem");
    run_ok(
        openssl()
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
            .args(["-subj", "/DC=net/DC=example/CN=Fleet CA", "-keyout"])
            .arg(&key_file)
            .arg("-out")
            .arg(&ca_file),
    );
    let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
    let key_pem = std::fs::read_to_string(&key_file).unwrap();
    let ca = CertificateAuthority::from_pem(&ca_pem, &key_pem).unwrap();
    let cert = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    verify_issued_by(&cert, &ca_pem).unwrap();
    // The issuer is the CA's subject exactly, repeated attributes and all.
    assert_eq!(
        parse(&cert).tbs_certificate.issuer,
        parse(&ca_pem).tbs_certificate.subject
    );
    let cert_file = write(dir.path(), "cert.pem", &cert);
    run_ok(
        openssl()
            .args(["verify", "-purpose", "sslclient", "-CAfile"])
            .arg(&ca_file)
            .arg(&cert_file),
    );
}

/// An OpenSSL root (RSA) and an intermediate under it (P-256, its key in
/// SEC1 as `openssl ecparam -genkey` writes it): the intermediate's file
/// then the root, as `ca.certificate` takes them.
fn openssl_intermediate(dir: &Path) -> (String, String, std::path::PathBuf) {
    let p = |name: &str| dir.join(name);
    run_ok(
        openssl()
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3",
            ])
            .args(["-subj", "/O=Acme/CN=Root CA", "-keyout"])
            .arg(p("root.key"))
            .arg("-out")
            .arg(p("root.pem")),
    );
    run_ok(
        openssl()
            .args(["ecparam", "-genkey", "-name", "prime256v1", "-out"])
            .arg(p("int.key")),
    );
    run_ok(
        openssl()
            .args(["req", "-new", "-subj", "/O=Acme/CN=Intermediate CA", "-key"])
            .arg(p("int.key"))
            .arg("-out")
            .arg(p("int.csr")),
    );
    write(
        dir,
        "int.ext",
        "basicConstraints=critical,CA:true\nkeyUsage=critical,keyCertSign,cRLSign\n",
    );
    run_ok(
        openssl()
            .args(["x509", "-req", "-days", "2", "-in"])
            .arg(p("int.csr"))
            .arg("-CA")
            .arg(p("root.pem"))
            .arg("-CAkey")
            .arg(p("root.key"))
            .args(["-CAcreateserial", "-extfile"])
            .arg(p("int.ext"))
            .arg("-out")
            .arg(p("int.pem")),
    );
    let read = |name: &str| std::fs::read_to_string(p(name)).unwrap();
    (
        read("int.pem") + &read("root.pem"),
        read("int.key"),
        p("root.pem"),
    )
}

#[test]
fn an_intermediate_sends_itself_as_the_chain_and_the_root_as_trust() {
    if skip_without_openssl("intermediate CA check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, sec1_key, root_file) = openssl_intermediate(dir.path());
    assert!(sec1_key.contains("BEGIN EC PRIVATE KEY"), "{sec1_key}");
    let ca = CertificateAuthority::from_pem(&file, &sec1_key).unwrap();
    assert_eq!(ca.common_name().as_deref(), Some("Intermediate CA"));
    let chain = parse_chain(ca.chain_pem()).unwrap();
    assert_eq!(chain.len(), 1, "the intermediate only, never the root");
    assert_eq!(
        chain[0].tbs_certificate.subject,
        parse(&ca.cert_pem()).tbs_certificate.subject
    );
    assert_eq!(parse_chain(ca.trust_pem()).unwrap().len(), 2);

    let leaf = ca.sign_csr(&node_csr("node1.example.net"), DAY).unwrap();
    let sent = write(dir.path(), "certificate.pem", &(leaf + ca.chain_pem()));
    let trust = write(dir.path(), "ca.pem", ca.trust_pem());
    // What a node is sent verifies with either what it trusts or the root
    // alone, the intermediate coming from its own certificate file.
    for anchor in [&trust, &root_file] {
        run_ok(
            openssl()
                .args(["verify", "-purpose", "sslclient", "-CAfile"])
                .arg(anchor)
                .arg("-untrusted")
                .arg(&sent)
                .arg(&sent),
        );
    }
}

#[test]
fn a_root_sends_no_chain() {
    let ca = ca();
    assert_eq!(ca.chain_pem(), "");
    assert_eq!(ca.trust_pem(), ca.cert_pem());
}
