//! A VM's crash policy (`VmSpec.crash`): what Rebound does when the guest panics or
//! hangs, as `rebound vm start --on-crash ...` sets it. It is part of the VM's record
//! and survives a daemon restart.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::parse::SpecError;

/// What happens after a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnCrash {
    /// Keep the crashed guest paused with its RAM, as it is.
    #[default]
    None,
    /// Dump its memory; no recovery VM.
    Dump,
    /// Start a recovery VM at once; no dump.
    Recover,
    /// Dump, then start the recovery VM (the sequential baseline).
    DumpThenRecover,
    /// Dump and recover at the same time, handing memory over chunk by chunk.
    DumpAndRecover,
}

impl OnCrash {
    pub fn dumps(self) -> bool {
        matches!(
            self,
            OnCrash::Dump | OnCrash::DumpThenRecover | OnCrash::DumpAndRecover
        )
    }
    pub fn recovers(self) -> bool {
        matches!(
            self,
            OnCrash::Recover | OnCrash::DumpThenRecover | OnCrash::DumpAndRecover
        )
    }
}

/// The dump's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpFormat {
    /// ELF core (`crash`, `makedumpfile` read it).
    #[default]
    Elf,
    /// kdump-compressed (diskdump), as `makedumpfile -c/-l/-z` writes.
    Kdump,
}

/// Page compression of a kdump-compressed dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compress {
    #[default]
    None,
    Zstd,
    Lz4,
    Zlib,
}

/// Classes of pages a selective dump can leave out (makedumpfile's dump levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageClass {
    Zero,
    Free,
    Cache,
    User,
}

/// How disk bandwidth is shared between the dump and the recovery VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "policy")]
pub enum IoPolicy {
    /// Both run unthrottled.
    Fair,
    /// The recovery VM's disks are throttled while the dump runs.
    DumpFirst,
    /// The dump is held back while the recovery VM boots (not before it runs: the
    /// dump frees the memory it starts with).
    RecoveryFirst,
    /// The default. The dump runs at full rate until the recovery VM runs, is held
    /// while it boots (its reads would wait behind the dump's writes on a shared
    /// disk), and runs at full rate once the service answers. The hold is unbounded
    /// for a service that was disk-bound (the crashed VM's disks moved 5 MB/s or more
    /// on average since it started); for any other it lasts at most 10 s, after which
    /// the dump goes first (`dump-first`: a recovery that long is more likely waiting
    /// for memory, which the dump frees). The report says which and why.
    #[default]
    Auto,
    /// Fixed rates in MB/s for the dump and the recovery VM's disks.
    Rates { dump_mbps: u32, recovery_mbps: u32 },
}

/// A VM's crash policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashPolicy {
    #[serde(default)]
    pub on_crash: OnCrash,
    /// Where dumps go (default: `$REBOUND_HOME/vms/NAME/crashes/ID/`).
    #[serde(default)]
    pub dump_dir: Option<String>,
    #[serde(default)]
    pub dump_format: DumpFormat,
    #[serde(default)]
    pub compress: Compress,
    /// Page classes left out of the dump (none by default).
    #[serde(default)]
    pub filter: Vec<PageClass>,
    #[serde(default = "default_chunk")]
    pub chunk_mib: u64,
    /// Memory the recovery VM starts with.
    #[serde(default = "default_min_memory")]
    pub min_memory_mib: u64,
    #[serde(default)]
    pub io_policy: IoPolicy,
    /// What the crashed VM and its recovery VM may hold together (default: the VM's
    /// memory plus `min_memory_mib`).
    #[serde(default)]
    pub host_memory_budget_mib: Option<u64>,
    /// Absolute path of a post-boot snapshot of this VM's guest: the recovery VM is
    /// restored from it (elastically) instead of booted. It comes back at the
    /// snapshot's state, disks included; the crashed VM's disk is kept aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recover_from: Option<String>,
    /// Start the recovery VM warm: while the guest runs, its cached file pages are
    /// listed every few seconds; the booted recovery VM reads the last list back, from
    /// the host's block cache when Rebound serves the disk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
}

fn default_chunk() -> u64 {
    128
}

fn default_min_memory() -> u64 {
    128
}

impl Default for CrashPolicy {
    fn default() -> Self {
        CrashPolicy {
            on_crash: OnCrash::None,
            dump_dir: None,
            dump_format: DumpFormat::Elf,
            compress: Compress::None,
            filter: Vec::new(),
            chunk_mib: default_chunk(),
            min_memory_mib: default_min_memory(),
            io_policy: IoPolicy::Auto,
            host_memory_budget_mib: None,
            recover_from: None,
            warm: false,
        }
    }
}

