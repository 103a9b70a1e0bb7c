//! `choria-provisioner run` provisions REAL go-choria 0.30.2 servers end to end:
//!
//! * v1: x509 with `pki`: the provisioner speaks insecure v1, our `fleet-helper`
//!   signs the node's CSR with the CA that also signed the broker's certificate;
//! * v2: an ed25519 Organization Issuer: the provisioner speaks v2 with a client
//!   JWT from the issuer and signs the node's server JWT with a chain-issuer key.
//!
//! After `restart` each server must come back (same PID, re-exec) with the
//! helper's configuration, connect with verified TLS, announce itself as a
//! normal `server` and answer a real `choria` client in its new collective, but
//! no longer in `provisioning`. The provisioner runs with `--debug` and its log
//! must hold no token, seed or private key.
//!
//! Needs `$CHORIA_BIN` and root, like tests/interop_go.rs (see
//! tests/gopeers/RECIPE.md); without the binary each test says so loudly and
//! returns.

use crate::support::discover_provisionable;
use crate::support::evidence::AwsRegion;
use crate::support::gopeers::{choria_tool, s};
use crate::support::provisioner::ProvisionerProcess;
use crate::support::realnodes::*;
use choria_fleet::ca as pki;
use choria_wire::client::{ChoriaClient, Identity};
use choria_wire::protocol::{RequestSigner, Version};
use choria_wire::security::ed25519::{self, Ed25519KeyPair};
use choria_wire::security::tokens;
use std::path::Path;

// ---------------------------------------------------------------------------
// 1. v1, x509 with the pki feature.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v1_server_is_provisioned_with_pki() {
    let Some(mut bench) = Bench::start("real_v1_server_is_provisioned_with_pki").await else {
        return;
    };
    let id = "real-v1.provision.example.net";
    let node_dir = bench.path(id);
    let ssl = node_dir.join("ssl");
    // The file provider pointed at what configure writes into the node's
    // ssldir: the certificate our helper signs, the key the node made for its
    // CSR, and the CA, which also signed the broker's certificate.
    let settings = file_provider_settings(&ssl);
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let (p, _server, policy) = bench
        .provision_v1(
            id,
            ("choria_insecure: true\n", &choria_cfg),
            &settings,
            "choria=admin.mcollective",
        )
        .await;
    assert_eq!(
        (
            p.metric("choria_provisioner_event_discovered"),
            p.metric("choria_provisioner_discovered")
        ),
        (1.0, 0.0),
        "found once, by its startup event"
    );

    // The configuration file: exactly the helper's settings.
    let (header, written) = read_written_config(&node_dir.join("server.conf"));
    assert!(
        header.starts_with("# configuration file written in request ")
            && header.contains(&format!(" from choria={PROVISIONER} ({PROVISIONER}) at ")),
        "written by our provisioner's configure request: {header}"
    );
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // The certificate is the one fleet-helper signed for the node's own key.
    let cert = std::fs::read_to_string(ssl.join("certificate.pem")).unwrap();
    let ca_pem = bench.broker.ca().cert_pem();
    pki::verify_issued_by(&cert, &ca_pem)
        .unwrap_or_else(|e| panic!("the node's certificate is not from the test CA: {e}"));
    assert_eq!(pki::certificate_common_name(&cert).unwrap(), id);
    assert_eq!(std::fs::read_to_string(ssl.join("ca.pem")).unwrap(), ca_pem);
    let public_of =
        |args: &[&str]| crate::support::stdout_of(std::process::Command::new("openssl").args(args));
    let private = ssl.join("private.pem");
    assert_eq!(
        public_of(&[
            "x509",
            "-noout",
            "-pubkey",
            "-in",
            s(&ssl.join("certificate.pem"))
        ]),
        public_of(&["pkey", "-pubout", "-in", s(&private)]),
        "the certificate is for the key the node generated for its CSR"
    );
    assert_eq!(mode(&private), 0o600);

    // Back in the default collective, out of provisioning, over TLS that the
    // file provider verifies with the CA configure delivered.
    bench.assert_connected_in(id, "mcollective");
    let v1 = bench.insecure_v1_client();
    assert!(
        discover_provisionable(&v1).await.is_empty(),
        "{id} no longer answers in the provisioning collective"
    );

    // A real x509 client whose certificate the same CA signed is served.
    let client_cfg = bench.x509_admin_config();
    assert_serves_cli(&bench, &client_cfg, id, "mcollective").await;

    bench
        .secrets
        .push(("a line of the node's private key", pem_body_line(&private)));
    let logs = bench.stop_and_check_log(p);
    assert!(logs.contains(id), "the node is named in the log");
}

