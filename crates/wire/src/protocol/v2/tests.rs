use super::*;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;

#[test]
fn reply_hash_matches_the_protocol_doc_vector() {
    let reply = r#"{"protocol":"io.choria.protocol.v2.reply","message":"eyJhY3Rpb24iOiJqd3QiLCJzdGF0dXNjb2RlIjowLCJzdGF0dXNtc2ciOiJPSyIsImRhdGEiOnsiand0IjoiZXlKaGJHY2lPaS4uLiIsImVjZGhfcHVibGljIjoiYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMSJ9fQ==","request":"2HbxMw3qYVbQ5g3lF3w0m2E9k1A","sender":"node1.example.net","agent":"choria_provision","time":1718000000124456789}"#;
    assert_eq!(
        reply_hash(reply.as_bytes()),
        "5Pc0knftN/56emknxuKJ8wxAp0WqTl5A6wLZSMJOCH4="
    );
    let body = STANDARD
        .decode("eyJhY3Rpb24iOiJqd3QiLCJzdGF0dXNjb2RlIjowLCJzdGF0dXNtc2ciOiJPSyIsImRhdGEiOnsiand0IjoiZXlKaGJHY2lPaS4uLiIsImVjZGhfcHVibGljIjoiYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMWExYTFhMSJ9fQ==")
        .unwrap();
    let spec = ReplySpec {
        request_id: "2HbxMw3qYVbQ5g3lF3w0m2E9k1A",
        sender: "node1.example.net",
        agent: "choria_provision",
        time_nanos: 1718000000124456789,
        body: &body,
        connected_url: "nats://127.0.0.1:4222",
    };
    let bytes = encode_reply(&spec).unwrap();
    let transport: Transport = serde_json::from_slice(&bytes).unwrap();
    let secure: SecureReplyDoc = serde_json::from_slice(&transport.data).unwrap();
    assert_eq!(std::str::from_utf8(&secure.reply).unwrap(), reply);
    assert_eq!(secure.hash, "5Pc0knftN/56emknxuKJ8wxAp0WqTl5A6wLZSMJOCH4=");
    let decoded = decode_reply(&bytes).unwrap();
    assert_eq!(decoded.message, body);
    assert_eq!(decoded.time_nanos, 1718000000124456789);
}

