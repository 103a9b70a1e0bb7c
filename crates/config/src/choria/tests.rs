use super::*;
use choria_wire::security::tokens::{ClientIdClaims, TokenSigningKey};
use std::time::Duration;

const NOW: i64 = 1_750_000_000;

fn env() -> Environment {
    Environment {
        user: Some("choria".into()),
        certname: None,
        is_root: true,
        home: None,
        hostname: Some("host.example.net".into()),
        now_unix: NOW,
    }
}

fn parse(text: &str) -> ChoriaClientConfig {
    ChoriaClientConfig::parse(text, "choria.cfg", &env()).unwrap()
}

/// The error `client_setup_for(false, None, …)` gives for `text`.
fn setup_err(text: &str) -> String {
    parse(text)
        .client_setup_for(false, None, &env())
        .unwrap_err()
        .to_string()
}

/// The error `caller_id(false, …)` gives for `text`.
fn caller_err(text: &str) -> String {
    parse(text)
        .caller_id(false, &env())
        .unwrap_err()
        .to_string()
}

fn warnings(c: &ChoriaClientConfig) -> Vec<String> {
    c.warnings.iter().map(|w| w.to_string()).collect()
}

fn write(dir: &Path, name: &str, data: impl AsRef<[u8]>) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

#[test]
fn line_format() {
    let c = parse(
        "# comment\n\n   identity   =   prov.example.net  \r\n\
         plugin.choria.middleware_hosts=nats://a:4222, b:4222 ,\n\
         loglevel = debug # not a comment\n\
         a b = c=d\n\
         =novalue\n\
         empty =\n\
         ; not a comment either\n\
         identity = later.example.net\n",
    );
    assert_eq!(c.identity, "later.example.net");
    assert_eq!(c.middleware_hosts, ["nats://a:4222", "b:4222"]);
    assert_eq!(c.option("loglevel"), Some("debug # not a comment"));
    assert_eq!(c.option("a b"), Some("c=d"));
    assert_eq!(c.option("empty"), None);
    assert_eq!(c.option("=novalue"), None);
    assert_eq!(
        warnings(&c),
        [
            "choria.cfg:7: =novalue: not a `key = value` line with a value, ignored",
            "choria.cfg:8: empty =: not a `key = value` line with a value, ignored",
            "choria.cfg:9: ; not a comment either: not a `key = value` line with a value, ignored",
        ]
    );
}

#[test]
fn inline_comment_warning_on_used_keys() {
    let c = parse("identity = a.example.net # the provisioner\n");
    assert_eq!(c.identity, "a.example.net # the provisioner");
    assert_eq!(
        warnings(&c),
        ["choria.cfg:1: identity: the value contains ' #': comments must be on their own line, so it is part of the value"]
    );
}

#[test]
fn booleans_and_defaults() {
    let c = parse("");
    assert!(c.use_srv);
    assert_eq!(c.identity, "host.example.net");
    assert_eq!(c.security_provider, None);
    for (v, want) in [
        ("1", true),
        ("0", false),
        ("yes", true),
        ("T", true),
        ("n", false),
        ("FALSE", false),
    ] {
        let c = parse(&format!("plugin.choria.use_srv = {v}\n"));
        assert_eq!(c.use_srv, want, "{v}");
        assert!(c.warnings.is_empty());
    }
    let c = parse("plugin.choria.use_srv = nope\n");
    assert!(!c.use_srv);
    assert!(warnings(&c)[0]
        .starts_with("choria.cfg:1: plugin.choria.use_srv: \"nope\" is not a boolean"));
    let e = ChoriaClientConfig::parse(
        "",
        "choria.cfg",
        &Environment {
            hostname: None,
            ..env()
        },
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "choria.cfg: identity: not set and the host name could not be determined; set identity"
    );
}

#[test]
fn home_expansion() {
    let e = Environment {
        home: Some("/home/prov".into()),
        ..env()
    };
    let c = ChoriaClientConfig::parse(
        "plugin.security.file.key = ~/.ssl/key.pem\nplugin.security.file.ca = /etc/ca.pem\n",
        "choria.cfg",
        &e,
    )
    .unwrap();
    assert_eq!(
        c.file_key.as_deref(),
        Some(Path::new("/home/prov/.ssl/key.pem"))
    );
    assert_eq!(c.file_ca.as_deref(), Some(Path::new("/etc/ca.pem")));
}