// ---------------------------------------------------------------------------
// 2. v2, ed25519 Organization Issuer.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v2_server_is_provisioned_with_ed25519_org_issuer() {
    let Some(mut bench) =
        Bench::start("real_v2_server_is_provisioned_with_ed25519_org_issuer").await
    else {
        return;
    };
    let org = V2Org::issue(&mut bench);
    let issuer_hex = org.issuer_hex.clone();
    let (client_jwt, client_seed, signer_jwt) = (
        org.client_jwt.clone(),
        org.client_seed.clone(),
        org.signer_jwt.clone(),
    );

    // This server is up before the provisioner: found by its start-up discovery.
    let id = "real-v2.provision.example.net";
    let mut server = bench.server(id, Version::V2).await;
    let node_dir = bench.path(id);
    let settings = org.server_settings(&node_dir);
    let policy = rpcutil_policy("admin");
    let helper = bench.helper(&settings, &serde_json::json!({ "rpcutil.policy": policy }));
    let choria_cfg = org.choria_cfg(&bench);
    let yaml = org.yaml();
    let mut p = bench.provisioner("real-v2", &yaml, &choria_cfg, &helper);

    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    assert_eq!(
        (
            p.metric("choria_provisioner_event_discovered"),
            p.metric("choria_provisioner_discovered")
        ),
        (0.0, 1.0),
        "found once, by discovery"
    );

    // The configuration file: exactly the helper's settings.
    let (header, written) = read_written_config(&node_dir.join("server.conf"));
    assert!(
        header.contains(" from provisioner (provisioner.example.net) at "),
        "written by our provisioner's configure request, caller from its JWT: {header}"
    );
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // server.jwt: chain-issued for the key gen25519 made, and the real Go
    // token code validates it with the issuer's public key.
    let jwt_path = node_dir.join("server.jwt");
    let jwt = std::fs::read_to_string(&jwt_path).unwrap();
    assert_eq!(mode(&jwt_path), 0o600);
    let issuer_key = ed25519::parse_public_key_hex(&issuer_hex).unwrap();
    let claims = tokens::verify_chain_issued_server_token(&jwt, &issuer_key)
        .unwrap_or_else(|e| panic!("server.jwt does not verify through the chain: {e}\n{jwt}"));
    assert_eq!(claims.identity, id);
    assert_eq!(
        claims.collectives,
        ["choria"],
        "the choria provider's collective"
    );
    let seed_text = std::fs::read_to_string(node_dir.join("server.seed")).unwrap();
    bench.secrets.push(("the node's seed", seed_text.clone()));
    let node_key = Ed25519KeyPair::from_seed_hex(seed_text.trim()).unwrap();
    assert_eq!(
        claims.standard.public_key,
        node_key.public_hex(),
        "the JWT is for the node's own server.seed"
    );
    // Signed by the chain issuer, whose expiry caps the year the provisioner
    // asks for, exactly as go-choria's tokens.SetChainIssuer does.
    let signer = tokens::parse_client_id_token_unverified(
        std::fs::read_to_string(&signer_jwt).unwrap().trim(),
    )
    .unwrap();
    assert_eq!(
        claims.standard.issuer,
        format!("C-{}.{}", signer.standard.id, signer.standard.public_key)
    );
    assert_eq!(
        claims.standard.issuer_expires_at,
        signer.standard.expires_at
    );
    assert_eq!(claims.standard.expires_at, signer.standard.expires_at);
    let view = choria_tool(
        &bench.bin,
        bench.work.path(),
        &["jwt", "view", s(&jwt_path), s(&bench.signers.issuer_public)],
    );
    assert!(
        view.contains(&format!("Validated Server Token {}", s(&jwt_path))) && view.contains(id),
        "choria jwt view:\n{view}"
    );

    // The restarted server runs on that JWT and seed, with the CA: it
    // re-enters provisioning mode instead when the JWT's key is not the
    // seed's (cmd/server_run.go shouldProvisionTokenAndSeed).
    let log = server.log();
    let restarted = &log[log.find("Initiating Choria Server restart").unwrap()..];
    for line in [
        format!(
            "mTLS=true security=choria seed={} token={}",
            s(&node_dir.join("server.seed")),
            s(&jwt_path)
        ),
        // logrus escapes the quotes in its msg="..." field.
        format!(r#"Setting JWT token and unique reply queues based on JWT for \"{id}\""#),
    ] {
        assert!(
            restarted.contains(&line),
            "{id} after its restart logs {line:?}:\n{restarted}"
        );
    }

    // Back in the choria collective (the choria provider's default), out of
    // provisioning, over TLS verified with plugin.security.choria.ca.
    bench.assert_connected_in(id, "choria");
    let v2 = v2_provisioner_client(&bench, &client_seed, &client_jwt);
    assert!(
        discover_provisionable(&v2).await.is_empty(),
        "{id} no longer answers in the provisioning collective"
    );

    // A real v2 client holding an issuer-issued JWT is served: the server
    // runs with the issuer configuration.
    let client_cfg = org.admin_client_config(&bench);
    assert_serves_cli(&bench, &client_cfg, id, "choria").await;

    let logs = bench.stop_and_check_log(p);
    assert!(logs.contains(id), "the node is named in the log");
}

