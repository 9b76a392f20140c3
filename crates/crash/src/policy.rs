//! The arithmetic of a crash policy: the disk I/O rate control between the core dump
//! and the recovery VM (and `auto`'s choice), the host memory budget, and the recovery
//! VM's size as the dump reclaims the crashed VM's memory chunk by chunk.

use rebound_api::{CrashPolicy, IoPolicy};

pub(crate) const MIB: u64 = 1 << 20;

/// `dump-first` holds the recovery VM's disks, `recovery-first` the dump, to this
/// (bytes per second).
pub const SLOW: u64 = 10_000_000;
/// `auto` calls a service disk-bound above this average rate, in bytes per second.
pub const DISK_BOUND: u64 = 5_000_000;
/// `auto` calls a recovery VM disk-bound when its throttled disks move this share of
/// the cap or more.
const DISK_BOUND_SHARE: f64 = 0.8;
/// `auto` measures the recovery VM's disks over at least this long, in nanoseconds.
const WATCH_NS: u64 = 500_000_000;

/// What the recovery QEMU itself may hold besides guest memory (TCG's code cache,
/// QEMU's heap, page tables), on top of the budget in the memory group's limit.
/// Measured here: a TCG QEMU of a 512 MiB guest holds ~80 MiB of anonymous memory
/// after boot, plus the page cache of what it reads (kernel, initrd, disk), which the
/// kernel reclaims at the limit rather than failing.
pub const QEMU_FOOTPRINT_MIB: u64 = 256;

/// While a dump and a recovery VM share the disk: the dump's rate and the recovery
/// VM's disk rate, in bytes per second (0: unlimited), as the I/O policy says.
/// `dump-first` holds the recovery VM's disks to 10 MB/s; `recovery-first` holds the
/// dump to 10 MB/s until the recovery VM is ready; `D:R` fixes both.
pub fn io_rates(p: IoPolicy, recovery_ready: bool) -> (u64, u64) {
    match p {
        IoPolicy::Fair => (0, 0),
        // Until `auto` is resolved, as dump-first.
        IoPolicy::DumpFirst | IoPolicy::Auto => (0, SLOW),
        IoPolicy::RecoveryFirst => (if recovery_ready { 0 } else { SLOW }, 0),
        IoPolicy::Rates {
            dump_mbps,
            recovery_mbps,
        } => (
            dump_mbps as u64 * 1_000_000,
            recovery_mbps as u64 * 1_000_000,
        ),
    }
}

/// The host memory a crash may use: the guest memory both VMs may hold together, and
/// the memory group's hard limit (the budget plus the recovery QEMU's footprint), in
/// bytes.
pub fn budget_bytes(policy: &CrashPolicy, memory_mib: u64) -> (u64, u64) {
    let budget = policy.budget_mib(memory_mib) * MIB;
    (budget, budget + QEMU_FOOTPRINT_MIB * MIB)
}

/// What the budget leaves for the recovery VM while the crashed RAM holds
/// `crashed_bytes`, in MiB.
pub fn free_mib(policy: &CrashPolicy, memory_mib: u64, crashed_bytes: u64) -> u64 {
    policy
        .budget_mib(memory_mib)
        .saturating_sub(crashed_bytes.div_ceil(MIB))
}

/// Rounds down to the memory device's block size.
pub fn round_block(mib: u64, block_mib: u64) -> u64 {
    mib / block_mib * block_mib
}

/// The recovery VM's boot memory when the budget leaves `free` MiB: `None` when it can
/// start now with all its memory (or restored, which has all its memory configured
/// from the start and holds what it touches), else a block-rounded size no smaller
/// than the minimum; never started below the minimum (the outer `None`).
pub fn boot_mib(
    policy: &CrashPolicy,
    memory_mib: u64,
    block_mib: u64,
    free: u64,
) -> Option<Option<u64>> {
    if free < policy.min_memory_mib {
        return None;
    }
    if free >= memory_mib || policy.recover_from.is_some() {
        return Some(None);
    }
    Some(Some(
        round_block(free, block_mib).max(policy.min_memory_mib),
    ))
}

