//! Eviction notices from the guest to the VM's disk backends (exclusive host cache,
//! Hcache section 3.3). The guest's module `rebound_evict` writes one notice per page
//! it lets go of into a ring in guest memory; the agent says where (`ready.evict_ring`).
//! A thread per VM reads the ring from the RAM file every [`POLL`] (or [`BUSY_POLL`]
//! while the guest evicts much) and sends what it found, with where the guest's copy of
//! each evicted page is, as one `notices` control request, to every disk of the VM
//! whose host cache is exclusive (the backend reads the copies through its own mapping
//! of guest memory) (`vm memory --host-cache`): only the backend whose I/O put a block in that page has a mapping for it, the
//! others answer `no_mapping` (so refusals of that kind grow with the number of disks).
//!
//! Counters (`GET /v1/vms/{name}/evict`): notices read, lost (overwritten in the ring
//! before the host read them), forwarded, and what the backends answered. A guest
//! without the module is said to have none, never silently counted as zero notices.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound_api::{EvictRingAddr, VmState};
use rebound_guestmem::evict_ring::{Batch, RingReader};
use rebound_guestmem::{GuestMemory, Layout};
use serde::Serialize;

use super::VmHandle;
use crate::daemon::error::chain;

/// How often the ring is read while the guest evicts little.
pub const POLL: Duration = Duration::from_millis(20);
/// How often while it evicts much (a poll found [`BUSY`] notices or more): the ring's
/// page copies (1,024 by default) last ~17 ms at the ~60k evictions/s a TCG guest
/// reaches, and a copy read after it was overwritten is refused.
pub const BUSY_POLL: Duration = Duration::from_millis(2);
pub const BUSY: usize = 32;

/// Where notices stand for one VM.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct EvictStats {
    /// `unknown` (the agent has not reported), `absent` (no module in the guest),
    /// `forwarding`, `failing` (the ring cannot be read: `error` says why) or `stopped`.
    pub state: String,
    /// Why, in words, for every state but `forwarding`.
    pub detail: Option<String>,
    pub ring: Option<EvictRingAddr>,
    pub polls: u64,
    /// Notices read whole from the ring, by kind.
    pub evicted: u64,
    pub released: u64,
    /// Overwritten before they were read.
    pub lost: u64,
    /// Entries with an unknown kind.
    pub invalid: u64,
    /// Notices sent to the backends (each sent once per backend).
    pub forwarded: u64,
    /// Notices read while the VM had no disk on Rebound's backend.
    pub unforwarded: u64,
    /// Time spent sending batches to the backends and waiting for their answers: in all,
    /// and the longest one batch took (ms). A copy must be read before the guest writes
    /// as many notices as its ring holds, so these bound the rate of evictions it keeps up with.
    pub forward_ms: f64,
    pub forward_ms_max: f64,
    /// The backends' answers, summed.
    pub admitted: u64,
    pub refused: BTreeMap<String, u64>,
    pub backend_released: u64,
    pub backend_errors: u64,
    pub last_error: Option<String>,
}

/// The VM's forwarder: which one is current (a new ring replaces it) and its counters.
#[derive(Debug, Default)]
pub struct EvictSlot {
    generation: u64,
    key: Option<(EvictRingAddr, std::path::PathBuf)>,
    stats: Arc<Mutex<EvictStats>>,
}

impl EvictSlot {
    pub fn new() -> EvictSlot {
        let s = EvictSlot::default();
        s.stats.lock().expect("evict stats").state = "unknown".into();
        s
    }

    pub fn stats(&self) -> EvictStats {
        self.stats.lock().expect("evict stats").clone()
    }
}

