//! The host cache of one disk: a bounded LRU of 4 KiB blocks that holds a block only
//! when its content provably equals the backing file's.
//!
//! A block is admitted only right after it was read from or written to the file, and
//! only if no write to it began in between. Every block has a generation (shared by a
//! stripe of blocks: a false conflict only costs an admission): a write bumps it and
//! drops the cached copy before it goes to the file, and bumps it again when it is
//! done; a read remembers the generations before it reads the file and admits what it
//! read only if they are unchanged. A write admits its own data only if no other write
//! to the block began while it ran, else it drops the block. So two writes racing on
//! one block, or a read racing a write, leave the block uncached, never stale.
//!
//! Every read access can be recorded, in order, with its time (the miss-ratio curves
//! are computed from this stream).

use std::io::Write;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use crate::units::BLOCK;
const STRIPES: usize = 1 << 16;

/// The most blocks one read covers: the largest request, plus one when it does not
/// start on a block.
pub const MAX_BLOCKS: usize =
    (crate::config::SIZE_MAX as usize * crate::config::SEG_MAX as usize) / BLOCK as usize + 1;

/// Which blocks of one read the cache served, a bit each, on the stack (4 KiB for the
/// largest request): a read allocates nothing to know its hits.
pub struct Hits {
    bits: [u64; MAX_BLOCKS.div_ceil(64)],
    count: usize,
}

impl Default for Hits {
    fn default() -> Hits {
        Hits {
            bits: [0; MAX_BLOCKS.div_ceil(64)],
            count: 0,
        }
    }
}

impl Hits {
    fn clear(&mut self, count: usize) {
        self.bits[..count.div_ceil(64)].fill(0);
        self.count = count;
    }

    fn set(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
    }

