use super::*;
use choria_wire::filter::Filter;

fn shared(key_pool: RsaKeyPool, presigned_csrs: Vec<String>) -> Arc<FleetShared> {
    Arc::new(FleetShared {
        protocol: Version::V1,
        server_version: "0.30.2".into(),
        token: "s3cret".into(),
        provisioning_jwt: Some("a.b.c".into()),
        upgradable: false,
        key_pool: Arc::new(key_pool),
        presigned_csrs,
        config_root: "/etc/choria-fleet".into(),
        facts: serde_json::json!({}),
        evidence: None,
        journal_config_keys: vec!["identity".into()],
    })
}

fn node() -> Node {
    let key = csr::generate_rsa_key(1024).unwrap();
    let shared = shared(RsaKeyPool::from_keys(vec![key]).unwrap(), Vec::new());
    Node::new("n1.example.net".into(), 0, None, shared)
}

fn request(agent: &str, payload: &str, sender: &str) -> Request {
    Request {
        version: Version::V1,
        id: choria_wire::ids::v1_request_id(),
        sender: sender.into(),
        caller: format!("choria={sender}"),
        collective: "provisioning".into(),
        agent: agent.into(),
        ttl: 60,
        time_nanos: choria_wire::client::now_nanos(),
        filter: Filter::with_agent(agent),
        message: payload.as_bytes().to_vec(),
        reply_to: "provisioning.reply.x.y".into(),
        transport_sender: sender.into(),
        caller_jwt: String::new(),
    }
}

