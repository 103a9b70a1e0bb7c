use super::*;
use choria_wire::security::tokens::{ProvisioningClaims, ServerClaims};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Writes an executable `#!/bin/sh` script into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// A helper running `body` through `/bin/sh`. Tests run scripts via the
/// shell rather than exec'ing them: another test thread forking while a
/// script is still open for writing would make exec fail with ETXTBSY.
fn helper(dir: &Path, body: &str) -> Helper {
    let path = script(dir, "helper.sh", body);
    Helper::new(vec!["/bin/sh".into(), path.display().to_string()])
}

fn input() -> HelperInput<'static> {
    HelperInput {
        identity: "n1.example.net",
        csr: None,
        ed25519_pubkey: None,
        inventory: "{}",
        jwt: None,
    }
}

async fn run(dir: &Path, body: &str) -> Result<HelperResponse, HelperError> {
    helper(dir, body).run(&input()).await
}

fn provisioning_claims() -> ProvisioningClaims {
    // The example input in the Go provisioner's helper documentation.
    let mut c = ProvisioningClaims {
        token: "s3cret".into(),
        urls: "nats://broker.choria.local:4222".into(),
        prov_default: true,
        organization_unit: "choria".into(),
        proto_v2: true,
        ..Default::default()
    };
    c.standard.purpose = "choria_provisioning".into();
    c.standard.issuer = "Choria Tokens Package v0.26.2".into();
    c.standard.subject = "choria_provisioning".into();
    c.standard.not_before = Some(1669809657);
    c.standard.issued_at = Some(1669809657);
    c.standard.id = "3a4f9896e013498daeedbcb9a82fcd3c".into();
    c
}

#[test]
fn input_is_go_json() {
    let csr = CsrReply {
        csr: "-----BEGIN CERTIFICATE REQUEST-----\nMII=\n".into(),
        public_key: "pk".into(),
        ssldir: "/etc/choria/ssl".into(),
    };
    let ed = Ed25519Reply {
        public_key: "2ddc".into(),
        directory: "/etc/choria".into(),
        signature: "34c5".into(),
    };
    let jwt = provisioning_claims();
    let full = HelperInput {
        identity: "n1.example.net",
        csr: Some(&csr),
        ed25519_pubkey: Some(&ed),
        inventory: r#"{"facts":{"a":"<b>&"},"version":"0.99.0"}"#,
        jwt: Some(&jwt),
    };
    let want = concat!(
        r#"{"identity":"n1.example.net","#,
        r#""csr":{"csr":"-----BEGIN CERTIFICATE REQUEST-----\nMII=\n","public_key":"pk","ssldir":"/etc/choria/ssl"},"#,
        r#""ed25519_pubkey":{"public_key":"2ddc","directory":"/etc/choria","signature":"34c5"},"#,
        r#""inventory":"{\"facts\":{\"a\":\"\u003cb\u003e\u0026\"},\"version\":\"0.99.0\"}","#,
        r#""jwt":{"cht":"s3cret","chs":false,"chu":"nats://broker.choria.local:4222","chpd":true,"#,
        r#""extensions":null,"ou":"choria","v2":true,"purpose":"choria_provisioning","#,
        r#""iss":"Choria Tokens Package v0.26.2","sub":"choria_provisioning","#,
        r#""nbf":1669809657,"iat":1669809657,"jti":"3a4f9896e013498daeedbcb9a82fcd3c"}}"#,
    );
    assert_eq!(String::from_utf8(full.to_json()).unwrap(), want);

    let bare = String::from_utf8(input().to_json()).unwrap();
    assert_eq!(
        bare,
        r#"{"identity":"n1.example.net","csr":null,"ed25519_pubkey":null,"inventory":"{}","jwt":null}"#
    );
}