/// The recovery VM's size once the budget leaves `free` MiB, if it is more than the
/// `now` MiB it has.
pub fn grown_mib(memory_mib: u64, block_mib: u64, now: u64, free: u64) -> Option<u64> {
    if now >= memory_mib {
        return None;
    }
    let target = round_block(free.min(memory_mib), block_mib);
    (target > now).then_some(target)
}

/// `auto` at the crash: a service that was disk-bound (its disks moved `DISK_BOUND`
/// or more on average over `secs` since the VM started) gets the disk first. Otherwise
/// the choice waits for what the recovery VM does, held as `dump-first` meanwhile.
///
/// The Vicover paper gives a memory-critical recovery (the budget lets the recovery VM
/// start with less than the VM's memory) the dump first, since the dump is what gives
/// it memory. Measured on one disk shared by the dump and the recovery VM (2 GiB, 100
/// MB/s, 2026-11-28), that rule held a disk-bound recovery VM to 10 MB/s for the whole
/// dump: 20.6 s of downtime against 2.5 s with the disk first. A memory-critical
/// recovery still starts as `dump-first`, and stays so unless its disks show it is
/// disk-bound.
pub fn auto_at_crash(disk: Option<(u64, f64)>) -> Option<(IoPolicy, String)> {
    let (bytes, secs) = disk?;
    let secs = secs.max(1.0);
    let rate = bytes as f64 / secs;
    (rate >= DISK_BOUND as f64).then(|| {
        (
            IoPolicy::RecoveryFirst,
            format!(
                "the crashed VM's disks moved {:.1} MB/s on average over {secs:.0} s",
                rate / 1e6
            ),
        )
    })
}

/// `auto` while the dump runs and the recovery VM is not ready: its disks moved from
/// `(b0, t0)` to `(bytes, now)` (bytes, nanoseconds). `None` while the look is too
/// short to judge; `Some(None)` when it was judged and found not disk-bound.
pub fn auto_watching(
    (b0, t0): (u64, u64),
    (bytes, now): (u64, u64),
) -> Option<Option<(IoPolicy, String)>> {
    if now.saturating_sub(t0) < WATCH_NS {
        return None;
    }
    let secs = now.saturating_sub(t0) as f64 / 1e9;
    let rate = bytes.saturating_sub(b0) as f64 / secs;
    Some((rate >= DISK_BOUND_SHARE * SLOW as f64).then(|| {
        (
            IoPolicy::RecoveryFirst,
            format!(
                "the recovery VM kept its disks at {:.1} MB/s while held to {} MB/s",
                rate / 1e6,
                SLOW / 1_000_000
            ),
        )
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_the_policy() {
        assert_eq!(io_rates(IoPolicy::Fair, false), (0, 0));
        assert_eq!(io_rates(IoPolicy::DumpFirst, true), (0, SLOW));
        assert_eq!(io_rates(IoPolicy::Auto, false), (0, SLOW));
        assert_eq!(io_rates(IoPolicy::RecoveryFirst, false), (SLOW, 0));
        assert_eq!(io_rates(IoPolicy::RecoveryFirst, true), (0, 0));
        let r = IoPolicy::Rates {
            dump_mbps: 30,
            recovery_mbps: 5,
        };
        assert_eq!(io_rates(r, false), (30_000_000, 5_000_000));
    }

    #[test]
    fn recovery_is_sized_by_the_budget() {
        let p = CrashPolicy {
            host_memory_budget_mib: Some(600),
            min_memory_mib: 128,
            ..CrashPolicy::default()
        };
        assert_eq!(budget_bytes(&p, 512), (600 * MIB, (600 + 256) * MIB));
        // 512 MiB crashed RAM less a part of a MiB: 89 MiB left, below the minimum.
        assert_eq!(free_mib(&p, 512, 511 * MIB + 1), 88);
        assert_eq!(boot_mib(&p, 512, 2, 88), None);
        assert_eq!(boot_mib(&p, 512, 2, 129), Some(Some(128)));
        assert_eq!(boot_mib(&p, 512, 2, 301), Some(Some(300)));
        assert_eq!(boot_mib(&p, 512, 2, 600), Some(None));
        assert_eq!(grown_mib(512, 2, 300, 301), None);
        assert_eq!(grown_mib(512, 2, 300, 451), Some(450));
        assert_eq!(grown_mib(512, 2, 300, 600), Some(512));
        assert_eq!(grown_mib(512, 2, 512, 600), None);
    }
}
