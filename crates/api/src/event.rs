//! The per-VM event log's entries: `vms/NAME/events.jsonl`, one JSON object a line, and
//! the answer of `GET /v1/vms/{name}/events`.
//!
//! Format, version [`EVENT_LOG_VERSION`]:
//! `{"v":1,"seq":<n>,"wall":"<RFC 3339>","mono_ns":<CLOCK_MONOTONIC ns>,"kind":"<kind>","detail":{...}}`.
//! `kind` names one variant of [`EventData`] and `detail` holds its fields (absent for
//! kinds without fields). Lines written before versioning have no `v` (read as 0)
//! and the same kinds and fields. A reader skips lines it cannot parse (a torn last
//! line, a kind from a newer version) rather than failing the whole log.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::status::{Accel, ReadyInfo};

/// Version written in every new line's `v`.
pub const EVENT_LOG_VERSION: u32 = 1;

/// One event, as stored and as served by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Format version of this line (0: before versioning).
    #[serde(default)]
    pub v: u32,
    /// Position in the VM's log, from 1, never reused (the log is rotated: the
    /// oldest lines go); `GET .../events?since=SEQ` pages by it. 0 in lines written
    /// before it existed.
    #[serde(default)]
    pub seq: u64,
    /// Wall-clock time, RFC 3339 with milliseconds.
    pub wall: String,
    /// CLOCK_MONOTONIC nanoseconds: exact intervals even if the wall clock jumps.
    pub mono_ns: u64,
    #[serde(flatten)]
    pub data: EventData,
}

impl Event {
    /// The kind's name, as in the JSON.
    pub fn kind(&self) -> &'static str {
        self.data.kind()
    }
}

