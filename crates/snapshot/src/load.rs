//! Reading a snapshot's RAM image into the host page cache in the order a restore
//! wants. QEMU maps the image private, so a page in the page cache costs the guest
//! only a minor fault on first touch; a page that is not costs a read from the
//! disk. Before the start: the first N working-set pages, sorted by file offset and
//! read in coalesced runs (HotRestore section 5.2); after it, in the background,
//! the rest of the trace in first-access order, then every other data extent in
//! file order.
//!
//! Once the guest runs, its own page faults read from the same disk, and a fault
//! stalls the whole vCPU until its page arrives. The disk serves requests in about
//! the order they come, so the background loader then reads in small pieces
//! (`BG_READ`) with no kernel readahead: a fault waits behind at most one small read
//! per loader, not behind megabytes of them (measured: 8 MiB reads with 16 MiB
//! readahead kept guests on a 40 MB/s disk in uninterruptible sleep for a second at
//! a time).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::check::{CheckError, ChunkChecker};
use crate::trace::{Trace, TracePage};
use crate::PAGE_SIZE;

/// Errors loading images.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("the trace names RAM block {0}, which the snapshot does not have")]
    NoBlock(u16),
    #[error("the trace names page {1} of RAM block {0}, past its end")]
    OutOfRange(u16, u64),
    #[error("{0} is {1} bytes, expected {2}")]
    Size(PathBuf, u64, u64),
    #[error(transparent)]
    Check(#[from] CheckError),
}

/// One RAM block's image.
pub struct ImageFile {
    pub block: u16,
    pub path: PathBuf,
    pub size: u64,
}

/// What the background loader reads after the working set: the API's choice
/// (`rest_order` of a restore request), defined once there.
pub use rebound_api::RestOrder;

/// What a load read: `pages` newly in the cache (data pages only), `bytes` read
/// (with the small gaps read along), in `reads` reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadStats {
    pub pages: u64,
    pub bytes: u64,
    pub reads: u64,
    pub seconds: f64,
}

/// Gaps up to this size between wanted pages are read too: one read instead of two.
const MERGE_GAP: u64 = 64 << 10;
/// Largest single read before the guest runs (nothing else waits for the disk).
const MAX_READ: u64 = 8 << 20;
/// Largest single read while the guest runs: 256 KiB is 6.5 ms at 40 MB/s.
const BG_READ: u64 = 256 << 10;
/// Background batches of trace pages.
const BATCH: usize = 256;

/// A set of pages, one bit each.
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(pages: u64) -> Bitmap {
        Bitmap(vec![0; pages.div_ceil(64) as usize])
    }

    fn get(&self, page: u64) -> bool {
        self.0[(page / 64) as usize] & (1 << (page % 64)) != 0
    }

    /// Sets the bit; false if it was set already.
    fn set(&mut self, page: u64) -> bool {
        let was = self.get(page);
        self.0[(page / 64) as usize] |= 1 << (page % 64);
        !was
    }
}

struct Image {
    block: u16,
    path: PathBuf,
    file: File,
    size: u64,
    /// Data extents (holes are zero pages: nothing to load).
    data: Vec<Range<u64>>,
    /// Pages with data.
    has_data: Bitmap,
    /// Pages read already.
    loaded: Bitmap,
    /// Checks each chunk once all its data pages are loaded, with the data pages
    /// not loaded yet per chunk and the chunks whose last one just was.
    checker: Option<ChunkChecker>,
    pending: Vec<u32>,
    complete: Vec<u64>,
}

