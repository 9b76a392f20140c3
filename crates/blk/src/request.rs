//! One virtio-blk request: its descriptor chain read into a header, data and a status
//! byte, executed against the disk through the cache, and answered.
//!
//! Everything in a chain comes from the guest and is checked before use: a header too
//! short, a chain without a writable status byte, data not in whole sectors, beyond
//! the disk's end or larger than the limits the device advertised is answered with an
//! error status (or, without a status byte, dropped) and the backend goes on.

use std::io::{Read, Write};
use std::ops::Deref;

use virtio_bindings::virtio_blk::*;
use virtio_queue::DescriptorChain;
use vm_memory::{ByteValued, GuestMemory};

use crate::cache::Cache;
use crate::config::{MAX_DISCARD_SECTORS, MAX_DISCARD_SEG, SECTOR, SEG_MAX, SIZE_MAX};
use crate::disk::{AlignedBuf, Disk};
use crate::exclusive::{pages_of, PageMap, Refusal, SlotRef};
use crate::faults::{skipped, Check};
use crate::guest_memory::Mem;
use crate::ring::NoticeSink;
use crate::units::{BLOCK, PAGE};

/// The request header (virtio 1.2, 5.2.6).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct Header {
    kind: u32,
    ioprio: u32,
    sector: u64,
}
const _: () = assert!(std::mem::size_of::<Header>() == 16);
// SAFETY: integers only, no padding (asserted size), any byte pattern is valid.
unsafe impl ByteValued for Header {}

/// One range of a discard or write-zeroes request.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct Segment {
    sector: u64,
    num_sectors: u32,
    flags: u32,
}
const _: () = assert!(std::mem::size_of::<Segment>() == 16);
// SAFETY: as for `Header`.
unsafe impl ByteValued for Segment {}

/// The most data one request may move: what the advertised limits allow.
const MAX_DATA: usize = SIZE_MAX as usize * SEG_MAX as usize;

/// A disk as the request loop sees it.
pub struct Device {
    pub disk: Disk,
    pub cache: Cache,
    /// Answer to `GET_ID` (up to 20 bytes; the guest's `serial`).
    pub serial: Vec<u8>,
    /// Which guest page holds which block, from every request served.
    pub pages: std::sync::Mutex<PageMap>,
    /// The guest's memory as the current vhost-user connection mapped it (notices are
    /// checked against it).
    pub mem: std::sync::RwLock<Option<Mem>>,
    /// What became of eviction notices.
    pub notices: crate::exclusive::NoticeStats,
    /// The guest's eviction-notice ring, when the daemon said where it is.
    pub ring: crate::ring::GuestRing,
}

/// What an eviction notice brings of its page.
#[derive(Debug, Clone, Copy)]
pub enum Page<'a> {
    /// Nothing: the page is read from guest memory when the notice is checked.
    InGuest,
    /// The guest's copy, taken as it let the page go ([`Device::take_copies`]), or why
    /// it could not be had.
    Copy(Result<&'a [u8], Refusal>),
}

fn read_guest<M: GuestMemory>(mem: &M, gpa: u64, out: &mut [u8]) -> bool {
    vm_memory::Bytes::read_slice(mem, out, vm_memory::GuestAddress(gpa)).is_ok()
}

/// The guest buffers of a request's data, as (guest physical address, length) runs.
struct Buffers {
    readable: Vec<(u64, u64)>,
    writable: Vec<(u64, u64)>,
}

impl Buffers {
    fn of<T>(chain: &DescriptorChain<T>) -> Buffers
    where
        T: Deref + Clone,
        T::Target: GuestMemory + Sized,
    {
        let (mut readable, mut writable) = (Vec::new(), Vec::new());
        for d in chain.clone() {
            let run = (d.addr().0, d.len() as u64);
            match d.is_write_only() {
                true => writable.push(run),
                false => readable.push(run),
            }
        }
        Buffers { readable, writable }
    }

    /// `len` bytes of `runs` after the first `skip`.
    fn window(runs: &[(u64, u64)], mut skip: u64, mut len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for &(a, l) in runs {
            if len == 0 {
                break;
            }
            if skip >= l {
                skip -= l;
                continue;
            }
            let take = (l - skip).min(len);
            out.push((a + skip, take));
            len -= take;
            skip = 0;
        }
        out
    }
}

/// Why a request failed (its status is `IOERR` or `UNSUPP`).
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("malformed request: {0}")]
    Bad(String),
    #[error("I/O error: {0}")]
    Io(std::io::Error),
}