#[test]
fn plugin_d_choria_cfg_overrides() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(
        dir.path(),
        "choria.cfg",
        "identity = p.example.net\nplugin.choria.middleware_hosts = a:4222\n",
    );
    std::fs::create_dir(dir.path().join("plugin.d")).unwrap();
    write(
        &dir.path().join("plugin.d"),
        "choria.cfg",
        "middleware_hosts = b:4222\nuse_srv = false\n",
    );
    let c = ChoriaClientConfig::load_with(&main, &env()).unwrap();
    assert_eq!(c.middleware_hosts, ["b:4222"]);
    assert!(!c.use_srv);
    assert_eq!(c.files.len(), 2);
    // go-choria skips plugin.d for files under the home directory.
    let e = Environment {
        home: Some(dir.path().to_path_buf()),
        ..env()
    };
    let c = ChoriaClientConfig::load_with(&main, &e).unwrap();
    assert_eq!(c.middleware_hosts, ["a:4222"]);
    let e = ChoriaClientConfig::load_with(dir.path().join("missing.cfg"), &env())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing.cfg: could not read the configuration file"),
        "{e}"
    );
}

#[test]
fn security_provider_and_protocol() {
    let e = parse("").security_provider(false).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "choria.cfg: plugin.security.provider: not set, so go-choria would use puppet"
        ),
        "{e}"
    );
    assert_eq!(
        parse("").security_provider(true).unwrap(),
        SecurityProvider::File
    );
    let c = parse("plugin.security.provider = file\n");
    assert_eq!(c.protocol_version(false).unwrap(), Version::V1);
    let c = parse("plugin.security.provider = choria\n");
    assert_eq!(c.protocol_version(false).unwrap(), Version::V2);
    // choria_insecure forces file, hence v1.
    assert_eq!(c.protocol_version(true).unwrap(), Version::V1);
    let e = parse("\nplugin.security.provider = puppet\n")
        .security_provider(false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "choria.cfg:2: plugin.security.provider: puppet is not supported by this provisioner; use file (x509 certificates) or choria (ed25519 JWT)"
    );
    let e = parse("plugin.security.provider = File\n")
        .security_provider(false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"File\" is not a security provider"), "{e}");
}

#[test]
fn certname_and_v1_caller() {
    let c = parse("identity = prov.example.net\n");
    assert_eq!(c.certname(&env()), "prov.example.net");
    assert_eq!(
        c.caller_id(true, &env()).unwrap(),
        "choria=prov.example.net"
    );
    let user = Environment {
        is_root: false,
        ..env()
    };
    assert_eq!(c.certname(&user), "choria.mcollective");
    let no_user = Environment {
        is_root: false,
        user: None,
        ..env()
    };
    assert_eq!(c.certname(&no_user), "prov.example.net");
    let forced = Environment {
        certname: Some("provisioner.mcollective".into()),
        is_root: false,
        ..env()
    };
    assert_eq!(c.certname(&forced), "provisioner.mcollective");
    assert_eq!(
        c.caller_id(true, &forced).unwrap(),
        "choria=provisioner.mcollective"
    );
}

#[test]
fn middleware_servers() {
    let c = parse(
        "plugin.choria.middleware_hosts = b1.example.net:4222, nats://b2:4222,tls://b3:4223, [::1]:4222, wss://b4:443/\n",
    );
    assert_eq!(
        c.middleware_servers().unwrap(),
        [
            "nats://b1.example.net:4222",
            "nats://b2:4222",
            "tls://b3:4223",
            "nats://[::1]:4222",
            "wss://b4:443"
        ]
    );
    let e = parse("").middleware_servers().unwrap_err().to_string();
    assert_eq!(
        e,
        "choria.cfg: plugin.choria.middleware_hosts: not set; SRV lookups are not supported, list the brokers as host:port or nats://host:port"
    );
    let e = parse("plugin.choria.srv_domain = example.net\n")
        .middleware_servers()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("SRV lookups (in example.net) are not supported"),
        "{e}"
    );
    let e = parse("plugin.choria.use_srv = false\n")
        .middleware_servers()
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("not set; list the brokers as host:port or nats://host:port"),
        "{e}"
    );
    for (bad, why) in [
        ("broker.example.net", "no port"),
        ("b:http", "not a port number"),
        ("b:70000", "not a port number"),
        ("http://b:80", "unsupported scheme"),
        (":4222", "not a host name"),
    ] {
        let e = parse(&format!("\n\nplugin.choria.middleware_hosts = {bad}\n"))
            .middleware_servers()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "choria.cfg:3: plugin.choria.middleware_hosts: {bad:?}: "
            )) && e.contains(why),
            "{e}"
        );
    }
}

