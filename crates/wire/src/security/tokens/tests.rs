use super::super::ed25519::Ed25519KeyPair;
use super::*;
use crate::json;
use crate::testing::test_key;
use crate::testing::{openssl, run_ok, skip_without_openssl};
use proptest::prelude::*;
use rsa::pkcs1v15;
use rsa::signature::{RandomizedSigner, SignatureEncoding};
use sha2::{Sha384, Sha512};

const NOW: i64 = 1_700_000_000;
const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const PUB: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

fn ed_key() -> TokenSigningKey {
    TokenSigningKey::from_bytes(SEED.as_bytes()).unwrap()
}

fn rsa_key() -> TokenSigningKey {
    TokenSigningKey::Rsa(crate::security::rsa_signer::RsaSigningKey::new(
        test_key().clone(),
    ))
}

fn b64(s: &str) -> String {
    JWT_B64.encode(s)
}

/// Builds a token with arbitrary header and claims JSON, signed by `key`.
fn raw_token(header: &str, claims: &str, key: &TokenSigningKey) -> String {
    let input = format!("{}.{}", b64(header), b64(claims));
    format!(
        "{input}.{}",
        JWT_B64.encode(key.sign_input(input.as_bytes()).unwrap())
    )
}

/// [`raw_token`] with the standard EdDSA header, signed by [`ed_key`].
fn ed_token(claims: &str) -> String {
    raw_token(r#"{"alg":"EdDSA","typ":"JWT"}"#, claims, &ed_key())
}

fn prov_claims() -> ProvisioningClaims {
    let mut c = ProvisioningClaims::new_at(
        "s3cret",
        "nats://broker:4222",
        "",
        Duration::from_secs(3600),
        NOW,
    )
    .unwrap();
    c.prov_nats_pass = "hunter2".into();
    c
}

#[test]
fn provisioning_claims_json_order_matches_go() {
    let mut c = prov_claims();
    c.standard.id = "2Y7pSdJ2mF3FZuG8N0ZP6kYbC7D".into();
    let json = json::to_string(&c).unwrap();
    assert_eq!(
        json,
        concat!(
            r#"{"cht":"s3cret","chs":false,"chu":"nats://broker:4222","chpd":true,"#,
            r#""chpwd":"hunter2","extensions":null,"ou":"choria","#,
            r#""purpose":"choria_provisioning","iss":"Choria Tokens Package","#,
            r#""sub":"choria_provisioning","exp":1700003600,"nbf":1700000000,"#,
            r#""iat":1700000000,"jti":"2Y7pSdJ2mF3FZuG8N0ZP6kYbC7D"}"#
        )
    );
    c.extensions = Some(serde_json::Map::new());
    c.proto_v2 = true;
    c.allow_update = true;
    c.standard.audience = vec!["x".into()];
    c.standard.trust_chain_signature = "ab".into();
    c.standard.public_key = "cd".into();
    c.standard.issuer_expires_at = Some(5);
    let json = json::to_string(&c).unwrap();
    assert!(
        json.contains(r#""extensions":{},"ou":"choria","v2":true,"update":true,"purpose":"choria_provisioning","tcs":"ab","public_key":"cd","issexp":5,"iss":"Choria Tokens Package","sub":"choria_provisioning","aud":["x"],"exp""#),
        "{json}"
    );
}

#[test]
fn server_claims_new_and_json_order() {
    let kp = Ed25519KeyPair::generate();
    let c = ServerClaims::new_at(
        NOW,
        "node1.example.net",
        vec!["choria".into()],
        "",
        Some(ServerPermissions {
            submission: true,
            ..Default::default()
        }),
        vec!["x.>".into()],
        &kp.public_hex().to_uppercase(),
        PROVISIONER_ISSUER,
        Duration::from_secs(365 * 24 * 3600),
    )
    .unwrap();
    assert_eq!(c.standard.public_key, kp.public_hex());
    assert_eq!(c.organization_unit, "choria");
    assert_eq!(c.standard.issued_at, Some(NOW));
    assert_eq!(c.standard.not_before, Some(NOW));
    assert_eq!(c.standard.expires_at, Some(NOW + 365 * 24 * 3600));
    assert_eq!(ksuid_timestamp(&c.standard.id).unwrap(), NOW);
    assert!(c.standard.subject.is_empty());
    let json = json::to_string(&c).unwrap();
    let expected_prefix = format!(
        r#"{{"identity":"node1.example.net","collectives":["choria"],"permissions":{{"submission":true}},"ou":"choria","pub_subjects":["x.>"],"purpose":"choria_server","public_key":"{}","iss":"Choria Provisioner","exp":{},"nbf":{NOW},"iat":{NOW},"jti":""#,
        kp.public_hex(),
        NOW + 365 * 24 * 3600
    )
    .replace("x.>", "x.\\u003e");
    assert!(
        json.starts_with(&expected_prefix),
        "{json}\n{expected_prefix}"
    );

    let err = |r: Result<ServerClaims, TokenError>| r.unwrap_err().to_string();
    let pk = kp.public_hex();
    let day = Duration::from_secs(86400);
    assert_eq!(
        err(plain_server_claims("", &["c"], &pk, day)),
        "invalid claims: identity is required"
    );
    assert_eq!(
        err(plain_server_claims("n", &[], &pk, day)),
        "invalid claims: at least one collective is required"
    );
    assert!(err(plain_server_claims("n", &["c"], "abc", day))
        .contains("server public key is not a hex ed25519 key"));
    assert_eq!(
        err(plain_server_claims("n", &["c"], &pk, Duration::ZERO)),
        "invalid claims: validity is required"
    );
    let d = plain_server_claims("n", &["c"], &pk, day).unwrap();
    assert_eq!(d.standard.issuer, DEFAULT_ISSUER);
    // wall clock variant
    let w = ServerClaims::new("n", vec!["c".into()], "o", None, vec![], &pk, "", day).unwrap();
    assert!(w.standard.issued_at.unwrap() > NOW);
}

#[test]
fn extensions_marshal_like_go() {
    // EXT vector: Go json.Unmarshal of this JSON into MapClaims, then
    // json.Marshal of ProvisioningClaims{Extensions: ext}.
    let input = r#"{"z":{"y":[1,2.0,-0.0],"x":null},"f":1.5,"big":1e21,"small":1e-7,"small2":1.5e-10,"int":12345678901234567890,"neg":-3,"s":"<&>","t":true,"mid":0.000001,"e20":1e20}"#;
    let go = r#"{"cht":"","chs":false,"chpd":false,"extensions":{"big":1e+21,"e20":100000000000000000000,"f":1.5,"int":12345678901234567000,"mid":0.000001,"neg":-3,"s":"\u003c\u0026\u003e","small":1e-7,"small2":1.5e-10,"t":true,"z":{"x":null,"y":[1,2,-0]}},"purpose":""}"#;
    let c = ProvisioningClaims {
        extensions: Some(serde_json::from_str(input).unwrap()),
        ..Default::default()
    };
    assert_eq!(json::to_string(&c).unwrap(), go);
    // Go's formatting of a big float; the JSON literal is kept out of the
    // vector above because serde_json's default (non `float_roundtrip`)
    // parser rounds 123456789012345678901234 one ulp differently.
    assert_eq!(
        json::go_float(1.234_567_890_123_456_9e23),
        "1.2345678901234569e+23"
    );
    assert_eq!(json::go_float(-2.5e-8), "-2.5e-8");
    // plain serde_json keeps integers natural
    let plain = serde_json::to_string(&c).unwrap();
    assert!(
        plain.contains(r#""neg":-3"#) && plain.contains(r#""y":[1,2,-0.0]"#),
        "{plain}"
    );
}

#[test]
fn go_string_escaping() {
    let v = serde_json::json!({"a": "<b>&\u{2028}\u{2029}\n\"é"});
    assert_eq!(
        json::to_string(&v).unwrap(),
        r#"{"a":"\u003cb\u003e\u0026\u2028\u2029\n\"é"}"#
    );
}

#[test]
fn header_is_go_byte_identical() {
    let t = ed_key().sign(&prov_claims()).unwrap();
    assert!(
        t.starts_with("eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9."),
        "{t}"
    );
    let t = rsa_key().sign(&prov_claims()).unwrap();
    assert!(
        t.starts_with("eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9."),
        "{t}"
    );
    assert_eq!(token_algorithm(&t).unwrap(), "RS256");
}

#[test]
fn round_trip_ed25519_and_rsa() {
    for key in [ed_key(), rsa_key()] {
        let claims = prov_claims();
        let token = key.sign(&claims).unwrap();
        let parsed = parse_provisioning_token_at(&token, &key.verify_key(), NOW + 10).unwrap();
        assert_eq!(parsed, claims);
        // a token with a trailing newline (as read from a file) still parses
        let parsed =
            parse_provisioning_token_at(&format!("{token}\n"), &key.verify_key(), NOW).unwrap();
        assert_eq!(parsed.token, "s3cret");
    }
}

#[test]
fn rs384_and_rs512_accepted() {
    /// A token with header `alg`, signed by [`test_key`] over digest `D`.
    fn rsa_token<D>(alg: &str, claims: &str) -> String
    where
        D: sha2::Digest + sha2::digest::const_oid::AssociatedOid,
    {
        let input = format!(
            "{}.{}",
            b64(&format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#)),
            b64(claims)
        );
        let sig = pkcs1v15::SigningKey::<D>::new(test_key().clone())
            .sign_with_rng(&mut rand::rngs::OsRng, input.as_bytes())
            .to_vec();
        format!("{input}.{}", JWT_B64.encode(sig))
    }
    let claims = json::to_string(&prov_claims()).unwrap();
    for token in [
        rsa_token::<Sha384>("RS384", &claims),
        rsa_token::<Sha512>("RS512", &claims),
    ] {
        parse_provisioning_token_at(&token, &rsa_key().verify_key(), NOW).unwrap();
    }
}

#[test]
fn verification_failures() {
    let ed = ed_key();
    let token = ed.sign(&prov_claims()).unwrap();

    // wrong key type
    let e = parse_provisioning_token_at(&token, &rsa_key().verify_key(), NOW).unwrap_err();
    assert!(
        matches!(
            e,
            TokenError::KeyMismatch {
                needed: "ed25519",
                have: "rsa",
                ..
            }
        ),
        "{e}"
    );
    let rt = rsa_key().sign(&prov_claims()).unwrap();
    let e = parse_provisioning_token_at(&rt, &ed.verify_key(), NOW).unwrap_err();
    assert_eq!(
        e.to_string(),
        "token is signed with RS256, which needs an rsa public key, but the verification key is ed25519"
    );

    // wrong key
    let other = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[7u8; 32]));
    let e = parse_provisioning_token_at(&token, &other.verify_key(), NOW).unwrap_err();
    assert!(matches!(e, TokenError::InvalidSignature));

    // tampered claims
    let parts: Vec<&str> = token.split('.').collect();
    let mut c = prov_claims();
    c.token = "other".into();
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        JWT_B64.encode(to_go_json(&c).unwrap()),
        parts[2]
    );
    assert!(matches!(
        parse_provisioning_token_at(&forged, &ed.verify_key(), NOW),
        Err(TokenError::InvalidSignature)
    ));

    // time checks: exp is exclusive, nbf inclusive, no leeway
    let vk = ed.verify_key();
    assert!(parse_provisioning_token_at(&token, &vk, NOW + 3599).is_ok());
    assert!(matches!(
        parse_provisioning_token_at(&token, &vk, NOW + 3600),
        Err(TokenError::Expired { exp, now }) if exp == NOW + 3600 && now == NOW + 3600
    ));
    assert!(parse_provisioning_token_at(&token, &vk, NOW).is_ok());
    assert!(matches!(
        parse_provisioning_token_at(&token, &vk, NOW - 1),
        Err(TokenError::NotYetValid { .. })
    ));

    // unsupported algorithms, including "none"
    for alg in ["HS256", "none", "ES256", "PS256"] {
        let t = raw_token(
            &format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#),
            r#"{"purpose":"choria_provisioning"}"#,
            &ed,
        );
        assert!(
            matches!(parse_provisioning_token_at(&t, &vk, NOW), Err(TokenError::UnsupportedAlgorithm(ref a)) if a == alg),
            "{alg}"
        );
    }

    // malformed
    for bad in ["", "a.b", "a.b.c.d", "!!!.e30.", "e30.e30.sig"] {
        assert!(
            matches!(
                parse_provisioning_token_at(bad, &vk, NOW),
                Err(TokenError::Malformed(_))
            ),
            "{bad}"
        );
    }
}

#[test]
fn purpose_and_optional_exp() {
    let vk = ed_key().verify_key();
    let parse = |claims: &str| parse_provisioning_token_at(&ed_token(claims), &vk, NOW);
    // sub alone is enough, exp is optional, ou defaults
    let c = parse(r#"{"cht":"x","sub":"choria_provisioning"}"#).unwrap();
    assert_eq!(c.organization_unit, "choria");
    assert!(c.standard.expires_at.is_none());
    // wrong purpose
    assert_eq!(
        parse(r#"{"purpose":"choria_server"}"#)
            .unwrap_err()
            .to_string(),
        "not a provisioning token (purpose \"choria_server\", sub \"\")"
    );
    for claims in [
        // tcs present but not chain issued => expired, like Go's ErrTokenExpired
        r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"I-00","exp":1800000000}"#,
        // tcs with chain issuer but no issexp
        r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000}"#,
        // tcs with chain issuer and issexp in the past
        r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000,"issexp":1600000000}"#,
    ] {
        assert!(
            matches!(parse(claims), Err(TokenError::IssuerExpiry(_))),
            "{claims}"
        );
    }
    assert!(parse(
        r#"{"purpose":"choria_provisioning","tcs":"aa","iss":"C-x.y","exp":1800000000,"issexp":1800000000}"#
    )
    .is_ok());
}

