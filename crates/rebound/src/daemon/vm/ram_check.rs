//! A restore's check of the RAM image it runs from, carried out: the choice is the
//! restore plan's (`rebound_snapshot::check::decide`: how far the snapshot is
//! trusted, what was asked); here the daemon finds the trust, checks before the
//! start, runs a lazy restore's checker in the background, and stops a guest whose
//! image turns out damaged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::AtomicBool;

use rebound_snapshot::check::{self, Trust};
use rebound_snapshot::restore_plan::{Action, Checking, Event, Restore};
use rebound_snapshot::{Catalog, ChunkChecker, Loader, Snapshot};
use rebound_vmm::paths::Paths;

use super::restore::error::InputError;
use super::{Job, VmHandle};
use crate::daemon::error::OpError;

/// How far the snapshot `snap` (RAM image `image`) is trusted, for the plan's check.
pub(super) fn trust(paths: &Paths, snap: &Snapshot, image: &Path) -> Result<Trust, OpError> {
    // A catalog that cannot be read lists nothing: the snapshot is then checked in full.
    let listed = Catalog::new(paths.snapshot_catalog())
        .contains(snap.path())
        .unwrap_or(false);
    let trust = check::trust(snap.path(), image, listed)
        .map_err(|e| InputError::Trust(image.to_path_buf(), e))?;
    tracing::debug!(snapshot = %snap.path().display(), ?trust, "RAM image trust");
    Ok(trust)
}

/// The RAM check done before the start, and what is left for the background.
pub(super) struct CheckedBefore {
    /// Chunks checked before the start.
    pub(super) before: u64,
    /// Seconds of a full check.
    pub(super) full_s: Option<f64>,
    /// A lazy restore's checker, to run while the guest runs.
    pub(super) lazy: Option<ChunkChecker>,
}

/// Sets up the check of a restore as its plan says: a full one runs now (the
/// restore fails at a damaged chunk, before QEMU is given anything); a background
/// one goes with the loader (working-set, elastic: chunks checked as they are
/// loaded whole, those of the working set before the start) or, for a lazy restore,
/// is handed back to run beside the guest.
pub(super) fn check_before_start(
    loader: &mut Loader,
    image: &Path,
    size: u64,
    chunk: u64,
    checksums: &[String],
    checking: Checking,
    vm: &VmHandle,
) -> Result<CheckedBefore, OpError> {
    let mut out = CheckedBefore {
        // An eager copy compares every chunk as it copies (or fails the restore).
        before: if checking == Checking::AsCopied {
            checksums.len() as u64
        } else {
            0
        },
        full_s: None,
        lazy: None,
    };
    if matches!(
        checking,
        Checking::None | Checking::AsCopied | Checking::AsServed
    ) {
        return Ok(out);
    }
    let mut c = ChunkChecker::new(image, size, chunk, checksums).map_err(InputError::from)?;
    match checking {
        Checking::FullBeforeStart => {
            let t = Instant::now();
            let mut show = |d: u64, n: u64| vm.set_progress(Some((d * chunk, n * chunk)));
            let r = c.check_all(&AtomicBool::new(false), &mut show);
            vm.set_progress(None);
            r.map_err(InputError::from)?;
            out.before = c.checked();
            out.full_s = Some(t.elapsed().as_secs_f64());
        }
        Checking::BesideGuest => out.lazy = Some(c),
        Checking::WithLoader => loader.check_with(0, c).map_err(InputError::from)?,
        Checking::None | Checking::AsCopied | Checking::AsServed => {}
    }
    Ok(out)
}

/// How often a lazy restore's checker looks at the page cache.
const POLL: Duration = Duration::from_millis(250);
/// How long it waits for the guest to load more before it reads a chunk itself.
const QUIET: Duration = Duration::from_secs(2);

/// Checks a lazy restore's image while its guest runs: each chunk once the guest's
/// own faults (and the kernel's readahead for them) have brought all its data into
/// the page cache, so the check reads nothing the guest would not; when nothing new
/// comes in for `QUIET`, it reads the next chunk itself. It gives way to restores
/// loading before their start, and stops when the VM's QEMU is gone. A damaged
/// chunk stops the guest. Its thread runs at the lowest priority (nice 19): under
/// TCG the guest is CPU-bound, and the check must not take its time, yet on a busy
/// host it still gets a small share and finishes.
pub(super) fn spawn_lazy_checker(
    vm: Arc<VmHandle>,
    machine: Restore,
    mut checker: ChunkChecker,
    image: PathBuf,
) {
    let rt = tokio::runtime::Handle::current();
    let (report_to, machine2) = (vm.clone(), machine.clone());
    // A thread of its own: the scheduling class stays with the thread.
    let spawned = std::thread::Builder::new()
        .name("ram-check".into())
        .spawn(move || {
            // SAFETY: gettid has no preconditions; setpriority of PRIO_PROCESS with a
            // thread id changes that thread alone (Linux). Failing leaves it as it was.
            if unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) }
                != 0
            {
                tracing::debug!(
                    "cannot lower the RAM check's priority: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut progress = Instant::now();
            let mut shown = 0;
            let r = loop {
                // A settle moves the guest to another QEMU, with memory copied from the
                // image: the check goes on while any QEMU runs this VM.
                if !vm.record().state.has_qemu() || checker.next_unchecked().is_none() {
                    break Ok(());
                }
                // Residency is a hint: without it, chunks are read as when nothing comes in.
                let resident = rebound_snapshot::image::resident_pages(&image).unwrap_or_default();
                match checker.check_resident(&resident) {
                    Ok(0) => {}
                    Ok(_) => progress = Instant::now(),
                    Err(e) => break Err(e),
                }
                if progress.elapsed() >= QUIET && !super::restore::gate::loading_before_start() {
                    if let Some(i) = checker.next_unchecked() {
                        if let Err(e) = checker.check(i) {
                            break Err(e);
                        }
                        progress = Instant::now();
                    }
                }
                // The report is saved on every change: only when there is one.
                let done = checker.checked();
                if done != shown {
                    shown = done;
                    vm.update_restore_report(|r| {
                        machine.on(r, Event::ChunksChecked(done));
                    });
                }
                std::thread::sleep(POLL);
            };
            let done = checker.checked();
            vm.update_restore_report(|r| {
                machine.on(r, Event::ChunksChecked(done));
            });
            if let Err(e) = r {
                rt.spawn(stop_damaged(vm, rebound_errors::chain(&e)));
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(vm = %report_to.name, "the RAM check could not start ({e}): the guest runs unchecked");
        report_to.update_restore_report(|r| {
            machine2.on(r, Event::CheckerUnavailable(e.to_string()));
        });
    }
}

/// Fails the restore with `error` (a damaged image) and stops its guest.
pub(super) async fn stop_damaged(vm: Arc<VmHandle>, error: String) {
    let running = vm.record().state.has_qemu();
    let mut actions = None;
    vm.update_restore_report(|r| actions = Some(Restore::damaged(r, error.clone(), running)));
    // Without a report (none published yet) the failure is still logged.
    let actions =
        actions.unwrap_or_else(|| Restore::damaged(&mut Default::default(), error, running));
    for a in actions {
        match a {
            Action::Publish => {}
            Action::Fail(error) => super::restore_guard::log_failed(&vm, error),
            Action::StopGuest => {
                if let Err(e) = vm.run(Job::Kill).await {
                    tracing::error!(vm = %vm.name, "cannot stop the guest: {}", rebound_errors::chain(&e));
                }
            }
            other => unreachable!("a damaged image asks for {other:?}"),
        }
    }
}
