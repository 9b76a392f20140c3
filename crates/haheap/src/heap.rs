//! The transactional heap: a tracked region, its shadow (last committed state), an engine,
//! and optionally a backup.
//!
//! `tend` = engine reports written pages → byte diff against the shadow → ship to the
//! backup with a commit record → copy the changed bytes into the shadow. `abort` copies the
//! shadow (page engines) or the undo log (`log`) back over what was written.

use std::time::{Duration, Instant};

use crate::config::{ConfigError, EngineKind, HeapConfig, HeapCounters, Spin, TxStats};
use crate::engine::{self, Dirty, EngineError, Tracker};
use crate::region::{Region, RegionError, Shadow};
use crate::repl::{self, DiffRun, ReplError, Replicator};
use crate::sys;

/// Errors of heap operations.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// tstart was called while a transaction is open.
    #[error("a transaction is already open (nested transactions are not supported)")]
    Nested,
    /// tend, abort or write was called with no transaction open.
    #[error("no transaction is open")]
    NoTransaction,
    /// A write would reach outside the heap.
    #[error("write of {len} bytes at offset {offset} reaches outside the heap of {size} bytes")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    /// A bad configuration value.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The region could not be mapped or declared.
    #[error(transparent)]
    Region(#[from] RegionError),
    /// The dirty-tracking engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Replication failed (the source says whether the transaction was rolled back or is in doubt).
    #[error("replication failed")]
    Replication(#[source] ReplError),
    /// A committed transaction still waits for the backup's acknowledgement.
    #[error("transaction {0} awaits the backup's acknowledgement; call tend to retry")]
    AwaitingAck(u64),
    /// Takeover needs the backup's endpoint.
    #[error("takeover needs a backup endpoint in the configuration")]
    NoBackup,
    /// The backup's replica does not fit the requested heap size.
    #[error("the backup's replica is {replica} bytes but {requested} were requested")]
    SizeMismatch { replica: usize, requested: usize },
    /// An earlier engine failure left tracking in an unknown state.
    #[error("the heap is unusable after an earlier engine failure")]
    Broken,
    /// The backup fenced this primary: a promote or another process's takeover made a new
    /// primary current. Nothing can be committed from this heap any more; only the
    /// transactions whose `tend` succeeded are in the replica.
    #[error("this primary was fenced by its backup (a promote or a takeover made another one current); it can no longer commit: {0}")]
    Fenced(String),
}

/// Pages diffed between checks for a part to stream.
const PART_PAGES: usize = 4;
/// Diff bytes worth streaming as a part before the commit (smaller diffs go whole: a part
/// costs a frame and a system call on each side).
const PART_BYTES: u64 = 2048;

/// A transactional, optionally replicated heap region.
pub struct Heap {
    // Drop order: the engine restores protections before the shadow and region go away.
    tracker: Box<dyn Tracker>,
    repl: Option<Box<dyn Replicator>>,
    shadow: Option<Shadow>,
    region: Region,
    kind: EngineKind,
    reason: String,
    in_tx: bool,
    broken: bool,
    /// The backup's reason, once it fenced this primary: every later call fails with it.
    fenced: Option<String>,
    /// A transaction committed here and queued for the backup, not yet acknowledged.
    pending: Option<TxStats>,
    tx_id: u64,
    written_hint: usize,
    dirty: Dirty,
    runs: Vec<DiffRun>,
    /// How many of `runs` went out as streamed parts in this `tend`.
    sent_runs: usize,
    last_pages: Vec<usize>,
    last_runs: Vec<DiffRun>,
    counters: HeapCounters,
}

impl Heap {
    /// Maps a fresh zeroed heap of `cfg.size` bytes (rounded up to pages).
    pub fn create(cfg: HeapConfig) -> Result<Heap, Error> {
        let region = Region::map(cfg.size, sys::page_size())?;
        // Engine first, backup last: a heap that cannot track must not announce itself.
        let parts = Parts::new(region, &cfg, None)?;
        let repl = connect(&cfg, parts.region.len())?;
        Ok(parts.into_heap(repl, 0))
    }

    /// Tracks memory the caller already has; its current contents are the committed state.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be page-aligned, readable and writable private anonymous memory
    /// that stays mapped until the Heap is dropped and that nobody else changes the protection
    /// of or registers with userfaultfd meanwhile. On drop it is left read-write.
    pub unsafe fn declare(ptr: *mut u8, len: usize, cfg: HeapConfig) -> Result<Heap, Error> {
        // SAFETY: forwarded caller contract.
        let region = unsafe { Region::declare(ptr, len, sys::page_size())? };
        // SAFETY: the caller guarantees the memory is readable for `len` bytes.
        let current = unsafe { std::slice::from_raw_parts(ptr, len) };
        let parts = Parts::new(region, &cfg, Some(current))?;
        let repl = connect(&cfg, parts.region.len())?;
        Ok(parts.into_heap(repl, 0))
    }

    /// Becomes the new primary: fetches the committed image from the backup named in
    /// `cfg.backup` and continues replicating after its last transaction.
    pub fn takeover(cfg: HeapConfig) -> Result<Heap, Error> {
        let ep = cfg.backup.as_deref().ok_or(Error::NoBackup)?;
        // Attaching fences the old primary: check that the engine works before doing that.
        engine::resolve(cfg.engine)?;
        let (client, image, last_tx) = repl::attach(ep, &cfg).map_err(Error::Replication)?;
        let page = sys::page_size();
        if cfg.size != 0 && crate::region::round_up(cfg.size, page) != Some(image.len()) {
            return Err(Error::SizeMismatch {
                replica: image.len(),
                requested: cfg.size,
            });
        }
        let mut region = Region::map(image.len(), page)?;
        region.as_mut_slice().copy_from_slice(&image);
        let parts = Parts::new(region, &cfg, Some(&image))?;
        Ok(parts.into_heap(Some(client), last_tx))
    }

    /// The engine in use (never `Auto`).
    pub fn engine(&self) -> EngineKind {
        self.kind
    }
    /// Why this engine was chosen.
    pub fn engine_reason(&self) -> &str {
        &self.reason
    }
    /// The heap's contents.
    pub fn as_slice(&self) -> &[u8] {
        self.region.as_slice()
    }
    /// Base address for direct stores (tracked by page engines inside a transaction).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.region.ptr()
    }
    /// Size in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.region.len()
    }
    /// Never true: a heap has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }
    pub fn page_size(&self) -> usize {
        self.region.page_size()
    }
    /// Id of the last committed transaction (0 before the first).
    pub fn committed_tx_id(&self) -> u64 {
        self.tx_id
    }
    pub fn in_transaction(&self) -> bool {
        self.in_tx
    }
    /// Pages the engine reported for the last committed transaction (ascending).
    pub fn dirty_pages_of_last_tx(&self) -> &[usize] {
        &self.last_pages
    }
    /// Cumulative counters since the heap was created.
    pub fn counters(&self) -> HeapCounters {
        self.counters
    }
    /// Byte ranges shipped for the last committed transaction.
    pub fn dirty_runs_of_last_tx(&self) -> &[DiffRun] {
        &self.last_runs
    }

    fn usable(&self) -> Result<(), Error> {
        match (&self.fenced, self.broken) {
            (Some(why), _) => Err(Error::Fenced(why.clone())),
            (None, true) => Err(Error::Broken),
            (None, false) => Ok(()),
        }
    }

    /// A replication failure as the caller sees it; a fence is remembered for good.
    fn repl_failed(&mut self, e: ReplError) -> Error {
        match e.fenced() {
            Some(why) => {
                self.fenced = Some(why.to_string());
                Error::Fenced(why.to_string())
            }
            None => Error::Replication(e),
        }
    }

    /// Opens a transaction.
    pub fn tstart(&mut self) -> Result<(), Error> {
        self.usable()?;
        if let Some(p) = &self.pending {
            return Err(Error::AwaitingAck(p.tx_id));
        }
        if self.in_tx {
            return Err(Error::Nested);
        }
        self.tracker.begin().inspect_err(|_| self.broken = true)?;
        self.in_tx = true;
        self.written_hint = 0;
        Ok(())
    }

    /// Copies `data` to `offset` inside the open transaction (the only way the `log`
    /// engine sees a write).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), Error> {
        if !self.in_tx {
            return Err(Error::NoTransaction);
        }
        let size = self.region.len();
        if offset.checked_add(data.len()).is_none_or(|end| end > size) {
            return Err(Error::OutOfBounds {
                offset,
                len: data.len(),
                size,
            });
        }
        self.tracker
            .before_write(self.region.as_slice(), offset, data.len());
        // SAFETY: bounds checked above; `copy` tolerates `data` overlapping the region.
        unsafe { std::ptr::copy(data.as_ptr(), self.region.ptr().add(offset), data.len()) };
        self.written_hint += data.len();
        Ok(())
    }

    /// Commits the open transaction: diff, ship (if a backup is configured), update the shadow.
    ///
    /// If the backup does not acknowledge a transaction that was already queued for it,
    /// the transaction stays committed here (the backup may still apply it) and the heap
    /// refuses new transactions until a later `tend` sees the acknowledgement. If the
    /// client refused the transaction outright it is rolled back.
    pub fn tend(&mut self) -> Result<TxStats, Error> {
        self.usable()?;
        if let Some(p) = self.pending {
            return self.retry_pending(p);
        }
        if !self.in_tx {
            return Err(Error::NoTransaction);
        }
        let t0 = Instant::now();
        if let Err(e) = self.tracker.take(&mut self.dirty) {
            self.broken = true;
            return Err(e.into());
        }
        let t1 = Instant::now();
        self.counters.collect_ns += (t1 - t0).as_nanos() as u64;
        let tx_id = self.tx_id + 1;
        let streamed = match self.diff_and_stream(tx_id) {
            Ok(n) => n,
            Err(e) => {
                self.in_tx = false;
                self.roll_back_taken()?;
                return Err(self.repl_failed(e));
            }
        };
        let t2 = Instant::now();
        let payload: u64 = self.runs.iter().map(|r| u64::from(r.len)).sum();
        let mut stats = TxStats {
            tx_id,
            pages: self.dirty.pages.len(),
            bytes_written_hint: self.written_hint,
            bytes_shipped: payload as usize,
        };
        // Send, then bring the shadow up to date and re-arm tracking while the backup
        // works, then wait for its acknowledgement.
        if let Some(r) = &mut self.repl {
            let res = r.send(tx_id, &self.runs[self.sent_runs..], self.region.as_slice());
            self.counters.ship_ns += t2.elapsed().as_nanos() as u64;
            match res {
                Ok(n) => stats.bytes_shipped = (streamed + n) as usize,
                Err(e @ ReplError::InDoubt { .. }) => {
                    self.finish_commit(tx_id)?;
                    self.counters.commits += 1;
                    self.pending = Some(stats);
                    return Err(self.repl_failed(e));
                }
                Err(e) => {
                    self.in_tx = false;
                    self.roll_back_taken()?;
                    return Err(self.repl_failed(e));
                }
            }
        }
        self.finish_commit(tx_id)?;
        if let Some(r) = &mut self.repl {
            let t3 = Instant::now();
            let waited = r.wait(tx_id);
            self.counters.ship_ns += t3.elapsed().as_nanos() as u64;
            if let Err(e) = waited {
                // Queued and committed here; the next tend waits for the acknowledgement.
                self.counters.commits += 1;
                self.pending = Some(stats);
                return Err(self.repl_failed(e));
            }
        }
        let c = &mut self.counters;
        c.commits += 1;
        c.pages += stats.pages as u64;
        c.runs += self.last_runs.len() as u64;
        c.bytes_shipped += stats.bytes_shipped as u64;
        Ok(stats)
    }

    /// Computes the runs of the taken pages into `self.runs`. With a backup and a large
    /// diff, every [`PART_BYTES`] of runs go out as a streamed part while the next pages
    /// are still being diffed, so the backup checks and logs them meanwhile; the rest goes
    /// with the commit. Returns the bytes streamed so far.
    fn diff_and_stream(&mut self, tx_id: u64) -> Result<u64, ReplError> {
        self.runs.clear();
        self.sent_runs = 0;
        let t0 = Instant::now();
        let Some(shadow) = &self.shadow else {
            ranges_to_runs(&self.dirty.ranges, &mut self.runs);
            self.counters.diff_ns += t0.elapsed().as_nanos() as u64;
            return Ok(0);
        };
        let (page, pages) = (self.region.page_size(), &self.dirty.pages);
        let (cur, old) = (self.region.as_slice(), shadow.as_slice());
        let mut streamed = 0;
        let (mut sent_runs, mut unsent_bytes) = (0, 0u64);
        let mut ship_ns = 0;
        for (i, chunk) in pages.chunks(PART_PAGES).enumerate() {
            let before = self.runs.len();
            if let Some(&p) = pages.get((i + 1) * PART_PAGES) {
                repl::prefetch_page(old, cur, p, page);
            }
            repl::diff_pages(old, cur, chunk, page, &mut self.runs);
            unsent_bytes += self.runs[before..]
                .iter()
                .map(|r| u64::from(r.len))
                .sum::<u64>();
            let more = (i + 1) * PART_PAGES < pages.len();
            if let (Some(r), true) = (&mut self.repl, more && unsent_bytes >= PART_BYTES) {
                let t = Instant::now();
                streamed += r.send_part(tx_id, &self.runs[sent_runs..], cur)?;
                ship_ns += t.elapsed().as_nanos() as u64;
                (sent_runs, unsent_bytes) = (self.runs.len(), 0);
            }
        }
        // The parts carry the runs before `sent_runs`; `send` ships the rest.
        self.sent_runs = sent_runs;
        self.counters.ship_ns += ship_ns;
        self.counters.diff_ns += t0.elapsed().as_nanos() as u64 - ship_ns;
        Ok(streamed)
    }

    /// Makes the taken transaction the committed state locally and re-arms tracking of
    /// its pages.
    fn finish_commit(&mut self, tx_id: u64) -> Result<(), Error> {
        let t0 = Instant::now();
        if let Some(shadow) = &mut self.shadow {
            let (cur, sh) = (self.region.as_slice(), shadow.as_mut_slice());
            for r in &self.runs {
                let (s, e) = (r.offset as usize, r.offset as usize + r.len as usize);
                sh[s..e].copy_from_slice(&cur[s..e]);
            }
        }
        self.tx_id = tx_id;
        self.in_tx = false;
        let t1 = Instant::now();
        let armed = self.tracker.rearm(&self.dirty);
        self.counters.diff_ns += (t1 - t0).as_nanos() as u64;
        self.counters.collect_ns += t1.elapsed().as_nanos() as u64;
        std::mem::swap(&mut self.last_pages, &mut self.dirty.pages);
        std::mem::swap(&mut self.last_runs, &mut self.runs);
        if let Err(e) = armed {
            self.broken = true;
            return Err(e.into());
        }
        Ok(())
    }

    /// Waits again for the acknowledgement of the in-doubt transaction.
    fn retry_pending(&mut self, mut stats: TxStats) -> Result<TxStats, Error> {
        let Some(r) = &mut self.repl else {
            self.pending = None;
            return Ok(stats);
        };
        let sent = r
            .send(stats.tx_id, &[], self.region.as_slice())
            .and_then(|n| r.wait(stats.tx_id).map(|()| n));
        let n = sent.map_err(|e| self.repl_failed(e))?;
        stats.bytes_shipped = n as usize;
        self.pending = None;
        Ok(stats)
    }

    /// Drops the open transaction and puts back the last committed state.
    pub fn abort(&mut self) -> Result<(), Error> {
        self.usable()?;
        if let Some(p) = &self.pending {
            return Err(Error::AwaitingAck(p.tx_id));
        }
        if !self.in_tx {
            return Err(Error::NoTransaction);
        }
        self.in_tx = false;
        self.counters.aborts += 1;
        if let Err(e) = self.tracker.take(&mut self.dirty) {
            self.broken = true;
            return Err(e.into());
        }
        self.roll_back_taken()
    }

    /// Restores what `self.dirty` lists to the committed state.
    fn roll_back_taken(&mut self) -> Result<(), Error> {
        let shadow = self.shadow.as_ref().map_or(&[][..], |s| s.as_slice());
        self.tracker
            .restore(&self.dirty, self.region.as_mut_slice(), shadow)
            .inspect_err(|_| self.broken = true)?;
        Ok(())
    }

    /// Waits until the backup acknowledged every committed transaction (async mode).
    pub fn flush(&mut self) -> Result<(), Error> {
        if let Some(why) = &self.fenced {
            return Err(Error::Fenced(why.clone()));
        }
        match self.repl.as_mut().map(|r| r.flush()) {
            Some(Err(e)) => Err(self.repl_failed(e)),
            _ => Ok(()),
        }
    }
}

