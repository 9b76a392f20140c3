//! A restore's check of the RAM image it runs from, carried out: the choice is
//! `rebound_snapshot::check::decide`'s (how far the snapshot is trusted, what was
//! asked); here the daemon finds the trust, runs a lazy restore's checker in the
//! background, and stops a guest whose image turns out damaged.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

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

/// Checks a lazy restore's image chunk by chunk while its guest runs, reading
/// around the page cache so that the restore stays lazy; gives way to restores
/// loading before their start; stops when the VM's QEMU is gone. A damaged chunk
/// stops the guest.
pub(super) fn spawn_lazy_checker(vm: Arc<VmHandle>, mut checker: ChunkChecker) {
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut between = |done: u64, _total: u64| {
            while super::restore::loading_before_start() {
                std::thread::sleep(Duration::from_millis(10));
            }
            // A settle moves the guest to another QEMU, with memory copied from the
            // image: the check goes on while any QEMU runs this VM.
            if !vm.record().state.has_qemu() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if done.is_multiple_of(16) {
                vm.update_restore_report(|r| r.ram_chunks_checked = done);
            }
        };
        let r = checker.check_all(&stop, &mut between);
        let done = checker.checked();
        vm.update_restore_report(|r| r.ram_chunks_checked = done);
        if let Err(e) = r {
            rt.spawn(stop_damaged(vm, crate::daemon::error::chain(&e)));
        }
    });
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
