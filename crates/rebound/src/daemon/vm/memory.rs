//! `vm memory` (Hcache): the VM's allocation is X + Y, the guest's memory X plus an
//! exclusive host cache Y of its disks. `--host-cache SIZE` moves Y from the guest to
//! the host caches, keeping the sum; `--size SIZE` changes the allocation (the guest
//! grows or shrinks by the balloon, up to the memory it booted with). The balloon
//! takes memory from the guest only if it can give it: what it cannot reclaim,
//! MemTotal − MemAvailable as its balloon driver reports, plus a margin, stays. Each
//! disk served by Rebound's backend then gets its share of Y as a cache that holds
//! only what the guest evicts (inclusive, filled by reads, when the guest has no
//! eviction-notice module, and the answer says so); `--host-cache 0` gives it all back. The setting lasts
//! until the VM stops.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rebound_api::HostCacheReport;
use serde_json::{json, Value};

use super::owner::Owner;
use crate::daemon::backend_control::{self, ControlError};
use crate::daemon::error::OpError;

const MIB: u64 = 1 << 20;
/// The least a guest keeps, whatever it reports.
const GUEST_MIN: u64 = 64 * MIB;
/// Kept above what the guest says it cannot reclaim.
const NEED_MARGIN: u64 = 32 * MIB;
/// How long the guest gets to give the memory back.
const BALLOON_WAIT: Duration = Duration::from_secs(20);
const BALLOON_PATH: &str = "/machine/peripheral/balloon0";

/// What `vm memory` asks for; what is not given stays as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryRequest {
    pub host_cache_bytes: Option<u64>,
    pub allocation_bytes: Option<u64>,
}

impl Owner {
    pub(super) async fn memory(&mut self, req: MemoryRequest) -> Result<HostCacheReport, OpError> {
        self.require_running("memory moves only while the guest runs")?;
        let rec = self.vm.record();
        let booted = rec.spec.memory_mib * MIB;
        let (guest_now, allocation_now) = crate::daemon::mrc::sizes(&rec);
        let allocation = req
            .allocation_bytes
            .map_or(allocation_now, |b| b / MIB * MIB);
        let y = req
            .host_cache_bytes
            .map_or(allocation_now - guest_now, |b| b / MIB * MIB);
        if y > 0 && rec.blk.is_empty() {
            return Err(OpError::BadRequest(format!(
                "VM {} has no disk served by Rebound's backend (disk_backend = \"rebound\"): there is no host cache to move memory to",
                self.vm.name
            )));
        }
        if allocation > booted {
            return Err(OpError::BadRequest(format!(
                "--size {} MiB is more than the {} MiB VM {} booted with: its balloon can give back only what it took",
                allocation / MIB,
                booted / MIB,
                self.vm.name
            )));
        }
        if y > allocation.saturating_sub(GUEST_MIN) {
            return Err(OpError::BadRequest(format!(
                "a {} MiB host cache would leave the guest {} MiB of its {} MiB allocation; it keeps at least {} MiB",
                y / MIB,
                allocation.saturating_sub(y) / MIB,
                allocation / MIB,
                GUEST_MIN / MIB
            )));
        }
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        let t = Instant::now();
        let before = balloon_actual(&q).await?;
        let mut notes = Vec::new();
        let mut guarded = "";
        let target = allocation - y;
        if target < before {
            match guest_need(&q).await {
                Some(need) if target < need + NEED_MARGIN => {
                    return Err(OpError::BadRequest(format!(
                        "the guest cannot give {} MiB: it needs about {} MiB (MemTotal - MemAvailable + {} MiB) and would keep {} MiB; nothing was moved",
                        (before - target) / MIB,
                        (need + NEED_MARGIN).div_ceil(MIB),
                        NEED_MARGIN / MIB,
                        target / MIB
                    )));
                }
                Some(_) => {}
                None => {
                    guarded = " (its balloon driver reported no memory statistics to check first)";
                    notes.push(
                        "the guest's balloon driver reports no memory statistics: only the 64 MiB floor guarded this".to_string(),
                    )
                }
            }
        }
        // Each disk's share; with none moved, the caches go back to what the spec says.
        let n = rec.blk.len() as u64;
        let spec_cache = rec.spec.disk_cache_mib * MIB;
        let (per_disk, mut exclusive) = match y {
            0 => (spec_cache, false),
            _ => (y / n.max(1), true),
        };
        // A guest that cannot say what it evicts (a kernel without rebound_evict) would
        // leave an exclusive cache empty: the memory still serves, as an inclusive cache.
        if exclusive && self.vm.evict_stats().state == "absent" {
            exclusive = false;
            notes.push(format!(
                "the guest has no eviction-notice module (rebound_evict): the {} MiB host cache is inclusive (filled by the guest's reads), not exclusive, and traces no curve below the guest",
                y / MIB
            ));
        }
        let controls: Vec<_> = rec.blk.iter().map(|p| p.serve.control.clone()).collect();
        let was: Vec<_> = rec
            .blk
            .iter()
            .map(|p| (p.serve.cache_bytes, p.serve.exclusive))
            .collect();
        // An exclusive cache is in place before the balloon takes the memory: what the
        // guest evicts to give it is what the host cache must hold (and its curve see).
        if exclusive {
            if let Err(e) = set_caches(&controls, per_disk, exclusive).await {
                restore_caches(&controls, &was).await;
                return Err(OpError::CacheRefused {
                    refusal: e,
                    then: "nothing was moved".into(),
                });
            }
        }
        q.execute("balloon", Some(json!({"value": target}))).await?;
        let end = Instant::now() + BALLOON_WAIT;
        let mut actual = balloon_actual(&q).await?;
        while actual.abs_diff(target) >= MIB && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
            actual = balloon_actual(&q).await?;
        }
        if actual.abs_diff(target) >= MIB {
            let _ = q.execute("balloon", Some(json!({"value": before}))).await;
            if exclusive {
                restore_caches(&controls, &was).await;
            }
            return Err(OpError::BadRequest(format!(
                "the guest cannot give {} MiB{guarded}: it came down only to {} MiB of the {} MiB asked within {} s, so its balloon is back to {} MiB and nothing was moved",
                (before - target) / MIB,
                actual / MIB,
                target / MIB,
                BALLOON_WAIT.as_secs(),
                before / MIB
            )));
        }
        let balloon_s = t.elapsed().as_secs_f64();
        if n == 0 {
            self.vm
                .update(|r| r.allocation_mib = Some(allocation / MIB));
            self.event(rebound_api::EventData::HostCache {
                guest_mib: actual / MIB,
                host_cache_bytes: 0,
                exclusive: false,
            });
            return Ok(HostCacheReport {
                guest_mib_before: before / MIB,
                guest_mib: actual / MIB,
                allocation_mib: allocation / MIB,
                host_cache_bytes: 0,
                per_disk_bytes: 0,
                disks: 0,
                exclusive: false,
                balloon_s,
                notes,
            });
        }
        // Caches given back after the guest has its memory again.
        if !exclusive {
            if let Err(e) = set_caches(&controls, per_disk, exclusive).await {
                // Memory the guest gave and no cache to hold it: give it back.
                let _ = q.execute("balloon", Some(json!({"value": before}))).await;
                return Err(OpError::CacheRefused {
                    refusal: e,
                    then: format!("the guest's balloon is back to {} MiB", before / MIB),
                });
            }
        }
        self.vm.update(|r| {
            r.allocation_mib = Some(allocation / MIB);
            for p in &mut r.blk {
                p.serve.cache_bytes = per_disk;
                p.serve.exclusive = exclusive;
            }
        });
        self.event(rebound_api::EventData::HostCache {
            guest_mib: actual / MIB,
            host_cache_bytes: per_disk * n,
            exclusive,
        });
        Ok(HostCacheReport {
            guest_mib_before: before / MIB,
            guest_mib: actual / MIB,
            allocation_mib: allocation / MIB,
            host_cache_bytes: per_disk * n,
            per_disk_bytes: per_disk,
            disks: n,
            exclusive,
            balloon_s,
            notes,
        })
    }
}

