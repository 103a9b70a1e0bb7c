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
