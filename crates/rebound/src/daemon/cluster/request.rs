//! The body of `POST /v1/cluster/restore`: a plan and the coordinator's timeouts it
//! changes. Its own module, so the API's route reads it without the cluster code.

use std::time::Duration;

use rebound_coord::{CoordinatorConfig, Plan};
use serde::Deserialize;

/// `POST /v1/cluster/restore`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRestoreRequest {
    pub plan: Plan,
    #[serde(default)]
    pub config: CoordinatorOverrides,
}

/// A timeout a request may not set.
#[derive(Debug, thiserror::Error)]
#[error("config.{name} must be more than 0 and at most 86400 seconds, got {got}")]
pub struct ConfigError {
    name: &'static str,
    got: f64,
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
    pub fn config(&self) -> Result<CoordinatorConfig, ConfigError> {
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
                    return Err(ConfigError { name, got: s });
                }
                *slot = Duration::from_secs_f64(s);
            }
        }
        Ok(c)
    }
}