impl Image {
    /// Reads `off..end` into `buf` and marks its data pages loaded; returns how
    /// many were new.
    fn read(&mut self, buf: &mut [u8], off: u64, end: u64) -> Result<u64, LoadError> {
        self.file
            .read_exact_at(&mut buf[..(end - off) as usize], off)
            .map_err(|e| LoadError::Read(self.path.clone(), e))?;
        let mut new = 0;
        let per_chunk = self.checker.as_ref().map(|c| c.chunk_bytes() / PAGE_SIZE);
        for p in off / PAGE_SIZE..end / PAGE_SIZE {
            if self.has_data.get(p) && self.loaded.set(p) {
                new += 1;
                if let Some(k) = per_chunk {
                    let c = p / k;
                    self.pending[c as usize] -= 1;
                    if self.pending[c as usize] == 0 {
                        self.complete.push(c);
                    }
                }
            }
        }
        self.check_complete()?;
        Ok(new)
    }

    /// Checks the chunks loaded whole since the last call (their pages are in the
    /// page cache: no disk reads).
    fn check_complete(&mut self) -> Result<(), LoadError> {
        if let Some(c) = self.checker.as_mut() {
            for i in self.complete.drain(..) {
                c.check(i)?;
            }
        }
        Ok(())
    }

    /// Tells the kernel how the next reads go: exactly the pages asked for
    /// (`random`), or ahead of them.
    fn advise(&self, random: bool) {
        let advice = if random {
            libc::POSIX_FADV_RANDOM
        } else {
            libc::POSIX_FADV_SEQUENTIAL
        };
        // SAFETY: posix_fadvise on an fd this image owns; no memory is involved. Advice
        // only: a failure changes nothing but speed.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, advice) };
    }
}

/// Loads the images of one restore.
pub struct Loader {
    images: Vec<Image>,
    trace: Vec<TracePage>,
    /// Trace pages handed out so far.
    next: usize,
    buf: Vec<u8>,
    /// Largest read now: `MAX_READ`, or `BG_READ` once the guest runs.
    max_read: u64,
    /// Data bytes of all images, and those loaded so far (by any call).
    total: u64,
    done: u64,
}

impl Loader {
    /// Opens the images (each must have its size) and checks that the trace names
    /// only their pages.
    /// A loader of a snapshot's one RAM image (block 0), the shape every restore
    /// of a single-block guest takes.
    pub fn one_image(path: &Path, size: u64, trace: Option<Trace>) -> Result<Loader, LoadError> {
        let image = ImageFile {
            block: 0,
            path: path.to_path_buf(),
            size,
        };
        Loader::new(vec![image], trace)
    }

    pub fn new(images: Vec<ImageFile>, trace: Option<Trace>) -> Result<Loader, LoadError> {
        let mut out = Vec::new();
        for i in images {
            let rerr = |e| LoadError::Read(i.path.clone(), e);
            let file = crate::open_nofollow(&i.path).map_err(rerr)?;
            let len = file.metadata().map_err(rerr)?.len();
            if len != i.size {
                return Err(LoadError::Size(i.path.clone(), len, i.size));
            }
            let data = crate::image::data_extents(&file, i.size).map_err(rerr)?;
            let mut has_data = Bitmap::new(i.size / PAGE_SIZE);
            for r in &data {
                for p in r.start / PAGE_SIZE..r.end.div_ceil(PAGE_SIZE) {
                    has_data.set(p);
                }
            }
            out.push(Image {
                block: i.block,
                loaded: Bitmap::new(i.size / PAGE_SIZE),
                has_data,
                path: i.path,
                file,
                size: i.size,
                data,
                checker: None,
                pending: Vec::new(),
                complete: Vec::new(),
            });
        }
        let trace = trace.map(|t| t.pages).unwrap_or_default();
        for p in &trace {
            let img = out
                .iter()
                .find(|i| i.block == p.block)
                .ok_or(LoadError::NoBlock(p.block))?;
            if p.page >= img.size / PAGE_SIZE {
                return Err(LoadError::OutOfRange(p.block, p.page));
            }
        }
        let total = out
            .iter()
            .flat_map(|i| i.data.iter().map(|r| r.end - r.start))
            .sum();
        Ok(Loader {
            images: out,
            trace,
            next: 0,
            buf: vec![0u8; MAX_READ as usize],
            max_read: MAX_READ,
            total,
            done: 0,
        })
    }