impl Device {
    /// Executes the request in `chain`; returns the bytes written into the guest's
    /// buffers (data and status), what the used ring reports.
    pub fn execute<T>(&self, chain: DescriptorChain<T>) -> u32
    where
        T: Deref + Clone,
        T::Target: GuestMemory + Sized,
    {
        let mem = chain.memory();
        // Every eviction the guest noted before it sent this request comes first: a
        // read of a block it just evicted then finds it in the host cache.
        if !skipped(Check::Order) {
            self.ring.drain(self, mem);
        }
        let (Ok(mut reader), Ok(mut data)) = (chain.clone().reader(mem), chain.clone().writer(mem))
        else {
            tracing::warn!("a descriptor chain outside guest memory: dropped");
            return 0;
        };
        let total = data.available_bytes();
        if total == 0 {
            tracing::warn!("a request without a status byte: dropped");
            return 0;
        }
        let Ok(mut status) = data.split_at(total - 1) else {
            return 0;
        };
        let bufs = Some(Buffers::of(&chain));
        let r = match reader.read_obj::<Header>() {
            Ok(h) => self.run(h, &mut reader, &mut data, bufs.as_ref()),
            Err(_) => Err(Failed::Bad("a header shorter than 16 bytes".into())),
        };
        let code = match &r {
            Ok(_) => VIRTIO_BLK_S_OK,
            Err(Failed::Unsupported(_)) => VIRTIO_BLK_S_UNSUPP,
            Err(_) => VIRTIO_BLK_S_IOERR,
        };
        match &r {
            // The backing file failed: the guest sees an I/O error for this request.
            Err(e @ Failed::Io(_)) => tracing::warn!("{e}"),
            Err(e) => tracing::debug!("{e}"),
            Ok(_) => {}
        }
        let written = r.unwrap_or(0);
        if status.write_all(&[code as u8]).is_err() {
            return 0;
        }
        (written + 1) as u32
    }

    /// Returns the data bytes written to the guest.
    fn run<R: Read + Available, W: Write + Available>(
        &self,
        h: Header,
        reader: &mut R,
        data: &mut W,
        bufs: Option<&Buffers>,
    ) -> Result<usize, Failed> {
        match h.kind {
            VIRTIO_BLK_T_IN => {
                let len = data.available();
                let off = self.range(h.sector, len)?;
                let gens = self.gens(off, len as u64);
                with_buf(len, |buf| {
                    self.read(buf, off).map_err(Failed::Io)?;
                    data.write_all(buf).map_err(Failed::Io)?;
                    let runs = bufs.map(|b| Buffers::window(&b.writable, 0, len as u64));
                    self.map_pages(runs, off, buf, &gens, 0);
                    Ok(())
                })?;
                Ok(len)
            }
            VIRTIO_BLK_T_OUT => {
                if self.disk.readonly() {
                    return Err(Failed::Bad("a write to a read-only disk".into()));
                }
                let len = reader.available();
                let off = self.range(h.sector, len)?;
                let gens = self.gens(off, len as u64);
                with_buf(len, |buf| {
                    reader.read_exact(buf).map_err(Failed::Io)?;
                    let r = self.write(buf, off).map_err(Failed::Io);
                    let runs = bufs.map(|b| Buffers::window(&b.readable, 16, len as u64));
                    match &r {
                        // This write's own two steps of the generation.
                        Ok(()) => self.map_pages(runs, off, buf, &gens, 2),
                        Err(_) => self.forget(off, len as u64),
                    }
                    r
                })?;
                Ok(0)
            }
            VIRTIO_BLK_T_FLUSH => {
                self.disk.flush().map_err(Failed::Io)?;
                Ok(0)
            }
            VIRTIO_BLK_T_GET_ID => {
                let n = self.serial.len().min(VIRTIO_BLK_ID_BYTES as usize);
                let n = n.min(data.available());
                data.write_all(&self.serial[..n]).map_err(Failed::Io)?;
                Ok(n)
            }
            VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES if !self.disk.readonly() => {
                let n = reader.available() / std::mem::size_of::<Segment>();
                if n == 0 || n > MAX_DISCARD_SEG as usize {
                    return Err(Failed::Bad(format!("{n} discard segments")));
                }
                for _ in 0..n {
                    let mut s = Segment::default();
                    reader.read_exact(s.as_mut_slice()).map_err(Failed::Io)?;
                    if s.num_sectors > MAX_DISCARD_SECTORS {
                        return Err(Failed::Bad(format!("{} sectors to discard", s.num_sectors)));
                    }
                    let len = s.num_sectors as usize * SECTOR as usize;
                    let off = self.range(s.sector, len)?;
                    let unmap = h.kind == VIRTIO_BLK_T_DISCARD || s.flags & 1 != 0;
                    let r = self.zero(off, len as u64, unmap).map_err(Failed::Io);
                    self.forget(off, len as u64);
                    r?;
                }
                Ok(0)
            }
            k => Err(Failed::Unsupported(k)),
        }
    }

