//! Equal host memory for `normal-hostcache`: the warm variant's host cache holds the
//! whole set plus 64 MiB in Rebound's backend, so the QEMU that reads through the host
//! page cache gets exactly that much page cache and no more. Its memory group (the one
//! the daemon started it in, or the slow disk's on a unified hierarchy) is limited to
//! QEMU's own footprint plus the warm cache's size; the kernel then reclaims the
//! image's page cache, the only reclaimable memory in the group (the host has no swap
//! to push the guest's RAM to, and if it had, the check after the run would say so).
//!
//! The guest's RAM file is charged in full to the group before the footprint is
//! measured (`fallocate` from a process inside it keeps every byte the guest wrote):
//! otherwise the guest touching more of its RAM during the load (its own page cache
//! fills with the set) would take the host page cache's share.
//!
//! QEMU's own memory still grows under TCG (its translation buffer fills again after
//! every guest reboot: 120 MB within minutes was seen), and a limit fixed at the start
//! then squeezes the page cache and finally OOM-kills QEMU. So the limit follows
//! QEMU's footprint: every [`FOLLOW`], footprint = the group's usage minus the image's
//! bytes in the page cache, limit = footprint + the cache's size; the image's page
//! cache can never take more than the share, whatever QEMU itself needs.

use std::path::{Path, PathBuf};

use rebound_vmm::cgroup::{CgroupError, Group};
use serde::{Deserialize, Serialize};

