//! A restore's files as QEMU may be given them: the device state copied and
//! checked, each disk's layers checked against the snapshot and the daemon's
//! catalog, and the disks of a VM whose backend serves them.

use std::path::PathBuf;

use rebound_snapshot::Snapshot;

use super::InputError;
use crate::daemon::error::OpError;
use crate::daemon::vm::owner::Owner;

impl Owner {
    /// A copy of the snapshot's device state in the run dir, checked against the
    /// manifest's checksum while copied: QEMU reads the bytes that were checked,
    /// whatever happens to the snapshot's file meanwhile.
    pub(super) async fn checked_device_state(&self, snap: &Snapshot) -> Result<PathBuf, OpError> {
        let e = snap.manifest().device_state.clone();
        let (from, to) = (
            snap.path_of(&e.file),
            self.vm.run.path().join("device.state"),
        );
        let dst = to.clone();
        let h = tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_file(&dst);
            rebound_snapshot::copy_file(&from, &dst)
        })
        .await
        .map_err(|err| OpError::Broken(Box::new(err)))?
        .map_err(InputError::Image)?;
        if h.checksum != e.checksum || h.size != e.size {
            let _ = std::fs::remove_file(&to);
            return Err(InputError::DeviceState(e.file).into());
        }
        Ok(to)
    }
}

/// The snapshot's disks as QEMU may open them: each of the format its manifest
/// declares (never probed from content a guest wrote), raw or a qcow2 whose backing
/// chain stays inside the snapshot and the daemon's images, but for the bases the
/// daemon recorded in its catalog when it wrote this very snapshot (a snapshot of a
/// restored VM keeps its disk's base, the earlier snapshot's copy, by reference).
pub(super) fn check_disk_layers(
    snap: &Snapshot,
    paths: &rebound_vmm::paths::Paths,
) -> Result<Vec<(PathBuf, rebound_vmm::qemu::DiskFormat)>, OpError> {
    use rebound_snapshot::Listing;
    use rebound_vmm::qemu::DiskFormat;
    let listing = rebound_snapshot::Catalog::new(paths.snapshot_catalog())
        .listing(snap.path())
        .map_err(|e| OpError::Broken(Box::new(e)))?;
    let (bases, unrecorded) = match listing {
        Listing::NotListed => (Vec::new(), "and this daemon did not write the snapshot (only a snapshot it wrote may read through a base it recorded then)".to_string()),
        Listing::WithoutBases => (Vec::new(), "and the snapshot catalog lists this snapshot from an older Rebound, which recorded no bases: it can no longer read through files outside (restore the snapshot it came from, or take it again)".to_string()),
        Listing::Bases(b) => (
            b.into_iter()
                .filter_map(|b| Some((PathBuf::from(b.file), DiskFormat::parse(&b.format)?)))
                .collect(),
            "and is not a base this daemon recorded for this snapshot when it wrote it".to_string(),
        ),
    };
    let roots = rebound_vmm::disks::LayerRoots {
        snapshot: snap.path().to_path_buf(),
        images: paths.home.join("images"),
        bases,
        unrecorded,
    };
    let mut out = Vec::new();
    for d in &snap.manifest().disks {
        let Some(fmt) = DiskFormat::parse(&d.format) else {
            return Err(InputError::DiskFormat {
                id: d.id.clone(),
                format: d.format.clone(),
            }
            .into());
        };
        let path = snap.path_of(&d.file);
        rebound_vmm::disks::check_layer(&path, fmt, &roots).map_err(InputError::Layer)?;
        out.push((path, fmt));
    }
    Ok(out)
}

impl Owner {
    /// The disks of a restore whose VM had some served by Rebound's backend: those get
    /// a raw copy of the snapshot's disk in the VM's directory (reflinked or sparse),
    /// which their backend serves; the others a copy-on-write overlay, as always.
    pub(super) fn backend_disks(
        &self,
        snap: &Snapshot,
        layers: &[(PathBuf, rebound_vmm::qemu::DiskFormat)],
        res: &mut rebound_vmm::resolve::Resolved,
    ) -> Result<Vec<rebound_vmm::qemu::Disk>, OpError> {
        use rebound_vmm::qemu::BlockBackend;
        let m = snap.manifest();
        if m.disks.len() != res.command.disks.len() {
            return Err(InputError::Disks {
                snapshot: m.disks.len(),
                spec: res.command.disks.len(),
            }
            .into());
        }
        let boot = |e| OpError::Boot(rebound_vmm::resolve::BootError::Disk(e));
        let mut out = Vec::new();
        for (i, (d, (from, fmt))) in res.command.disks.iter().zip(layers).enumerate() {
            match &d.backend {
                BlockBackend::VhostUser { socket } => {
                    let copy = self.vm.dir.disk_raw(i);
                    if *fmt != rebound_vmm::qemu::DiskFormat::Raw {
                        return Err(boot(rebound_vmm::disks::DiskError::NotRaw(from.clone())));
                    }
                    rebound_vmm::disks::raw_copy(from, &copy).map_err(boot)?;
                    if let Some(b) = res.backends.iter_mut().find(|b| &b.socket == socket) {
                        b.disk = copy;
                    }
                    out.push(d.clone());
                }
                _ => out.push(
                    rebound_vmm::disks::create_overlay_as(from, *fmt, &self.vm.dir.disk_overlay(i))
                        .map_err(boot)?,
                ),
            }
        }
        Ok(out)
    }
}
