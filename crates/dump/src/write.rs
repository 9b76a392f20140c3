//! The dump writer: guest RAM in chunks, read and compressed on worker
//! threads, written in GPA order, flushed in batches, each chunk reported
//! durable after the flush that covers it.
//!
//! The file is `<out>.partial` (created 0600) until every byte is written
//! and flushed; then it is renamed to `<out>` and the directory flushed. A
//! dump that stops (no space, a read error, the process killed) stays
//! `.partial`, and everything reported durable is in it: [`crate::inspect`]
//! says which guest ranges it holds.

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rebound_guestmem::{GuestMemory, PageSource, VmcoreInfo, VmcoreinfoError};

use crate::elf::{self, Phdr, PT_LOAD, PT_NOTE};
use crate::filter::PageFilter;
use crate::kdump::{self, PageDesc, PAGE_DESC_SIZE};
use crate::notes::Note;
use crate::PAGE_SIZE;

/// Runs of fewer excluded pages than this stay inside an ELF segment (read as
/// zeros) instead of starting a new one: makedumpfile's `PFN_EXCLUDED`.
const PFN_EXCLUDED: u64 = 256;
/// The most program headers an ELF dump gets (no `PN_XNUM` extension).
const MAX_PHNUM: usize = 0xfffe;

/// Errors writing a dump.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The options cannot work.
    #[error("bad dump options: {0}")]
    Options(String),
    /// LZ4 was asked for.
    #[error("lz4 is not a kdump page compression: crash 8.0.2 and makedumpfile 1.7.2 read only zlib, lzo, snappy and zstd pages")]
    Lz4,
    /// The guest's RAM layout cannot be dumped as asked.
    #[error("cannot plan the dump: {0}")]
    Plan(String),
    /// The VMCOREINFO text does not parse.
    #[error("the VMCOREINFO text is not usable")]
    Vmcoreinfo(#[from] VmcoreinfoError),
    /// The output file could not be created.
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The dump stopped before the end; the partial file keeps what was written.
    #[error("dump stopped: {partial} holds {durable:#x} of {total:#x} bytes of guest RAM durably; missing: {missing}")]
    Stopped {
        partial: PathBuf,
        durable: u64,
        total: u64,
        missing: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Page compression of a kdump-compressed dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compress {
    /// Pages stored raw.
    None,
    /// zlib streams (`makedumpfile -c`), read by makedumpfile and crash.
    Zlib,
    /// zstd frames (`makedumpfile -z`), read by crash 8.0.2 as Debian builds it.
    Zstd,
    /// LZO1X-1 blocks (`makedumpfile -l`), read by makedumpfile and crash.
    Lzo,
    /// Refused: no reader supports LZ4 pages.
    Lz4,
}

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// ELF64 core file (like `/proc/vmcore`).
    Elf,
    /// kdump-compressed (diskdump) file.
    Kdump { compress: Compress },
}

impl Format {
    /// `Format::Kdump { compress }`.
    pub const fn kdump(compress: Compress) -> Format {
        Format::Kdump { compress }
    }
}

/// How to write a dump.
#[derive(Debug, Clone)]
pub struct DumpOptions {
    pub format: Format,
    /// Bytes of guest RAM per chunk (a multiple of 4 KiB); the unit of
    /// parallel work and of durability reports. Default 128 MiB.
    pub chunk_bytes: u64,
    /// Worker threads reading and compressing. Default: available cores.
    pub threads: usize,
    /// Chunks per flush (`fdatasync`). Default 1.
    pub batch_fsync: usize,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            format: Format::Elf,
            chunk_bytes: 128 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            batch_fsync: 1,
        }
    }
}

/// Told how the dump advances. Both methods run on the caller's thread.
pub trait Progress {
    /// After each chunk is written: guest RAM bytes covered so far, file
    /// bytes written so far.
    fn advanced(&mut self, _covered: u64, _written: u64) {}

    /// After a flush: `gpa` is in the file durably; its RAM may be released.
    fn durable(&mut self, _gpa: Range<u64>) {}
}

/// No progress reports.
impl Progress for () {}

/// What a finished dump holds.
#[derive(Debug, Clone)]
pub struct DumpReport {
    /// The complete dump.
    pub path: PathBuf,
    pub format: Format,
    /// Guest RAM bytes covered (all RAM ranges).
    pub ram_bytes: u64,
    /// Pages in the dump (filter kept them), zero ones included.
    pub pages_dumped: u64,
    /// Pages the filter left out.
    pub pages_excluded: u64,
    /// Dumped pages that were all zeros (not stored: a file hole in ELF, the
    /// shared zero page in kdump).
    pub zero_pages: u64,
    /// The file's size.
    pub file_bytes: u64,
    /// Whether a VMCOREINFO note is in the dump.
    pub vmcoreinfo: bool,
    /// Whether a page filter was applied.
    pub filtered: bool,
    /// `NT_PRSTATUS` notes written.
    pub cpus: usize,
    /// Things a user should know (e.g. no VMCOREINFO, so no filtering).
    pub warnings: Vec<String>,
    pub elapsed: Duration,
}

