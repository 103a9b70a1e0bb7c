//! PKCS#7 evidence as the clouds write it, made here by `openssl cms` with
//! keys and certificates the tests make: AWS's `rsa2048` form (streamed,
//! so in BER with indefinite lengths, no certificate inside) and Azure's
//! attested document (its signing certificate inside, issued by an
//! intermediate the verifier is given).

// Through the verifier, as evidence reaches it: the glob brings the
// evidence module's types (and this module, as `pkcs7`) into scope.
use crate::evidence::*;
use base64::Engine as _;
use der::Decode as _;
use std::process::Command;

const NOW: i64 = 1_796_544_000; // 2026-12-06

/// Runs openssl in `dir`; `None` when there is no openssl (a failure
/// under CI, where every tool the suite needs must be there).
fn openssl(dir: &Path, args: &[&str]) -> Option<()> {
    let out = match Command::new("openssl").args(args).current_dir(dir).output() {
        Ok(o) => o,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("NOT RUN: no openssl ({e})");
            return None;
        }
        Err(e) => panic!("openssl is needed under CI: {e}"),
    };
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(())
}

/// A key and a certificate `name` for `cn`: self-signed, or issued by
/// `issuer` (a name made before).
fn cert(dir: &Path, name: &str, cn: &str, issuer: Option<&str>) -> Option<()> {
    let key = format!("{name}.key");
    openssl(dir, &["genrsa", "-out", &key, "2048"])?;
    let subject = format!("/CN={cn}");
    match issuer {
        None => openssl(
            dir,
            &[
                "req",
                "-x509",
                "-new",
                "-key",
                &key,
                "-subj",
                &subject,
                "-days",
                "3650",
                "-out",
                &format!("{name}.pem"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
            ],
        ),
        Some(ca) => {
            openssl(
                dir,
                &[
                    "req",
                    "-new",
                    "-key",
                    &key,
                    "-subj",
                    &subject,
                    "-out",
                    &format!("{name}.csr"),
                ],
            )?;
            std::fs::write(
                dir.join(format!("{name}.ext")),
                format!("subjectAltName=DNS:{cn}\n"),
            )
            .unwrap();
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.pem"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-days",
                    "3650",
                    "-extfile",
                    &format!("{name}.ext"),
                    "-out",
                    &format!("{name}.pem"),
                ],
            )
        }
    }
}

/// `content` signed by `signer` as SignedData with the content inside,
/// base64; `extra` adds openssl cms options.
fn signed(dir: &Path, signer: &str, content: &str, extra: &[&str]) -> Option<String> {
    std::fs::write(dir.join("content"), content).unwrap();
    let (pem, key) = (format!("{signer}.pem"), format!("{signer}.key"));
    let mut args = vec![
        "cms",
        "-sign",
        "-binary",
        "-nodetach",
        "-md",
        "sha256",
        "-in",
        "content",
        "-signer",
        &pem,
        "-inkey",
        &key,
        "-outform",
        "DER",
        "-out",
        "signed.der",
    ];
    args.extend_from_slice(extra);
    openssl(dir, &args)?;
    let der = std::fs::read(dir.join("signed.der")).unwrap();
    Some(base64::engine::general_purpose::STANDARD.encode(der))
}

fn keys(dir: &Path, names: &[&str]) -> Vec<RsaPublicKey> {
    let pems: String = names
        .iter()
        .map(|n| std::fs::read_to_string(dir.join(format!("{n}.pem"))).unwrap())
        .collect();
    parse::pem_keys(&pems)
        .unwrap()
        .into_iter()
        .map(|(_, k)| k)
        .collect()
}

fn verifier(aws: Vec<RsaPublicKey>, azure: Vec<RsaPublicKey>) -> Verifier {
    Verifier {
        aws,
        aws_accounts: vec![],
        gcp: vec![],
        gcp_audience: "choria:{identity}".into(),
        gcp_projects: vec![],
        azure,
        azure_subscriptions: vec![],
        max_age: None,
        node_name: None,
    }
}

const AWS_DOC: &str = "{\n  \"accountId\" : \"123456789012\",\n  \"instanceId\" : \"i-0abc123\",\n  \"region\" : \"eu-west-1\",\n  \"pendingTime\" : \"2026-12-06T08:00:00Z\",\n  \"imageId\" : \"ami-0abc\"\n}";

