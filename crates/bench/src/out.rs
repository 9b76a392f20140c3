//! What every guest benchmark shares on its command line: its scratch directory and
//! how it reports.

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
    pub fn scratch(&self, kind: &str) -> anyhow::Result<std::path::PathBuf> {
        let dir = self.dir.clone().unwrap_or_else(|| {
            format!("/var/tmp/rebound-bench-{kind}-{}", std::process::id()).into()
        });
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}
