//! Watching the snapshot image a restored guest's memory still comes from.
//!
//! Until a lazily restored guest settles onto shared RAM, QEMU maps the snapshot's
//! RAM image private: a page the guest has not written yet is read from the file
//! when first touched. If the file is truncated, a touch past its new end kills
//! QEMU with SIGBUS; if it is rewritten, the guest would take the new bytes for its
//! memory. Neither may pass unreported: the guard stops such a guest, marks its
//! restore failed with an error naming the image, and logs a `restore_failed`
//! event. Deleting the image (or the whole snapshot directory) is harmless: the
//! mapping keeps the inode, so that is no change here.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rebound_api::EventData;

use super::{Job, VmHandle};

/// How often the guard looks at the image.
const POLL: Duration = Duration::from_millis(50);
/// How long the guard waits for the event that says why QEMU went away.
const END_EVENT_WAIT: Duration = Duration::from_secs(2);

/// The image as the restore found it: its length and modification time, read
/// through an open file so that an unlinked image is still the same file.
pub(super) struct ImageStamp {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
}

impl ImageStamp {
    pub(super) fn take(path: &Path) -> std::io::Result<ImageStamp> {
        let file = File::open(path)?;
        let m = file.metadata()?;
        Ok(ImageStamp {
            path: path.to_path_buf(),
            len: m.len(),
            modified: m.modified().ok(),
            file,
        })
    }

    /// What happened to the image since it was stamped, if anything.
    pub(super) fn change(&self) -> Option<String> {
        let what = match self.file.metadata() {
            Err(e) => format!("cannot be read any more ({e})"),
            Ok(m) if m.len() < self.len => {
                format!("was truncated to {} of its {} bytes", m.len(), self.len)
            }
            Ok(m) if m.len() != self.len => {
                format!("grew from {} to {} bytes", self.len, m.len())
            }
            Ok(m) if m.modified().ok() != self.modified => "was rewritten".to_string(),
            Ok(_) => return None,
        };
        Some(format!(
            "the snapshot's RAM image {} {what} while the restored guest's memory still came from it",
            self.path.display()
        ))
    }
}

/// Watches `stamp`'s image until the VM no longer runs from it (settled onto shared
/// RAM, or stopped).
pub(super) fn spawn(vm: Arc<VmHandle>, stamp: ImageStamp) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        loop {
            tick.tick().await;
            let rec = vm.record();
            if !rec.ram_private || rec.ram_file != stamp.path {
                return;
            }
            let gone = !rec.state.has_qemu();
            if let Some(what) = stamp.change() {
                let error = if gone {
                    format!("{what}: QEMU died reading it")
                } else {
                    format!("{what}: the guest was stopped before it could read damaged memory")
                };
                fail(&vm, error);
                if !gone {
                    if let Err(e) = vm.run(Job::Kill).await {
                        tracing::error!(vm = %vm.name, "cannot stop the guest: {}", rebound_errors::chain(&e));
                    }
                }
                return;
            }
            if gone {
                if let Some(why) = exited_on_its_own(&vm).await {
                    fail(
                        &vm,
                        format!("QEMU {why} while the restored guest still ran from the snapshot image {}", stamp.path.display()),
                    );
                }
                return;
            }
        }
    });
}

/// Marks the restore failed and logs why.
pub(super) fn fail(vm: &VmHandle, error: String) {
    vm.update_restore_report(|r| {
        r.phase = "failed".into();
        r.error = Some(error.clone());
    });
    log_failed(vm, error);
}

/// Logs a restore's failure (the daemon's log, the VM's event log).
pub(super) fn log_failed(vm: &VmHandle, error: String) {
    tracing::warn!(vm = %vm.name, "{error}");
    if let Err(e) = vm.events.append(EventData::RestoreFailed { error }) {
        tracing::error!(vm = %vm.name, "{}", rebound_errors::chain(&e));
    }
}

/// Whether the VM's QEMU went away by itself (not stopped or killed on request, not
/// a guest poweroff), as its last event says: how, if so.
async fn exited_on_its_own(vm: &VmHandle) -> Option<String> {
    let deadline = tokio::time::Instant::now() + END_EVENT_WAIT;
    loop {
        let last = vm.events.read_all().ok()?.pop().map(|e| e.data);
        match last {
            Some(EventData::Exited { exit_code, error }) => {
                return match (exit_code, error) {
                    (Some(0), None) => None,
                    (_, Some(e)) => Some(format!("failed: {e}")),
                    (Some(c), None) => Some(format!("exited with code {c}")),
                    (None, None) => Some("died (killed by a signal)".into()),
                };
            }
            Some(EventData::Stopped { .. } | EventData::Killed { .. }) => return None,
            _ if tokio::time::Instant::now() >= deadline => return None,
            _ => tokio::time::sleep(POLL).await,
        }
    }
}