    /// Checks the chunks of `block`'s image with `checker` as they are loaded whole
    /// (from now on; chunks loaded already, and those without data, at once).
    pub fn check_with(&mut self, block: u16, checker: ChunkChecker) -> Result<(), LoadError> {
        let k = self
            .images
            .iter()
            .position(|i| i.block == block)
            .ok_or(LoadError::NoBlock(block))?;
        let img = &mut self.images[k];
        let per_chunk = checker.chunk_bytes() / PAGE_SIZE;
        img.pending = vec![0; checker.chunks() as usize];
        for p in 0..img.size / PAGE_SIZE {
            if img.has_data.get(p) && !img.loaded.get(p) {
                img.pending[(p / per_chunk) as usize] += 1;
            }
        }
        img.complete = (0..checker.chunks())
            .filter(|&c| img.pending[c as usize] == 0)
            .collect();
        img.checker = Some(checker);
        img.check_complete()
    }

    /// Chunks checked and chunks in all, over the images checked.
    pub fn chunks_checked(&self) -> (u64, u64) {
        self.images
            .iter()
            .filter_map(|i| i.checker.as_ref())
            .fold((0, 0), |(a, b), c| (a + c.checked(), b + c.chunks()))
    }

    /// Data bytes of all images: what an eager restore reads.
    pub fn data_bytes(&self) -> u64 {
        self.total
    }

    /// Data bytes loaded so far, by any call.
    pub fn loaded_bytes(&self) -> u64 {
        self.done
    }

    /// Trace pages in all.
    pub fn trace_pages(&self) -> usize {
        self.trace.len()
    }

    fn index(&self, block: u16) -> usize {
        self.images
            .iter()
            .position(|i| i.block == block)
            .expect("trace blocks checked in new")
    }

    /// Reads those of `pages` (any order) that have data and are not loaded yet:
    /// per block sorted by offset, runs with gaps up to `MERGE_GAP` in one read.
    fn load_pages(
        &mut self,
        pages: &[TracePage],
        mut rate: Option<&mut Bucket>,
        stop: &AtomicBool,
    ) -> Result<LoadStats, LoadError> {
        let mut st = LoadStats::default();
        let mut want: Vec<TracePage> = pages
            .iter()
            .filter(|p| {
                let img = &self.images[self.index(p.block)];
                img.has_data.get(p.page) && !img.loaded.get(p.page)
            })
            .copied()
            .collect();
        want.sort_unstable();
        want.dedup();
        let mut i = 0;
        while i < want.len() && !stop.load(Ordering::Relaxed) {
            let (block, start) = (want[i].block, want[i].page);
            let mut end = start + 1;
            i += 1;
            while let Some(p) = want.get(i) {
                if p.block != block
                    || (p.page - end) * PAGE_SIZE > MERGE_GAP
                    || (p.page + 1 - start) * PAGE_SIZE > self.max_read
                {
                    break;
                }
                end = p.page + 1;
                i += 1;
            }
            let k = self.index(block);
            let (off, end) = (start * PAGE_SIZE, end * PAGE_SIZE);
            st.pages += self.images[k].read(&mut self.buf, off, end)?;
            st.bytes += end - off;
            st.reads += 1;
            if let Some(b) = rate.as_deref_mut() {
                b.take(end - off, stop);
            }
        }
        self.done += st.pages * PAGE_SIZE;
        Ok(st)
    }

    /// Reads the first `n` trace pages into the page cache before the guest starts:
    /// sorted by offset, runs coalesced, with plain reads, so they are cached when
    /// this returns. Pages that are holes in the image are skipped.
    pub fn load_first(&mut self, n: usize) -> Result<LoadStats, LoadError> {
        let t = Instant::now();
        let n = n.min(self.trace.len());
        let pages: Vec<TracePage> = self.trace[..n].to_vec();
        self.next = n;
        // Readahead would spend the time before the start on pages not asked for.
        self.images.iter().for_each(|i| i.advise(true));
        let mut st = self.load_pages(&pages, None, &AtomicBool::new(false))?;
        st.seconds = t.elapsed().as_secs_f64();
        Ok(st)
    }

