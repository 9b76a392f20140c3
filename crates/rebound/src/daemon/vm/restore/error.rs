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
}