    /// The page map, kept in either mode: when the cache becomes exclusive, what the
    /// guest holds already is mapped, so its evictions can be admitted (and traced)
    /// from the first one. Without it, every page the guest read before the switch was
    /// refused on eviction as unmapped, and read again from the disk.
    fn tracking(&self) -> Option<&std::sync::Mutex<PageMap>> {
        Some(&self.pages)
    }

    /// Changes the host cache's size and mode. Mappings stay: each was made by the
    /// same checks in either mode.
    pub fn reconfigure(&self, bytes: u64, exclusive: bool) {
        self.cache.reconfigure(bytes, exclusive);
    }

    /// The generations of the blocks under `off..off + len` before an I/O moves them.
    fn gens(&self, off: u64, len: u64) -> Vec<u64> {
        match self.tracking() {
            Some(_) if len > 0 => {
                let first = off / BLOCK;
                (first..(off + len).div_ceil(BLOCK))
                    .map(|b| self.cache.gen_of(b))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// After data moved between the guest buffers `runs` and the disk at `off`: each
    /// whole, aligned block now maps its page, provided no write but this request's own
    /// (`own` steps of the generation: 2 for a write, 0 for a read) began meanwhile;
    /// every other block touched loses its mapping.
    fn map_pages(
        &self,
        runs: Option<Vec<(u64, u64)>>,
        off: u64,
        data: &[u8],
        before: &[u64],
        own: u64,
    ) {
        let (Some(pages), Some(runs)) = (self.tracking(), runs) else {
            return;
        };
        let (whole, partial) = pages_of(&runs, off);
        let first = off / BLOCK;
        let mut map = pages.lock().expect("page map lock");
        for (pfn, block) in whole {
            let now = self.cache.gen_of(block);
            let then = before.get((block - first) as usize).copied();
            if then.map(|g| g.wrapping_add(own)) != Some(now) {
                map.forget_block(block);
                continue;
            }
            let at = (block * BLOCK - off) as usize;
            map.on_io(pfn, block, &data[at..at + BLOCK as usize], now);
        }
        for block in partial {
            map.forget_block(block);
        }
    }

    /// Blocks under `off..off + len` lose their mappings (discarded, zeroed, a failed
    /// write).
    fn forget(&self, off: u64, len: u64) {
        let Some(pages) = self.tracking() else { return };
        let mut map = pages.lock().expect("page map lock");
        for b in off / BLOCK..(off + len).div_ceil(BLOCK) {
            map.forget_block(b);
        }
    }

    /// An eviction notice from the guest for page `pfn`, checked against `mem`:
    /// admitted into the exclusive cache if every check of [`PageMap::evicted`] (or,
    /// with the guest's copy of the page, [`PageMap::evicted_copy`]) and
    /// [`Cache::admit_evicted`] passes.
    pub fn evicted_in<M: GuestMemory>(&self, pfn: u64, page: Page, mem: &M) -> Result<(), Refusal> {
        let r = self.check_evicted(pfn, page, mem);
        self.notices.count(r);
        r
    }

    fn check_evicted<M: GuestMemory>(&self, pfn: u64, page: Page, mem: &M) -> Result<(), Refusal> {
        let Some(pages) = self.tracking() else {
            return Err(Refusal::NoMapping);
        };
        let e = match page {
            Page::Copy(copy) => {
                let e = pages
                    .lock()
                    .expect("page map lock")
                    .evicted_copy(pfn, copy?);
                if let Ok(e) = &e {
                    // The access log's eviction, which the curve below the guest needs.
                    self.cache.record_eviction(e.block);
                }
                e?
            }
            Page::InGuest => {
                let mut map = pages.lock().expect("page map lock");
                // The guest let go of the block this page held (admitted or not).
                if let Some(block) = map.holds(pfn) {
                    self.cache.record_eviction(block);
                }
                map.evicted(pfn, |out| {
                    pfn.checked_mul(PAGE)
                        .is_some_and(|a| read_guest(mem, a, out))
                })?
            }
        };
        self.cache.admit_evicted(&e)
    }

    /// The guest's copies of evicted pages, read all at once before anything else is
    /// done with them (the guest reuses a slot as soon as 1,024 later notices came): a
    /// copy counts only if its notice's seq word still says so after every copy was
    /// read (the guest clears it before it overwrites the slot).
    pub fn take_copies<M: GuestMemory>(
        copies: &[SlotRef],
        mem: &M,
    ) -> Vec<Result<Box<[u8]>, Refusal>> {
        let mut out: Vec<Result<Box<[u8]>, Refusal>> = copies
            .iter()
            .map(|c| {
                let mut data = vec![0u8; PAGE as usize].into_boxed_slice();
                match read_guest(mem, c.data_gpa, &mut data) {
                    true => Ok(data),
                    false => Err(Refusal::Unreadable),
                }
            })
            .collect();
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        for (c, o) in copies.iter().zip(out.iter_mut()) {
            let mut seq = [0u8; 8];
            if o.is_ok() && !read_guest(mem, c.seq_gpa, &mut seq) {
                *o = Err(Refusal::Unreadable);
            } else if o.is_ok() && u64::from_le_bytes(seq) != c.seq && !skipped(Check::CopySeq) {
                *o = Err(Refusal::Overwritten);
            }
        }
        out
    }

    /// Eviction notices for `pfns` (with the guest's copies of the pages, in the same
    /// order, or none), checked against `mem`.
    pub fn evictions_in<M: GuestMemory>(
        &self,
        pfns: &[u64],
        copies: &[SlotRef],
        mem: &M,
    ) -> Vec<Result<(), Refusal>> {
        let taken = Device::take_copies(copies, mem);
        pfns.iter()
            .enumerate()
            .map(|(i, &pfn)| {
                let page = match taken.get(i) {
                    Some(c) => Page::Copy(c.as_deref().map_err(|e| *e)),
                    None => Page::InGuest,
                };
                self.evicted_in(pfn, page, mem)
            })
            .collect()
    }

    /// Follows the guest's ring at `gpa` (see [`crate::ring`]) and takes what it holds.
    pub fn follow_ring(&self, gpa: u64, bytes: u64) -> Result<crate::ring::RingCounts, String> {
        use vm_memory::GuestAddressSpace;
        let Some(m) = self.mem.read().expect("mem lock").clone() else {
            return Err(
                "no guest is connected: there is no guest memory to read the ring from".into(),
            );
        };
        let mem = m.memory();
        self.ring
            .set(gpa, bytes, &*mem)
            .map_err(|e| e.to_string())?;
        self.ring.drain(self, &*mem);
        Ok(self.ring.counts())
    }

    /// A release notice: the page no longer holds file data.
    pub fn released(&self, pfn: u64) {
        if let Some(pages) = self.tracking() {
            pages.lock().expect("page map lock").release(pfn);
        }
        self.notices
            .released
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The byte offset of `len` bytes at `sector`, checked against the disk and the
    /// advertised limits.
    fn range(&self, sector: u64, len: usize) -> Result<u64, Failed> {
        if !(len as u64).is_multiple_of(SECTOR) || len > MAX_DATA {
            return Err(Failed::Bad(format!("{len} data bytes")));
        }
        let off = sector
            .checked_mul(SECTOR)
            .filter(|o| {
                o.checked_add(len as u64)
                    .is_some_and(|e| e <= self.disk.size())
            })
            .ok_or_else(|| Failed::Bad(format!("sector {sector} + {len} bytes past the end")))?;
        Ok(off)
    }

    /// Whole cache blocks, if the range is made of them.
    fn blocks(off: u64, len: usize) -> Option<(u64, u64)> {
        (off.is_multiple_of(BLOCK) && (len as u64).is_multiple_of(BLOCK))
            .then_some((off / BLOCK, len as u64 / BLOCK))
    }

    fn read(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        if let Some((first, count)) = Self::blocks(off, buf.len()) {
            return self.read_blocks(buf, first, count);
        }
        // Not whole blocks (a filesystem with 1 KiB blocks reads its metadata so): the
        // covering blocks go through the cache, and the part asked for is copied out.
        let first = off / BLOCK;
        let count = (off + buf.len() as u64).div_ceil(BLOCK) - first;
        let mut around = AlignedBuf::new((count * BLOCK) as usize);
        self.read_blocks(around.as_mut(), first, count)?;
        let at = (off - first * BLOCK) as usize;
        buf.copy_from_slice(&around.as_ref()[at..at + buf.len()]);
        Ok(())
    }

    fn read_blocks(&self, buf: &mut [u8], first: u64, count: u64) -> std::io::Result<()> {
        let off = first * BLOCK;
        let bs = BLOCK as usize;
        // Runs of missing blocks are read from the disk in one go each.
        let mut i = 0u64;
        while i < count {
            let at = i as usize * bs;
            if self.cache.get(first + i, &mut buf[at..at + bs]) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < count
                && !self
                    .cache
                    .get(first + j, &mut buf[j as usize * bs..(j as usize + 1) * bs])
            {
                j += 1;
            }
            // Block j (if any) was a hit and is in place; i..j are read now.
            let t = self.cache.begin_read(first + i, j - i);
            let run = &mut buf[at..j as usize * bs];
            self.disk.read_at(run, off + at as u64)?;
            self.cache.end_read(&t, run);
            i = j + 1;
        }
        Ok(())
    }

    fn write(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        let (first, count, whole) = match Self::blocks(off, buf.len()) {
            Some((f, c)) => (f, c, true),
            None => {
                let first = off / BLOCK;
                (
                    first,
                    (off + buf.len() as u64).div_ceil(BLOCK) - first,
                    false,
                )
            }
        };
        let t = self.cache.begin_write(first, count);
        let r = self.disk.write_at(buf, off);
        let admit = (whole && r.is_ok()).then_some(buf);
        let done = if r.is_ok() { buf.len() as u64 } else { 0 };
        self.cache.end_write(&t, admit, done);
        r
    }

    fn zero(&self, off: u64, len: u64, unmap: bool) -> std::io::Result<()> {
        let first = off / BLOCK;
        let t = self
            .cache
            .begin_write(first, (off + len).div_ceil(BLOCK) - first);
        let r = self.disk.zero_range(off, len, unmap);
        self.cache.end_write(&t, None, 0);
        r
    }
}

thread_local! {
    /// Each queue thread's bounce buffer, kept between requests: a fresh megabyte
    /// per request costs page faults and zeroing that dominated large requests.
    static BUF: std::cell::RefCell<Option<AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's buffer, at least `len` bytes (grown when needed).
fn with_buf<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        if b.as_ref().is_none_or(|x| x.len() < len) {
            *b = Some(AlignedBuf::new(len));
        }
        let buf = b.as_mut().expect("just set");
        f(&mut buf.as_mut()[..len])
    })
}

/// Bytes left in a guest buffer.
trait Available {
    fn available(&self) -> usize;
}

impl<B: vm_memory::bitmap::BitmapSlice> Available for virtio_queue::Reader<'_, B> {
    fn available(&self) -> usize {
        self.available_bytes()
    }
}

impl<B: vm_memory::bitmap::BitmapSlice> Available for virtio_queue::Writer<'_, B> {
    fn available(&self) -> usize {
        self.available_bytes()
    }
}

