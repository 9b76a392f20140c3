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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rebound_coord::cohort::CohortRestoreStatus;
use rebound_coord::token::TokenError;
use rebound_coord::{ClusterToken, CohortConfig, CohortHandle, CoordinatorConfig, Plan};
use serde::Deserialize;

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

/// The daemon's cluster side, once started.
pub struct Cluster {
    pub token: ClusterToken,
    cohort: Option<CohortHandle>,
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

/// `POST /v1/cluster/restore`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRestoreRequest {
    pub plan: Plan,
    #[serde(default)]
    pub config: CoordinatorOverrides,
}

/// The coordinator's timeouts a request may change, in seconds; the rest keep
/// `rebound-coord`'s defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorOverrides {
    pub connect_s: Option<f64>,
    pub handshake_s: Option<f64>,
    pub retry_s: Option<f64>,
    pub ping_s: Option<f64>,
    pub peer_s: Option<f64>,
    pub load_s: Option<f64>,
    pub start_s: Option<f64>,
    pub restore_s: Option<f64>,
    pub abort_s: Option<f64>,
}

impl CoordinatorOverrides {
    /// The defaults with these changes; each must be a positive number of seconds
    /// of at most a day.
    pub fn config(&self) -> Result<CoordinatorConfig, String> {
        let mut c = CoordinatorConfig::default();
        let fields = [
            ("connect_s", self.connect_s, &mut c.connect),
            ("handshake_s", self.handshake_s, &mut c.handshake),
            ("retry_s", self.retry_s, &mut c.retry),
            ("ping_s", self.ping_s, &mut c.ping),
            ("peer_s", self.peer_s, &mut c.peer),
            ("load_s", self.load_s, &mut c.load),
            ("start_s", self.start_s, &mut c.start),
            ("restore_s", self.restore_s, &mut c.restore),
            ("abort_s", self.abort_s, &mut c.abort),
        ];
        for (name, v, slot) in fields {
            if let Some(s) = v {
                if !(s > 0.0 && s <= 86_400.0) {
                    return Err(format!(
                        "config.{name} must be more than 0 and at most 86400 seconds, got {s}"
                    ));
                }
                *slot = Duration::from_secs_f64(s);
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let e = o.config().unwrap_err();
            assert!(e.contains("config.load_s"), "{e}");
        }
        assert!(serde_json::from_str::<CoordinatorOverrides>(r#"{"lod_s": 1}"#).is_err());
    }
}
