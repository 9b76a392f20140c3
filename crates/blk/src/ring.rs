//! The guest's eviction-notice ring (`guest/evict`, read by
//! [`rebound_guestmem::evict_ring`]), drained by the backend itself through its
//! vhost-user mapping of guest memory: before every request it serves, and whenever
//! the daemon asks (`{"op":"ring"}`, every 20 ms, which also says where the ring is).
//!
//! Why here and not in the daemon: the guest writes a notice, under the page-cache lock,
//! before it can reuse the page or read the evicted block again. A backend that takes
//! every notice written so far before it serves a request sees the eviction of a block
//! before the read that brings it back (which then hits the host cache, as in
//! Hcache's synchronous design), and takes each page's copy long before the guest
//! reuses the copy's slot. A daemon polling on its own clock sees neither in time.
//!
//! While the disk's cache is not exclusive the ring is still followed (evictions are
//! skipped and counted as `ignored`, releases drop their mappings), so that the moment
//! it becomes exclusive the evictions are admitted from the first one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rebound_guestmem::evict_ring::{RingError, RingReader, RingSource, SlotRef};
use rebound_guestmem::MemoryError;
use serde::Serialize;
use vm_memory::GuestMemory;

/// What takes the notices drained from the ring: the disk's device.
pub trait NoticeSink {
    /// Whether evictions are admitted now (the cache is exclusive); when not, they are
    /// only counted as `ignored`.
    fn admits_evictions(&self) -> bool;
    /// A release notice: the page no longer holds file data.
    fn released(&self, pfn: u64);
    /// Eviction notices for `pfns`, with the guest's copies of the pages (in the same
    /// order, or none), checked against `mem`.
    fn evictions<M: GuestMemory>(&self, pfns: &[u64], copies: &[SlotRef], mem: &M);
}

/// What the backend read from the ring since it was told where it is.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RingCounts {
    /// Where the ring is (guest physical address, bytes); `None`: not told, or given up.
    pub ring: Option<(u64, u64)>,
    pub polls: u64,
    pub evicted: u64,
    pub released: u64,
    /// Overwritten in the ring before the backend read them.
    pub lost: u64,
    /// Entries with an unknown kind (a misbehaving guest).
    pub invalid: u64,
    /// Evictions read while the cache was not exclusive.
    pub ignored: u64,
    /// Why the ring was given up (the module unloaded, the guest rebooted, a bad header).
    pub error: Option<String>,
}

/// The ring as one disk's backend follows it.
#[derive(Debug, Default)]
pub struct GuestRing {
    /// Checked before the lock: most requests find no ring or nothing new.
    on: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    reader: Option<RingReader>,
    counts: RingCounts,
}

/// Guest memory as the ring reader reads it.
struct Src<'a, M>(&'a M);

impl<M: GuestMemory> RingSource for Src<'_, M> {
    fn read_at(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        vm_memory::Bytes::read_slice(self.0, buf, vm_memory::GuestAddress(gpa)).map_err(|_| {
            MemoryError::NotRam {
                gpa,
                why: "outside the memory the guest shares with the backend",
            }
        })
    }
}

impl GuestRing {
    /// The counts so far.
    pub fn counts(&self) -> RingCounts {
        self.state.lock().expect("ring lock").counts.clone()
    }

    /// Follows the ring at `gpa` (`bytes` long) from the notices written from now on,
    /// unless it follows that one already.
    pub fn set<M: GuestMemory>(&self, gpa: u64, bytes: u64, mem: &M) -> Result<(), RingError> {
        let mut st = self.state.lock().expect("ring lock");
        if st
            .reader
            .as_ref()
            .is_some_and(|r| r.place() == (gpa, bytes))
        {
            return Ok(());
        }
        let r = RingReader::open(&Src(mem), gpa, bytes);
        st.counts = RingCounts::default();
        match r {
            Ok(r) => {
                st.counts.ring = Some((gpa, bytes));
                st.reader = Some(r);
                self.on.store(true, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                st.reader = None;
                st.counts.error = Some(e.to_string());
                self.on.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    /// Takes every notice written so far into `dev`: releases, then evictions with
    /// their copies (admitted only while the cache is exclusive).
    pub fn drain<M: GuestMemory>(&self, dev: &impl NoticeSink, mem: &M) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state.lock().expect("ring lock");
        let src = Src(mem);
        let State { reader, counts } = &mut *st;
        let Some(r) = reader.as_mut() else { return };
        let batch = match r.pending(&src).and_then(|p| match p {
            true => r.poll(&src).map(Some),
            false => Ok(None),
        }) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                // The module unloaded or the guest rebooted (a new ring will be told),
                // or the guest wrote a bad header: stop reading this one.
                counts.error = Some(e.to_string());
                counts.ring = None;
                *reader = None;
                self.on.store(false, Ordering::Release);
                return;
            }
        };
        counts.polls += 1;
        counts.evicted += batch.evicted.len() as u64;
        counts.released += batch.released.len() as u64;
        counts.lost += batch.lost;
        counts.invalid += batch.invalid;
        for &p in &batch.released {
            dev.released(p);
        }
        if dev.admits_evictions() {
            dev.evictions(&batch.evicted, &batch.copies, mem);
        } else {
            counts.ignored += batch.evicted.len() as u64;
        }
    }
}