/// The ring hands the device what the guest noted.
impl NoticeSink for Device {
    fn admits_evictions(&self) -> bool {
        self.cache.is_exclusive()
    }

    fn released(&self, pfn: u64) {
        Device::released(self, pfn);
    }

    fn evictions<M: GuestMemory>(&self, pfns: &[u64], copies: &[SlotRef], mem: &M) {
        self.evictions_in(pfns, copies, mem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor as D, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x20_0000;
    const STATUS: u64 = 0x30_0000;
    const W: u16 = VRING_DESC_F_WRITE as u16;

    struct Rig {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        dev: Device,
        mem: GuestMemoryMmap,
    }

    fn rig(cache: u64) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let mut content = vec![0u8; 1 << 20];
        for (i, b) in content.iter_mut().enumerate() {
            *b = (i / 4096) as u8;
        }
        std::fs::write(&path, &content).unwrap();
        let dev = Device {
            disk: Disk::open(&path, false, false).unwrap(),
            cache: Cache::new(cache),
            pages: Default::default(),
            mem: Default::default(),
            notices: Default::default(),
            ring: Default::default(),
            serial: b"disk0".to_vec(),
        };
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
        Rig {
            _dir: dir,
            path,
            dev,
            mem,
        }
    }

    impl Rig {
        /// Runs one request; returns (used length, status byte).
        fn run(&self, kind: u32, sector: u64, descs: &[RawDescriptor]) -> (u32, u8) {
            let h = Header {
                kind,
                ioprio: 0,
                sector,
            };
            self.mem.write_obj(h, GuestAddress(HDR)).unwrap();
            self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
            let q = MockSplitQueue::new(&self.mem, 16);
            let chain = q.build_desc_chain(descs).unwrap();
            let used = self.dev.execute(chain);
            (used, self.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap())
        }
    }

    fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
        RawDescriptor::from(D::new(addr, len, flags, 0))
    }