fn body(h: &Handled) -> serde_json::Value {
    match &h.response {
        Response::Reply(b) => serde_json::from_slice(b).unwrap(),
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn gencsr_ignores_st_like_go_choria() {
    let mut n = node();
    let payload = r#"{"agent":"choria_provision","action":"gencsr","data":{"token":"s3cret","cn":"n1.example.net","O":"Acme","ST":"Somewhere"}}"#;
    let h = n.handle(
        &request("choria_provision", payload, "p"),
        choria_wire::client::now_nanos(),
    );
    let b = body(&h);
    let pem_text = b["data"]["csr"].as_str().unwrap();
    let der = pem::parse(pem_text).unwrap().into_contents();
    // stateOrProvinceName is OID 2.5.4.8 (06 03 55 04 08); organizationName 2.5.4.10 is present.
    assert!(
        !der.windows(5).any(|w| w == [0x06, 0x03, 0x55, 0x04, 0x08]),
        "ST must not be in the subject"
    );
    assert!(
        der.windows(5).any(|w| w == [0x06, 0x03, 0x55, 0x04, 0x0a]),
        "O is in the subject"
    );
}

#[test]
fn lock_is_per_sender_and_caller_and_restart_is_not_locked() {
    let mut n = node();
    let now = choria_wire::client::now_nanos();
    let jwt = r#"{"agent":"choria_provision","action":"jwt","data":{"token":"s3cret"}}"#;
    assert_eq!(
        body(&n.handle(&request("choria_provision", jwt, "a"), now))["statuscode"],
        0
    );
    assert_eq!(
        body(&n.handle(&request("choria_provision", jwt, "a"), now))["statuscode"],
        0
    );
    let refused = body(&n.handle(&request("choria_provision", jwt, "b"), now));
    assert_eq!(refused["statusmsg"], "Could not obtain provisioning lock");
    let restart =
        r#"{"agent":"choria_provision","action":"restart","data":{"token":"s3cret","splay":1}}"#;
    let h = n.handle(&request("choria_provision", restart, "b"), now);
    assert_eq!(
        body(&h)["data"]["message"],
        "Restarting Choria Server after 2s"
    );
    assert_eq!(h.effects.events, [EventType::Shutdown]);
    assert_eq!(h.effects.restart_after, Some(Duration::from_secs(2)));
    // One restart per process: a second request replies but schedules nothing.
    let again = n.handle(&request("choria_provision", restart, "b"), now);
    assert_eq!(again.effects.restart_after, None);
    n.complete_restart();
    assert_eq!(
        n.mode,
        Mode::Provisioning,
        "no provision=false written: back into provisioning"
    );
    // The re-exec clears the lock.
    assert_eq!(
        body(&n.handle(&request("choria_provision", jwt, "b"), now))["statuscode"],
        0
    );
}

#[test]
fn configure_with_provision_true_blocks_restart() {
    let mut n = node();
    let now = choria_wire::client::now_nanos();
    let cfg = r#"{"agent":"choria_provision","action":"configure","data":{"token":"s3cret","config":"{\"plugin.choria.server.provision\":\"true\"}"}}"#;
    let h = n.handle(&request("choria_provision", cfg, "a"), now);
    assert_eq!(
        body(&h)["data"]["message"],
        "Wrote 2 lines to /etc/choria-fleet/n1.example.net/server.conf"
    );
    assert_eq!(h.effects.events, [EventType::Provisioned]);
    let restart = r#"{"agent":"choria_provision","action":"restart","data":{"token":"s3cret"}}"#;
    let b = body(&n.handle(&request("choria_provision", restart, "a"), now));
    assert_eq!(
        b["statusmsg"],
        "Configuration /etc/choria-fleet/n1.example.net/server.conf enables provisioning, restart cannot continue"
    );
}

#[test]
fn the_final_state_records_only_the_values_of_the_named_keys() {
    let mut n = node();
    let now = choria_wire::client::now_nanos();
    let cfg = r#"{"agent":"choria_provision","action":"configure","data":{"token":"s3cret","config":"{\"identity\":\"n1.example.net\",\"plugin.choria.middleware_hosts\":\"nats://b:4222\",\"password\":\"pw\"}"}}"#;
    n.handle(&request("choria_provision", cfg, "a"), now);
    let f = n.final_state();
    assert_eq!(f.config_keys.len(), 3, "{:?}", f.config_keys);
    assert_eq!(
        f.config_values,
        [("identity".to_string(), "n1.example.net".to_string())].into()
    );
}

#[test]
fn unparsable_rpc_body_is_invalid_data_with_empty_action() {
    let mut n = node();
    let h = n.handle(
        &request("rpcutil", "{not json", "a"),
        choria_wire::client::now_nanos(),
    );
    let b = body(&h);
    assert_eq!(b["statuscode"], 4);
    assert_eq!(b["action"], "");
    assert!(b["statusmsg"]
        .as_str()
        .unwrap()
        .starts_with("Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: "));
}

#[test]
fn presigned_csrs_are_served_for_the_default_subject_only() {
    let key = csr::generate_rsa_key(1024).unwrap();
    let pool = RsaKeyPool::from_keys(vec![key]).unwrap();
    let ids = vec!["n0.example.net".to_string(), "n1.example.net".to_string()];
    let presigned = crate::setup::presign_csrs(&pool, &ids).unwrap();
    assert_eq!(presigned.len(), 2);
    let shared = shared(pool, presigned.clone());
    let mut n = Node::new("n1.example.net".into(), 1, None, shared);
    let ask = |n: &mut Node, data: &str| {
        let payload = format!(r#"{{"agent":"choria_provision","action":"gencsr","data":{data}}}"#);
        let h = n.handle(
            &request("choria_provision", &payload, "p"),
            choria_wire::client::now_nanos(),
        );
        body(&h)["data"]["csr"].as_str().unwrap().to_string()
    };
    // What the provisioners ask for: the presigned CSR, with its CN.
    let got = ask(&mut n, r#"{"token":"s3cret","cn":"n1.example.net"}"#);
    assert_eq!(got, presigned[1]);
    let info = csr::parse_csr(&got).unwrap();
    assert_eq!(
        (info.common_name.as_str(), info.common_name_count),
        ("n1.example.net", 1)
    );
    // Anything else is made on request.
    let other = ask(
        &mut n,
        r#"{"token":"s3cret","cn":"n1.example.net","O":"Acme"}"#,
    );
    assert_ne!(other, presigned[1]);
}