#[test]
fn jwt_extensions_and_expiry_serialize_like_go() {
    let mut jwt = provisioning_claims();
    let ext = serde_json::json!({"z": 1.0, "a": "x<y", "n": [2.5, 3]});
    jwt.extensions = Some(ext.as_object().unwrap().clone());
    jwt.standard.expires_at = Some(1700000000);
    jwt.standard.audience = vec!["choria".into()];
    let input = HelperInput {
        jwt: Some(&jwt),
        ..input()
    };
    let json = String::from_utf8(input.to_json()).unwrap();
    assert!(
        json.contains(r#""extensions":{"a":"x\u003cy","n":[2.5,3],"z":1},"#),
        "{json}"
    );
    assert!(
        json.contains(r#""sub":"choria_provisioning","aud":["choria"],"exp":1700000000,"nbf":"#),
        "{json}"
    );
}

#[tokio::test]
async fn decodes_a_full_response() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"cat >/dev/null
cat <<'EOF'
{"defer":false,"shutdown":false,"msg":"Done","key":"KEY","certificate":"CERT","ca":"CA",
 "ssldir":"/etc/choria/ssl",
 "server_claims":{"ou":"acme","exp":1900000000,"collectives":["c1","c2"],
   "pub_subjects":["x.>"],"permissions":{"streams":true,"submission":true},"unknown":1},
 "configuration":{"identity":"n1.example.net","plugin.choria.server.provision":"false"},
 "action_policies":{"rpcutil":"policy default allow"},
 "opa_policies":{"default":"package choria"},
 "upgrade":"0.29.0","extra":{"ignored":[1,2]}}
EOF"#;
    let r = run(dir.path(), body).await.unwrap();
    assert!(!r.defer && !r.shutdown);
    assert_eq!(
        (
            &*r.msg,
            &*r.key,
            &*r.certificate,
            &*r.ca,
            &*r.ssldir,
            &*r.upgrade
        ),
        ("Done", "KEY", "CERT", "CA", "/etc/choria/ssl", "0.29.0")
    );
    let claims = r.server_claims.as_ref().unwrap();
    assert_eq!(claims.organization_unit, "acme");
    assert_eq!(claims.standard.expires_at, Some(1900000000));
    assert_eq!(claims.collectives, ["c1", "c2"]);
    assert_eq!(claims.additional_publish_subjects, ["x.>"]);
    let perms = claims.permissions.unwrap();
    assert!(perms.streams && perms.submission && !perms.governor);
    assert_eq!(r.configuration["plugin.choria.server.provision"], "false");
    assert_eq!(r.configuration.len(), 2);
    assert_eq!(r.action_policies["rpcutil"], "policy default allow");
    assert_eq!(r.opa_policies["default"], "package choria");
}

#[tokio::test]
async fn sends_the_input_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("input.json");
    let h = helper(
        dir.path(),
        &format!("cat > '{}'\necho '{{\"msg\":\"ok\"}}'", saved.display()),
    );
    let jwt = provisioning_claims();
    let input = HelperInput {
        jwt: Some(&jwt),
        ..input()
    };
    assert_eq!(h.run(&input).await.unwrap().msg, "ok");
    assert_eq!(std::fs::read(&saved).unwrap(), input.to_json());
}

#[tokio::test]
async fn execs_the_helper_directly() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "h.sh",
        r#"cat >/dev/null; echo '{"msg":"direct"}'"#,
    );
    let h = Helper::new(vec![path.display().to_string()]);
    // See `helper`: a concurrent fork can briefly keep the new script
    // open for writing, so retry a few times on ETXTBSY.
    for _ in 0..50 {
        match h.run(&input()).await {
            Err(HelperError::Spawn { source, .. }) if source.raw_os_error() == Some(26) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => {
                assert_eq!(other.unwrap().msg, "direct");
                return;
            }
        }
    }
    panic!("the script stayed busy");
}

#[tokio::test]
async fn large_input_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    // The helper prints 900 KB (more than a pipe holds) before it reads a
    // 4 MiB input: both pipes must be serviced at once.
    let inventory = "x".repeat(4 << 20);
    let input = HelperInput {
        inventory: &inventory,
        ..input()
    };
    let body =
        "printf '{\"msg\":\"'; head -c 900000 /dev/zero | tr '\\0' y; printf '\"}'; cat >/dev/null";
    let r = helper(dir.path(), body).run(&input).await.unwrap();
    assert!(r.configuration.is_empty());
    assert_eq!(r.msg.len(), 900_000);
}