    fn hdr() -> RawDescriptor {
        d(HDR, 16, 0)
    }

    fn status() -> RawDescriptor {
        d(STATUS, 1, W)
    }

    /// A notice ring (`guest/evict/ring.h`, version 2) at `RING` with 16 page copies.
    const RING: u64 = 0x38_0000;
    const SLOTS: u64 = 0x39_0000;

    fn make_ring(mem: &GuestMemoryMmap) {
        let put = |at: u64, v: &[u8]| mem.write_slice(v, GuestAddress(RING + at)).unwrap();
        put(0, b"RBEVRING");
        put(8, &2u32.to_le_bytes());
        put(12, &16u32.to_le_bytes());
        put(16, &16u64.to_le_bytes());
        put(32, &4096u32.to_le_bytes());
        put(36, &16u32.to_le_bytes());
        put(40, &1u32.to_le_bytes());
        put(44, &4096u32.to_le_bytes());
        put(64, &SLOTS.to_le_bytes());
    }

    /// The guest's module: notice n for the page at `gpa`, with its copy.
    fn guest_evicts(mem: &GuestMemoryMmap, gpa: u64) {
        let n = mem.read_obj::<u64>(GuestAddress(RING + 24)).unwrap() + 1;
        let s = (n - 1) % 16;
        let e = RING + 4096 + s * 16;
        mem.write_obj(0u64, GuestAddress(e)).unwrap();
        let mut page = vec![0u8; 4096];
        mem.read_slice(&mut page, GuestAddress(gpa)).unwrap();
        mem.write_slice(&page, GuestAddress(SLOTS + s * 4096))
            .unwrap();
        mem.write_obj((gpa / PAGE) | (1 << 56), GuestAddress(e + 8))
            .unwrap();
        mem.write_obj(n, GuestAddress(e)).unwrap();
        mem.write_obj(n, GuestAddress(RING + 24)).unwrap();
    }

