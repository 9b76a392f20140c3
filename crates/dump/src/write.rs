//! The dump writer: guest RAM in chunks, read and compressed on worker
//! threads, written in GPA order, flushed in batches, each chunk reported
//! durable after the flush that covers it.
//!
//! The file is `<out>.partial` (created 0600) until every byte is written
//! and flushed; then it is renamed to `<out>` and the directory flushed. A
//! dump that stops (no space, a read error, the process killed) stays
//! `.partial`, and everything reported durable is in it: [`crate::inspect`]
//! says which guest ranges it holds. A dump never replaces a file already at
//! `<out>` (refused before anything is written, and the rename itself does not
//! replace): a file at `<out>` is always a finished dump.

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
    /// Which parts of guest RAM hold data could not be found.
    #[error("cannot find which guest RAM holds data")]
    DataRanges(#[source] rebound_guestmem::MemoryError),
    /// The VMCOREINFO text does not parse.
    #[error("the VMCOREINFO text is not usable")]
    Vmcoreinfo(#[from] VmcoreinfoError),
    /// Something is already at the output path.
    #[error("{0} already exists: a dump never replaces a file")]
    Exists(PathBuf),
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

    /// Every byte is written and flushed; the rename to the final name comes next.
    fn renaming(&mut self) {}
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

/// Guest RAM per unit of work: one slice is read, scanned for zero pages,
/// compressed and written at a time. Chunks (the unit of durability) are
/// cut into slices so buffers stay small and reused.
const SLICE_BYTES: u64 = 8 << 20;
/// Runs of at least this many bytes are written with `O_DIRECT` (straight
/// from the page-aligned buffer to the disk, no page cache copy); shorter
/// ones through the page cache, so zero pages between them stay holes
/// without a small synchronous write each.
const DIRECT_MIN: usize = 64 << 10;

/// A chunk of guest RAM: the unit of durability (and of `advanced` reports).
struct Chunk {
    gpa: Range<u64>,
    /// Its slices in `Plan::slices`.
    slices: Range<usize>,
    /// ELF: file length that covers this chunk's data.
    file_end: u64,
}

/// A slice of a chunk: the unit of work.
struct Slice {
    gpa: Range<u64>,
    /// kdump: index of the first dumped page's descriptor.
    first_desc: u64,
    /// Pages of the slice the dump holds.
    pages: u64,
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
    slices: Vec<Slice>,
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

/// One page, aligned as `O_DIRECT` wants its memory.
#[derive(Clone)]
#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE as usize]);

/// A page-aligned buffer.
struct Pages(Vec<Page>);

impl Pages {
    fn new(pages: usize) -> Pages {
        Pages(vec![Page([0; PAGE_SIZE as usize]); pages])
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Page` is a plain byte array with no padding (size 4096,
        // align 4096), so the vector's pages are `len * 4096` initialised,
        // contiguous bytes, borrowed for as long as `self` is.
        unsafe {
            std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * PAGE_SIZE as usize)
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and the borrow is exclusive.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.0.as_mut_ptr().cast(),
                self.0.len() * PAGE_SIZE as usize,
            )
        }
    }
}

/// Buffers handed back by the writer, for the workers to fill again.
#[derive(Default)]
struct Pool(Mutex<Vec<Pages>>);

impl Pool {
    /// A buffer of at least `pages` pages (old contents left in it).
    fn take(&self, pages: usize) -> Pages {
        let mut free = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|b| b.0.len() >= pages) {
            Some(i) => free.swap_remove(i),
            None => Pages::new(pages),
        }
    }

    fn give(&self, b: Pages) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(b);
    }
}

/// A worker's result for one slice.
type WorkResult = Result<SliceOut, Box<dyn std::error::Error + Send + Sync>>;

/// What a worker hands the writer for one slice.
enum SliceOut {
    /// ELF: the slice's pages (page `i` of `buf` is the slice's page `i`)
    /// and the runs of them to write: read, dumped and not all zeros.
    Elf {
        buf: Pages,
        nonzero: Vec<Range<usize>>,
    },
    /// kdump: per dumped page, `None` for a zero page or the stored length
    /// and flags; the stored bytes concatenated, `len` of them, in `data`
    /// padded with zeros to a whole page.
    Kdump {
        pages: Vec<Option<(u32, u32)>>,
        data: Pages,
        len: usize,
    },
}

fn is_zero(page: &[u8]) -> bool {
    page.chunks(64)
        .all(|c| c.iter().fold(0u8, |a, &b| a | b) == 0)
}

/// Renames `from` to `to` unless something is at `to` (then `AlreadyExists`):
/// `renameat2(RENAME_NOREPLACE)`, or a hard link and an unlink where the file
/// system lacks it (either way, a file at `to` is never replaced).
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both paths are NUL-terminated strings that live across the call;
    // renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EINVAL) {
        return Err(e);
    }
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
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

    /// Stores `page` at the start of `out` (at least a page long),
    /// compressed if that makes it smaller, else raw; returns (stored
    /// length, descriptor flags).
    fn page(&mut self, page: &[u8], out: &mut [u8]) -> (u32, u32) {
        let room = &mut out[..page.len() - 1];
        let got = match self {
            Compressor::None => None,
            Compressor::Zlib(z) => {
                z.reset();
                match z.compress(page, room, flate2::FlushCompress::Finish) {
                    Ok(flate2::Status::StreamEnd) => {
                        Some((z.total_out() as usize, kdump::DUMP_DH_COMPRESSED_ZLIB))
                    }
                    _ => None,
                }
            }
            Compressor::Zstd(z) => z
                .compress_to_buffer(page, room)
                .ok()
                .map(|n| (n, kdump::DUMP_DH_COMPRESSED_ZSTD)),
            Compressor::Lzo => {
                let c = lzo1x::compress(page, lzo1x::CompressLevel::new(3));
                room.get_mut(..c.len()).map(|dst| {
                    dst.copy_from_slice(&c);
                    (c.len(), kdump::DUMP_DH_COMPRESSED_LZO)
                })
            }
        };
        match got {
            Some((n, flags)) => (n as u32, flags),
            None => {
                out[..page.len()].copy_from_slice(page);
                (page.len() as u32, 0)
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
        let data = self.mem.data_ranges().map_err(DumpError::DataRanges)?;
        let mut plan = Plan {
            ranges,
            keep,
            data,
            chunks: Vec::new(),
            slices: Vec::new(),
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
        for r in &plan.ranges {
            let mut at = r.start;
            while at < r.end {
                let end = ((at / opts.chunk_bytes + 1) * opts.chunk_bytes).min(r.end);
                let first = plan.slices.len();
                let mut s = at;
                while s < end {
                    let e = (s + SLICE_BYTES).min(end);
                    let pages = (s / PAGE_SIZE..e / PAGE_SIZE)
                        .filter(|&p| plan.kept(p))
                        .count() as u64;
                    plan.slices.push(Slice {
                        gpa: s..e,
                        first_desc: desc,
                        pages,
                    });
                    desc += pages;
                    s = e;
                }
                plan.chunks.push(Chunk {
                    gpa: at..end,
                    slices: first..plan.slices.len(),
                    file_end: 0,
                });
                at = end;
            }
        }
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

        if out.symlink_metadata().is_ok() {
            return Err(DumpError::Exists(out.to_path_buf()));
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
            data_end: 0,
            // Page data goes around the page cache when it can: one copy less,
            // and no dirty pages for the flushes to find.
            direct: OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&partial)
                .ok(),
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
                    // Without the last slice's padding.
                    file.set_len(run.data_end)?;
                    run.kdump_header(&plan, &notes, info.as_ref(), compress, filter, cpus, false)?
                }
            }
            file.sync_all()?;
            progress.renaming();
            rename_noreplace(&partial, out)?;
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

    /// Reads the slice's dumped pages that hold data into `buf` (page `i` of
    /// `buf` is the slice's page `i`), one read per run; returns the runs
    /// read, as page indexes.
    fn read_slice(
        &self,
        plan: &Plan,
        s: &Slice,
        buf: &mut [u8],
    ) -> Result<Vec<Range<usize>>, rebound_guestmem::MemoryError> {
        let base = s.gpa.start / PAGE_SIZE;
        let n = ((s.gpa.end - s.gpa.start) / PAGE_SIZE) as usize;
        let wanted = |i: usize| {
            let pfn = base + i as u64;
            plan.kept(pfn) && plan.has_data(pfn * PAGE_SIZE)
        };
        let page = PAGE_SIZE as usize;
        let mut runs = Vec::new();
        let mut i = 0;
        while i < n {
            if !wanted(i) {
                i += 1;
                continue;
            }
            let first = i;
            while i < n && wanted(i) {
                i += 1;
            }
            self.mem.read(
                (base + first as u64) * PAGE_SIZE,
                &mut buf[first * page..i * page],
            )?;
            runs.push(first..i);
        }
        Ok(runs)
    }

    /// A worker's part of one slice: read, find zero pages, compress.
    fn work(&self, plan: &Plan, s: &Slice, w: &mut Worker, pool: &Pool) -> WorkResult {
        let n = ((s.gpa.end - s.gpa.start) / PAGE_SIZE) as usize;
        let page = PAGE_SIZE as usize;
        let Some(comp) = &mut w.comp else {
            let mut buf = pool.take(n);
            let read = self.read_slice(plan, s, buf.bytes_mut())?;
            let bytes = buf.bytes();
            let mut nonzero: Vec<Range<usize>> = Vec::new();
            for i in read.into_iter().flatten() {
                if is_zero(&bytes[i * page..(i + 1) * page]) {
                    continue;
                }
                match nonzero.last_mut() {
                    Some(r) if r.end == i => r.end = i + 1,
                    _ => nonzero.push(i..i + 1),
                }
            }
            return Ok(SliceOut::Elf { buf, nonzero });
        };
        // kdump: read into the worker's own buffer, store into a pooled one.
        if w.read.0.len() < n {
            w.read = Pages::new(n);
        }
        let read = self.read_slice(plan, s, w.read.bytes_mut())?;
        let src = w.read.bytes();
        let mut data = pool.take(s.pages as usize);
        let out = data.bytes_mut();
        let mut len = 0;
        let mut pages = Vec::with_capacity(s.pages as usize);
        let mut runs = read.iter().peekable();
        let base = s.gpa.start / PAGE_SIZE;
        for i in 0..n {
            if !plan.kept(base + i as u64) {
                continue;
            }
            while runs.peek().is_some_and(|r| r.end <= i) {
                runs.next();
            }
            let p = &src[i * page..(i + 1) * page];
            if runs.peek().is_some_and(|r| r.start <= i) && !is_zero(p) {
                let (stored, flags) = comp.page(p, &mut out[len..]);
                len += stored as usize;
                pages.push(Some((stored, flags)));
            } else {
                pages.push(None);
            }
        }
        out[len..len.next_multiple_of(page)].fill(0);
        Ok(SliceOut::Kdump { pages, data, len })
    }

    fn pipeline(
        &self,
        plan: &Plan,
        opts: &DumpOptions,
        run: &mut Run<'_>,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        let n = plan.slices.len();
        let threads = opts.threads.max(1);
        let window = 4 * threads;
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let done = (Mutex::new(0usize), Condvar::new());
        let pool = Pool::default();
        let (tx, rx) = mpsc::sync_channel(window);
        let mut workers = Vec::new();
        for _ in 0..threads {
            let comp = match opts.format {
                Format::Elf => None,
                Format::Kdump { compress } => {
                    Some(Compressor::new(compress).map_err(|e| run.stopped(e.into()))?)
                }
            };
            workers.push(Worker {
                comp,
                read: Pages::new(0),
            });
        }
        std::thread::scope(|s| -> Result<(), DumpError> {
            for mut worker in workers {
                let tx = tx.clone();
                let (next, stop, done, pool) = (&next, &stop, &done, &pool);
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n || stop.load(Ordering::Relaxed) {
                            return;
                        }
                        // Stay within `window` slices of the writer.
                        let mut w = done.0.lock().unwrap_or_else(|e| e.into_inner());
                        while i >= *w + window && !stop.load(Ordering::Relaxed) {
                            w = done.1.wait(w).unwrap_or_else(|e| e.into_inner());
                        }
                        drop(w);
                        let out = self.work(plan, &plan.slices[i], &mut worker, pool);
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
            let result = run.write_in_order(plan, opts, &rx, &done, &pool, flusher, progress);
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

/// A worker thread's own state.
struct Worker {
    comp: Option<Compressor>,
    /// kdump: the slice's pages as read, before they are stored.
    read: Pages,
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
    /// kdump: the end of the last page data stored (`cursor` less padding).
    data_end: u64,
    /// The same file opened with `O_DIRECT`, while the file system takes it.
    direct: Option<File>,
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
        // shared zero page, left as a hole, on a page boundary so that page
        // data starts on one (every slice's data then starts and ends on a
        // page boundary and goes out with O_DIRECT; descriptors hold
        // offsets, so the padding costs readers nothing).
        self.desc_at = l.desc_offset();
        self.zero_page = (l.desc_offset() + plan.kept * PAGE_DESC_SIZE).next_multiple_of(PAGE_SIZE);
        self.cursor = self.zero_page + PAGE_SIZE;
        self.data_end = self.cursor;
        self.file.set_len(self.cursor)?;
        self.written += (PAGE_SIZE + block1.len() as u64) + 2 * l.bitmap_len();
        Ok(())
    }

    /// Receives slices, writes them in order, flushes each batch of chunks.
    #[allow(clippy::too_many_arguments)]
    fn write_in_order(
        &mut self,
        plan: &Plan,
        opts: &DumpOptions,
        rx: &mpsc::Receiver<(usize, WorkResult)>,
        done: &(Mutex<usize>, Condvar),
        pool: &Pool,
        mut flusher: Flusher,
        progress: &mut dyn Progress,
    ) -> Result<(), DumpError> {
        let n = plan.chunks.len();
        let mut waiting = std::collections::BTreeMap::new();
        let mut batch: Vec<Range<u64>> = Vec::new();
        let mut covered = 0u64;
        for (i, c) in plan.chunks.iter().enumerate() {
            for j in c.slices.clone() {
                let out = loop {
                    if let Some(o) = waiting.remove(&j) {
                        break o;
                    }
                    let Ok((k, o)) = rx.recv() else {
                        return Err(self.stopped("a worker thread ended early".into()));
                    };
                    waiting.insert(k, o);
                };
                let out = out.map_err(|e| self.stopped(e))?;
                let wrote = self.write_slice(plan, &plan.slices[j], out, pool);
                self.written += wrote.map_err(|e| self.stopped(e.into()))?;
                *done.0.lock().unwrap_or_else(|e| e.into_inner()) = j + 1;
                done.1.notify_all();
            }
            covered += c.gpa.end - c.gpa.start;
            batch.push(c.gpa.clone());
            progress.advanced(covered, self.written);
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

    /// Writes one slice where it goes; returns the bytes written.
    fn write_slice(
        &mut self,
        plan: &Plan,
        s: &Slice,
        out: SliceOut,
        pool: &Pool,
    ) -> std::io::Result<u64> {
        let page = PAGE_SIZE as usize;
        let wrote = match out {
            SliceOut::Elf { buf, nonzero } => {
                let pages: usize = nonzero.iter().map(|r| r.end - r.start).sum();
                self.zero_pages += s.pages - pages as u64;
                let bytes = buf.bytes();
                for r in &nonzero {
                    let gpa = s.gpa.start + (r.start * page) as u64;
                    let off = plan.elf_offset(gpa).ok_or_else(|| {
                        std::io::Error::other(format!("GPA {gpa:#x} has no place in the ELF file"))
                    })?;
                    self.put(&bytes[r.start * page..r.end * page], off)?;
                }
                pool.give(buf);
                (pages * page) as u64
            }
            SliceOut::Kdump { pages, data, len } => {
                let descs = kdump_descs(&pages, self.zero_page, self.cursor);
                self.zero_pages += pages.iter().filter(|p| p.is_none()).count() as u64;
                let padded = len.next_multiple_of(page);
                self.put(&data.bytes()[..padded], self.cursor)?;
                pool.give(data);
                self.data_end = self.cursor + len as u64;
                self.cursor += padded as u64;
                let at = self.desc_at + s.first_desc * PAGE_DESC_SIZE;
                self.file.write_all_at(&descs, at)?;
                (padded + descs.len()) as u64
            }
        };
        Ok(wrote)
    }

    /// Writes `bytes` at `off`: with `O_DIRECT` when it is long and aligned
    /// (and the file system takes it), else through the page cache.
    fn put(&mut self, bytes: &[u8], off: u64) -> std::io::Result<()> {
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(PAGE_SIZE as usize)
            && off.is_multiple_of(PAGE_SIZE)
            && bytes.len().is_multiple_of(PAGE_SIZE as usize);
        if let Some(d) = self
            .direct
            .as_ref()
            .filter(|_| aligned && bytes.len() >= DIRECT_MIN)
        {
            match d.write_all_at(bytes, off) {
                Ok(()) => return Ok(()),
                // Not for this file system after all: the page cache from now on.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct = None,
                Err(e) => return Err(e),
            }
        }
        self.file.write_all_at(bytes, off)
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
            slices: vec![],
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
        let mut data = vec![0u8; 4096];
        let mut z = Compressor::new(Compress::Zstd).unwrap();
        let zeros = vec![0u8; 4096];
        let (n, f) = z.page(&zeros, &mut data);
        assert_eq!(f, kdump::DUMP_DH_COMPRESSED_ZSTD);
        assert!(n < 100);
        let back = zstd::bulk::decompress(&data[..n as usize], 4096).unwrap();
        assert_eq!(back, zeros);
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
            let mut out = vec![1; 4099];
            let (n, f) = Compressor::new(c).unwrap().page(&noise, &mut out[3..]);
            assert_eq!((n, f), (4096, 0), "{c:?}");
            assert_eq!(&out[..3], &[1, 1, 1]);
            assert_eq!(&out[3..], &noise[..]);
        }
        let mut zl = Compressor::new(Compress::Zlib).unwrap();
        let text = b"Kernel panic - not syncing: sysrq triggered crash\n".repeat(100);
        let mut out = vec![0u8; 4096];
        let (n, f) = zl.page(&text[..4096], &mut out);
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
