//! Dirty-tracking engines: how a heap learns what a transaction wrote.
//!
//! | engine     | mechanism                                   | per written page       | at tend              |
//! |------------|---------------------------------------------|------------------------|----------------------|
//! | `mprotect` | read-only region, SIGSEGV handler           | signal + mprotect      | bitmap; mprotect per run (or one over the region) to re-arm |
//! | `uffd`     | userfaultfd sync write-protect, thread      | fault + 2 switches     | bitmap; ioctl per run to re-arm     |
//! | `scan`     | userfaultfd async write-protect, PAGEMAP_SCAN | in-kernel minor fault | one ioctl reports and re-arms     |
//! | `log`      | explicit `Heap::write` logging              | a memcpy of undo bytes | none (ranges known)                 |
//!
//! Page engines stay armed between transactions: whatever is stored into the region outside
//! a transaction is reported with the next one.

mod bitmap;
mod log;
mod mprotect;
mod scan;
mod sigsegv;
mod uffd;

use std::io;
use std::sync::OnceLock;

use crate::config::EngineKind;
use crate::region::Region;
use crate::sys::{self, SysError, Uffd};

pub use sigsegv::SignalError;

/// Errors of the engines.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A userfaultfd or pagemap call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The mprotect engine's signal handler could not be set up.
    #[error(transparent)]
    Signal(#[from] SignalError),
    /// mprotect refused to change a protection.
    #[error("mprotect of {len} bytes at {addr:#x} failed")]
    Protect {
        addr: usize,
        len: usize,
        #[source]
        source: io::Error,
    },
    /// Pre-faulting the region failed.
    #[error("pre-faulting the region failed")]
    Populate(#[source] io::Error),
    /// The fault-handler thread or its wake-up descriptor could not be created.
    #[error("starting the userfaultfd handler thread failed")]
    Thread(#[source] io::Error),
    /// The requested engine does not work on this kernel.
    #[error("engine {engine} is unavailable here: {reason}")]
    Unavailable {
        engine: &'static str,
        reason: String,
    },
}

/// What a transaction wrote: pages (ascending) for every engine, byte ranges for `log`.
#[derive(Default, Debug)]
pub struct Dirty {
    pub pages: Vec<usize>,
    pub ranges: Vec<(usize, usize)>,
}

impl Dirty {
    pub fn clear(&mut self) {
        self.pages.clear();
        self.ranges.clear();
    }
}

/// One dirty-tracking mechanism bound to one region.
pub trait Tracker: Send {
    fn kind(&self) -> EngineKind;
    /// A transaction starts.
    fn begin(&mut self) -> Result<(), EngineError>;
    /// `Heap::write` is about to store `len` bytes at `off` of `mem` (bounds already checked).
    fn before_write(&mut self, mem: &[u8], off: usize, len: usize);
    /// Reports into `out` what was written since tracking was last armed. An engine whose
    /// re-arming costs a system call per run leaves the reported pages untracked until
    /// [`rearm`](Self::rearm), so the heap re-arms while the backup works; `scan` re-arms
    /// in the same page-table walk. The heap does not write the region in between.
    fn take(&mut self, out: &mut Dirty) -> Result<(), EngineError>;
    /// Tracks again what `take` reported in `taken` (if `take` did not already).
    fn rearm(&mut self, taken: &Dirty) -> Result<(), EngineError>;
    /// Puts back the last committed bytes of what `take` reported (`shadow` holds them for
    /// page engines) and re-arms, so the restore itself is not reported later.
    fn restore(&mut self, taken: &Dirty, mem: &mut [u8], shadow: &[u8]) -> Result<(), EngineError>;
}

/// Calls `f(first_page, count)` for each run of consecutive pages in sorted `pages`.
pub(crate) fn for_each_run(pages: &[usize], mut f: impl FnMut(usize, usize)) {
    let mut i = 0;
    while i < pages.len() {
        let mut j = i + 1;
        while j < pages.len() && pages[j] == pages[j - 1] + 1 {
            j += 1;
        }
        f(pages[i], j - i);
        i = j;
    }
}

fn restore_from_shadow(pages: &[usize], page: usize, mem: &mut [u8], shadow: &[u8]) {
    for &p in pages {
        let r = p * page..(p + 1) * page;
        mem[r.clone()].copy_from_slice(&shadow[r]);
    }
}

/// What this kernel offers for dirty tracking, probed once per process.
#[derive(Debug, Clone)]
pub struct Capabilities {
    /// Kernel release.
    pub kernel: String,
    /// Synchronous userfaultfd write-protect works (or why not).
    pub uffd_wp: Result<(), String>,
    /// Async write-protect plus PAGEMAP_SCAN found exactly one written page (or why not).
    pub scan: Result<(), String>,
    /// How this process obtains a userfaultfd (syscall, /dev/userfaultfd, or user-mode-only
    /// when unprivileged); None when it cannot.
    pub uffd_access: Option<&'static str>,
    /// Soft-dirty bits exist (informational: no engine relies on them).
    pub soft_dirty: bool,
}

/// Probes the kernel once: opens userfaultfds, registers a scratch mapping and checks that
/// async write-protect plus PAGEMAP_SCAN reports exactly the page written.
pub fn capabilities() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(|| {
        let uffd = probe_uffd_wp().map_err(|e| rebound_errors::chain(&e));
        let scan = probe_scan().map_err(|e| rebound_errors::chain(&e));
        Capabilities {
            kernel: sys::kernel_release(),
            uffd_access: uffd.as_ref().or(scan.as_ref()).ok().copied(),
            uffd_wp: uffd.map(|_| ()),
            scan: scan.map(|_| ()),
            soft_dirty: sys::soft_dirty_available(),
        }
    })
}

fn probe_uffd_wp() -> Result<&'static str, EngineError> {
    let r = Region::map(4 * sys::page_size(), sys::page_size()).map_err(|e| {
        EngineError::Unavailable {
            engine: "uffd",
            reason: e.to_string(),
        }
    })?;
    let uffd = Uffd::open(0)?;
    // SAFETY: `r` is our fresh private anonymous scratch mapping; nothing writes to it while
    // registered, and it is unregistered (by unmapping) when `r` drops.
    unsafe { uffd.register_wp(r.addr() as u64, r.len() as u64)? };
    uffd.writeprotect(r.addr() as u64, r.len() as u64, true)?;
    Ok(uffd.access().describe())
}

