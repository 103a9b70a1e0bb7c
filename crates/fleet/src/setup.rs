//! What the fleet makes before it connects: the provisioning JWT its nodes
//! hand out, the RSA keys (and the CSRs signed ahead) of `gencsr`, the
//! journal, and the nodes with their injected failures.

use crate::context::NodeRef;
use crate::journal::Journal;
use crate::node::{Failure, FleetShared, Node};
use crate::{identity_for, FleetError, FleetOptions};
use choria_wire::protocol::Version;
use choria_wire::security::csr::{self, CsrError, CsrSubject, RsaKeyPool};
use choria_wire::security::tokens::{ProvisioningClaims, TokenSigningKey};
use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::{debug, info};

/// The journal's writer task, awaited when the fleet stops.
pub(crate) type JournalWriter = tokio::task::JoinHandle<std::io::Result<()>>;

/// Builds the provisioning JWT the nodes hand out, signed by `--jwt-signer` or by
/// a throwaway ed25519 key whose public half is logged.
pub(crate) fn provisioning_jwt(opts: &FleetOptions) -> Result<String, FleetError> {
    let signer = match &opts.jwt_signer {
        Some(path) => TokenSigningKey::from_file(path).map_err(|e| FleetError::Signer {
            path: path.clone(),
            reason: e.to_string(),
        })?,
        None => {
            let pair = choria_wire::security::ed25519::Ed25519KeyPair::generate();
            info!(
                public_key = %pair.public_hex(),
                "no --jwt-signer given: provisioning JWT signed with a throwaway ed25519 key"
            );
            TokenSigningKey::Ed25519(pair.signing_key().clone())
        }
    };
    let now = chrono::Utc::now().timestamp();
    let mut claims = ProvisioningClaims::new_at(
        &opts.token,
        &opts.broker.nats.join(","),
        "",
        Duration::from_secs(365 * 24 * 3600),
        now,
    )
    .map_err(|e| FleetError::Options(format!("provisioning JWT claims: {e}")))?;
    claims.proto_v2 = opts.protocol == Version::V2;
    claims.allow_update = opts.upgradable;
    signer.sign(&claims).map_err(|e| FleetError::Signer {
        path: opts.jwt_signer.clone().unwrap_or_default(),
        reason: e.to_string(),
    })
}

/// What every node shares: its settings, the provisioning JWT and the keys
/// (and, with `--presign-csrs`, the CSRs) its `gencsr` hands out.
pub(crate) async fn fleet_shared(
    opts: &FleetOptions,
    jwt: &str,
) -> Result<Arc<FleetShared>, FleetError> {
    let pool = Arc::new(key_pool(opts).await?);
    let presigned_csrs = if opts.presign_csrs {
        presign_all(opts, &pool).await?
    } else {
        Vec::new()
    };
    Ok(Arc::new(FleetShared {
        protocol: opts.protocol,
        server_version: opts.server_version.clone(),
        token: opts.token.clone(),
        provisioning_jwt: Some(jwt.to_string()),
        upgradable: opts.upgradable,
        key_pool: pool,
        presigned_csrs,
        config_root: "/etc/choria-fleet".into(),
        facts: opts.facts.clone(),
        evidence: opts
            .evidence
            .as_ref()
            .map(crate::evidence::EvidenceSigner::load)
            .transpose()
            .map_err(FleetError::Evidence)?,
        journal_config_keys: opts.journal_config_keys.clone(),
    }))
}

/// `--key-pool-size` RSA keys (no more than there are nodes), made off the
/// async threads.
async fn key_pool(opts: &FleetOptions) -> Result<RsaKeyPool, FleetError> {
    let pool_size = opts.key_pool_size.clamp(1, opts.nodes.max(1));
    let started = std::time::Instant::now();
    let pool = tokio::task::spawn_blocking(move || RsaKeyPool::generate(pool_size, 2048))
        .await
        .map_err(|e| FleetError::KeyPool(e.to_string()))?
        .map_err(|e| FleetError::KeyPool(e.to_string()))?;
    debug!(keys = pool_size, elapsed = ?started.elapsed(), "RSA key pool ready");
    Ok(pool)
}

/// `--presign-csrs`: every node's default CSR, made off the async threads.
async fn presign_all(
    opts: &FleetOptions,
    pool: &Arc<RsaKeyPool>,
) -> Result<Vec<String>, FleetError> {
    let started = std::time::Instant::now();
    let identities: Vec<String> = (0..opts.nodes).map(|i| identity_for(opts, i)).collect();
    let keys = pool.clone();
    let csrs = tokio::task::spawn_blocking(move || presign_csrs(&keys, &identities))
        .await
        .map_err(|e| FleetError::KeyPool(e.to_string()))?
        .map_err(|e| FleetError::KeyPool(e.to_string()))?;
    info!(csrs = csrs.len(), elapsed = ?started.elapsed(), "CSRs signed ahead (--presign-csrs)");
    Ok(csrs)
}

/// The default-subject CSR (CN = identity) of every node, signed with the
/// node's pool key on one thread per core.
pub(crate) fn presign_csrs(
    pool: &RsaKeyPool,
    identities: &[String],
) -> Result<Vec<String>, CsrError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = identities.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<String>, _>> = std::thread::scope(|scope| {
        let handles: Vec<_> = identities
            .chunks(chunk)
            .enumerate()
            .map(|(c, ids)| {
                scope.spawn(move || {
                    ids.iter()
                        .enumerate()
                        .map(|(j, id)| {
                            csr::make_csr(&pool.get(c * chunk + j), &CsrSubject::new(id.clone()))
                        })
                        .collect::<Result<Vec<String>, _>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a CSR thread panicked"))
            .collect()
    });
    let mut all = Vec::with_capacity(identities.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// Opens `--journal`, or a journal that records nothing.
pub(crate) fn open_journal(
    opts: &FleetOptions,
) -> Result<(Journal, Option<JournalWriter>), FleetError> {
    match &opts.journal {
        Some(path) => {
            let (j, w) = Journal::open(path).map_err(|source| FleetError::Journal {
                path: path.clone(),
                source,
            })?;
            Ok((j, Some(w)))
        }
        None => Ok((Journal::disabled(), None)),
    }
}

/// Assigns injected failures to a deterministic share of nodes.
pub(crate) fn assign_failures(opts: &FleetOptions) -> Vec<Option<Failure>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let n = opts.nodes;
    let mut failures = vec![None; n];
    let mut order: Vec<usize> = (0..n).collect();
    // Fisher-Yates so that failed nodes are spread over the fleet.
    for i in (1..n).rev() {
        let j = rng.gen_range(0..=i);
        order.swap(i, j);
    }
    let mut next = order.into_iter();
    for (share, failure) in [
        (opts.fail_silent, Failure::Silent),
        (opts.fail_error, Failure::ErrorStatus),
        (opts.fail_malformed, Failure::Malformed),
    ] {
        let count = (share * n as f64).round() as usize;
        for idx in next.by_ref().take(count) {
            failures[idx] = Some(failure);
        }
    }
    failures
}

/// The nodes, node `i` with `failures[i]`.
pub(crate) fn make_nodes(
    opts: &FleetOptions,
    failures: &[Option<Failure>],
    shared: &Arc<FleetShared>,
) -> Vec<NodeRef> {
    (0..opts.nodes)
        .map(|i| {
            Arc::new(Mutex::new(Node::new(
                identity_for(opts, i),
                i,
                failures[i],
                shared.clone(),
            )))
        })
        .collect()
}
