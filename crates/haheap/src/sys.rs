//! Kernel ABI for userfaultfd write-protection, and `/proc/self/pagemap` for the
//! `PAGEMAP_SCAN` ioctl (whose ABI is `rebound-pagemap`'s).
//!
//! Debian 12's 6.1 user headers lack `UFFD_FEATURE_WP_UNPOPULATED` and
//! `UFFD_FEATURE_WP_ASYNC`, so the structs and numbers are written out here from the Linux
//! uapi (`include/uapi/linux/userfaultfd.h`) and pinned with size assertions. The kernel
//! decides at run time what it supports.

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Errors of the kernel calls in this module.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// Creating a userfaultfd failed by syscall, through /dev/userfaultfd and in user-mode-only form.
    #[error("userfaultfd unavailable: syscall: {syscall}; /dev/userfaultfd: {dev}; user-mode-only syscall: {user_only}{hint}")]
    NoUserfaultfd {
        syscall: io::Error,
        dev: io::Error,
        user_only: io::Error,
        hint: &'static str,
    },
    /// The UFFDIO_API handshake failed.
    #[error("UFFDIO_API handshake failed")]
    Api(#[source] io::Error),
    /// The kernel lacks a userfaultfd feature we asked for.
    #[error("kernel lacks userfaultfd feature(s) {missing:#x}")]
    MissingFeature { missing: u64 },
    /// A userfaultfd ioctl on a range failed.
    #[error("{what} of {len} bytes at {start:#x} failed")]
    RangeIoctl {
        what: &'static str,
        start: u64,
        len: u64,
        #[source]
        source: io::Error,
    },
    /// Opening /proc/self/pagemap failed.
    #[error("cannot open /proc/self/pagemap")]
    Pagemap(#[source] io::Error),
    /// The PAGEMAP_SCAN ioctl failed.
    #[error("PAGEMAP_SCAN over {start:#x}..{end:#x} failed")]
    Scan {
        start: u64,
        end: u64,
        #[source]
        source: io::Error,
    },
}

const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (ty << 8) | nr
}
const IOC_NONE: u64 = 0;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const UFFDIO: u64 = 0xAA;

pub(crate) const UFFD_API: u64 = 0xAA;
pub(crate) const UFFD_USER_MODE_ONLY: i32 = 1;
pub(crate) const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
pub(crate) const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
pub(crate) const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
pub(crate) const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
pub(crate) const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub(crate) const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Default)]
pub struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}
/// `struct uffdio_range`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct UffdioRange {
    pub start: u64,
    pub len: u64,
}
/// `struct uffdio_register`.
#[repr(C)]
#[derive(Default)]
pub struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}
/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Default)]
pub struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}
/// `struct uffd_msg` with the pagefault arm of its union (the only event we register for).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct UffdMsg {
    pub event: u8,
    pub reserved1: u8,
    pub reserved2: u16,
    pub reserved3: u32,
    pub pf_flags: u64,
    pub pf_address: u64,
    pub pf_ptid: u32,
    pub pad: u32,
}
const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, UFFDIO, 0x01, 16);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x06, 24);
const USERFAULTFD_IOC_NEW: u64 = ioc(IOC_NONE, UFFDIO, 0x00, 0);
// Known values from the C headers (checked on Debian 12 with gcc): catch a slip in `ioc`.
const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);

/// A userfaultfd after a successful `UFFDIO_API` handshake.
pub struct Uffd {
    fd: OwnedFd,
    access: Access,
}

impl Uffd {
    /// Opens a userfaultfd (non-blocking, close-on-exec) and negotiates `features`.
    ///
    /// Tries the syscall first; when that is refused (unprivileged userfaultfd is off and we
    /// lack CAP_SYS_PTRACE) falls back to `/dev/userfaultfd`, which its file mode may allow,
    /// then to a user-mode-only descriptor.
    pub fn open(features: u64) -> Result<Uffd, SysError> {
        let (fd, access) = open_raw()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: `fd` is a fresh userfaultfd and `api` is a live, correctly sized uffdio_api
        // that the kernel reads and writes during the call only.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) };
        if rc != 0 {
            let err = io::Error::last_os_error();
            // The kernel answers EINVAL when it does not know a requested feature bit.
            if err.raw_os_error() == Some(libc::EINVAL) {
                return Err(SysError::MissingFeature { missing: features });
            }
            return Err(SysError::Api(err));
        }
        if api.features & features != features {
            return Err(SysError::MissingFeature {
                missing: features & !api.features,
            });
        }
        Ok(Uffd { fd, access })
    }

    /// How the descriptor was obtained.
    pub fn access(&self) -> Access {
        self.access
    }