impl VmHandle {
    /// What the agent said about the ring (at every `ready`): starts a forwarder for a
    /// new ring, keeps the one reading the same ring, or says the guest has none.
    pub(super) fn evict_ring(self: &Arc<Self>, ring: Option<EvictRingAddr>) {
        let ram = self.record().ram_file;
        let mut slot = self.evict.lock().expect("evict slot");
        let key = ring.map(|r| (r, ram.clone()));
        if key.is_some() && slot.key == key {
            return;
        }
        slot.generation += 1;
        slot.key = key;
        let stats = EvictStats {
            state: if ring.is_some() { "forwarding" } else { "absent" }.into(),
            detail: ring.is_none().then(|| {
                "the guest has no eviction-notice module (rebound_evict): an exclusive host cache gets no notices".into()
            }),
            ring,
            ..EvictStats::default()
        };
        slot.stats = Arc::new(Mutex::new(stats));
        if let Some(r) = ring {
            let (vm, gen, stats) = (self.clone(), slot.generation, slot.stats.clone());
            std::thread::spawn(move || forward(vm, gen, r, ram, stats));
        }
    }

    /// Stops the forwarder (the VM stopped).
    pub(super) fn evict_stop(&self, why: &str) {
        let mut slot = self.evict.lock().expect("evict slot");
        slot.generation += 1;
        slot.key = None;
        let mut s = slot.stats.lock().expect("evict stats");
        if s.state == "forwarding" || s.state == "failing" {
            s.state = "stopped".into();
            s.detail = Some(why.into());
        }
    }

    /// The counters of eviction notices.
    pub fn evict_stats(&self) -> EvictStats {
        self.evict.lock().expect("evict slot").stats()
    }

    fn evict_current(&self, gen: u64) -> bool {
        self.evict.lock().expect("evict slot").generation == gen
    }
}

/// The forwarder thread: until the VM stops or another ring replaces this one.
fn forward(
    vm: Arc<VmHandle>,
    gen: u64,
    ring: EvictRingAddr,
    ram: std::path::PathBuf,
    stats: Arc<Mutex<EvictStats>>,
) {
    let mut reader: Option<(GuestMemory<rebound_guestmem::FileSource>, RingReader)> = None;
    // The first reader starts from the ring's first notice: the agent reports the ring
    // after the module began writing, and those notices count. One opened again (after
    // a read error) starts from the head, so nothing is sent twice.
    let mut first = true;
    let fail = |e: String| {
        let mut s = stats.lock().expect("evict stats");
        s.state = "failing".into();
        s.detail = Some(e);
    };
    let mut pause = POLL;
    while vm.evict_current(gen) {
        std::thread::sleep(pause);
        pause = POLL;
        let rec = vm.record();
        if rec.state == VmState::Stopped {
            break;
        }
        if rec.state != VmState::Running {
            continue;
        }
        if reader.is_none() {
            let opened = Layout::pc(rec.spec.memory_mib << 20)
                .map_err(|e| e.to_string())
                .and_then(|l| GuestMemory::open_ram_file(&ram, l).map_err(|e| e.to_string()))
                .and_then(|m| {
                    let r = RingReader::open(&m, ring.gpa, ring.bytes).map_err(|e| chain(&e))?;
                    Ok((m, if first { r.from_start() } else { r }))
                });
            match opened {
                Ok(x) => {
                    reader = Some(x);
                    first = false;
                }
                Err(e) => {
                    fail(e);
                    continue;
                }
            }
        }
        let (mem, r) = reader.as_mut().expect("opened above");
        let batch = match r.poll(mem) {
            Ok(b) => b,
            Err(e) => {
                fail(chain(&e));
                reader = None;
                continue;
            }
        };
        // Only disks whose cache is exclusive (`vm memory --host-cache`) take notices;
        // until one is, they are read and counted as unforwarded.
        let controls: Vec<_> = rec
            .blk
            .iter()
            .filter(|p| p.serve.exclusive)
            .map(|p| p.serve.control.clone())
            .collect();
        if batch.evicted.len() + batch.released.len() >= BUSY {
            pause = BUSY_POLL;
        }
        let t = std::time::Instant::now();
        let answers = send(&batch, &controls);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        {
            let mut s = stats.lock().expect("evict stats");
            s.forward_ms += ms;
            s.forward_ms_max = s.forward_ms_max.max(ms);
        }
        account(&stats, &batch, controls.len(), answers);
    }
    let mut s = stats.lock().expect("evict stats");
    if s.state == "forwarding" || s.state == "failing" {
        s.state = "stopped".into();
        s.detail = Some("the VM stopped or the guest announced another ring".into());
    }
}

