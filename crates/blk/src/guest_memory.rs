//! Guest memory as the vhost-user connection maps it, with the dirty log QEMU's
//! migration reads (a snapshot's device-state save and a settle are migrations: without
//! `LOG_SHMFD` QEMU refuses them). A leaf: the backend maps it, the requests and the
//! eviction notices read it, and a read request's data goes straight into it
//! ([`GuestBufs`], [`reads_direct`]), marking what it wrote in the dirty log.

use std::cell::Cell;

use vm_memory::bitmap::{BitmapSlice, BS};
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryAtomic, GuestMemoryMmap};
use vm_memory::{Permissions, VolatileSlice};

pub type Bitmap = vhost_user_backend::bitmap::BitmapMmapRegion;
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap<Bitmap>>;

/// A request's data buffers as this process maps them: guest memory, in the order of
/// the request's bytes.
pub struct GuestBufs<'a, B: BitmapSlice> {
    slices: Vec<VolatileSlice<'a, B>>,
    /// Where the last access ended (slice index, request offset of its first byte):
    /// the next one usually starts there.
    hint: Cell<(usize, usize)>,
}

/// The buffers of `runs` (guest physical address, length) in `mem`, or `None` if a
/// byte of them is not guest memory.
pub fn guest_bufs<'a, M: GuestMemory + ?Sized>(
    mem: &'a M,
    runs: &[(u64, u64)],
) -> Option<GuestBufs<'a, BS<'a, M::Bitmap>>> {
    let mut slices = Vec::with_capacity(runs.len());
    for &(gpa, len) in runs {
        let mut got = 0;
        for s in mem
            .get_slices(GuestAddress(gpa), len as usize, Permissions::Write)
            .ok()?
        {
            let s = s.ok()?;
            got += s.len();
            slices.push(s);
        }
        if got != len as usize {
            return None;
        }
    }
    Some(GuestBufs {
        slices,
        hint: Cell::new((0, 0)),
    })
}

