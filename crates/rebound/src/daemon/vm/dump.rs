//! The dump task of a crash: reads the crashed VM's moved RAM file through
//! `rebound-guestmem`, writes it with `rebound-dump`, and punches every chunk out of
//! the RAM file once it is durable (and pages the filter leaves out at once), so the
//! memory goes to the recovery VM at the rate the dump makes progress.

use std::collections::BTreeMap;
use std::ops::Range;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

use rebound_api::{Compress, DumpFormat, PageClass, VmcoreinfoAddr};
use rebound_dump::read::ResumeSource;
use rebound_dump::{DumpOptions, DumpPages, Dumper, Format, PageFilter, Progress, PAGE_SIZE};
use rebound_guestmem::{
    classify, find_vmcoreinfo, read_vmcoreinfo, DumpLevel, Excluded, FileSource, GuestMemory,
    Layout, VmcoreInfo,
};
use tokio::sync::mpsc::UnboundedSender;

use rebound_crash::DumpSummary;

pub(crate) mod error;
pub use error::DumpError;

/// The dump's write rate in bytes per second (0: unlimited); the owner changes it as
/// the I/O policy says (e.g. held back until the recovery VM is ready).
pub type Rate = std::sync::Arc<std::sync::atomic::AtomicU64>;

/// What a dump needs.
pub struct DumpJob {
    /// Partial dumps of stopped daemons, newest first (see `ResumeSource`).
    pub earlier: Vec<PathBuf>,
    pub rate: Rate,
    pub ram: PathBuf,
    pub memory_mib: u64,
    pub out: PathBuf,
    pub cpu_notes: Option<PathBuf>,
    pub format: DumpFormat,
    pub compress: Compress,
    pub filter: Vec<PageClass>,
    pub chunk_mib: u64,
    pub vmcoreinfo: Option<VmcoreinfoAddr>,
    /// Punch dumped memory out of the RAM file (a crashed guest's, never a live one's).
    pub release: bool,
}

/// What the dump task reports to the owner.
#[derive(Debug)]
pub enum DumpProgress {
    /// Guest memory covered so far (written or skipped) is durable, and the RAM file
    /// now holds this much.
    Chunk {
        dumped_bytes: u64,
        /// Of `dumped_bytes`, what the page filter left out (not written).
        skipped_bytes: u64,
        crashed_bytes: u64,
    },
    /// Finished: the dump's size, or why it failed.
    Done(Result<DumpSummary, DumpError>),
}

/// Runs a crash's dump to its end and reports it; never panics the daemon.
pub fn run(job: DumpJob, tx: UnboundedSender<DumpProgress>) {
    let r = write(&job, Some(&tx), &mut |_| {});
    let _ = tx.send(DumpProgress::Done(r));
}

/// Holds the dump to its rate, releases dumped memory and tells the owner.
struct Punch<'a> {
    ram: Option<std::fs::File>,
    layout: Layout,
    path: &'a std::path::Path,
    tx: Option<&'a UnboundedSender<DumpProgress>>,
    covered: &'a mut dyn FnMut(u64),
    durable: u64,
    /// The pages the filter leaves out, and how many of the durable bytes they are.
    excluded: Option<&'a rebound_guestmem::classify::Excluded<'a>>,
    skipped: u64,
    rate: Rate,
    /// Token bucket: bytes written and when, at the last check.
    last: (u64, std::time::Instant),
}

