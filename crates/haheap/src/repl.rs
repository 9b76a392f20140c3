//! The heap's side of replication: byte diffs and the backup connection.
//!
//! Kept behind a small trait so the heap does not care how a commit reaches the backup.
//! Until the `hareplica` crate's client lands this module carries its own diff with the
//! same contract and refuses backups with a clear error.

use crate::config::ReplMode;

/// Errors of replication.
#[derive(Debug, thiserror::Error)]
pub enum ReplError {
    /// This build has no replication client.
    #[error("replication to {0:?} is not available in this build (hareplica client not linked)")]
    NotLinked(String),
}

/// A byte range of the heap whose contents changed in a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffRun {
    /// Byte offset from the start of the heap.
    pub offset: u64,
    /// Length in bytes (never zero).
    pub len: u32,
}

/// Runs separated by fewer equal bytes than this are merged (contract with hareplica).
const MERGE_GAP: u64 = 16;

/// Appends the runs where `current` differs from `shadow` inside `pages` (ascending).
pub fn diff_pages(
    shadow: &[u8],
    current: &[u8],
    pages: &[usize],
    page_size: usize,
    out: &mut Vec<DiffRun>,
) {
    for &p in pages {
        let base = p * page_size;
        let (a, b) = (
            &shadow[base..base + page_size],
            &current[base..base + page_size],
        );
        for (i, (aw, bw)) in a.chunks_exact(8).zip(b.chunks_exact(8)).enumerate() {
            let x = u64::from_le_bytes(aw.try_into().unwrap_or_default())
                ^ u64::from_le_bytes(bw.try_into().unwrap_or_default());
            if x == 0 {
                continue;
            }
            let word = (base + i * 8) as u64;
            let first = word + u64::from(x.trailing_zeros() / 8);
            let last = word + 8 - u64::from(x.leading_zeros() / 8);
            match out.last_mut() {
                Some(prev)
                    if first >= prev.offset + u64::from(prev.len)
                        && first - (prev.offset + u64::from(prev.len)) < MERGE_GAP =>
                {
                    prev.len = (last - prev.offset) as u32;
                }
                _ => out.push(DiffRun {
                    offset: first,
                    len: (last - first) as u32,
                }),
            }
        }
    }
}

/// A takeover's result: the client, the committed image, the last committed tx id.
pub type Attached = (Box<dyn Replicator>, Vec<u8>, u64);

/// Where committed transactions go.
pub trait Replicator: Send {
    /// Ships one transaction's runs (contents read from `heap`); returns bytes sent.
    fn commit(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, ReplError>;
    /// Waits until every shipped transaction is acknowledged.
    fn flush(&mut self) -> Result<(), ReplError>;
}

/// Connects to a backup for a fresh heap of `heap_size` bytes.
pub fn connect(
    endpoint: &str,
    _heap_size: u64,
    _mode: ReplMode,
) -> Result<Box<dyn Replicator>, ReplError> {
    Err(ReplError::NotLinked(endpoint.to_string()))
}

/// Attaches to a backup's replica for takeover: the client, the committed image, the last tx id.
pub fn attach(endpoint: &str, _mode: ReplMode) -> Result<Attached, ReplError> {
    Err(ReplError::NotLinked(endpoint.to_string()))
}
