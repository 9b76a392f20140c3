//! The correctness core of the exclusive host cache (Hcache, section 3.2): which guest
//! page holds which disk block, learnt from the I/O this backend served, and the
//! check an eviction notice must pass before the evicted page enters the host cache.
//!
//! A guest evicts clean page-cache pages; in exclusive mode the host caches what the
//! guest evicts, straight from guest memory. That page is only worth caching if its
//! content still equals its disk block: the guest may have reused the page for other
//! data, scribbled on it, or written the block from another page since. So:
//!
//! - **P2S** (page → sector, here block) and **S2P** (block → page) are set by every
//!   whole, aligned 4 KiB block a request moved between a guest page and the disk
//!   (reads: the page now holds the block; writes: the block now holds the page), with
//!   the block's cache generation after the I/O and, while the cache is exclusive, a
//!   BLAKE3 hash of the bytes moved. Hashing is most of the backend's own time per
//!   block, so a cache that admits no evictions (inclusive, or none) maps without it;
//!   such a mapping is checked against the block's bytes on the disk instead, which
//!   equal the bytes moved while the generation is unchanged (the map is kept in
//!   either mode so that the pages a guest already holds count from the switch on).
//!   A later request that moves another block through the same page, or the same block
//!   through another page, replaces both directions, so the two maps always agree on
//!   a mapping that is still current; a discard forgets the block.
//! - An **eviction notice** names a guest page. It is admitted only if P2S maps the page
//!   to a block, S2P maps that block back to the same page, no write to the block began
//!   since the I/O (its cache generation is unchanged), and the page read now from guest
//!   memory hashes to the hash taken at the I/O (or, unhashed, equals the block on
//!   the disk). What is admitted is that copy, the one
//!   that was hashed. Anything else is refused with its reason, and the mapping is
//!   dropped either way: the guest has let the page go.
//! - A notice may come with a **copy** of the page taken by the guest as it let the
//!   page go (the ring's page copies): then the copy is what is hashed and admitted,
//!   and it may match either the page's current mapping or the one an I/O displaced
//!   from it since (the guest reuses a freed page at once, often for the next block it
//!   reads, before the notice reaches the host). A copy that matches neither leaves the
//!   current mapping alone: the notice is about an earlier occupant, or forged. A
//!   displaced mapping whose block is in a guest page again is not admitted (the guest
//!   holds the block: caching it too would not be exclusive).
//! - A **release notice** (truncation, deletion: the page's data is no longer the
//!   file's) drops the mapping and admits nothing.
//!
//! A misbehaving guest can forge, repeat or drop notices: a forged one fails a check
//! (BLAKE3 is collision resistant, so a page with other content cannot pass for the
//! block), a repeated one finds no mapping, a dropped one only loses a caching chance.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::faults::{skipped, Check};
use crate::units::BLOCK;

pub use crate::units::PAGE;

/// One guest page known to hold one disk block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    pub block: u64,
    /// `None`: mapped while the cache admitted no evictions; the content check reads
    /// the block from the disk.
    pub hash: Option<[u8; 32]>,
    /// The block's cache generation right after the I/O.
    pub gen: u64,
}

/// Why an eviction notice was not admitted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// No I/O of this backend put a block in that page (or it was forgotten since).
    NoMapping,
    /// The block was read or written through another page since.
    Remapped,
    /// A write to the block began after the I/O that mapped the page.
    WrittenSince,
    /// The page's content no longer hashes to the block's.
    ContentChanged,
    /// The page could not be read from guest memory.
    Unreadable,
    /// The guest's copy of the page was overwritten by a later notice before the host
    /// read it.
    Overwritten,
}

impl Refusal {
    pub const ALL: [Refusal; 6] = [
        Refusal::NoMapping,
        Refusal::Remapped,
        Refusal::WrittenSince,
        Refusal::ContentChanged,
        Refusal::Unreadable,
        Refusal::Overwritten,
    ];
}

