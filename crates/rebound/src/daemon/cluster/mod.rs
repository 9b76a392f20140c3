//! This daemon's part in cluster restores: a [`rebound_coord::run::Participant`]
//! over the cluster store, driving this daemon's own VMs ([`cohort::DaemonVms`]),
//! and a publisher of this host's VMs and snapshot catalog ([`publish`]).
//!
//! - With `--etcd URL[,URL...]` the store is etcd, reached with this host's
//!   certificate (`--etcd-ca/--etcd-cert/--etcd-key`); the daemon registers as
//!   `--host NAME` under a lease and takes part in every restore whose plan names
//!   it, coordinating those it is elected for.
//! - Without it the store is in memory: a cluster whose VMs all live on this host
//!   runs the same protocol with no etcd.
//!
//! No other daemon reaches into this one: everything between hosts goes through
//! the store.

pub mod cohort;
pub mod confine;
pub mod publish;
pub mod request;
pub mod side;

pub use request::ClusterRestoreRequest;
pub use side::Cluster;

use std::sync::Arc;
use std::time::Duration;

use rebound_coord::run::{HostConfig, Participant, RunError};
use rebound_store::etcd::{EtcdConfig, EtcdStore};
use rebound_store::mem::MemStore;
use rebound_store::{Store, StoreError};

use super::state::Daemon;

/// How the daemon reaches the cluster store.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `None`: the in-memory store (one host).
    pub etcd: Option<EtcdConfig>,
    /// This host's name in the store.
    pub host: String,
    /// The host lease's TTL.
    pub ttl: Duration,
}

impl Default for ClusterOptions {
    /// The in-memory store, as host `local`.
    fn default() -> Self {
        ClusterOptions {
            etcd: None,
            host: "local".into(),
            ttl: Duration::from_secs(5),
        }
    }
}

/// Why the daemon cannot take part in cluster restores as asked.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot reach the cluster store at {0}")]
    Connect(String, #[source] StoreError),
    #[error(transparent)]
    Run(#[from] RunError),
}

/// The store, connected before the daemon serves, so a wrong endpoint or a refused
/// certificate stops it at once.
pub struct Prepared {
    store: Arc<dyn Store>,
    opts: ClusterOptions,
}

impl Prepared {
    pub async fn new(opts: &ClusterOptions) -> Result<Prepared, ClusterError> {
        rebound_coord::layout::check_host(&opts.host).map_err(RunError::from)?;
        let store: Arc<dyn Store> = match &opts.etcd {
            Some(c) => Arc::new(
                EtcdStore::connect(c)
                    .await
                    .map_err(|e| ClusterError::Connect(c.endpoints.join(","), e))?,
            ),
            None => Arc::new(MemStore::new()),
        };
        Ok(Prepared {
            store,
            opts: opts.clone(),
        })
    }

    /// Registers this host and starts taking part, over `d`'s VMs.
    pub async fn start(self, d: &Arc<Daemon>) -> Result<Cluster, ClusterError> {
        let mut config = HostConfig::new(&self.opts.host);
        config.ttl = self.opts.ttl;
        let participant = Participant::start(
            self.store.clone(),
            config,
            Arc::new(cohort::DaemonVms::new(d)),
        )
        .await?;
        let publisher = publish::spawn(d, self.store.clone(), &self.opts.host);
        match &self.opts.etcd {
            Some(c) => tracing::info!(
                host = %self.opts.host,
                "in the cluster store at {} (lease TTL {:.1} s)",
                c.endpoints.join(","),
                self.opts.ttl.as_secs_f64()
            ),
            None => {
                tracing::info!(host = %self.opts.host, "cluster restores on this host only (in-memory store)")
            }
        }
        Ok(Cluster {
            store: self.store,
            participant,
            publisher,
            shared: self.opts.etcd.is_some(),
        })
    }
}
