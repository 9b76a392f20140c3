//! Facts about the machine a benchmark runs on, recorded with its figures, and the
//! page cache it must empty before a cold read.

use std::path::{Path, PathBuf};

/// Why the page cache of a snapshot could not be emptied.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot list {}", .0.display())]
    List(PathBuf, #[source] std::io::Error),
    #[error("cannot drop {} from the page cache", .0.display())]
    Drop(PathBuf, #[source] rebound_snapshot::ImageError),
    #[error("{} keeps {mib} MiB in the page cache after it was dropped (a process still maps it): the restore would not read it cold", .path.display())]
    StillCached { path: PathBuf, mib: u64 },
}

/// Why a run stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum Interrupted {
    #[error("cannot watch for SIGTERM")]
    Watch(#[source] std::io::Error),
    #[error("interrupted (SIGINT): the run stopped and cleaned up")]
    Int,
    #[error("terminated (SIGTERM): the run stopped and cleaned up")]
    Term,
}

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
pub fn drop_cache(dir: &Path) -> Result<(), CacheError> {
    let list = |e| CacheError::List(dir.to_path_buf(), e);
    for e in std::fs::read_dir(dir).map_err(list)? {
        let p = e.map_err(list)?.path();
        if p.is_dir() {
            drop_cache(&p)?;
        } else if p.is_file() {
            let left = rebound_snapshot::drop_page_cache(&p)
                .and_then(|()| rebound_snapshot::cached_bytes(&p))
                .map_err(|e| CacheError::Drop(p.clone(), e))?;
            if left > 1 << 20 {
                return Err(CacheError::StillCached {
                    path: p,
                    mib: left >> 20,
                });
            }
        }
    }
    Ok(())
}

/// Runs `work` to its end, or until SIGINT or SIGTERM: then it is dropped (what it
/// holds is released by its owners' `Drop`) and the run fails saying so.
pub async fn until_interrupted<E: From<Interrupted>>(
    work: impl std::future::Future<Output = Result<(), E>>,
) -> Result<(), E> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(Interrupted::Watch)?;
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(Interrupted::Int.into()),
        _ = term.recv() => Err(Interrupted::Term.into()),
    }
}