/// Why equal host memory could not be set up or did not hold.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find the memory group of QEMU (pid {0})")]
    Group(u32, #[source] CgroupError),
    #[error(
        "QEMU (pid {0}) runs in the root memory group: limiting it would limit the whole host"
    )]
    Root(u32),
    #[error("cannot read or set QEMU's memory group")]
    Cgroup(#[source] CgroupError),
    #[error("cannot tell how much of the image is in the page cache")]
    Cached(#[source] rebound_snapshot::ImageError),
    #[error("the memory limit did not apply: {0}")]
    NotApplied(String),
    #[error("QEMU left the limited memory group {} for {}", .was.display(), .now.display())]
    Left { was: PathBuf, now: PathBuf },
    #[error("the limit could not follow QEMU's footprint: {0}")]
    NotFollowed(String),
    #[error("equal memory did not hold: {0}")]
    NotHeld(String),
    #[error("cannot read the guest's RAM file {}", .0.display())]
    RamFile(PathBuf, #[source] std::io::Error),
    #[error("cannot run fallocate")]
    Fallocate(#[source] std::io::Error),
    #[error("fallocate of {} in {} failed: {why}", .file.display(), .group.display())]
    FallocateFailed {
        file: PathBuf,
        group: PathBuf,
        why: String,
    },
}

/// How often the limit follows QEMU's footprint.
const FOLLOW: std::time::Duration = std::time::Duration::from_millis(100);

/// Page cache the check lets the group exceed its share by: pages the kernel charges
/// before reclaim catches up, and metadata read at boot.
const SLACK: u64 = 4 << 20;

/// What was set, and what held over the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EqualMemory {
    /// The memory group QEMU was in.
    pub group: PathBuf,
    /// The warm variant's host-cache size: the page cache this QEMU may hold.
    pub cache_bytes: u64,
    /// QEMU's footprint when the limit was set: its anonymous memory, the guest's
    /// whole RAM file and kernel memory (everything charged but the image's page
    /// cache); and the largest it was while the limit followed it.
    pub footprint_bytes: u64,
    #[serde(default)]
    pub footprint_max_bytes: u64,
    /// Footprint plus the cache: the group's hard limit at the start.
    pub limit_bytes: u64,
    /// Times the limit was moved after the footprint.
    #[serde(default)]
    pub limit_moves: u64,
    /// After the run: the most the group held, what it holds as file page cache, the
    /// image's bytes in the host page cache (all groups: the most seen while the limit
    /// followed, and at the end), and how often the limit made the kernel reclaim.
    pub peak_bytes: u64,
    pub file_bytes_after: u64,
    #[serde(default)]
    pub image_cached_max_bytes: u64,
    pub image_cached_bytes: u64,
    pub limit_hits: u64,
}

/// What the following thread saw.
#[derive(Debug, Default)]
struct Followed {
    footprint_max: u64,
    image_max: u64,
    moves: u64,
    error: Option<String>,
}

/// The limit on one QEMU's group while its variant runs, following QEMU's footprint;
/// lifted when dropped.
pub struct Limit {
    group: Group,
    qemu_pid: u32,
    pub figures: EqualMemory,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    follower: Option<std::thread::JoinHandle<Followed>>,
}

/// The group's limit for QEMU's footprint and the warm cache's size.
pub fn limit_for(footprint: u64, cache: u64) -> u64 {
    footprint + cache
}

/// Whether the figures show the limit held: the limit still there (`limit_now`, what
/// the group's limit file says, against `want`, the footprint then plus the share),
/// the image's page cache within the share all along; Err says what did not.
pub fn held(f: &EqualMemory, limit_now: u64, want: u64) -> Result<(), String> {
    // Limits are kept in whole pages, and the footprint moves between two looks.
    if limit_now.abs_diff(want) > SLACK {
        return Err(format!(
            "the group's limit is {limit_now} bytes, not the {want} it should be"
        ));
    }
    for (what, v) in [
        (
            "the image's page cache (the most seen)",
            f.image_cached_max_bytes,
        ),
        ("the image's page cache", f.image_cached_bytes),
    ] {
        if v > f.cache_bytes + SLACK {
            return Err(format!(
                "{what} is {} MiB, above the {} MiB share",
                v >> 20,
                f.cache_bytes >> 20
            ));
        }
    }
    Ok(())
}

impl Limit {
    /// Charges the guest's RAM file to QEMU's group, measures QEMU's footprint and
    /// limits the group to it plus `cache_bytes`.
    pub fn apply(
        qemu_pid: u32,
        ram_file: &Path,
        image: &Path,
        cache_bytes: u64,
    ) -> Result<Limit, Error> {
        let group = Group::of_process(qemu_pid).map_err(|e| Error::Group(qemu_pid, e))?;
        if group.is_root() {
            return Err(Error::Root(qemu_pid));
        }
        charge_ram(&group, ram_file)?;
        group.reset_peak().map_err(Error::Cgroup)?;
        let footprint = footprint(&group, image)?;
        let limit = limit_for(footprint, cache_bytes);
        group.set_limit(Some(limit)).map_err(Error::Cgroup)?;
        let figures = EqualMemory {
            group: group.path().to_path_buf(),
            cache_bytes,
            footprint_bytes: footprint,
            limit_bytes: limit,
            ..Default::default()
        };
        held(&figures, group.limit().map_err(Error::Cgroup)?, limit).map_err(Error::NotApplied)?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let follower = {
            let (g, image, stop) = (group.clone(), image.to_path_buf(), stop.clone());
            std::thread::spawn(move || follow(&g, &image, cache_bytes, &stop))
        };
        Ok(Limit {
            group,
            qemu_pid,
            figures,
            stop,
            follower: Some(follower),
        })
    }

    /// What held over the run; fails loudly if the limit did not.
    pub fn check(&mut self, image: &Path) -> Result<EqualMemory, Error> {
        let now = Group::of_process(self.qemu_pid).map_err(|e| Error::Group(self.qemu_pid, e))?;
        if now.path() != self.group.path() {
            return Err(Error::Left {
                was: self.group.path().to_path_buf(),
                now: now.path().to_path_buf(),
            });
        }
        let seen = self.stop_following();
        if let Some(e) = seen.error {
            return Err(Error::NotFollowed(e));
        }
        let f = &mut self.figures;
        f.footprint_max_bytes = seen.footprint_max;
        f.image_cached_max_bytes = seen.image_max;
        f.limit_moves = seen.moves;
        let g = &self.group;
        f.peak_bytes = g.peak().map_err(Error::Cgroup)?;
        f.file_bytes_after = g.charged().map_err(Error::Cgroup)?.file;
        f.image_cached_bytes = rebound_snapshot::cached_bytes(image).map_err(Error::Cached)?;
        f.limit_hits = g.limit_hits().map_err(Error::Cgroup)?;
        let want = limit_for(footprint(g, image)?, f.cache_bytes);
        held(f, g.limit().map_err(Error::Cgroup)?, want).map_err(Error::NotHeld)?;
        Ok(f.clone())
    }

    fn stop_following(&mut self) -> Followed {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.follower
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Limit {
    fn drop(&mut self) {
        self.stop_following();
        let _ = self.group.set_limit(None);
    }
}

/// QEMU's footprint: what its group holds but the image's page cache.
fn footprint(group: &Group, image: &Path) -> Result<u64, Error> {
    let image = rebound_snapshot::cached_bytes(image).map_err(Error::Cached)?;
    Ok(group.usage().map_err(Error::Cgroup)?.saturating_sub(image))
}

/// Moves the limit after QEMU's footprint until `stop`.
fn follow(
    group: &Group,
    image: &Path,
    cache: u64,
    stop: &std::sync::atomic::AtomicBool,
) -> Followed {
    let mut seen = Followed::default();
    let mut set = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let r = (|| -> Result<(), Error> {
            let cached = rebound_snapshot::cached_bytes(image).map_err(Error::Cached)?;
            let own = group.usage().map_err(Error::Cgroup)?.saturating_sub(cached);
            seen.footprint_max = seen.footprint_max.max(own);
            seen.image_max = seen.image_max.max(cached);
            let want = limit_for(own, cache);
            // Moves of less than a MiB are noise of the usage counter.
            if want.abs_diff(set) >= 1 << 20 {
                group.set_limit(Some(want)).map_err(Error::Cgroup)?;
                set = want;
                seen.moves += 1;
            }
            Ok(())
        })();
        if let Err(e) = r {
            seen.error.get_or_insert_with(|| rebound_errors::chain(&e));
        }
        std::thread::sleep(FOLLOW);
    }
    seen
}

/// Allocates every page of the guest's RAM file from a process inside `group`
/// (`fallocate` keeps what is written and charges what it adds to the caller's group).
fn charge_ram(group: &Group, ram_file: &Path) -> Result<(), Error> {
    let size = std::fs::metadata(ram_file)
        .map_err(|e| Error::RamFile(ram_file.to_path_buf(), e))?
        .len();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec fallocate -l "$2" "$3""#)
        .arg("sh")
        .arg(group.path().join("cgroup.procs"))
        .arg(size.to_string())
        .arg(ram_file)
        .output()
        .map_err(Error::Fallocate)?;
    if !out.status.success() {
        return Err(Error::FallocateFailed {
            file: ram_file.to_path_buf(),
            group: group.path().to_path_buf(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(peak: u64, file: u64, image: u64) -> EqualMemory {
        EqualMemory {
            cache_bytes: 259 << 20,
            footprint_bytes: 600 << 20,
            limit_bytes: limit_for(600 << 20, 259 << 20),
            peak_bytes: peak,
            file_bytes_after: file,
            image_cached_max_bytes: image,
            image_cached_bytes: image,
            ..Default::default()
        }
    }

    #[test]
    fn the_limit_is_the_footprint_plus_the_warm_cache() {
        assert_eq!(limit_for(600 << 20, 259 << 20), 859 << 20);
    }

    #[test]
    fn a_run_within_its_share_holds() {
        let f = figures(859 << 20, 259 << 20, 200 << 20);
        assert_eq!(held(&f, f.limit_bytes, f.limit_bytes), Ok(()));
        // The kernel keeps limits in whole pages; the footprint moved a little.
        assert_eq!(
            held(&f, f.limit_bytes - 100, f.limit_bytes + (1 << 20)),
            Ok(())
        );
    }

    #[test]
    fn a_lifted_limit_or_a_cache_above_the_share_fails() {
        let f = figures(800 << 20, 100 << 20, 100 << 20);
        let e = held(&f, u64::MAX, f.limit_bytes).unwrap_err();
        assert!(e.contains("not the"), "{e}");
        let mut f = figures(800 << 20, 100 << 20, 100 << 20);
        f.image_cached_max_bytes = 400 << 20;
        let e = held(&f, f.limit_bytes, f.limit_bytes).unwrap_err();
        assert!(e.contains("(the most seen) is 400 MiB"), "{e}");
        // At the end, after the last look of the follower.
        let mut f = figures(800 << 20, 100 << 20, 300 << 20);
        f.image_cached_max_bytes = 100 << 20;
        let e = held(&f, f.limit_bytes, f.limit_bytes).unwrap_err();
        assert!(
            e.contains("page cache is 300 MiB, above the 259 MiB share"),
            "{e}"
        );
    }
}
