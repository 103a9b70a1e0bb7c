//! The built-in CA (`ca:`) signs a REAL go-choria 0.30.2 server's CSR with
//! no helper and no Kubernetes: an ECDSA P-256 intermediate under the RSA
//! root that also signed the broker's certificate, its key in a PKCS#11
//! token (SoftHSM2; the file made to import it is removed first), named by
//! a `pkcs11:` URI with the PIN in a file. The server is configured by a
//! template, comes back with its certificate and the intermediate in
//! `certificate.pem` and the CA's file in `ca.pem`, connects with verified
//! TLS, answers the real `choria` CLI in its collective, and is renewed
//! twice before its certificate expires, each time with a new certificate
//! from the same CA.
//!
//! Needs `$CHORIA_BIN`, `openssl`, SoftHSM2 (`softhsm2-util` and its
//! module; `SOFTHSM2_MODULE` overrides Debian's path) and root, like
//! tests/provision_go.rs; without SoftHSM the test fails under CI and says
//! skipped otherwise.

use crate::support::gopeers::{s, TestCa};
use crate::support::provisioner::ProvisionerProcess;
use crate::support::realnodes::*;
use crate::support::NatsServer;
use choria_fleet::ca as pki;
use choria_wire::lifecycle::EventType;
use choria_wire::protocol::Version;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// `ca.validity`: the shortest the configuration takes.
const VALIDITY: &str = "1h";
/// `renewal.before`: due 30 s after issue (the CA backdates its
/// certificates 5 minutes, so their lifetime is 65 minutes).
const RENEW_BEFORE: &str = "3570s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_server_is_signed_by_the_built_in_ca_and_renewed_twice() {
    let Some(mut bench) =
        Bench::start("a_real_server_is_signed_by_the_built_in_ca_and_renewed_twice").await
    else {
        return;
    };
    let id = "ca-signed.provision.example.net";
    let Some(module) = softhsm_module() else {
        return;
    };
    let (chain, key) = intermediate_under(bench.broker.ca(), bench.work.path());
    bench
        .secrets
        .push(("a line of the CA's key", pem_body_line(&key)));
    let token = TokenKey::import(&module, &key, &bench.path("softhsm"));
    bench.secrets.push(("the token's PIN", PIN.to_string()));
    let records = NatsServer::start_with(&format!(
        "jetstream {{ store_dir: \"{}\" }}\n",
        s(&bench.path("records"))
    ));
    let admin = bench.x509_admin_config();
    let mut p = given_a_provisioner_signing_with_the_built_in_ca(
        &bench,
        (&chain, &token),
        &records.url(),
        &admin,
    )
    .await;
    let mut server = bench.server(id, Version::V1).await;
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;
    then_the_node_holds_a_certificate_from_the_intermediate(&bench, id, &chain);
    assert_eq!(
        p.metric("choria_provisioner_helper_time_count"),
        0.0,
        "no helper ran"
    );
    assert_serves_cli(&bench, &admin, id, "mcollective").await;

    let serials = when_renewal_comes_twice(&mut bench, id, &server).await;
    assert_eq!(
        serials
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3,
        "a new certificate each time: {serials:?}"
    );
    let metrics = p.get("/metrics").1;
    for (name, outcome, at_least) in [
        ("choria_provisioner_ca_signatures", "issued", 3),
        ("choria_provisioner_renewals", "sent", 2),
    ] {
        let count = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {name}{{outcome={outcome}}}:\n{metrics}"));
        assert!(
            count >= f64::from(at_least),
            "{name}{{{outcome}}} = {count}"
        );
    }
    bench.stop_and_check_log(p);
    drop(server);
}

/// The token's user PIN (a test token's).
const PIN: &str = "4711-fleet";

/// SoftHSM's module, or `None` (the test skipped) when it is not installed
/// and `CI` is not set.
fn softhsm_module() -> Option<PathBuf> {
    let module = std::env::var_os("SOFTHSM2_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/softhsm/libsofthsm2.so"));
    let util = Command::new("softhsm2-util").arg("--version").output();
    if module.exists() && util.is_ok_and(|o| o.status.success()) {
        return Some(module);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "SoftHSM2 is not installed ({} or softhsm2-util missing): scripts/test.sh installs it",
        module.display()
    );
    eprintln!("skipped: softhsm2 not installed");
    None
}

