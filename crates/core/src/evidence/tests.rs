use super::*;
use base64::Engine as _;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::EncodePublicKey as _;
use rsa::signature::{SignatureEncoding as _, Signer as _};
use rsa::RsaPrivateKey;
use sha2::Sha256;

const NOW: i64 = 1_796_544_000;

fn key(bits: usize) -> RsaPrivateKey {
    RsaPrivateKey::new(&mut rand::thread_rng(), bits).expect("an RSA key")
}

fn sign(k: &RsaPrivateKey, msg: &[u8]) -> Vec<u8> {
    SigningKey::<Sha256>::new(k.clone()).sign(msg).to_vec()
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn b64url(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn verifier(aws: &[&RsaPrivateKey], gcp: &[(&str, &RsaPrivateKey)]) -> Verifier {
    Verifier {
        aws: aws.iter().map(|k| k.to_public_key()).collect(),
        aws_accounts: vec![],
        gcp: gcp
            .iter()
            .map(|(kid, k)| (kid.to_string(), k.to_public_key()))
            .collect(),
        gcp_audience: "choria:{identity}".into(),
        gcp_projects: vec![],
        azure: vec![],
        azure_subscriptions: vec![],
        max_age: None,
        node_name: None,
    }
}

fn document(account: &str, instance: &str) -> String {
    // As AWS serves it: pretty-printed, no trailing newline.
    format!(
        "{{\n  \"accountId\" : \"{account}\",\n  \"architecture\" : \"x86_64\",\n  \"availabilityZone\" : \"eu-west-1a\",\n  \
         \"imageId\" : \"ami-0abc\",\n  \"instanceId\" : \"{instance}\",\n  \"instanceType\" : \"t3.micro\",\n  \
         \"pendingTime\" : \"2026-12-06T08:00:00Z\",\n  \"privateIp\" : \"10.0.0.7\",\n  \"region\" : \"eu-west-1\",\n  \"version\" : \"2017-09-30\"\n}}"
    )
}

fn aws_facts(doc: &str, sig: &[u8]) -> Value {
    json!({"os": "linux", FACT: {"aws": {"document": doc, "signature": b64(sig)}}})
}

fn gcp_token(k: &RsaPrivateKey, kid: &str, claims: Value) -> String {
    let header = b64url(
        json!({"alg": "RS256", "kid": kid, "typ": "JWT"})
            .to_string()
            .as_bytes(),
    );
    let body = b64url(claims.to_string().as_bytes());
    let input = format!("{header}.{body}");
    format!("{input}.{}", b64url(&sign(k, input.as_bytes())))
}

fn gcp_claims(aud: &str) -> Value {
    json!({
        "iss": "https://accounts.google.com", "aud": aud, "azp": "1", "sub": "1",
        "iat": NOW - 10, "exp": NOW + 3590,
        "google": {"compute_engine": {
            "instance_id": "4567890123", "instance_name": "web-1", "project_id": "fleet-prod",
            "project_number": 12345, "zone": "europe-west1-b", "instance_creation_timestamp": NOW - 300
        }}
    })
}

#[test]
fn an_aws_document_signed_by_a_configured_region_names_its_instance() {
    let (region, other) = (key(1024), key(1024));
    let doc = document("123456789012", "i-0abc123");
    let v = verifier(&[&other, &region], &[]);
    let e = v
        .verify(
            "n1.example.net",
            &aws_facts(&doc, &sign(&region, doc.as_bytes())),
            NOW,
        )
        .unwrap();
    assert_eq!(e.instance(), "aws.123456789012.i-0abc123");
    assert_eq!(e.region, "eu-west-1");
    assert_eq!(
        e.launched_unix,
        Some(NOW),
        "pendingTime 2026-12-06T08:00:00Z"
    );
    assert_eq!(e.input()["details"]["instance_type"], "t3.micro");
}

#[test]
fn an_aws_document_edited_or_signed_by_anyone_else_is_refused() {
    let (region, stranger) = (key(1024), key(1024));
    let doc = document("123456789012", "i-0abc123");
    let v = verifier(&[&region], &[]);
    let theirs = v.verify(
        "n1",
        &aws_facts(&doc, &sign(&stranger, doc.as_bytes())),
        NOW,
    );
    assert!(
        matches!(theirs, Err(EvidenceError::Signature("aws", _))),
        "{theirs:?}"
    );
    let edited = doc.replace("i-0abc123", "i-0fff999");
    let e = v.verify(
        "n1",
        &aws_facts(&edited, &sign(&region, doc.as_bytes())),
        NOW,
    );
    assert!(
        matches!(e, Err(EvidenceError::Signature("aws", _))),
        "{e:?}"
    );
}

#[test]
fn missing_malformed_and_unconfigured_evidence_is_refused_by_name() {
    let region = key(1024);
    let v = verifier(&[&region], &[]);
    assert!(matches!(
        v.verify("n1", &json!({"os": "linux"}), NOW),
        Err(EvidenceError::Missing)
    ));
    let both = json!({FACT: {"aws": {}, "gcp": {}}});
    assert!(matches!(
        v.verify("n1", &both, NOW),
        Err(EvidenceError::Malformed(_))
    ));
    let number = json!({FACT: {"aws": {"document": 1, "signature": "x"}}});
    assert!(matches!(
        v.verify("n1", &number, NOW),
        Err(EvidenceError::Malformed(_))
    ));
    let gcp = json!({FACT: {"gcp": {"token": "a.b.c"}}});
    assert!(matches!(
        v.verify("n1", &gcp, NOW),
        Err(EvidenceError::Unconfigured("gcp"))
    ));
    // Signed, but naming an instance that could not be a key.
    let doc = document("123456789012", "i-0abc.>*");
    let e = v.verify("n1", &aws_facts(&doc, &sign(&region, doc.as_bytes())), NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Malformed(m)) if m.contains("instanceId")),
        "{e:?}"
    );
}

