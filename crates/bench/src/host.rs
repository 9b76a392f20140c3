//! Facts about the machine a benchmark runs on, recorded with its figures, and the
//! page cache it must empty before a cold read.

use std::path::Path;

/// The host's CPUs as the scheduler offers them.
pub fn host_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

/// The host kernel's release.
pub fn host_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The host's 1, 5 and 15 minute load averages, as `/proc/loadavg` writes them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Drops every file under a snapshot directory from the page cache, so that the next
/// restore reads cold, and fails if more than 1 MiB of one stayed (a process still
/// maps it): a warm restore would be compared with cold ones.
pub fn drop_cache(dir: &Path) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            drop_cache(&p)?;
        } else if p.is_file() {
            rebound_snapshot::drop_page_cache(&p)?;
            let left = rebound_snapshot::cached_bytes(&p)?;
            if left > 1 << 20 {
                anyhow::bail!(
                    "{} keeps {} MiB in the page cache after it was dropped (a process still maps it): the restore would not read it cold",
                    p.display(),
                    left >> 20
                );
            }
        }
    }
    Ok(())
}

/// Runs `work` to its end, or until SIGINT or SIGTERM: then it is dropped (what it
/// holds is released by its owners' `Drop`) and the run fails saying so.
pub async fn until_interrupted(
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted (SIGINT): the run stopped and cleaned up"),
        _ = term.recv() => anyhow::bail!("terminated (SIGTERM): the run stopped and cleaned up"),
    }
}
