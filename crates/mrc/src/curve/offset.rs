//! From the hypervisor's view below a guest's direct memory to the guest's
//! miss-ratio curve (paper sections 3.4 and 4.1).
//!
//! The hypervisor manages part of a VM's memory as an exclusive cache: the
//! guest keeps `X` pages of direct memory, and the hypervisor sees only what
//! leaves it, each access that misses the `X` pages and each page the guest
//! evicts (section 3.3 has the guest report evictions). With an LRU guest,
//! the `X` direct pages are the top `X` of the virtual LRU stack of all the
//! guest's accesses, and the pages outside, ordered by when the guest
//! evicted them, are the rest of the stack in order: a page leaves the top
//! `X` exactly when `X` more recently used pages push it out, so eviction
//! order is last-use order (Figure 5). A missed page found at rank `k` among
//! the evicted pages (1 = evicted last) therefore has stack distance `X + k`
//! in the guest's own stream, and it would have hit a guest memory of
//! `X + s` pages exactly when `k <= s`.
//!
//! So the [`ExclusiveTracer`] measures `k` for every miss, the curve of
//! those ranks at host size `s` counts the misses of a guest of `X + s`
//! pages, and [`MissRatioCurve::shifted`] relabels it by `X`. Its miss ratio
//! is out of the guest's total accesses when that count is known (from the
//! guest's own counters, say), else out of the traced misses, in which case
//! the ratio at `X` is 1 and the curve reads as "fraction of today's misses".
//!
//! The eviction reports are needed: the stack distances of the miss stream
//! alone do not give the guest's curve. With `X = 2`, the accesses
//! `a b a c b` miss as `a b c b`; in that stream the second `b` is at
//! distance 2 (`c` came between), which predicts a miss for `X + 1 = 3`
//! pages, yet in the guest's stream `b` is at distance 3 and hits (`a` was
//! re-used while resident, which the miss stream never shows). Ranking by
//! eviction order gets this right; the test
//! `miss_stream_alone_is_not_enough` keeps the example.
//!
//! The tracer expects a miss to be reported before the eviction it causes;
//! an eviction reported first would place one extra page above the missed
//! one. A guest that is not quite LRU makes the curve approximate, as the
//! paper measured (section 6.4).

use crate::hash::BlockMap;
use crate::histogram::Histogram;
use crate::shards::{spatial_hash, threshold, ShardsError, MODULUS};
use crate::stack::StackDistance;

use super::MissRatioCurve;

/// Errors of shifting a curve.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OffsetError {
    #[error("the curve is already shifted (it starts at {0} pages)")]
    AlreadyShifted(u64),
    #[error("the guest made {guest} accesses, fewer than the {traced} misses traced below it")]
    TooFewGuestAccesses { guest: u64, traced: f64 },
}

/// What the hypervisor learns from a guest with an exclusive cache below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestEvent {
    /// The guest missed its direct memory on this page.
    Miss(u64),
    /// The guest evicted this page from its direct memory.
    Evict(u64),
    /// The page is back in the guest without a miss (the guest overwrote its
    /// block whole): it leaves the evicted pages uncounted.
    Returned(u64),
}

/// Ranks each guest miss among the pages the guest has evicted and not yet
/// taken back, in eviction order (see the module doc).
#[derive(Clone, Debug)]
pub struct ExclusiveTracer {
    /// Evicted pages, most recently evicted on top.
    evicted: StackDistance,
    histogram: Histogram,
    misses: u64,
    /// Pages evicted more than once without a miss in between: a sign that
    /// the events arrive out of order or some are lost.
    doubled: BlockMap<()>,
    /// SHARDS' spatial sampling: only pages hashing below this are traced
    /// (`MODULUS`: every page).
    threshold: u64,
}

impl Default for ExclusiveTracer {
    fn default() -> Self {
        Self::new()
    }
}

impl ExclusiveTracer {
    /// A tracer with one histogram bucket per page.
    pub fn new() -> Self {
        Self::with_bucket_width(1)
    }

