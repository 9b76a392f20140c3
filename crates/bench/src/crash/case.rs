//! What the crash benchmark runs and measures: its options, its cases, one case's
//! figures, and the guest setup every case starts from. Shared by the driver, the
//! dump-size runs and the report.

use std::path::{Path, PathBuf};

use clap::Args;
use rebound_api::{CrashPolicy, Forward, IoPolicy, OnCrash, PageClass, VmSpec};
use serde::Serialize;

use super::Error;
use crate::throttledfs::ThrottledFs;

pub(super) const MB: f64 = 1e6;
pub(super) const MIB: f64 = (1u64 << 20) as f64;

#[derive(Args, Debug)]
pub struct CrashArgs {
    /// Guest memory, e.g. 512M, 1G (a bare number is MiB).
    #[arg(long, default_value = "512M", value_parser = rebound_api::spec::parse_memory_mib)]
    pub(super) memory: u64,
    /// Memory the guest's memfill workload fills before the crash (the default 512 MiB
    /// guest has about 413 MiB available and memfill keeps 16 MiB of it free).
    #[arg(long, default_value = "384M", value_parser = rebound_api::spec::parse_memory_mib)]
    pub(super) fill: u64,
    /// Rounds over the variants (interleaved); medians are printed.
    #[arg(long, default_value_t = 1)]
    pub(super) runs: usize,
    /// Variants to run: a (stock), b, c, d, e (I/O policies), r (recovery restored
    /// from a post-boot snapshot), s (same-memory dumps).
    #[arg(long, default_value = "a,b,c,d,e,r,s")]
    pub(super) variants: String,
    /// Seconds of working-set trace recorded with the post-boot snapshot (r).
    #[arg(long, default_value_t = 8.0)]
    pub(super) trace_s: f64,
    /// What the service reads from its data disk (O_DIRECT) before it is ready in the
    /// I/O-policy variants (e): a disk-bound service, as the paper's boot-time copy.
    #[arg(long, default_value = "256M", value_parser = rebound_api::spec::parse_memory_mib)]
    pub(super) disk_io: u64,
    /// The emulated slow disk's rate, reads and writes together, MB/s.
    #[arg(long, default_value_t = 100)]
    pub(super) disk_mbps: u32,
    /// Chunk size of the dump and the memory handover.
    #[arg(long, default_value = "64M", value_parser = rebound_api::spec::parse_memory_mib)]
    pub(super) chunk: u64,
    /// Memory the recovery VM starts with (the default image's guest, root in RAM,
    /// panicked "deadlocked on memory" when booted with 146 MiB).
    #[arg(long, default_value = "256M", value_parser = rebound_api::spec::parse_memory_mib)]
    pub(super) min_memory: u64,
    #[command(flatten)]
    pub(super) out: crate::out::BenchOut,
}

/// One way of handling the crash.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Case {
    pub(super) id: String,
    pub(super) what: String,
    pub(super) on_crash: OnCrash,
    pub(super) filter: Vec<PageClass>,
    pub(super) io_policy: IoPolicy,
    /// The dump, the guest's disk and the snapshot are on the emulated slow disk.
    pub(super) throttled: bool,
    /// MiB the service reads from its disk before it is ready (0: none).
    pub(super) disk_io_mib: u64,
    /// The recovery VM is restored from the post-boot snapshot (r).
    pub(super) recover_from: bool,
}

/// What one case measured.
#[derive(Debug, Clone, Serialize, Default)]
pub(super) struct Outcome {
    pub(super) case: String,
    /// Crash request to the first answer the client got after it (client side).
    pub(super) downtime_s: f64,
    /// The daemon's downtime: panic to the recovery VM passing readiness (b–e).
    pub(super) daemon_downtime_s: Option<f64>,
    /// The longest time between two answers the client saw.
    pub(super) longest_gap_s: f64,
    pub(super) dump_s: f64,
    pub(super) dump_bytes: u64,
    pub(super) dump_io_bytes: u64,
    pub(super) recovery_s: Option<f64>,
    pub(super) pages_written: u64,
    pub(super) pages_skipped: std::collections::BTreeMap<String, u64>,
    pub(super) notes: Vec<String>,
    /// The service's capacity before the crash and while the dump ran.
    pub(super) capacity: super::capacity::Capacity,
    /// For `a`: the reboot alone (panic seen, kill, boot, service answers), no dump.
    pub(super) reboot_only_s: Option<f64>,
    /// For `r`: the restore's time to running and the pages it read before.
    pub(super) restore_running_s: Option<f64>,
    pub(super) restore_pages_before_start: Option<u64>,
}

/// Where the default image's parts are, and the run's scratch directory.
pub(super) struct Setup {
    pub(super) kernel: String,
    pub(super) initrd: String,
    pub(super) append: String,
    pub(super) disk: PathBuf,
    pub(super) dir: PathBuf,
    pub(super) port: u16,
    pub(super) progress: bool,
    /// The post-boot snapshot the `r` cases recover from.
    pub(super) snapshot: Option<PathBuf>,
    /// The emulated slow disk, and the copy of the snapshot on it.
    pub(super) slow: Option<ThrottledFs>,
    pub(super) slow_snapshot: Option<PathBuf>,
}

impl Setup {
    pub(super) fn spec(
        &self,
        args: &CrashArgs,
        name: &str,
        disk: &Path,
        crash: CrashPolicy,
        disk_io_mib: u64,
    ) -> VmSpec {
        let mut s = VmSpec::new(name);
        s.kernel = Some(self.kernel.clone());
        s.initrd = Some(self.initrd.clone());
        s.append = Some(format!(
            "{} unknown_nmi_panic rebound.workload=memfill,web rebound.memfill={} rebound.disk_io={}",
            self.append,
            args.fill << 20,
            disk_io_mib << 20
        ));
        s.disks = vec![rebound_api::disk::entry(&disk.display().to_string())];
        s.memory_mib = args.memory;
        s.ready = Some("http:8080/".into());
        s.forwards = vec![Forward {
            host: self.port,
            guest: 8080,
        }];
        s.crash = crash;
        s
    }

    /// Where a case's dumps and disk go and the snapshot it restores from: on the
    /// emulated slow disk or on the real one.
    pub(super) fn place(&self, throttled: bool) -> (&Path, Option<&Path>) {
        match (&self.slow, throttled) {
            (Some(fs), true) => (&fs.mount, self.slow_snapshot.as_deref()),
            _ => (&self.dir, self.snapshot.as_deref()),
        }
    }

    pub(super) fn say(&self, m: &str) {
        if self.progress {
            eprintln!("bench crash: {m}");
        }
    }
}

/// A copy of the image's data disk for one guest, so that no case sees another's
/// writes, on the emulated slow disk or the real one.
pub(super) fn copy_disk(setup: &Setup, tag: &str, throttled: bool) -> Result<PathBuf, Error> {
    let d = setup.place(throttled).0.join(format!("{tag}.ext4"));
    std::fs::copy(&setup.disk, &d).map_err(|source| Error::Copy {
        from: setup.disk.clone(),
        to: d.clone(),
        source,
    })?;
    Ok(d)
}