#[tokio::test]
async fn helper_that_ignores_its_input_still_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = "x".repeat(1 << 20);
    let input = HelperInput {
        inventory: &inventory,
        ..input()
    };
    let r = helper(dir.path(), r#"exec 0<&-; echo '{"msg":"early"}'"#)
        .run(&input)
        .await
        .unwrap();
    assert_eq!(r.msg, "early");
}

#[tokio::test]
async fn empty_output_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = run(dir.path(), "cat >/dev/null; echo 'nothing to say' >&2")
        .await
        .unwrap_err();
    assert!(matches!(err, HelperError::EmptyOutput { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("helper.sh exited successfully but printed nothing: nothing to say"),
        "{msg}"
    );
}

#[tokio::test]
async fn garbage_output_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = run(dir.path(), "echo 'not json'").await.unwrap_err();
    assert!(matches!(err, HelperError::Decode { .. }), "{err:?}");
    assert!(
        err.to_string().contains("printed an invalid response"),
        "{err}"
    );

    // Go rejects anything after the top-level value too.
    let err = run(dir.path(), r#"echo '{"msg":"a"} {}'"#)
        .await
        .unwrap_err();
    assert!(matches!(err, HelperError::Decode { .. }), "{err:?}");

    let err = run(dir.path(), r#"echo '["msg"]'"#).await.unwrap_err();
    assert!(matches!(err, HelperError::Decode { .. }), "{err:?}");
}

#[tokio::test]
async fn non_zero_exit_reports_status_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let err = run(
        dir.path(),
        r#"echo '{"msg":"ignored"}'; echo first >&2; echo 'the CA is down' >&2; exit 3"#,
    )
    .await
    .unwrap_err();
    let HelperError::Exit {
        status,
        stderr_tail,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(status.code(), Some(3));
    assert_eq!(stderr_tail, "first\nthe CA is down\n");
    let msg = err.to_string();
    assert!(msg.starts_with("helper /bin/sh "), "{msg}");
    assert!(
        msg.ends_with("helper.sh exited with status 3: the CA is down"),
        "{msg}"
    );
}

#[tokio::test]
async fn stderr_keeps_only_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"i=0; while [ $i -lt 500 ]; do echo "line $i" >&2; i=$((i+1)); done; exit 1"#;
    let Err(HelperError::Exit { stderr_tail, .. }) = run(dir.path(), body).await else {
        panic!("expected an exit error");
    };
    assert!(stderr_tail.len() <= STDERR_TAIL);
    assert!(stderr_tail.ends_with("line 499\n"), "{stderr_tail}");
    assert!(!stderr_tail.contains("line 0\n"));
}

/// How long the helpers below may run before they are killed. They write
/// their pid file first: a fork, an echo and a rename, measured here at
/// 10 ms median, 65 ms at most over 100 runs with a load average of 10 on 2
/// cores; a helper killed before it wrote the file fails the test by name
/// rather than passing on nothing.
const KILLED_AFTER: Duration = Duration::from_secs(1);

/// A shell fragment writing `what` ($$ or $!) to `file` at once: written to
/// a temporary name and renamed, so the file never exists half written.
fn write_pid(what: &str, file: &Path) -> String {
    format!(
        "echo {what} > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        file.display()
    )
}

/// The pid a helper wrote to `file`; fails when it never did.
fn read_pid(file: &Path) -> String {
    let pid = std::fs::read_to_string(file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: the helper was killed before it wrote its pid (KILLED_AFTER is too short here)",
            file.display()
        )
    });
    assert!(
        pid.trim().parse::<u32>().is_ok(),
        "{}: {pid:?} is not a pid",
        file.display()
    );
    pid
}

