//! Why a snapshot cannot be restored: its input refused, with the cause kept.

use std::path::PathBuf;

/// Why a snapshot cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error(transparent)]
    Plan(#[from] rebound_snapshot::restore_plan::PlanError),
    #[error(transparent)]
    Trace(#[from] rebound_snapshot::TraceError),
    #[error("cannot look at {0}")]
    Trust(PathBuf, #[source] std::io::Error),
    #[error("cannot open {0}")]
    Open(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Load(#[from] rebound_snapshot::LoadError),
    #[error(transparent)]
    Check(#[from] rebound_snapshot::CheckError),
    #[error(transparent)]
    Image(#[from] rebound_snapshot::ImageError),
    #[error("checksum mismatch in {} chunk {chunk} (bytes {start}..{end}): the image is damaged", .image.display())]
    Copy {
        image: PathBuf,
        chunk: usize,
        start: u64,
        end: u64,
    },
    #[error("the snapshot was made on machine type {snapshot} and this QEMU's pc is {here}")]
    Machine { snapshot: String, here: String },
    #[error("{0}")]
    Changed(String),
    #[error("{0}: checksum mismatch: the device state is damaged, QEMU was not given it")]
    DeviceState(String),
    #[error("disk {id:?} has format {format:?}: a snapshot's disks are raw or qcow2")]
    DiskFormat { id: String, format: String },
    #[error(transparent)]
    Layer(#[from] rebound_vmm::disks::DiskError),
    #[error("the snapshot has {snapshot} disks but its VM spec gives {spec}: the manifest does not fit together")]
    Disks { snapshot: usize, spec: usize },
    #[error(transparent)]
    Manifest(#[from] rebound_snapshot::ManifestError),
    #[error("the manifest's VM spec is malformed")]
    Spec(#[source] serde_json::Error),
    /// The files a restore's user names again do not fit the snapshot's VM
    /// (`VmSpec::for_restore`'s own words).
    #[error("{0}")]
    Named(String),
    #[error("the snapshot records {snapshot} pmem devices but its VM spec lists {spec}: the manifest does not fit together")]
    Pmem { snapshot: usize, spec: usize },
    /// A crash policy's `--recover-from` snapshot cannot stand in for its VM.
    #[error("--recover-from {dir}")]
    RecoverFrom {
        dir: String,
        #[source]
        source: Box<InputError>,
    },
    #[error("its VM has {what} {theirs}, this VM {ours}: a recovery VM must be the same guest")]
    Mismatch {
        what: &'static str,
        theirs: String,
        ours: String,
    },
    #[error("its RAM image holds {snapshot_mib} MiB, this VM has {vm_mib} MiB")]
    RamSize { snapshot_mib: u64, vm_mib: u64 },
    #[error("it has {0} RAM blocks; only single-block snapshots can be restored")]
    RamBlocks(usize),
}