/// A CA key moved into a SoftHSM token of its own: where the token's
/// configuration is, and the `pkcs11:` URI that names the key.
struct TokenKey {
    conf: PathBuf,
    uri: String,
}

impl TokenKey {
    /// Imports `key` (SEC1 PEM) into a new token in `dir` and removes the
    /// file: from here on the key exists only in the token.
    fn import(module: &Path, key: &Path, dir: &Path) -> TokenKey {
        let tokens = dir.join("tokens");
        std::fs::create_dir_all(&tokens).unwrap();
        let conf = dir.join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                s(&tokens)
            ),
        )
        .unwrap();
        let run = |program: &str, args: &[&str]| {
            let out = Command::new(program)
                .args(args)
                .env("SOFTHSM2_CONF", &conf)
                .output()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(
                out.status.success(),
                "{program} {}: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let pkcs8 = dir.join("ca.p8");
        run(
            "openssl",
            &[
                "pkcs8",
                "-topk8",
                "-nocrypt",
                "-in",
                s(key),
                "-out",
                s(&pkcs8),
            ],
        );
        run(
            "softhsm2-util",
            &[
                "--init-token",
                "--free",
                "--label",
                "fleet",
                "--pin",
                PIN,
                "--so-pin",
                "0000-so",
            ],
        );
        run(
            "softhsm2-util",
            &[
                "--import",
                s(&pkcs8),
                "--token",
                "fleet",
                "--label",
                "ca",
                "--id",
                "01",
                "--pin",
                PIN,
            ],
        );
        std::fs::remove_file(&pkcs8).unwrap();
        std::fs::remove_file(key).unwrap();
        let pin = dir.join("pin");
        std::fs::write(&pin, format!("{PIN}\n")).unwrap();
        TokenKey {
            conf,
            uri: format!(
                "pkcs11:token=fleet;object=ca?module-path={}&pin-source=file:{}",
                s(module),
                s(&pin)
            ),
        }
    }
}

/// `<dir>/intermediate-chain.pem` (the intermediate, then the root) and
/// `<dir>/intermediate.key`: a P-256 CA `root` signed, as OpenSSL makes one.
fn intermediate_under(root: &TestCa, dir: &Path) -> (PathBuf, PathBuf) {
    let p = |name: &str| dir.join(name);
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "ecparam",
        "-genkey",
        "-name",
        "prime256v1",
        "-out",
        "intermediate.key",
    ]);
    openssl(&[
        "req",
        "-new",
        "-subj",
        "/O=Fleet/CN=Fleet Intermediate CA",
        "-key",
        "intermediate.key",
        "-out",
        "intermediate.csr",
    ]);
    std::fs::write(
        p("intermediate.ext"),
        "basicConstraints=critical,CA:true,pathlen:0\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        "intermediate.csr",
        "-CA",
        s(&root.cert),
        "-CAkey",
        s(&root.key),
        "-CAcreateserial",
        "-extfile",
        "intermediate.ext",
        "-out",
        "intermediate.pem",
    ]);
    let chain = std::fs::read_to_string(p("intermediate.pem")).unwrap() + &root.cert_pem();
    std::fs::write(p("intermediate-chain.pem"), chain).unwrap();
    (p("intermediate-chain.pem"), p("intermediate.key"))
}