// ---------------------------------------------------------------------------
// 3. v1, no helper: a configuration template and the real cert-manager.
// ---------------------------------------------------------------------------

/// The certificate's key usages and extended key usages, as openssl names them.
fn usages(cert: &Path) -> String {
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "keyUsage,extendedKeyUsage", "-in"])
        .arg(cert)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v1_server_is_configured_by_a_template_and_signed_by_cert_manager() {
    const TEST: &str = "real_v1_server_is_configured_by_a_template_and_signed_by_cert_manager";
    let Some(kube) = crate::support::kube::ControlPlane::available() else {
        return;
    };
    let Some(cm_bins) = crate::support::certmanager::available() else {
        return;
    };
    let Some(mut bench) = Bench::start(TEST).await else {
        return;
    };
    let cp = crate::support::kube::ControlPlane::start(&kube);
    cp.kubectl_ok(&["create", "namespace", "choria"]);
    // The Issuer signs with the CA that signed the broker's certificate, so
    // the provisioned server's TLS verifies.
    let _cm = crate::support::certmanager::CertManager::start_with_ca(
        &cp,
        &cm_bins,
        "choria",
        "choria-ca",
        &bench.broker.ca().cert,
        &bench.broker.ca().key,
        bench.work.path(),
    );
    let id = "real-cm.provision.example.net";
    let node_dir = bench.path(id);
    let ssl = node_dir.join("ssl");
    let policy = rpcutil_policy("choria=admin.mcollective");
    let template = serde_json::json!({
        "configuration": file_provider_template(&bench.url()),
        "action_policies": {"rpcutil.policy": policy},
    });
    let yaml = format!(
        "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: real-cm\ndiscovery_timeout: 2s\nchoria_insecure: true\n\
         jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\nconfiguration_template: {template}\n\
         cert_manager:\n  issuer: choria-ca\n  namespace: choria\n",
        s(&bench.signers.rsa_public)
    );
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let dir = bench.path("provisioner");
    std::fs::create_dir_all(&dir).unwrap();
    let admin = cp.kubeconfig(cp.admin_token());
    let mut p = ProvisionerProcess::start_with_env(
        &dir,
        "provisioner",
        &yaml,
        &choria_cfg,
        &["--debug"],
        &[("KUBECONFIG", s(&admin))],
    );
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    let mut server = bench.server(id, Version::V1).await;
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    // One request, issued.
    assert_eq!(p.metric("choria_provisioner_cert_manager_requests"), 1.0);
    let (_, metrics) = p.get("/metrics");
    assert!(
        metrics.lines().any(
            |l| l.starts_with("choria_provisioner_cert_manager_requests{")
                && l.contains("outcome=\"issued\"")
                && l.ends_with(" 1")
        ),
        "{metrics}"
    );
    assert_eq!(
        p.metric("choria_provisioner_helper_time_count"),
        0.0,
        "no helper ran"
    );

    // Exactly the template's settings, rendered for this node.
    let (_, written) = read_written_config(&node_dir.join("server.conf"));
    let settings = file_provider_settings(&ssl);
    assert_eq!(written, bench.expected_config(id, &settings));
    assert_policy_written(&node_dir, &policy);

    // cert-manager's certificate, from the Issuer's CA, for the node's name
    // and key, for TLS server and client use.
    let cert_path = ssl.join("certificate.pem");
    let cert = std::fs::read_to_string(&cert_path).unwrap();
    let ca_pem = bench.broker.ca().cert_pem();
    pki::verify_issued_by(&cert, &ca_pem)
        .unwrap_or_else(|e| panic!("the node's certificate is not from the Issuer's CA: {e}"));
    assert_eq!(pki::certificate_common_name(&cert).unwrap(), id);
    assert_eq!(
        std::fs::read_to_string(ssl.join("ca.pem")).unwrap().trim(),
        ca_pem.trim(),
        "status.ca is the CA"
    );
    let u = usages(&cert_path);
    for usage in [
        "Digital Signature",
        "Key Encipherment",
        "TLS Web Server Authentication",
        "TLS Web Client Authentication",
    ] {
        assert!(u.contains(usage), "{usage} missing: {u}");
    }
    bench.assert_connected_in(id, "mcollective");
    bench.secrets.push((
        "a line of the node's private key",
        pem_body_line(&ssl.join("private.pem")),
    ));
    bench.stop_and_check_log(p);
}