#[test]
fn an_aws_rsa2048_document_verifies_with_its_regions_certificate_in_ber() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (Some(()), Some(())) = (
        cert(d, "region", "ec2.eu-west-1", None),
        cert(d, "other", "other", None),
    ) else {
        return;
    };
    // As AWS writes it: streamed (indefinite lengths), no certificate inside.
    let Some(form) = signed(d, "region", AWS_DOC, &["-nocerts", "-stream"]) else {
        return;
    };
    let der = parse::base64(&form).unwrap();
    assert_eq!(
        &der[..2],
        &[0x30, 0x80],
        "openssl wrote BER with an indefinite length"
    );
    let facts = json!({FACT: {"aws": {"rsa2048": form}}});
    let e = verifier(keys(d, &["other", "region"]), vec![])
        .verify("web-1", &facts, NOW)
        .unwrap();
    assert_eq!((e.provider, e.instance_id.as_str()), ("aws", "i-0abc123"));
    assert_eq!(e.account, "123456789012");
    let e = verifier(keys(d, &["other"]), vec![])
        .verify("web-1", &facts, NOW)
        .unwrap_err();
    assert!(matches!(e, EvidenceError::Signature("aws", _)), "{e}");
}

#[test]
fn a_changed_document_inside_does_not_verify() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(()) = cert(d, "region", "ec2.eu-west-1", None) else {
        return;
    };
    let Some(form) = signed(d, "region", AWS_DOC, &["-nocerts"]) else {
        return;
    };
    let mut der = parse::base64(&form).unwrap();
    let at = der
        .windows(9)
        .position(|w| w == b"i-0abc123")
        .expect("the document is inside");
    der[at + 8] = b'4';
    let facts =
        json!({FACT: {"aws": {"rsa2048": base64::engine::general_purpose::STANDARD.encode(&der)}}});
    let e = verifier(keys(d, &["region"]), vec![])
        .verify("web-1", &facts, NOW)
        .unwrap_err();
    assert!(matches!(e, EvidenceError::Signature("aws", _)), "{e}");
    for garbage in ["bm90IHBrY3M3", "", "%%%"] {
        let facts = json!({FACT: {"aws": {"rsa2048": garbage}}});
        let e = verifier(keys(d, &["region"]), vec![])
            .verify("web-1", &facts, NOW)
            .unwrap_err();
        assert!(matches!(e, EvidenceError::Malformed(_)), "{garbage}: {e}");
    }
}

/// Azure's time format, `seconds` from now.
fn azure_time(seconds: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(seconds))
        .format("%m/%d/%y %H:%M:%S -0000")
        .to_string()
}

fn azure_doc(expires: &str) -> String {
    let created = azure_time(-600);
    format!(
        r#"{{"nonce":"1234567890","plan":{{"name":"","product":"","publisher":""}},"timeStamp":{{"createdOn":"{created}","expiresOn":"{expires}"}},"vmId":"02aab8a4-74ef-476e-8182-f6d2ba4166a6","licenseType":"","subscriptionId":"8d10da13-8125-4ba9-a717-bf7490507b3d","sku":"22_04-lts-gen2"}}"#
    )
}