impl CrashPolicy {
    /// The budget in force: the given one, or memory + min-memory.
    pub fn budget_mib(&self, memory_mib: u64) -> u64 {
        self.host_memory_budget_mib
            .unwrap_or(memory_mib + self.min_memory_mib)
    }

    /// Refuses contradictions, each with one line.
    pub fn validate(&self, memory_mib: u64) -> Result<(), SpecError> {
        let bad = |m: String| Err(SpecError::CrashPolicy(m));
        if self.compress != Compress::None && self.dump_format != DumpFormat::Kdump {
            return bad("--compress applies to --dump-format kdump only".into());
        }
        if self.compress == Compress::Lz4 {
            return bad(
                "--compress lz4: neither crash nor makedumpfile reads lz4 kdump files; use zstd, zlib or none"
                    .into(),
            );
        }
        if self.chunk_mib == 0 || self.chunk_mib > memory_mib.max(1) {
            return bad(format!(
                "--chunk {} MiB must be between 1 MiB and the VM's memory ({memory_mib} MiB)",
                self.chunk_mib
            ));
        }
        if self.min_memory_mib < 16 || self.min_memory_mib > memory_mib {
            return bad(format!(
                "--min-memory {} MiB must be between 16 MiB and the VM's memory ({memory_mib} MiB)",
                self.min_memory_mib
            ));
        }
        if let Some(b) = self.host_memory_budget_mib {
            if b < self.min_memory_mib {
                return bad(format!(
                    "--host-memory-budget {b} MiB is below --min-memory {} MiB: the recovery VM could never start",
                    self.min_memory_mib
                ));
            }
        }
        if let IoPolicy::Rates {
            dump_mbps,
            recovery_mbps,
        } = self.io_policy
        {
            if dump_mbps == 0 || recovery_mbps == 0 {
                return bad("--io-policy D:R rates must be at least 1 MB/s".into());
            }
        }
        if let Some(dir) = &self.recover_from {
            if !self.on_crash.recovers() {
                return bad(
                    "--recover-from needs --on-crash recover, dump-then-recover or dump-and-recover"
                        .into(),
                );
            }
            if !dir.starts_with('/') {
                return bad(format!("--recover-from {dir:?} must be an absolute path"));
            }
        }
        if self.warm && !self.on_crash.recovers() {
            return bad(
                "--warm needs --on-crash recover, dump-then-recover or dump-and-recover".into(),
            );
        }
        if self.warm && self.recover_from.is_some() {
            return bad(
                "--warm with --recover-from: a recovery VM restored from a snapshot has the snapshot's cache already"
                    .into(),
            );
        }
        let dump_only = [
            (self.dump_dir.is_some(), "--dump-dir"),
            (!self.filter.is_empty(), "--filter"),
        ];
        if !self.on_crash.dumps() {
            if let Some((_, flag)) = dump_only.iter().find(|(set, _)| *set) {
                return bad(format!(
                    "{flag} needs --on-crash dump, dump-then-recover or dump-and-recover"
                ));
            }
        }
        Ok(())
    }
}

macro_rules! from_str_kebab {
    ($t:ty, $what:literal, $expected:literal) => {
        impl FromStr for $t {
            type Err = SpecError;
            fn from_str(s: &str) -> Result<Self, SpecError> {
                serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
                    SpecError::CrashPolicy(format!(
                        concat!("unknown ", $what, " {:?}: expected ", $expected),
                        s
                    ))
                })
            }
        }
    };
}

from_str_kebab!(
    OnCrash,
    "--on-crash",
    "none, dump, recover, dump-then-recover or dump-and-recover"
);
from_str_kebab!(DumpFormat, "--dump-format", "elf or kdump");
from_str_kebab!(Compress, "--compress", "none, zstd, lz4 or zlib");
from_str_kebab!(PageClass, "page class", "zero, free, cache or user");

/// Parses `--filter zero,free,...` (`none` for nothing).
pub fn parse_filter(s: &str) -> Result<Vec<PageClass>, SpecError> {
    if s == "none" || s.is_empty() {
        return Ok(Vec::new());
    }
    let mut v: Vec<PageClass> = s.split(',').map(str::parse).collect::<Result<_, _>>()?;
    v.sort();
    v.dedup();
    Ok(v)
}

impl FromStr for IoPolicy {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Ok(match s {
            "fair" => IoPolicy::Fair,
            "dump-first" => IoPolicy::DumpFirst,
            "recovery-first" => IoPolicy::RecoveryFirst,
            "auto" => IoPolicy::Auto,
            _ => {
                let err = || {
                    SpecError::CrashPolicy(format!(
                        "unknown --io-policy {s:?}: expected dump-first, recovery-first, fair, auto or D:R (MB/s)"
                    ))
                };
                let (d, r) = s.split_once(':').ok_or_else(err)?;
                IoPolicy::Rates {
                    dump_mbps: d.parse().map_err(|_| err())?,
                    recovery_mbps: r.parse().map_err(|_| err())?,
                }
            }
        })
    }
}