/// What happened. Each variant is one `kind`; its fields are the `detail` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum EventData {
    /// QEMU was spawned with this command line.
    Started {
        pid: u32,
        accel: Accel,
        #[serde(default)]
        accel_reason: Option<String>,
        qemu: String,
        argv: Vec<String>,
    },
    /// A restarted daemon found this VM's QEMU alive and took it back.
    Reattached { pid: u32, qemu_status: String },
    /// The guest agent said `ready` for the first time since QEMU started.
    AgentReady(ReadyInfo),
    /// The agent said `ready` again (its link came back, e.g. after a daemon restart).
    AgentHello(ReadyInfo),
    /// The VM's readiness condition held for the first time.
    Ready {
        #[serde(default)]
        ready_after_ms: Option<u64>,
        probe: String,
    },
    /// QEMU reported `GUEST_PANICKED`.
    Panicked {
        #[serde(default)]
        action: Option<String>,
        #[serde(default)]
        info: Option<Value>,
    },
    /// The vCPUs stopped.
    Paused,
    /// The vCPUs run again.
    Resumed,
    /// The watchdog fired.
    Watchdog {
        #[serde(default)]
        action: Option<String>,
    },
    /// The guest or QEMU shut down.
    Shutdown {
        #[serde(default)]
        guest: Option<bool>,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The machine reset: the guest's own reboot (`guest: true`) or a reset the
    /// daemon asked QEMU for.
    Reset {
        #[serde(default)]
        guest: Option<bool>,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The balloon reached a new size.
    Balloon {
        #[serde(default)]
        actual: Option<u64>,
    },
    /// Progress of the `memfill` workload (rate-limited).
    Memfill {
        filled_kib: u64,
        rounds: u64,
        errors: u64,
    },
    /// The agent reported an error.
    AgentError { message: String },
    /// The agent sent more than its VM's rate allows: `dropped` messages were
    /// dropped since the last such event (written at most once per window).
    AgentThrottled { dropped: u64 },
    /// A crash was requested, through the agent (`sysrq`) or an NMI.
    CrashRequested { via: String },
    /// The agent wrote a marker into guest RAM.
    Marker { paddr: u64, len: u64 },
    /// The VM stopped on request (`how`: guest poweroff, quit, sigkill) or was found
    /// dead when the daemon came back (`reason`).
    Stopped {
        #[serde(default)]
        how: Option<String>,
        #[serde(default)]
        reason: Option<String>,
    },
    /// The VM was killed on request.
    Killed { pid: u32 },
    /// QEMU went away on its own (or never came up).
    Exited {
        #[serde(default)]
        exit_code: Option<i32>,
        #[serde(default)]
        error: Option<String>,
    },
    /// The crash policy took over a crashed guest (`cause`: panic or watchdog).
    CrashHandling {
        id: String,
        cause: String,
        on_crash: crate::crash::OnCrash,
    },
    /// The dump began, into `path` (renamed there when complete).
    DumpStarted { id: String, path: String },
    /// A chunk of the crashed VM's memory is dumped (durable) and given back.
    ChunkReclaimed {
        id: String,
        dumped_bytes: u64,
        crashed_bytes: u64,
        recovery_bytes: u64,
    },
    /// The dump is complete and durable, or failed (`error`).
    DumpFinished {
        id: String,
        #[serde(default)]
        bytes: Option<u64>,
        seconds: f64,
        #[serde(default)]
        error: Option<String>,
    },
    /// A recovery VM was spawned on the crashed VM's disks.
    RecoveryStarted {
        id: String,
        pid: u32,
        boot_memory_mib: u64,
    },
    /// The recovery VM passed the readiness condition: the service is back.
    Recovered { id: String, downtime_ms: u64 },
    /// A restored guest moved from its snapshot image onto shared RAM, into a new
    /// QEMU (`pid`), by a local live migration of `ram_bytes` that stopped the guest
    /// for `downtime_ms`.
    Settled {
        pid: u32,
        seconds: f64,
        #[serde(default)]
        downtime_ms: Option<u64>,
        #[serde(default)]
        ram_bytes: Option<u64>,
    },
    /// A restored guest could not go on: what its memory came from failed it (the
    /// snapshot's RAM image changed under it, or QEMU died while it was mapped).
    RestoreFailed { error: String },
    /// A disk backend process ended on its own (`reason`) and a new one (`pid`) serves
    /// `disk`; QEMU reconnects, and the guest's requests in flight are sent again.
    DiskBackendRestarted {
        disk: String,
        pid: u32,
        reason: String,
    },
    /// One phase of the guest's `io` workload finished.
    Io(IoReport),
    /// The `io` workload's file-set mode (`io_files`) finished a round (and once after
    /// its first 200 requests).
    Files(FilesReport),
    /// A reboot began (`how`: agent or reset); a warm one listed `cached_pages` first.
    RebootRequested {
        warm: bool,
        how: String,
        #[serde(default)]
        cached_pages: u64,
    },
    /// The rebooted guest's agent is up again, `after_ms` after the request.
    Rebooted { after_ms: u64 },
    /// A warm reboot goes on cold, and why (no agent, the list missing or damaged).
    WarmCacheCold { reason: String },
    /// The guest read its listed cache pages back after a warm reboot.
    Prefetched(crate::reboot::PrefetchReport),
    /// A coordinated snapshot saved the guest into `out` and holds it paused until
    /// `resume` (every VM of the cluster is saved before any runs on).
    SnapshotHeld { out: String },
    /// The guest's `peer` workload declared a peer dead (silent `silent_ms` while this
    /// guest ran) or alive again.
    Peer(PeerEvent),
    /// A restore held paused handed `frames` frames (`bytes` bytes) to QEMU for the
    /// guest on bridge NIC `nic` (`net<nic>`); the guest receives them when it runs.
    FramesReplayed { nic: u32, frames: u64, bytes: u64 },
    /// `vm memory --host-cache`: the guest now has `guest_mib`, its disks' host caches
    /// `host_cache_bytes` in all, exclusive of the guest's memory or not.
    HostCache {
        guest_mib: u64,
        host_cache_bytes: u64,
        exclusive: bool,
    },
}

/// A change the `peer` workload saw in one of its peers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerEvent {
    /// `dead` or `alive`.
    pub event: String,
    /// `IP:PORT`.
    pub peer: String,
    pub silent_ms: u64,
}

/// One phase of the `io` workload: what the guest measured of its data disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IoReport {
    /// `seqread`, `seqwrite`, `randread` or `randwrite`.
    pub phase: String,
    pub round: u64,
    /// Bytes per request.
    pub bs: u64,
    /// `O_DIRECT` (the guest's page cache bypassed).
    pub direct: bool,
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// The `io` workload's file-set mode so far: the paper's microbenchmarks over files
/// whose every 1 KiB block carries a signature of (file, block, version). Counters are
/// cumulative since the workload's first request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FilesReport {
    pub round: u64,
    /// `seq`, `random`, `zipf` or `class`.
    pub pattern: String,
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    /// Writes that churned the set (`io_churn`), also counted in `writes`: one chunk
    /// overwritten (buffered, or `direct_writes` with O_DIRECT), the file truncated and
    /// written back, the file deleted and created.
    #[serde(default)]
    pub chunk_writes: u64,
    #[serde(default)]
    pub direct_writes: u64,
    #[serde(default)]
    pub truncates: u64,
    #[serde(default)]
    pub deletes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
    /// Blocks that held another version, another block's content or no signature, and
    /// failed reads and writes.
    pub errors: u64,
    /// The first of them: the file, the offset, the version word expected and found.
    #[serde(default)]
    pub first_error: Option<String>,
    /// Page-cache KiB of the file set now (`mincore`).
    pub footprint_kib: u64,
    /// The guest's `Cached:` (`/proc/meminfo`).
    pub cached_kib: u64,
    pub mem_total_kib: u64,
}