#[test]
fn signed_request_round_trips_and_the_signature_verifies() {
    use ed25519_dalek::Verifier;
    let seed = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
    let signer = RequestSigner::V2 {
        seed: Box::new(seed.clone()),
        jwt: "caller.jwt.token".into(),
    };
    let filter = Filter::with_agent("choria_provision");
    let payload = br#"{"agent":"choria_provision","action":"jwt","data":{"token":"s3cret"}}"#;
    let spec = RequestSpec {
        connected_url: "nats://127.0.0.1:4222",
        ..provision_spec(&filter, payload)
    };
    let bytes = encode_request(&spec, &signer).unwrap();
    let transport: Transport = serde_json::from_slice(&bytes).unwrap();
    let secure: SecureRequest = serde_json::from_slice(&transport.data).unwrap();
    let sig = ed25519_dalek::Signature::from_slice(&secure.signature).unwrap();
    seed.verifying_key().verify(&secure.request, &sig).unwrap();
    let inner = std::str::from_utf8(&secure.request).unwrap();
    assert!(inner.starts_with(r#"{"protocol":"io.choria.protocol.v2.request","message":"eyJhZ2VudCI6ImNob3JpYV9wcm92aXNpb24iLCJhY3Rpb24iOiJqd3QiLCJkYXRhIjp7InRva2VuIjoiczNjcmV0In19","id":"2HbxMw3qYVbQ5g3lF3w0m2E9k1A","sender":"provisioner.example.net","caller":"provisioner_signer","collective":"provisioning","agent":"choria_provision","ttl":60,"time":1718000000123456789,"filter":{"#));

    let req = decode_request(&bytes).unwrap();
    assert_eq!(req.version, Version::V2);
    assert_eq!(req.message, payload);
    assert_eq!(req.payload(), payload);
    assert_eq!(req.caller_jwt, "caller.jwt.token");
    assert_eq!(req.reply_to, "provisioning.reply.x.y");
}

/// A valid signed v2 request whose inner request JSON `edit` changed
/// (the signature is checked later, by the security layer, not here).
fn with_inner(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    with_secure(|secure| {
        let mut inner: serde_json::Value = serde_json::from_slice(
            &STANDARD
                .decode(secure["request"].as_str().unwrap())
                .unwrap(),
        )
        .unwrap();
        edit(&mut inner);
        secure["request"] = STANDARD.encode(inner.to_string()).into();
    })
}

/// A provisioner's v2 request to a node with `payload` (no hop).
fn provision_spec<'a>(filter: &'a Filter, payload: &'a [u8]) -> RequestSpec<'a> {
    RequestSpec {
        id: "2HbxMw3qYVbQ5g3lF3w0m2E9k1A",
        sender: "provisioner.example.net",
        caller: "provisioner_signer",
        collective: "provisioning",
        agent: "choria_provision",
        ttl: 60,
        time_nanos: 1718000000123456789,
        filter,
        payload,
        reply_to: "provisioning.reply.x.y",
        connected_url: "",
    }
}

/// A valid signed v2 request whose secure-request layer `edit` changed.
fn with_secure(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let filter = Filter::with_agent("choria_provision");
    let spec = provision_spec(
        &filter,
        br#"{"agent":"choria_provision","action":"inventory","data":{}}"#,
    );
    let signer = RequestSigner::V2 {
        seed: Box::new(ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])),
        jwt: "caller.jwt.token".into(),
    };
    let bytes = encode_request(&spec, &signer).unwrap();
    let mut transport: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let mut secure: serde_json::Value = serde_json::from_slice(
        &STANDARD
            .decode(transport["data"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    edit(&mut secure);
    transport["data"] = STANDARD.encode(secure.to_string()).into();
    transport.to_string().into_bytes()
}

fn schema_field(bytes: &[u8]) -> &'static str {
    match decode_request(bytes) {
        Err(ProtocolError::Schema { field, .. }) => field,
        other => panic!("expected a schema error, got {other:?}"),
    }
}

/// go-choria v0.30.2's `protocol/v2/request.json`: every field but the
/// filter is required, strings have a minimum length of 1, `ttl` and
/// `time` a minimum of 1.
#[test]
fn every_required_request_field_is_required_and_non_empty() {
    assert!(
        decode_request(&with_inner(|_| {})).is_ok(),
        "the unedited request"
    );
    for field in [
        "protocol",
        "message",
        "id",
        "sender",
        "caller",
        "collective",
        "agent",
        "ttl",
        "time",
    ] {
        let bytes = with_inner(|v| {
            v.as_object_mut().unwrap().remove(field);
        });
        assert_eq!(schema_field(&bytes), field, "without {field}");
    }
    for field in ["message", "id", "sender", "caller", "collective", "agent"] {
        let bytes = with_inner(|v| v[field] = "".into());
        assert_eq!(schema_field(&bytes), field, "empty {field}");
    }
}

#[test]
fn ttl_and_time_below_one_are_refused_and_one_is_accepted() {
    for bad in [0, -1, i64::MIN] {
        assert_eq!(
            schema_field(&with_inner(|v| v["ttl"] = bad.into())),
            "ttl",
            "ttl {bad}"
        );
        assert_eq!(
            schema_field(&with_inner(|v| v["time"] = bad.into())),
            "time",
            "time {bad}"
        );
    }
    let req = decode_request(&with_inner(|v| {
        v["ttl"] = 1.into();
        v["time"] = 1.into();
    }))
    .unwrap();
    assert_eq!((req.ttl, req.time_nanos), (1, 1));
}

/// The filter may be left out (Go omits a nil one); present, it must be
/// an object with the four arrays, `agent` an array when there, and
/// facts well formed.
#[test]
fn filter_rules_name_the_filter() {
    let req = decode_request(&with_inner(|v| {
        v.as_object_mut().unwrap().remove("filter");
    }))
    .unwrap();
    assert_eq!(req.filter, Filter::default());
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["filter"] = serde_json::Value::Null),
            "filter",
        ),
        (
            Box::new(|v| v["filter"] = "choria_provision".into()),
            "filter",
        ),
        (Box::new(|v| v["filter"] = serde_json::json!([])), "filter"),
        (
            Box::new(|v| v["filter"]["identity"] = serde_json::Value::Null),
            "filter",
        ),
        (Box::new(|v| v["filter"]["cf_class"] = "a".into()), "filter"),
        (
            Box::new(|v| v["filter"]["compound"] = serde_json::json!({})),
            "filter",
        ),
        (
            Box::new(|v| v["filter"]["agent"] = "choria_provision".into()),
            "filter",
        ),
        (
            Box::new(|v| v["filter"]["identity"] = serde_json::json!([1])),
            "filter",
        ),
    ];
    for key in ["fact", "cf_class", "identity", "compound"] {
        let bytes = with_inner(|v| {
            v["filter"].as_object_mut().unwrap().remove(key);
        });
        assert_eq!(schema_field(&bytes), "filter", "filter without {key}");
    }
    for (i, (edit, field)) in cases.into_iter().enumerate() {
        assert_eq!(schema_field(&with_inner(edit)), field, "case {i}");
    }
    let fact = |f: &str, op: &str, value: &str| {
        let fact = serde_json::json!([{"fact": f, "operator": op, "value": value}]);
        with_inner(move |v| v["filter"]["fact"] = fact)
    };
    assert!(decode_request(&fact("country", "==", "mt")).is_ok());
    for (f, op, value) in [
        ("", "==", "mt"),
        ("country", "===", "mt"),
        ("country", "==", ""),
    ] {
        assert_eq!(
            schema_field(&fact(f, op, value)),
            "filter.fact",
            "{f} {op} {value}"
        );
    }
}