// ---------------------------------------------------------------------------
// 4. Day two: a real server's credentials renewed before they expire.
// ---------------------------------------------------------------------------

/// A real go-choria 0.30.2 server (v2, org issuer) provisioned with a server
/// JWT valid one hour and `renewal.before: 99%`: due 36 s after issue. The
/// provisioner sends `reprovision` to it in its collective (`choria`), as the
/// caller the policy it shipped allows; the server re-enters provisioning,
/// is provisioned again and is back in its collective with a new `jti` and a
/// later expiry — twice, with no manual step. Records in a JetStream of
/// their own hold each provisioning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_v2_server_is_renewed_twice_before_its_credentials_expire() {
    let Some(mut bench) =
        Bench::start("a_real_v2_server_is_renewed_twice_before_its_credentials_expire").await
    else {
        return;
    };
    renew_a_v2_server_twice(&mut bench, "renewed-v2.provision.example.net", None, None).await;
}

// ---------------------------------------------------------------------------
// Join tokens: a provisioning JWT minted for one node.
// ---------------------------------------------------------------------------

/// A real go-choria server joined with a token `token issue` minted (the
/// provisioning token read from a file, its lifetime checked against the
/// credentials the provisioner issues) is renewed twice with it: it comes
/// back each time with the same token, which outlives its server JWT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_joined_with_a_token_is_renewed_twice() {
    let Some(mut bench) = Bench::start("a_real_server_joined_with_a_token_is_renewed_twice").await
    else {
        return;
    };
    let id = "joined-renewed.provision.example.net";
    let token_file = bench.path("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let jwt = crate::support::stdout_of(
        std::process::Command::new(crate::support::provisioner::binary()).args([
            "token",
            "issue",
            "--identity",
            id,
            "--ttl",
            "1d",
            "--signer",
            s(&bench.signers.issuer_seed),
            "--token-file",
            s(&token_file),
            "--urls",
            &bench.url(),
            "--protocol-v2",
        ]),
    );
    renew_a_v2_server_twice(&mut bench, id, None, Some(jwt.trim().to_string())).await;
}