/// Sends the batch to each backend, in requests of at most the backend's limit.
fn send(b: &Batch, controls: &[std::path::PathBuf]) -> Vec<Result<serde_json::Value, String>> {
    if b.evicted.is_empty() && b.released.is_empty() {
        return Vec::new();
    }
    let per = rebound_blk::serve::MAX_NOTICES / 2;
    let mut out = Vec::new();
    for c in controls {
        let chunks = b.evicted.len().max(b.released.len()).div_ceil(per);
        for i in 0..chunks {
            let part = |v: &[u64]| {
                v.iter()
                    .skip(i * per)
                    .take(per)
                    .copied()
                    .collect::<Vec<_>>()
            };
            let copies: Vec<[u64; 3]> = b
                .copies
                .iter()
                .skip(i * per)
                .take(per)
                .map(|c| [c.data_gpa, c.seq_gpa, c.seq])
                .collect();
            let req = serde_json::json!({
                "op": "notices",
                "evicted": part(&b.evicted),
                "copies": copies,
                "released": part(&b.released),
            });
            out.push(match rebound_blk::serve::ask(c, &req) {
                Ok(v) if v.get("error").is_some() => Err(v["error"].to_string()),
                Ok(v) => Ok(v),
                Err(e) => Err(format!("{}: {e}", c.display())),
            });
        }
    }
    out
}

fn account(
    stats: &Mutex<EvictStats>,
    b: &Batch,
    backends: usize,
    answers: Vec<Result<serde_json::Value, String>>,
) {
    let n = (b.evicted.len() + b.released.len()) as u64;
    let mut s = stats.lock().expect("evict stats");
    s.polls += 1;
    s.evicted += b.evicted.len() as u64;
    s.released += b.released.len() as u64;
    s.lost += b.lost;
    s.invalid += b.invalid;
    if backends == 0 {
        s.unforwarded += n;
    } else {
        s.forwarded += n;
    }
    for a in answers {
        match a {
            Ok(v) => {
                s.admitted += v["admitted"].as_u64().unwrap_or(0);
                s.backend_released += v["released"].as_u64().unwrap_or(0);
                if let Some(r) = v["refused"].as_object() {
                    for (why, k) in r {
                        *s.refused.entry(why.clone()).or_default() += k.as_u64().unwrap_or(0);
                    }
                }
            }
            Err(e) => {
                s.backend_errors += 1;
                s.last_error = Some(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_summed_and_errors_kept() {
        let stats = Mutex::new(EvictStats::default());
        let b = Batch {
            evicted: vec![1, 2, 3],
            copies: Vec::new(),
            released: vec![4],
            lost: 2,
            invalid: 1,
        };
        let answers = vec![
            Ok(serde_json::json!({"admitted": 2, "refused": {"no_mapping": 1}, "released": 1})),
            Ok(serde_json::json!({"admitted": 0, "refused": {"no_mapping": 3}, "released": 1})),
            Err("not exclusive".to_string()),
        ];
        account(&stats, &b, 2, answers);
        let s = stats.lock().unwrap().clone();
        assert_eq!((s.evicted, s.released, s.lost, s.invalid), (3, 1, 2, 1));
        assert_eq!((s.forwarded, s.unforwarded, s.admitted), (4, 0, 2));
        assert_eq!(s.refused["no_mapping"], 4);
        assert_eq!((s.backend_released, s.backend_errors), (2, 1));
        assert_eq!(s.last_error.as_deref(), Some("not exclusive"));
        account(&stats, &b, 0, Vec::new());
        assert_eq!(stats.lock().unwrap().unforwarded, 4);
    }
}