#[test]
fn an_azure_attested_document_verifies_through_its_certificate_and_intermediate() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let made = (|| {
        cert(d, "intermediate", "Test Azure Issuing CA", None)?;
        cert(d, "metadata", "metadata.azure.com", Some("intermediate"))?;
        cert(d, "impostor", "metadata.evil.example", Some("intermediate"))?;
        cert(d, "rogue", "Rogue CA", None)?;
        cert(d, "stranger", "metadata.azure.com", Some("rogue"))
    })();
    if made.is_none() {
        return;
    }
    // The certificates are made now: the document is checked at the real
    // time, unlike the other tests.
    let now = chrono::Utc::now().timestamp();
    let good = azure_doc(&azure_time(6 * 3600));
    let Some(sig) = signed(d, "metadata", &good, &[]) else {
        return;
    };
    let v = verifier(vec![], keys(d, &["intermediate"]));
    let facts = |sig: &str| json!({FACT: {"azure": {"signature": sig}}});
    let e = v.verify("vm-1", &facts(&sig), now).unwrap();
    assert_eq!(e.provider, "azure");
    assert_eq!(e.instance_id, "02aab8a4-74ef-476e-8182-f6d2ba4166a6");
    assert_eq!(e.account, "8d10da13-8125-4ba9-a717-bf7490507b3d");
    assert_eq!(e.details["sku"], "22_04-lts-gen2");
    assert_eq!(e.launched_unix, None, "the document does not say");

    // Another name, the same intermediate: not Azure's metadata service.
    let sig = signed(d, "impostor", &good, &[]).unwrap();
    let e = v.verify("vm-1", &facts(&sig), now).unwrap_err();
    assert!(e.to_string().contains("metadata.azure.com"), "{e}");
    // The right name from another CA.
    let sig = signed(d, "stranger", &good, &[]).unwrap();
    let e = v.verify("vm-1", &facts(&sig), now).unwrap_err();
    assert!(matches!(e, EvidenceError::Signature("azure", _)), "{e}");
    // Expired.
    let sig = signed(d, "metadata", &azure_doc(&azure_time(-60)), &[]).unwrap();
    let e = v.verify("vm-1", &facts(&sig), now).unwrap_err();
    assert!(e.to_string().contains("expired"), "{e}");
    // Its signing certificate out of date (made for ten years): said as
    // such, not as a forgery.
    let sig = signed(d, "metadata", &good, &[]).unwrap();
    let e = v
        .verify("vm-1", &facts(&sig), now + 11 * 365 * 86_400)
        .unwrap_err();
    assert!(matches!(e, EvidenceError::Signature("azure", _)), "{e}");
    assert!(
        e.to_string()
            .contains("the signing certificate inside is valid from"),
        "{e}"
    );
    // A subscription not listed.
    let sig = signed(d, "metadata", &good, &[]).unwrap();
    let mut listed = verifier(vec![], keys(d, &["intermediate"]));
    listed.azure_subscriptions = vec!["00000000-0000-0000-0000-000000000000".into()];
    let e = listed.verify("vm-1", &facts(&sig), now).unwrap_err();
    assert!(e.to_string().contains("azure_subscriptions"), "{e}");
    // Listed in upper case: the same subscription.
    let mut upper = verifier(vec![], keys(d, &["intermediate"]));
    upper.azure_subscriptions = vec!["8D10DA13-8125-4BA9-A717-BF7490507B3D".into()];
    upper.verify("vm-1", &facts(&sig), now).unwrap();
    // Signed with an intermediate's own key, no metadata.azure.com
    // certificate inside: not the metadata service.
    let sig = signed(d, "intermediate", &good, &["-nocerts"]).unwrap();
    let e = v.verify("vm-1", &facts(&sig), now).unwrap_err();
    assert!(e.to_string().contains("metadata.azure.com"), "{e}");
    // Not configured.
    let e = verifier(vec![], vec![])
        .verify("vm-1", &facts(&sig), now)
        .unwrap_err();
    assert!(matches!(e, EvidenceError::Unconfigured("azure")), "{e}");
}

