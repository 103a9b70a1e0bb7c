//! Loading and checking both files before anything connects: what `run`
//! verifies first and `run --check` reports.

use crate::provision::day_two::renewal;
use choria_config::{ClientSetup, ConfigError, ProvisionerConfig};

/// Why the provisioner cannot start: a file is missing, malformed or
/// inconsistent. Found before anything connects (`run` and `run --check`).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("the provisioner could not be configured: {0}")]
    Provisioner(#[source] ConfigError),
    #[error("could not load the Choria client configuration: {0}")]
    Choria(#[source] ConfigError),
    #[error("could not set up the Choria client: {0}")]
    Setup(#[source] ConfigError),
    #[error("could not set up renewal's Choria client (renewal.choria_config): {0}")]
    Renewal(#[source] ConfigError),
    #[error("records: {0}")]
    Records(#[source] crate::records::store::RecordsError),
    #[error(transparent)]
    Admission(#[from] crate::admission::PolicyError),
    #[error(transparent)]
    Evidence(#[from] crate::evidence::EvidenceError),
    #[error("could not set up TLS to the broker ({}): {source}", .file.display())]
    Tls {
        file: std::path::PathBuf,
        #[source]
        source: choria_wire::tls::TlsError,
    },
}

/// Both configuration files, loaded and checked: what [`Provisioner::new`]
/// takes.
#[derive(Debug)]
pub struct Prepared {
    pub config: ProvisionerConfig,
    pub setup: ClientSetup,
}

impl Prepared {
    /// Every warning of both files.
    pub fn warnings(&self) -> Vec<choria_config::ConfigWarning> {
        let mut all = self.config.warnings.clone();
        all.extend(self.setup.warnings.iter().cloned());
        all
    }

    /// The effective settings of both files, secrets redacted, as
    /// `key: value` lines under a heading per file.
    pub fn report(&self) -> String {
        let mut out = format!("# {} (effective settings)\n", self.config.file.display());
        for (k, v) in self.config.effective_settings() {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out.push_str("\n# Choria client (how the provisioner connects and signs)\n");
        for (k, v) in self.setup.effective_settings() {
            out.push_str(&format!("{k}: {v}\n"));
        }
        out
    }
}

impl Prepared {
    /// The one line `run` prints when it starts, whatever the log level:
    /// which brokers it provisions on and as whom, how it configures
    /// nodes, where it serves its metrics, and how it waits to work.
    /// Broker URLs are shown without any credentials they carry.
    pub fn start_line(&self, version: &str) -> String {
        use choria_config::election::{ElectionBackend, ElectionMode};
        let cfg = &self.config;
        let brokers: Vec<String> = self
            .setup
            .connect
            .servers
            .iter()
            .map(|u| without_userinfo(u))
            .collect();
        let how = match (cfg.configuration_template.is_some(), cfg.helper.is_empty()) {
            (true, false) => "a configuration template and the helper",
            (true, true) => "a configuration template",
            (false, _) => "the helper",
        };
        let metrics = match cfg.monitor_port {
            Some(p) => format!("/metrics, /healthz and /readyz on port {p}"),
            None => "no metrics (monitor_port unset)".into(),
        };
        let e = &cfg.election;
        let election = match (e.backend, e.mode) {
            (ElectionBackend::None, _) => "no election: working at once".to_string(),
            (b, ElectionMode::Shards) => {
                format!("shards on {}: working once a member", b.as_str())
            }
            (b, ElectionMode::Leader) => {
                format!("{} election: working once elected", b.as_str())
            }
        };
        format!(
            "choria-provisioner {version} starting: on {} (protocol {}, collective {}) as {}; \
             {} workers configuring with {how}; {metrics}; {election}",
            brokers.join(" "),
            self.setup.version,
            self.setup.collective,
            self.setup.identity.identity,
            cfg.workers,
        )
    }
}

/// `url` without the `user:password@` it may carry.
fn without_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    match scheme {
        "" => rest.to_string(),
        s => format!("{s}://{rest}"),
    }
}

/// Loads and checks both files: everything `run` verifies before it
/// connects (the files the settings point at, the helper, the deny list, the
/// TLS credentials). `run --check` is this and a report.
pub fn prepare(
    config: &std::path::Path,
    choria_config: &std::path::Path,
    env: &choria_config::Environment,
) -> Result<Prepared, PrepareError> {
    let cfg = ProvisionerConfig::load(config).map_err(PrepareError::Provisioner)?;
    cfg.helper_command().map_err(PrepareError::Provisioner)?;
    cfg.cert_deny_regexes().map_err(PrepareError::Provisioner)?;
    let ccfg = choria_config::ChoriaClientConfig::load_with(choria_config, env)
        .map_err(PrepareError::Choria)?;
    let setup = ccfg.client_setup(&cfg, env).map_err(PrepareError::Setup)?;
    if let Some(r) = &cfg.renewal {
        renewal::setup(r, cfg.choria_insecure, env).map_err(PrepareError::Renewal)?;
    }
    if let Some(r) = &cfg.records {
        crate::records::store::sealer(r, &cfg.site).map_err(PrepareError::Records)?;
    }
    if let Some(a) = &cfg.admission {
        crate::admission::Policy::load(a)?;
    }
    if let Some(e) = &cfg.evidence {
        crate::evidence::Verifier::load(e)?;
    }
    if setup.connect.tls.is_custom() {
        setup
            .connect
            .tls
            .client_config()
            .map_err(|source| PrepareError::Tls {
                file: ccfg.file.clone(),
                source,
            })?;
    }
    Ok(Prepared { config: cfg, setup })
}

#[cfg(test)]
mod start_line_tests {
    use super::without_userinfo;

    #[test]
    fn broker_credentials_never_reach_the_start_line() {
        assert_eq!(
            without_userinfo("nats://prov:hunter2@broker.example.net:4222"),
            "nats://broker.example.net:4222"
        );
        assert_eq!(without_userinfo("tls://b:4222"), "tls://b:4222");
        assert_eq!(without_userinfo("b:4222"), "b:4222");
    }
}
