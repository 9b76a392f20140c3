//! A restore's check of the RAM image it runs from, carried out: the choice is
//! `rebound_snapshot::check::decide`'s (how far the snapshot is trusted, what was
//! asked); here the daemon finds the trust, runs a lazy restore's checker in the
//! background, and stops a guest whose image turns out damaged.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::{RamCheck, RestoreMode};
use rebound_snapshot::check::{self, Decision};
use rebound_snapshot::{Catalog, ChunkChecker, Snapshot};
use rebound_vmm::paths::Paths;

use super::{Job, VmHandle};
use crate::daemon::error::OpError;

/// What the restore of `snap` (RAM image `image`) in `mode` does about its RAM.
pub(super) fn decide(
    paths: &Paths,
    snap: &Snapshot,
    image: &Path,
    asked: RamCheck,
    mode: RestoreMode,
) -> Result<Decision, OpError> {
    let asked = match asked {
        RamCheck::Auto => None,
        RamCheck::Full => Some(check::RamCheck::Full),
        RamCheck::Background => Some(check::RamCheck::Background),
        RamCheck::Off => Some(check::RamCheck::Off),
    };
    let maps = matches!(
        mode,
        RestoreMode::Lazy | RestoreMode::WorkingSet | RestoreMode::Elastic
    );
    // A catalog that cannot be read lists nothing: the snapshot is then checked in full.
    let listed = Catalog::new(paths.snapshot_catalog())
        .contains(snap.path())
        .unwrap_or(false);
    let trust = check::trust(snap.path(), image, listed)
        .map_err(|e| OpError::SnapshotInput(format!("cannot look at {}: {e}", image.display())))?;
    tracing::debug!(snapshot = %snap.path().display(), ?trust, "RAM image trust");
    Ok(check::decide(asked, trust, maps))
}

/// The report's name for a check.
pub(super) fn as_api(c: check::RamCheck) -> RamCheck {
    match c {
        check::RamCheck::Full => RamCheck::Full,
        check::RamCheck::Background => RamCheck::Background,
        check::RamCheck::Off => RamCheck::Off,
    }
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
pub(super) fn spawn_lazy_checker(vm: Arc<VmHandle>, mut checker: ChunkChecker, image: PathBuf) {
    let rt = tokio::runtime::Handle::current();
    let report_to = vm.clone();
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
                if progress.elapsed() >= QUIET && !super::restore::loading_before_start() {
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
                    vm.update_restore_report(|r| r.ram_chunks_checked = done);
                }
                std::thread::sleep(POLL);
            };
            let done = checker.checked();
            vm.update_restore_report(|r| r.ram_chunks_checked = done);
            if let Err(e) = r {
                rt.spawn(stop_damaged(vm, crate::daemon::error::chain(&e)));
            }
        });
    if let Err(e) = spawned {
        let note = format!("the RAM check could not start ({e}): the guest runs unchecked");
        tracing::warn!(vm = %report_to.name, "{note}");
        report_to.update_restore_report(|r| {
            r.ram_check = Some(RamCheck::Off);
            r.notes.push(note);
        });
    }
}

/// Fails the restore with `error` (a damaged image) and stops its guest.
pub(super) async fn stop_damaged(vm: Arc<VmHandle>, error: String) {
    let running = vm.record().state.has_qemu();
    let error = if running {
        format!("{error}: the guest was stopped")
    } else {
        error
    };
    super::restore_guard::fail(&vm, error);
    if running {
        if let Err(e) = vm.run(Job::Kill).await {
            tracing::error!(vm = %vm.name, "cannot stop the guest: {}", crate::daemon::error::chain(&e));
        }
    }
}