/// The insecure client configuration of the protocol notes (§12.5).
#[test]
fn insecure_setup() {
    let c = parse(
        "plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n\
         plugin.choria.use_srv = false\n\
         identity = provisioner.example.net\n\
         loglevel = debug\n",
    );
    let s = c.client_setup_for(true, None, &env()).unwrap();
    assert_eq!(s.version, Version::V1);
    assert!(matches!(s.identity.signer, RequestSigner::V1Insecure));
    assert_eq!(s.identity.identity, "provisioner.example.net");
    assert_eq!(s.identity.caller, "choria=provisioner.example.net");
    assert_eq!(s.connect.servers, ["nats://127.0.0.1:4222"]);
    assert!(!s.connect.tls.required && !s.connect.tls.is_custom());
    assert_eq!(
        s.connect.inbox_prefix.as_deref(),
        Some("provisioning.reply")
    );
    assert!(s.connect.user.is_none() && s.connect.token.is_none() && s.connect.nats_jwt.is_none());
    assert_eq!(s.collective, "provisioning");

    let pw = Secret::new("s3cret");
    let s = c.client_setup_for(true, Some(&pw), &env()).unwrap();
    assert_eq!(
        s.connect.user,
        Some(("provisioner".to_string(), "s3cret".to_string()))
    );
    assert!(!format!("{s:?}").contains("s3cret"));

    // plugin.nats.user/pass are used when there is no provisioning password.
    let c2 = parse(
        "plugin.choria.middleware_hosts = a:4222\nplugin.nats.user = u\nplugin.nats.pass = hunter2\n",
    );
    let s = c2.client_setup_for(true, None, &env()).unwrap();
    assert_eq!(
        s.connect.user,
        Some(("u".to_string(), "hunter2".to_string()))
    );
    assert!(!format!("{c2:?}").contains("hunter2"));
    let s = c2.client_setup_for(true, Some(&pw), &env()).unwrap();
    assert_eq!(s.connect.user.unwrap().0, "provisioner");
}

#[test]
fn file_provider_setup() {
    let dir = tempfile::tempdir().unwrap();
    let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 1024).unwrap();
    let key_pem = choria_wire::security::private_key_pkcs1_pem(&key).unwrap();
    let key_path = write(dir.path(), "key.pem", key_pem);
    let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let cert_path = write(dir.path(), "cert.pem", cert);
    let ca_path = write(dir.path(), "ca.pem", cert);
    let text = format!(
        "identity = provisioner.mcollective\n\
         plugin.choria.middleware_hosts = tls://broker:4222\n\
         plugin.security.provider = file\n\
         plugin.security.file.certificate = {}\n\
         plugin.security.file.key = {}\n\
         plugin.security.file.ca = {}\n",
        cert_path.display(),
        key_path.display(),
        ca_path.display()
    );
    let c = parse(&text);
    let s = c.client_setup_for(false, None, &env()).unwrap();
    assert_eq!(s.version, Version::V1);
    assert_eq!(s.identity.caller, "choria=provisioner.mcollective");
    match &s.identity.signer {
        RequestSigner::V1Rsa { key: k, cert_pem } => {
            assert_eq!(*k.key(), key);
            assert_eq!(cert_pem, cert);
        }
        other => panic!("{other:?}"),
    }
    assert!(s.connect.tls.required && !s.connect.tls.insecure_skip_verify);
    assert_eq!(s.connect.tls.ca_file.as_deref(), Some(ca_path.as_path()));
    assert_eq!(
        s.connect.tls.client_cert,
        Some((cert_path.clone(), key_path.clone()))
    );
    assert_eq!(
        s.connect.inbox_prefix.as_deref(),
        Some("provisioning.reply")
    );
    assert_eq!(s.connect.name, "provisioner.mcollective");

    // PKCS#8 keys work too.
    use rsa::pkcs8::EncodePrivateKey;
    let p8 = key.to_pkcs8_pem(Default::default()).unwrap();
    write(dir.path(), "key.pem", p8.as_bytes());
    c.client_setup_for(false, None, &env()).unwrap();

    // Missing and broken files are named with key and path.
    let missing = dir.path().join("missing.pem");
    let c = parse(&text.replace(
        &ca_path.display().to_string(),
        &missing.display().to_string(),
    ));
    let e = c
        .client_setup_for(false, None, &env())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "choria.cfg:6: plugin.security.file.ca: {}: ",
            missing.display()
        )),
        "{e}"
    );
    write(dir.path(), "key.pem", "garbage");
    let e = setup_err(&text);
    assert!(
        e.starts_with("choria.cfg:5: plugin.security.file.key: ")
            && e.contains("holds no PEM private key"),
        "{e}"
    );
    let e = setup_err("plugin.security.provider = file\nplugin.choria.middleware_hosts = a:1\n");
    assert_eq!(
        e,
        "choria.cfg: plugin.security.file.certificate: not set; it is required by this security provider"
    );
}

