//! The hcache runs' guests and their disk: the file set on an ext4 image, the io
//! workload over it, and what the backend and the workload report. Shared by the
//! settings and curve runs, the allocation runs and the web pattern.

use std::path::{Path, PathBuf};

use rebound_api::{FilesReport, VmSpec, Workload};
use rebound_client::Client;
use serde_json::Value;

use crate::guest::get;

const MIB: u64 = 1 << 20;

/// Why a guest's disk could not be made or its backend and workload read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot write the file set under {}", .0.display())]
    Fileset(PathBuf, #[source] rebound_image::FilesetError),
    #[error("cannot make the file set's image {}", .0.display())]
    Image(PathBuf, #[source] rebound_image::ToolError),
    #[error("cannot remove the file set's scratch files {}", .0.display())]
    Scratch(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Guest(#[from] crate::guest::Error),
    #[error("{name}: no disk on Rebound's backend: {disks}")]
    NoBackend { name: String, disks: Value },
    #[error("{name}: the io workload failed: {detail}")]
    Workload { name: String, detail: Value },
}

/// The file set on an ext4 image, made once per benchmark.
pub(super) fn make_disk(dir: &Path, files: u64) -> Result<PathBuf, Error> {
    let src = dir.join("set");
    rebound_image::write_fileset(&src.join("files"), files, MIB, 1)
        .map_err(|e| Error::Fileset(src.clone(), e))?;
    let img = dir.join("set.ext4");
    let tools = rebound_image::Tools::check().map_err(|e| Error::Image(img.clone(), e))?;
    // Room for the set, ext4's metadata and a little slack.
    let size = format!("{}M", files + files / 8 + 64);
    rebound_image::mkfs_from_dir(&tools, "hcache-set", &src, &img, &size)
        .map_err(|e| Error::Image(img.clone(), e))?;
    std::fs::remove_dir_all(&src).map_err(|e| Error::Scratch(src, e))?;
    Ok(img)
}

/// What one io workload run over the file set is: its pattern and size.
pub(super) struct IoRun<'a> {
    pub pattern: &'a str,
    pub files: u64,
    pub requests: u64,
    /// Rounds of `requests` (0: without end).
    pub rounds: u64,
    pub write_ratio: f64,
}

/// A VM of `memory_mib` running the io workload's file-set mode on `disk`.
pub(super) fn io_spec(name: &str, disk: &Path, memory_mib: u64, run: &IoRun) -> VmSpec {
    let mut s = VmSpec::new(name);
    s.memory_mib = memory_mib;
    s.workload = Some(Workload::Io);
    for (k, v) in [
        ("data_disk", "vdb".to_string()),
        ("io_files", run.files.to_string()),
        ("io_file_size", "1M".into()),
        ("io_pattern", run.pattern.into()),
        ("io_requests", run.requests.to_string()),
        ("io_rounds", run.rounds.to_string()),
        ("io_write_ratio", run.write_ratio.to_string()),
        // Time to move memory to the host cache before the first request.
        ("io_delay_s", "8".into()),
    ] {
        s.workload_args.insert(k.into(), v);
    }
    s.disks = vec![rebound_uncached(disk)];
    s
}

/// The set's disk alone on Rebound's backend, with no cache of its own: every read that
/// misses the guest (and its host cache) is counted there.
pub(super) fn rebound_uncached(disk: &Path) -> String {
    format!(
        "{},backend=rebound,cache=none",
        rebound_api::disk::entry(&disk.display().to_string())
    )
}

/// The backend's answer to `stats` and its pid, from the VM's disks.
pub(super) async fn backend(
    c: &Client,
    name: &str,
) -> Result<(Value, Option<u32>, Option<PathBuf>), Error> {
    let disks: Value = get(c, &format!("/v1/vms/{name}/disks")).await?;
    let d = disks
        .as_array()
        .and_then(|a| a.iter().find(|d| d["backend"] == "rebound"))
        .ok_or_else(|| Error::NoBackend {
            name: name.to_string(),
            disks: disks.clone(),
        })?;
    Ok((
        d["stats"].clone(),
        d["pid"].as_u64().map(|p| p as u32),
        d["control"].as_str().map(PathBuf::from),
    ))
}

/// The io workload's reports of a VM, from its events; its error if it failed.
pub(super) async fn files_reports(c: &Client, name: &str) -> Result<Vec<FilesReport>, Error> {
    let ev: Vec<Value> = get(c, &format!("/v1/vms/{name}/events")).await?;
    if let Some(e) = ev.iter().find(|e| e["kind"] == "agent_error") {
        return Err(Error::Workload {
            name: name.to_string(),
            detail: e["detail"].clone(),
        });
    }
    Ok(ev
        .iter()
        .filter(|e| e["kind"] == "files")
        .filter_map(|e| serde_json::from_value(e["detail"].clone()).ok())
        .collect())
}
