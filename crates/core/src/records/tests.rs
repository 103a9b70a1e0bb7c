use super::*;

fn issued<'a>(certificate: &'a str, server_jwt: &'a str) -> Issued<'a> {
    Issued {
        identity: "n1.example.net",
        replica: "prov-a1b2c3",
        site: "lon",
        protocol: "v2",
        mode: "template",
        signer: None,
        certificate,
        server_jwt,
        config: r#"{"identity":"n1.example.net"}"#,
        provisioning_jwt_expires: Some(1_800_086_400),
        now: chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
    }
}

fn jwt(claims: serde_json::Value) -> String {
    use base64::Engine;
    let e = |v: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
    format!(
        "{}.{}.{}",
        e(br#"{"alg":"EdDSA","typ":"JWT"}"#),
        e(claims.to_string().as_bytes()),
        e(b"sig")
    )
}

#[test]
fn a_record_holds_what_was_issued_and_no_secret() {
    let token = jwt(serde_json::json!({
        "jti": "2abcKSUID", "iat": 1_800_000_000, "exp": 1_800_003_600,
        "collectives": ["choria", "lon"], "public_key": "00ff"
    }));
    let r = issued("", &token).record().unwrap();
    let j = r.server_jwt.as_ref().unwrap();
    assert_eq!(j.jti, "2abcKSUID");
    assert_eq!(j.collectives, ["choria", "lon"]);
    assert_eq!(r.expiry(), Some((1_800_000_000, 1_800_003_600)));
    assert_eq!(r.collective(), Some("choria"));
    assert_eq!(r.time, "2027-01-15T08:00:00Z");
    assert_eq!(
        r.config_sha256,
        hex::encode(Sha256::digest(br#"{"identity":"n1.example.net"}"#))
    );
    let text = serde_json::to_string(&r).unwrap();
    assert!(
        !text.contains(&token) && !text.contains("identity\\\":"),
        "{text}"
    );
}

#[test]
fn a_certificate_is_recorded_by_serial_issuer_and_validity() {
    let ca = choria_fleet::ca::CertificateAuthority::generate("records test CA").unwrap();
    let key = choria_wire::security::csr::generate_rsa_key(1024).unwrap();
    let subject = choria_wire::security::csr::CsrSubject {
        common_name: "n1.example.net".into(),
        ..Default::default()
    };
    let csr = choria_wire::security::csr::make_csr(&key, &subject).unwrap();
    let cert = ca
        .sign_csr(&csr, std::time::Duration::from_secs(3600))
        .unwrap();
    let r = issued(&cert, "").record().unwrap();
    let c = r.certificate.as_ref().unwrap();
    assert!(c.issuer.contains("records test CA"), "{c:?}");
    assert!(!c.serial.is_empty());
    assert!(c.not_after_unix > c.not_before_unix);
    assert_eq!(r.expiry(), Some((c.not_before_unix, c.not_after_unix)));
    assert!(issued("not a certificate", "").record().is_err());
}

#[test]
fn the_earlier_expiry_of_certificate_and_jwt_counts() {
    let mut r = issued("", &jwt(serde_json::json!({"iat": 10, "exp": 100})))
        .record()
        .unwrap();
    r.certificate = Some(CertificateRecord {
        serial: "01".into(),
        issuer: "CN=x".into(),
        not_before_unix: 5,
        not_after_unix: 50,
    });
    assert_eq!(r.expiry(), Some((5, 50)));
    r.certificate.as_mut().unwrap().not_after_unix = 500;
    assert_eq!(r.expiry(), Some((10, 100)));
}
