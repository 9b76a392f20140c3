//! Cluster restore across daemons: this daemon's part in `rebound-coord`.
//!
//! - With `--cluster-token FILE` the daemon holds the cluster token and can
//!   coordinate a restore (`POST /v1/cluster/restore` runs
//!   [`rebound_coord::restore`] here).
//! - With `--listen ADDR:PORT` as well, it serves the cohort side on that TCP
//!   address: the restore protocol driving its own VMs ([`cohort::DaemonVms`]), and
//!   the API relay ([`relay::DaemonApi`]) that passes authenticated calls to its own
//!   HTTP router. Without a token nothing listens on TCP.
//!
//! Both talk to the daemon in-process, not over its socket. They hold the daemon
//! weakly: the cohort lives inside the daemon and must not keep it alive.

pub mod cohort;
pub mod confine;
pub mod relay;
pub mod request;
pub mod side;

pub use request::{ClusterRestoreRequest, CoordinatorOverrides};
pub use side::Cluster;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rebound_coord::cohort::CohortRestoreStatus;
use rebound_coord::token::TokenError;
use rebound_coord::{ClusterToken, CohortConfig};

use super::state::Daemon;

/// How the daemon takes part in cluster restores (`rebound daemon --cluster-token`).
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The cluster token file (mode 600, at least 32 bytes).
    pub token: PathBuf,
    /// Serve the cohort side (restores and the API relay) here.
    pub listen: Option<SocketAddr>,
    /// Held VMs of a restore are dropped after this long without word from its
    /// coordinator.
    pub hold_timeout: Duration,
}

/// Why the daemon cannot take part in cluster restores as asked.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot use the cluster token")]
    Token(#[from] TokenError),
    #[error("cannot listen for cluster peers on {0}")]
    Listen(SocketAddr, #[source] std::io::Error),
}

/// The token and, when asked to listen, the bound listener: done before the daemon
/// serves, so a bad token file or a taken port stops it at once.
pub struct Prepared {
    token: ClusterToken,
    listener: Option<tokio::net::TcpListener>,
    hold_timeout: Duration,
}

impl Prepared {
    pub async fn new(opts: &ClusterOptions) -> Result<Prepared, ClusterError> {
        let token = ClusterToken::from_file(&opts.token)?;
        let listener = match opts.listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| ClusterError::Listen(addr, e))?,
            ),
            None => None,
        };
        Ok(Prepared {
            token,
            listener,
            hold_timeout: opts.hold_timeout,
        })
    }

    /// Starts the cohort (if listening) over `d`'s VMs and API.
    pub fn start(self, d: &Arc<Daemon>) -> Result<Cluster, ClusterError> {
        let cohort = match self.listener {
            Some(l) => {
                let addr = l
                    .local_addr()
                    .map_err(|e| ClusterError::Listen(SocketAddr::from(([0, 0, 0, 0], 0)), e))?;
                let config = CohortConfig {
                    hold_timeout: self.hold_timeout,
                    ..CohortConfig::default()
                };
                let h = rebound_coord::spawn_cohort_with_api(
                    l,
                    self.token.clone(),
                    Arc::new(cohort::DaemonVms::new(d)),
                    Arc::new(relay::DaemonApi::new(d)),
                    config,
                )
                .map_err(|e| ClusterError::Listen(addr, e))?;
                tracing::info!(
                    "cluster cohort on {addr} (hold timeout {:.1} s)",
                    self.hold_timeout.as_secs_f64()
                );
                Some(h)
            }
            None => {
                tracing::info!("cluster token loaded: this daemon can coordinate restores");
                None
            }
        };
        Ok(Cluster {
            token: self.token,
            cohort,
        })
    }
}

impl Cluster {
    /// Whether this daemon serves the cohort side.
    pub fn is_cohort(&self) -> bool {
        self.cohort.is_some()
    }

    /// A restore as this daemon's cohort saw it (including why it aborted).
    pub fn cohort_status(&self, restore_id: &str) -> Option<CohortRestoreStatus> {
        self.cohort.as_ref()?.status(restore_id)
    }

    /// Stops the cohort (the daemon is exiting; held VMs stay, as every VM does).
    pub fn shutdown(&self) {
        if let Some(c) = &self.cohort {
            c.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_coord::CoordinatorConfig;

    #[test]
    fn overrides_change_only_what_they_name_and_refuse_nonsense() {
        let o: CoordinatorOverrides =
            serde_json::from_str(r#"{"peer_s": 2.5, "ping_s": 0.2}"#).unwrap();
        let c = o.config().unwrap();
        assert_eq!(c.peer, Duration::from_millis(2500));
        assert_eq!(c.ping, Duration::from_millis(200));
        assert_eq!(c.load, CoordinatorConfig::default().load);
        for bad in [
            r#"{"load_s": 0}"#,
            r#"{"load_s": -1}"#,
            r#"{"load_s": 1e9}"#,
        ] {
            let o: CoordinatorOverrides = serde_json::from_str(bad).unwrap();
            let e = o.config().unwrap_err().to_string();
            assert!(e.contains("config.load_s"), "{e}");
        }
        assert!(serde_json::from_str::<CoordinatorOverrides>(r#"{"lod_s": 1}"#).is_err());
    }
}