#[tokio::test]
async fn timeout_kills_the_helper_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // Left alone it would run 30 s.
    let h = helper(
        dir.path(),
        &format!("{}; sleep 30", write_pid("$$", &pid_file)),
    )
    .with_timeout(KILLED_AFTER);
    let started = Instant::now();
    let err = h.run(&input()).await.unwrap_err();
    // Killed at the timeout, not when the helper would have ended (30 s
    // later): a third of that is room enough for any scheduling delay.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(err, HelperError::Timeout { .. }), "{err:?}");
    assert!(
        err.to_string().contains("did not finish within 1s"),
        "{err}"
    );

    // The helper was killed and reaped before run() returned: no process,
    // not even a zombie.
    let pid = read_pid(&pid_file);
    let proc_dir = format!("/proc/{}", pid.trim());
    assert!(!Path::new(&proc_dir).exists(), "{proc_dir} still exists");
}

/// Whether a process runs (a zombie counts as gone: it holds nothing).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .map(|stat| {
            // state is the field after "(comm)"
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

fn wait_gone(pid: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[tokio::test]
async fn a_timed_out_helper_takes_its_children_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let child_pid = dir.path().join("child");
    // The helper forks a child that would outlive it, then hangs itself.
    let h = helper(
        dir.path(),
        &format!("sleep 300 & {}; sleep 300", write_pid("$!", &child_pid)),
    )
    .with_timeout(KILLED_AFTER);
    let err = h.run(&input()).await.unwrap_err();
    assert!(matches!(err, HelperError::Timeout { .. }), "{err:?}");
    let pid = read_pid(&child_pid);
    assert!(wait_gone(&pid), "the helper's child {pid} still runs");
}

#[tokio::test]
async fn a_helper_that_leaves_a_child_behind_still_answers_and_the_child_goes() {
    let dir = tempfile::tempdir().unwrap();
    let child_pid = dir.path().join("child");
    // The background child must not hold stdout open, or we would wait for it.
    let h = helper(
        dir.path(),
        &format!(
            "sleep 300 >/dev/null 2>&1 & {}; echo '{{\"configuration\":{{\"a\":\"b\"}}}}'",
            write_pid("$!", &child_pid)
        ),
    );
    let r = h.run(&input()).await.unwrap();
    assert_eq!(r.configuration.get("a").map(String::as_str), Some("b"));
    let pid = read_pid(&child_pid);
    assert!(wait_gone(&pid), "the helper's child {pid} still runs");
}