struct V2Files {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    seed: choria_wire::security::Ed25519KeyPair,
}

fn v2_files(purpose_client: bool, exp_offset: i64) -> V2Files {
    let dir = tempfile::tempdir().unwrap();
    let issuer = choria_wire::security::generate_keypair();
    let seed = choria_wire::security::generate_keypair();
    let claims = if purpose_client {
        let mut c = ClientIdClaims::new_at(
            NOW + exp_offset - 3600,
            "up=provisioner_signer",
            Some(&seed.public_hex()),
            "issuer",
            Duration::from_secs(3600),
        )
        .unwrap();
        c.standard.public_key = seed.public_hex();
        serde_json::to_value(c).unwrap()
    } else {
        serde_json::json!({"purpose": "choria_provisioning", "exp": NOW + 3600})
    };
    let jwt = TokenSigningKey::Ed25519(issuer.signing_key().clone())
        .sign(&claims)
        .unwrap();
    write(dir.path(), "signer.jwt", format!("{jwt}\n"));
    write(dir.path(), "signer.key", seed.seed_hex());
    V2Files {
        dir: dir.path().to_path_buf(),
        _dir: dir,
        seed,
    }
}

fn v2_text(f: &V2Files, extra: &str) -> String {
    format!(
        "plugin.security.provider = choria\n\
         plugin.security.choria.token_file = {}\n\
         identity = provisioner_signer\n\
         plugin.choria.middleware_hosts = broker:4222\n{extra}",
        f.dir.join("signer.jwt").display()
    )
}

