//! Crash recovery from a snapshot (`--recover-from DIR`): the recovery VM is restored
//! elastically from a post-boot snapshot of the guest instead of booted, so the
//! downtime is a restore's time to running, not a boot.
//!
//! The guest comes back as the snapshot left it, disks included (memory and disk of
//! one instant belong together: the crashed disk under the snapshot's page cache
//! would be a corrupt filesystem). The crashed VM's own image disk is moved into the
//! crash's directory for the operator; user disks (`--disk FILE`) stay as the crashed
//! guest left them and the recovery VM runs on copy-on-write layers of the
//! snapshot's copies.
//!
//! Memory: a restored guest holds only the pages it touches (the image's page cache
//! and its own writes), not its whole size, so it starts as a booting recovery VM
//! would, once the budget has `--min-memory` free, with its working set cut to what
//! is free. The background loader, which reads the rest into the page cache outside
//! the VM's memory group, waits until the dump has given the crashed memory back;
//! then the guest settles onto shared RAM like any restored VM.

use rebound_api::{RestOrder, RestoreMode, RestoreRequest, VmSpec};
use rebound_snapshot::Snapshot;
use rebound_vmm::resolve::Recovery;

use super::owner::Owner;
use super::restore::error::InputError;
use super::restore::RestoreJob;
use crate::daemon::error::OpError;

/// Opens the snapshot a VM's crash policy recovers from and checks it can stand in
/// for the VM: done at start, so a wrong path fails the start, not the recovery.
pub fn check(spec: &VmSpec) -> Result<Snapshot, OpError> {
    let Some(dir) = &spec.crash.recover_from else {
        return Err(OpError::Internal("no --recover-from to check".into()));
    };
    let bad = |e: InputError| {
        OpError::from(InputError::RecoverFrom {
            dir: dir.clone(),
            source: Box::new(e),
        })
    };
    let snap = Snapshot::open(std::path::Path::new(dir)).map_err(|e| bad(e.into()))?;
    let theirs: VmSpec = serde_json::from_value(snap.manifest().spec.clone())
        .map_err(|e| bad(InputError::Spec(e)))?;
    compatible(spec, &theirs).map_err(bad)?;
    let blocks = &snap.manifest().ram_blocks;
    match blocks.as_slice() {
        [b] if b.size == spec.memory_mib << 20 => Ok(snap),
        [b] => Err(bad(InputError::RamSize {
            snapshot_mib: b.size >> 20,
            vm_mib: spec.memory_mib,
        })),
        _ => Err(bad(InputError::RamBlocks(blocks.len()))),
    }
}

/// Whether a snapshot of `theirs` restores into a QEMU built from `ours`: the same
/// memory, vCPUs, boot source, disks and workload (the device state must fit the
/// devices, and the guest must be the service this VM runs).
fn compatible(ours: &VmSpec, theirs: &VmSpec) -> Result<(), InputError> {
    let differs = |what: &'static str, ours: String, theirs: String| {
        Err(InputError::Mismatch { what, theirs, ours })
    };
    if ours.memory_mib != theirs.memory_mib {
        return differs(
            "memory",
            format!("{} MiB", ours.memory_mib),
            format!("{} MiB", theirs.memory_mib),
        );
    }
    if ours.cpus != theirs.cpus {
        return differs("vCPUs", ours.cpus.to_string(), theirs.cpus.to_string());
    }
    let boot = |s: &VmSpec| match (&s.kernel, &s.image) {
        (Some(_), _) => "a user kernel".to_string(),
        (None, i) => format!("image {}", i.as_deref().unwrap_or("default")),
    };
    if boot(ours) != boot(theirs) {
        return differs("boot source", boot(ours), boot(theirs));
    }
    if ours.disks.len() != theirs.disks.len() {
        return differs(
            "user disks",
            ours.disks.len().to_string(),
            theirs.disks.len().to_string(),
        );
    }
    if ours.workload != theirs.workload {
        let w = |s: &VmSpec| s.workload.map_or("none", |w| w.as_str()).to_string();
        return differs("workload", w(ours), w(theirs));
    }
    Ok(())
}

impl Owner {
    /// Restores the recovery VM from `dir` with `free_mib` of the budget free now,
    /// the background loader held while the dump runs; returns the line the crash
    /// report keeps about it.
    pub(super) async fn recovery_restore(
        &mut self,
        spec: &VmSpec,
        dir: &str,
        free_mib: u64,
        dumping: bool,
        kept: &std::path::Path,
    ) -> Result<String, OpError> {
        let s = spec.clone();
        let snap = tokio::task::spawn_blocking(move || check(&s))
            .await
            .map_err(|e| OpError::Broken(Box::new(e)))??;
        let (boot, ready) = spec.validate()?;
        // The working set loaded before the start fits in what the budget has free.
        let ws_pages = snap
            .manifest()
            .trace
            .as_ref()
            .map(|t| t.default_elastic_pages().min(free_mib << 8));
        // The crashed VM's image disk is kept for the operator; the snapshot's takes
        // its place.
        let overlay = self.vm.dir.disk_overlay(0);
        let mut note = String::new();
        if spec.kernel.is_none() && overlay.exists() {
            std::fs::rename(&overlay, kept).map_err(|e| {
                OpError::Io(
                    format!("cannot keep the crashed disk {}", overlay.display()),
                    e,
                )
            })?;
            note = format!("; the crashed VM's disk is kept at {}", kept.display());
        }
        if !spec.disks.is_empty() {
            note.push_str("; its user disks stay as the crashed guest left them, the recovery VM runs on the snapshot's copies");
        }
        let job = RestoreJob {
            spec: spec.clone(),
            boot,
            ready,
            req: RestoreRequest {
                dir: dir.to_string(),
                name: spec.name.clone(),
                mode: RestoreMode::Elastic,
                ws_pages,
                paused: false,
                rest_order: RestOrder::Fafl,
                // While the dump runs the rest of the image waits until the dump
                // gives its memory back (`hold_rest`), which only the page cache's
                // background loader can do; the page server pushes the rest at once.
                path: if dumping {
                    rebound_api::LoadPath::PageCache
                } else {
                    rebound_api::LoadPath::Auto
                },
                ram_check: rebound_api::RamCheck::Auto,
                watch_s: rebound_api::snapshot::default_watch_s(),
                forwards: None,
                replay: None,
                // The recovery VM's spec is the crashed VM's own, not the snapshot's.
                kernel: None,
                initrd: None,
                pmem: Vec::new(),
            },
            snap,
            recovery: Some(Recovery {
                forwards: self.vm.record().forwards.clone(),
                boot_memory_mib: None,
            }),
            hold_rest: dumping,
            replay: Vec::new(),
            notes: Vec::new(),
        };
        let r = self.restore(job).await?;
        Ok(format!(
            "the recovery VM was restored from {dir} ({}, {} working-set pages loaded in {:.2} s, running {:.2} s after the restore began{})",
            r.mode.as_str(),
            r.pages_loaded_before_start,
            r.load_before_start_s,
            r.time_to_running_s.unwrap_or(0.0),
            note
        ))
    }
}
