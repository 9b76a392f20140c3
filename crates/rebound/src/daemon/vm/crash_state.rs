//! What the owner holds of one crash being handled: its state machine, the crashed
//! RAM, the dump's progress and rate, the memory group. Its own module, so the owner
//! can hold it without depending on the code that handles the crash.

use std::path::{Path, PathBuf};

use rebound_crash::{Crash, Seen};
use rebound_vmm::events::mono_ns;
use tokio::sync::mpsc::UnboundedReceiver;

use super::dump::DumpProgress;

/// One crash being handled: its state machine and what the owner holds for it.
pub struct Handling {
    pub(super) m: Crash,
    pub(super) dir: PathBuf,
    pub(super) crashed_ram: PathBuf,
    pub(super) progress: Option<UnboundedReceiver<DumpProgress>>,
    /// The dump's rate, which the I/O policy changes as recovery advances.
    pub(super) rate: super::dump::Rate,
    /// The VM's memory group, limited to the budget while the crash is handled.
    pub(super) group: Option<rebound_vmm::cgroup::Group>,
    /// Partial dumps of daemons that stopped mid-dump, newest first: the pages they
    /// hold are no longer in the RAM file.
    pub(super) earlier: Vec<PathBuf>,
    /// The crashed vCPUs' registers, for the dump.
    pub(super) cpu_notes: Option<PathBuf>,
}

impl Handling {
    pub(super) fn new(m: Crash, dir: PathBuf, crashed_ram: PathBuf) -> Handling {
        Handling {
            m,
            dir,
            crashed_ram,
            progress: None,
            rate: Default::default(),
            group: None,
            earlier: Vec::new(),
            cpu_notes: None,
        }
    }

    /// What the owner sees of the crash now.
    pub(super) fn seen(&self) -> Seen {
        Seen {
            now_ns: mono_ns(),
            crashed_bytes: held(&self.crashed_ram),
            charged_bytes: self.group.as_ref().and_then(|g| g.usage().ok()),
        }
    }
}

/// The next dump progress message, if a dump runs; never, otherwise.
pub async fn next_progress(h: &mut Option<Handling>) -> Option<DumpProgress> {
    match h.as_mut().and_then(|h| h.progress.as_mut()) {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Bytes a file holds on its filesystem (0 once it is gone).
pub(super) fn held(path: &Path) -> u64 {
    rebound_vmm::process::allocated_bytes(path).unwrap_or(0)
}