    #[test]
    fn the_ring_is_taken_before_each_request_so_a_block_evicted_then_read_back_hits() {
        let r = rig(1 << 20);
        r.dev.reconfigure(1 << 20, true);
        make_ring(&r.mem);
        r.dev.ring.set(RING, 8192, &r.mem).unwrap();
        // Block 2 read into a page; the guest evicts it and at once reuses the page.
        r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 4096, W), status()]);
        guest_evicts(&r.mem, DATA);
        r.mem
            .write_slice(&[0x77; 4096], GuestAddress(DATA))
            .unwrap();
        // A forged notice: a page no I/O mapped, holding what block 3 would.
        let forged = DATA + 0x20000;
        r.mem.write_slice(&[3; 4096], GuestAddress(forged)).unwrap();
        guest_evicts(&r.mem, forged);
        // Its next request reads block 2 back: the ring was taken first, so the block
        // is in the host cache, from the copy, and the read hits it.
        let other = DATA + 0x10000;
        r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(other, 4096, W), status()]);
        let mut got = vec![0u8; 4096];
        r.mem.read_slice(&mut got, GuestAddress(other)).unwrap();
        assert!(got.iter().all(|b| *b == 2), "block 2's bytes");
        let (c, s) = (r.dev.ring.counts(), r.dev.cache.stats());
        assert_eq!((c.evicted, c.lost, c.polls), (2, 0, 1));
        assert_eq!((s.hits, s.held_bytes), (1, 0), "the hit moved block 2 back");
        assert_eq!(
            r.dev
                .notices
                .admitted
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(r.dev.notices.refused()[&Refusal::NoMapping], 1);
        // Nothing new: requests do not read the ring again.
        r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(other, 4096, W), status()]);
        assert_eq!(r.dev.ring.counts().polls, 1);
        // A ring whose magic is gone (the module unloaded) is given up, in words.
        r.mem.write_obj(0u64, GuestAddress(RING)).unwrap();
        guest_evicts(&r.mem, other);
        r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(other, 4096, W), status()]);
        let c = r.dev.ring.counts();
        assert!(c.ring.is_none() && c.error.unwrap().contains("magic"));
    }

    #[test]
    fn exclusive_an_evicted_page_comes_back_from_the_host_and_nothing_stale_is_served() {
        let r = rig(1 << 20);
        r.dev.reconfigure(1 << 20, true);
        let evict = |r: &Rig, gpa: u64| r.dev.evicted_in(gpa / PAGE, Page::InGuest, &r.mem);
        // Read blocks 2 and 3 into two guest pages: mapped, nothing cached yet.
        r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 8192, W), status()]);
        assert_eq!(r.dev.cache.stats().held_bytes, 0);
        // The guest evicts both: admitted, copied from its memory.
        assert_eq!(evict(&r, DATA), Ok(()));
        assert_eq!(evict(&r, DATA + 4096), Ok(()));
        assert_eq!(r.dev.cache.stats().held_bytes, 8192);
        // A repeated notice finds nothing.
        assert_eq!(evict(&r, DATA), Err(Refusal::NoMapping));
        // The guest reuses the page, then reads block 2 again elsewhere: a host hit.
        r.mem
            .write_slice(&[0x77; 4096], GuestAddress(DATA))
            .unwrap();
        let other = DATA + 0x10000;
        r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(other, 4096, W), status()]);
        let mut got = vec![0u8; 4096];
        r.mem.read_slice(&mut got, GuestAddress(other)).unwrap();
        assert!(got.iter().all(|b| *b == 2));
        let s = r.dev.cache.stats();
        assert_eq!(
            (s.hits, s.held_bytes),
            (1, 4096),
            "the hit moved block 2 back to the guest"
        );
        // Block 3 is overwritten from another page: the host copy goes, and the page
        // that read it before can no longer pass for it.
        r.mem
            .write_slice(&[0xcd; 4096], GuestAddress(other))
            .unwrap();
        r.run(VIRTIO_BLK_T_OUT, 24, &[hdr(), d(other, 4096, 0), status()]);
        assert_eq!(r.dev.cache.stats().held_bytes, 0);
        r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(DATA, 4096, W), status()]);
        r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert!(
            got.iter().all(|b| *b == 0xcd),
            "the write, not the evicted copy"
        );
        // The page that read block 3 is scribbled on before its eviction: refused.
        r.mem
            .write_slice(&[0x01; 4096], GuestAddress(DATA))
            .unwrap();
        assert_eq!(evict(&r, DATA), Err(Refusal::ContentChanged));
        // A discard forgets what the write mapped.
        let seg = Segment {
            sector: 24,
            num_sectors: 8,
            flags: 0,
        };
        r.mem.write_obj(seg, GuestAddress(DATA + 0x20000)).unwrap();
        r.run(
            VIRTIO_BLK_T_DISCARD,
            0,
            &[hdr(), d(DATA + 0x20000, 16, 0), status()],
        );
        assert_eq!(evict(&r, other), Err(Refusal::NoMapping));
        assert_eq!(
            r.dev
                .notices
                .admitted
                .load(std::sync::atomic::Ordering::Relaxed),
            2
        );
        // With the access log on, each eviction of a held block is an `e` line.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.csv");
        r.dev.cache.record_to(Some(&log)).unwrap();
        r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
        assert_eq!(evict(&r, DATA), Ok(()));
        assert_eq!(evict(&r, DATA), Err(Refusal::NoMapping));
        r.dev.cache.record_to(None).unwrap();
        let kinds: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| l.split(',').skip(1).collect::<Vec<_>>().join(","))
            .collect();
        assert_eq!(kinds, ["0,m", "0,e"]);
    }

    #[test]
    fn a_read_returns_the_disk_and_a_second_read_hits_the_cache() {
        let r = rig(1 << 20);
        for round in 0..2 {
            let (used, st) = r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 8192, W), status()]);
            assert_eq!((used, st), (8193, VIRTIO_BLK_S_OK as u8), "round {round}");
            let mut got = vec![0u8; 8192];
            r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
            assert!(got[..4096].iter().all(|b| *b == 2) && got[4096..].iter().all(|b| *b == 3));
        }
        let s = r.dev.cache.stats();
        assert_eq!((s.misses, s.hits, s.admissions), (2, 2, 2));
    }

    #[test]
    fn a_write_reaches_the_file_and_the_cache_serves_the_new_data() {
        let r = rig(1 << 20);
        r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
        r.mem
            .write_slice(&[0xab; 4096], GuestAddress(DATA))
            .unwrap();
        let (used, st) = r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 4096, 0), status()]);
        assert_eq!((used, st), (1, VIRTIO_BLK_S_OK as u8));
        assert!(std::fs::read(&r.path).unwrap()[..4096]
            .iter()
            .all(|b| *b == 0xab));
        r.mem.write_slice(&[0; 4096], GuestAddress(DATA)).unwrap();
        r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
        let mut got = vec![0u8; 4096];
        r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert!(got.iter().all(|b| *b == 0xab));
        assert_eq!(r.dev.cache.stats().hits, 1);
    }

    #[test]
    fn discard_zeroes_and_drops_the_cached_block() {
        let r = rig(1 << 20);
        r.run(VIRTIO_BLK_T_IN, 8, &[hdr(), d(DATA, 4096, W), status()]);
        let seg = Segment {
            sector: 8,
            num_sectors: 8,
            flags: 0,
        };
        r.mem.write_obj(seg, GuestAddress(DATA)).unwrap();
        let (_, st) = r.run(VIRTIO_BLK_T_DISCARD, 0, &[hdr(), d(DATA, 16, 0), status()]);
        assert_eq!(st, VIRTIO_BLK_S_OK as u8);
        r.run(VIRTIO_BLK_T_IN, 8, &[hdr(), d(DATA, 4096, W), status()]);
        let mut got = vec![1u8; 4096];
        r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert!(got.iter().all(|b| *b == 0));
        assert_eq!(r.dev.cache.stats().invalidations, 1);
    }

    #[test]
    fn a_read_of_part_of_a_block_goes_through_the_cache_too() {
        let r = rig(1 << 20);
        for _ in 0..2 {
            let (_, st) = r.run(VIRTIO_BLK_T_IN, 10, &[hdr(), d(DATA, 1024, W), status()]);
            assert_eq!(st, 0);
            let mut got = vec![0u8; 1024];
            r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
            assert!(got.iter().all(|b| *b == 1));
        }
        let s = r.dev.cache.stats();
        assert_eq!((s.misses, s.hits), (1, 1));
    }

    #[test]
    fn get_id_and_flush() {
        let r = rig(0);
        let (used, st) = r.run(VIRTIO_BLK_T_GET_ID, 0, &[hdr(), d(DATA, 20, W), status()]);
        assert_eq!((used, st), (6, VIRTIO_BLK_S_OK as u8));
        let mut id = [0u8; 5];
        r.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
        assert_eq!(&id, b"disk0");
        assert_eq!(r.run(VIRTIO_BLK_T_FLUSH, 0, &[hdr(), status()]).1, 0);
    }

    #[test]
    fn malformed_requests_get_an_error_status_and_nothing_moves() {
        let r = rig(1 << 20);
        let before = std::fs::read(&r.path).unwrap();
        let ioerr = VIRTIO_BLK_S_IOERR as u8;
        // Past the end of the 1 MiB disk.
        assert_eq!(
            r.run(VIRTIO_BLK_T_IN, 2047, &[hdr(), d(DATA, 4096, W), status()])
                .1,
            ioerr
        );
        assert_eq!(
            r.run(
                VIRTIO_BLK_T_OUT,
                u64::MAX / 256,
                &[hdr(), d(DATA, 512, 0), status()]
            )
            .1,
            ioerr
        );
        // Not whole sectors.
        assert_eq!(
            r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 100, 0), status()])
                .1,
            ioerr
        );
        // A header of 8 bytes.
        assert_eq!(
            r.run(
                VIRTIO_BLK_T_IN,
                0,
                &[d(HDR, 8, 0), d(DATA, 512, W), status()]
            )
            .1,
            ioerr
        );
        // An unknown type.
        assert_eq!(
            r.run(99, 0, &[hdr(), status()]).1,
            VIRTIO_BLK_S_UNSUPP as u8
        );
        // No writable byte for the status: dropped, nothing written.
        let (used, st) = r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 512, 0)]);
        assert_eq!((used, st), (0, 0xff));
        // Data outside guest memory.
        assert_eq!(
            r.run(
                VIRTIO_BLK_T_IN,
                0,
                &[hdr(), d(0x100_0000, 512, W), status()]
            )
            .0,
            0
        );
        // Too many discard segments.
        let (_, st) = r.run(
            VIRTIO_BLK_T_DISCARD,
            0,
            &[hdr(), d(DATA, 16 * 17, 0), status()],
        );
        assert_eq!(st, ioerr);
        assert_eq!(std::fs::read(&r.path).unwrap(), before);
    }
}
