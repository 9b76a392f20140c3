//! A restore that a daemon restart interrupted after it answered (held, or running
//! while the rest of its memory loads): the restarted daemon reads the restore
//! report kept with the VM, and where the background loader had not finished it
//! reads the rest of the image again, so the guest's memory is complete, which is
//! what `vm wait` and a cluster restore's `restored` phase wait for. The image
//! guard, the RAM check beside the guest and a lazy restore's settle do not carry
//! on after a restart: the report says so, and a lazy restore that had not settled
//! is reported failed rather than waited on forever. A restore on the page server
//! is followed to its server's end instead (`served::follow`): the server outlives
//! the daemon.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use rebound_api::{LoadPath, RestoreMode, RestoreReport};
use rebound_snapshot::{LoadStats, Loader, Snapshot, Trace};

use crate::daemon::vm::VmHandle;

/// A report larger than this is not ours.
const MAX_REPORT: u64 = 4 << 20;

/// Takes back the report of the restore `vm` came from, if any, and finishes
/// loading its memory where a restart interrupted that.
pub(in crate::daemon::vm) fn resume(vm: &Arc<VmHandle>) {
    let path = vm.dir.path().join("restore.json");
    let mut rep = match read(&path) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(vm = %vm.name, "cannot take back {}: {e}", path.display());
            return;
        }
    };
    let unfinished =
        rep.memory_loaded_s.is_none() && rep.background_error.is_none() && rep.phase != "failed";
    if !unfinished {
        vm.set_restore_report(Some(rep));
        return;
    }
    if rep.path == Some(LoadPath::PageServer) {
        rep.notes.push(
            "the daemon restarted during this restore: the restarted daemon followed its page server to its end; the server took the old daemon's end for the guest's start, so its requests after the start count from then"
                .into(),
        );
        vm.set_restore_report(Some(rep.clone()));
        super::served::follow(vm.clone(), &rep);
        return;
    }
    if !matches!(rep.mode, RestoreMode::Elastic | RestoreMode::WorkingSet) {
        rep.background_error = Some(format!(
            "the daemon restarted before this {} restore's memory was complete, and it cannot carry on after a restart",
            rep.mode.as_str()
        ));
        vm.set_restore_report(Some(rep));
        return;
    }
    rep.notes.push(
        "the daemon restarted during this restore: the restarted daemon read the rest of the image again; the image guard and the RAM check beside the guest did not carry on"
            .into(),
    );
    vm.set_restore_report(Some(rep.clone()));
    let since = vm.record().started_mono_ns;
    let vm = vm.clone();
    tokio::task::spawn_blocking(move || {
        let r = load_rest(&rep);
        vm.update_restore_report(|rep| match r {
            Ok(s) => {
                rep.background_pages = s.pages;
                rep.background_s = Some(s.seconds);
                // From QEMU's spawn for the restore (the request's instant died with
                // the old daemon; the monotonic clock did not).
                let now = rebound_vmm::events::mono_ns();
                rep.memory_loaded_s =
                    Some(since.map_or(0.0, |t| now.saturating_sub(t) as f64 / 1e9));
            }
            Err(e) => rep.background_error = Some(e),
        });
    });
}

fn read(path: &Path) -> Result<Option<RestoreReport>, String> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut bytes = Vec::new();
    f.take(MAX_REPORT + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_REPORT {
        return Err(format!("over {MAX_REPORT} bytes"));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The rest of the restore's image (its trace first), read as the background
/// loader reads it.
fn load_rest(rep: &RestoreReport) -> Result<LoadStats, String> {
    let chain = |e: &dyn std::error::Error| rebound_errors::chain(e);
    let snap = Snapshot::open(Path::new(&rep.snapshot)).map_err(|e| chain(&e))?;
    let m = snap.manifest();
    let block = m
        .ram_blocks
        .first()
        .ok_or_else(|| "the snapshot has no RAM image".to_string())?;
    let size = block.size;
    let trace = match &m.trace {
        Some(t) => Some(Trace::read(&snap.path_of(&t.file), size / 4096).map_err(|e| chain(&e))?),
        None => None,
    };
    let mut loader =
        Loader::one_image(&snap.path_of(&block.file), size, trace).map_err(|e| chain(&e))?;
    let stop = AtomicBool::new(false);
    loader
        .load_rest(rep.rest_order, &stop, None, &mut |_, _| {})
        .map_err(|e| chain(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_back_and_a_damaged_one_is_refused_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("restore.json");
        assert_eq!(read(&p), Ok(None), "no report: not a restored VM");
        let rep = RestoreReport {
            vm: "a".into(),
            snapshot: "/snap".into(),
            phase: "held".into(),
            ..Default::default()
        };
        let good = serde_json::to_vec(&rep).unwrap();
        std::fs::write(&p, &good).unwrap();
        assert_eq!(read(&p), Ok(Some(rep)));
        for (what, bytes) in [
            ("truncated", good[..good.len() / 2].to_vec()),
            ("not JSON", b"\x00\x01\x02restore".to_vec()),
            ("empty", Vec::new()),
            ("a field of the wrong type", br#"{"vm":7}"#.to_vec()),
        ] {
            std::fs::write(&p, &bytes).unwrap();
            let e = read(&p).unwrap_err();
            assert!(!e.is_empty() && !e.contains('\n'), "{what}: {e}");
        }
        // Oversized: refused before it is parsed (or held in memory whole).
        std::fs::File::create(&p)
            .unwrap()
            .set_len(MAX_REPORT + 1)
            .unwrap();
        assert_eq!(read(&p), Err(format!("over {MAX_REPORT} bytes")));
        // A directory where the report should be.
        std::fs::remove_file(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        assert!(read(&p).is_err());
    }
}