/// `token issue` mints a provisioning JWT bound to one identity, which a
/// real go-choria server takes unchanged; the node it was issued for is
/// provisioned, and a second server using a copy of it under another name
/// is refused (and left in provisioning mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_token_provisions_its_node_and_is_refused_under_another_name() {
    let Some(mut bench) =
        Bench::start("a_join_token_provisions_its_node_and_is_refused_under_another_name").await
    else {
        return;
    };
    let id = "joined.provision.example.net";
    let thief = "thief.provision.example.net";
    let jwt = crate::support::stdout_of(
        std::process::Command::new(crate::support::provisioner::binary()).args([
            "token",
            "issue",
            "--identity",
            id,
            "--ttl",
            "1h",
            "--signer",
            s(&bench.signers.rsa_key),
            "--token",
            TOKEN,
            "--urls",
            &bench.url(),
        ]),
    );
    let claims = tokens::parse_provisioning_token_unverified(jwt.trim()).unwrap();
    assert_eq!(claims.bound_identity().unwrap(), Some(id));

    let settings = file_provider_settings(&bench.path(id).join("ssl"));
    let helper = bench.helper(&settings, &serde_json::json!({}));
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let yaml = format!(
        "jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\nchoria_insecure: true\n",
        s(&bench.signers.rsa_public)
    );
    let mut p = bench.provisioner("joined", &yaml, &choria_cfg, &helper);
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    let mut server = bench.server_with_jwt(id, jwt.trim()).await;
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    let _thief = bench.server_with_jwt(thief, jwt.trim()).await;
    p.wait_for_metric(
        "choria_provisioner_provision_errors",
        1.0,
        PROVISION_TIMEOUT,
    )
    .await;
    let v1 = bench.insecure_v1_client();
    let waiting = discover_provisionable(&v1).await;
    assert!(
        waiting.iter().any(|n| n == thief),
        "{thief} is still in provisioning mode: {waiting:?}"
    );
    assert_eq!(p.metric("choria_provisioner_provisioned"), 1.0);
    let logs = bench.stop_and_check_log(p);
    assert!(
        logs.contains(&format!("was issued for {id}, not for this name")),
        "the refusal names the token's node"
    );
}

// ---------------------------------------------------------------------------
// Cloud instance identity evidence (`evidence:`).
// ---------------------------------------------------------------------------

/// `facts.json` holding `document` signed by `region`, as a unit before
/// choria-server would write it from the metadata service.
fn evidence_facts(
    region: &AwsRegion,
    dir: &Path,
    name: &str,
    document: &str,
) -> std::path::PathBuf {
    let facts = dir.join(format!("{name}.facts.json"));
    std::fs::write(&facts, region.facts(name, document).to_string()).unwrap();
    facts
}

