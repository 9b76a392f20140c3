//! The working-set trace as a task of the daemon: armed before a guest's first
//! instruction (a snapshot's post-snapshot trace, a restore's watch), it records
//! in order the pages QEMU's process first touches. The recorder itself is
//! `rebound_snapshot`'s [`PagemapTracer`]; finding QEMU's RAM mapping is
//! `rebound_guestmem`'s. This glue stays in the daemon: it is a tokio task, and
//! neither library crate depends on tokio or on the other.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_snapshot::{PagemapTracer, Trace, TraceError};

/// How often the trace looks at QEMU's page table.
pub(super) const TRACE_POLL: Duration = Duration::from_millis(5);

/// Why a trace was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum TraceTaskError {
    #[error(transparent)]
    Target(std::io::Error),
    #[error(transparent)]
    Maps(#[from] rebound_guestmem::maps::MapsError),
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("the held restore ended before its start")]
    HeldEnded,
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// A trace task's handle.
pub(super) type TraceTask = tokio::task::JoinHandle<Result<Trace, TraceTaskError>>;

/// How a trace task says it is armed and, for a restore held ready, waits for the
/// start before its window begins.
pub(super) struct Arming {
    armed: tokio::sync::oneshot::Sender<()>,
    go: Option<std::sync::mpsc::Receiver<()>>,
}

/// A trace task, returned once the tracer is armed (pages unmapped when asked, the
/// page table's present pages taken as the baseline): start the guest after this,
/// or its first touches are part of the baseline and never recorded. With `go`, the
/// window of `max` begins when `go` receives (a held restore arms at its hold, so
/// its start is a bare `cont`); a dropped sender ends the task with an error.
pub(super) async fn arm_trace(
    pid: u32,
    file: PathBuf,
    size: u64,
    max: Duration,
    stop: Arc<AtomicBool>,
    unmap: bool,
    go: Option<std::sync::mpsc::Receiver<()>>,
) -> TraceTask {
    let (armed, rx) = tokio::sync::oneshot::channel();
    let arming = Some(Arming { armed, go });
    let h = tokio::spawn(trace_blocking(pid, file, size, max, stop, unmap, arming));
    // An error before arming drops the sender: the handle then holds the error.
    let _ = rx.await;
    h
}

/// Records, for `max` or until `stop`, the order in which QEMU's process first touches
/// the pages of its mapping of `file` (`unmap`: first make the running guest's next
/// touches visible by unmapping its pages, which stay in the file).
pub(super) async fn trace_blocking(
    pid: u32,
    file: PathBuf,
    size: u64,
    max: Duration,
    stop: Arc<AtomicBool>,
    unmap: bool,
    arming: Option<Arming>,
) -> Result<Trace, TraceTaskError> {
    tokio::task::spawn_blocking(move || {
        let target =
            rebound_guestmem::MapTarget::inode_of(&file).map_err(TraceTaskError::Target)?;
        let maps = rebound_guestmem::maps::read_maps(pid)?;
        let m = rebound_guestmem::maps::find_ram_mapping(&maps, pid, &target, size)?;
        if unmap {
            rebound_snapshot::unmap_for_trace(pid, &[(m.start, size)])?;
        }
        let mut tracer = PagemapTracer::new(pid, vec![(0, m.start, size)])?;
        if let Some(a) = arming {
            let _ = a.armed.send(());
            if let Some(go) = a.go {
                go.recv().map_err(|_| TraceTaskError::HeldEnded)?;
            }
        }
        let end = Instant::now() + max;
        while Instant::now() < end && !stop.load(Ordering::Relaxed) {
            tracer.poll()?;
            std::thread::sleep(TRACE_POLL);
        }
        tracer.poll()?;
        Ok(tracer.into_trace())
    })
    .await?
}