#[test]
fn choria_provider_setup() {
    let f = v2_files(true, 3600);
    let c = parse(&v2_text(&f, ""));
    assert_eq!(c.caller_id(false, &env()).unwrap(), "up=provisioner_signer");
    assert_eq!(c.seed_file().unwrap(), f.dir.join("signer.key"));
    let s = c
        .client_setup_for(false, Some(&Secret::new("pw")), &env())
        .unwrap();
    assert_eq!(s.version, Version::V2);
    assert_eq!(s.identity.identity, "provisioner_signer");
    assert_eq!(s.identity.caller, "up=provisioner_signer");
    let jwt = std::fs::read_to_string(f.dir.join("signer.jwt")).unwrap();
    match &s.identity.signer {
        RequestSigner::V2 { seed, jwt: j } => {
            assert_eq!(seed.to_bytes(), f.seed.signing_key().to_bytes());
            assert_eq!(j, jwt.trim());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.connect.token.as_deref(), Some(jwt.trim()));
    let (nj, nk) = s.connect.nats_jwt.as_ref().unwrap();
    assert_eq!(nj, jwt.trim());
    assert_eq!(nk.to_bytes(), f.seed.signing_key().to_bytes());
    assert_eq!(
        s.connect.inbox_prefix.as_deref(),
        Some(
            format!(
                "provisioning.reply.{}",
                subjects::caller_hash("up=provisioner_signer")
            )
            .as_str()
        )
    );
    assert_eq!(s.connect.user, Some(("provisioner".into(), "pw".into())));
    // No CA: TLS without verification, as go-choria does, with a warning.
    assert!(s.connect.tls.required && s.connect.tls.insecure_skip_verify);
    assert_eq!(s.warnings.len(), 1);
    assert!(s.warnings[0]
        .to_string()
        .contains("plugin.security.choria.ca: not set"));

    // With a CA and mTLS files.
    let ca = write(&f.dir, "ca.pem", "x");
    let c = parse(&v2_text(
        &f,
        &format!(
            "plugin.security.choria.ca = {}\nplugin.security.choria.certificate = {}\nplugin.security.choria.key = {}\n",
            ca.display(),
            ca.display(),
            ca.display()
        ),
    ));
    let s = c.client_setup_for(false, None, &env()).unwrap();
    assert!(!s.connect.tls.insecure_skip_verify);
    assert_eq!(s.connect.tls.ca_file.as_deref(), Some(ca.as_path()));
    assert!(s.connect.tls.client_cert.is_some());
    assert!(s.warnings.is_empty());
    let e = setup_err(&v2_text(
        &f,
        "plugin.security.choria.ca = /nonexistent/ca.pem\n",
    ));
    assert!(
        e.starts_with("choria.cfg:5: plugin.security.choria.ca: /nonexistent/ca.pem: "),
        "{e}"
    );
    let e = setup_err(&v2_text(
        &f,
        &format!("plugin.security.choria.certificate = {}\n", ca.display()),
    ));
    assert!(
        e.contains("plugin.security.choria.certificate: set without plugin.security.choria.key"),
        "{e}"
    );

    // An explicit seed file, and a seed that does not match the token.
    let other = choria_wire::security::generate_keypair();
    let other_path = write(&f.dir, "other.seed", other.seed_hex());
    let e = setup_err(&v2_text(
        &f,
        &format!(
            "plugin.security.choria.seed_file = {}\n",
            other_path.display()
        ),
    ));
    assert!(
        e.starts_with("choria.cfg:5: plugin.security.choria.seed_file: ")
            && e.contains("does not belong to the token"),
        "{e}"
    );
    let bad = write(&f.dir, "bad.seed", "not hex");
    let e = setup_err(&v2_text(
        &f,
        &format!("plugin.security.choria.seed_file = {}\n", bad.display()),
    ));
    assert!(
        e.contains("is not an ed25519 seed") && !e.contains("not hex\""),
        "{e}"
    );
    std::fs::remove_file(f.dir.join("signer.key")).unwrap();
    let e = c.seed_file().unwrap_err().to_string();
    assert!(
        e.contains("plugin.security.choria.seed_file: not set, and the default")
            && e.contains("signer.key"),
        "{e}"
    );
}

#[test]
fn choria_token_problems() {
    let expired = v2_files(true, -60);
    let e = caller_err(&v2_text(&expired, ""));
    assert!(
        e.starts_with("choria.cfg:2: plugin.security.choria.token_file: ")
            && e.contains("the token expired at"),
        "{e}"
    );

    let prov = v2_files(false, 0);
    let e = caller_err(&v2_text(&prov, ""));
    assert!(
        e.contains("is a \"choria_provisioning\" token, not a client token"),
        "{e}"
    );

    let dir = tempfile::tempdir().unwrap();
    let junk = write(dir.path(), "junk.jwt", "junk");
    let e = caller_err(&format!(
        "plugin.security.provider = choria\nplugin.security.choria.token_file = {}\n",
        junk.display()
    ));
    assert!(e.contains("not a JWT"), "{e}");
    let e = caller_err("plugin.security.provider = choria\n");
    assert_eq!(
        e,
        "choria.cfg: plugin.security.choria.token_file: not set; it is required by this security provider"
    );
}

#[test]
fn unsupported_features_are_errors() {
    let base = "plugin.choria.middleware_hosts = a:4222\n";
    let e = |extra: &str, insecure: bool| {
        parse(&format!("{base}{extra}"))
            .client_setup_for(insecure, None, &env())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        e("plugin.nats.credentials = /x.creds\n", true),
        "choria.cfg:2: plugin.nats.credentials: NATS credentials files are not supported"
    );
    assert!(e("plugin.security.client_anon_tls = true\n", true)
        .starts_with("choria.cfg:2: plugin.security.client_anon_tls: "));
    assert!(e(
        "plugin.choria.security.request_signer.url = https://aaa\n",
        true
    )
    .contains("remote request signers (aaasvc) are not supported"));
    assert!(e(
        "plugin.choria.security.request_signer.service = yes\n",
        true
    )
    .contains("request_signer.service: remote request signers"));
    let f = v2_files(true, 3600);
    let e = setup_err(&v2_text(
        &f,
        "plugin.choria.security.request_signer.token_file = /t\n",
    ));
    assert!(
        e.contains("request_signer.token_file: can not be used with the choria security provider"),
        "{e}"
    );
}

#[test]
fn from_process_environment() {
    let e = Environment::from_process();
    assert!(e.now_unix > 1_600_000_000);
    assert!(e.hostname.is_some());
}
