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
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ByteValued, GuestMemory};

use crate::cache::{Cache, Hits};
use crate::config::{MAX_DISCARD_SECTORS, MAX_DISCARD_SEG, SECTOR, SEG_MAX, SIZE_MAX};
use crate::disk::{AlignedBuf, Disk};
use crate::exclusive::{pages_of, PageMap, Refusal, SlotRef};
use crate::faults::{skipped, Check};
use crate::guest_memory::{guest_bufs, reads_direct, GuestBufs, Mem};
use crate::ring::NoticeSink;
use crate::timing::{Class, Lap, Phase};
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
    /// Where requests' time goes, by phase.
    pub timing: crate::timing::Timing,
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
        let mut lap = Lap::off();
        let used = self.execute_timed(chain, &mut lap);
        self.finish(&mut lap);
        used
    }

    /// [`Device::execute`], charging its time to the phases of `lap` and setting its
    /// class, but for the page map's update of a read or a write, left to
    /// [`Device::finish`]: the caller answers the guest first, then finishes, before
    /// this thread executes another request (which finishes it first otherwise).
    pub fn execute_timed<T>(&self, chain: DescriptorChain<T>, lap: &mut Lap) -> u32
    where
        T: Deref + Clone,
        T::Target: GuestMemory + Sized,
    {
        self.finish(&mut Lap::off());
        let mem = chain.memory();
        lap.class = Class::Other;
        // Every eviction the guest noted before it sent this request comes first: a
        // read of a block it just evicted then finds it in the host cache.
        if !skipped(Check::Order) {
            self.ring.drain(self, mem);
        }
        lap.lap(Phase::Ring);
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
            Ok(h) => {
                lap.class = match h.kind {
                    VIRTIO_BLK_T_IN => Class::ReadHit,
                    VIRTIO_BLK_T_OUT => Class::Write,
                    _ => Class::Other,
                };
                self.run(h, mem, &mut reader, &mut data, bufs.as_ref(), lap)
            }
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
        let ok = status.write_all(&[code as u8]).is_ok();
        lap.lap(Phase::Copy);
        match ok {
            true => (written + 1) as u32,
            false => 0,
        }
    }

    /// Returns the data bytes written to the guest.
    fn run<M: GuestMemory + ?Sized, R: Read + Available, W: Write + Available>(
        &self,
        h: Header,
        mem: &M,
        reader: &mut R,
        data: &mut W,
        bufs: Option<&Buffers>,
        lap: &mut Lap,
    ) -> Result<usize, Failed> {
        let r = self.run_kind(h, mem, reader, data, bufs, lap);
        if r.is_err() {
            lap.lap(Phase::Parse);
        }
        r
    }

    fn run_kind<M: GuestMemory + ?Sized, R: Read + Available, W: Write + Available>(
        &self,
        h: Header,
        mem: &M,
        reader: &mut R,
        data: &mut W,
        bufs: Option<&Buffers>,
        lap: &mut Lap,
    ) -> Result<usize, Failed> {
        match h.kind {
            VIRTIO_BLK_T_IN => {
                let len = data.available();
                let off = self.range(h.sector, len)?;
                let gens = self.gens(off, len as u64);
                let runs = bufs.map(|b| Buffers::window(&b.writable, 0, len as u64));
                // Whole blocks, in a cache that keeps no hash of what the guest reads,
                // go between the cache, the disk and the guest's buffers directly.
                let guest = match (&runs, Self::blocks(off, len)) {
                    (Some(r), Some(_)) if !self.cache.is_exclusive() => guest_bufs(mem, r),
                    _ => None,
                };
                lap.lap(Phase::Parse);
                let deferred = |in_buf| Deferred {
                    device: self as *const Device as usize,
                    runs,
                    off,
                    len,
                    gens,
                    own: 0,
                    in_buf,
                };
                if let Some(g) = guest {
                    self.read_into(&g, off, lap).map_err(Failed::Io)?;
                    defer(deferred(false));
                    return Ok(len);
                }
                with_buf(len, |buf| {
                    self.read(buf, off, lap).map_err(Failed::Io)?;
                    data.write_all(buf).map_err(Failed::Io)?;
                    lap.lap(Phase::Copy);
                    defer(deferred(true));
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
                lap.lap(Phase::Parse);
                with_buf(len, |buf| {
                    reader.read_exact(buf).map_err(Failed::Io)?;
                    lap.lap(Phase::Copy);
                    let r = self.write(buf, off, lap).map_err(Failed::Io);
                    let runs = bufs.map(|b| Buffers::window(&b.readable, 16, len as u64));
                    match &r {
                        // This write's own two steps of the generation.
                        Ok(()) => defer(Deferred {
                            device: self as *const Device as usize,
                            runs,
                            off,
                            len,
                            gens,
                            own: 2,
                            in_buf: true,
                        }),
                        Err(_) => {
                            self.forget(off, len as u64);
                            lap.lap(Phase::Map);
                        }
                    }
                    r
                })?;
                Ok(0)
            }
            VIRTIO_BLK_T_FLUSH => {
                lap.lap(Phase::Parse);
                let r = self.disk.flush().map_err(Failed::Io);
                lap.lap(Phase::Disk);
                r.map(|()| 0)
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
                    lap.lap(Phase::Parse);
                    let r = self.zero(off, len as u64, unmap).map_err(Failed::Io);
                    lap.lap(Phase::Disk);
                    self.forget(off, len as u64);
                    lap.lap(Phase::Map);
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

    /// The page map's update left by this thread's last request, if any, from the data
    /// still in its buffer; its time is charged to `lap`'s map phase.
    ///
    /// Why it waits: hashing the 4 KiB of a block (BLAKE3) is most of the backend's
    /// own time on a cache hit, and the guest need not wait for it. Meanwhile the page
    /// has no mapping yet, so an eviction notice for it can only be refused (a caching
    /// chance lost, nothing stale admitted), and a write that begins meanwhile makes
    /// the update forget the block, as it would have if it raced the request.
    pub fn finish(&self, lap: &mut Lap) {
        let Some(d) = PENDING.with(|p| p.borrow_mut().take()) else {
            return;
        };
        if d.device != self as *const Device as usize {
            // Another device's, on a thread that served both (tests): not ours to apply.
            return;
        }
        match d.in_buf {
            true => with_buf(d.len, |buf| {
                self.map_pages(d.runs, d.off, Some(buf), &d.gens, d.own)
            }),
            false => self.map_pages(d.runs, d.off, None, &d.gens, d.own),
        }
        lap.lap(Phase::Map);
    }

    /// After data moved between the guest buffers `runs` and the disk at `off`: each
    /// whole, aligned block now maps its page, provided no write but this request's own
    /// (`own` steps of the generation: 2 for a write, 0 for a read) began meanwhile;
    /// every other block touched loses its mapping. `data` is what moved, as the host
    /// holds it (`None`: it went straight into guest memory, and the mappings carry no
    /// hash: an eviction of theirs is checked against the disk).
    fn map_pages(
        &self,
        runs: Option<Vec<(u64, u64)>>,
        off: u64,
        data: Option<&[u8]>,
        before: &[u64],
        own: u64,
    ) {
        let (Some(pages), Some(runs)) = (self.tracking(), runs) else {
            return;
        };
        let (whole, partial) = pages_of(&runs, off);
        let first = off / BLOCK;
        // The block's generation now, if no write but this request's own began.
        let current = |block: u64| {
            let now = self.cache.gen_of(block);
            let then = before.get((block - first) as usize).copied();
            (then.map(|g| g.wrapping_add(own)) == Some(now)).then_some(now)
        };
        let apply = |map: &mut PageMap, pfn, block, mapping| match mapping {
            Some((hash, gen)) => map.map(pfn, block, hash, gen),
            None => map.forget_block(block),
        };
        // Only a cache that admits evictions needs the hash now (see `exclusive`); it
        // is taken before the lock, which eviction notices wait on.
        let hashed: Option<Vec<_>> = data.filter(|_| self.cache.is_exclusive()).map(|data| {
            whole
                .iter()
                .map(|&(pfn, block)| {
                    let at = (block * BLOCK - off) as usize;
                    let hash = || crate::exclusive::hash(&data[at..at + BLOCK as usize]);
                    (pfn, block, current(block).map(|g| (Some(hash()), g)))
                })
                .collect()
        });
        let mut map = pages.lock().expect("page map lock");
        match hashed {
            Some(updates) => {
                for (pfn, block, mapping) in updates {
                    apply(&mut map, pfn, block, mapping);
                }
            }
            None => {
                for (pfn, block) in whole {
                    apply(&mut map, pfn, block, current(block).map(|g| (None, g)));
                }
            }
        }
        partial.into_iter().for_each(|b| map.forget_block(b));
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
                let e =
                    pages
                        .lock()
                        .expect("page map lock")
                        .evicted_copy(pfn, copy?, |b, bytes| self.on_disk(b, bytes));
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
                map.evicted(
                    pfn,
                    |out| {
                        pfn.checked_mul(PAGE)
                            .is_some_and(|a| read_guest(mem, a, out))
                    },
                    |b, bytes| self.on_disk(b, bytes),
                )?
            }
        };
        self.cache.admit_evicted(&e)
    }

    /// Whether block `block` on the disk holds `bytes`: the content check of a mapping
    /// made without a hash (a read error counts as a mismatch: nothing is admitted).
    fn on_disk(&self, block: u64, bytes: &[u8]) -> bool {
        let mut b = AlignedBuf::new(BLOCK as usize);
        let Some(off) = block.checked_mul(BLOCK) else {
            return false;
        };
        self.disk.read_at(b.as_mut(), off).is_ok() && b.as_mut()[..] == *bytes
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

    /// Reads through the cache; ends with a lap of the cache's time.
    fn read(&self, buf: &mut [u8], off: u64, lap: &mut Lap) -> std::io::Result<()> {
        if let Some((first, count)) = Self::blocks(off, buf.len()) {
            return self.read_blocks(buf, first, count, lap);
        }
        // Not whole blocks (a filesystem with 1 KiB blocks reads its metadata so): the
        // covering blocks go through the cache, and the part asked for is copied out.
        let first = off / BLOCK;
        let count = (off + buf.len() as u64).div_ceil(BLOCK) - first;
        let mut around = AlignedBuf::new((count * BLOCK) as usize);
        self.read_blocks(around.as_mut(), first, count, lap)?;
        let at = (off - first * BLOCK) as usize;
        buf.copy_from_slice(&around.as_ref()[at..at + buf.len()]);
        lap.lap(Phase::Cache);
        Ok(())
    }

    /// Each run of missing blocks makes the request a miss and is the disk's time;
    /// the rest is the cache's.
    fn read_blocks(
        &self,
        buf: &mut [u8],
        first: u64,
        count: u64,
        lap: &mut Lap,
    ) -> std::io::Result<()> {
        let off = first * BLOCK;
        let bs = BLOCK as usize;
        let mut hits = Hits::default();
        self.cache.get_many(first, count, &mut hits, |i, d| {
            buf[i * bs..(i + 1) * bs].copy_from_slice(d)
        });
        // Runs of missing blocks are read from the disk in one go each.
        for (i, j) in hits.misses() {
            let at = i as usize * bs;
            // The hits are in place; i..j are read now.
            let t = self.cache.begin_read(first + i, j - i);
            let run = &mut buf[at..j as usize * bs];
            lap.class = Class::ReadMiss;
            lap.lap(Phase::Cache);
            let r = self.disk.read_at(run, off + at as u64);
            lap.lap(Phase::Disk);
            r?;
            self.cache.end_read(&t, Some(run));
        }
        lap.lap(Phase::Cache);
        Ok(())
    }

    /// [`Device::read_blocks`] of whole blocks at `off` into the guest's buffers `g`:
    /// hits are copied from the cache into them, and each run of misses is read from
    /// the disk straight into them when [`reads_direct`] allows, else through this
    /// thread's buffer (then copied into the guest and offered to the cache).
    ///
    /// The guest may change its buffers while this runs (another vCPU): harmless, it
    /// owns those bytes and sees what it wrote; the host takes nothing from them (the
    /// cache's copies come from the cache or the bounce buffer, and these mappings
    /// carry no hash).
    fn read_into<B: BitmapSlice>(
        &self,
        g: &GuestBufs<'_, B>,
        off: u64,
        lap: &mut Lap,
    ) -> std::io::Result<()> {
        let (first, bs) = (off / BLOCK, BLOCK as usize);
        let count = g.len() as u64 / BLOCK;
        let mut hits = Hits::default();
        self.cache
            .get_many(first, count, &mut hits, |i, d| g.copy_in(i * bs, d));
        let fills = self.cache.fills_on_miss();
        let mut iov = Vec::new();
        for (i, j) in hits.misses() {
            let (at, len, from) = (i as usize * bs, (j - i) as usize * bs, off + i * BLOCK);
            let t = self.cache.begin_read(first + i, j - i);
            lap.class = Class::ReadMiss;
            iov.clear();
            g.iovecs(at, len, &mut iov);
            lap.lap(Phase::Cache);
            if reads_direct(fills, self.disk.align(), &iov) {
                // SAFETY: `iov` is the host mapping of the guest's buffers for these
                // bytes; `g` borrows the request's guest memory, which stays mapped
                // until the request is answered, after this read. No Rust reference
                // points into it (the guest's bytes are only reached through
                // volatile slices), so the kernel's writes alias nothing.
                let r = unsafe { self.disk.read_raw_at(&mut iov, from) };
                lap.lap(Phase::Disk);
                r?;
                g.mark_dirty(at, len);
                self.cache.end_read(&t, None);
                continue;
            }
            with_buf(len, |buf| {
                let r = self.disk.read_at(buf, from);
                lap.lap(Phase::Disk);
                r?;
                self.cache.end_read(&t, Some(buf));
                lap.lap(Phase::Cache);
                g.copy_in(at, buf);
                lap.lap(Phase::Copy);
                Ok::<_, std::io::Error>(())
            })?;
        }
        lap.lap(Phase::Cache);
        Ok(())
    }

    /// Writes through the cache, laps for the cache and the disk.
    fn write(&self, buf: &[u8], off: u64, lap: &mut Lap) -> std::io::Result<()> {
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
        lap.lap(Phase::Cache);
        let r = self.disk.write_at(buf, off);
        lap.lap(Phase::Disk);
        let admit = (whole && r.is_ok()).then_some(buf);
        let done = if r.is_ok() { buf.len() as u64 } else { 0 };
        self.cache.end_write(&t, admit, done);
        lap.lap(Phase::Cache);
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
    /// The page map's update of this thread's last request, over the data in `BUF`
    /// ([`Device::finish`]).
    static PENDING: std::cell::RefCell<Option<Deferred>> = const { std::cell::RefCell::new(None) };
}

/// A page map update left for after the request's answer.
struct Deferred {
    /// Whose page map (the device's address).
    device: usize,
    runs: Option<Vec<(u64, u64)>>,
    off: u64,
    /// Bytes of `BUF` the request moved.
    len: usize,
    gens: Vec<u64>,
    own: u64,
    /// Whether the data is in `BUF` (else it went straight into guest memory).
    in_buf: bool,
}

/// Leaves `d` for [`Device::finish`] (the request's data stays in `BUF` until then).
fn defer(d: Deferred) {
    PENDING.with(|p| *p.borrow_mut() = Some(d));
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
#[path = "request_tests.rs"]
mod tests;
