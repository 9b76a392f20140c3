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

use std::path::{Path, PathBuf};

use anyhow::Context;
use rebound_vmm::cgroup::Group;
use serde::{Deserialize, Serialize};

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
    /// whole RAM file and kernel memory (everything charged but file page cache).
    pub footprint_bytes: u64,
    /// Footprint plus the cache: the group's hard limit.
    pub limit_bytes: u64,
    /// After the run: the most the group held, what it holds as file page cache, the
    /// image's bytes in the host page cache (all groups), and how often the limit
    /// made the kernel reclaim.
    pub peak_bytes: u64,
    pub file_bytes_after: u64,
    pub image_cached_bytes: u64,
    pub limit_hits: u64,
}

/// The limit on one QEMU's group while its variant runs; lifted when dropped.
pub struct Limit {
    group: Group,
    qemu_pid: u32,
    pub figures: EqualMemory,
}

/// The group's limit for QEMU's footprint and the warm cache's size.
pub fn limit_for(footprint: u64, cache: u64) -> u64 {
    footprint + cache
}

/// Whether the figures show the limit held: still set as asked, the group never above
/// it, its file cache and the image's within the cache's size; Err says what did not.
pub fn held(f: &EqualMemory, limit_now: u64) -> Result<(), String> {
    // Limits are kept in whole pages.
    if limit_now.abs_diff(f.limit_bytes) >= 4096 {
        return Err(format!(
            "the group's limit is {limit_now} bytes, not the {} set",
            f.limit_bytes
        ));
    }
    if f.peak_bytes > f.limit_bytes + SLACK {
        return Err(format!(
            "the group held up to {} MiB, above its {} MiB limit",
            f.peak_bytes >> 20,
            f.limit_bytes >> 20
        ));
    }
    for (what, v) in [
        ("the group's file page cache", f.file_bytes_after),
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
    pub fn apply(qemu_pid: u32, ram_file: &Path, cache_bytes: u64) -> anyhow::Result<Limit> {
        let group = Group::of_process(qemu_pid)
            .with_context(|| format!("the memory group of QEMU (pid {qemu_pid})"))?;
        if group.is_root() {
            anyhow::bail!(
                "QEMU (pid {qemu_pid}) runs in the root memory group: limiting it would limit the whole host"
            );
        }
        charge_ram(&group, ram_file)?;
        group.reset_peak()?;
        let usage = group.usage()?;
        let footprint = usage.saturating_sub(group.charged()?.file);
        let limit = limit_for(footprint, cache_bytes);
        group.set_limit(Some(limit))?;
        let figures = EqualMemory {
            group: group.path().to_path_buf(),
            cache_bytes,
            footprint_bytes: footprint,
            limit_bytes: limit,
            ..Default::default()
        };
        let now = group.limit()?;
        held(&figures, now).map_err(|e| anyhow::anyhow!("the memory limit did not apply: {e}"))?;
        Ok(Limit {
            group,
            qemu_pid,
            figures,
        })
    }

    /// What held over the run; fails loudly if the limit did not.
    pub fn check(&mut self, image: &Path) -> anyhow::Result<EqualMemory> {
        let now = Group::of_process(self.qemu_pid)?;
        if now.path() != self.group.path() {
            anyhow::bail!(
                "QEMU left the limited memory group {} for {}",
                self.group.path().display(),
                now.path().display()
            );
        }
        let f = &mut self.figures;
        f.peak_bytes = self.group.peak()?;
        f.file_bytes_after = self.group.charged()?.file;
        f.image_cached_bytes = rebound_snapshot::cached_bytes(image)?;
        f.limit_hits = self.group.limit_hits()?;
        held(f, self.group.limit()?)
            .map_err(|e| anyhow::anyhow!("equal memory did not hold: {e}"))?;
        Ok(f.clone())
    }
}

impl Drop for Limit {
    fn drop(&mut self) {
        let _ = self.group.set_limit(None);
    }
}

/// Allocates every page of the guest's RAM file from a process inside `group`
/// (`fallocate` keeps what is written and charges what it adds to the caller's group).
fn charge_ram(group: &Group, ram_file: &Path) -> anyhow::Result<()> {
    let size = std::fs::metadata(ram_file)
        .with_context(|| format!("the guest's RAM file {}", ram_file.display()))?
        .len();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1" && exec fallocate -l "$2" "$3""#)
        .arg("sh")
        .arg(group.path().join("cgroup.procs"))
        .arg(size.to_string())
        .arg(ram_file)
        .output()
        .context("cannot run fallocate")?;
    if !out.status.success() {
        anyhow::bail!(
            "fallocate of {} in {} failed: {}",
            ram_file.display(),
            group.path().display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
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
        assert_eq!(held(&f, f.limit_bytes), Ok(()));
        // The kernel keeps limits in whole pages.
        assert_eq!(held(&f, f.limit_bytes - 100), Ok(()));
    }

    #[test]
    fn a_lifted_limit_or_a_cache_above_the_share_fails() {
        let f = figures(800 << 20, 100 << 20, 100 << 20);
        let e = held(&f, u64::MAX).unwrap_err();
        assert!(e.contains("not the"), "{e}");
        let f = figures(800 << 20, 300 << 20, 100 << 20);
        let e = held(&f, f.limit_bytes).unwrap_err();
        assert!(e.contains("group's file page cache is 300 MiB"), "{e}");
        let f = figures(800 << 20, 100 << 20, 400 << 20);
        let e = held(&f, f.limit_bytes).unwrap_err();
        assert!(e.contains("image's page cache is 400 MiB"), "{e}");
        let f = figures(900 << 20, 100 << 20, 100 << 20);
        let e = held(&f, f.limit_bytes).unwrap_err();
        assert!(e.contains("above its 859 MiB limit"), "{e}");
    }
}