#[test]
fn wrong_inner_protocol_is_refused() {
    let bytes = with_inner(|v| v["protocol"] = "io.choria.protocol.v1.request".into());
    assert!(
        matches!(
            decode_request(&bytes),
            Err(ProtocolError::UnknownProtocol {
                layer: Layer::Request,
                ..
            })
        ),
        "{:?}",
        decode_request(&bytes)
    );
}

/// `secure_request.json`: request, signature and caller have a minimum
/// length of 1.
#[test]
fn secure_request_fields_must_not_be_empty() {
    for field in ["request", "signature", "caller"] {
        let bytes = with_secure(|s| s[field] = "".into());
        assert_eq!(schema_field(&bytes), field, "empty {field}");
    }
}

#[test]
fn secure_request_without_caller_jwt_fails_the_schema() {
    let secure = serde_json::json!({
        "protocol": SECURE_REQUEST_PROTOCOL,
        "request": STANDARD.encode("{}"),
        "signature": STANDARD.encode("insecure"),
        "caller": ""
    });
    let transport = serde_json::json!({"protocol": TRANSPORT_PROTOCOL, "data": STANDARD.encode(secure.to_string())});
    let err = decode_request(transport.to_string().as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            ProtocolError::Schema {
                field: "caller",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn v1_signer_cannot_build_v2() {
    let filter = Filter::default();
    let spec = RequestSpec {
        id: "x",
        sender: "s",
        caller: "c",
        collective: "provisioning",
        agent: "rpcutil",
        ttl: 60,
        time_nanos: 1,
        filter: &filter,
        payload: b"{}",
        reply_to: "r",
        connected_url: "",
    };
    assert!(matches!(
        encode_request(&spec, &RequestSigner::V1Insecure),
        Err(ProtocolError::VersionMismatch { .. })
    ));
}
