//! The memory a heap tracks: a fresh anonymous mapping or memory the caller declares.

use std::io;

/// Errors of region setup.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// The size is zero or does not fit the address space.
    #[error("region size {0} is zero or too large")]
    BadSize(usize),
    /// Declared memory must start on a page boundary and span whole pages.
    #[error("declared memory {addr:#x}+{len:#x} is not page aligned (page size {page})")]
    Unaligned {
        addr: usize,
        len: usize,
        page: usize,
    },
    /// mmap refused the mapping.
    #[error("mmap of {len} bytes failed")]
    Mmap {
        len: usize,
        #[source]
        source: io::Error,
    },
}

/// A page-aligned span of memory: either mapped by us (unmapped on drop) or declared.
pub struct Region {
    ptr: *mut u8,
    len: usize,
    page: usize,
    owned: bool,
}

// SAFETY: a Region is a plain address range; which threads touch it is governed by Heap.
unsafe impl Send for Region {}

impl Region {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed private anonymous memory.
    pub fn map(len: usize, page: usize) -> Result<Region, RegionError> {
        let len = round_up(len, page).ok_or(RegionError::BadSize(len))?;
        let ptr = map_anon(len)?;
        Ok(Region {
            ptr,
            len,
            page,
            owned: true,
        })
    }

    /// Wraps memory the caller owns.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be readable and writable private anonymous memory that stays
    /// mapped, and is touched by nobody else in a way that conflicts with dirty tracking,
    /// until the Region is dropped.
    pub unsafe fn declare(ptr: *mut u8, len: usize, page: usize) -> Result<Region, RegionError> {
        if len == 0 {
            return Err(RegionError::BadSize(len));
        }
        if !(ptr as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(RegionError::Unaligned {
                addr: ptr as usize,
                len,
                page,
            });
        }
        Ok(Region {
            ptr,
            len,
            page,
            owned: false,
        })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn page_size(&self) -> usize {
        self.page
    }
    pub fn pages(&self) -> usize {
        self.len / self.page
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the region is readable for `len` bytes while it lives (map/declare contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and writable; &mut self makes this the only Rust reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Asks the kernel not to back the region with transparent huge pages: a 2 MiB page
    /// is written, reported and re-protected as a whole, which would turn a one-byte write
    /// into 512 dirty pages. Advisory: failure only costs precision.
    pub fn no_huge_pages(&self) {
        // SAFETY: madvise on our own range changes only the THP policy, not contents.
        unsafe { libc::madvise(self.ptr.cast(), self.len, libc::MADV_NOHUGEPAGE) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we mapped exactly this range in `map` and nobody else unmaps it.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

/// An anonymous private mapping used as the shadow (last committed state).
pub struct Shadow {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the shadow is private to its Heap.
unsafe impl Send for Shadow {}

impl Shadow {
    /// A zeroed shadow (the kernel backs untouched pages with the zero page).
    pub fn zeroed(len: usize) -> Result<Shadow, RegionError> {
        let ptr = map_anon(len)?;
        // Unlike the heap, nothing tracks the shadow's pages: 2 MiB pages spare the diff a
        // TLB miss per dirty page. Advisory: without them it is only slower.
        // SAFETY: madvise on our own fresh range changes only the THP policy.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        Ok(Shadow { ptr, len })
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: we own this mapping of `len` readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: we own this mapping of `len` writable bytes until drop; &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range and nobody else unmaps it.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn map_anon(len: usize) -> Result<*mut u8, RegionError> {
    // SAFETY: a fresh private anonymous mapping at a kernel-chosen address aliases nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(RegionError::Mmap {
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok(p.cast())
}

pub fn round_up(len: usize, page: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    len.checked_add(page - 1).map(|l| l / page * page)
}