    pub fn raw(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Registers `[start, start+len)` for write-protect tracking.
    ///
    /// # Safety
    /// The range must be private anonymous (or shmem) memory owned by the caller for as long
    /// as it stays registered: from now on writes to it fault into this userfaultfd, and with
    /// synchronous write-protect somebody must resolve them or the writer blocks forever.
    pub unsafe fn register_wp(&self, start: u64, len: u64) -> Result<(), SysError> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: `reg` is a live uffdio_register; the caller vouched for the range.
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_REGISTER as _, &mut reg) };
        check(rc, "UFFDIO_REGISTER", start, len)
    }

    /// Unregisters a range; this also drops its write-protection.
    pub fn unregister(&self, start: u64, len: u64) -> Result<(), SysError> {
        let mut range = UffdioRange { start, len };
        // SAFETY: `range` is a live uffdio_range; unregistering only relaxes tracking.
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_UNREGISTER as _, &mut range) };
        check(rc, "UFFDIO_UNREGISTER", start, len)
    }

    /// Sets (`protect`) or clears write-protection on a registered range. Clearing also wakes
    /// threads blocked on a synchronous fault in it.
    pub fn writeprotect(&self, start: u64, len: u64, protect: bool) -> Result<(), SysError> {
        let mode = if protect {
            UFFDIO_WRITEPROTECT_MODE_WP
        } else {
            0
        };
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode,
        };
        // SAFETY: `wp` is a live uffdio_writeprotect; the range was registered by our owner
        // (the kernel refuses unregistered ranges with ENOENT).
        let rc = unsafe { libc::ioctl(self.raw(), UFFDIO_WRITEPROTECT as _, &mut wp) };
        check(rc, "UFFDIO_WRITEPROTECT", start, len)
    }

    /// Reads pending fault messages into `buf`; returns how many (0 when none is pending).
    pub fn read_msgs(&self, buf: &mut [UffdMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is writable memory of `bytes` bytes made of plain-data UffdMsg.
        let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return if err.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(err)
            };
        }
        Ok(n as usize / std::mem::size_of::<UffdMsg>())
    }
}

fn check(rc: i32, what: &'static str, start: u64, len: u64) -> Result<(), SysError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError::RangeIoctl {
            what,
            start,
            len,
            source: io::Error::last_os_error(),
        })
    }
}

fn open_raw() -> Result<(OwnedFd, Access), SysError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let syscall = match uffd_syscall(flags) {
        Ok(fd) => return Ok((fd, Access::Syscall)),
        Err(e) => e,
    };
    let dev = match OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes the new fd's flags by value.
            let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                // SAFETY: the ioctl just returned this descriptor and nothing else owns it.
                return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, Access::Device));
            }
            io::Error::last_os_error()
        }
        Err(e) => e,
    };
    // Without privilege the kernel still allows a userfaultfd that only sees faults from
    // user mode: enough for tracking stores, while a syscall writing into a protected
    // page gets EFAULT (sync mode) instead of waiting for us.
    let user_only = match uffd_syscall(flags | UFFD_USER_MODE_ONLY) {
        Ok(fd) => return Ok((fd, Access::UserModeOnly)),
        Err(e) => e,
    };
    let hint = if syscall.raw_os_error() == Some(libc::EPERM) {
        " (unprivileged userfaultfd is off: vm.unprivileged_userfaultfd=0; run with CAP_SYS_PTRACE or grant access to /dev/userfaultfd)"
    } else {
        ""
    };
    Err(SysError::NoUserfaultfd {
        syscall,
        dev,
        user_only,
        hint,
    })
}

fn uffd_syscall(flags: i32) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes only flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall just returned this descriptor and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// How a userfaultfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The userfaultfd syscall with full rights.
    Syscall,
    /// Through /dev/userfaultfd.
    Device,
    /// The syscall with UFFD_USER_MODE_ONLY (unprivileged).
    UserModeOnly,
}

impl Access {
    pub fn describe(self) -> &'static str {
        match self {
            Access::Syscall => "userfaultfd syscall",
            Access::Device => "/dev/userfaultfd",
            Access::UserModeOnly => "userfaultfd syscall, user-mode faults only (unprivileged)",
        }
    }
}

pub use rebound_pagemap::PageRegion;

/// `/proc/self/pagemap`, for the `PAGEMAP_SCAN` ioctl.
pub struct Pagemap(rebound_pagemap::Pagemap);

impl Pagemap {
    pub fn open() -> Result<Pagemap, SysError> {
        rebound_pagemap::Pagemap::open_self()
            .map(Pagemap)
            .map_err(SysError::Pagemap)
    }

    /// One `PAGEMAP_SCAN` call over `[start, end)` reporting pages whose categories match
    /// `category_mask`. Fills `vec`; returns how many regions were filled and where the
    /// walk stopped (less than `end` when `vec` filled up).
    pub fn scan(
        &self,
        start: u64,
        end: u64,
        flags: u64,
        category_mask: u64,
        vec: &mut [PageRegion],
    ) -> Result<(usize, u64), SysError> {
        let q = rebound_pagemap::Query {
            flags,
            all_of: category_mask,
            report: category_mask,
            ..Default::default()
        };
        self.0
            .scan(start, end, &q, vec)
            .map_err(|source| SysError::Scan { start, end, source })
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory side effects.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if ps > 0 {
        ps as usize
    } else {
        4096
    }
}

/// Whether soft-dirty tracking exists: with `CONFIG_MEM_SOFT_DIRTY` every new mapping shows
/// the `sd` flag in `/proc/self/smaps`' VmFlags. Read-only, unlike poking `clear_refs`.
pub fn soft_dirty_available() -> bool {
    std::fs::read_to_string("/proc/self/smaps")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "sd"))
        })
        .unwrap_or(false)
}

/// Kernel release string, for reason messages.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it completely on success.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a live utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    // SAFETY: uname NUL-terminates `release` within its fixed array.
    unsafe { CStr::from_ptr(uts.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