impl Punch<'_> {
    fn punch(&self, gpa: Range<u64>) {
        let Some(ram) = &self.ram else { return };
        for r in self.layout.ranges() {
            let g = r.gpa_range();
            let (s, e) = (gpa.start.max(g.start), gpa.end.min(g.end));
            if s >= e {
                continue;
            }
            let off = self.layout.gpa_to_offset(s).expect("inside a RAM range");
            // SAFETY: fallocate on a descriptor we own; it only frees the file's
            // blocks in [off, off + len), which the dump has made durable elsewhere.
            let rc = unsafe {
                libc::fallocate(
                    ram.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off as libc::off_t,
                    (e - s) as libc::off_t,
                )
            };
            if rc != 0 {
                tracing::warn!(
                    "cannot release dumped memory of {}: {}",
                    self.path.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

impl Progress for Punch<'_> {
    /// Holds the writer to the rate in force: after each chunk it sleeps until the
    /// bytes written since the last chunk fit the rate.
    fn advanced(&mut self, covered: u64, written: u64) {
        (self.covered)(covered);
        let rate = self.rate.load(std::sync::atomic::Ordering::Relaxed);
        let (last_written, last_t) = self.last;
        if rate > 0 {
            let due = std::time::Duration::from_secs_f64(
                written.saturating_sub(last_written) as f64 / rate as f64,
            );
            if let Some(wait) = due.checked_sub(last_t.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        self.last = (written, std::time::Instant::now());
    }

    fn renaming(&mut self) {
        // A crash's dump (the one that reports to the owner).
        if self.tx.is_some() {
            crate::daemon::fault::point("crash:before-rename");
        }
    }

    fn durable(&mut self, gpa: Range<u64>) {
        self.durable += gpa.end - gpa.start;
        self.punch(gpa.clone());
        let Some(tx) = self.tx else { return };
        // Counted only for a crash's owner, the one that reports it.
        if let Some(ex) = self.excluded {
            let pages = (gpa.start..gpa.end).step_by(PAGE_SIZE as usize);
            self.skipped += pages.filter(|&g| ex.is_excluded_gpa(g)).count() as u64 * PAGE_SIZE;
        }
        let _ = tx.send(DumpProgress::Chunk {
            dumped_bytes: self.durable,
            skipped_bytes: self.skipped,
            crashed_bytes: rebound_vmm::process::allocated_bytes(self.path).unwrap_or(0),
        });
    }
}

/// makedumpfile's dump level for the classes a filter leaves out.
fn level_bits(filter: &[PageClass]) -> u32 {
    filter
        .iter()
        .map(|c| match c {
            PageClass::Zero => DumpLevel::ZERO,
            PageClass::Cache => DumpLevel::CACHE | DumpLevel::CACHE_PRIVATE,
            PageClass::User => DumpLevel::USER,
            PageClass::Free => DumpLevel::FREE,
        } as u32)
        .fold(0, |a, b| a | b)
}

/// The classification's exclusions as the dump writer's filter.
struct Filter<'a> {
    ex: Excluded<'a>,
    bits: u32,
}

impl PageFilter for Filter<'_> {
    fn keep(&self, gpa: u64) -> bool {
        !self.ex.is_excluded_gpa(gpa)
    }

    fn dump_level(&self) -> u32 {
        self.bits
    }
}

/// The guest's VMCOREINFO: at the agent's address, else found by scanning.
fn vmcoreinfo(
    mem: &GuestMemory<ResumeSource>,
    at: Option<VmcoreinfoAddr>,
) -> Result<VmcoreInfo, rebound_guestmem::VmcoreinfoError> {
    if let Some(a) = at {
        if let Ok(i) = read_vmcoreinfo(mem, a.paddr, a.size) {
            return Ok(i);
        }
    }
    find_vmcoreinfo(mem).map(|f| f.info)
}

fn format(job: &DumpJob) -> Format {
    match job.format {
        DumpFormat::Elf => Format::Elf,
        DumpFormat::Kdump => Format::Kdump {
            compress: match job.compress {
                Compress::None => rebound_dump::Compress::None,
                Compress::Zlib => rebound_dump::Compress::Zlib,
                Compress::Zstd => rebound_dump::Compress::Zstd,
                Compress::Lz4 => rebound_dump::Compress::Lz4,
            },
        },
    }
}

/// Writes the dump; `covered` hears how much guest memory is done.
pub fn write(
    job: &DumpJob,
    tx: Option<&UnboundedSender<DumpProgress>>,
    covered: &mut dyn FnMut(u64),
) -> Result<DumpSummary, DumpError> {
    let layout = Layout::pc(job.memory_mib << 20)?;
    let earlier = job
        .earlier
        .iter()
        .map(|p| DumpPages::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    let ram = FileSource::open(&job.ram, layout.ram_size())?;
    let mem = GuestMemory::new(ResumeSource::new(ram, earlier, layout), layout)?;
    let mut notes = Vec::new();
    let info = match vmcoreinfo(&mem, job.vmcoreinfo) {
        Ok(i) => Some(i),
        Err(e) => {
            notes.push(format!("VMCOREINFO not found ({e}): dumped unfiltered"));
            None
        }
    };
    let cpu = match &job.cpu_notes {
        Some(p) => rebound_dump::notes_from_qemu_elf(p).unwrap_or_else(|e| {
            notes.push(format!("no vCPU registers: {e}"));
            Vec::new()
        }),
        None => Vec::new(),
    };
    let ram = match job.release {
        true => Some(
            std::fs::OpenOptions::new()
                .write(true)
                .open(&job.ram)
                .map_err(|e| DumpError::Open(job.ram.clone(), e))?,
        ),
        false => None,
    };
    let mut skipped = BTreeMap::new();
    // The classes the filter leaves out, classified from the guest's own struct pages
    // (as makedumpfile's dump levels), and given back before any I/O.
    let bits = level_bits(&job.filter);
    let classes = match (&info, bits) {
        (_, 0) => None,
        (None, _) => {
            notes.push("no VMCOREINFO, so pages were not classified: dumped unfiltered".into());
            None
        }
        (Some(i), _) => match classify(&mem, i) {
            Ok(c) => Some(c),
            Err(e) => {
                notes.push(format!(
                    "pages not classified ({}): dumped unfiltered",
                    rebound_errors::chain(&e)
                ));
                None
            }
        },
    };
    let level = DumpLevel::new(bits)?;
    let excluded = classes.as_ref().map(|c| Filter {
        ex: c.excluded(level),
        bits,
    });
    let mut punch = Punch {
        ram,
        layout,
        path: &job.ram,
        tx,
        covered,
        durable: 0,
        excluded: excluded.as_ref().map(|f| &f.ex),
        skipped: 0,
        rate: job.rate.clone(),
        last: (0, std::time::Instant::now()),
    };
    if let Some(f) = &excluded {
        for r in f.ex.excluded_ranges() {
            punch.punch(r);
        }
        let n = f.ex.counts();
        for (k, v) in [
            ("zero", n.zero),
            ("cache", n.cache),
            ("cache_private", n.cache_private),
            ("user", n.user),
            ("free", n.free),
            ("hwpoison", n.hwpoison),
            ("offline", n.offline),
        ] {
            if v > 0 {
                skipped.insert(k.to_string(), v);
            }
        }
    }
    let mut d = Dumper::new(&mem).notes(&cpu);
    if let Some(i) = &info {
        d = d.vmcoreinfo(&i.text);
    }
    if let Some(f) = &excluded {
        d = d.filter(f as &dyn PageFilter);
    }
    let opts = DumpOptions {
        format: format(job),
        chunk_bytes: job.chunk_mib << 20,
        ..DumpOptions::default()
    };
    if let Some(dir) = job.out.parent() {
        rebound_vmm::private::create_dir_all(dir)
            .map_err(|e| DumpError::CreateDir(dir.to_path_buf(), e))?;
    }
    let r = d.write(&job.out, &opts, &mut punch)?;
    notes.extend(r.warnings.iter().cloned());
    Ok(DumpSummary {
        bytes: r.file_bytes,
        io_bytes: punch.last.0,
        pages_written: r.pages_dumped,
        pages_skipped: skipped,
        notes,
    })
}
