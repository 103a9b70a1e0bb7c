use super::make::go_subject;
use super::*;
use crate::testing::test_key;
use crate::testing::{openssl, run_ok, skip_without_openssl};
use proptest::prelude::*;
use regex::Regex;
use rsa::pkcs8::DecodePublicKey;
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use std::sync::{Arc, OnceLock};
use x509_cert::der::{Tag, Tagged};

/// A CSR PEM for `cn` alone, signed with [`test_key`].
fn csr_pem(cn: &str) -> String {
    make_csr(test_key(), &CsrSubject::new(cn)).unwrap()
}

/// [`csr_pem`] parsed back.
fn csr_info(cn: &str) -> CsrInfo {
    parse_csr(&csr_pem(cn)).unwrap()
}

/// A subject with every field go-choria's `gencsr` knows about set.
fn full_subject(cn: &str) -> CsrSubject {
    CsrSubject {
        common_name: cn.into(),
        country: Some("GB".into()),
        locality: Some("London".into()),
        organization: Some("Acme & Co".into()),
        organizational_unit: Some("Ops".into()),
        state: Some("Greater London".into()),
    }
}

#[test]
fn csr_round_trip_and_signature() {
    let key = test_key();
    let pem_text = csr_pem("node1.example.net");
    assert!(pem_text.starts_with("-----BEGIN CERTIFICATE REQUEST-----\n"));
    assert!(pem_text.ends_with("-----END CERTIFICATE REQUEST-----\n"));
    let info = parse_csr(&pem_text).unwrap();
    assert_eq!(info.common_name, "node1.example.net");
    assert!(info.dns_names.is_empty());
    assert_eq!(info.public_key.as_ref(), Some(&key.to_public_key()));
    assert_eq!(info.signature_algorithm, "1.2.840.113549.1.1.11");
    info.verify_signature().unwrap();
}