/// Real go-choria v2 servers (an Organization Issuer network) carry an AWS
/// instance identity document in the facts file their provisioning JWT
/// names (`choria jwt prov --facts`):
/// the node whose document verifies is provisioned, and its instance is
/// bound to its name; a second server presenting a copy of that document
/// under another name, and a third with no evidence, are refused and left
/// in provisioning mode; the admission policy reads the verified instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_evidence_admits_its_node_and_one_instance_gets_one_identity() {
    let Some(mut bench) =
        Bench::start("instance_evidence_admits_its_node_and_one_instance_gets_one_identity").await
    else {
        return;
    };
    let work = bench.path("");
    let region = AwsRegion::create(&work);
    let (id, copy, bare) = (
        "web-1.evidence.example.net",
        "copy.evidence.example.net",
        "bare.evidence.example.net",
    );
    let facts = evidence_facts(&region, &work, "web-1", &AwsRegion::document("i-0abc1234"));
    let org = V2Org::issue(&mut bench);
    let (bin, signer, url) = (
        bench.bin.clone(),
        bench.signers.issuer_seed.clone(),
        bench.url(),
    );
    let prov_jwt = |facts: Option<&Path>| {
        let file = work.join(format!("prov-{}.jwt", uuid::Uuid::new_v4().simple()));
        let mut args = vec![
            "jwt".to_string(),
            "prov".into(),
            s(&file).into(),
            s(&signer).into(),
            "--token".into(),
            TOKEN.into(),
            "--urls".into(),
            url.clone(),
            "--default".into(),
            "--protocol-v2".into(),
        ];
        if let Some(f) = facts {
            args.extend(["--facts".into(), s(f).into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        choria_tool(&bin, &work, &args);
        std::fs::read_to_string(file).unwrap()
    };
    let store = tempfile::tempdir().unwrap();
    let js = crate::support::NatsServer::start_with(&format!(
        "jetstream {{ store_dir: \"{}\" }}\n",
        store.path().display()
    ));
    let policy = work.join("admission.rego");
    std::fs::write(
        &policy,
        "package choria.provisioner\nimport rego.v1\n\
         default allow := false\n\
         allow if input.evidence.provider == \"aws\"\n\
         deny_reason := \"no evidence\" if not input.evidence\n",
    )
    .unwrap();
    let settings = org.server_settings(&bench.path(id));
    let helper = bench.helper(&settings, &serde_json::json!({}));
    let choria_cfg = org.choria_cfg(&bench);
    let yaml = format!(
        "{}records:\n  url: {}\n  signing_key: {}\n\
         evidence:\n  aws_certificates: {}\n  aws_accounts: [\"123456789012\"]\n  max_age: 1h\n\
         admission:\n  policy: {}\n",
        org.yaml(),
        js.url(),
        s(&crate::support::signing_key(&work)),
        s(&region.cert),
        s(&policy),
    );
    let mut p = bench.provisioner("evidence", &yaml, &choria_cfg, &helper);
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    let mut server = bench
        .server_with_jwt(id, prov_jwt(Some(&facts)).trim())
        .await;
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    // A copy of web-1's document (anyone on the node could read it) under
    // another name, and a node with no evidence at all.
    let _copy = bench
        .server_with_jwt(copy, prov_jwt(Some(&facts)).trim())
        .await;
    let _bare = bench.server_with_jwt(bare, prov_jwt(None).trim()).await;
    p.wait_for_metric(
        "choria_provisioner_evidence{outcome=\"bound_elsewhere\"",
        1.0,
        PROVISION_TIMEOUT,
    )
    .await;
    p.wait_for_metric(
        "choria_provisioner_evidence{outcome=\"missing\"",
        1.0,
        PROVISION_TIMEOUT,
    )
    .await;
    let v2 = v2_provisioner_client(&bench, &org.client_seed, &org.client_jwt);
    let waiting = discover_provisionable(&v2).await;
    for refused in [copy, bare] {
        assert!(
            waiting.iter().any(|n| n == refused),
            "{refused} is still in provisioning mode: {waiting:?}"
        );
    }
    assert_eq!(p.metric("choria_provisioner_provisioned"), 1.0);
    assert_eq!(
        p.metric("choria_provisioner_evidence{outcome=\"verified\""),
        1.0
    );
    assert_eq!(
        p.metric("choria_provisioner_admission{decision=\"allowed\""),
        1.0
    );
    let logs = bench.stop_and_check_log(p);
    assert!(
        logs.contains(&format!(
            "instance aws.123456789012.i-0abc1234 was provisioned as {id}: one instance, one identity"
        )),
        "the copy's refusal names the instance and its identity"
    );
    assert!(
        logs.contains("no instance identity evidence"),
        "the bare node's refusal says why"
    );
}

/// A v2 client as the provisioner (its client JWT and seed), on the
/// bench's watcher connection.
fn v2_provisioner_client(bench: &Bench, seed: &Path, jwt: &Path) -> ChoriaClient {
    ChoriaClient::new(
        bench.watcher.clone(),
        Identity {
            identity: PROVISIONER.into(),
            caller: "provisioner".into(),
            signer: RequestSigner::V2 {
                seed: Box::new(
                    Ed25519KeyPair::from_seed_hex(std::fs::read_to_string(seed).unwrap().trim())
                        .unwrap()
                        .signing_key()
                        .clone(),
                ),
                jwt: std::fs::read_to_string(jwt).unwrap().trim().to_string(),
            },
        },
    )
}