impl EventData {
    /// The kind's name, as in the JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            EventData::Started { .. } => "started",
            EventData::Reattached { .. } => "reattached",
            EventData::AgentReady(_) => "agent_ready",
            EventData::AgentHello(_) => "agent_hello",
            EventData::Ready { .. } => "ready",
            EventData::Panicked { .. } => "panicked",
            EventData::Paused => "paused",
            EventData::Resumed => "resumed",
            EventData::Watchdog { .. } => "watchdog",
            EventData::Shutdown { .. } => "shutdown",
            EventData::Reset { .. } => "reset",
            EventData::Balloon { .. } => "balloon",
            EventData::Memfill { .. } => "memfill",
            EventData::AgentError { .. } => "agent_error",
            EventData::AgentThrottled { .. } => "agent_throttled",
            EventData::CrashRequested { .. } => "crash_requested",
            EventData::Marker { .. } => "marker",
            EventData::Stopped { .. } => "stopped",
            EventData::Killed { .. } => "killed",
            EventData::Exited { .. } => "exited",
            EventData::CrashHandling { .. } => "crash_handling",
            EventData::DumpStarted { .. } => "dump_started",
            EventData::ChunkReclaimed { .. } => "chunk_reclaimed",
            EventData::DumpFinished { .. } => "dump_finished",
            EventData::RecoveryStarted { .. } => "recovery_started",
            EventData::Recovered { .. } => "recovered",
            EventData::Settled { .. } => "settled",
            EventData::RestoreFailed { .. } => "restore_failed",
            EventData::DiskBackendRestarted { .. } => "disk_backend_restarted",
            EventData::Io(_) => "io",
            EventData::Files(_) => "files",
            EventData::RebootRequested { .. } => "reboot_requested",
            EventData::Rebooted { .. } => "rebooted",
            EventData::WarmCacheCold { .. } => "warm_cache_cold",
            EventData::Prefetched(_) => "prefetched",
            EventData::Peer(_) => "peer",
            EventData::SnapshotHeld { .. } => "snapshot_held",
            EventData::FramesReplayed { .. } => "frames_replayed",
            EventData::HostCache { .. } => "host_cache",
        }
    }

    /// Every kind's name (documentation and the API spec list the same).
    pub const KINDS: [&'static str; 39] = [
        "started",
        "reattached",
        "agent_ready",
        "agent_hello",
        "ready",
        "panicked",
        "paused",
        "resumed",
        "watchdog",
        "shutdown",
        "reset",
        "balloon",
        "memfill",
        "agent_error",
        "agent_throttled",
        "crash_requested",
        "marker",
        "stopped",
        "killed",
        "exited",
        "crash_handling",
        "dump_started",
        "chunk_reclaimed",
        "dump_finished",
        "recovery_started",
        "recovered",
        "settled",
        "restore_failed",
        "disk_backend_restarted",
        "io",
        "files",
        "reboot_requested",
        "rebooted",
        "warm_cache_cold",
        "prefetched",
        "peer",
        "snapshot_held",
        "frames_replayed",
        "host_cache",
    ];

    /// A QEMU event's data as this kind's fields; unknown or odd fields are dropped,
    /// since QEMU's own schema decides them.
    pub fn from_qmp(event: &str, data: &Value) -> Option<EventData> {
        let s = |k: &str| data.get(k).and_then(Value::as_str).map(str::to_string);
        Some(match event {
            "GUEST_PANICKED" => EventData::Panicked {
                action: s("action"),
                info: data.get("info").cloned(),
            },
            "STOP" => EventData::Paused,
            "RESUME" => EventData::Resumed,
            "WATCHDOG" => EventData::Watchdog {
                action: s("action"),
            },
            "SHUTDOWN" => EventData::Shutdown {
                guest: data.get("guest").and_then(Value::as_bool),
                reason: s("reason"),
            },
            "RESET" => EventData::Reset {
                guest: data.get("guest").and_then(Value::as_bool),
                reason: s("reason"),
            },
            "BALLOON_CHANGE" => EventData::Balloon {
                actual: data.get("actual").and_then(Value::as_u64),
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(data: EventData) -> Event {
        Event {
            v: EVENT_LOG_VERSION,
            seq: 3,
            wall: "2026-11-23T00:00:00.000Z".into(),
            mono_ns: 7,
            data,
        }
    }

    #[test]
    fn json_shape_is_kind_plus_detail() {
        let e = ev(EventData::Killed { pid: 9 });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v,
            json!({"v":1,"seq":3,"wall":"2026-11-23T00:00:00.000Z","mono_ns":7,"kind":"killed","detail":{"pid":9}})
        );
        let e2: Event = serde_json::from_value(v).unwrap();
        assert_eq!(e2, e);
        // Kinds without fields have no detail, and read back.
        let v = serde_json::to_value(ev(EventData::Paused)).unwrap();
        assert_eq!(v["kind"], "paused");
        assert!(v.get("detail").is_none(), "{v}");
        assert_eq!(
            serde_json::from_value::<Event>(v).unwrap().data,
            EventData::Paused
        );
    }

    #[test]
    fn kind_names_match_the_json() {
        let samples = [
            EventData::Paused,
            EventData::Resumed,
            EventData::Killed { pid: 1 },
            EventData::Ready {
                ready_after_ms: Some(3),
                probe: "agent".into(),
            },
            EventData::Exited {
                exit_code: None,
                error: None,
            },
            EventData::RestoreFailed {
                error: "image changed".into(),
            },
            EventData::Files(FilesReport {
                round: 1,
                pattern: "zipf".into(),
                requests: 200,
                reads: 190,
                writes: 10,
                chunk_writes: 2,
                direct_writes: 1,
                truncates: 1,
                deletes: 1,
                bytes_read: 190 << 20,
                bytes_written: 10 << 20,
                seconds: 2.5,
                errors: 1,
                first_error: Some("f00003 offset 1024: ...".into()),
                footprint_kib: 4096,
                cached_kib: 8192,
                mem_total_kib: 230_000,
            }),
        ];
        for d in samples {
            let v = serde_json::to_value(ev(d.clone())).unwrap();
            assert_eq!(v["kind"], d.kind());
            assert!(EventData::KINDS.contains(&d.kind()));
            assert_eq!(serde_json::from_value::<Event>(v).unwrap().data, d);
        }
    }

    #[test]
    fn kinds_are_the_api_specs() {
        let spec = include_str!("../../../api/openapi.yaml");
        let list = spec
            .lines()
            .find_map(|l| l.trim().strip_prefix("enum: [started, "))
            .expect("the Event kind enum in api/openapi.yaml");
        let spec_kinds: Vec<&str> = std::iter::once("started")
            .chain(list.trim_end_matches(']').split(", "))
            .collect();
        assert_eq!(spec_kinds, EventData::KINDS);
    }

    #[test]
    fn lines_from_before_versioning_read_as_v0() {
        let line = r#"{"wall":"x","mono_ns":5,"kind":"stopped","detail":{"how":"quit"}}"#;
        let e: Event = serde_json::from_str(line).unwrap();
        assert_eq!(e.v, 0);
        assert_eq!(
            e.data,
            EventData::Stopped {
                how: Some("quit".into()),
                reason: None
            }
        );
    }

    #[test]
    fn unknown_kinds_and_bad_fields_are_refused() {
        for line in [
            r#"{"v":1,"wall":"x","mono_ns":5,"kind":"teleported"}"#,
            r#"{"v":1,"wall":"x","mono_ns":5,"kind":"killed","detail":{"pid":"nine"}}"#,
            r#"{"v":1,"wall":"x","kind":"paused"}"#,
        ] {
            assert!(serde_json::from_str::<Event>(line).is_err(), "{line}");
        }
    }

    #[test]
    fn qmp_events_become_typed() {
        let d = EventData::from_qmp(
            "GUEST_PANICKED",
            &json!({"action":"pause","info":{"type":"hyper-v"}}),
        )
        .unwrap();
        assert_eq!(
            d,
            EventData::Panicked {
                action: Some("pause".into()),
                info: Some(json!({"type":"hyper-v"}))
            }
        );
        assert_eq!(
            EventData::from_qmp("BALLOON_CHANGE", &json!({"actual": 5})),
            Some(EventData::Balloon { actual: Some(5) })
        );
        assert_eq!(
            EventData::from_qmp("RESET", &json!({"guest": true, "reason": "guest-reset"})),
            Some(EventData::Reset {
                guest: Some(true),
                reason: Some("guest-reset".into())
            })
        );
        assert_eq!(
            EventData::from_qmp("NIC_RX_FILTER_CHANGED", &json!({})),
            None
        );
    }
}