#[test]
fn subject_order_and_string_types_match_go() {
    let subj = full_subject("n_1.example");
    let name = go_subject(&subj).unwrap();
    let got: Vec<(String, Tag, String)> = name
        .0
        .iter()
        .map(|rdn| {
            let atv = rdn.0.iter().next().unwrap();
            (
                atv.oid.to_string(),
                atv.value.tag(),
                String::from_utf8(atv.value.value().to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("2.5.4.6".into(), Tag::PrintableString, "GB".into()),
            (
                "2.5.4.8".into(),
                Tag::PrintableString,
                "Greater London".into()
            ),
            ("2.5.4.7".into(), Tag::PrintableString, "London".into()),
            ("2.5.4.10".into(), Tag::Utf8String, "Acme & Co".into()),
            ("2.5.4.11".into(), Tag::PrintableString, "Ops".into()),
            // underscore is not PrintableString
            ("2.5.4.3".into(), Tag::Utf8String, "n_1.example".into()),
        ]
    );
    let pem_text = make_csr(test_key(), &subj).unwrap();
    let info = parse_csr(&pem_text).unwrap();
    assert_eq!(info.common_name, "n_1.example");
    info.verify_signature().unwrap();
}

#[test]
fn openssl_reads_our_csr() {
    if skip_without_openssl("CSR check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("csr.pem");
    std::fs::write(&p, csr_pem("node1.example.net")).unwrap();
    let out = openssl()
        .args(["req", "-noout", "-verify", "-subject", "-in"])
        .arg(&p)
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("CN") && all.contains("node1.example.net"),
        "{all}"
    );
    assert!(all.to_lowercase().contains("verify ok"), "{all}");
}

#[test]
fn parses_openssl_csr_with_sans() {
    if skip_without_openssl("SAN parsing check") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pem");
    std::fs::write(&key, private_key_pkcs1_pem(test_key()).unwrap()).unwrap();
    let out = run_ok(
        openssl()
            .args(["req", "-new", "-sha256", "-key"])
            .arg(&key)
            .args([
                "-subj",
                "/CN=node1.example.net",
                "-addext",
                "subjectAltName=DNS:node1.example.net,DNS:evil.mcollective,IP:10.0.0.1,email:a@b.c",
            ]),
    );
    let info = parse_csr(&String::from_utf8(out.stdout).unwrap()).unwrap();
    info.verify_signature().unwrap();
    assert_eq!(info.common_name, "node1.example.net");
    assert_eq!(
        info.dns_names,
        vec!["node1.example.net", "evil.mcollective"]
    );
    assert_eq!(info.ip_addresses, vec![IpAddr::from([10, 0, 0, 1])]);
    assert_eq!(info.email_addresses, vec!["a@b.c"]);
    let deny = default_deny_list();
    assert_eq!(
        validate_csr_names(&info, "node1.example.net", &deny),
        Err(CsrError::DeniedName("evil.mcollective".into()))
    );
}

#[test]
fn tampered_csr_fails_signature() {
    let pem_text = csr_pem("node1.example.net");
    let mut der = pem::parse(&pem_text).unwrap().into_contents();
    // flip a byte inside the CN value
    let pos = der
        .windows(5)
        .position(|w| w == b"node1")
        .expect("cn in der");
    der[pos] = b'm';
    let info = parse_csr_der(&der).unwrap();
    assert_eq!(info.common_name, "mode1.example.net");
    assert_eq!(info.verify_signature(), Err(CsrError::InvalidSignature));
}

#[test]
fn key_pems() {
    let key = test_key();
    let priv_pem = private_key_pkcs1_pem(key).unwrap();
    assert!(priv_pem.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"));
    use rsa::pkcs1::DecodeRsaPrivateKey;
    let back = RsaPrivateKey::from_pkcs1_der(pem::parse(&priv_pem).unwrap().contents()).unwrap();
    assert_eq!(&back, key);

    let pub_pem = public_key_pem_go_style(&key.to_public_key()).unwrap();
    assert!(pub_pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
    let block = pem::parse(&pub_pem).unwrap();
    // PKCS#1 inside, not SPKI
    assert_eq!(
        rsa_public_key_from_pkcs1_der(block.contents()).unwrap(),
        key.to_public_key()
    );
    assert!(RsaPublicKey::from_public_key_der(block.contents()).is_err());
}

#[test]
fn name_validation_matches_go() {
    let info = csr_info("n1.example.net");
    let deny = default_deny_list();
    validate_csr_names(&info, "n1.example.net", &deny).unwrap();
    assert_eq!(
        validate_csr_names(&info, "n2.example.net", &deny)
            .unwrap_err()
            .to_string(),
        "common name n1.example.net does not match identity n2.example.net"
    );
    for cn in ["x.mcollective", "x.privileged.choria", "a.choria"] {
        let info = csr_info(cn);
        assert_eq!(
            validate_csr_names(&info, cn, &deny)
                .unwrap_err()
                .to_string(),
            format!("{cn} matches denied certificate pattern")
        );
    }
    // unanchored, `.` is a wildcard in the Go default patterns too
    let info = csr_info("x.privilegedXchoria");
    assert!(validate_csr_names(&info, "x.privilegedXchoria", &deny).is_err());
    let info = csr_info("choria");
    validate_csr_names(&info, "choria", &deny).unwrap();
}

#[test]
fn deny_list_delimiters() {
    assert_eq!(strip_regex_delimiters("/foo/"), "foo");
    assert_eq!(strip_regex_delimiters("//foo//"), "foo");
    assert_eq!(strip_regex_delimiters("/foo"), "/foo");
    assert_eq!(strip_regex_delimiters("//"), "//");
    assert_eq!(strip_regex_delimiters("/a\nb/"), "/a\nb/");
    let re = compile_deny_list(&["/^bad\\./", "evil$"]).unwrap();
    assert!(re[0].is_match("bad.example"));
    assert!(!re[0].is_match("notbad.example"));
    assert!(matches!(
        compile_deny_list(&["/(/"]),
        Err(CsrError::InvalidDenyPattern { .. })
    ));
    assert_eq!(default_deny_list().len(), 4);
}

#[test]
fn bad_pem_says_what_is_wrong() {
    assert_eq!(
        parse_csr("garbage").unwrap_err().to_string(),
        "could not parse CSR: no complete -----BEGIN/-----END PEM block"
    );
}

#[test]
fn missing_cn_rejected() {
    assert_eq!(
        make_csr(test_key(), &CsrSubject::default()),
        Err(CsrError::MissingCommonName)
    );
}

#[test]
fn key_pool() {
    let pool = RsaKeyPool::generate_with_threads(3, 512, 2).unwrap();
    assert_eq!(pool.len(), 3);
    assert!(!pool.is_empty());
    let a = pool.next_key();
    let _ = pool.next_key();
    let _ = pool.next_key();
    assert!(Arc::ptr_eq(&a, &pool.next_key()));
    assert!(Arc::ptr_eq(&pool.get(1), &pool.get(4)));
    assert!(!Arc::ptr_eq(&pool.get(0), &pool.get(1)));
    assert_eq!(
        RsaKeyPool::generate(0, 512).unwrap_err(),
        CsrError::EmptyPool
    );
    assert!(RsaKeyPool::from_keys(vec![]).is_err());
    assert!(!format!("{pool:?}").contains("BEGIN"));
    let one = RsaKeyPool::from_keys(vec![test_key().clone()]).unwrap();
    assert_eq!(one.get(7).n().bits(), 1024);
}

#[test]
fn pool_generates_2048_bit_keys_in_parallel() {
    let pool = RsaKeyPool::generate(2, DEFAULT_RSA_BITS).unwrap();
    assert_eq!(pool.get(0).n().bits(), 2048);
    assert_eq!(pool.get(1).n().bits(), 2048);
}

#[test]
fn byte_identical_to_go_create_certificate_request() {
    use super::super::go_vectors::{GO_CSR, GO_PUBPEM, RSA_KEY_PEM};
    use rsa::pkcs1::DecodeRsaPrivateKey;
    let key = RsaPrivateKey::from_pkcs1_pem(RSA_KEY_PEM).unwrap();
    let ours = pem::parse(make_csr(&key, &full_subject("node1.example.net")).unwrap())
        .unwrap()
        .into_contents();
    assert_eq!(hex::encode(&ours), GO_CSR);
    let go_pub = String::from_utf8(hex::decode(GO_PUBPEM).unwrap()).unwrap();
    assert_eq!(
        public_key_pem_go_style(&key.to_public_key()).unwrap(),
        go_pub
    );
    let info = parse_csr_der(&hex::decode(GO_CSR).unwrap()).unwrap();
    info.verify_signature().unwrap();
    assert_eq!(info.common_name, "node1.example.net");
}

proptest! {
    #[test]
    fn parse_csr_never_panics(s in ".{0,300}") {
        let _ = parse_csr(&s);
    }

    #[test]
    fn parse_csr_der_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_csr_der(&b);
    }

    #[test]
    fn parse_mutated_csr_never_panics(idx in 0usize..2000, byte in any::<u8>()) {
        static DER: OnceLock<Vec<u8>> = OnceLock::new();
        let der = DER.get_or_init(|| {
            pem::parse(csr_pem("node1.example.net")).unwrap().into_contents()
        });
        let mut d = der.clone();
        let i = idx % d.len();
        d[i] = byte;
        if let Ok(info) = parse_csr_der(&d) {
            let _ = info.verify_signature();
        }
    }

    #[test]
    fn compile_deny_list_never_panics(p in ".{0,30}") {
        let _ = compile_deny_list(&[p]);
    }
}

/// A CSR made by `openssl req` with `subj` and optional `-addext` values,
/// signed with [`test_key`]; `None` without openssl.
fn openssl_csr(subj: &str, addext: &[&str]) -> Option<CsrInfo> {
    if skip_without_openssl("openssl-made CSRs") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pem");
    std::fs::write(&key, private_key_pkcs1_pem(test_key()).unwrap()).unwrap();
    let mut cmd = openssl();
    cmd.args(["req", "-new", "-key"])
        .arg(&key)
        .args(["-subj", subj]);
    for e in addext {
        cmd.args(["-addext", e]);
    }
    let out = run_ok(&mut cmd);
    Some(parse_csr(&String::from_utf8(out.stdout).unwrap()).unwrap())
}

fn checked(info: &CsrInfo) -> Result<(), CsrError> {
    check_csr(info, "n1.example.net", &default_deny_list(), &[])
}

#[test]
fn a_csr_for_exactly_the_identity_passes_every_check() {
    check_csr(
        &csr_info("n1.example.net"),
        "n1.example.net",
        &default_deny_list(),
        &[],
    )
    .unwrap();
    if let Some(info) = openssl_csr("/CN=n1.example.net", &["subjectAltName=DNS:n1.example.net"]) {
        checked(&info).unwrap();
    }
}

#[test]
fn a_csr_whose_signature_does_not_verify_is_refused() {
    let pem_text = csr_pem("n1.example.net");
    let mut der = pem::parse(&pem_text).unwrap().contents().to_vec();
    let last = der.len() - 1;
    der[last] ^= 0x01; // inside the signature BIT STRING
    let info = parse_csr_der(&der).unwrap();
    let e = checked(&info).unwrap_err();
    assert_eq!(e, CsrError::InvalidSignature);
    assert_eq!(e.reason(), "bad_signature");
}

#[test]
fn each_name_problem_has_its_own_refusal() {
    let cases: [(&str, &[&str], &str, &str); 7] = [
        (
            "/CN=n1.example.net/CN=n2.example.net",
            &[],
            "common_name_count",
            "2 common names",
        ),
        ("/O=acme", &[], "common_name_count", "no common name"),
        (
            "/CN=n2.example.net",
            &[],
            "common_name",
            "does not match identity",
        ),
        (
            "/CN=n1.example.net",
            &["subjectAltName=DNS:n1.example.net,DNS:evil.example.net"],
            "foreign_dns_name",
            "evil.example.net",
        ),
        (
            "/CN=n1.example.net",
            &["subjectAltName=IP:10.1.2.3"],
            "non_dns_san",
            "IP address 10.1.2.3",
        ),
        (
            "/CN=n1.example.net",
            &["subjectAltName=URI:spiffe://x/y"],
            "non_dns_san",
            "URI",
        ),
        (
            "/CN=n1.example.net",
            &["subjectAltName=email:a@example.net"],
            "non_dns_san",
            "e-mail",
        ),
    ];
    for (subj, ext, reason, text) in cases {
        let Some(info) = openssl_csr(subj, ext) else {
            return;
        };
        let e = checked(&info).unwrap_err();
        assert_eq!(e.reason(), reason, "{subj} {ext:?}: {e}");
        assert!(e.to_string().contains(text), "{subj} {ext:?}: {e}");
    }
}

#[test]
fn extra_dns_names_pass_only_when_configured() {
    let Some(info) = openssl_csr(
        "/CN=n1.example.net",
        &["subjectAltName=DNS:n1.example.net,DNS:n1.internal"],
    ) else {
        return;
    };
    assert!(matches!(checked(&info), Err(CsrError::ForeignDnsName(_))));
    let allowed = [Regex::new(r"^n1\.internal$").unwrap()];
    check_csr(&info, "n1.example.net", &default_deny_list(), &allowed).unwrap();
}

#[test]
fn an_allowed_name_pattern_matches_whole_names_only() {
    // `example\.net` must not admit a name that merely contains it.
    let allowed = [compile_whole_name(r"n1\.example\.net").unwrap()];
    for (san, ok) in [
        ("n1.example.net", true),
        ("n1.example.net.evil.tld", false),
        ("evil-n1.example.net", false),
        ("xn1.example.net", false),
    ] {
        let Some(info) = openssl_csr(
            "/CN=n1.internal",
            &[&format!("subjectAltName=DNS:n1.internal,DNS:{san}")],
        ) else {
            return;
        };
        let result = check_csr(&info, "n1.internal", &default_deny_list(), &allowed);
        assert_eq!(result.is_ok(), ok, "{san}: {result:?}");
    }
    // Go-style /re/ delimiters are still taken off first.
    assert!(compile_whole_name("/a.b/").unwrap().is_match("a.b"));
    assert!(!compile_whole_name("/a/").unwrap().is_match("ab"));
    // Alternatives are anchored as a group, not only the first and last.
    let alt = compile_whole_name("a|b").unwrap();
    assert!(alt.is_match("a") && alt.is_match("b") && !alt.is_match("ab") && !alt.is_match("xb"));
}

#[test]
fn the_deny_list_still_applies_to_allowed_names() {
    let Some(info) = openssl_csr(
        "/CN=n1.example.net",
        &["subjectAltName=DNS:n1.example.net,DNS:x.privileged.choria"],
    ) else {
        return;
    };
    let allowed = [Regex::new(r"choria$").unwrap()];
    let e = check_csr(&info, "n1.example.net", &default_deny_list(), &allowed).unwrap_err();
    assert_eq!(e.reason(), "denied_name", "{e}");
}

#[test]
fn garbage_names_are_shown_clipped_and_escaped() {
    let cn = format!("evil\u{1b}[31m{}", "x".repeat(500));
    let e = CsrError::CommonNameMismatch {
        common_name: cn,
        identity: "n1".into(),
    }
    .to_string();
    assert!(!e.chars().any(char::is_control), "{e:?}");
    assert!(e.len() < 150, "{e}");
}