impl fmt::Display for IoPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IoPolicy::Fair => f.write_str("fair"),
            IoPolicy::DumpFirst => f.write_str("dump-first"),
            IoPolicy::RecoveryFirst => f.write_str("recovery-first"),
            IoPolicy::Auto => f.write_str("auto"),
            IoPolicy::Rates {
                dump_mbps,
                recovery_mbps,
            } => write!(f, "{dump_mbps}:{recovery_mbps}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_flags() {
        assert_eq!(
            "dump-and-recover".parse::<OnCrash>().unwrap(),
            OnCrash::DumpAndRecover
        );
        assert!("sometimes".parse::<OnCrash>().is_err());
        assert_eq!("kdump".parse::<DumpFormat>().unwrap(), DumpFormat::Kdump);
        assert_eq!(
            parse_filter("free,zero,free").unwrap(),
            vec![PageClass::Zero, PageClass::Free]
        );
        assert_eq!(parse_filter("none").unwrap(), vec![]);
        assert!(parse_filter("zero,kernel").is_err());
        assert_eq!(
            "100:20".parse::<IoPolicy>().unwrap(),
            IoPolicy::Rates {
                dump_mbps: 100,
                recovery_mbps: 20
            }
        );
        assert_eq!("100:20".parse::<IoPolicy>().unwrap().to_string(), "100:20");
        assert!("100:".parse::<IoPolicy>().is_err());
        assert!("fast".parse::<IoPolicy>().is_err());
    }

    #[test]
    fn refuses_contradictions() {
        let p = |f: &dyn Fn(&mut CrashPolicy)| {
            let mut c = CrashPolicy {
                on_crash: OnCrash::DumpAndRecover,
                ..CrashPolicy::default()
            };
            f(&mut c);
            c.validate(1024)
        };
        assert!(p(&|_| {}).is_ok());
        assert_eq!(CrashPolicy::default().budget_mib(1024), 1152);
        for (f, want) in [
            (
                &(|c: &mut CrashPolicy| c.host_memory_budget_mib = Some(64))
                    as &dyn Fn(&mut CrashPolicy),
                "below --min-memory",
            ),
            (
                &|c: &mut CrashPolicy| c.compress = Compress::Zstd,
                "kdump only",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.dump_format = DumpFormat::Kdump;
                    c.compress = Compress::Lz4
                },
                "lz4",
            ),
            (&|c: &mut CrashPolicy| c.chunk_mib = 0, "--chunk"),
            (
                &|c: &mut CrashPolicy| c.min_memory_mib = 2048,
                "--min-memory",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.on_crash = OnCrash::Recover;
                    c.filter = vec![PageClass::Free]
                },
                "--filter needs",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.io_policy = IoPolicy::Rates {
                        dump_mbps: 0,
                        recovery_mbps: 1,
                    }
                },
                "at least 1 MB/s",
            ),
            (
                &|c: &mut CrashPolicy| c.recover_from = Some("snap".into()),
                "must be an absolute path",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.on_crash = OnCrash::Dump;
                    c.warm = true
                },
                "--warm needs",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.on_crash = OnCrash::Recover;
                    c.warm = true;
                    c.recover_from = Some("/snap".into())
                },
                "has the snapshot's cache already",
            ),
            (
                &|c: &mut CrashPolicy| {
                    c.on_crash = OnCrash::Dump;
                    c.recover_from = Some("/snap".into())
                },
                "--recover-from needs",
            ),
        ] {
            let e = p(f).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn json_form() {
        let c = CrashPolicy {
            on_crash: OnCrash::DumpThenRecover,
            filter: vec![PageClass::Free],
            io_policy: IoPolicy::Rates {
                dump_mbps: 100,
                recovery_mbps: 50,
            },
            ..CrashPolicy::default()
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["on_crash"], "dump-then-recover");
        assert_eq!(v["io_policy"]["policy"], "rates");
        assert_eq!(serde_json::from_value::<CrashPolicy>(v).unwrap(), c);
        // Old records without a policy read as none.
        let c: CrashPolicy = serde_json::from_str("{}").unwrap();
        assert_eq!(c, CrashPolicy::default());
    }
}

/// Format version of a crash report (`vms/NAME/crashes/ID/report.json`).
pub const CRASH_REPORT_VERSION: u32 = 1;

/// Where one crash's handling stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CrashPhase {
    /// The guest is dead and kept paused (policy `none`).
    Kept,
    Dumping,
    Recovering,
    /// Everything the policy asked for is finished.
    Done,
    /// Something the policy asked for failed; `notes` say what.
    Failed,
}