/// A dump of one guest's RAM: what goes in it.
pub struct Dumper<'a, S: PageSource> {
    mem: &'a GuestMemory<S>,
    vmcoreinfo: Option<&'a str>,
    notes: &'a [Note],
    filter: Option<&'a dyn PageFilter>,
}

// Every backing of guest RAM can be dumped: workers read it from several threads.
const _: fn() = || {
    fn dumpable<S: PageSource + Sync>() {}
    dumpable::<rebound_guestmem::FileSource>();
    dumpable::<rebound_guestmem::ProcMemSource>();
    dumpable::<Box<dyn PageSource + Sync>>();
};

/// A chunk of guest RAM: the unit of work and of durability.
struct Chunk {
    gpa: Range<u64>,
    /// kdump: index of the first dumped page's descriptor.
    first_desc: u64,
    /// Pages of the chunk the dump holds.
    pages: u64,
    /// ELF: file length that covers this chunk's data.
    file_end: u64,
}

/// ELF: one PT_LOAD.
#[derive(Debug, Clone, Copy)]
struct Seg {
    paddr: u64,
    filesz: u64,
    memsz: u64,
    offset: u64,
}

struct Plan {
    ranges: Vec<Range<u64>>,
    keep: Vec<u64>,
    data: Vec<Range<u64>>,
    chunks: Vec<Chunk>,
    kept: u64,
    segs: Vec<Seg>,
}

impl Plan {
    fn kept(&self, pfn: u64) -> bool {
        self.keep[(pfn / 64) as usize] & (1 << (pfn % 64)) != 0
    }

    fn has_data(&self, gpa: u64) -> bool {
        let i = self.data.partition_point(|r| r.end <= gpa);
        self.data.get(i).is_some_and(|r| r.contains(&gpa))
    }

    /// ELF file offset of a GPA inside a segment's file part.
    fn elf_offset(&self, gpa: u64) -> Option<u64> {
        let i = self.segs.partition_point(|s| s.paddr + s.memsz <= gpa);
        let s = self.segs.get(i)?;
        (gpa >= s.paddr && gpa < s.paddr + s.filesz).then(|| s.offset + gpa - s.paddr)
    }
}

/// Pages of a chunk read from guest RAM: runs of dumped pages with data.
struct Piece {
    gpa: u64,
    buf: Vec<u8>,
    /// Page index ranges in `buf` that are not all zeros.
    nonzero: Vec<Range<usize>>,
}

impl Piece {
    fn new(gpa: u64, buf: Vec<u8>) -> Piece {
        let page = PAGE_SIZE as usize;
        let mut nonzero: Vec<Range<usize>> = Vec::new();
        for (i, p) in buf.chunks(page).enumerate() {
            if is_zero(p) {
                continue;
            }
            match nonzero.last_mut() {
                Some(r) if r.end == i => r.end = i + 1,
                _ => nonzero.push(i..i + 1),
            }
        }
        Piece { gpa, buf, nonzero }
    }

    fn nonzero_pages(&self) -> usize {
        self.nonzero.iter().map(|r| r.end - r.start).sum()
    }
}

/// A worker's result for one chunk.
type WorkResult = Result<ChunkOut, Box<dyn std::error::Error + Send + Sync>>;

/// What a worker hands the writer for one chunk.
enum ChunkOut {
    Elf(Vec<Piece>),
    /// kdump: per dumped page, `None` for a zero page or the stored length
    /// and flags; the stored bytes concatenated.
    Kdump {
        pages: Vec<Option<(u32, u32)>>,
        data: Vec<u8>,
    },
}