#[tokio::test]
async fn output_beyond_the_cap_is_an_error_and_stops_the_helper() {
    let dir = tempfile::tempdir().unwrap();
    let h = helper(dir.path(), "yes '{\"configuration\":{}}'");
    let started = Instant::now();
    let err = h.run(&input()).await.unwrap_err();
    assert!(matches!(err, HelperError::OutputTooLarge { .. }), "{err:?}");
    assert!(err.to_string().contains("1048576 bytes"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn the_quoted_stderr_line_is_short_and_has_no_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    // Longer than the quoted line, shorter than the stderr tail kept.
    let long = "x".repeat(1500);
    let h = helper(
        dir.path(),
        &format!("printf 'evil\\033[31m\\rforged log line {long}\\n' >&2; exit 3"),
    );
    let err = h.run(&input()).await.unwrap_err().to_string();
    assert!(err.contains("exited with status 3"), "{err}");
    assert!(!err.chars().any(|c| c.is_control()), "{err:?}");
    assert!(err.contains("evil[31mforged log line"), "{err}");
    assert!(err.len() < 600, "{} bytes: {err}", err.len());
}

#[tokio::test]
async fn spawn_failure_names_the_command() {
    let h = Helper::new(vec![
        "/nonexistent/helper".into(),
        "--arg with space".into(),
    ]);
    let err = h.run(&input()).await.unwrap_err();
    assert!(matches!(err, HelperError::Spawn { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("could not start helper /nonexistent/helper '--arg with space': "),
        "{msg}"
    );

    let err = Helper::new(vec![]).run(&input()).await.unwrap_err();
    assert!(matches!(err, HelperError::Spawn { .. }), "{err:?}");
}

#[tokio::test]
async fn example_helper_follows_the_contract() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/helper.sh");
    let h = Helper::new(vec!["/bin/sh".into(), example.display().to_string()]);
    let r = h.run(&input()).await.unwrap();
    assert!(!r.defer && !r.shutdown);
    assert_eq!(r.configuration["identity"], "n1.example.net");
    assert_eq!(r.configuration["plugin.choria.server.provision"], "false");
    assert!(r.configuration["plugin.choria.middleware_hosts"].contains("://"));
}

#[test]
fn nulls_decode_to_defaults() {
    let r = HelperResponse::from_json(
        br#"{"defer":null,"shutdown":null,"msg":null,"key":null,"certificate":null,
            "ca":null,"ssldir":null,"server_claims":null,"configuration":null,
            "action_policies":null,"opa_policies":null,"upgrade":null}"#,
    )
    .unwrap();
    assert!(!r.defer && !r.shutdown && r.msg.is_empty() && r.key.is_empty());
    assert!(r.server_claims.is_none() && r.configuration.is_empty());

    // A bare null decodes without error in Go as well.
    let r = HelperResponse::from_json(b"null").unwrap();
    assert!(r.upgrade.is_empty());

    // A null inside a map is an empty string, as Go stores the zero value.
    let r = HelperResponse::from_json(br#"{"configuration":{"a":null,"b":"1"}}"#).unwrap();
    assert_eq!(r.configuration["a"], "");
    assert_eq!(r.configuration["b"], "1");

    let r = HelperResponse::from_json(br#"{"server_claims":{}}"#).unwrap();
    assert_eq!(r.server_claims, Some(ServerClaims::default()));
}

#[test]
fn keys_match_case_insensitively_and_repeats_apply_in_order() {
    let r = HelperResponse::from_json(
        "{\"Defer\":true,\"MSG\":\"x\",\"\u{212A}ey\":\"k\",\"defer\":null,\"Configuration\":{\"a\":\"1\"},\"configuration\":{\"b\":\"2\"}}"
            .as_bytes(),
    )
    .unwrap();
    assert!(r.defer);
    assert_eq!(r.msg, "x");
    assert_eq!(r.key, "k");
    assert_eq!(r.configuration.len(), 2);

    let r = HelperResponse::from_json(br#"{"upgrade":"1","upgrade":"2"}"#).unwrap();
    assert_eq!(r.upgrade, "2");
}

#[test]
fn non_string_configuration_values_are_errors() {
    for (json, want) in [
        (
            r#"{"configuration":{"loglevel":"info","rpcauthorization":0}}"#,
            r#"configuration["rpcauthorization"] must be a string, not a number"#,
        ),
        (
            r#"{"configuration":{"plugin.choria.server.provision":false}}"#,
            r#"configuration["plugin.choria.server.provision"] must be a string, not a boolean"#,
        ),
        (
            r#"{"opa_policies":{"default":["x"]}}"#,
            r#"opa_policies["default"] must be a string, not an array"#,
        ),
    ] {
        let err = HelperResponse::from_json(json.as_bytes()).unwrap_err();
        assert!(err.to_string().starts_with(want), "{err}");
    }

    for json in [
        r#"{"defer":"yes"}"#,
        r#"{"msg":1}"#,
        r#"{"configuration":"a=b"}"#,
    ] {
        assert!(
            HelperResponse::from_json(json.as_bytes()).is_err(),
            "{json}"
        );
    }
}

#[test]
fn invalid_utf8_in_strings_is_replaced() {
    let r = HelperResponse::from_json(b"{\"msg\":\"a\xffb\"}").unwrap();
    assert_eq!(r.msg, "a\u{FFFD}b");
}

#[test]
fn debug_redacts_the_key_and_configuration_values() {
    let mut r = HelperResponse {
        key: "-----BEGIN RSA PRIVATE KEY-----\nSECRETKEY".into(),
        msg: "hello".into(),
        ..Default::default()
    };
    r.configuration
        .insert("plugin.nats.pass".into(), "hunter2".into());
    let debug = format!("{r:?}");
    assert!(
        !debug.contains("SECRETKEY") && !debug.contains("hunter2"),
        "{debug}"
    );
    assert!(
        debug.contains("<redacted>") && debug.contains("plugin.nats.pass"),
        "{debug}"
    );
    assert!(debug.contains("hello"), "{debug}");
}