    /// How many blocks were hits.
    pub fn count(&self) -> u64 {
        let words = &self.bits[..self.count.div_ceil(64)];
        words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Whether block `i` of the read was a hit.
    pub fn hit(&self, i: usize) -> bool {
        i < self.count && self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// The runs of missed blocks, `i..j` each, in order.
    pub fn misses(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut i = 0;
        std::iter::from_fn(move || {
            while i < self.count && self.hit(i) {
                i += 1;
            }
            if i >= self.count {
                return None;
            }
            let start = i;
            while i < self.count && !self.hit(i) {
                i += 1;
            }
            Some((start as u64, i as u64))
        })
    }
}

/// What the cache did since the backend started.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheStats {
    pub capacity_bytes: u64,
    pub held_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub admissions: u64,
    /// Blocks not admitted because a write to them began meanwhile.
    pub refused: u64,
    pub evictions: u64,
    /// Cached blocks dropped by a write or discard.
    pub invalidations: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    /// Accesses written to the access log, if one is being recorded.
    pub recorded: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    admissions: AtomicU64,
    refused: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    recorded: AtomicU64,
}

/// The access log: one line per block access, `t_ns,block,kind` with kind `h` (a read
/// served by the cache), `m` (a read from the file), `w` (a write or discard) or `e`
/// (exclusive cache: the guest evicted the page holding the block).
struct Log {
    t0: Instant,
    out: std::io::BufWriter<std::fs::File>,
}

pub struct Cache {
    lru: Mutex<lru::LruCache<u64, Box<[u8]>>>,
    /// Blocks; 0: nothing is cached.
    capacity: AtomicUsize,
    gens: Box<[AtomicU64]>,
    n: Counters,
    log: Mutex<Option<Log>>,
    /// Whether a log is open: accesses skip the log's lock when none is.
    recording: AtomicBool,
    /// Exclusive of the guest's memory (Hcache): reads and writes admit nothing, a hit
    /// moves the block out, and only evicted pages come in ([`Cache::admit_evicted`]).
    exclusive: AtomicBool,
    /// The miss-ratio curve below the guest, traced while the cache is exclusive.
    pub tracer: crate::curve::CurveTracer,
}

/// The generations of a run of blocks when a read of them began.
pub struct ReadTicket {
    first: u64,
    gens: Vec<u64>,
}

/// The generations a write set on its blocks when it began.
pub struct WriteTicket {
    first: u64,
    gens: Vec<u64>,
}

impl Cache {
    /// A cache of at most `bytes` (whole blocks; 0: nothing is ever cached, accesses
    /// are still counted).
    pub fn new(bytes: u64) -> Cache {
        let capacity = (bytes / BLOCK) as usize;
        Cache {
            lru: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(capacity.max(1)).expect("non-zero"),
            )),
            capacity: AtomicUsize::new(capacity),
            gens: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            n: Counters::default(),
            log: Mutex::new(None),
            recording: AtomicBool::new(false),
            exclusive: AtomicBool::new(false),
            tracer: Default::default(),
        }
    }

    /// An exclusive cache of at most `bytes`: it holds what the guest evicted and
    /// nothing the guest holds.
    pub fn new_exclusive(bytes: u64) -> Cache {
        let c = Cache::new(bytes);
        c.reconfigure(bytes, true);
        c
    }

    pub fn is_exclusive(&self) -> bool {
        self.exclusive.load(Ordering::Acquire)
    }

    fn cap(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }

    /// Changes the size and the mode while the guest runs: blocks beyond the new size
    /// go (least recently used first, counted as evictions). What stays is equal to the
    /// disk in either mode; a block the guest also holds leaves an exclusive cache at
    /// its next hit.
    pub fn reconfigure(&self, bytes: u64, exclusive: bool) {
        let capacity = (bytes / BLOCK) as usize;
        let mut lru = self.lru.lock().expect("cache lock");
        let before = lru.len();
        lru.resize(NonZeroUsize::new(capacity.max(1)).expect("non-zero"));
        if capacity == 0 {
            lru.clear();
        }
        self.n
            .evictions
            .fetch_add(before.saturating_sub(lru.len()) as u64, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Release);
        let was = self.exclusive.swap(exclusive, Ordering::AcqRel);
        // Only an exclusive cache sees every guest miss and eviction: the curve is
        // traced from the moment it becomes one, and stops with it.
        match (was, exclusive) {
            (false, true) => self
                .tracer
                .start(crate::curve::TraceConfig::default())
                .expect("the default trace config is valid"),
            (true, false) => self.tracer.stop(),
            _ => {}
        }
    }

    fn gen(&self, block: u64) -> &AtomicU64 {
        &self.gens[(block as usize) % STRIPES]
    }

    /// Copies block `block` into `out` if it is cached (counting a hit or a miss). An
    /// exclusive cache lets the block go: the guest holds it now.
    pub fn get(&self, block: u64, out: &mut [u8]) -> bool {
        let mut hits = Hits::default();
        self.get_many(block, 1, &mut hits, |_, d| {
            out[..BLOCK as usize].copy_from_slice(d)
        });
        hits.hit(0)
    }

    /// [`Cache::get`] of `count` blocks from `first` on, under one lock (a 1 MiB
    /// request is 256 blocks): `copy(i, data)` gets each cached block `first + i`, and
    /// `hits` says which were.
    pub fn get_many(
        &self,
        first: u64,
        count: u64,
        hits: &mut Hits,
        mut copy: impl FnMut(usize, &[u8]),
    ) {
        assert!(count as usize <= MAX_BLOCKS, "{count} blocks in one read");
        hits.clear(count as usize);
        if self.cap() > 0 {
            let mut lru = self.lru.lock().expect("cache lock");
            let exclusive = self.is_exclusive();
            for (i, b) in (first..first + count).enumerate() {
                let hit = match exclusive {
                    true => lru.pop(&b).map(|d| copy(i, &d)).is_some(),
                    false => lru.get(&b).map(|d| copy(i, d)).is_some(),
                };
                if hit {
                    hits.set(i);
                }
            }
        }
        let n = hits.count();
        self.n.hits.fetch_add(n, Ordering::Relaxed);
        self.n.misses.fetch_add(count - n, Ordering::Relaxed);
        for (i, b) in (first..first + count).enumerate() {
            self.record(b, if hits.hit(i) { 'h' } else { 'm' });
        }
    }

    /// Whether a read's misses enter the cache (inclusive, not empty): they must then be
    /// read into memory the guest cannot change.
    pub fn fills_on_miss(&self) -> bool {
        self.cap() > 0 && !self.is_exclusive()
    }

    /// Before reading `count` blocks from the file.
    pub fn begin_read(&self, first: u64, count: u64) -> ReadTicket {
        ReadTicket {
            first,
            gens: (first..first + count)
                .map(|b| self.gen(b).load(Ordering::Acquire))
                .collect(),
        }
    }

    /// After the read of `t`'s blocks returned `data`: each block is admitted if no
    /// write to it began since the ticket. `None`: the data went where the host keeps
    /// no copy of it (only when [`Cache::fills_on_miss`] said no), nothing is admitted.
    pub fn end_read(&self, t: &ReadTicket, data: Option<&[u8]>) {
        self.n
            .read_bytes
            .fetch_add(t.gens.len() as u64 * BLOCK, Ordering::Relaxed);
        let Some(data) = data else { return };
        if self.cap() == 0 || self.is_exclusive() {
            return;
        }
        let mut lru = self.lru.lock().expect("cache lock");
        for (i, g) in t.gens.iter().enumerate() {
            let b = t.first + i as u64;
            if self.gen(b).load(Ordering::Acquire) != *g {
                self.n.refused.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let chunk = &data[i * BLOCK as usize..(i + 1) * BLOCK as usize];
            self.insert(&mut lru, b, chunk);
        }
    }

    fn insert(&self, lru: &mut lru::LruCache<u64, Box<[u8]>>, b: u64, data: &[u8]) {
        if let Some((old, _)) = lru.push(b, data.into()) {
            if old != b {
                self.n.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.n.admissions.fetch_add(1, Ordering::Relaxed);
    }

    /// Before a write (or discard) of blocks `first..first + count` goes to the file:
    /// their cached copies are dropped.
    pub fn begin_write(&self, first: u64, count: u64) -> WriteTicket {
        let mut lru = self.lru.lock().expect("cache lock");
        let gens = (first..first + count)
            .map(|b| {
                if !crate::faults::skipped(crate::faults::Check::WriteInvalidate)
                    && lru.pop(&b).is_some()
                {
                    self.n.invalidations.fetch_add(1, Ordering::Relaxed);
                }
                self.record(b, 'w');
                self.gen(b).fetch_add(1, Ordering::AcqRel) + 1
            })
            .collect();
        WriteTicket { first, gens }
    }

    /// After the write is on the file: `data` (whole blocks, or `None` for a partial
    /// write or a failed one) is admitted where no other write began meanwhile.
    pub fn end_write(&self, t: &WriteTicket, data: Option<&[u8]>, bytes: u64) {
        self.n.written_bytes.fetch_add(bytes, Ordering::Relaxed);
        let mut lru = self.lru.lock().expect("cache lock");
        for (i, g) in t.gens.iter().enumerate() {
            let b = t.first + i as u64;
            let gen = self.gen(b);
            let alone = gen.load(Ordering::Acquire) == *g;
            match data {
                Some(d) if alone && self.cap() > 0 && !self.is_exclusive() => self.insert(
                    &mut lru,
                    b,
                    &d[i * BLOCK as usize..(i + 1) * BLOCK as usize],
                ),
                _ => {
                    if !crate::faults::skipped(crate::faults::Check::WriteInvalidate)
                        && lru.pop(&b).is_some()
                    {
                        self.n.invalidations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            gen.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The generation of `block` now: an I/O records it with the mapping it makes, and
    /// an eviction is admitted only while it is unchanged.
    pub fn gen_of(&self, block: u64) -> u64 {
        self.gen(block).load(Ordering::Acquire)
    }

    /// Exclusive caching: a page the guest evicted, checked against its mapping
    /// ([`PageMap::evicted`](crate::exclusive::PageMap::evicted)), enters the cache if
    /// no write to its block began since the I/O that mapped it. Checked under the
    /// cache's lock, which a write's start also takes: the write then drops it.
    pub fn admit_evicted(
        &self,
        e: &crate::exclusive::Evicted,
    ) -> Result<(), crate::exclusive::Refusal> {
        if self.cap() == 0 {
            return Ok(());
        }
        let mut lru = self.lru.lock().expect("cache lock");
        if self.gen(e.block).load(Ordering::Acquire) != e.gen
            && !crate::faults::skipped(crate::faults::Check::Generation)
        {
            self.n.refused.fetch_add(1, Ordering::Relaxed);
            return Err(crate::exclusive::Refusal::WrittenSince);
        }
        self.insert(&mut lru, e.block, &e.data);
        Ok(())
    }

    /// Records every access to `path` from now on (replacing any earlier log), or
    /// stops recording (`None`).
    pub fn record_to(&self, path: Option<&Path>) -> std::io::Result<()> {
        let log = match path {
            Some(p) => Some(Log {
                t0: Instant::now(),
                out: std::io::BufWriter::new(std::fs::File::create(p)?),
            }),
            None => None,
        };
        let mut cur = self.log.lock().expect("log lock");
        if let Some(mut old) = cur.take() {
            old.out.flush()?;
        }
        self.recording.store(log.is_some(), Ordering::Release);
        *cur = log;
        Ok(())
    }

    fn record(&self, block: u64, kind: char) {
        self.tracer.feed(block, kind);
        if !self.recording.load(Ordering::Acquire) {
            return;
        }
        let mut g = self.log.lock().expect("log lock");
        if let Some(l) = g.as_mut() {
            let t = l.t0.elapsed().as_nanos();
            if writeln!(l.out, "{t},{block},{kind}").is_ok() {
                self.n.recorded.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Logs that the guest evicted its copy of `block` (exclusive caching).
    pub fn record_eviction(&self, block: u64) {
        self.record(block, 'e');
    }

    /// Writes out what the access log has buffered.
    pub fn flush_log(&self) -> std::io::Result<()> {
        match self.log.lock().expect("log lock").as_mut() {
            Some(l) => l.out.flush(),
            None => Ok(()),
        }
    }

    pub fn stats(&self) -> CacheStats {
        let held = self.lru.lock().expect("cache lock").len() as u64;
        let n = &self.n;
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CacheStats {
            capacity_bytes: self.cap() as u64 * BLOCK,
            held_bytes: if self.cap() == 0 { 0 } else { held * BLOCK },
            hits: l(&n.hits),
            misses: l(&n.misses),
            admissions: l(&n.admissions),
            refused: l(&n.refused),
            evictions: l(&n.evictions),
            invalidations: l(&n.invalidations),
            read_bytes: l(&n.read_bytes),
            written_bytes: l(&n.written_bytes),
            recorded: l(&n.recorded),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: u8) -> Vec<u8> {
        vec![v; BLOCK as usize]
    }

    #[test]
    fn a_read_is_admitted_and_then_hit() {
        let c = Cache::new(2 * BLOCK);
        let mut out = block(0);
        assert!(!c.get(5, &mut out));
        let t = c.begin_read(5, 1);
        c.end_read(&t, Some(&block(9)));
        assert!(c.get(5, &mut out));
        assert_eq!(out, block(9));
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.admissions), (1, 1, 1));
    }

    #[test]
    fn a_read_gets_its_hits_in_place_and_its_misses_as_runs() {
        let c = Cache::new(1 << 20);
        for b in [1, 2, 5, 63, 64, 129] {
            let t = c.begin_read(b, 1);
            c.end_read(&t, Some(&block(b as u8)));
        }
        let mut out = vec![0u8; 130 * BLOCK as usize];
        let mut hits = Hits::default();
        c.get_many(0, 130, &mut hits, |i, d| {
            out[i * BLOCK as usize..(i + 1) * BLOCK as usize].copy_from_slice(d)
        });
        let runs: Vec<_> = hits.misses().collect();
        assert_eq!(runs, [(0, 1), (3, 5), (6, 63), (65, 129)]);
        assert_eq!(hits.count(), 6);
        for (i, b) in out.chunks(BLOCK as usize).enumerate() {
            let want = if hits.hit(i) { i as u8 } else { 0 };
            assert!(b.iter().all(|x| *x == want), "block {i}");
        }
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (6, 124));
        // A smaller read after it sees none of the larger one's bits.
        c.get_many(200, 3, &mut hits, |_, _| unreachable!());
        assert_eq!(
            (hits.count(), hits.misses().collect::<Vec<_>>()),
            (0, vec![(0, 3)])
        );
    }

    #[test]
    fn a_write_during_a_read_keeps_the_read_out() {
        let c = Cache::new(4 * BLOCK);
        let t = c.begin_read(1, 2);
        let w = c.begin_write(2, 1);
        // The read may have seen the old or the new content of block 2.
        c.end_read(&t, Some(&[block(1), block(2)].concat()));
        c.end_write(&w, Some(&block(3)), BLOCK);
        let mut out = block(0);
        assert!(c.get(1, &mut out));
        assert!(c.get(2, &mut out));
        assert_eq!(out, block(3), "block 2 holds the write, not the read");
        assert_eq!(c.stats().refused, 1);
    }

    #[test]
    fn two_racing_writes_leave_the_block_uncached() {
        let c = Cache::new(4 * BLOCK);
        let w1 = c.begin_write(7, 1);
        let w2 = c.begin_write(7, 1);
        c.end_write(&w2, Some(&block(2)), BLOCK);
        c.end_write(&w1, Some(&block(1)), BLOCK);
        let mut out = block(0);
        assert!(!c.get(7, &mut out), "either write may be on disk");
    }

    #[test]
    fn the_lru_evicts_and_a_zero_cache_caches_nothing() {
        let c = Cache::new(2 * BLOCK);
        for b in 0..3 {
            let t = c.begin_read(b, 1);
            c.end_read(&t, Some(&block(b as u8)));
        }
        let s = c.stats();
        assert_eq!((s.evictions, s.held_bytes), (1, 2 * BLOCK));
        let z = Cache::new(0);
        let t = z.begin_read(0, 1);
        z.end_read(&t, Some(&block(1)));
        assert!(!z.get(0, &mut block(0)));
        assert_eq!(z.stats().admissions, 0);
        // Shrunk at run time: the least recently used block goes; grown, it admits.
        c.reconfigure(BLOCK, false);
        let s = c.stats();
        assert_eq!(
            (s.evictions, s.held_bytes, s.capacity_bytes),
            (2, BLOCK, BLOCK)
        );
        assert!(c.get(2, &mut block(0)) && !c.get(1, &mut block(0)));
        z.reconfigure(2 * BLOCK, false);
        let t = z.begin_read(0, 1);
        z.end_read(&t, Some(&block(1)));
        assert!(z.get(0, &mut block(0)));
    }

    #[test]
    fn an_evicted_page_is_admitted_unless_a_write_began_and_a_take_moves_it_out() {
        use crate::exclusive::{PageMap, Refusal};
        let c = Cache::new_exclusive(4 * BLOCK);
        let mut m = PageMap::new();
        // Reads and writes admit nothing.
        let t = c.begin_read(8, 1);
        c.end_read(&t, Some(&block(8)));
        let w = c.begin_write(7, 1);
        c.end_write(&w, Some(&block(7)), BLOCK);
        assert_eq!(c.stats().held_bytes, 0);
        m.on_io(3, 8, &block(8), c.gen_of(8));
        let e = m.evicted(
            3,
            |p| {
                p.copy_from_slice(&block(8));
                true
            },
            |_, _| unreachable!(),
        );
        let e = e.unwrap();
        c.admit_evicted(&e).unwrap();
        let mut out = block(0);
        assert!(c.get(8, &mut out));
        assert_eq!(out, block(8));
        assert!(!c.get(8, &mut out), "exclusive: the hit left the cache");
        // A write to the block begins between the check of the page and the admission.
        m.on_io(4, 9, &block(9), c.gen_of(9));
        let e = m
            .evicted(
                4,
                |p| {
                    p.copy_from_slice(&block(9));
                    true
                },
                |_, _| unreachable!(),
            )
            .unwrap();
        let w = c.begin_write(9, 1);
        assert_eq!(c.admit_evicted(&e), Err(Refusal::WrittenSince));
        c.end_write(&w, None, BLOCK);
        assert!(!c.get(9, &mut out));
    }

    #[test]
    fn the_access_log_has_every_access_in_order() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log.csv");
        let c = Cache::new(4 * BLOCK);
        c.record_to(Some(&p)).unwrap();
        c.get(3, &mut block(0));
        let t = c.begin_read(3, 1);
        c.end_read(&t, Some(&block(3)));
        c.get(3, &mut block(0));
        let w = c.begin_write(3, 1);
        c.end_write(&w, None, BLOCK);
        c.record_to(None).unwrap();
        let kinds: Vec<String> = std::fs::read_to_string(&p)
            .unwrap()
            .lines()
            .map(|l| l.split(',').skip(1).collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(kinds, ["3,m", "3,h", "3,w"]);
    }
}
