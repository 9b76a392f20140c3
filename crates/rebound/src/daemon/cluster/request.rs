//! The body of `POST /v1/cluster/restore`: a plan and, optionally, its phase
//! timeouts. Its own module, so the API's route reads it without the cluster code.

use rebound_coord::records::Timeouts;
use rebound_coord::Plan;
use serde::Deserialize;

/// `POST /v1/cluster/restore`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRestoreRequest {
    pub plan: Plan,
    #[serde(default)]
    pub timeouts: Timeouts,
}
