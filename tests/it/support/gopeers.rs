//! Real go-choria peers for the interop tiers (`tests/interop_go.rs`,
//! `tests/provision_go.rs`): the `$CHORIA_BIN` binary or a loud reason why it
//! is missing, its JWT and key tooling, servers in provisioning mode each in
//! its own UTS namespace, and a nats-server whose TLS certificate a throwaway
//! CA signed (tests/gopeers/RECIPE.md §3).

use choria_wire::protocol::Version;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::peers::{self, Missing};
use super::NatsServer;

// ---------------------------------------------------------------------------
// The real binary, or a loud explanation of why it is missing.
// ---------------------------------------------------------------------------

/// `$CHORIA_BIN` when it names a file; otherwise fails the test under CI
/// or says loudly why it proves nothing and returns `None` (see
/// [`super::peers`]).
pub fn choria_bin(test: &str) -> Option<PathBuf> {
    match peers::file_from_env("CHORIA_BIN") {
        Ok(bin) => {
            assert!(
                is_root(),
                "{test}: CHORIA_BIN is set but this is not root: the real servers need `unshare --uts`"
            );
            Some(bin)
        }
        Err(problem) => Missing {
            test,
            problem,
            unproven: "Interop with go-choria (its servers and CLI)",
            advice: "Build the peer with `scripts/build-go-peers.sh choria natstap` and export\n\
                     CHORIA_BIN=$HOME/.cache/choria-provisioner-rs/bin/choria (scripts/test.sh does both).",
            build_log_var: Some("CHORIA_GO_PEERS_UNAVAILABLE"),
        }
        .skip(),
    }
}

/// `$CHORIA_GO_PROVISIONER_BIN` (the real Go provisioner, built by
/// `scripts/build-go-peers.sh provisioner` from ../shared/peers/go-provisioner)
/// when it names a file; otherwise as [`choria_bin`].
pub fn go_provisioner_bin(test: &str) -> Option<PathBuf> {
    match peers::file_from_env("CHORIA_GO_PROVISIONER_BIN") {
        Ok(bin) => Some(bin),
        Err(problem) => Missing {
            test,
            problem,
            unproven: "Behaviour beside the real Go provisioner",
            advice: "Build it with `scripts/build-go-peers.sh provisioner` (from ../shared/peers/go-provisioner)\n\
                     and export CHORIA_GO_PROVISIONER_BIN=$HOME/.cache/choria-provisioner-rs/bin/choria-go-provisioner\n\
                     (scripts/test.sh does both).",
            build_log_var: Some("CHORIA_GO_PROVISIONER_UNAVAILABLE"),
        }
        .skip(),
    }
}

/// `$CHORIA_ELECTION_CANDIDATE_BIN` (go-choria's election as the Go
/// provisioner runs it) when it names a file; otherwise as [`choria_bin`].
pub fn candidate_bin(test: &str) -> Option<PathBuf> {
    match peers::file_from_env("CHORIA_ELECTION_CANDIDATE_BIN") {
        Ok(bin) => Some(bin),
        Err(problem) => Missing {
            test,
            problem,
            unproven: "Election interop with go-choria's election",
            advice: "Build the peer with `scripts/build-go-peers.sh election-candidate` and export\n\
                     CHORIA_ELECTION_CANDIDATE_BIN=$HOME/.cache/choria-provisioner-rs/bin/choria-election-candidate\n\
                     (scripts/test.sh does both).",
            build_log_var: Some("CHORIA_GO_PEERS_UNAVAILABLE"),
        }
        .skip(),
    }
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs the real `choria` binary synchronously (JWT and key tooling) in `dir`.
pub fn choria_tool(bin: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", bin.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "choria {args:?} failed ({}):\n{text}",
        out.status
    );
    text
}

pub fn openssl(dir: &Path, args: &[&str]) {
    openssl_output(dir, args);
}