    /// Reads every data extent of every image, in file order (eager).
    /// `progress(done, total)` in data bytes.
    pub fn load_all(&mut self, progress: &mut dyn FnMut(u64, u64)) -> Result<LoadStats, LoadError> {
        let t = Instant::now();
        self.next = self.trace.len();
        let mut st = LoadStats::default();
        self.load_files(&AtomicBool::new(false), None, progress, &mut st)?;
        st.seconds = t.elapsed().as_secs_f64();
        Ok(st)
    }

    /// The background part, after the guest started: the rest of the trace in
    /// first-access order (`RestOrder::Fafl`, batches of 256 pages, each sorted and
    /// coalesced), then every data extent not loaded yet in file order. Stops early
    /// when `stop` is set; `rate` caps the bytes read per second;
    /// `progress(done, total)` in data bytes, counting what `load_first` read.
    /// Reads are at most `BG_READ`, without readahead: the guest's faults go first.
    pub fn load_rest(
        &mut self,
        order: RestOrder,
        stop: &AtomicBool,
        rate: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<LoadStats, LoadError> {
        let t = Instant::now();
        let mut bucket = rate.map(Bucket::new);
        let mut st = LoadStats::default();
        self.max_read = BG_READ;
        self.images.iter().for_each(|i| i.advise(true));
        if order == RestOrder::Fafl {
            while self.next < self.trace.len() && !stop.load(Ordering::Relaxed) {
                let end = (self.next + BATCH).min(self.trace.len());
                let batch = self.trace[self.next..end].to_vec();
                self.next = end;
                st.add(&self.load_pages(&batch, bucket.as_mut(), stop)?);
                progress(self.done, self.total);
            }
        }
        if !stop.load(Ordering::Relaxed) {
            self.load_files(stop, bucket.as_mut(), progress, &mut st)?;
        }
        st.seconds = t.elapsed().as_secs_f64();
        Ok(st)
    }

    /// Every data extent not loaded yet, in file order.
    fn load_files(
        &mut self,
        stop: &AtomicBool,
        mut rate: Option<&mut Bucket>,
        progress: &mut dyn FnMut(u64, u64),
        st: &mut LoadStats,
    ) -> Result<(), LoadError> {
        for k in 0..self.images.len() {
            // Readahead helps an eager load; while the guest runs it would queue
            // megabytes ahead of the guest's own faults.
            self.images[k].advise(self.max_read < MAX_READ);
            for r in self.images[k].data.clone() {
                let mut at = r.start;
                while at < r.end {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    let img = &mut self.images[k];
                    // Skip pages loaded already; read the next run of unloaded ones.
                    if img.loaded.get(at / PAGE_SIZE) {
                        at += PAGE_SIZE;
                        continue;
                    }
                    let mut end = at + PAGE_SIZE;
                    while end < r.end
                        && end - at < self.max_read
                        && !img.loaded.get(end / PAGE_SIZE)
                    {
                        end += PAGE_SIZE;
                    }
                    let end = end.min(r.end);
                    let new = img.read(&mut self.buf, at, end)?;
                    self.done += new * PAGE_SIZE;
                    st.add(&LoadStats {
                        pages: new,
                        bytes: end - at,
                        reads: 1,
                        seconds: 0.0,
                    });
                    if let Some(b) = rate.as_deref_mut() {
                        b.take(end - at, stop);
                    }
                    progress(self.done, self.total);
                    at = end;
                }
            }
        }
        Ok(())
    }
}

impl LoadStats {
    fn add(&mut self, o: &LoadStats) {
        self.pages += o.pages;
        self.bytes += o.bytes;
        self.reads += o.reads;
    }
}

/// A token bucket: `take` sleeps so that bytes stay under the rate.
struct Bucket {
    rate: u64,
    start: Instant,
    taken: u64,
}

impl Bucket {
    fn new(rate: u64) -> Bucket {
        Bucket {
            rate: rate.max(1),
            start: Instant::now(),
            taken: 0,
        }
    }

