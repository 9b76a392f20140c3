//! What the daemon holds of its cluster side once started: its own module, so the
//! daemon's table can hold it without depending on the cluster code that needs the
//! daemon.

use std::sync::Arc;

use rebound_coord::run::Participant;
use rebound_store::Store;

/// The daemon's cluster side, once started.
pub struct Cluster {
    pub store: Arc<dyn Store>,
    pub participant: Participant,
    pub(super) publisher: tokio::task::AbortHandle,
    /// The store is shared with other hosts (etcd), not this daemon's own.
    pub shared: bool,
}

impl Cluster {
    /// Stops taking part (the daemon is exiting; its VMs, held ones included, stay,
    /// and its lease expires unless a new daemon renews its record first).
    pub fn shutdown(&self) {
        self.publisher.abort();
    }
}
