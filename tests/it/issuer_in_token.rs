//! A real go-choria v2 server provisioned by a provisioner whose server-JWT
//! chain issuer key (`jwt_signing_key`) stays in a PKCS#11 token (issue #44
//! item 2). The organisation is the one `V2Org` issues with the real
//! `choria jwt` tooling; only the provisioner's signing key moves: the
//! chain signer's seed is imported into a SoftHSM token of this test's own
//! and removed from disk, and the provisioner opens it as
//! `pkcs11:token=fleet;object=issuer?module-path=…&pin-source=file:…`.
//! The server must come back with a JWT the issuer's chain verifies and
//! serve the real CLI; the provisioner's debug log holds neither the PIN
//! nor the seed.
//!
//! Needs `$CHORIA_BIN` and root like tests/it/provision_go.rs, and SoftHSM
//! (`softhsm2-util` and its module: Debian's path, or `SOFTHSM2_MODULE`):
//! under CI a missing SoftHSM fails the test, otherwise it says it was not
//! run.

use crate::support::gopeers::s;
use crate::support::peers::Missing;
use crate::support::realnodes::*;
use choria_wire::protocol::Version;
use choria_wire::security::ed25519::{self, Ed25519KeyPair};
use choria_wire::security::tokens;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const TEST: &str = "real_v2_server_is_provisioned_with_its_issuer_key_in_a_token";
/// Debian's module; `SOFTHSM2_MODULE` names another.
const DEBIAN_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
const TOKEN_LABEL: &str = "fleet";
const KEY_LABEL: &str = "issuer";
const PIN: &str = "token-pin-4921";
const SO_PIN: &str = "token-so-7705";
/// The DER of an Ed25519 PKCS#8 private key (RFC 8410) up to its 32-byte
/// seed: what `softhsm2-util --import` reads.
const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// SoftHSM's module, or `None` (having said why) when it is not installed.
fn softhsm_module() -> Option<PathBuf> {
    let module = std::env::var_os("SOFTHSM2_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEBIAN_MODULE));
    let util = Command::new("softhsm2-util").arg("--version").output();
    if module.exists() && util.is_ok_and(|o| o.status.success()) {
        return Some(module);
    }
    Missing {
        test: TEST,
        problem: format!(
            "SoftHSM is not installed ({} or softhsm2-util is missing)",
            module.display()
        ),
        unproven: "A jwt_signing_key kept in a PKCS#11 token",
        advice: "Install it (`apt-get install softhsm2`), or set SOFTHSM2_MODULE to its module.",
        build_log_var: None,
    }
    .skip()
}

fn softhsm_util(conf: &Path, args: &[&str]) {
    let out = Command::new("softhsm2-util")
        .args(args)
        .env("SOFTHSM2_CONF", conf)
        .output()
        .expect("softhsm2-util");
    assert!(
        out.status.success(),
        "softhsm2-util {}: {}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A SoftHSM token of its own in `dir` holding the Ed25519 pair of
/// `seed_hex`, and the file with its PIN: SoftHSM's configuration file
/// (for `SOFTHSM2_CONF`) and the PIN file.
fn token_with_seed(dir: &Path, seed_hex: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir.join("tokens")).unwrap();
    let conf = dir.join("softhsm2.conf");
    let text = format!(
        "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
        dir.join("tokens").display()
    );
    std::fs::write(&conf, text).unwrap();
    softhsm_util(
        &conf,
        &[
            "--init-token",
            "--free",
            "--label",
            TOKEN_LABEL,
            "--pin",
            PIN,
            "--so-pin",
            SO_PIN,
        ],
    );
    let seed = hex::decode(seed_hex.trim()).unwrap();
    assert_eq!(seed.len(), 32, "an ed25519 seed");
    let der = [PKCS8_ED25519_PREFIX.as_slice(), &seed].concat();
    let pkcs8 = dir.join("issuer.pem");
    std::fs::write(&pkcs8, pem::encode(&pem::Pem::new("PRIVATE KEY", der))).unwrap();
    std::fs::set_permissions(&pkcs8, std::fs::Permissions::from_mode(0o600)).unwrap();
    softhsm_util(
        &conf,
        &[
            "--import",
            s(&pkcs8),
            "--token",
            TOKEN_LABEL,
            "--label",
            KEY_LABEL,
            "--id",
            "01",
            "--pin",
            PIN,
        ],
    );
    std::fs::remove_file(&pkcs8).unwrap();
    let pin = dir.join("pin");
    std::fs::write(&pin, format!("{PIN}\n")).unwrap();
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o600)).unwrap();
    (conf, pin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_v2_server_is_provisioned_with_its_issuer_key_in_a_token() {
    let Some(module) = softhsm_module() else {
        return;
    };
    let Some(mut bench) = Bench::start(TEST).await else {
        return;
    };
    let org = V2Org::issue(&mut bench);
    bench.secrets.push(("the token's PIN", PIN.to_string()));

    // The chain signer's key moves into the token: its seed leaves the disk.
    let seed = std::fs::read_to_string(&org.signer_seed).unwrap();
    let signer_public = Ed25519KeyPair::from_seed_hex(seed.trim())
        .unwrap()
        .public_hex();
    let (conf, pin) = token_with_seed(&bench.path("softhsm"), &seed);
    std::fs::remove_file(&org.signer_seed).unwrap();
    let uri = format!(
        "pkcs11:token={TOKEN_LABEL};object={KEY_LABEL};type=private?module-path={}&pin-source=file:{}",
        s(&module),
        s(&pin)
    );
    let yaml = org.yaml().replace(s(&org.signer_seed), &uri);
    assert!(yaml.contains(&uri), "{yaml}");

    let id = "token-signed.provision.example.net";
    let mut server = bench.server(id, Version::V2).await;
    let node_dir = bench.path(id);
    let settings = org.server_settings(&node_dir);
    let helper = bench.helper(
        &settings,
        &serde_json::json!({ "rpcutil.policy": rpcutil_policy("admin") }),
    );
    let choria_cfg = org.choria_cfg(&bench);
    let env = [("SOFTHSM2_CONF", s(&conf))];
    let mut p = bench.provisioner_with_env("in-token", &yaml, &choria_cfg, &helper, &env);
    bench
        .wait_provisioned_and_restarted(&mut p, &mut server)
        .await;

    // server.jwt: chain-issued by the key in the token, verified through
    // the organisation issuer.
    let jwt = std::fs::read_to_string(node_dir.join("server.jwt")).unwrap();
    let issuer_key = ed25519::parse_public_key_hex(&org.issuer_hex).unwrap();
    let claims = tokens::verify_chain_issued_server_token(&jwt, &issuer_key)
        .unwrap_or_else(|e| panic!("server.jwt does not verify through the chain: {e}\n{jwt}"));
    assert_eq!(claims.identity, id);
    let signer = tokens::parse_client_id_token_unverified(
        std::fs::read_to_string(&org.signer_jwt).unwrap().trim(),
    )
    .unwrap();
    assert_eq!(signer.standard.public_key, signer_public);
    assert_eq!(
        claims.standard.issuer,
        format!("C-{}.{signer_public}", signer.standard.id),
        "issued as the chain signer whose key is in the token"
    );

    // The restarted server runs on it and serves the real CLI.
    bench.assert_connected_in(id, "choria");
    let client_cfg = org.admin_client_config(&bench);
    assert_serves_cli(&bench, &client_cfg, id, "choria").await;

    // Neither the PIN nor the seed in the debug log (the bench's secrets).
    let logs = bench.stop_and_check_log(p);
    assert!(logs.contains(id), "the node is named in the log");
}