/// A heap's local parts, built before any backup hears of it.
struct Parts {
    tracker: Box<dyn Tracker>,
    shadow: Option<Shadow>,
    region: Region,
    kind: EngineKind,
    reason: String,
}

impl Parts {
    /// Resolves and arms the engine over `region`; `initial` is the committed state when it
    /// is not all zeroes.
    fn new(region: Region, cfg: &HeapConfig, initial: Option<&[u8]>) -> Result<Parts, Error> {
        let (kind, reason) = engine::resolve(cfg.engine)?;
        let shadow = if kind.is_page_level() {
            let mut s = Shadow::zeroed(region.len())?;
            if let Some(init) = initial {
                s.as_mut_slice().copy_from_slice(init);
            }
            Some(s)
        } else {
            None
        };
        // Only a fixed spin makes the uffd handler poll: it has no peer to measure.
        let fault_spin = match cfg.spin {
            Spin::Fixed(d) => d,
            Spin::Off | Spin::Adaptive { .. } => Duration::ZERO,
        };
        let tracker = engine::build(kind, &region, fault_spin)?;
        debug_assert_eq!(tracker.kind(), kind);
        Ok(Parts {
            tracker,
            shadow,
            region,
            kind,
            reason,
        })
    }

    fn into_heap(self, repl: Option<Box<dyn Replicator>>, tx_id: u64) -> Heap {
        Heap {
            tracker: self.tracker,
            repl,
            shadow: self.shadow,
            region: self.region,
            kind: self.kind,
            reason: self.reason,
            in_tx: false,
            broken: false,
            fenced: None,
            pending: None,
            tx_id,
            written_hint: 0,
            dirty: Dirty::default(),
            runs: Vec::new(),
            sent_runs: 0,
            last_pages: Vec::new(),
            last_runs: Vec::new(),
            counters: HeapCounters::default(),
        }
    }
}

/// Connects to the configured backup, if any, for a fresh heap of `len` bytes.
fn connect(cfg: &HeapConfig, len: usize) -> Result<Option<Box<dyn Replicator>>, Error> {
    match &cfg.backup {
        Some(ep) => repl::connect(ep, len as u64, cfg)
            .map(Some)
            .map_err(Error::Replication),
        None => Ok(None),
    }
}

/// Turns the log engine's coalesced (offset, len) ranges into runs no longer than u32::MAX.
fn ranges_to_runs(ranges: &[(usize, usize)], out: &mut Vec<DiffRun>) {
    for &(mut off, mut len) in ranges {
        while len > 0 {
            let n = len.min(u32::MAX as usize);
            out.push(DiffRun {
                offset: off as u64,
                len: n as u32,
            });
            off += n;
            len -= n;
        }
    }
}