/// Our provisioner, configured by a template (no helper), signing with the
/// built-in CA, keeping records, renewing through `admin`'s configuration;
/// returns once it is listening, so the server is found by its startup.
async fn given_a_provisioner_signing_with_the_built_in_ca(
    bench: &Bench,
    (chain, token): (&Path, &TokenKey),
    records: &str,
    admin: &Path,
) -> ProvisionerProcess {
    let policies = serde_json::json!({
        "rpcutil.policy": rpcutil_policy("choria=admin.mcollective"),
        "choria_provision.policy":
            "policy default deny\nallow\tchoria=admin.mcollective\treprovision\t*\t*\n",
    });
    let template = serde_json::json!({
        "configuration": file_provider_template(&bench.url()),
        "action_policies": policies,
    });
    let yaml = format!(
        "workers: 2\ninterval: 1m\ntoken: {TOKEN}\nsite: built-in-ca\ndiscovery_timeout: 2s\nchoria_insecure: true\n\
         jwt_verify_cert: {}\nfeatures:\n  jwt: true\n  pki: true\nconfiguration_template: {template}\n\
         ca:\n  certificate: {}\n  key: '{}'\n  validity: {VALIDITY}\n\
         records:\n  url: {records}\n  bucket: CA_SIGNED\n  history: 10\n  signing_key: {}\n\
         renewal:\n  before: {RENEW_BEFORE}\n  retry: 2m\n  choria_config: {}\n",
        s(&bench.signers.rsa_public),
        s(chain),
        token.uri,
        s(&crate::support::signing_key(&bench.path(""))),
        s(admin),
    );
    let choria_cfg = format!(
        "identity = {PROVISIONER}\nplugin.choria.middleware_hosts = {}\nplugin.security.provider = file\n",
        bench.url()
    );
    let dir = bench.path("provisioner");
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = ProvisionerProcess::start_with_env(
        &dir,
        "provisioner",
        &yaml,
        &choria_cfg,
        &["--debug"],
        &[("SOFTHSM2_CONF", s(&token.conf))],
    );
    p.wait_for_metric("choria_provisioner_discover_cycles", 1.0, STARTUP_TIMEOUT)
        .await;
    p
}

/// What configure wrote: the node's certificate for its name and own key,
/// from the intermediate, for TLS server and client use, `ca.validity`
/// long; the intermediate behind it; the CA's whole file as what it
/// trusts; and it verifies up to the root alone, as the broker checks it.
fn then_the_node_holds_a_certificate_from_the_intermediate(bench: &Bench, id: &str, chain: &Path) {
    let ssl = bench.path(id).join("ssl");
    let sent = std::fs::read_to_string(ssl.join("certificate.pem")).unwrap();
    assert_eq!(
        sent.matches("BEGIN CERTIFICATE").count(),
        2,
        "leaf and intermediate:\n{sent}"
    );
    let chain_pem = std::fs::read_to_string(chain).unwrap();
    pki::verify_issued_by(&sent, &chain_pem)
        .unwrap_or_else(|e| panic!("the node's certificate is not the intermediate's: {e}"));
    assert_eq!(pki::certificate_common_name(&sent).unwrap(), id);
    assert_eq!(
        std::fs::read_to_string(ssl.join("ca.pem")).unwrap(),
        chain_pem
    );
    let out = Command::new("openssl")
        .args(["verify", "-purpose", "sslclient", "-CAfile"])
        .arg(&bench.broker.ca().cert)
        .arg("-untrusted")
        .arg(ssl.join("certificate.pem"))
        .arg(ssl.join("certificate.pem"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(ssl.join("certificate.pem"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    for usage in [
        "Digital Signature",
        "Key Encipherment",
        "TLS Web Server Authentication",
        "TLS Web Client Authentication",
        "ecdsa-with-SHA256",
    ] {
        assert!(text.contains(usage), "{usage} missing:\n{text}");
    }
    bench.assert_connected_in(id, "mcollective");
}

/// Renewal sends `reprovision` to the node in its collective and it comes
/// back, twice; returns the serial of each certificate it held (the first
/// included).
async fn when_renewal_comes_twice(
    bench: &mut Bench,
    id: &str,
    server: &crate::support::gopeers::GoServer,
) -> Vec<String> {
    let cert = bench.path(id).join("ssl").join("certificate.pem");
    let mut serials = Vec::new();
    for round in 1..=3 {
        bench
            .events
            .wait_count(
                id,
                (EventType::Startup, "server"),
                round,
                Duration::from_secs(120),
                server,
            )
            .await;
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(&cert)
            .output()
            .unwrap();
        serials.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while bench.broker.connections(id).len() != 1 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bench.assert_connected_in(id, "mcollective");
    }
    let history = bench.events.history(id);
    let back = history
        .windows(2)
        .filter(|w| w[0] == "shutdown.server" && w[1] == "startup.provision_mode_server")
        .count();
    assert_eq!(
        back, 2,
        "twice from its collective back into provisioning: {history:?}"
    );
    serials
}