fn probe_scan() -> Result<&'static str, EngineError> {
    let page = sys::page_size();
    let r = Region::map(4 * page, page).map_err(|e| EngineError::Unavailable {
        engine: "scan",
        reason: e.to_string(),
    })?;
    let mut engine = scan::ScanEngine::new(&r)?;
    // SAFETY: page 1 of our own scratch mapping; async write-protect resolves the store in-kernel.
    unsafe { r.ptr().add(page).write_volatile(1) };
    let mut d = Dirty::default();
    engine.take(&mut d)?;
    if d.pages != [1] {
        return Err(EngineError::Unavailable {
            engine: "scan",
            reason: format!(
                "PAGEMAP_SCAN reported pages {:?} after a write to page 1",
                d.pages
            ),
        });
    }
    Ok(engine.access().describe())
}

/// Resolves `Auto` to the fastest engine that works here, with the reason.
pub fn resolve(kind: EngineKind) -> Result<(EngineKind, String), EngineError> {
    let caps = capabilities();
    let how = caps.uffd_access.unwrap_or("none");
    let sd = if caps.soft_dirty {
        "present (unused)"
    } else {
        "absent"
    };
    match kind {
        EngineKind::Auto => Ok(match (&caps.scan, &caps.uffd_wp) {
            (Ok(()), _) => (
                EngineKind::Scan,
                format!(
                    "scan: async write-protect + PAGEMAP_SCAN work on kernel {} (via {how}): one ioctl per transaction; soft-dirty {sd}",
                    caps.kernel
                ),
            ),
            (Err(s), Ok(())) => (
                EngineKind::Uffd,
                format!("uffd: scan unavailable ({s}); synchronous userfaultfd write-protect works (via {how}); soft-dirty {sd}"),
            ),
            (Err(s), Err(u)) => (
                EngineKind::Mprotect,
                format!("mprotect: scan unavailable ({s}); uffd unavailable ({u}); soft-dirty {sd}"),
            ),
        }),
        EngineKind::Scan => caps
            .scan
            .clone()
            .map(|()| (kind, format!("scan: requested (via {how})")))
            .map_err(|reason| EngineError::Unavailable { engine: "scan", reason }),
        EngineKind::Uffd => caps
            .uffd_wp
            .clone()
            .map(|()| (kind, format!("uffd: requested (via {how})")))
            .map_err(|reason| EngineError::Unavailable { engine: "uffd", reason }),
        EngineKind::Mprotect | EngineKind::Log => Ok((kind, format!("{}: requested", kind.name()))),
    }
}

/// Builds a resolved engine (never `Auto`) over `region`.
/// Arms `kind` over `region`; `spin` is how long the uffd handler thread busy-polls for
/// the next fault before it sleeps.
pub fn build(
    kind: EngineKind,
    region: &Region,
    spin: std::time::Duration,
) -> Result<Box<dyn Tracker>, EngineError> {
    if kind != EngineKind::Log {
        region.no_huge_pages();
    }
    Ok(match kind {
        EngineKind::Mprotect => Box::new(mprotect::MprotectEngine::new(region)?),
        EngineKind::Uffd => Box::new(uffd::UffdEngine::new(region, spin)?),
        EngineKind::Scan => Box::new(scan::ScanEngine::new(region)?),
        EngineKind::Log => Box::new(log::LogEngine::new(region.page_size())),
        EngineKind::Auto => return build(resolve(kind)?.0, region, spin),
    })
}