/// One sample of the memory timeline (bytes), taken at every chunk and event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Seconds since the crash.
    pub t_s: f64,
    /// Host memory the crashed VM's RAM still holds.
    pub crashed_bytes: u64,
    /// Memory the recovery VM is configured with (boot plus plugged).
    pub recovery_bytes: u64,
    /// Guest memory the dump has covered (written or skipped), durable.
    pub dumped_bytes: u64,
    /// Of `dumped_bytes`, what the page filter left out (not written); only when a
    /// filter is in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped_bytes: Option<u64>,
    /// What the VM's memory group holds (both QEMUs, the crashed RAM included),
    /// where the budget is enforced by a memory cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// How a crash's host memory budget was held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryLimit {
    /// `cgroup v1`, `cgroup v2`, or `accounted` (planned by the daemon, not enforced).
    pub enforced_by: String,
    /// The guest memory both VMs may hold together (`--host-memory-budget`).
    pub budget_bytes: u64,
    /// The memory group's hard limit: the budget plus the recovery QEMU's own
    /// footprint (its code cache, heap and page tables are not guest memory).
    #[serde(default)]
    pub limit_bytes: Option<u64>,
    /// The group (a path under the cgroup mount).
    #[serde(default)]
    pub group: Option<String>,
    /// The most the group held while the crash was handled.
    #[serde(default)]
    pub peak_bytes: Option<u64>,
    /// Why the budget is only accounted.
    #[serde(default)]
    pub why_not: Option<String>,
}

/// What happened in one crash, kept next to its dump and served by
/// `GET /v1/vms/{name}/crashes[/{id}]` and `rebound crash report`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashReport {
    pub version: u32,
    pub id: String,
    pub vm: String,
    /// `panic` (GUEST_PANICKED) or `watchdog` (a hang).
    pub cause: String,
    pub policy: CrashPolicy,
    pub crashed_at: String,
    pub crashed_mono_ns: u64,
    pub phase: CrashPhase,
    /// Crash to the recovery VM passing the VM's readiness condition.
    pub downtime_s: Option<f64>,
    /// Dump start to the dump being durable and complete.
    pub dump_s: Option<f64>,
    /// Recovery VM spawn to ready.
    pub recovery_s: Option<f64>,
    pub dump_path: Option<String>,
    pub dump_bytes: Option<u64>,
    /// Bytes the dump actually wrote (its holes take none): what the disk carried.
    #[serde(default)]
    pub dump_io_bytes: Option<u64>,
    pub pages_written: Option<u64>,
    /// Pages left out, by class.
    #[serde(default)]
    pub pages_skipped: std::collections::BTreeMap<String, u64>,
    pub io_policy: String,
    /// What did not go as asked (e.g. "VMCOREINFO not found: dumped unfiltered").
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub timeline: Vec<MemorySample>,
    /// The snapshot the recovery VM was restored from (`recover_from`); none when it
    /// booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered_from: Option<String>,
    #[serde(default)]
    pub memory_limit: Option<MemoryLimit>,
}

/// Which program writes an on-demand dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DumpEngine {
    /// Rebound's writer (`rebound-dump`): parallel, filtered, readable by makedumpfile.
    #[default]
    Rebound,
    /// QEMU's own `dump-guest-memory` (the stock baseline).
    Qemu,
}

/// `POST /v1/vms/{name}/dump`: dump a running, paused or crashed VM now. A running
/// guest is paused for the dump and resumed after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DumpRequest {
    /// Absolute path of the dump (written beside it and renamed when complete).
    pub out: String,
    #[serde(default)]
    pub format: DumpFormat,
    #[serde(default)]
    pub compress: Compress,
    #[serde(default)]
    pub filter: Vec<PageClass>,
    #[serde(default)]
    pub engine: DumpEngine,
    /// Permissions of the dump (octal, e.g. 0o640); 0600 when absent.
    #[serde(default)]
    pub mode: Option<u32>,
}

/// What an on-demand dump wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DumpResult {
    pub path: String,
    pub engine: DumpEngine,
    pub format: DumpFormat,
    /// The file's length.
    pub bytes: u64,
    /// Bytes actually written (holes take none).
    pub io_bytes: u64,
    /// From the start of the dump to the file being complete and durable.
    pub seconds: f64,
    /// How long the guest was paused for it (0 for a guest that was not running).
    pub paused_s: f64,
    pub pages_written: u64,
    #[serde(default)]
    pub pages_skipped: std::collections::BTreeMap<String, u64>,
    #[serde(default)]
    pub notes: Vec<String>,
}
