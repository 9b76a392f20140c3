//! The hcache runs' guests and their disk: the file set on an ext4 image, the io
//! workload over it, and what the backend and the workload report. Shared by the
//! settings and curve runs, the allocation runs and the web pattern.

use std::path::{Path, PathBuf};

use hyper::Method;
use rebound_api::{FilesReport, VmSpec, Workload};
use rebound_client::Client;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The file set on an ext4 image, made once per benchmark.
pub(super) fn make_disk(dir: &Path, files: u64) -> anyhow::Result<PathBuf> {
    let src = dir.join("set");
    rebound_image::write_fileset(&src.join("files"), files, MIB, 1)?;
    let img = dir.join("set.ext4");
    let tools = rebound_image::Tools::check()?;
    // Room for the set, ext4's metadata and a little slack.
    let size = format!("{}M", files + files / 8 + 64);
    rebound_image::mkfs_from_dir(&tools, "hcache-set", &src, &img, &size)?;
    std::fs::remove_dir_all(&src)?;
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
) -> anyhow::Result<(Value, Option<u32>, Option<PathBuf>)> {
    let disks: Value = c
        .call(Method::GET, &format!("/v1/vms/{name}/disks"), None)
        .await?;
    let d = disks
        .as_array()
        .and_then(|a| a.iter().find(|d| d["backend"] == "rebound"))
        .ok_or_else(|| anyhow::anyhow!("{name}: no disk on Rebound's backend: {disks}"))?;
    Ok((
        d["stats"].clone(),
        d["pid"].as_u64().map(|p| p as u32),
        d["control"].as_str().map(PathBuf::from),
    ))
}

/// The io workload's reports of a VM, from its events; its error if it failed.
pub(super) async fn files_reports(c: &Client, name: &str) -> anyhow::Result<Vec<FilesReport>> {
    let ev: Vec<Value> = c
        .call(Method::GET, &format!("/v1/vms/{name}/events"), None)
        .await?;
    if let Some(e) = ev.iter().find(|e| e["kind"] == "agent_error") {
        anyhow::bail!("{name}: the io workload failed: {}", e["detail"]);
    }
    Ok(ev
        .iter()
        .filter(|e| e["kind"] == "files")
        .filter_map(|e| serde_json::from_value(e["detail"].clone()).ok())
        .collect())
}