/// What became of the notices a disk received.
#[derive(Debug, Default)]
pub struct NoticeStats {
    pub admitted: AtomicU64,
    pub released: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl NoticeStats {
    pub fn count(&self, r: Result<(), Refusal>) {
        let c = match r {
            Ok(()) => &self.admitted,
            Err(why) => &self.refused[why as usize],
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals by reason.
    pub fn refused(&self) -> BTreeMap<Refusal, u64> {
        Refusal::ALL
            .iter()
            .map(|&r| (r, self.refused[r as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

/// An evicted page that held its block's bytes when the host copied it.
#[derive(Debug, PartialEq, Eq)]
pub struct Evicted {
    pub block: u64,
    /// The block's cache generation after the I/O that mapped the page.
    pub gen: u64,
    pub data: Box<[u8]>,
}

/// Where the guest's copy of an evicted page is (a slot of its notice ring).
pub use rebound_guestmem::evict_ring::SlotRef;

/// The hash kept per mapping.
pub fn hash(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// P2S and S2P of one disk.
#[derive(Debug, Default)]
pub struct PageMap {
    p2s: HashMap<u64, Mapping>,
    s2p: HashMap<u64, u64>,
    /// Per page, the last [`HISTORY`] mappings I/O displaced from it, oldest first (a
    /// notice with a copy may still be on its way for each: under reclaim one page is
    /// evicted and reused again and again while a notice travels).
    prev: HashMap<u64, Vec<Mapping>>,
}

/// Displaced mappings kept per guest page.
pub const HISTORY: usize = 16;

impl PageMap {
    pub fn new() -> PageMap {
        PageMap::default()
    }

    /// Guest pages with a mapping.
    pub fn len(&self) -> usize {
        self.p2s.len()
    }

    pub fn is_empty(&self) -> bool {
        self.p2s.is_empty()
    }

    pub fn get(&self, pfn: u64) -> Option<&Mapping> {
        self.p2s.get(&pfn)
    }

    /// The block page `pfn` holds, when P2S and S2P agree on it.
    pub fn holds(&self, pfn: u64) -> Option<u64> {
        let m = self.p2s.get(&pfn)?;
        (self.s2p.get(&m.block) == Some(&pfn)).then_some(m.block)
    }

    /// Every mapping goes (a new connection maps a new guest memory).
    pub fn clear(&mut self) {
        self.p2s.clear();
        self.s2p.clear();
        self.prev.clear();
    }

    /// An I/O moved block `block`'s 4 KiB `data` between the disk and guest page `pfn`;
    /// `gen` is the block's cache generation after it.
    pub fn on_io(&mut self, pfn: u64, block: u64, data: &[u8], gen: u64) {
        debug_assert_eq!(data.len() as u64, PAGE);
        self.map(pfn, block, Some(hash(data)), gen);
    }

    /// As [`PageMap::on_io`], with the hash of the bytes moved already taken (`None`:
    /// not taken; the content check then reads the disk).
    pub fn map(&mut self, pfn: u64, block: u64, hash: Option<[u8; 32]>, gen: u64) {
        if let Some(old) = self.p2s.remove(&pfn) {
            if self.s2p.get(&old.block) == Some(&pfn) {
                self.s2p.remove(&old.block);
                if old.block != block {
                    self.displace(pfn, old);
                }
            }
        }
        if let Some(old_pfn) = self.s2p.insert(block, pfn) {
            if old_pfn != pfn && self.p2s.get(&old_pfn).is_some_and(|m| m.block == block) {
                let old = self.p2s.remove(&old_pfn).expect("checked above");
                self.displace(old_pfn, old);
            }
        }
        self.p2s.insert(pfn, Mapping { block, hash, gen });
    }

    /// Displaced mappings kept for late notices.
    pub fn displaced(&self) -> usize {
        self.prev.values().map(Vec::len).sum()
    }

    fn displace(&mut self, pfn: u64, m: Mapping) {
        let h = self.prev.entry(pfn).or_default();
        if h.len() == HISTORY {
            h.remove(0);
        }
        h.push(m);
    }

    /// Part of a block moved, or the block was discarded or zeroed: whatever page held
    /// it holds it no more as far as we can prove. (A displaced mapping of the block
    /// needs no forgetting: the write or discard moved the block's generation, which
    /// every admission checks.)
    pub fn forget_block(&mut self, block: u64) {
        if let Some(pfn) = self.s2p.remove(&block) {
            if self.p2s.get(&pfn).is_some_and(|m| m.block == block) {
                self.p2s.remove(&pfn);
            }
        }
    }

    /// A release notice: the page's mapping goes, nothing is admitted.
    pub fn release(&mut self, pfn: u64) {
        if let Some(m) = self.p2s.remove(&pfn) {
            if self.s2p.get(&m.block) == Some(&pfn) {
                self.s2p.remove(&m.block);
            }
        }
    }

    /// An eviction notice for `pfn`: takes its mapping out and checks it; `read_page`
    /// copies the page from guest memory, `on_disk(block, bytes)` says whether the
    /// block's bytes on the disk are `bytes` (for an unhashed mapping). On success,
    /// what to hand to
    /// [`Cache::admit_evicted`](crate::Cache::admit_evicted), which checks the
    /// generation under the cache's lock (a write beginning in between is then seen).
    pub fn evicted(
        &mut self,
        pfn: u64,
        read_page: impl FnOnce(&mut [u8]) -> bool,
        on_disk: impl FnOnce(u64, &[u8]) -> bool,
    ) -> Result<Evicted, Refusal> {
        let m = self.p2s.remove(&pfn).ok_or(Refusal::NoMapping)?;
        if self.s2p.get(&m.block) != Some(&pfn) {
            if !skipped(Check::Remap) {
                return Err(Refusal::Remapped);
            }
        } else {
            self.s2p.remove(&m.block);
        }
        let mut data = vec![0u8; PAGE as usize].into_boxed_slice();
        if !read_page(&mut data) {
            return Err(Refusal::Unreadable);
        }
        let same = match m.hash {
            Some(h) => hash(&data) == h,
            None => on_disk(m.block, &data),
        };
        if !same && !skipped(Check::Content) {
            return Err(Refusal::ContentChanged);
        }
        Ok(Evicted {
            block: m.block,
            gen: m.gen,
            data,
        })
    }
}

impl PageMap {
    /// An eviction notice for `pfn` that came with the guest's `copy` of the page:
    /// the copy is admitted as the block of the page's current mapping, or of one an
    /// I/O displaced from the page since (the newest that matches: its generation is
    /// the latest), whichever it hashes to (or, unhashed, equals on the disk, by
    /// `on_disk` as in [`PageMap::evicted`]). The mapping it matched goes; others
    /// stay. On success, the block the guest let go (for the access log) and what to
    /// hand to [`Cache::admit_evicted`](crate::Cache::admit_evicted).
    pub fn evicted_copy(
        &mut self,
        pfn: u64,
        copy: &[u8],
        mut on_disk: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<Evicted, Refusal> {
        let h = std::cell::OnceCell::new();
        let evicted = |m: Mapping| Evicted {
            block: m.block,
            gen: m.gen,
            data: copy.into(),
        };
        // (Test builds can turn a check off: `faults`. Without the content check the
        // copy goes to whatever the page maps now, as a host that trusts notices would.)
        let mut matches = |m: &Mapping| {
            skipped(Check::Content)
                || match m.hash {
                    Some(mh) => *h.get_or_init(|| hash(copy)) == mh,
                    None => on_disk(m.block, copy),
                }
        };
        let remap = !skipped(Check::Remap);
        if let Some(m) = self.p2s.get(&pfn).copied().filter(&mut matches) {
            self.p2s.remove(&pfn);
            if self.s2p.get(&m.block) != Some(&pfn) {
                if remap {
                    return Err(Refusal::Remapped);
                }
            } else {
                self.s2p.remove(&m.block);
            }
            return Ok(evicted(m));
        }
        if let Some(hist) = self.prev.get_mut(&pfn) {
            if let Some(i) = hist.iter().rposition(&mut matches) {
                let m = hist.remove(i);
                if hist.is_empty() {
                    self.prev.remove(&pfn);
                }
                if remap && self.s2p.contains_key(&m.block) {
                    return Err(Refusal::Remapped);
                }
                return Ok(evicted(m));
            }
        }
        if self.p2s.contains_key(&pfn) || self.prev.contains_key(&pfn) {
            Err(Refusal::ContentChanged)
        } else {
            Err(Refusal::NoMapping)
        }
    }
}

/// The (guest page, disk block) pairs of one request whose data moved whole and
/// aligned: `segments` are the request's data buffers in order (guest physical address,
/// length), `disk_off` the byte offset on the disk where the data begins. A block
/// counts when its 4 KiB lie in one buffer at a page-aligned guest address; the rest
/// (partial blocks, unaligned buffers) is returned in `partial`, blocks whose mapping
/// must be forgotten.
pub fn pages_of(segments: &[(u64, u64)], disk_off: u64) -> (Vec<(u64, u64)>, Vec<u64>) {
    let (mut whole, mut partial) = (Vec::new(), Vec::new());
    let mut off = disk_off; // disk offset of the current segment's first byte
    for &(gpa, len) in segments.iter().filter(|s| s.1 > 0) {
        let end = off.saturating_add(len);
        // Every block this segment touches.
        let mut b = off / BLOCK;
        while b * BLOCK < end {
            let (bs, be) = (b * BLOCK, (b + 1) * BLOCK);
            let inside = bs >= off && be <= end;
            let at = gpa + (bs.max(off) - off);
            if inside && at.is_multiple_of(PAGE) {
                whole.push((at / PAGE, b));
            } else if partial.last() != Some(&b) {
                partial.push(b);
            }
            b += 1;
        }
        off = end;
    }
    (whole, partial)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(v: u8) -> Vec<u8> {
        vec![v; PAGE as usize]
    }

    /// For hashed mappings, whose check reads no disk.
    fn no_disk(_: u64, _: &[u8]) -> bool {
        panic!("a hashed mapping's check read the disk")
    }

    fn read(v: &[u8]) -> impl FnOnce(&mut [u8]) -> bool + '_ {
        move |out: &mut [u8]| {
            out.copy_from_slice(v);
            true
        }
    }

    #[test]
    fn a_page_evicted_as_it_was_read_is_admitted_with_the_copy_checked() {
        let mut m = PageMap::new();
        m.on_io(10, 7, &page(1), 4);
        let e = m.evicted(10, read(&page(1)), no_disk).unwrap();
        assert_eq!((e.block, e.gen, &e.data[..]), (7, 4, &page(1)[..]));
        assert!(m.is_empty(), "the mapping went with the page");
        assert_eq!(
            m.evicted(10, read(&page(1)), no_disk),
            Err(Refusal::NoMapping)
        );
    }

    #[test]
    fn each_check_refuses_what_it_guards() {
        let mut m = PageMap::new();
        // Scribbled on (or reused) before the host copied it.
        m.on_io(1, 1, &page(1), 0);
        assert_eq!(
            m.evicted(1, read(&page(2)), no_disk),
            Err(Refusal::ContentChanged)
        );
        // The block went through another page since: the old page's P2S is gone, so the
        // old page finds nothing; the new page still maps.
        m.on_io(1, 1, &page(1), 0);
        m.on_io(2, 1, &page(1), 0);
        assert_eq!(
            m.evicted(1, read(&page(1)), no_disk),
            Err(Refusal::NoMapping)
        );
        assert!(m.evicted(2, read(&page(1)), no_disk).is_ok());
        // The page held another block since: the first block's S2P is gone.
        m.on_io(3, 5, &page(5), 0);
        m.on_io(3, 6, &page(6), 0);
        assert_eq!(m.get(3).map(|x| x.block), Some(6));
        assert_eq!(
            m.evicted(3, read(&page(5)), no_disk),
            Err(Refusal::ContentChanged)
        );
        // Unreadable guest memory.
        m.on_io(4, 4, &page(4), 0);
        assert_eq!(m.evicted(4, |_| false, no_disk), Err(Refusal::Unreadable));
        // Released, then a (forged) eviction of the same page.
        m.on_io(5, 5, &page(5), 0);
        m.release(5);
        assert_eq!(
            m.evicted(5, read(&page(5)), no_disk),
            Err(Refusal::NoMapping)
        );
        // Discarded block.
        m.on_io(6, 9, &page(9), 0);
        m.forget_block(9);
        assert_eq!(
            m.evicted(6, read(&page(9)), no_disk),
            Err(Refusal::NoMapping)
        );
        assert!(m.is_empty());
    }

    #[test]
    fn a_copy_finds_the_block_even_after_the_page_was_reused() {
        let mut m = PageMap::new();
        // The guest evicts page 1 (block 10) and at once reads block 20 into it; the
        // notice with the copy of block 10 arrives after that read.
        m.on_io(1, 10, &page(10), 3);
        m.on_io(1, 20, &page(20), 5);
        let e = m.evicted_copy(1, &page(10), no_disk).unwrap();
        assert_eq!((e.block, e.gen, &e.data[..]), (10, 3, &page(10)[..]));
        assert_eq!(
            m.holds(1),
            Some(20),
            "the current occupant keeps its mapping"
        );
        assert_eq!(
            m.evicted_copy(1, &page(10), no_disk),
            Err(Refusal::ContentChanged)
        );
        let e = m.evicted_copy(1, &page(20), no_disk).unwrap();
        assert_eq!(e.block, 20);
        assert_eq!(
            m.evicted_copy(1, &page(20), no_disk),
            Err(Refusal::NoMapping)
        );
        // A copy matching nothing (scribbled, forged) leaves the mapping alone.
        m.on_io(2, 30, &page(30), 0);
        assert_eq!(
            m.evicted_copy(2, &page(99), no_disk),
            Err(Refusal::ContentChanged)
        );
        assert_eq!(m.holds(2), Some(30));
        // Block 30 read again into page 3 before page 2's notice: the guest holds it,
        // so the late notice is not admitted (the host would cache it twice).
        m.on_io(3, 30, &page(30), 0);
        assert_eq!(
            m.evicted_copy(2, &page(30), no_disk),
            Err(Refusal::Remapped)
        );
        assert_eq!(m.holds(3), Some(30));
        assert_eq!(m.displaced(), 0, "consumed displaced mappings go");
        // Under reclaim a page cycles through several blocks before the first notice
        // arrives: each copy still finds its block, late and in any order.
        for b in 40..50 {
            m.on_io(4, b, &page(b as u8), b);
        }
        for b in [45, 41, 49, 40] {
            let e = m.evicted_copy(4, &page(b as u8), no_disk).unwrap();
            assert_eq!((e.block, e.gen), (b, b));
        }
        // Only the last HISTORY displaced mappings are kept.
        for b in 0..HISTORY as u64 + 5 {
            m.on_io(5, 100 + b, &page(b as u8 + 100), 0);
        }
        assert_eq!(
            m.evicted_copy(5, &page(100), no_disk),
            Err(Refusal::ContentChanged)
        );
        assert!(m.evicted_copy(5, &page(106), no_disk).is_ok());
    }

    #[test]
    fn an_unhashed_mapping_is_checked_by_the_disk_and_only_for_its_block() {
        let mut m = PageMap::new();
        let disk = |b: u64, bytes: &[u8]| bytes == page(b as u8).as_slice();
        m.map(1, 7, None, 0);
        assert_eq!(
            m.evicted(1, read(&page(8)), disk),
            Err(Refusal::ContentChanged)
        );
        m.map(1, 7, None, 0);
        assert_eq!(m.evicted(1, read(&page(7)), disk).unwrap().block, 7);
        // A copy is matched against the unhashed current and displaced mappings alike,
        // each by its own block's bytes.
        m.map(2, 10, None, 1);
        m.on_io(2, 11, &page(11), 2);
        m.map(2, 12, None, 3);
        let mut asked = Vec::new();
        let e = m
            .evicted_copy(2, &page(10), |b, bytes| {
                asked.push(b);
                disk(b, bytes)
            })
            .unwrap();
        assert_eq!((e.block, e.gen), (10, 1));
        assert_eq!(
            asked,
            [12, 10],
            "the current mapping, then the newest displaced"
        );
        assert_eq!(
            m.evicted_copy(2, &page(99), disk),
            Err(Refusal::ContentChanged)
        );
        assert_eq!(m.evicted_copy(2, &page(11), disk).unwrap().block, 11);
        assert_eq!(m.evicted_copy(2, &page(12), disk).unwrap().block, 12);
    }

    #[test]
    fn p2s_and_s2p_stay_inverse_under_any_sequence() {
        let mut m = PageMap::new();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let (pfn, block) = (rng.u64(0..64), rng.u64(0..64));
            match rng.u8(0..4) {
                0 | 1 => m.on_io(pfn, block, &page(block as u8), 0),
                2 => m.forget_block(block),
                _ => m.release(pfn),
            }
            for (p, map) in &m.p2s {
                assert_eq!(m.s2p.get(&map.block), Some(p), "P2S without its S2P");
            }
            for (b, p) in &m.s2p {
                assert_eq!(
                    m.p2s.get(p).map(|x| x.block),
                    Some(*b),
                    "S2P without its P2S"
                );
            }
        }
    }

    #[test]
    fn whole_aligned_blocks_map_and_the_rest_is_partial() {
        // Two pages in one buffer, block-aligned on the disk.
        assert_eq!(
            pages_of(&[(0x10000, 8192)], 0x3000),
            (vec![(0x10, 3), (0x11, 4)], vec![])
        );
        // A buffer not page-aligned in the guest: nothing maps.
        assert_eq!(pages_of(&[(0x10200, 4096)], 0), (vec![], vec![0]));
        // Disk offset not block-aligned: both touched blocks are partial.
        assert_eq!(pages_of(&[(0x10000, 4096)], 512), (vec![], vec![0, 1]));
        // A block split over two buffers (2 KiB each), then a whole page.
        assert_eq!(
            pages_of(&[(0x20000, 2048), (0x30800, 2048), (0x40000, 4096)], 0),
            (vec![(0x40, 1)], vec![0])
        );
        // Sub-block reads (512-byte sectors) touch one block, partially.
        assert_eq!(pages_of(&[(0x5000, 512)], 4096 + 512), (vec![], vec![1]));
    }
}