fn is_zero(page: &[u8]) -> bool {
    page.chunks(64)
        .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

/// Appends `.partial` to the file name.
pub fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

/// One page compressor per worker.
enum Compressor {
    None,
    Zlib(flate2::Compress),
    Zstd(zstd::bulk::Compressor<'static>),
    Lzo,
}

impl Compressor {
    fn new(c: Compress) -> Result<Compressor, std::io::Error> {
        Ok(match c {
            Compress::None | Compress::Lz4 => Compressor::None,
            // Level 1, as makedumpfile (compress2 Z_BEST_SPEED, ZSTD_compressCCtx level 1).
            Compress::Zlib => {
                Compressor::Zlib(flate2::Compress::new(flate2::Compression::fast(), true))
            }
            Compress::Zstd => Compressor::Zstd(zstd::bulk::Compressor::new(1)?),
            // LZO1X-1 with 14-bit dictionary hashing, as liblzo's lzo1x_1_compress.
            Compress::Lzo => Compressor::Lzo,
        })
    }

    /// Appends `page` to `out` compressed if that makes it smaller, else raw;
    /// returns (stored length, descriptor flags).
    fn page(&mut self, page: &[u8], out: &mut Vec<u8>) -> Result<(u32, u32), std::io::Error> {
        let start = out.len();
        out.resize(start + page.len() - 1, 0);
        let got = match self {
            Compressor::None => None,
            Compressor::Zlib(z) => {
                z.reset();
                match z.compress(page, &mut out[start..], flate2::FlushCompress::Finish) {
                    Ok(flate2::Status::StreamEnd) => {
                        Some((z.total_out() as usize, kdump::DUMP_DH_COMPRESSED_ZLIB))
                    }
                    _ => None,
                }
            }
            Compressor::Zstd(z) => z
                .compress_to_buffer(page, &mut out[start..])
                .ok()
                .map(|n| (n, kdump::DUMP_DH_COMPRESSED_ZSTD)),
            Compressor::Lzo => {
                let c = lzo1x::compress(page, lzo1x::CompressLevel::new(3));
                out.get_mut(start..start + c.len()).map(|dst| {
                    dst.copy_from_slice(&c);
                    (c.len(), kdump::DUMP_DH_COMPRESSED_LZO)
                })
            }
        };
        match got {
            Some((n, flags)) => {
                out.truncate(start + n);
                Ok((n as u32, flags))
            }
            None => {
                out.truncate(start);
                out.extend_from_slice(page);
                Ok((page.len() as u32, 0))
            }
        }
    }
}

impl<'a, S: PageSource + Sync> Dumper<'a, S> {
    /// A dump of all of `mem`'s RAM ranges, no notes, no filter.
    pub fn new(mem: &'a GuestMemory<S>) -> Self {
        Dumper {
            mem,
            vmcoreinfo: None,
            notes: &[],
            filter: None,
        }
    }

    /// The guest kernel's VMCOREINFO text (as in its note). Without it the
    /// dump is written unfiltered and the report says so.
    pub fn vmcoreinfo(mut self, text: &'a str) -> Self {
        self.vmcoreinfo = Some(text);
        self
    }

    /// Register notes (e.g. from [`crate::notes_from_qemu_elf`]), written
    /// before VMCOREINFO.
    pub fn notes(mut self, notes: &'a [Note]) -> Self {
        self.notes = notes;
        self
    }

    /// Leaves out the pages `filter` rejects (needs VMCOREINFO).
    pub fn filter(mut self, filter: &'a dyn PageFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    fn plan(&self, opts: &DumpOptions, filter: Option<&dyn PageFilter>) -> Result<Plan, DumpError> {
        let ranges: Vec<Range<u64>> = self.mem.layout().ranges().map(|r| r.gpa_range()).collect();
        let ranges: Vec<Range<u64>> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
        for r in &ranges {
            if r.start % PAGE_SIZE != 0 || r.end % PAGE_SIZE != 0 {
                return Err(DumpError::Plan(format!(
                    "guest RAM range {:#x}..{:#x} is not page-aligned",
                    r.start, r.end
                )));
            }
        }
        let max_pfn = ranges.last().map_or(0, |r| r.end / PAGE_SIZE);
        let mut keep = vec![0u64; max_pfn.div_ceil(64) as usize];
        let mut kept = 0;
        for r in &ranges {
            for pfn in r.start / PAGE_SIZE..r.end / PAGE_SIZE {
                if filter.is_none_or(|f| f.keep(pfn * PAGE_SIZE)) {
                    keep[(pfn / 64) as usize] |= 1 << (pfn % 64);
                    kept += 1;
                }
            }
        }
        let data = self
            .mem
            .data_ranges()
            .map_err(|e| DumpError::Plan(error_chain(&e)))?;
        let mut plan = Plan {
            ranges,
            keep,
            data,
            chunks: Vec::new(),
            kept,
            segs: Vec::new(),
        };
        if opts.format == Format::Elf {
            plan.segs = elf_segments(&plan);
            if plan.segs.len() + 1 > MAX_PHNUM {
                return Err(DumpError::Plan(format!(
                    "the filter leaves {} separate pieces of RAM, more than an ELF file's {MAX_PHNUM} program headers; write a kdump dump instead",
                    plan.segs.len()
                )));
            }
        }
        let mut desc = 0;
        let mut chunks = Vec::new();
        for r in &plan.ranges {
            let mut at = r.start;
            while at < r.end {
                let end = ((at / opts.chunk_bytes + 1) * opts.chunk_bytes).min(r.end);
                let pages = (at / PAGE_SIZE..end / PAGE_SIZE)
                    .filter(|&p| plan.kept(p))
                    .count();
                chunks.push(Chunk {
                    gpa: at..end,
                    first_desc: desc,
                    pages: pages as u64,
                    file_end: 0,
                });
                desc += pages as u64;
                at = end;
            }
        }
        plan.chunks = chunks;
        Ok(plan)
    }

    /// Writes the dump to `out` (through `out.partial`), reporting to `progress`.
    pub fn write(
        &self,
        out: &Path,
        opts: &DumpOptions,
        progress: &mut dyn Progress,
    ) -> Result<DumpReport, DumpError> {
        let t0 = Instant::now();
        check_options(opts)?;
        let mut warnings = Vec::new();
        let info = self
            .vmcoreinfo
            .map(|t| VmcoreInfo::parse(t.as_bytes()))
            .transpose()?;
        if let Some(i) = &info {
            if i.page_size != PAGE_SIZE {
                return Err(DumpError::Plan(format!(
                    "the guest's page size is {}, only {PAGE_SIZE} is supported",
                    i.page_size
                )));
            }
        }
        let filter = match (self.filter, &info) {
            (Some(f), Some(_)) => Some(f),
            (Some(_), None) => {
                warnings.push(
                    "no VMCOREINFO: the page filter was not applied, the dump is unfiltered".into(),
                );
                None
            }
            (None, _) => None,
        };
        if info.is_none() {
            warnings.push(
                "no VMCOREINFO note: makedumpfile cannot read this dump and crash needs the guest's vmlinux".into(),
            );
        }
        let mut plan = self.plan(opts, filter)?;
        let mut notes: Vec<Note> = self
            .notes
            .iter()
            .filter(|n| !n.is_vmcoreinfo())
            .cloned()
            .collect();
        if let Some(text) = self.vmcoreinfo {
            notes.push(Note::vmcoreinfo(text));
        }
        let cpus = notes.iter().filter(|n| n.is_prstatus()).count();
        if cpus == 0 {
            warnings.push("no NT_PRSTATUS notes: the dump has no CPU registers".into());
        }

        let partial = partial_path(out);
        match std::fs::remove_file(&partial) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(DumpError::Create {
                    path: partial,
                    source: e,
                })
            }
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .map_err(|source| DumpError::Create {
                path: partial.clone(),
                source,
            })?;
        let total: u64 = plan.ranges.iter().map(|r| r.end - r.start).sum();
        let mut run = Run {
            file: &file,
            partial: &partial,
            total,
            durable: Vec::new(),
            zero_pages: 0,
            written: 0,
            desc_at: 0,
            zero_page: 0,
            cursor: 0,
        };
        let header = match opts.format {
            Format::Elf => run.elf_header(&mut plan, &notes),
            Format::Kdump { compress } => {
                run.kdump_header(&plan, &notes, info.as_ref(), compress, filter, cpus, true)
            }
        };
        header.map_err(|e| run.stopped(e.into()))?;
        self.pipeline(&plan, opts, &mut run, progress)?;
        // Finish: the complete header, every byte flushed, then the name.
        let mut finish = || -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            match opts.format {
                Format::Elf => {
                    let end = plan
                        .segs
                        .iter()
                        .map(|s| s.offset + s.filesz)
                        .max()
                        .unwrap_or(0);
                    if end > file.metadata()?.len() {
                        file.set_len(end)?;
                    }
                }
                Format::Kdump { compress } => {
                    run.kdump_header(&plan, &notes, info.as_ref(), compress, filter, cpus, false)?
                }
            }
            file.sync_all()?;
            std::fs::rename(&partial, out)?;
            let dir = match out.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            File::open(dir)?.sync_all()?;
            Ok(())
        };
        finish().map_err(|e| run.stopped(e))?;
        Ok(DumpReport {
            path: out.to_path_buf(),
            format: opts.format,
            ram_bytes: total,
            pages_dumped: plan.kept,
            pages_excluded: total / PAGE_SIZE - plan.kept,
            zero_pages: run.zero_pages,
            file_bytes: file.metadata().map(|m| m.len()).unwrap_or(0),
            vmcoreinfo: info.is_some(),
            filtered: filter.is_some(),
            cpus,
            warnings,
            elapsed: t0.elapsed(),
        })
    }

    /// Reads one chunk: runs of dumped pages that hold data, one read each.
    fn read_chunk(
        &self,
        plan: &Plan,
        c: &Chunk,
    ) -> Result<Vec<Piece>, rebound_guestmem::MemoryError> {
        let mut pieces = Vec::new();
        let mut pfn = c.gpa.start / PAGE_SIZE;
        let end = c.gpa.end / PAGE_SIZE;
        while pfn < end {
            let wanted = |p: u64| plan.kept(p) && plan.has_data(p * PAGE_SIZE);
            if !wanted(pfn) {
                pfn += 1;
                continue;
            }
            let first = pfn;
            while pfn < end && wanted(pfn) {
                pfn += 1;
            }
            let buf = self
                .mem
                .read_vec(first * PAGE_SIZE, ((pfn - first) * PAGE_SIZE) as usize)?;
            pieces.push(Piece::new(first * PAGE_SIZE, buf));
        }
        Ok(pieces)
    }

    fn work(
        &self,
        plan: &Plan,
        c: &Chunk,
        comp: &mut Option<Compressor>,
    ) -> Result<ChunkOut, Box<dyn std::error::Error + Send + Sync>> {
        let pieces = self.read_chunk(plan, c)?;
        let Some(comp) = comp else {
            return Ok(ChunkOut::Elf(pieces));
        };
        let mut pages = Vec::new();
        let mut data = Vec::new();
        let mut next = pieces.iter().peekable();
        for pfn in c.gpa.start / PAGE_SIZE..c.gpa.end / PAGE_SIZE {
            if !plan.kept(pfn) {
                continue;
            }
            let gpa = pfn * PAGE_SIZE;
            while next
                .peek()
                .is_some_and(|p| p.gpa + p.buf.len() as u64 <= gpa)
            {
                next.next();
            }
            let page = next.peek().filter(|p| p.gpa <= gpa).map(|p| {
                let at = (gpa - p.gpa) as usize;
                &p.buf[at..at + PAGE_SIZE as usize]
            });
            match page {
                Some(page) if !is_zero(page) => pages.push(Some(comp.page(page, &mut data)?)),
                _ => pages.push(None),
            }
        }
        Ok(ChunkOut::Kdump { pages, data })
    }

    fn pipeline(
        &self,
        plan: &Plan,
        opts: &DumpOptions,
        run: &mut Run<'_>,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        let n = plan.chunks.len();
        let threads = opts.threads.max(1);
        let window = 2 * threads;
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let done = (Mutex::new(0usize), Condvar::new());
        let (tx, rx) = mpsc::sync_channel(window);
        let mut comps = Vec::new();
        for _ in 0..threads {
            comps.push(match opts.format {
                Format::Elf => None,
                Format::Kdump { compress } => {
                    Some(Compressor::new(compress).map_err(|e| run.stopped(e.into()))?)
                }
            });
        }
        std::thread::scope(|s| -> Result<(), DumpError> {
            for mut comp in comps {
                let tx = tx.clone();
                let (next, stop, done) = (&next, &stop, &done);
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || stop.load(Ordering::Relaxed) {
                            return;
                        }
                        // Stay within `window` chunks of the writer.
                        let mut w = done.0.lock().unwrap_or_else(|e| e.into_inner());
                        while i >= *w + window && !stop.load(Ordering::Relaxed) {
                            w = done.1.wait(w).unwrap_or_else(|e| e.into_inner());
                        }
                        drop(w);
                        let out = self.work(plan, &plan.chunks[i], &mut comp);
                        if tx.send((i, out)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            // The flusher: fdatasync of one batch while the next is written.
            let (to_flush, flush_rx) = mpsc::channel::<Vec<Range<u64>>>();
            let (flushed_tx, flushed) = mpsc::channel();
            let file = run.file;
            s.spawn(move || {
                for batch in flush_rx {
                    let r = file.sync_data().map(|_| batch);
                    if flushed_tx.send(r).is_err() {
                        return;
                    }
                }
            });
            let flusher = Flusher {
                to_flush,
                flushed,
                outstanding: 0,
            };
            let result = run.write_in_order(plan, opts, &rx, &done, flusher, progress);
            if result.is_err() {
                // Under the lock, so no worker misses the wake-up.
                let _w = done.0.lock().unwrap_or_else(|e| e.into_inner());
                stop.store(true, Ordering::Relaxed);
                done.1.notify_all();
            }
            drop(rx);
            result
        })
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(&format!(": {x}"));
        src = x.source();
    }
    s
}

fn check_options(opts: &DumpOptions) -> Result<(), DumpError> {
    if let Format::Kdump {
        compress: Compress::Lz4,
    } = opts.format
    {
        return Err(DumpError::Lz4);
    }
    if opts.chunk_bytes == 0 || !opts.chunk_bytes.is_multiple_of(PAGE_SIZE) {
        return Err(DumpError::Options(format!(
            "chunk_bytes {} is not a positive multiple of {PAGE_SIZE}",
            opts.chunk_bytes
        )));
    }
    if opts.batch_fsync == 0 {
        return Err(DumpError::Options("batch_fsync must be at least 1".into()));
    }
    Ok(())
}

/// ELF segments: one per run of dumped pages (runs closer than
/// [`PFN_EXCLUDED`] pages merged), each extended over the excluded pages
/// after it by `p_memsz`, as makedumpfile's `write_elf_pages_cyclic`.
fn elf_segments(plan: &Plan) -> Vec<Seg> {
    let mut segs = Vec::new();
    for r in &plan.ranges {
        let (first, end) = (r.start / PAGE_SIZE, r.end / PAGE_SIZE);
        let mut runs: Vec<Range<u64>> = Vec::new();
        let mut pfn = first;
        while pfn < end {
            if !plan.kept(pfn) {
                pfn += 1;
                continue;
            }
            let a = pfn;
            while pfn < end && plan.kept(pfn) {
                pfn += 1;
            }
            let empty = runs.is_empty();
            match runs.last_mut() {
                Some(last) if a - last.end < PFN_EXCLUDED => last.end = pfn,
                _ if empty && a - first < PFN_EXCLUDED => runs.push(first..pfn),
                _ => runs.push(a..pfn),
            }
        }
        if runs.first().is_none_or(|f| f.start > first) {
            let to = runs.first().map_or(end, |f| f.start);
            segs.push(Seg {
                paddr: r.start,
                filesz: 0,
                memsz: (to - first) * PAGE_SIZE,
                offset: 0,
            });
        }
        for (i, run) in runs.iter().enumerate() {
            let to = runs.get(i + 1).map_or(end, |n| n.start);
            segs.push(Seg {
                paddr: run.start * PAGE_SIZE,
                filesz: (run.end - run.start) * PAGE_SIZE,
                memsz: (to - run.start) * PAGE_SIZE,
                offset: 0,
            });
        }
    }
    segs
}

/// The writer's end of the flusher thread.
struct Flusher {
    to_flush: mpsc::Sender<Vec<Range<u64>>>,
    flushed: mpsc::Receiver<std::io::Result<Vec<Range<u64>>>>,
    /// Batches sent and not yet reported back.
    outstanding: usize,
}

/// State of one dump being written.
struct Run<'f> {
    file: &'f File,
    partial: &'f Path,
    total: u64,
    /// GPA ranges flushed, in order.
    durable: Vec<Range<u64>>,
    zero_pages: u64,
    written: u64,
    /// kdump: where the descriptors start, the shared zero page, the next data byte.
    desc_at: u64,
    zero_page: u64,
    cursor: u64,
}

impl Run<'_> {
    fn stopped(&self, source: Box<dyn std::error::Error + Send + Sync>) -> DumpError {
        let durable: u64 = self.durable.iter().map(|r| r.end - r.start).sum();
        let upto = self.durable.last().map_or(0, |r| r.end);
        let missing = if durable == self.total {
            "nothing (the final header or rename failed)".to_string()
        } else {
            format!("everything from GPA {upto:#x} on")
        };
        DumpError::Stopped {
            partial: self.partial.to_path_buf(),
            durable,
            total: self.total,
            missing,
            source,
        }
    }

    fn elf_header(&mut self, plan: &mut Plan, notes: &[Note]) -> std::io::Result<()> {
        let phnum = plan.segs.len() + 1;
        let notes_at = elf::EHDR_SIZE + phnum as u64 * elf::PHDR_SIZE;
        let mut note_bytes = Vec::new();
        for n in notes {
            n.encode(&mut note_bytes);
        }
        let mut at = (notes_at + note_bytes.len() as u64).next_multiple_of(PAGE_SIZE);
        for s in &mut plan.segs {
            if s.filesz > 0 {
                s.offset = at;
                at += s.filesz;
            }
        }
        let mut h = elf::encode_header(phnum as u16);
        Phdr {
            p_type: PT_NOTE,
            p_offset: notes_at,
            p_filesz: note_bytes.len() as u64,
            p_memsz: note_bytes.len() as u64,
            ..Phdr::default()
        }
        .encode(&mut h);
        for s in &plan.segs {
            // p_vaddr 0: makedumpfile's NOT_KV_ADDR, a segment with no kernel
            // virtual address (get_page_offset_x86_64 skips it); crash and
            // makedumpfile take phys_base from VMCOREINFO.
            Phdr {
                p_type: PT_LOAD,
                p_flags: 7, // PF_R | PF_W | PF_X, as the kernel's /proc/vmcore
                p_offset: s.offset,
                p_vaddr: 0,
                p_paddr: s.paddr,
                p_filesz: s.filesz,
                p_memsz: s.memsz,
                p_align: 0,
            }
            .encode(&mut h);
        }
        h.extend_from_slice(&note_bytes);
        self.file.write_all_at(&h, 0)?;
        let data_start = (h.len() as u64).next_multiple_of(PAGE_SIZE);
        self.file.set_len(data_start)?;
        for c in &mut plan.chunks {
            c.file_end = plan
                .segs
                .iter()
                .filter(|s| s.filesz > 0 && s.paddr < c.gpa.end)
                .map(|s| s.offset + s.filesz.min(c.gpa.end - s.paddr))
                .max()
                .unwrap_or(data_start);
        }
        self.written += h.len() as u64;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn kdump_header(
        &mut self,
        plan: &Plan,
        notes: &[Note],
        info: Option<&VmcoreInfo>,
        compress: Compress,
        filter: Option<&dyn PageFilter>,
        cpus: usize,
        first: bool,
    ) -> std::io::Result<()> {
        let max_mapnr = plan.ranges.last().map_or(0, |r| r.end / PAGE_SIZE);
        let mut note_bytes = Vec::new();
        let mut vmcoreinfo = (0, 0);
        for n in notes {
            if n.is_vmcoreinfo() {
                vmcoreinfo = (note_bytes.len() + n.desc_offset(), n.desc.len());
            }
            n.encode(&mut note_bytes);
        }
        let l = kdump::Layout::new(PAGE_SIZE, max_mapnr, note_bytes.len() as u64);
        let mut status = match compress {
            Compress::Zlib => kdump::DUMP_DH_COMPRESSED_ZLIB,
            Compress::Zstd => kdump::DUMP_DH_COMPRESSED_ZSTD,
            Compress::Lzo => kdump::DUMP_DH_COMPRESSED_LZO,
            Compress::None | Compress::Lz4 => 0,
        };
        if first {
            status |= kdump::DUMP_DH_COMPRESSED_INCOMPLETE;
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let h = kdump::Header {
            header_version: kdump::HEADER_VERSION,
            utsname: kdump::Utsname {
                sysname: "Linux".into(),
                release: info.map(|i| i.osrelease.clone()).unwrap_or_default(),
                machine: "x86_64".into(),
                ..Default::default()
            },
            timestamp_sec: now.as_secs(),
            timestamp_usec: now.subsec_micros().into(),
            status,
            block_size: PAGE_SIZE as u32,
            sub_hdr_size: l.sub_hdr_blocks as u32,
            bitmap_blocks: l.bitmap_blocks as u32,
            max_mapnr: max_mapnr.min(u32::MAX.into()) as u32,
            nr_cpus: cpus.max(1) as u32,
        };
        self.file.write_all_at(&h.encode(), 0)?;
        if !first {
            return Ok(());
        }
        let notes_at = l.notes_offset();
        let sub = kdump::SubHeader {
            phys_base: info.and_then(|i| i.phys_base).unwrap_or(0),
            dump_level: filter.map_or(0, |f| f.dump_level()),
            offset_vmcoreinfo: if vmcoreinfo.1 > 0 {
                notes_at + vmcoreinfo.0 as u64
            } else {
                0
            },
            size_vmcoreinfo: vmcoreinfo.1 as u64,
            offset_note: if note_bytes.is_empty() { 0 } else { notes_at },
            size_note: note_bytes.len() as u64,
            max_mapnr_64: max_mapnr,
            ..Default::default()
        };
        let mut block1 = sub.encode();
        block1.extend_from_slice(&note_bytes);
        self.file.write_all_at(&block1, PAGE_SIZE)?;
        // 1st bitmap: RAM; 2nd: dumped pages.
        let mut ram = vec![0u8; l.bitmap_len() as usize];
        for r in &plan.ranges {
            for pfn in r.start / PAGE_SIZE..r.end / PAGE_SIZE {
                ram[(pfn / 8) as usize] |= 1 << (pfn % 8);
            }
        }
        self.file.write_all_at(&ram, l.bitmap1_offset())?;
        let mut dumped = vec![0u8; l.bitmap_len() as usize];
        for (i, w) in plan.keep.iter().enumerate() {
            dumped[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.file.write_all_at(&dumped, l.bitmap2_offset())?;
        // Descriptors stay zero (not written) until their chunk is; then the
        // shared zero page, left as a hole.
        self.desc_at = l.desc_offset();
        self.zero_page = l.desc_offset() + plan.kept * PAGE_DESC_SIZE;
        self.cursor = self.zero_page + PAGE_SIZE;
        self.file.set_len(self.cursor)?;
        self.written += (PAGE_SIZE + block1.len() as u64) + 2 * l.bitmap_len();
        Ok(())
    }

    /// Receives chunks, writes them in order, flushes each batch.
    fn write_in_order(
        &mut self,
        plan: &Plan,
        opts: &DumpOptions,
        rx: &mpsc::Receiver<(usize, WorkResult)>,
        done: &(Mutex<usize>, Condvar),
        mut flusher: Flusher,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        let n = plan.chunks.len();
        let mut waiting = std::collections::BTreeMap::new();
        let mut batch: Vec<Range<u64>> = Vec::new();
        let mut covered = 0u64;
        for i in 0..n {
            let out = loop {
                if let Some(o) = waiting.remove(&i) {
                    break o;
                }
                let Ok((j, o)) = rx.recv() else {
                    return Err(self.stopped("a worker thread ended early".into()));
                };
                waiting.insert(j, o);
            };
            let c = &plan.chunks[i];
            let out = out.map_err(|e| self.stopped(e))?;
            let wrote = match out {
                ChunkOut::Elf(pieces) => {
                    let nonzero: usize = pieces.iter().map(Piece::nonzero_pages).sum();
                    self.zero_pages += c.pages - nonzero as u64;
                    self.write_elf_chunk(plan, &pieces)
                }
                ChunkOut::Kdump { pages, data } => {
                    let descs = kdump_descs(&pages, self.zero_page, self.cursor);
                    self.zero_pages += pages.iter().filter(|p| p.is_none()).count() as u64;
                    let at = self.desc_at + c.first_desc * PAGE_DESC_SIZE;
                    let r = self
                        .file
                        .write_all_at(&data, self.cursor)
                        .and_then(|_| self.file.write_all_at(&descs, at));
                    self.cursor += data.len() as u64;
                    r.map(|_| (data.len() + descs.len()) as u64)
                }
            };
            self.written += wrote.map_err(|e| self.stopped(e.into()))?;
            covered += c.gpa.end - c.gpa.start;
            batch.push(c.gpa.clone());
            progress.advanced(covered, self.written);
            *done.0.lock().unwrap_or_else(|e| e.into_inner()) = i + 1;
            done.1.notify_all();
            start_writeback(self.file);
            while let Ok(r) = flusher.flushed.try_recv() {
                flusher.outstanding -= 1;
                self.flushed(r, progress)?;
            }
            if batch.len() >= opts.batch_fsync || i + 1 == n {
                if opts.format == Format::Elf
                    && c.file_end
                        > self
                            .file
                            .metadata()
                            .map_err(|e| self.stopped(e.into()))?
                            .len()
                {
                    self.file
                        .set_len(c.file_end)
                        .map_err(|e| self.stopped(e.into()))?;
                }
                // At most one flush runs while the next batch is written.
                while flusher.outstanding > 0 {
                    self.wait_flush(&mut flusher, progress)?;
                }
                if flusher.to_flush.send(std::mem::take(&mut batch)).is_err() {
                    return Err(self.stopped("the flusher thread ended early".into()));
                }
                flusher.outstanding += 1;
            }
        }
        while flusher.outstanding > 0 {
            self.wait_flush(&mut flusher, progress)?;
        }
        Ok(())
    }

    fn wait_flush(
        &mut self,
        flusher: &mut Flusher,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        let r = flusher
            .flushed
            .recv()
            .map_err(|_| self.stopped("the flusher thread ended early".into()))?;
        flusher.outstanding -= 1;
        self.flushed(r, progress)
    }

    /// A batch's flush ended: its chunks are durable, or the dump stops.
    fn flushed(
        &mut self,
        r: std::io::Result<Vec<Range<u64>>>,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        for g in r.map_err(|e| self.stopped(e.into()))? {
            self.durable.push(g.clone());
            progress.durable(g);
        }
        Ok(())
    }

    /// ELF: writes the non-zero pages of each piece at their file offsets.
    fn write_elf_chunk(&mut self, plan: &Plan, pieces: &[Piece]) -> std::io::Result<u64> {
        let mut wrote = 0;
        let page = PAGE_SIZE as usize;
        for p in pieces {
            for r in &p.nonzero {
                let gpa = p.gpa + (r.start * page) as u64;
                let off = plan.elf_offset(gpa).ok_or_else(|| {
                    std::io::Error::other(format!("GPA {gpa:#x} has no place in the ELF file"))
                })?;
                self.file
                    .write_all_at(&p.buf[r.start * page..r.end * page], off)?;
                wrote += ((r.end - r.start) * page) as u64;
            }
        }
        Ok(wrote)
    }
}

/// Starts writing the file's dirty pages back without waiting, so the flush
/// at the end of the batch finds most of them on disk already. Best effort:
/// errors show up at the flush.
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range only reads its integer arguments; the
    // descriptor is open for as long as `file` is borrowed, and offset 0 with
    // length 0 means "to the end of the file", a valid range for any file.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// The descriptors of one chunk's pages: zero pages point at the shared
/// zero page, stored ones at their place from `cursor` on.
fn kdump_descs(pages: &[Option<(u32, u32)>], zero_page: u64, mut cursor: u64) -> Vec<u8> {
    let mut descs = Vec::with_capacity(pages.len() * PAGE_DESC_SIZE as usize);
    for p in pages {
        let d = match *p {
            None => PageDesc {
                offset: zero_page,
                size: PAGE_SIZE as u32,
                flags: 0,
                page_flags: 0,
            },
            Some((size, flags)) => {
                let d = PageDesc {
                    offset: cursor,
                    size,
                    flags,
                    page_flags: 0,
                };
                cursor += u64::from(size);
                d
            }
        };
        d.encode(&mut descs);
    }
    descs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (first page, file pages, memory pages) of each segment.
    fn seg_pages(plan: &Plan) -> Vec<(u64, u64, u64)> {
        let page = |b: u64| b / PAGE_SIZE;
        elf_segments(plan)
            .iter()
            .map(|s| (page(s.paddr), page(s.filesz), page(s.memsz)))
            .collect()
    }

    #[test]
    fn short_gaps_stay_inside_a_segment_long_ones_split_it() {
        // 2048 pages; drop 10 pages at 100 and 300 pages at 1000, and the last 2 pages.
        let pages = 2048u64;
        let mut keep = vec![u64::MAX; 32];
        let mut drop = |a: u64, b: u64| {
            for p in a..b {
                keep[(p / 64) as usize] &= !(1 << (p % 64));
            }
        };
        drop(100, 110);
        drop(1000, 1300);
        drop(2046, 2048);
        let plan = Plan {
            ranges: vec![0..pages * PAGE_SIZE],
            keep,
            data: vec![],
            chunks: vec![],
            kept: 0,
            segs: vec![],
        };
        let got = seg_pages(&plan);
        assert_eq!(got, vec![(0, 1000, 1300), (1300, 746, 748)]);
        // Leading excluded pages: a segment without file data.
        let mut keep = vec![u64::MAX; 32];
        for p in 0..512 {
            keep[(p / 64) as usize] &= !(1 << (p % 64));
        }
        let plan = Plan { keep, ..plan };
        let got = seg_pages(&plan);
        assert_eq!(got, vec![(0, 0, 512), (512, 1536, 1536)]);
    }

    #[test]
    fn pages_that_do_not_shrink_are_stored_raw() {
        let mut data = Vec::new();
        let mut z = Compressor::new(Compress::Zstd).unwrap();
        let zeros = vec![0u8; 4096];
        let (n, f) = z.page(&zeros, &mut data).unwrap();
        assert_eq!(f, kdump::DUMP_DH_COMPRESSED_ZSTD);
        assert!(n < 100 && data.len() == n as usize);
        assert_eq!(zstd::bulk::decompress(&data, 4096).unwrap(), zeros);
        let mut rng = 0x1234_5678u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect();
        for c in [
            Compress::Zlib,
            Compress::Zstd,
            Compress::Lzo,
            Compress::None,
        ] {
            let mut out = vec![1, 2, 3];
            let (n, f) = Compressor::new(c).unwrap().page(&noise, &mut out).unwrap();
            assert_eq!((n, f), (4096, 0), "{c:?}");
            assert_eq!(&out[3..], &noise[..]);
        }
        let mut zl = Compressor::new(Compress::Zlib).unwrap();
        let text = b"Kernel panic - not syncing: sysrq triggered crash\n".repeat(100);
        let mut out = Vec::new();
        let (n, f) = zl.page(&text[..4096], &mut out).unwrap();
        assert_eq!(f, kdump::DUMP_DH_COMPRESSED_ZLIB);
        let mut d = flate2::Decompress::new(true);
        let mut back = vec![0u8; 4096];
        d.decompress(
            &out[..n as usize],
            &mut back,
            flate2::FlushDecompress::Finish,
        )
        .unwrap();
        assert_eq!(&back[..], &text[..4096]);
    }
}