/// Runs openssl with `args` in `dir`; what it wrote on stdout.
pub fn openssl_output(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is needed for the interop tests");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Provisioning-JWT signers as the Go tooling makes them: an RSA key pair
/// (`prov-signer-key.pem`, `prov-signer-public.pem`) for v1 and an ed25519 issuer
/// (`issuer.seed`, `issuer.public`, hex without newline) for v2.
pub struct Signers {
    pub rsa_key: PathBuf,
    pub rsa_public: PathBuf,
    pub issuer_seed: PathBuf,
    pub issuer_public: PathBuf,
    pub issuer_public_hex: String,
}

impl Signers {
    /// The key that signs provisioning JWTs of `version`.
    pub fn signing_key(&self, version: Version) -> &Path {
        match version {
            Version::V1 => &self.rsa_key,
            Version::V2 => &self.issuer_seed,
        }
    }

    /// The file that verifies provisioning JWTs of `version`.
    pub fn public_key(&self, version: Version) -> &Path {
        match version {
            Version::V1 => &self.rsa_public,
            Version::V2 => &self.issuer_public,
        }
    }
}

pub fn make_signers(bin: &Path, dir: &Path) -> Signers {
    openssl(dir, &["genrsa", "-out", "prov-signer-key.pem", "2048"]);
    openssl(
        dir,
        &[
            "rsa",
            "-in",
            "prov-signer-key.pem",
            "-pubout",
            "-out",
            "prov-signer-public.pem",
        ],
    );
    choria_tool(bin, dir, &["jwt", "keys", "issuer.seed", "issuer.public"]);
    let issuer_public_hex = std::fs::read_to_string(dir.join("issuer.public")).unwrap();
    assert!(
        is_hex(&issuer_public_hex, 64),
        "issuer.public: {issuer_public_hex:?}"
    );
    Signers {
        rsa_key: dir.join("prov-signer-key.pem"),
        rsa_public: dir.join("prov-signer-public.pem"),
        issuer_seed: dir.join("issuer.seed"),
        issuer_public: dir.join("issuer.public"),
        issuer_public_hex,
    }
}

/// A client JWT for the ed25519 key `public_hex`, issued into `jwt_file` (relative
/// to `dir`) by the real `choria jwt client ... --server-provisioner`, with
/// callerid `provisioner`.
pub fn issue_client_jwt(
    bin: &Path,
    dir: &Path,
    jwt_file: &str,
    public_hex: &str,
    signers: &Signers,
) {
    choria_tool(
        bin,
        dir,
        &[
            "jwt",
            "client",
            jwt_file,
            "provisioner",
            s(&signers.issuer_seed),
            &format!("--public-key={public_hex}"),
            "--server-provisioner",
            "--validity",
            "1h",
        ],
    );
}

pub fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

// ---------------------------------------------------------------------------
// Real go-choria servers in provisioning mode.
// ---------------------------------------------------------------------------

/// A real `choria server run` in provisioning mode, killed (with its whole
/// process group) when dropped, also when an assertion fails.
pub struct GoServer {
    pub identity: String,
    pub dir: PathBuf,
    child: std::process::Child,
}

impl GoServer {
    /// Writes `provisioning.jwt` (made by `choria jwt prov`, expecting `token`)
    /// into `dir` and starts the server there with hostname `identity`.
    pub fn start(
        bin: &Path,
        signers: &Signers,
        dir: &Path,
        identity: &str,
        nats_url: &str,
        version: Version,
        token: &str,
    ) -> GoServer {
        std::fs::create_dir_all(dir).unwrap();
        let jwt_file = dir.join("provisioning.jwt");
        let mut args = vec!["jwt", "prov", s(&jwt_file), s(signers.signing_key(version))];
        args.extend(["--token", token, "--urls", nats_url, "--default"]);
        if version == Version::V2 {
            args.push("--protocol-v2");
        }
        choria_tool(bin, dir, &args);
        Self::start_in(bin, dir, identity)
    }

    /// Starts a server in `dir`, whose `provisioning.jwt` is there already
    /// (made by something else than `choria jwt prov`).
    pub fn start_in(bin: &Path, dir: &Path, identity: &str) -> GoServer {
        // Must exist; its contents are ignored in provisioning mode.
        std::fs::write(dir.join("server.conf"), "loglevel = debug\n").unwrap();
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let script = format!(
            "hostname '{identity}' && exec '{}' server run --config '{}'",
            bin.display(),
            dir.join("server.conf").display()
        );
        // unshare, setpriv, sh and choria exec each other: one PID throughout,
        // whose parent is this test. --pdeathsig kills it should the test
        // process die without running Drop (SIGKILL, Ctrl-C); it survives the
        // execs, including the `restart` action's re-exec.
        let child = Command::new("unshare")
            .args([
                "--uts",
                "setpriv",
                "--pdeathsig",
                "KILL",
                "sh",
                "-c",
                &script,
            ])
            .current_dir(dir) // the binary's ProvisionJWTFile is the relative provisioning.jwt
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("could not start unshare/setpriv (util-linux)");
        GoServer {
            identity: identity.to_string(),
            dir: dir.to_path_buf(),
            child,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn provisioning_jwt(&self) -> String {
        std::fs::read_to_string(self.dir.join("provisioning.jwt")).unwrap()
    }

    /// The server's PID: the same across the `restart` action's re-exec.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the server exited, or `None` while it runs.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().unwrap()
    }
}

impl Drop for GoServer {
    fn drop(&mut self) {
        // The server is the leader of its own process group: kill the group so
        // that nothing it may have started survives, then reap it.
        let pgid = self.child.id();
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{pgid}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// A throwaway CA and a nats-server whose certificate it signed (RECIPE.md §3.a).
// ---------------------------------------------------------------------------

/// A CA made by openssl: `ca.pem` and its key `ca-key.pem` (PKCS#8).
pub struct TestCa {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn create(dir: &Path) -> TestCa {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=Test CA",
            ],
        );
        TestCa {
            cert: dir.join("ca.pem"),
            key: dir.join("ca-key.pem"),
        }
    }

    pub fn cert_pem(&self) -> String {
        std::fs::read_to_string(&self.cert).unwrap()
    }

    /// `<name>-cert.pem` and `<name>-key.pem` in `dir`: a key and a certificate
    /// this CA signed for `cn`, with `cn` and `sans` (`DNS:x`, `IP:y`) as
    /// subject alternative names, which Go checks instead of the CN.
    pub fn issue(&self, dir: &Path, name: &str, cn: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        let (cert, key, csr, ext) = (
            format!("{name}-cert.pem"),
            format!("{name}-key.pem"),
            format!("{name}.csr"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        let mut names = vec![format!("DNS:{cn}")];
        names.extend(sans.iter().map(|s| s.to_string()));
        std::fs::write(
            dir.join(&ext),
            format!("subjectAltName={}\n", names.join(",")),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                s(&self.cert),
                "-CAkey",
                s(&self.key),
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        (dir.join(cert), dir.join(key))
    }
}

/// A nats-server offering TLS (optional, as provisioning-mode servers connect
/// anonymously) with a certificate for 127.0.0.1 that `ca` signed, so that
/// provisioned servers given `ca` connect with verified TLS; and its HTTP
/// monitoring port, whose `/connz` shows each connection's TLS version.
pub struct CaNats {
    pub nats: NatsServer,
    pub ca: TestCa,
    pub monitor_port: u16,
}

impl CaNats {
    /// Makes the CA and the broker's certificate in `dir` and starts the broker.
    pub fn start(dir: &Path) -> CaNats {
        let ca = TestCa::create(dir);
        let (cert, key) = ca.issue(dir, "nats", "localhost", &["IP:127.0.0.1"]);
        let monitor_port = super::free_port();
        let nats = NatsServer::start_with(&format!(
            "http: 127.0.0.1:{monitor_port}\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\nallow_non_tls: true\n",
            cert.display(),
            key.display()
        ));
        CaNats {
            nats,
            ca,
            monitor_port,
        }
    }

    /// The open client connections named `name` in `/connz`, with their
    /// subscriptions (`subscriptions_list`).
    pub fn connections(&self, name: &str) -> Vec<serde_json::Value> {
        super::broker::connz(self.monitor_port, name)
    }
}
