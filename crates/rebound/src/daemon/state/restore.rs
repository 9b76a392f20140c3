//! Restoring a snapshot into a new VM: the request's paths and files checked, then
//! a new owner that restores it (`vm/restore.rs`).

use std::sync::Arc;

use rebound_api::VmSpec;

use super::Daemon;
use crate::daemon::error::OpError;
use crate::daemon::vm::restore::error::InputError;
use crate::daemon::vm::Init;

impl Daemon {
    /// Restores a snapshot into a new VM: returns once it runs (or is held ready).
    pub async fn restore(
        self: &Arc<Self>,
        req: rebound_api::RestoreRequest,
    ) -> Result<rebound_api::RestoreReport, OpError> {
        let dir = std::path::PathBuf::from(&req.dir);
        if !dir.is_absolute() {
            return Err(OpError::BadRequest(format!(
                "snapshot path {:?} must be absolute",
                req.dir
            )));
        }
        let snap = tokio::task::spawn_blocking(move || rebound_snapshot::Snapshot::open(&dir))
            .await
            .map_err(|e| OpError::Broken(Box::new(e)))?
            .map_err(InputError::from)?;
        let spec: VmSpec =
            serde_json::from_value(snap.manifest().spec.clone()).map_err(InputError::Spec)?;
        // The manifest is the snapshot's word: its extra disks become the snapshot's
        // copies (the last entries of its disk list), and no host path of it is used.
        let m = snap.manifest();
        let copies: Vec<String> = m
            .disks
            .iter()
            .skip(m.disks.len().saturating_sub(spec.disks.len()))
            .map(|d| snap.path_of(&d.file).display().to_string())
            .collect();
        // Its kernel, initrd and pmem files are the ones the user names again.
        let (mut spec, notes) = spec
            .for_restore(&copies, &req.named_files())
            .map_err(InputError::Named)?;
        let (named, sizes) = (spec.clone(), m.pmem.clone());
        tokio::task::spawn_blocking(move || check_named_files(&named, &sizes))
            .await
            .map_err(|e| OpError::Broken(Box::new(e)))??;
        spec.name = req.name.clone();
        // The snapshot's VM may still run: the copy gets host ports of its own,
        // unless the request names them.
        // Its forwards are those of its spec and its workload's service port.
        let service = spec.service_port();
        for a in req.forwards.iter().flatten() {
            let known = spec.forwards.iter().any(|f| f.guest == a.guest);
            if !known && service != Some(a.guest) {
                return Err(OpError::BadRequest(format!(
                    "the snapshot's VM forwarded no guest port {}: only its forwards can be given host ports",
                    a.guest
                )));
            }
        }
        for f in &mut spec.forwards {
            let asked = req.forwards.iter().flatten().find(|a| a.guest == f.guest);
            f.host = asked.map_or(0, |a| a.host);
        }
        for a in req.forwards.iter().flatten() {
            if !spec.forwards.iter().any(|f| f.guest == a.guest) {
                spec.forwards.push(*a);
            }
        }
        let (boot, ready) = spec.validate()?;
        // Frames to replay are read and checked before anything starts.
        let replay = crate::daemon::vm::replay::load(&req, &spec).await?;
        let job = crate::daemon::vm::restore::RestoreJob {
            spec,
            boot,
            ready,
            req,
            snap,
            recovery: None,
            hold_rest: false,
            replay,
            notes,
        };
        let spec = job.spec.clone();
        self.launch(&spec, |tx| Init::Restore(Box::new(job), tx))
            .await
    }
}

/// Checks the files a restore's user named as a start checks its files, and each
/// pmem file against the size the snapshot's VM had there (a smaller one would
/// leave the guest a device larger than its file: QEMU dies of SIGBUS when the
/// guest touches the rest). Snapshots from before sizes were recorded have none.
fn check_named_files(spec: &VmSpec, sizes: &[rebound_snapshot::PmemEntry]) -> Result<(), OpError> {
    rebound_vmm::resolve::check_host_files(spec)?;
    if sizes.is_empty() {
        return Ok(());
    }
    if sizes.len() != spec.pmem.len() {
        return Err(InputError::Pmem {
            snapshot: sizes.len(),
            spec: spec.pmem.len(),
        }
        .into());
    }
    for (f, want) in spec.pmem.iter().zip(sizes) {
        let len = std::fs::metadata(f)
            .map_err(|e| OpError::Io(format!("cannot read pmem file {f}"), e))?
            .len();
        if len != want.size {
            return Err(OpError::BadRequest(format!(
                "--pmem {f} is {len} bytes but the snapshot's VM had {} bytes on {}: name the file it had there",
                want.size, want.id
            )));
        }
    }
    Ok(())
}