/// Gives each backend `bytes` of cache, exclusive or not; the first refusal.
async fn set_caches(controls: &[PathBuf], bytes: u64, exclusive: bool) -> Result<(), ControlError> {
    let settings = vec![(bytes, exclusive); controls.len()];
    let answers = ask_caches(controls.to_vec(), settings).await;
    answers
        .into_iter()
        .find_map(Result::err)
        .map_or(Ok(()), Err)
}

/// Puts each backend's cache back as it was (best effort: this undoes a failed move).
async fn restore_caches(controls: &[PathBuf], was: &[(u64, bool)]) {
    let _ = ask_caches(controls.to_vec(), was.to_vec()).await;
}

async fn ask_caches(
    controls: Vec<PathBuf>,
    settings: Vec<(u64, bool)>,
) -> Vec<Result<Value, ControlError>> {
    let asked = tokio::task::spawn_blocking(move || {
        controls
            .iter()
            .zip(settings)
            .map(|(c, (bytes, exclusive))| {
                let req = json!({"op": "cache", "bytes": bytes, "exclusive": exclusive});
                backend_control::ask(c, &req)
            })
            .collect()
    })
    .await;
    asked.unwrap_or_else(|e| vec![Err(e.into())])
}

/// The guest's memory as the balloon has it, bytes.
async fn balloon_actual(q: &rebound_vmm::qmp::Qmp) -> Result<u64, OpError> {
    let v = q.execute("query-balloon", None).await?;
    v.get("actual")
        .and_then(Value::as_u64)
        .ok_or_else(|| OpError::Internal(format!("query-balloon answered {v}")))
}

/// What the guest cannot give back (total − available), from its balloon driver's
/// statistics sent since we asked; `None` if none come within 10 s (a guest busy under
/// TCG answers late).
async fn guest_need(q: &rebound_vmm::qmp::Qmp) -> Option<u64> {
    // QEMU keeps the last statistics the guest sent, which may be its driver's first,
    // from boot: only an update stamped (by QEMU, in whole seconds) since now counts.
    let asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let set = json!({"path": BALLOON_PATH, "property": "guest-stats-polling-interval", "value": 1});
    if let Err(e) = q.execute("qom-set", Some(set)).await {
        tracing::info!("no balloon statistics: {e}");
        return None;
    }
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let get = json!({"path": BALLOON_PATH, "property": "guest-stats"});
        if let Ok(v) = q.execute("qom-get", Some(get)).await {
            tracing::debug!("balloon statistics: {v}");
            if v["last-update"].as_u64().is_none_or(|t| t < asked) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            let stat = |k: &str| v["stats"][k].as_i64().filter(|x| *x >= 0);
            if let (Some(total), Some(avail)) =
                (stat("stat-total-memory"), stat("stat-available-memory"))
            {
                return Some((total - avail).max(0) as u64);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}
