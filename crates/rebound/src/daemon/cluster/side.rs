//! What the daemon holds of its cluster side once started: its own module, so the
//! daemon's table can hold it without depending on the cluster code that needs the
//! daemon.

use rebound_coord::{ClusterToken, CohortHandle};

/// The daemon's cluster side, once started.
pub struct Cluster {
    pub token: ClusterToken,
    pub(super) cohort: Option<CohortHandle>,
}
