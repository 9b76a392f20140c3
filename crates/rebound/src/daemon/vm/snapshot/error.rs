//! Why a snapshot could not be saved or settled, with the cause kept.

/// Why a snapshot (or a move onto shared RAM) could not be written; a QMP failure
/// is QMP's own error.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error(transparent)]
    Migration(rebound_vmm::migration::MigrationError),
    #[error(transparent)]
    Image(#[from] rebound_snapshot::ImageError),
    #[error(transparent)]
    Manifest(#[from] rebound_snapshot::ManifestError),
    #[error(transparent)]
    Trace(#[from] rebound_snapshot::TraceError),
    #[error(transparent)]
    PageSums(#[from] rebound_snapshot::pagesums::PageSumsError),
    #[error("cannot dump net{0}'s frames")]
    NetDump(usize, #[source] rebound_vmm::qmp::QmpError),
}