    /// A tracer whose histogram buckets are `width` pages wide.
    pub fn with_bucket_width(width: u64) -> Self {
        ExclusiveTracer {
            evicted: StackDistance::new(),
            histogram: Histogram::new(width),
            misses: 0,
            doubled: BlockMap::default(),
            threshold: MODULUS,
        }
    }

    /// A tracer that follows only a fraction `rate` of the pages, chosen by
    /// hash as SHARDS does (see [`crate::shards`]): a sampled page's rank
    /// among the sampled evicted pages, scaled by `1 / rate`, stands for its
    /// rank among all of them. Memory is about `rate` of the exact tracer's.
    pub fn sampled(rate: f64, width: u64) -> Result<Self, ShardsError> {
        let mut t = Self::with_bucket_width(width);
        t.threshold = threshold(rate)?;
        Ok(t)
    }

    /// The fraction of pages traced (1 unless [`ExclusiveTracer::sampled`]).
    pub fn rate(&self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    fn traced(&self, page: u64) -> bool {
        self.threshold == MODULUS || spatial_hash(page) < self.threshold
    }

    /// Records one event.
    pub fn record(&mut self, event: GuestEvent) {
        match event {
            GuestEvent::Miss(page) => self.miss(page),
            GuestEvent::Evict(page) => self.evict(page),
            GuestEvent::Returned(page) => self.returned(page),
        }
    }

    /// The guest missed `page`: rank it among the evicted pages (a page
    /// never evicted is a cold miss) and take it off, as it is back in the
    /// guest.
    pub fn miss(&mut self, page: u64) {
        self.misses += 1;
        if !self.traced(page) {
            return;
        }
        let rank = self.evicted.remove(page);
        self.doubled.remove(&page);
        let rate = self.rate();
        let rank = rank.map(|k| ((k as f64 / rate).round() as u64).max(1));
        self.histogram.add(rank, 1.0);
    }

    /// `page` came back into the guest without a miss: it is no longer among
    /// the evicted pages, and counts for nothing.
    pub fn returned(&mut self, page: u64) {
        if self.traced(page) {
            self.evicted.remove(page);
            self.doubled.remove(&page);
        }
    }

    /// Pages the tracer holds as evicted (sampled ones only, when sampling).
    pub fn evicted_pages(&self) -> usize {
        self.evicted.len()
    }

    /// The guest evicted `page`: it becomes the most recently evicted.
    pub fn evict(&mut self, page: u64) {
        if !self.traced(page) {
            return;
        }
        if self.evicted.access(page).is_some() {
            self.doubled.insert(page, ());
        }
    }

    /// Pages currently reported evicted twice without a miss between.
    pub fn inconsistent_pages(&self) -> usize {
        self.doubled.len()
    }

    /// Histogram of the ranks: host-side stack distances, `X` less than the
    /// guest's.
    pub fn histogram(&self) -> Histogram {
        let mut h = self.histogram.clone();
        h.set_accesses(self.misses);
        h
    }
}

impl MissRatioCurve {
    /// The guest's curve from a curve of the host-side ranks traced below
    /// `direct` pages of guest memory: the point at host size `s` becomes
    /// the guest's at `direct + s`. Miss ratios are out of `guest_accesses`
    /// when given, else out of the traced misses.
    pub fn shifted(&self, direct: u64, guest_accesses: Option<u64>) -> Result<Self, OffsetError> {
        if self.base != 0 {
            return Err(OffsetError::AlreadyShifted(self.base));
        }
        let accesses = match guest_accesses {
            None => self.accesses,
            Some(guest) if (guest as f64) < self.accesses => {
                return Err(OffsetError::TooFewGuestAccesses {
                    guest,
                    traced: self.accesses,
                })
            }
            Some(guest) => guest as f64,
        };
        Ok(MissRatioCurve {
            base: direct,
            step: self.step,
            misses: self.misses.clone(),
            accesses,
        })
    }
}