/// The attested document Microsoft publishes as its example response
/// (learn.microsoft.com, "Azure Instance Metadata Service", Attested data):
/// a real PKCS#7 from 2018, signed by a self-signed test certificate for
/// `testsubdomain.metadata.azure.com` whose own signature is MD5 with RSA.
const AZURE_PUBLISHED_SAMPLE: &str = "MIIEEgYJKoZIhvcNAQcCoIIEAzCCA/8CAQExDzANBgkqhkiG9w0BAQsFADCBugYJKoZIhvcNAQcBoIGsBIGpeyJub25jZSI6IjEyMzQ1NjY3NjYiLCJwbGFuIjp7Im5hbWUiOiIiLCJwcm9kdWN0IjoiIiwicHVibGlzaGVyIjoiIn0sInRpbWVTdGFtcCI6eyJjcmVhdGVkT24iOiIxMS8yMC8xOCAyMjowNzozOSAtMDAwMCIsImV4cGlyZXNPbiI6IjExLzIwLzE4IDIyOjA4OjI0IC0wMDAwIn0sInZtSWQiOiIifaCCAj8wggI7MIIBpKADAgECAhBnxW5Kh8dslEBA0E2mIBJ0MA0GCSqGSIb3DQEBBAUAMCsxKTAnBgNVBAMTIHRlc3RzdWJkb21haW4ubWV0YWRhdGEuYXp1cmUuY29tMB4XDTE4MTEyMDIxNTc1N1oXDTE4MTIyMDIxNTc1NlowKzEpMCcGA1UEAxMgdGVzdHN1YmRvbWFpbi5tZXRhZGF0YS5henVyZS5jb20wgZ8wDQYJKoZIhvcNAQEBBQADgY0AMIGJAoGBAML/tBo86ENWPzmXZ0kPkX5dY5QZ150mA8lommszE71x2sCLonzv4/UWk4H+jMMWRRwIea2CuQ5RhdWAHvKq6if4okKNt66fxm+YTVz9z0CTfCLmLT+nsdfOAsG1xZppEapC0Cd9vD6NCKyE8aYI1pliaeOnFjG0WvMY04uWz2MdAgMBAAGjYDBeMFwGA1UdAQRVMFOAENnYkHLa04Ut4Mpt7TkJFfyhLTArMSkwJwYDVQQDEyB0ZXN0c3ViZG9tYWluLm1ldGFkYXRhLmF6dXJlLmNvbYIQZ8VuSofHbJRAQNBNpiASdDANBgkqhkiG9w0BAQQFAAOBgQCLSM6aX5Bs1KHCJp4VQtxZPzXF71rVKCocHy3N9PTJQ9Fpnd+bYw2vSpQHg/AiG82WuDFpPReJvr7Pa938mZqW9HUOGjQKK2FYDTg6fXD8pkPdyghlX5boGWAMMrf7bFkup+lsT+n2tRw2wbNknO1tQ0wICtqy2VqzWwLi45RBwTGB6DCB5QIBATA/MCsxKTAnBgNVBAMTIHRlc3RzdWJkb21haW4ubWV0YWRhdGEuYXp1cmUuY29tAhBnxW5Kh8dslEBA0E2mIBJ0MA0GCSqGSIb3DQEBCwUAMA0GCSqGSIb3DQEBAQUABIGAld1BM/yYIqqv8SDE4kjQo3Ul/IKAVR8ETKcve5BAdGSNkTUooUGVniTXeuvDj5NkmazOaKZp9fEtByqqPOyw/nlXaZgOO44HDGiPUJ90xVYmfeK6p9RpJBu6kiKhnnYTelUk5u75phe5ZbMZfBhuPhXmYAdjc7Nmw97nx8NnprQ=";

/// Our reading of a real Azure document: its PKCS#7 parses, the signature
/// inside verifies with the certificate inside (over the content, without
/// signed attributes: a form openssl does not write by default), the
/// content's times parse; and the document is still refused, for the two
/// reasons it must be: its certificate is signed with MD5, and it names
/// no subscription (nor a vmId).
#[test]
fn microsofts_published_attested_document_reads_as_azure_writes_it() {
    let der = parse::base64(AZURE_PUBLISHED_SAMPLE).unwrap();
    let info = cms::content_info::ContentInfo::from_der(&der).unwrap();
    let sd: cms::signed_data::SignedData = info.content.decode_as().unwrap();
    let cert = match sd.certificates.as_ref().unwrap().0.iter().next().unwrap() {
        cms::cert::CertificateChoices::Certificate(c) => c.clone(),
        other => panic!("{other:?}"),
    };
    let spki = der::Encode::to_der(&cert.tbs_certificate.subject_public_key_info).unwrap();
    let key: RsaPublicKey = rsa::pkcs8::DecodePublicKey::from_public_key_der(&spki).unwrap();
    // 2018-11-20 22:08:00 UTC: within the document's and the certificate's
    // lifetimes. The signature over the content verified (a failing one
    // would say so first); the certificate's own signature is refused.
    let at = 1_542_751_680;
    let e = pkcs7::verify(&der, &[key], at).unwrap_err();
    assert!(
        e.to_string().contains("1.2.840.113549.1.1.4"),
        "the MD5 certificate, after the signature verified: {e}"
    );
    let content = sd
        .encap_content_info
        .econtent
        .unwrap()
        .decode_as::<der::asn1::OctetString>()
        .unwrap();
    let e = parse::azure_document(content.as_bytes(), at).unwrap_err();
    // The times are read first: a format we did not expect would be the
    // error here. This 2018 document predates subscriptionId (2019).
    assert!(
        e.contains("subscriptionId is missing"),
        "its times parse; it has no subscription: {e}"
    );
}