impl<B: BitmapSlice> GuestBufs<'_, B> {
    /// Bytes in all the buffers.
    pub fn len(&self) -> usize {
        self.slices.iter().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Each slice touched by the `len` bytes at request offset `at`, with the part of it
    /// they cover (offset in the slice, length).
    fn each(&self, at: usize, len: usize, mut f: impl FnMut(&VolatileSlice<'_, B>, usize, usize)) {
        let (mut i, mut start) = self.hint.get();
        if at < start {
            (i, start) = (0, 0);
        }
        let end = at + len;
        while let Some(s) = self.slices.get(i) {
            if start >= end {
                break;
            }
            let from = at.max(start);
            let to = end.min(start + s.len());
            if from < to {
                f(s, from - start, to - from);
            }
            if start + s.len() > end {
                break;
            }
            start += s.len();
            i += 1;
        }
        self.hint.set((i, start));
    }

    /// Copies `data` into the buffers from request offset `at` (marking the pages dirty
    /// for a migration's log).
    pub fn copy_in(&self, at: usize, data: &[u8]) {
        let mut done = 0;
        self.each(at, data.len(), |s, off, n| {
            if let Ok(s) = s.subslice(off, n) {
                s.copy_from(&data[done..done + n]);
            }
            done += n;
        });
    }

    /// The host memory under the `len` bytes at request offset `at`, for a read
    /// straight into it ([`crate::disk::Disk::read_raw_at`]; the caller keeps `self`
    /// alive until that read returns, then calls [`GuestBufs::mark_dirty`]).
    pub fn iovecs(&self, at: usize, len: usize, out: &mut Vec<libc::iovec>) {
        self.each(at, len, |s, off, n| {
            out.push(libc::iovec {
                iov_base: (s.ptr_guard_mut().as_ptr() as usize + off) as *mut libc::c_void,
                iov_len: n,
            })
        });
    }

    /// Marks the `len` bytes at request offset `at` written, for a migration's dirty log.
    pub fn mark_dirty(&self, at: usize, len: usize) {
        self.each(at, len, |s, off, n| s.bitmap().mark_dirty(off, n));
    }
}

/// Whether a read may go from the disk straight into the memory `iov` describes:
/// when the host keeps no copy of what it reads (`fills_cache` false: a copy taken
/// from guest memory could change under the host), and every buffer's address and
/// length are multiples of `align` (what `O_DIRECT` needs), in at most one `preadv`'s
/// worth of buffers. Otherwise the read goes through the backend's own buffer.
pub fn reads_direct(fills_cache: bool, align: usize, iov: &[libc::iovec]) -> bool {
    !fills_cache
        && !iov.is_empty()
        && iov.len() <= libc::UIO_MAXIOV as usize
        && iov
            .iter()
            .all(|v| (v.iov_base as usize).is_multiple_of(align) && v.iov_len.is_multiple_of(align))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(runs: &[(usize, usize)]) -> Vec<libc::iovec> {
        runs.iter()
            .map(|&(a, n)| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: n,
            })
            .collect()
    }

    #[test]
    fn only_aligned_buffers_of_a_read_the_host_keeps_no_copy_of_go_direct() {
        let aligned = iov(&[(0x10_0000, 0x1_0000), (0x30_0000, 0x1000)]);
        assert!(reads_direct(false, 4096, &aligned));
        assert!(
            !reads_direct(true, 4096, &aligned),
            "a miss the cache keeps goes through the backend's buffer"
        );
        let address = iov(&[(0x10_0000, 0x1000), (0x30_0200, 0x1000)]);
        let length = iov(&[(0x10_0000, 0x1200), (0x30_0000, 0xe00)]);
        assert!(!reads_direct(false, 4096, &address));
        assert!(!reads_direct(false, 4096, &length));
        // A file without O_DIRECT takes any buffer.
        assert!(reads_direct(false, 1, &address) && reads_direct(false, 1, &length));
        assert!(!reads_direct(false, 1, &[]));
        let many = vec![(0x10_0000, 0x1000); libc::UIO_MAXIOV as usize + 1];
        assert!(!reads_direct(false, 4096, &iov(&many)));
    }

    #[test]
    fn bytes_land_at_their_offset_across_regions_and_runs() {
        // Two regions, so one run is split in two slices.
        let mem = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x1_0000),
            (GuestAddress(0x1_0000), 0x1_0000),
        ])
        .unwrap();
        let g = guest_bufs(&mem, &[(0xf000, 0x2000), (0x1000, 0x1000)]).unwrap();
        assert_eq!(g.len(), 0x3000);
        let data: Vec<u8> = (0..0x3000u32).map(|i| (i / 7) as u8).collect();
        g.copy_in(0x2000, &data[0x2000..]);
        g.copy_in(0, &data[..0x1800]);
        g.copy_in(0x1800, &data[0x1800..0x2000]);
        let mut v = Vec::new();
        g.iovecs(0x800, 0x2000, &mut v);
        assert_eq!(
            v.iter().map(|x| x.iov_len).collect::<Vec<_>>(),
            [0x800, 0x1000, 0x800]
        );
        let read = |gpa: u64, n: usize| {
            let mut b = vec![0u8; n];
            vm_memory::Bytes::read_slice(&mem, &mut b, GuestAddress(gpa)).unwrap();
            b
        };
        assert_eq!(read(0xf000, 0x2000), data[..0x2000]);
        assert_eq!(read(0x1000, 0x1000), data[0x2000..]);
        assert!(
            guest_bufs(&mem, &[(0x1_f000, 0x2000)]).is_none(),
            "past the end"
        );
    }

    #[test]
    fn a_read_straight_into_guest_memory_lands_and_is_in_the_dirty_log() {
        use vm_memory::bitmap::{AtomicBitmap, Bitmap as _};
        use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let content: Vec<u8> = (0..0x4000u32).map(|i| (i * 31 / 4096) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let disk = crate::disk::Disk::open(&path, true, true).unwrap();
        let mem =
            GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let g = guest_bufs(&mem, &[(0x8000, 0x2000), (0x2000, 0x1000)]).unwrap();
        let mut v = Vec::new();
        g.iovecs(0, 0x3000, &mut v);
        assert!(reads_direct(false, disk.align(), &v));
        // SAFETY: `v` is `mem`'s mapping of those guest pages, alive past the call; no
        // reference points into it.
        unsafe { disk.read_raw_at(&mut v, 0x1000) }.unwrap();
        g.mark_dirty(0, 0x3000);
        let mut got = vec![0u8; 0x3000];
        mem.read_slice(&mut got[..0x2000], GuestAddress(0x8000))
            .unwrap();
        mem.read_slice(&mut got[0x2000..], GuestAddress(0x2000))
            .unwrap();
        assert_eq!(got, content[0x1000..0x4000]);
        let region = mem.find_region(GuestAddress(0)).unwrap();
        let dirty: Vec<usize> = (0..0x10_0000)
            .step_by(0x1000)
            .filter(|&a| region.bitmap().dirty_at(a))
            .collect();
        assert_eq!(dirty, [0x2000, 0x8000, 0x9000]);
    }
}