#[test]
fn lenient_decoding_like_go() {
    let c: ProvisioningClaims = serde_json::from_str(
        r#"{"cht":null,"chs":null,"extensions":{"a":1},"aud":"one","exp":1.7e9,"nbf":"1600000000","iat":1600000000.9,"unknown":[1,2]}"#,
    )
    .unwrap();
    assert_eq!(c.token, "");
    assert_eq!(c.standard.audience, vec!["one"]);
    assert_eq!(c.standard.expires_at, Some(1_700_000_000));
    assert_eq!(c.standard.not_before, Some(1_600_000_000));
    assert_eq!(c.standard.issued_at, Some(1_600_000_000));
    assert_eq!(c.extensions.as_ref().unwrap()["a"], 1);
    let c: StandardClaims = serde_json::from_str(r#"{"aud":["a","b"],"exp":null}"#).unwrap();
    assert_eq!(c.audience, vec!["a", "b"]);
    assert_eq!(c.expires_at, None);
    assert!(serde_json::from_str::<StandardClaims>(r#"{"aud":[1]}"#).is_err());
    assert!(serde_json::from_str::<StandardClaims>(r#"{"exp":"soon"}"#).is_err());
    assert!(serde_json::from_str::<StandardClaims>(r#"{"exp":1e300}"#).is_err());
    assert!(serde_json::from_str::<ProvisioningClaims>(r#"{"extensions":"x"}"#).is_err());
}

#[test]
fn claims_errors_do_not_echo_values() {
    let ed = ed_key();
    let t = ed_token(r#"{"purpose":"choria_provisioning","cht":987654321,"chpwd":true}"#);
    let e = parse_provisioning_token_at(&t, &ed.verify_key(), NOW)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("token claims could not be decoded: invalid type, expected a string"),
        "{e}"
    );
    assert!(!e.contains("987654321"), "{e}");
    let t = raw_token(r#"{"alg":"EdDSA"}"#, r#"{"exp":"nope"}"#, &ed);
    let e = parse_provisioning_token_at(&t, &ed.verify_key(), NOW)
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid NumericDate"), "{e}");
    assert!(!e.contains("nope"), "{e}");
}

#[test]
fn debug_redacts_secrets() {
    let c = prov_claims();
    let d = format!("{c:?}");
    assert!(!d.contains("s3cret") && !d.contains("hunter2"), "{d}");
    assert!(d.contains("<redacted>"));
    let d = format!("{:?}", ed_key());
    assert!(!d.contains(SEED) && d.contains(PUB), "{d}");
    let d = format!("{:?}", rsa_key());
    assert!(d.contains("redacted 1024 bit key"), "{d}");
}

#[test]
fn signing_key_loading() {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::EncodePrivateKey;
    let key = test_key();
    let pkcs1 = key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    let pkcs8 = key.to_pkcs8_pem(rsa::pkcs8::LineEnding::LF).unwrap();
    for pem_text in [pkcs1.as_str(), pkcs8.as_str()] {
        let k = TokenSigningKey::from_bytes(pem_text.as_bytes()).unwrap();
        assert_eq!(k.algorithm(), "RS256");
        assert_eq!(k.verify_key(), TokenVerifyKey::Rsa(key.to_public_key()));
    }
    let k = TokenSigningKey::from_bytes(SEED.as_bytes()).unwrap();
    assert_eq!(k.algorithm(), "EdDSA");
    assert_eq!(
        k.verify_key(),
        TokenVerifyKey::from_ed25519_hex(PUB).unwrap()
    );
    assert!(k.as_ed25519().is_some());
    // lenient: trailing newline
    assert!(TokenSigningKey::from_bytes(format!("{SEED}\n").as_bytes()).is_ok());
    assert!(TokenSigningKey::from_bytes(format!("{SEED}\r\n").as_bytes()).is_ok());
    // errors
    assert!(matches!(
        TokenSigningKey::from_bytes(b"hello"),
        Err(KeyError::UnsupportedSigningKey(5))
    ));
    let bad_seed = format!("{}zz", &SEED[..62]);
    let e = TokenSigningKey::from_bytes(bad_seed.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("invalid ed25519 seed"), "{e}");
    assert!(!e.contains(&SEED[..20]), "{e}");
    assert!(matches!(
        TokenSigningKey::from_bytes(
            b"-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n"
        ),
        Err(KeyError::RsaPrivateKey(_))
    ));
    // from file
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("seed");
    std::fs::write(&p, SEED).unwrap();
    assert_eq!(TokenSigningKey::from_file(&p).unwrap().algorithm(), "EdDSA");
    assert!(matches!(
        TokenSigningKey::from_file(dir.path().join("missing")),
        Err(KeyError::Read { .. })
    ));
}

#[test]
fn verify_key_from_setting() {
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::pkcs8::EncodePublicKey;
    let key = test_key().to_public_key();
    let want = TokenVerifyKey::Rsa(key.clone());
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, data: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, data).unwrap();
        p.to_str().unwrap().to_string()
    };
    let spki = write(
        "spki.pem",
        &key.to_public_key_pem(rsa::pkcs8::LineEnding::LF).unwrap(),
    );
    let pkcs1 = write(
        "pkcs1.pem",
        &key.to_pkcs1_pem(rsa::pkcs8::LineEnding::LF).unwrap(),
    );
    let go_style = write(
        "go.pem",
        &super::super::csr::public_key_pem_go_style(&key).unwrap(),
    );
    for p in [&spki, &pkcs1, &go_style] {
        assert_eq!(TokenVerifyKey::from_setting(p).unwrap(), want, "{p}");
    }
    let hexf = write("pub.hex", &format!("{PUB}\n"));
    let ed = TokenVerifyKey::from_ed25519_hex(PUB).unwrap();
    assert_eq!(TokenVerifyKey::from_setting(&hexf).unwrap(), ed);
    assert_eq!(TokenVerifyKey::from_setting(PUB).unwrap(), ed);
    assert_eq!(
        TokenVerifyKey::from_setting(&PUB.to_uppercase()).unwrap(),
        ed
    );
    assert!(matches!(
        TokenVerifyKey::from_setting(""),
        Err(KeyError::EmptySetting)
    ));
    assert!(matches!(
        TokenVerifyKey::from_setting("/no/such/file.pem"),
        Err(KeyError::Ed25519PublicKey(_))
    ));
    // a directory exists but cannot be read as a file
    assert!(matches!(
        TokenVerifyKey::from_setting(dir.path().to_str().unwrap()),
        Err(KeyError::Read { .. })
    ));
    // ed25519 SPKI is not accepted on the PEM path (Go: not an RSA key)
    let ed_spki = ed25519_dalek::pkcs8::EncodePublicKey::to_public_key_pem(
        &SigningKey::from_bytes(&[1u8; 32]).verifying_key(),
        ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF,
    )
    .unwrap();
    let edp = write("ed.pem", &ed_spki);
    let e = TokenVerifyKey::from_setting(&edp).unwrap_err().to_string();
    assert!(e.contains("not a valid RSA public key"), "{e}");

    // certificate via openssl when available
    if !skip_without_openssl("certificate check") {
        use rsa::pkcs1::EncodeRsaPrivateKey;
        let kp = dir.path().join("k.pem");
        std::fs::write(
            &kp,
            test_key()
                .to_pkcs1_pem(rsa::pkcs8::LineEnding::LF)
                .unwrap()
                .as_bytes(),
        )
        .unwrap();
        let cp = dir.path().join("cert.pem");
        run_ok(
            openssl()
                .args(["req", "-new", "-x509", "-days", "1", "-subj", "/CN=signer"])
                .arg("-key")
                .arg(&kp)
                .arg("-out")
                .arg(&cp),
        );
        assert_eq!(
            TokenVerifyKey::from_setting(cp.to_str().unwrap()).unwrap(),
            want
        );
    }
}

/// Builds an Org Issuer → chain issuer (client token) → server token chain.
struct Chain {
    org: SigningKey,
    signer_key: SigningKey,
    signer: ClientIdClaims,
    signer_token: String,
}

fn chain(signer_validity: Duration) -> Chain {
    let org = SigningKey::from_bytes(&[1u8; 32]);
    let signer_key = SigningKey::from_bytes(&[2u8; 32]);
    let mut signer = ClientIdClaims::new_at(
        NOW - 100,
        "provisioner",
        Some(&hex::encode(signer_key.verifying_key().as_bytes())),
        "",
        signer_validity,
    )
    .unwrap();
    signer.standard.add_org_issuer_data(&org).unwrap();
    assert!(signer.standard.issuer.starts_with("I-"));
    let signer_token = TokenSigningKey::Ed25519(org.clone()).sign(&signer).unwrap();
    Chain {
        org,
        signer_key,
        signer,
        signer_token,
    }
}

fn chain_server_token(c: &Chain, now: i64) -> (ServerClaims, String) {
    let node = Ed25519KeyPair::generate();
    let mut claims = ServerClaims::new_at(
        now,
        "node1.example.net",
        vec!["choria".into()],
        "choria",
        None,
        vec![],
        &node.public_hex(),
        PROVISIONER_ISSUER,
        Duration::from_secs(365 * 86400),
    )
    .unwrap();
    let signer = parse_client_id_token_unverified(&c.signer_token).unwrap();
    claims
        .add_chain_issuer_data(&signer, &c.signer_key)
        .unwrap();
    let token = TokenSigningKey::Ed25519(c.signer_key.clone())
        .sign(&claims)
        .unwrap();
    (claims, token)
}

#[test]
fn chain_issued_server_token_verifies() {
    let c = chain(Duration::from_secs(30 * 86400));
    let (claims, token) = chain_server_token(&c, NOW);
    let signer = &c.signer.standard;
    assert_eq!(
        claims.standard.issuer,
        format!("C-{}.{}", signer.id, signer.public_key)
    );
    assert_eq!(claims.standard.issuer_expires_at, signer.expires_at);
    // exp = min(own exp, signer exp)
    assert_eq!(claims.standard.expires_at, signer.expires_at);
    let parts: Vec<&str> = claims.standard.trust_chain_signature.split('.').collect();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[0], signer.trust_chain_signature);

    let org_pub = c.org.verifying_key();
    let v = verify_chain_issued_server_token_at(&token, &org_pub, NOW + 1).unwrap();
    assert_eq!(v, claims);
    // the generic parser does the same with the org key
    parse_server_token_at(&token, &TokenVerifyKey::Ed25519(org_pub), NOW + 1).unwrap();
    // the org issuer's token verifies as an I- issuer
    assert_eq!(
        c.signer.standard.signed_by_issuer_key(&org_pub).unwrap(),
        org_pub
    );

    // wrong org key
    let other = SigningKey::from_bytes(&[9u8; 32]).verifying_key();
    let e = verify_chain_issued_server_token_at(&token, &other, NOW).unwrap_err();
    assert_eq!(
        e.to_string(),
        "not signed by issuer: chain issuer credentials not signed by org issuer"
    );
    // after the signer expired
    let after = signer.expires_at.unwrap();
    assert!(matches!(
        verify_chain_issued_server_token_at(&token, &org_pub, after),
        Err(TokenError::Expired { .. })
    ));
    // a directly signed token is not chain issued
    let direct = TokenSigningKey::Ed25519(c.org.clone())
        .sign(&claims_without_chain())
        .unwrap();
    assert!(matches!(
        verify_chain_issued_server_token_at(&direct, &org_pub, NOW),
        Err(TokenError::NotChainIssued(_))
    ));
}

/// [`ServerClaims::new_at`] at [`NOW`] without `ou`, permissions, extra
/// subjects or issuer.
fn plain_server_claims(
    identity: &str,
    collectives: &[&str],
    public_key_hex: &str,
    validity: Duration,
) -> Result<ServerClaims, TokenError> {
    let collectives = collectives.iter().map(|c| c.to_string()).collect();
    ServerClaims::new_at(
        NOW,
        identity,
        collectives,
        "",
        None,
        vec![],
        public_key_hex,
        "",
        validity,
    )
}

fn claims_without_chain() -> ServerClaims {
    plain_server_claims("n", &["c"], PUB, Duration::from_secs(3600)).unwrap()
}

#[test]
fn chain_tampering_detected() {
    let c = chain(Duration::from_secs(30 * 86400));
    let org_pub = c.org.verifying_key();
    let (claims, _) = chain_server_token(&c, NOW);
    // The verification error for the chain-signed claims after `tamper`,
    // re-signed with the chain signer's key, at `now`.
    let tampered = |tamper: fn(&mut ServerClaims), now: i64| {
        let mut bad = claims.clone();
        tamper(&mut bad);
        let token = TokenSigningKey::Ed25519(c.signer_key.clone())
            .sign(&bad)
            .unwrap();
        verify_chain_issued_server_token_at(&token, &org_pub, now).unwrap_err()
    };

    // jti not based on iat
    let e = tampered(|c| c.standard.issued_at = Some(NOW + 1), NOW + 2);
    assert_eq!(
        e.to_string(),
        "not signed by issuer: id is not based on issued time"
    );

    // jti changed => chain signature no longer matches
    let e = tampered(|c| c.standard.id = new_ksuid_at(NOW).unwrap(), NOW);
    assert_eq!(
        e.to_string(),
        "not signed by issuer: invalid chain signature"
    );

    // issexp missing
    let e = tampered(|c| c.standard.issuer_expires_at = None, NOW);
    assert_eq!(e.to_string(), "not signed by issuer: no issuer expires set");

    // issexp passed although exp is later
    let e = tampered(
        |c| {
            c.standard.issuer_expires_at = Some(NOW + 5);
            c.standard.expires_at = Some(NOW + 100);
        },
        NOW + 10,
    );
    assert!(matches!(e, TokenError::IssuerExpiry(_)), "{e}");

    // JWS signed by some other key
    let rogue = TokenSigningKey::Ed25519(SigningKey::from_bytes(&[5u8; 32]));
    let e = verify_chain_issued_server_token_at(&rogue.sign(&claims).unwrap(), &org_pub, NOW)
        .unwrap_err();
    assert!(matches!(e, TokenError::InvalidSignature), "{e}");

    // malformed tcs / issuer
    let e = tampered(|c| c.standard.trust_chain_signature = "abc".into(), NOW);
    assert_eq!(
        e.to_string(),
        "not signed by issuer: invalid trust chain signature"
    );
    let e = tampered(|c| c.standard.issuer = "C-onlyone".into(), NOW);
    assert_eq!(
        e.to_string(),
        "not signed by issuer: invalid issuer content"
    );

    // wrong purpose
    let e = tampered(|c| c.standard.purpose = CLIENT_ID_PURPOSE.into(), NOW);
    assert!(matches!(e, TokenError::NotServerToken(_)), "{e}");
}

#[test]
fn chain_issuer_data_preconditions() {
    let c = chain(Duration::from_secs(86400));
    let mut s = claims_without_chain();
    // key mismatch
    let e = s
        .add_chain_issuer_data(&c.signer, &SigningKey::from_bytes(&[3u8; 32]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot add issuer chain data: the signing key does not match the public_key of the signing token"
    );
    // no tcs
    let mut signer = c.signer.clone();
    signer.standard.trust_chain_signature.clear();
    let e = s.add_chain_issuer_data(&signer, &c.signer_key).unwrap_err();
    assert!(e
        .to_string()
        .contains("no Trust Chain Signature claim in JWT Signing Token"));
    // no exp
    let mut signer = c.signer.clone();
    signer.standard.expires_at = None;
    assert!(s.add_chain_issuer_data(&signer, &c.signer_key).is_err());
    // exp kept when earlier than the signer's
    let mut s = claims_without_chain();
    s.add_chain_issuer_data(&c.signer, &c.signer_key).unwrap();
    assert_eq!(s.standard.expires_at, Some(NOW + 3600));
    assert_eq!(s.standard.issuer_expires_at, c.signer.standard.expires_at);
}

#[test]
fn client_id_token_parsing() {
    let c = chain(Duration::from_secs(86400));
    let parsed = parse_client_id_token_unverified(&c.signer_token).unwrap();
    assert_eq!(parsed, c.signer);
    assert_eq!(parsed.caller_id, "provisioner");
    parse_client_id_token_at(
        &c.signer_token,
        &TokenVerifyKey::Ed25519(c.org.verifying_key()),
        NOW,
    )
    .unwrap();
    let server = ed_key().sign(&claims_without_chain()).unwrap();
    assert!(matches!(
        parse_client_id_token_unverified(&server),
        Err(TokenError::NotClientToken(_))
    ));
    let perms: ClientIdClaims = serde_json::from_str(
        r#"{"callerid":"x","permissions":{"provisioner":true,"service":true},"purpose":"choria_client_id"}"#,
    )
    .unwrap();
    let p = perms.permissions.unwrap();
    assert!(p.server_provisioner && p.extended_service_lifetime && !p.org_admin);
}

#[test]
fn provisioning_unverified() {
    let t = ed_key().sign(&prov_claims()).unwrap();
    let c = parse_provisioning_token_unverified(&t).unwrap();
    assert_eq!(c.token, "s3cret");
    let st: StandardClaims = parse_unverified(&t).unwrap();
    assert!(st.is_provisioning());
    let t = ed_key().sign(&claims_without_chain()).unwrap();
    assert!(parse_provisioning_token_unverified(&t).is_err());
}

/// KSUID with a fixed payload, as the Go vector generator made them.
fn fixed_ksuid(ts: i64, p: u8) -> String {
    svix_ksuid::Ksuid::new_raw(
        u32::try_from(ts - super::super::ksuid::KSUID_EPOCH).unwrap(),
        Some(&[p; 16]),
    )
    .to_string()
}

fn seed_key(b: u8) -> SigningKey {
    SigningKey::from_bytes(&[b; 32])
}

fn go_vector_prov_claims() -> ProvisioningClaims {
    let serde_json::Value::Object(ext) = serde_json::json!({"b": 1, "a": "x<"}) else {
        unreachable!()
    };
    ProvisioningClaims {
        token: "s3cret".into(),
        secure: true,
        urls: "nats://a:4222,nats://b:4222".into(),
        prov_default: true,
        prov_reg_data: "/r".into(),
        prov_facts: "/f".into(),
        prov_nats_user: "u".into(),
        prov_nats_pass: "p<&>".into(),
        extensions: Some(ext),
        organization_unit: "choria".into(),
        proto_v2: true,
        allow_update: true,
        srv_domain: String::new(),
        standard: StandardClaims {
            purpose: PROVISIONING_PURPOSE.into(),
            issuer: DEFAULT_ISSUER.into(),
            subject: PROVISIONING_PURPOSE.into(),
            audience: vec!["aud1".into()],
            expires_at: Some(4_000_000_000),
            not_before: Some(NOW),
            issued_at: Some(NOW),
            id: fixed_ksuid(NOW, 7),
            ..Default::default()
        },
    }
}

#[test]
fn provisioning_tokens_byte_identical_to_go() {
    use super::super::go_vectors::*;
    let claims = go_vector_prov_claims();
    let ed = TokenSigningKey::Ed25519(seed_key(3));
    assert_eq!(ed.sign(&claims).unwrap(), GO_PROV_ED);
    let rsa = TokenSigningKey::from_bytes(RSA_KEY_PEM.as_bytes()).unwrap();
    assert_eq!(rsa.sign(&claims).unwrap(), GO_PROV_RSA);
    let minimal = ProvisioningClaims {
        token: "x".into(),
        urls: "nats://a:4222".into(),
        standard: StandardClaims {
            purpose: PROVISIONING_PURPOSE.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(ed.sign(&minimal).unwrap(), GO_PROV_MIN);

    // and Go's tokens parse back into the same claims
    assert_eq!(
        parse_provisioning_token_at(GO_PROV_ED, &ed.verify_key(), NOW).unwrap(),
        claims
    );
    assert_eq!(
        parse_provisioning_token_at(GO_PROV_RSA, &rsa.verify_key(), NOW).unwrap(),
        claims
    );
    let mut min = parse_provisioning_token_at(GO_PROV_MIN, &ed.verify_key(), NOW).unwrap();
    assert_eq!(min.organization_unit, "choria");
    min.organization_unit.clear();
    assert_eq!(min, minimal);
}

#[test]
fn chain_tokens_byte_identical_to_go() {
    use super::super::go_vectors::*;
    let (org, signer_key, node) = (seed_key(1), seed_key(2), seed_key(4));
    let mut signer = ClientIdClaims {
        caller_id: "provisioner".into(),
        organization_unit: "choria".into(),
        permissions: Some(ClientPermissions {
            server_provisioner: true,
            ..Default::default()
        }),
        standard: StandardClaims {
            purpose: CLIENT_ID_PURPOSE.into(),
            public_key: hex::encode(signer_key.verifying_key().as_bytes()),
            issuer: "x".into(),
            expires_at: Some(3_900_000_000),
            not_before: Some(1_690_000_000),
            issued_at: Some(1_690_000_000),
            id: fixed_ksuid(1_690_000_000, 8),
            ..Default::default()
        },
        ..Default::default()
    };
    signer.standard.add_org_issuer_data(&org).unwrap();
    let signer_token = TokenSigningKey::Ed25519(org.clone()).sign(&signer).unwrap();
    assert_eq!(signer_token, GO_SIGNER);

    let mut server = ServerClaims {
        identity: "node1.example.net".into(),
        collectives: vec!["choria".into(), "x".into()],
        permissions: Some(ServerPermissions {
            submission: true,
            service_host: true,
            ..Default::default()
        }),
        organization_unit: "choria".into(),
        additional_publish_subjects: vec!["a.>".into()],
        standard: StandardClaims {
            purpose: SERVER_PURPOSE.into(),
            public_key: hex::encode(node.verifying_key().as_bytes()),
            issuer: PROVISIONER_ISSUER.into(),
            expires_at: Some(4_000_000_000),
            not_before: Some(NOW),
            issued_at: Some(NOW),
            id: fixed_ksuid(NOW, 9),
            ..Default::default()
        },
    };
    let parsed_signer = parse_client_id_token_unverified(GO_SIGNER).unwrap();
    server
        .add_chain_issuer_data(&parsed_signer, &signer_key)
        .unwrap();
    let token = TokenSigningKey::Ed25519(signer_key).sign(&server).unwrap();
    assert_eq!(token, GO_SERVER);
    let v = verify_chain_issued_server_token_at(GO_SERVER, &org.verifying_key(), NOW).unwrap();
    assert_eq!(v, server);
    assert_eq!(v.standard.expires_at, Some(3_900_000_000));
}

proptest! {
    #[test]
    fn parse_provisioning_token_never_panics(s in ".{0,200}") {
        let vk = ed_key().verify_key();
        let _ = parse_provisioning_token_at(&s, &vk, NOW);
        let _ = parse_unverified::<ProvisioningClaims>(&s);
        let _ = parse_server_token_at(&s, &vk, NOW);
    }

    #[test]
    fn parse_structured_tokens_never_panic(
        header in prop_oneof![
            Just(r#"{"alg":"EdDSA","typ":"JWT"}"#.to_string()),
            Just(r#"{"alg":"RS256"}"#.to_string()),
            ".{0,30}",
        ],
        claims in prop_oneof![
            Just(r#"{"purpose":"choria_provisioning"}"#.to_string()),
            r#"\{"(cht|chs|exp|nbf|aud|tcs|iss|jti|extensions|purpose|sub|issexp)":(null|true|1|-1|1\.5e9|"x"|\[\]|\{\})\}"#,
            ".{0,60}",
        ],
        sig in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let t = format!("{}.{}.{}", b64(&header), b64(&claims), JWT_B64.encode(sig));
        let ed = ed_key().verify_key();
        let _ = parse_provisioning_token_at(&t, &ed, NOW);
        let _ = parse_server_token_at(&t, &ed, NOW);
        let _ = verify_chain_issued_server_token_at(&t, &SigningKey::from_bytes(&[1u8; 32]).verifying_key(), NOW);
        let _ = parse_provisioning_token_at(&t, &rsa_key().verify_key(), NOW);
    }

    #[test]
    fn chain_claims_never_panic(
        iss in r"(C-|I-)?[0-9a-f.]{0,70}",
        tcs in r"[0-9a-f.]{0,140}",
        jti in r"[0-9A-Za-z]{0,28}",
        iat in proptest::option::of(0i64..2_000_000_000),
    ) {
        let st = StandardClaims {
            issuer: iss,
            trust_chain_signature: tcs,
            id: jti,
            issued_at: iat,
            expires_at: Some(NOW + 10),
            issuer_expires_at: Some(NOW + 10),
            public_key: PUB.into(),
            purpose: SERVER_PURPOSE.into(),
            ..Default::default()
        };
        let _ = st.signed_by_issuer_key(&SigningKey::from_bytes(&[1u8; 32]).verifying_key());
    }

    #[test]
    fn from_setting_never_panics(s in ".{0,100}") {
        let _ = TokenVerifyKey::from_setting(&s);
    }

    #[test]
    fn from_pem_or_hex_never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = TokenVerifyKey::from_pem_or_hex(&b);
        let _ = TokenSigningKey::from_bytes(&b);
        let mut pem_like = b"-----BEGIN PUBLIC KEY-----\n".to_vec();
        pem_like.extend_from_slice(&b);
        let _ = TokenVerifyKey::from_pem_or_hex(&pem_like);
    }
}

#[test]
fn a_join_token_names_its_node_and_nothing_else_binds() {
    let now = chrono::Utc::now().timestamp();
    let mut c =
        ProvisioningClaims::new_at("t", "nats://b:4222", "", Duration::from_secs(60), now).unwrap();
    assert_eq!(c.bound_identity().unwrap(), None);
    c.extensions = Some(serde_json::Map::new());
    assert_eq!(
        c.bound_identity().unwrap(),
        None,
        "other extensions bind nothing"
    );
    c.bind_identity("n1.example.net");
    assert_eq!(c.bound_identity().unwrap(), Some("n1.example.net"));
    // Round trip through a signed token.
    let key = TokenSigningKey::Ed25519(ed25519_dalek::SigningKey::from_bytes(&[7; 32]));
    let jwt = key.sign(&c).unwrap();
    let back = parse_provisioning_token(&jwt, &key.verify_key()).unwrap();
    assert_eq!(back.bound_identity().unwrap(), Some("n1.example.net"));
    // A binding that is not a name refuses rather than binds nothing.
    for bad in [
        serde_json::json!(""),
        serde_json::json!(3),
        serde_json::json!(["n1"]),
    ] {
        c.extensions
            .as_mut()
            .unwrap()
            .insert(BOUND_IDENTITY.into(), bad);
        assert!(c.bound_identity().is_err());
    }
}
