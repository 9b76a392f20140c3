//! Eviction notices from the guest to the VM's disk backends (exclusive host cache,
//! Hcache section 3.3). The guest's module `rebound_evict` writes one notice per page
//! it lets go of, with a copy of an evicted page, into a ring in guest memory; the agent
//! says where (`ready.evict_ring`). Each disk's backend reads the ring itself through
//! its mapping of guest memory, before every request it serves (`rebound_blk::ring`):
//! one thread per VM here (whatever the guest announces: a new ring only retargets it) tells every backend where the ring is every [`POLL`] (every
//! [`BUSY_POLL`] while the guest evicts much), which also makes it take what the ring
//! holds when the guest does no I/O, and sums what the backends answer. Only the
//! backend whose I/O put a block in a page has a mapping for it, the others refuse the
//! notice as `no_mapping` (so refusals of that kind grow with the number of disks). A VM
//! with no disk on Rebound's backend has its ring read by this thread, to count.
//!
//! Counters (`GET /v1/vms/{name}/evict`): notices read, lost (overwritten in the ring
//! before they were read), taken by the backends, and what became of them. A guest
//! without the module is said to have none, never silently counted as zero notices.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound_api::{EvictRingAddr, VmState};
use rebound_guestmem::evict_ring::{Batch, RingReader};
use rebound_guestmem::{GuestMemory, Layout};
use serde::Serialize;
use serde_json::Value;

use super::VmHandle;
use crate::daemon::backend_control::{self, ControlError};
use rebound_errors::chain;

/// How often the backends are told the ring (and take what it holds) while the guest
/// evicts little.
pub const POLL: Duration = Duration::from_millis(20);
/// How often while it evicts much (the last poll found [`BUSY`] notices or more)
/// without the I/O that makes the backends read the ring anyway (a balloon taking
/// memory, `drop_caches`): the ring's page copies (1,024 by default) last ~17 ms at the
/// ~60k evictions/s a TCG guest reaches, and a copy read after it was overwritten is
/// refused.
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
    /// Notices the backends took while their caches were exclusive (counted once per
    /// backend).
    pub forwarded: u64,
    /// Notices read while no disk's cache was exclusive, or the VM had no disk on
    /// Rebound's backend.
    pub unforwarded: u64,
    /// Time spent telling the backends the ring and waiting for their answers (which
    /// includes taking what the ring held): in all, and the longest one round took (ms).
    pub forward_ms: f64,
    pub forward_ms_max: f64,
    /// The backends' answers, summed.
    pub admitted: u64,
    pub refused: BTreeMap<String, u64>,
    pub backend_released: u64,
    pub backend_errors: u64,
    pub last_error: Option<String>,
}