#[test]
fn accounts_and_max_age_bound_what_aws_evidence_admits() {
    let region = key(1024);
    let doc = document("123456789012", "i-0abc123");
    let facts = aws_facts(&doc, &sign(&region, doc.as_bytes()));
    let mut v = verifier(&[&region], &[]);
    v.aws_accounts = vec!["999999999999".into()];
    let e = v.verify("n1", &facts, NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("123456789012")),
        "{e:?}"
    );
    v.aws_accounts = vec!["123456789012".into()];
    v.max_age = Some(Duration::from_secs(600));
    assert!(v.verify("n1", &facts, NOW + 600).is_ok());
    let e = v.verify("n1", &facts, NOW + 601);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("max_age")),
        "{e:?}"
    );
}

#[test]
fn a_gcp_token_is_good_for_the_name_it_was_made_for_only() {
    let google = key(2048);
    let v = verifier(&[], &[("k1", &google)]);
    let token = gcp_token(&google, "k1", gcp_claims("choria:web-1.example.net"));
    let facts = json!({FACT: {"gcp": {"token": token}}});
    let e = v.verify("web-1.example.net", &facts, NOW).unwrap();
    assert_eq!(e.instance(), "gcp.fleet-prod.4567890123");
    assert_eq!(e.launched_unix, Some(NOW - 300));
    let e = v.verify("db-1.example.net", &facts, NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("another name")),
        "{e:?}"
    );
    let e = v.verify("web-1.example.net", &facts, NOW + 3600);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("expired")),
        "{e:?}"
    );
}

#[test]
fn a_gcp_token_from_another_key_or_issuer_is_refused() {
    let (google, stranger) = (key(2048), key(2048));
    let v = verifier(&[], &[("k1", &google)]);
    let forged = gcp_token(&stranger, "k1", gcp_claims("choria:n1"));
    let e = v.verify("n1", &json!({FACT: {"gcp": {"token": forged}}}), NOW);
    assert!(
        matches!(e, Err(EvidenceError::Signature("gcp", _))),
        "{e:?}"
    );
    let unknown_kid = gcp_token(&google, "k9", gcp_claims("choria:n1"));
    let e = v.verify("n1", &json!({FACT: {"gcp": {"token": unknown_kid}}}), NOW);
    assert!(matches!(e, Err(EvidenceError::Malformed(_))), "{e:?}");
    let mut claims = gcp_claims("choria:n1");
    claims["iss"] = json!("https://evil.example");
    let other_issuer = gcp_token(&google, "k1", claims);
    let e = v.verify("n1", &json!({FACT: {"gcp": {"token": other_issuer}}}), NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("issuer")),
        "{e:?}"
    );
}

#[test]
fn certificates_load_from_a_pem_bundle_and_googles_json() {
    let (a, b) = (key(1024), key(1024));
    let pem = |k: &RsaPrivateKey| {
        k.to_public_key()
            .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
            .unwrap()
    };
    let bundle = format!("{}{}", pem(&a), pem(&b));
    assert_eq!(parse::pem_keys(&bundle).unwrap().len(), 2);
    let json = json!({"k1": pem(&a), "k2": pem(&b)}).to_string();
    let keys = parse::google_keys(&json).unwrap();
    assert_eq!(
        keys.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["k1", "k2"]
    );
    assert!(parse::pem_keys("no pem here").is_err());
    assert!(parse::google_keys("{\"k1\": \"not pem\"}").is_err());
}

#[test]
fn node_name_makes_the_identity_name_its_instance() {
    let region = key(1024);
    let doc = document("123456789012", "i-0abc123");
    let facts = aws_facts(&doc, &sign(&region, doc.as_bytes()));
    let mut v = verifier(&[&region], &[]);
    v.node_name = Some(NodeName::InstanceId);
    assert!(v.verify("i-0abc123.web.example.net", &facts, NOW).is_ok());
    let e = v.verify("web-1.example.net", &facts, NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("does not name")),
        "{e:?}"
    );
    let google = key(2048);
    let mut v = verifier(&[], &[("k1", &google)]);
    v.node_name = Some(NodeName::InstanceName);
    let token = |id: &str| gcp_token(&google, "k1", gcp_claims(&format!("choria:{id}")));
    let ok = json!({FACT: {"gcp": {"token": token("web-1.example.net")}}});
    assert!(
        v.verify("web-1.example.net", &ok, NOW).is_ok(),
        "instance_name web-1"
    );
    let other = json!({FACT: {"gcp": {"token": token("db-1.example.net")}}});
    let e = v.verify("db-1.example.net", &other, NOW);
    assert!(
        matches!(&e, Err(EvidenceError::Refused(m)) if m.contains("does not name")),
        "{e:?}"
    );
}