    /// Counts `bytes` and sleeps until they are due, in short naps so that a stop
    /// is not kept waiting.
    fn take(&mut self, bytes: u64, stop: &AtomicBool) {
        self.taken += bytes;
        let due = Duration::from_secs_f64(self.taken as f64 / self.rate as f64);
        while let Some(wait) = due.checked_sub(self.start.elapsed()) {
            if stop.load(Ordering::Relaxed) || wait.is_zero() {
                return;
            }
            std::thread::sleep(wait.min(Duration::from_millis(20)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cachestat(2)` (Linux 6.5), which libc does not declare for x86_64.
    #[repr(C)]
    struct CachestatRange {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Cachestat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;

    /// Which pages of `path` were brought into the page cache: resident now, or
    /// evicted since by the kernel's reclaim. Reclaim leaves a shadow entry where
    /// it drops a page (`nr_evicted`); nothing else puts one there, as the images
    /// are written without the cache. Residency alone raced with reclaim: a loaded
    /// page evicted before `mincore` looked. On a kernel without `cachestat` only
    /// resident pages count (the stricter check).
    fn resident(path: &std::path::Path) -> Vec<bool> {
        let mut r = crate::image::resident_pages(path).unwrap();
        let f = File::open(path).unwrap();
        for (p, cached) in r.iter_mut().enumerate().filter(|(_, c)| !**c) {
            let range = CachestatRange {
                off: p as u64 * PAGE_SIZE,
                len: PAGE_SIZE,
            };
            let mut cs = Cachestat::default();
            // SAFETY: cachestat reads `range` and writes one `struct cachestat` into
            // `cs`; both are live locals with the kernel's layout (repr(C), five and
            // two u64s); the fd is open for the call.
            let ret = unsafe {
                libc::syscall(
                    SYS_CACHESTAT,
                    f.as_raw_fd(),
                    &range as *const CachestatRange,
                    &mut cs as *mut Cachestat,
                    0u32,
                )
            };
            if ret != 0 {
                let e = io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "cachestat: {e}");
                break;
            }
            *cached = cs.nr_evicted > 0;
        }
        r
    }

    fn tp(block: u16, page: u64) -> TracePage {
        TracePage { block, page }
    }

    /// An image on disk (not tmpfs, where every page counts as cached) with 16
    /// bytes of data in each page except the holes, never in the page cache: written
    /// with `O_DIRECT`, so no page of it is cached or was evicted (`resident` tells
    /// the two apart only for pages the test's loads read).
    fn image(dir: &std::path::Path, name: &str, pages: u64, holes: Range<u64>) -> ImageFile {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join(name);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        f.set_len(pages * PAGE_SIZE).unwrap();
        // O_DIRECT wants a page-aligned buffer: take an aligned slice of a bigger one.
        let run = 1024u64;
        let mut v = vec![0u8; ((run + 1) * PAGE_SIZE) as usize];
        let at = v.as_ptr().align_offset(PAGE_SIZE as usize);
        let buf = &mut v[at..at + (run * PAGE_SIZE) as usize];
        for p in (0..run as usize).map(|p| p * PAGE_SIZE as usize) {
            buf[p..p + 16].fill(1);
        }
        let mut p = 0;
        while p < pages {
            if holes.contains(&p) {
                p = holes.end;
                continue;
            }
            let end = (p + run).min(pages);
            let end = if p < holes.start {
                end.min(holes.start)
            } else {
                end
            };
            let n = ((end - p) * PAGE_SIZE) as usize;
            f.write_all_at(&buf[..n], p * PAGE_SIZE).unwrap();
            p = end;
        }
        drop(f);
        assert!(resident(&path).iter().all(|&c| !c), "{name} starts cached");
        ImageFile {
            block: 0,
            path,
            size: pages * PAGE_SIZE,
        }
    }

    #[test]
    fn the_first_trace_pages_are_cached_before_the_start_and_far_ones_are_not() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let pages = 8192; // 32 MiB
                          // Pages 6000..6100 are a hole: a trace page there has nothing to load.
        let img = image(d.path(), "ram.img", pages, 6000..6100);
        let path = img.path.clone();
        let trace = Trace {
            pages: vec![
                tp(0, 5000),
                tp(0, 12),
                tp(0, 6050),
                tp(0, 4000),
                tp(0, 13),
                tp(0, 7000),
            ],
        };
        let mut l = Loader::new(vec![img], Some(trace)).unwrap();
        assert_eq!(l.data_bytes(), (pages - 100) * PAGE_SIZE);
        let st = l.load_first(5).unwrap();
        assert_eq!(
            (st.pages, st.reads, st.bytes),
            (4, 3, 4 * PAGE_SIZE),
            "12 and 13 in one read"
        );
        let r = resident(&path);
        for p in [5000, 12, 4000, 13] {
            assert!(r[p], "page {p} not loaded");
        }
        assert!(!r[7000], "the sixth trace page was loaded early");
        assert!(!r[2000], "a page far from the trace is cached");
        let cached = r.iter().filter(|&&b| b).count();
        assert!(cached < 64, "{cached} pages cached for 4 asked");

        // The rest: the last trace page first, then everything, progress to the end.
        let stop = AtomicBool::new(false);
        let mut seen = Vec::new();
        let st = l
            .load_rest(RestOrder::Fafl, &stop, None, &mut |d, t| seen.push((d, t)))
            .unwrap();
        assert_eq!(st.pages, pages - 100 - 4);
        assert_eq!(
            seen[0],
            (5 * PAGE_SIZE, l.data_bytes()),
            "the trace page first"
        );
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(*seen.last().unwrap(), (l.data_bytes(), l.data_bytes()));
        let r = resident(&path);
        assert!((0..pages as usize)
            .filter(|p| !(6000..6100).contains(p))
            .all(|p| r[p]));
    }

    #[test]
    fn file_order_eager_rate_limits_and_stops() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        let pages = 8192;
        let mk = |name: &str| {
            let mut i = image(d.path(), name, pages, 0..0);
            i.block = 3;
            i
        };
        let trace = Trace {
            pages: vec![tp(3, 100), tp(3, 8000)],
        };
        // FileOrder: the trace after the working set is not read first; stopped
        // after its first read, the file's start is cached and page 8000 is not.
        let mut l = Loader::new(vec![mk("a.img")], Some(trace.clone())).unwrap();
        l.load_first(1).unwrap();
        let stop = AtomicBool::new(false);
        let st = l
            .load_rest(RestOrder::FileOrder, &stop, None, &mut |_, _| {
                stop.store(true, Ordering::Relaxed)
            })
            .unwrap();
        assert_eq!(st.reads, 1);
        let r = resident(&d.path().join("a.img"));
        assert!(r[0] && r[100] && !r[8000]);

        // Eager: everything, in big reads.
        let mut l = Loader::new(vec![mk("b.img")], None).unwrap();
        let st = l.load_all(&mut |_, _| {}).unwrap();
        assert_eq!((st.pages, st.reads), (pages, 4));
        assert!(resident(&d.path().join("b.img")).iter().all(|&b| b));

        // A rate limit holds: 32 MiB at 64 MiB/s takes half a second.
        let mut l = Loader::new(vec![mk("c.img")], None).unwrap();
        let t = Instant::now();
        let st = l
            .load_rest(
                RestOrder::Fafl,
                &AtomicBool::new(false),
                Some(64 << 20),
                &mut |_, _| {},
            )
            .unwrap();
        assert_eq!(st.bytes, 32 << 20);
        // Once the guest runs, in small reads (eager above: 8 MiB each), so that a
        // guest's page fault never queues behind megabytes of them.
        assert_eq!(st.reads, (32 << 20) / BG_READ);
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );

        // A stop is honoured at once.
        let mut l = Loader::new(vec![mk("d.img")], Some(trace)).unwrap();
        let stop = AtomicBool::new(true);
        assert_eq!(
            l.load_rest(RestOrder::Fafl, &stop, None, &mut |_, _| {})
                .unwrap()
                .pages,
            0
        );

        // A trace naming other blocks or pages past the image is refused.
        let e = |t: Vec<TracePage>| {
            Loader::new(vec![mk("e.img")], Some(Trace { pages: t }))
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            e(vec![tp(0, 1)]),
            "the trace names RAM block 0, which the snapshot does not have"
        );
        assert_eq!(
            e(vec![tp(3, pages)]),
            "the trace names page 8192 of RAM block 3, past its end"
        );
        // An image of the wrong size is refused.
        let mut i = mk("f.img");
        i.size += PAGE_SIZE;
        assert!(Loader::new(vec![i], None).is_err());
    }

    /// The chunk checksums (`chunk` bytes each) of a file as it is now.
    fn sums(path: &std::path::Path, chunk: usize) -> Vec<String> {
        std::fs::read(path)
            .unwrap()
            .chunks(chunk)
            .map(|c| crate::image::hex(xxhash_rust::xxh3::xxh3_64(c)))
            .collect()
    }

    #[test]
    fn chunks_are_checked_as_they_are_loaded_whole_and_a_damaged_one_stops_the_load() {
        let d = tempfile::tempdir_in("/var/tmp").unwrap();
        // 64 pages in chunks of 16; pages 16..32 are a hole (chunk 1 has no data).
        let img = image(d.path(), "ram.img", 64, 16..32);
        let path = img.path.clone();
        let chunk = 16 * PAGE_SIZE;
        let good = sums(&path, chunk as usize);
        let checker =
            |sums: &[String]| ChunkChecker::new(&path, 64 * PAGE_SIZE, chunk, sums).unwrap();
        let trace = Trace {
            pages: (0..16).map(|p| tp(0, p)).chain([tp(0, 40)]).collect(),
        };
        let mut l = Loader::new(vec![img], Some(trace.clone())).unwrap();
        l.check_with(0, checker(&good)).unwrap();
        // The hole chunk is checked at once, without a read.
        assert_eq!(l.chunks_checked(), (1, 4));
        l.load_first(17).unwrap();
        // Chunk 0 is loaded whole; chunk 2 only in part.
        assert_eq!(l.chunks_checked(), (2, 4));
        l.load_rest(
            RestOrder::Fafl,
            &AtomicBool::new(false),
            None,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(l.chunks_checked(), (4, 4));

        // One flipped byte in chunk 3: the load stops there, naming it.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[7], 50 * PAGE_SIZE + 3).unwrap();
        let img = ImageFile {
            block: 0,
            path: path.clone(),
            size: 64 * PAGE_SIZE,
        };
        let mut l = Loader::new(vec![img], Some(trace)).unwrap();
        l.check_with(0, checker(&good)).unwrap();
        l.load_first(17).unwrap();
        let e = l
            .load_rest(
                RestOrder::Fafl,
                &AtomicBool::new(false),
                None,
                &mut |_, _| {},
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("checksum mismatch in chunk 3 (bytes 196608..262144)"),
            "{e}"
        );
        // A hole chunk whose checksum says it held data fails before any load.
        let mut lying = good.clone();
        lying[1] = good[0].clone();
        let img = ImageFile {
            block: 0,
            path: path.clone(),
            size: 64 * PAGE_SIZE,
        };
        let mut l = Loader::new(vec![img], None).unwrap();
        assert!(l.check_with(0, checker(&lying)).is_err());
    }
}
