//! Heap configuration and per-transaction statistics.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use hareplica::Spin;

/// Errors parsing configuration values.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The engine name is not one of auto, mprotect, uffd, scan, log.
    #[error("unknown engine {0:?} (expected auto, mprotect, uffd, scan or log)")]
    UnknownEngine(String),
}

/// Which dirty-tracking engine a heap uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// The fastest engine available on this kernel.
    Auto,
    /// Read-only region + SIGSEGV handler (the talk's "PT").
    Mprotect,
    /// userfaultfd synchronous write-protect with a handler thread.
    Uffd,
    /// userfaultfd asynchronous write-protect + PAGEMAP_SCAN.
    Scan,
    /// Explicit write logging through `Heap::write` (the talk's "emulation").
    Log,
}

impl EngineKind {
    /// All concrete engines, slowest-first as the talk ranks them.
    pub const CONCRETE: [EngineKind; 4] = [
        EngineKind::Mprotect,
        EngineKind::Uffd,
        EngineKind::Scan,
        EngineKind::Log,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Auto => "auto",
            EngineKind::Mprotect => "mprotect",
            EngineKind::Uffd => "uffd",
            EngineKind::Scan => "scan",
            EngineKind::Log => "log",
        }
    }

    /// Whether the engine tracks whole pages (and so also sees direct stores).
    pub fn is_page_level(self) -> bool {
        !matches!(self, EngineKind::Log)
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "auto" => EngineKind::Auto,
            "mprotect" => EngineKind::Mprotect,
            "uffd" => EngineKind::Uffd,
            "scan" => EngineKind::Scan,
            "log" => EngineKind::Log,
            other => return Err(ConfigError::UnknownEngine(other.to_string())),
        })
    }
}

/// When `tend` returns relative to the backup's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplMode {
    /// After the backup acknowledged the transaction.
    #[default]
    Sync,
    /// At once, unless `max_lag` transactions are still unacknowledged.
    Async { max_lag: u32 },
}

/// What `tend` does when the backup is gone (killed, restarting, unreachable).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackupFailure {
    /// Return at once: `Error::Replication(ReplError::InDoubt)` if the transaction was
    /// queued for the backup (it stays committed here; `tend` again waits for it).
    #[default]
    Fail,
    /// Block, reconnecting every [`BackupFailure::RETRY_DELAY`], until the backup is back
    /// and has acknowledged, for about `timeout` (plus up to one connect timeout); then
    /// fail as with `Fail`.
    Block { timeout: Duration },
}

impl BackupFailure {
    /// Pause between reconnect attempts while blocked.
    pub const RETRY_DELAY: Duration = Duration::from_millis(50);
}

/// How to build a heap.
#[derive(Debug, Clone)]
pub struct HeapConfig {
    /// Bytes; rounded up to whole pages.
    pub size: usize,
    pub engine: EngineKind,
    /// Backup endpoint, `tcp:HOST:PORT` or `unix:PATH`; `None` keeps the heap local. A TCP
    /// backup's token is read from the file `REBOUND_HA_TOKEN_FILE` names.
    pub backup: Option<String>,
    pub mode: ReplMode,
    /// What a commit does while the backup is gone; the backup must be reachable when the
    /// heap is created or taken over.
    pub on_backup_failure: BackupFailure,
    /// How to wait for the backup's acknowledgement. The default, [`Spin::PRIMARY`], busy-
    /// polls up to 100 µs while the backup has been answering within that (on a machine
    /// with more than one CPU), and sleeps otherwise: it saves an idle CPU's wake-up per
    /// commit for at most 100 µs of CPU. `Spin::Fixed` always polls, and also makes the
    /// `uffd` engine's handler thread poll for the next fault that long.
    pub spin: Spin,
}

impl HeapConfig {
    /// A local heap (no backup) of `size` bytes with `engine`.
    pub fn local(size: usize, engine: EngineKind) -> HeapConfig {
        HeapConfig {
            size,
            engine,
            backup: None,
            mode: ReplMode::Sync,
            on_backup_failure: BackupFailure::Fail,
            spin: Spin::PRIMARY,
        }
    }
}

/// What one committed transaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C)]
pub struct TxStats {
    /// Id of the committed transaction (1 for the first).
    pub tx_id: u64,
    /// Pages the engine reported written.
    pub pages: usize,
    /// Bytes passed to `Heap::write` in the transaction (direct stores are not counted).
    pub bytes_written_hint: usize,
    /// Payload bytes of the diff sent to the backup; without a backup, what would have been sent.
    pub bytes_shipped: usize,
}

/// Cumulative counters of one heap, for benchmarks and monitoring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapCounters {
    /// Committed transactions.
    pub commits: u64,
    /// Aborted transactions.
    pub aborts: u64,
    /// Pages reported written, summed over commits.
    pub pages: u64,
    /// Diff runs produced, summed over commits.
    pub runs: u64,
    /// Bytes shipped (or that would have been), summed over commits.
    pub bytes_shipped: u64,
    /// Nanoseconds in the engine's collection (scan, bitmap drain + re-protect) at tend.
    pub collect_ns: u64,
    /// Nanoseconds computing byte diffs (page engines) or runs (log) at tend.
    pub diff_ns: u64,
    /// Nanoseconds shipping to the backup and waiting for it at tend.
    pub ship_ns: u64,
}
