//! The backing file: a raw image read and written at offsets, with `O_DIRECT` where
//! the filesystem allows it (so the host page cache does not hold a second copy of
//! what the guest and our cache already hold).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Alignment `O_DIRECT` needs of buffers, offsets and lengths here.
pub const DIRECT_ALIGN: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot open {0}")]
    Open(PathBuf, #[source] std::io::Error),
    #[error("{0} is not a raw image: it starts with the {1} magic (the backend serves raw images; convert it with `qemu-img convert -O raw`)")]
    NotRaw(PathBuf, &'static str),
    #[error("{0} is empty")]
    Empty(PathBuf),
}

/// A raw disk image.
pub struct Disk {
    file: File,
    size: u64,
    direct: bool,
    readonly: bool,
}

impl Disk {
    /// Opens `path`; `direct` asks for `O_DIRECT` (dropped, and said, where the
    /// filesystem refuses it, e.g. tmpfs).
    pub fn open(path: &Path, readonly: bool, direct: bool) -> Result<Disk, DiskError> {
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(!readonly)
                .custom_flags(flags)
                .open(path)
        };
        let (file, direct) = match direct {
            true => match open(libc::O_DIRECT) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(
                        "{}: no O_DIRECT on this filesystem, buffered I/O",
                        path.display()
                    );
                    (open(0).map_err(|e| DiskError::Open(path.into(), e))?, false)
                }
                Err(e) => return Err(DiskError::Open(path.into(), e)),
            },
            false => (open(0).map_err(|e| DiskError::Open(path.into(), e))?, false),
        };
        let size = file
            .metadata()
            .map_err(|e| DiskError::Open(path.into(), e))?
            .len();
        if size == 0 {
            return Err(DiskError::Empty(path.into()));
        }
        let disk = Disk {
            file,
            size,
            direct,
            readonly,
        };
        let mut head = AlignedBuf::new(DIRECT_ALIGN);
        if disk.read_at(head.as_mut(), 0).is_ok() {
            if let Some(fmt) = image_magic(head.as_ref()) {
                return Err(DiskError::NotRaw(path.into(), fmt));
            }
        }
        Ok(disk)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn readonly(&self) -> bool {
        self.readonly
    }

    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Reads `buf.len()` bytes at `offset`; the part past the end of the file reads
    /// as zeros (a sparse tail).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.file.read_at(&mut buf[done..], offset + done as u64)?;
            if n == 0 {
                buf[done..].fill(0);
                break;
            }
            done += n;
        }
        Ok(())
    }

    /// What `O_DIRECT` needs of a buffer's address and length here (1: nothing).
    pub fn align(&self) -> usize {
        match self.direct {
            true => DIRECT_ALIGN,
            false => 1,
        }
    }

    /// [`Disk::read_at`] into the memory `iov` describes, in one `preadv` when it can
    /// (each buffer's address and length a multiple of [`Disk::align`] for that).
    ///
    /// # Safety
    ///
    /// Every `iovec` must describe memory this process maps writable for its whole
    /// length until the call returns, and no Rust reference may point into it meanwhile
    /// (the kernel and, here, `write_bytes` write through raw pointers).
    pub unsafe fn read_raw_at(
        &self,
        mut iov: &mut [libc::iovec],
        mut offset: u64,
    ) -> std::io::Result<()> {
        while !iov.is_empty() {
            let n = iov.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
            // SAFETY: the caller's promise on `iov`: the kernel writes only inside it.
            let r = unsafe {
                libc::preadv(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    n,
                    offset as libc::off_t,
                )
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                // Past the end of the file: zeros, as `read_at` gives.
                for v in iov.iter() {
                    // SAFETY: the caller's promise on `iov`.
                    unsafe { std::ptr::write_bytes(v.iov_base as *mut u8, 0, v.iov_len) };
                }
                return Ok(());
            }
            offset += r as u64;
            let mut left = r as usize;
            while let Some(v) = iov.first_mut() {
                if left < v.iov_len {
                    v.iov_base = (v.iov_base as usize + left) as *mut libc::c_void;
                    v.iov_len -= left;
                    break;
                }
                left -= v.iov_len;
                iov = &mut std::mem::take(&mut iov)[1..];
            }
        }
        Ok(())
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Deallocates (`unmap`) or zeroes a range; either way it reads as zeros after.
    pub fn zero_range(&self, offset: u64, len: u64, unmap: bool) -> std::io::Result<()> {
        let mode = if unmap {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        // SAFETY: fallocate on a file this struct owns; no memory is passed.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(e);
        }
        // A filesystem without the mode: write the zeros.
        let chunk = AlignedBuf::new(1 << 20);
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(chunk.len() as u64) as usize;
            self.write_at(&chunk.as_ref()[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
}

/// The format a header's magic names, if it is not raw data.
fn image_magic(head: &[u8]) -> Option<&'static str> {
    match head.get(..4)? {
        b"QFI\xfb" => Some("qcow2"),
        b"KDMV" => Some("vmdk"),
        b"conectix" if head.len() >= 8 => Some("vhd"),
        _ => None,
    }
}

/// A zeroed buffer aligned for `O_DIRECT`.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is owned memory with no interior sharing; moving it between
// threads moves the ownership.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` bytes rounded up to the alignment (at least one block).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN;
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, DIRECT_ALIGN).expect("a valid layout")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialized (zeroed at allocation) bytes that live
        // as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qcow2_image_is_refused_by_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.img");
        let mut head = vec![0u8; 8192];
        head[..4].copy_from_slice(b"QFI\xfb");
        std::fs::write(&p, &head).unwrap();
        let e = Disk::open(&p, false, false).err().unwrap().to_string();
        assert!(e.contains("qcow2") && e.contains("raw"), "{e}");
        std::fs::write(&p, b"").unwrap();
        let e = Disk::open(&p, false, false).err().unwrap().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn reads_past_the_end_are_zeros_and_zero_range_zeroes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.img");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        let disk = Disk::open(&p, false, true).unwrap();
        let mut b = AlignedBuf::new(8192);
        disk.read_at(b.as_mut(), 4096).unwrap();
        assert!(b.as_ref()[..4096].iter().all(|x| *x == 7));
        assert!(b.as_ref()[4096..].iter().all(|x| *x == 0));
        disk.zero_range(0, 4096, true).unwrap();
        disk.read_at(b.as_mut(), 0).unwrap();
        assert!(b.as_ref()[..4096].iter().all(|x| *x == 0));
        assert!(b.as_ref()[4096..].iter().all(|x| *x == 7));
    }
}