/// The VM's forwarder: which ring is current (a new ring replaces it), its counters,
/// and whether the VM's one forwarder thread runs.
#[derive(Debug, Default)]
pub struct EvictSlot {
    generation: u64,
    key: Option<(EvictRingAddr, std::path::PathBuf)>,
    stats: Arc<Mutex<EvictStats>>,
    running: bool,
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
        // One thread per VM, however many rings the guest announces: a running one
        // takes the new ring at its next poll.
        if ring.is_some() && !slot.running {
            slot.running = true;
            let vm = self.clone();
            std::thread::spawn(move || forward_current(vm));
        }
    }

    /// The ring the forwarder should read now, the one ending with `ended` (its
    /// generation) aside; `None` tells the thread to end, which it then does.
    #[allow(clippy::type_complexity)]
    fn evict_next(
        &self,
        ended: Option<u64>,
    ) -> Option<(u64, EvictRingAddr, PathBuf, Arc<Mutex<EvictStats>>)> {
        let mut slot = self.evict.lock().expect("evict slot");
        if ended == Some(slot.generation) {
            slot.key = None;
        }
        match slot.key.clone() {
            Some((ring, ram)) => Some((slot.generation, ring, ram, slot.stats.clone())),
            None => {
                slot.running = false;
                None
            }
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

/// The VM's forwarder thread: the current ring, then the next, until none is left.
fn forward_current(vm: Arc<VmHandle>) {
    let mut ended = None;
    while let Some((gen, ring, ram, stats)) = vm.evict_next(ended) {
        forward(vm.clone(), gen, ring, ram, stats);
        ended = Some(gen);
    }
}

/// Forwards one ring: until the VM stops or another ring replaces this one.
fn forward(
    vm: Arc<VmHandle>,
    gen: u64,
    ring: EvictRingAddr,
    ram: std::path::PathBuf,
    stats: Arc<Mutex<EvictStats>>,
) {
    let mut own: Option<(GuestMemory<rebound_guestmem::FileSource>, RingReader)> = None;
    // The daemon's own first reader starts from the ring's first notice: the agent
    // reports the ring after the module began writing, and those notices count. One
    // opened again starts from the head, so nothing is counted twice.
    let mut first = true;
    let mut seen: BTreeMap<PathBuf, Seen> = BTreeMap::new();
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
        let controls: Vec<PathBuf> = rec.blk.iter().map(|p| p.serve.control.clone()).collect();
        if controls.is_empty() {
            // No disk on Rebound's backend: the daemon reads the ring itself, to count.
            if let Some(batch) = read_own(&mut own, &mut first, &rec, &ram, ring, &stats) {
                account(&stats, &batch);
            }
            continue;
        }
        own = None;
        first = false;
        let t = std::time::Instant::now();
        let answers: Vec<_> = controls
            .iter()
            .map(|c| (c.clone(), tell(c, ring)))
            .collect();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let mut s = stats.lock().expect("evict stats");
        s.forward_ms += ms;
        s.forward_ms_max = s.forward_ms_max.max(ms);
        if take(&mut s, &mut seen, answers) >= BUSY as u64 {
            pause = BUSY_POLL;
        }
    }
    let mut s = stats.lock().expect("evict stats");
    if s.state == "forwarding" || s.state == "failing" {
        s.state = "stopped".into();
        s.detail = Some("the VM stopped or the guest announced another ring".into());
    }
}

/// One poll of the ring by the daemon itself (no disk on Rebound's backend).
fn read_own(
    own: &mut Option<(GuestMemory<rebound_guestmem::FileSource>, RingReader)>,
    first: &mut bool,
    rec: &crate::daemon::vm::VmRecord,
    ram: &Path,
    ring: EvictRingAddr,
    stats: &Mutex<EvictStats>,
) -> Option<Batch> {
    let fail = |e: String| {
        let mut s = stats.lock().expect("evict stats");
        s.state = "failing".into();
        s.detail = Some(e);
    };
    if own.is_none() {
        let opened = Layout::pc(rec.spec.memory_mib << 20)
            .map_err(|e| e.to_string())
            .and_then(|l| GuestMemory::open_ram_file(ram, l).map_err(|e| e.to_string()))
            .and_then(|m| {
                let r = RingReader::open(&m, ring.gpa, ring.bytes).map_err(|e| chain(&e))?;
                Ok((m, if *first { r.from_start() } else { r }))
            });
        match opened {
            Ok(x) => {
                *own = Some(x);
                *first = false;
            }
            Err(e) => {
                fail(e);
                return None;
            }
        }
    }
    let (mem, r) = own.as_mut().expect("opened above");
    match r.poll(mem) {
        Ok(b) => {
            // Read again (the guest rebooted and wrote its ring anew where the old
            // kernel's was, say): no longer failing.
            let mut s = stats.lock().expect("evict stats");
            if s.state == "failing" {
                s.state = "forwarding".into();
                s.detail = None;
            }
            Some(b)
        }
        Err(e) => {
            fail(chain(&e));
            *own = None;
            None
        }
    }
}

/// Tells one backend where the ring is, which makes it take what the ring holds now
/// (it also takes notices before every request it serves).
fn tell(control: &Path, ring: EvictRingAddr) -> Result<Value, ControlError> {
    let req = serde_json::json!({"op": "ring", "gpa": ring.gpa, "bytes": ring.bytes});
    backend_control::ask(control, &req)
}

/// A backend's running totals, as its last answer gave them.
#[derive(Debug, Clone, Default, PartialEq)]
struct Seen {
    evicted: u64,
    released: u64,
    lost: u64,
    invalid: u64,
    ignored: u64,
    admitted: u64,
    backend_released: u64,
    refused: BTreeMap<String, u64>,
    error: Option<String>,
}

impl Seen {
    fn of(v: &Value) -> Seen {
        let n = |x: &Value| x.as_u64().unwrap_or(0);
        let r = &v["ring"];
        Seen {
            evicted: n(&r["evicted"]),
            released: n(&r["released"]),
            lost: n(&r["lost"]),
            invalid: n(&r["invalid"]),
            ignored: n(&r["ignored"]),
            admitted: n(&v["admitted"]),
            backend_released: n(&v["released"]),
            refused: v["refused"]
                .as_object()
                .map(|m| m.iter().map(|(k, x)| (k.clone(), n(x))).collect())
                .unwrap_or_default(),
            error: r["ring"]
                .is_null()
                .then(|| r["error"].as_str().map(str::to_string))
                .flatten(),
        }
    }

    /// What grew since `old` (a backend started again counts from zero).
    fn since(&self, old: &Seen) -> Seen {
        let d = |new: u64, old: u64| if new >= old { new - old } else { new };
        Seen {
            evicted: d(self.evicted, old.evicted),
            released: d(self.released, old.released),
            lost: d(self.lost, old.lost),
            invalid: d(self.invalid, old.invalid),
            ignored: d(self.ignored, old.ignored),
            admitted: d(self.admitted, old.admitted),
            backend_released: d(self.backend_released, old.backend_released),
            refused: self
                .refused
                .iter()
                .map(|(k, &v)| (k.clone(), d(v, old.refused.get(k).copied().unwrap_or(0))))
                .collect(),
            error: self.error.clone(),
        }
    }
}

/// Adds the backends' answers to the counters: the ring's counts from the first disk
/// (every disk reads the same ring), the notices' outcomes from all. Returns how many
/// notices the ring gave since the last answer.
fn take(
    s: &mut EvictStats,
    seen: &mut BTreeMap<PathBuf, Seen>,
    answers: Vec<(PathBuf, Result<Value, ControlError>)>,
) -> u64 {
    s.polls += 1;
    let mut fresh = 0;
    let mut first = true;
    for (c, a) in answers {
        let v = match a {
            Ok(v) => v,
            Err(e) => {
                s.backend_errors += 1;
                s.last_error = Some(chain(&e));
                continue;
            }
        };
        let new = Seen::of(&v);
        let d = new.since(&seen.get(&c).cloned().unwrap_or_default());
        seen.insert(c, new);
        if first {
            first = false;
            s.evicted += d.evicted;
            s.released += d.released;
            s.lost += d.lost;
            s.invalid += d.invalid;
            s.unforwarded += d.ignored;
            fresh = d.evicted + d.released;
            match d.error {
                Some(e) => {
                    s.state = "failing".into();
                    s.detail = Some(e);
                }
                None => {
                    s.state = "forwarding".into();
                    s.detail = None;
                }
            }
        }
        s.forwarded += (d.evicted + d.released).saturating_sub(d.ignored);
        s.admitted += d.admitted;
        s.backend_released += d.backend_released;
        for (why, k) in d.refused {
            *s.refused.entry(why).or_default() += k;
        }
    }
    fresh
}

/// Counts a batch the daemon read itself (no disk on Rebound's backend takes it).
fn account(stats: &Mutex<EvictStats>, b: &Batch) {
    let mut s = stats.lock().expect("evict stats");
    s.polls += 1;
    s.evicted += b.evicted.len() as u64;
    s.released += b.released.len() as u64;
    s.lost += b.lost;
    s.invalid += b.invalid;
    s.unforwarded += (b.evicted.len() + b.released.len()) as u64;
}

#[cfg(test)]
mod tests;
