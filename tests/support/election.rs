//! A nats-server standing in for a Choria broker's election plumbing: a
//! CHORIA account with JetStream holds the election bucket, and a
//! PROVISIONING account (where provisioners and servers log in) imports
//! exactly the two subjects a Choria broker imports for the election.

use super::NatsServer;
use serde_json::Value;
use std::time::Duration;

/// nats-server with JetStream in a CHORIA account and a PROVISIONING account
/// that imports exactly what a Choria broker imports for the election.
pub fn choria_like_broker() -> NatsServer {
    let store = tempfile::tempdir().unwrap();
    let extra = format!(
        r#"
jetstream {{ store_dir: "{}" }}
accounts {{
  CHORIA: {{ jetstream: enabled, users: [{{user: admin, password: admin}}],
    exports: [{{service: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}},
              {{service: "$KV.CHORIA_LEADER_ELECTION.provisioner"}}] }}
  PROVISIONING: {{ users: [{{user: prov, password: prov}}], imports: [
    {{service: {{account: CHORIA, subject: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}},
     to: "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION"}}
    {{service: {{account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}},
     to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"}}
    {{service: {{account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.provisioner"}}}} ] }}
}}
no_auth_user: prov
"#,
        store.path().display()
    );
    let nats = NatsServer::start_with(&extra);
    std::mem::forget(store); // lives as long as the test process
    nats
}

/// A connection to the CHORIA account, where the bucket lives.
pub async fn admin(nats: &NatsServer) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password("admin".into(), "admin".into())
        .connect(nats.url())
        .await
        .unwrap()
}

/// Creates the election bucket as the broker would, from the CHORIA account.
pub async fn create_bucket(nats: &NatsServer, ttl: Duration) {
    let config = serde_json::json!({
        "name": "KV_CHORIA_LEADER_ELECTION",
        "subjects": ["$KV.CHORIA_LEADER_ELECTION.>"],
        "retention": "limits", "max_consumers": -1, "max_msgs_per_subject": 1,
        "max_msgs": -1, "max_bytes": -1, "max_age": ttl.as_nanos() as u64,
        "max_msg_size": 1024, "storage": "file", "discard": "new", "num_replicas": 1,
        "deny_delete": true, "allow_rollup_hdrs": true, "allow_direct": true,
    });
    let reply = admin(nats)
        .await
        .request(
            "$JS.API.STREAM.CREATE.KV_CHORIA_LEADER_ELECTION",
            serde_json::to_vec(&config).unwrap().into(),
        )
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(v.get("error").is_none(), "bucket creation failed: {v}");
}
