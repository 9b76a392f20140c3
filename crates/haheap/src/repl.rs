//! The heap's side of replication: byte diffs (`hareplica::diff_pages`) and the link to the
//! backup (`hareplica::ReplicaClient`), kept behind a small trait so the heap does not care
//! how a commit reaches the backup.

use crate::config::{BackupFailure, HeapConfig, ReplMode};
pub use hareplica::{diff_pages, prefetch_page, DiffRun};
use hareplica::{ClientOptions, Endpoint, OnFailure, ReplicaClient};

/// Errors of replication.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    /// The endpoint string does not parse.
    #[error("bad backup endpoint")]
    Endpoint(#[source] hareplica::endpoint::EndpointError),
    /// Connecting to or attaching at the backup failed.
    #[error("cannot open replication to the backup")]
    Connect(#[source] hareplica::Error),
    /// The transaction is queued for the backup but not acknowledged; `tend` again waits for it.
    #[error("transaction {tx} is queued but the backup has not acknowledged it; call tend again to wait")]
    InDoubt {
        tx: u64,
        #[source]
        source: hareplica::Error,
    },
    /// The transaction never left this process (the client refused it).
    #[error("the replication client refused transaction {tx}")]
    Refused {
        tx: u64,
        #[source]
        source: hareplica::Error,
    },
    /// Waiting for acknowledgements failed.
    #[error("waiting for the backup's acknowledgements failed")]
    Flush(#[source] hareplica::Error),
}

impl ReplError {
    /// The backup's message when it refused because this primary was fenced.
    pub fn fenced(&self) -> Option<&str> {
        let source = match self {
            ReplError::Endpoint(_) => return None,
            ReplError::Connect(s) | ReplError::Flush(s) => s,
            ReplError::InDoubt { source, .. } | ReplError::Refused { source, .. } => source,
        };
        match source {
            hareplica::Error::Fenced(why) => Some(why),
            _ => None,
        }
    }
}

/// Where committed transactions go.
pub trait Replicator: Send {
    /// Queues and sends one transaction's runs (contents read from `heap`); returns bytes
    /// sent. Called again with the same `tx_id` after `InDoubt`, it gets that one resent.
    fn send(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, ReplError>;
    /// Streams a first part of transaction `tx_id` (the rest follows with `send`). An
    /// error leaves nothing queued.
    fn send_part(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, ReplError>;
    /// Waits for the backup as the mode says (sync: every sent transaction acknowledged).
    fn wait(&mut self, tx_id: u64) -> Result<(), ReplError>;
    /// Waits until every shipped transaction is acknowledged.
    fn flush(&mut self) -> Result<(), ReplError>;
}

/// Whether `tx_id` made it into the client's queue: unacknowledged transactions are kept
/// in order after the last acknowledged one.
fn classify(c: &ReplicaClient, tx_id: u64, source: hareplica::Error) -> ReplError {
    if c.last_acked() + c.unacked() as u64 >= tx_id {
        ReplError::InDoubt { tx: tx_id, source }
    } else {
        ReplError::Refused { tx: tx_id, source }
    }
}

impl Replicator for ReplicaClient {
    fn send(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, ReplError> {
        ReplicaClient::send(self, tx_id, runs, heap).map_err(|e| classify(self, tx_id, e))
    }

    fn send_part(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, ReplError> {
        ReplicaClient::send_part(self, tx_id, runs, heap)
            .map_err(|source| ReplError::Refused { tx: tx_id, source })
    }

    fn wait(&mut self, tx_id: u64) -> Result<(), ReplError> {
        ReplicaClient::wait(self).map_err(|e| classify(self, tx_id, e))
    }

    fn flush(&mut self) -> Result<(), ReplError> {
        ReplicaClient::flush(self).map_err(ReplError::Flush)
    }
}

fn options(cfg: &HeapConfig) -> ClientOptions {
    let mut o = ClientOptions::new(match cfg.mode {
        ReplMode::Sync => hareplica::Mode::Sync,
        ReplMode::Async { max_lag } => hareplica::Mode::Async { max_lag },
    });
    o.on_failure = match cfg.on_backup_failure {
        BackupFailure::Fail => OnFailure::Fail,
        BackupFailure::Block { timeout } => {
            // hareplica counts attempts: the first one is immediate, the rest a delay apart.
            let delay = BackupFailure::RETRY_DELAY;
            let waits = timeout.as_nanos().div_ceil(delay.as_nanos());
            OnFailure::Reconnect {
                attempts: u32::try_from(waits + 1).unwrap_or(u32::MAX),
                delay,
            }
        }
    };
    o.spin = cfg.spin;
    o
}

/// Connects to a backup for a fresh heap of `heap_size` bytes, as `cfg` says.
pub fn connect(
    endpoint: &str,
    heap_size: u64,
    cfg: &HeapConfig,
) -> Result<Box<dyn Replicator>, ReplError> {
    let ep: Endpoint = endpoint.parse().map_err(ReplError::Endpoint)?;
    let client =
        ReplicaClient::connect_with(&ep, heap_size, options(cfg)).map_err(ReplError::Connect)?;
    Ok(Box::new(client))
}

/// A takeover's result: the client, the committed image, the last committed tx id.
pub type Attached = (Box<dyn Replicator>, Vec<u8>, u64);

/// Attaches to a backup's replica for takeover, as `cfg` says.
pub fn attach(endpoint: &str, cfg: &HeapConfig) -> Result<Attached, ReplError> {
    let ep: Endpoint = endpoint.parse().map_err(ReplError::Endpoint)?;
    let (client, image, last_tx) =
        ReplicaClient::attach_with(&ep, options(cfg)).map_err(ReplError::Connect)?;
    Ok((Box::new(client), image, last_tx))
}
