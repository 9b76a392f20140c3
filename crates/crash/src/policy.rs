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
/// `auto` holds the dump for a recovery VM that boots at most this long, in
/// nanoseconds, unless the service was disk-bound: a boot under TCG takes 2.5-5 s
/// here, and a recovery VM not ready after this is more likely waiting for memory,
/// which only the dump frees.
pub const AUTO_HOLD_NS: u64 = 10_000_000_000;

/// What the recovery QEMU itself may hold besides guest memory (TCG's code cache,
/// QEMU's heap, page tables), on top of the budget in the memory group's limit.
/// Measured here: a TCG QEMU of a 512 MiB guest holds ~80 MiB of anonymous memory
/// after boot, plus the page cache of what it reads (kernel, initrd, disk), which the
/// kernel reclaims at the limit rather than failing.
pub const QEMU_FOOTPRINT_MIB: u64 = 256;

/// Where the recovery VM stands, for the I/O rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Not running (not started yet, or none in this policy).
    Absent,
    /// Running, its service not answering yet.
    Booting,
    /// Its service answers.
    Ready,
}

/// While a dump and a recovery VM share the disk: the dump's rate and the recovery
/// VM's disk rate, in bytes per second (0: unlimited), as the I/O policy says.
/// `dump-first` holds the recovery VM's disks to 10 MB/s; `recovery-first` (and `auto`
/// until it decides otherwise) holds the dump to 10 MB/s while the recovery VM boots:
/// not before it runs, since the dump frees the memory it starts with; `D:R` fixes
/// both.
pub fn io_rates(p: IoPolicy, recovery: Recovery) -> (u64, u64) {
    match p {
        IoPolicy::Fair => (0, 0),
        IoPolicy::DumpFirst => (0, SLOW),
        IoPolicy::RecoveryFirst | IoPolicy::Auto => match recovery {
            Recovery::Booting => (SLOW, 0),
            Recovery::Absent | Recovery::Ready => (0, 0),
        },
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
/// or more on average over `secs` since the VM started) gets the disk first for as
/// long as its recovery VM boots. Any other keeps `auto`'s bounded hold.
///
/// The Vicover paper gives a recovery that is not I/O-intensive the dump first. On one
/// disk shared by the dump and the recovery VM (2 GiB, 100 MB/s, 2026-11-28) even a
/// service that reads little waited behind the dump's writes (1.21x a plain reboot,
/// no limit on either); a disk-bound one came back in 0.96-1.0x with the dump held
/// while its recovery VM booted, and in 8x with its disks held for the whole dump.
/// So `auto` holds the dump while any recovery VM boots: boundedly
/// ([`auto_hold_over`]) unless the service is known to be disk-bound.
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

/// `auto`, undecided, with the recovery VM started at `spawned` (ns) and not ready
/// at `now`: past the hold, the dump goes first.
pub fn auto_hold_over(spawned: u64, now: u64) -> Option<(IoPolicy, String)> {
    (now.saturating_sub(spawned) >= AUTO_HOLD_NS).then(|| {
        (
            IoPolicy::DumpFirst,
            format!(
                "the recovery VM was not ready {} s after it started: the dump, which frees \
                 the memory it grows into, goes first",
                AUTO_HOLD_NS / 1_000_000_000
            ),
        )
    })
}

/// `auto`, undecided, when the recovery VM's service answered `secs` after it started.
pub fn auto_at_ready(secs: f64) -> (IoPolicy, String) {
    (
        IoPolicy::RecoveryFirst,
        format!(
            "the recovery VM's boot had the disk first (the dump held to {} MB/s) and its \
             service answered {secs:.1} s after it started",
            SLOW / 1_000_000
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_the_policy() {
        use Recovery::*;
        assert_eq!(io_rates(IoPolicy::Fair, Booting), (0, 0));
        assert_eq!(io_rates(IoPolicy::DumpFirst, Ready), (0, SLOW));
        for p in [IoPolicy::Auto, IoPolicy::RecoveryFirst] {
            assert_eq!(io_rates(p, Absent), (0, 0), "the dump frees its memory");
            assert_eq!(io_rates(p, Booting), (SLOW, 0));
            assert_eq!(io_rates(p, Ready), (0, 0));
        }
        let r = IoPolicy::Rates {
            dump_mbps: 30,
            recovery_mbps: 5,
        };
        assert_eq!(io_rates(r, Absent), (30_000_000, 5_000_000));
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
