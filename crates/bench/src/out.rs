//! What every guest benchmark shares on its command line: its scratch directory and
//! how it reports.

/// The scratch directory could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the scratch directory {}", .0.display())]
pub struct ScratchError(std::path::PathBuf, #[source] std::io::Error);

/// Where a guest benchmark keeps its files and how it reports.
#[derive(clap::Args, Debug, Default)]
pub struct BenchOut {
    /// Scratch directory for snapshots and dumps (default:
    /// /var/tmp/rebound-bench-KIND-PID); removed after unless given.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also draw the results to this SVG file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

impl BenchOut {
    /// The scratch directory, created; `kind` names the default one.
    pub fn scratch(&self, kind: &str) -> Result<std::path::PathBuf, ScratchError> {
        let dir = self.dir.clone().unwrap_or_else(|| {
            format!("/var/tmp/rebound-bench-{kind}-{}", std::process::id()).into()
        });
        std::fs::create_dir_all(&dir).map_err(|e| ScratchError(dir.clone(), e))?;
        Ok(dir)
    }
}
