//! The guest's eviction-notice ring (`guest/evict`, module `rebound_evict`), read from
//! guest RAM: which page-cache pages the guest evicted or released, for the exclusive
//! host cache, and a copy of each evicted page as it was when the guest let it go.
//!
//! Format, version 2, little-endian, at the guest physical address the guest's agent
//! reports (`ready.evict_ring`); the authoritative description is `guest/evict/ring.h`:
//!
//! | offset | field |
//! |---|---|
//! | 0 | u64 magic `RBEVRING` (0 once the module unloads) |
//! | 8 | u32 version (2) |
//! | 12 | u32 entry size (16) |
//! | 16 | u64 capacity (entries, and slots when there are copies) |
//! | 24 | u64 head: notices ever written, the last one's sequence number |
//! | 32 | u32 slot bytes: 4096 (evicted pages are copied) or 0 (notices only) |
//! | 36 | u32 slots per chunk |
//! | 40 | u32 chunks (at most [`MAX_CHUNKS`]) |
//! | 44 | u32 offset of the entries ([`ENTRIES_OFF`]) |
//! | 64 | u64 guest physical address of each chunk |
//! | 4096 | `capacity` entries of {u64 seq, u64 info = pfn \| kind << 56} |
//!
//! Notice n (from 1) lives in entry s = (n − 1) mod capacity, its copy in slot s, at
//! chunk s / chunk_slots, page s mod chunk_slots. The guest writes seq = 0, then the
//! copy and info, then seq = n, with write barriers between. The reader copies the
//! entries it wants, then their seq words again: a notice counts only when both copies
//! say n (a writer that began on the entry in between would have cleared seq first).
//! An entry with a smaller seq is not written yet (read again at the next poll); one
//! with a larger seq was overwritten before we read it, and counts as lost, as do
//! notices older than head − capacity. A copy is read later, by whoever admits it: it
//! is whole only if the entry's seq still says n after the copy was read ([`SlotRef`]).
//! The header is checked at every poll (a cap of [`MAX_BYTES`], the capacity must fit
//! the ring, the chunks must hold the slots): a guest controls all of it, so nothing
//! read is trusted beyond those bounds.

use thiserror::Error;

use crate::memory::{GuestMemory, MemoryError};
use crate::source::PageSource;

pub const MAGIC: u64 = u64::from_le_bytes(*b"RBEVRING");
pub const VERSION: u32 = 2;
/// The fixed part of the header; the chunk table follows it.
pub const HEADER: u64 = 64;
pub const MAX_CHUNKS: u64 = 64;
pub const ENTRIES_OFF: u64 = 4096;
pub const ENTRY: u64 = 16;
/// Bytes of a page copy.
pub const SLOT: u64 = 4096;
/// The largest ring (header and entries) a guest may announce, and the largest chunk of
/// copies (the module's largest allocation, order 10).
pub const MAX_BYTES: u64 = 4 << 20;
const KIND_SHIFT: u32 = 56;
const KIND_EVICTED: u64 = 1;
const KIND_RELEASED: u64 = 2;

/// Errors reading the ring.
#[derive(Debug, Error)]
pub enum RingError {
    #[error("the ring at {0:#x} is not page-aligned or is outside 4 KiB..4 MiB ({1} bytes)")]
    Placement(u64, u64),
    #[error("no ring at {0:#x}: magic {1:#018x} (the module is not loaded, or was unloaded)")]
    Magic(u64, u64),
    #[error("ring version {0}, this host reads version {VERSION}")]
    Version(u32),
    #[error("ring entries of {0} bytes, expected {ENTRY}")]
    EntrySize(u32),
    #[error("ring capacity {capacity} does not fit its {bytes} bytes")]
    Capacity { capacity: u64, bytes: u64 },
    #[error("ring entries at offset {0}, expected {ENTRIES_OFF}")]
    EntriesOffset(u32),
    #[error("ring head {0} is more notices than a guest can have written")]
    Head(u64),
    #[error("ring page copies are wrong: {0}")]
    Slots(String),
    #[error("cannot read the ring")]
    Read(#[source] MemoryError),
}

/// Where the ring's bytes come from: guest memory by physical address.
pub trait RingSource {
    fn read_at(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError>;
}

impl<S: PageSource> RingSource for GuestMemory<S> {
    fn read_at(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.read(gpa, buf)
    }
}

/// Where the copy of an evicted page is, and how to tell it is still that page's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    /// Guest physical address of the 4 KiB copy.
    pub data_gpa: u64,
    /// Guest physical address of the notice's seq word: the copy is the notice's only
    /// if it still reads `seq` after the copy was read.
    pub seq_gpa: u64,
    pub seq: u64,
}

/// What one poll found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Page frame numbers (guest physical address / 4096), in notice order.
    pub evicted: Vec<u64>,
    /// The copy of each evicted page, in the same order (empty: the ring has none).
    pub copies: Vec<SlotRef>,
    pub released: Vec<u64>,
    /// Notices overwritten before they were read.
    pub lost: u64,
    /// Entries whole but with an unknown kind (a misbehaving guest).
    pub invalid: u64,
}

/// A validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub capacity: u64,
    pub head: u64,
    /// Slots per chunk and each chunk's guest physical address, when pages are copied.
    pub copies: Option<(u64, Vec<u64>)>,
}

/// Bytes of the header as read (fixed part and chunk table).
const HEADER_READ: usize = (HEADER + MAX_CHUNKS * 8) as usize;

/// Checks a header read from a ring of `bytes` bytes.
pub fn parse_header(h: &[u8], gpa: u64, bytes: u64) -> Result<Header, RingError> {
    let u64_at = |o: usize| {
        h.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let u32_at = |o: usize| {
        h.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let (Some(magic), Some(version), Some(esize), Some(capacity), Some(head)) =
        (u64_at(0), u32_at(8), u32_at(12), u64_at(16), u64_at(24))
    else {
        return Err(RingError::Read(MemoryError::NotRam {
            gpa,
            why: "the ring header is truncated",
        }));
    };
    if magic != MAGIC {
        return Err(RingError::Magic(gpa, magic));
    }
    if version != VERSION {
        return Err(RingError::Version(version));
    }
    if u64::from(esize) != ENTRY {
        return Err(RingError::EntrySize(esize));
    }
    let (Some(slot_bytes), Some(per), Some(chunks), Some(entries_off)) =
        (u32_at(32), u32_at(36), u32_at(40), u32_at(44))
    else {
        return Err(RingError::Read(MemoryError::NotRam {
            gpa,
            why: "the ring header is truncated",
        }));
    };
    if u64::from(entries_off) != ENTRIES_OFF {
        return Err(RingError::EntriesOffset(entries_off));
    }
    // The reader counts up to head + 1: a head of u64::MAX would overflow it.
    if head == u64::MAX {
        return Err(RingError::Head(head));
    }
    let fits = capacity
        .checked_mul(ENTRY)
        .and_then(|b| b.checked_add(ENTRIES_OFF))
        .is_some_and(|b| b <= bytes);
    if capacity == 0 || !fits {
        return Err(RingError::Capacity { capacity, bytes });
    }
    let copies = match u64::from(slot_bytes) {
        0 => None,
        SLOT => Some(chunk_table(h, capacity, per.into(), chunks.into())?),
        other => return Err(RingError::Slots(format!("slots of {other} bytes"))),
    };
    Ok(Header {
        capacity,
        head,
        copies,
    })
}

/// The chunks of copies: enough of them for `capacity` slots, each page-aligned.
fn chunk_table(
    h: &[u8],
    capacity: u64,
    per: u64,
    chunks: u64,
) -> Result<(u64, Vec<u64>), RingError> {
    let bad = |why: String| Err(RingError::Slots(why));
    if per == 0 || per * SLOT > MAX_BYTES {
        return bad(format!("{per} slots per chunk"));
    }
    if chunks > MAX_CHUNKS || chunks * per < capacity {
        return bad(format!(
            "{chunks} chunks of {per} slots for {capacity} notices"
        ));
    }
    let mut gpas = Vec::with_capacity(chunks as usize);
    for i in 0..chunks as usize {
        let at = HEADER as usize + 8 * i;
        let Some(g) = h.get(at..at + 8) else {
            return bad("the chunk table is truncated".into());
        };
        let g = u64::from_le_bytes(g.try_into().unwrap());
        if !g.is_multiple_of(SLOT) || g.checked_add(per * SLOT).is_none() {
            return bad(format!("chunk {i} at {g:#x}"));
        }
        gpas.push(g);
    }
    Ok((per, gpas))
}

/// Reads new notices from one ring, remembering how far it got.
#[derive(Debug)]
pub struct RingReader {
    gpa: u64,
    bytes: u64,
    /// The next notice's sequence number.
    next: u64,
}

impl RingReader {
    /// A reader of the ring the guest announced at `gpa`, `bytes` long, starting with
    /// the notices written from now on (older ones are of a past the host did not see).
    pub fn open(src: &impl RingSource, gpa: u64, bytes: u64) -> Result<RingReader, RingError> {
        if !gpa.is_multiple_of(4096) || !(4096..=MAX_BYTES).contains(&bytes) {
            return Err(RingError::Placement(gpa, bytes));
        }
        let mut r = RingReader {
            gpa,
            bytes,
            next: 1,
        };
        r.next = r.header(src)?.head.saturating_add(1);
        Ok(r)
    }

    /// Starts from the first notice the guest ever wrote (a ring read since boot).
    pub fn from_start(mut self) -> RingReader {
        self.next = 1;
        self
    }

    fn header(&self, src: &impl RingSource) -> Result<Header, RingError> {
        let mut h = [0u8; HEADER_READ];
        src.read_at(self.gpa, &mut h).map_err(RingError::Read)?;
        parse_header(&h, self.gpa, self.bytes)
    }

    /// Entries `first..first+n` (slots, no wrap) as (seq, info) pairs.
    fn slots(
        &self,
        src: &impl RingSource,
        first: u64,
        n: u64,
        out: &mut Vec<(u64, u64)>,
    ) -> Result<(), RingError> {
        let mut buf = vec![0u8; (n * ENTRY) as usize];
        src.read_at(self.gpa + ENTRIES_OFF + first * ENTRY, &mut buf)
            .map_err(RingError::Read)?;
        out.extend(buf.chunks_exact(ENTRY as usize).map(|e| {
            let w = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().unwrap());
            (w(0), w(8))
        }));
        Ok(())
    }

    /// Notices `next..next+n` in order, the ring wrapping at `cap`.
    fn entries(
        &self,
        src: &impl RingSource,
        cap: u64,
        n: u64,
    ) -> Result<Vec<(u64, u64)>, RingError> {
        let start = (self.next - 1) % cap;
        let first = n.min(cap - start);
        let mut out = Vec::with_capacity(n as usize);
        self.slots(src, start, first, &mut out)?;
        if n > first {
            self.slots(src, 0, n - first, &mut out)?;
        }
        Ok(out)
    }

    /// Whether the guest wrote notices since the last poll: one 8-byte read of the
    /// head, for a reader that looks before every I/O request (a poll checks the rest).
    pub fn pending(&self, src: &impl RingSource) -> Result<bool, RingError> {
        let mut h = [0u8; 8];
        src.read_at(self.gpa + 24, &mut h)
            .map_err(RingError::Read)?;
        Ok(u64::from_le_bytes(h) != self.next.wrapping_sub(1))
    }

    /// Where the ring is: (guest physical address, bytes).
    pub fn place(&self) -> (u64, u64) {
        (self.gpa, self.bytes)
    }

    /// The notices written since the last poll.
    pub fn poll(&mut self, src: &impl RingSource) -> Result<Batch, RingError> {
        let h = self.header(src)?;
        let mut batch = Batch::default();
        if h.head < self.next.saturating_sub(1) {
            // The head went back: a new ring (the module was loaded again). Start over.
            self.next = h.head.saturating_add(1);
            return Ok(batch);
        }
        let pending = h.head - (self.next - 1);
        if pending > h.capacity {
            batch.lost = pending - h.capacity;
            self.next = h.head - h.capacity + 1;
        }
        let n = h.head + 1 - self.next;
        if n == 0 {
            return Ok(batch);
        }
        let first = self.entries(src, h.capacity, n)?;
        let again = self.entries(src, h.capacity, n)?;
        for (i, (&(seq, info), &(seq2, _))) in first.iter().zip(&again).enumerate() {
            let want = self.next + i as u64;
            if seq < want && seq2 <= want {
                // Not written yet: take it (and what follows) at the next poll.
                self.next = want;
                return Ok(batch);
            }
            if seq != want || seq2 != want {
                batch.lost += 1;
                continue;
            }
            let pfn = info & ((1 << KIND_SHIFT) - 1);
            match info >> KIND_SHIFT {
                KIND_EVICTED => {
                    batch.evicted.push(pfn);
                    if let Some((per, chunks)) = &h.copies {
                        let s = (want - 1) % h.capacity;
                        batch.copies.push(SlotRef {
                            data_gpa: chunks[(s / per) as usize] + s % per * SLOT,
                            seq_gpa: self.gpa + ENTRIES_OFF + s * ENTRY,
                            seq: want,
                        });
                    }
                }
                KIND_RELEASED => batch.released.push(pfn),
                _ => batch.invalid += 1,
            }
        }
        self.next = h.head + 1;
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A guest writer acting on the ring's bytes.
    type Writer = Box<dyn FnMut(&mut Vec<u8>)>;

    /// Guest memory as a byte vector at GPA 0, with a hook run between reads (a
    /// writer racing the reader).
    struct Mem {
        bytes: RefCell<Vec<u8>>,
        between: RefCell<Option<Writer>>,
        reads: RefCell<u32>,
    }

    impl RingSource for Mem {
        fn read_at(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
            let mut r = self.reads.borrow_mut();
            *r += 1;
            if *r == 3 {
                // After the header and the first copy of the entries.
                if let Some(f) = self.between.borrow_mut().as_mut() {
                    f(&mut self.bytes.borrow_mut());
                }
            }
            let b = self.bytes.borrow();
            let src = b
                .get(gpa as usize..gpa as usize + buf.len())
                .ok_or(MemoryError::NotRam {
                    gpa,
                    why: "past the test memory",
                })?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }

    const BYTES: u64 = 8192;
    const CAP: u64 = (BYTES - ENTRIES_OFF) / ENTRY; // 256
    /// With copies: two chunks of 128 slots right after the ring.
    const PER: u64 = 128;

    fn mem() -> Mem {
        let mut b = vec![0u8; BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(ENTRY as u32).to_le_bytes());
        b[16..24].copy_from_slice(&CAP.to_le_bytes());
        b[44..48].copy_from_slice(&(ENTRIES_OFF as u32).to_le_bytes());
        Mem {
            bytes: RefCell::new(b),
            between: RefCell::new(None),
            reads: RefCell::new(0),
        }
    }

    /// A ring whose evicted pages are copied (the module's default).
    fn mem_with_copies() -> Mem {
        let m = mem();
        {
            let mut b = m.bytes.borrow_mut();
            b.resize((BYTES + 2 * PER * SLOT) as usize, 0);
            b[32..36].copy_from_slice(&(SLOT as u32).to_le_bytes());
            b[36..40].copy_from_slice(&(PER as u32).to_le_bytes());
            b[40..44].copy_from_slice(&2u32.to_le_bytes());
            for i in 0..2 {
                let at = (HEADER + 8 * i) as usize;
                b[at..at + 8].copy_from_slice(&(BYTES + i * PER * SLOT).to_le_bytes());
            }
        }
        m
    }

    /// The guest's writer: notice n for `pfn` of `kind`, its copy filled with the
    /// pfn's low byte when the ring has copies.
    fn push(b: &mut [u8], pfn: u64, kind: u64) {
        let n = u64::from_le_bytes(b[24..32].try_into().unwrap()) + 1;
        b[24..32].copy_from_slice(&n.to_le_bytes());
        let s = (n - 1) % CAP;
        if b.len() as u64 > BYTES && kind == KIND_EVICTED {
            let at = (BYTES + s * SLOT) as usize;
            b[at..at + SLOT as usize].fill(pfn as u8);
        }
        let at = (ENTRIES_OFF + s * ENTRY) as usize;
        b[at..at + 8].copy_from_slice(&n.to_le_bytes());
        b[at + 8..at + 16].copy_from_slice(&(pfn | kind << KIND_SHIFT).to_le_bytes());
    }

    fn poll(r: &mut RingReader, m: &Mem) -> Batch {
        *m.reads.borrow_mut() = 0;
        r.poll(m).unwrap()
    }

    #[test]
    fn notices_come_in_order_across_the_wrap_and_once() {
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        for round in 0..5u64 {
            for i in 0..200 {
                let kind = if i % 10 == 0 {
                    KIND_RELEASED
                } else {
                    KIND_EVICTED
                };
                push(&mut m.bytes.borrow_mut(), round * 1000 + i, kind);
            }
            let b = poll(&mut r, &m);
            assert_eq!((b.evicted.len(), b.released.len(), b.lost), (180, 20, 0));
            assert_eq!(b.evicted[0], round * 1000 + 1);
            assert_eq!(b.released[1], round * 1000 + 10);
            assert_eq!(poll(&mut r, &m), Batch::default(), "nothing twice");
            assert!(!r.pending(&m).unwrap());
            push(&mut m.bytes.borrow_mut(), 1, KIND_EVICTED);
            assert!(r.pending(&m).unwrap());
            assert_eq!(poll(&mut r, &m).evicted, vec![1]);
        }
    }

    #[test]
    fn overwritten_notices_are_counted_lost() {
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        for i in 0..(CAP + 50) {
            push(&mut m.bytes.borrow_mut(), i, KIND_EVICTED);
        }
        let b = poll(&mut r, &m);
        assert_eq!((b.evicted.len() as u64, b.lost), (CAP, 50));
        assert_eq!(b.evicted[0], 50, "the oldest surviving notice comes first");
    }

    #[test]
    fn an_entry_being_written_waits_and_one_overwritten_while_read_is_lost() {
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        for i in 0..3 {
            push(&mut m.bytes.borrow_mut(), i, KIND_EVICTED);
        }
        // Notice 3 reserved but not written yet: seq still 0.
        let at = (ENTRIES_OFF + 2 * ENTRY) as usize;
        m.bytes.borrow_mut()[at..at + 8].fill(0);
        let b = poll(&mut r, &m);
        assert_eq!(b.evicted, vec![0, 1]);
        m.bytes.borrow_mut()[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        assert_eq!(poll(&mut r, &m).evicted, vec![2]);
        // A writer laps notice 4's entry between the two copies: lost, not taken.
        push(&mut m.bytes.borrow_mut(), 9, KIND_EVICTED);
        *m.between.borrow_mut() = Some(Box::new(|b: &mut Vec<u8>| {
            let at = (ENTRIES_OFF + 3 * ENTRY) as usize;
            b[at..at + 8].fill(0); // a writer of notice 4 + CAP began
        }));
        let b = poll(&mut r, &m);
        assert_eq!((b.evicted.len(), b.lost), (0, 1));
    }

    #[test]
    fn malformed_rings_are_refused() {
        let set = |m: &Mem, at: usize, v: &[u8]| {
            m.bytes.borrow_mut()[at..at + v.len()].copy_from_slice(v)
        };
        let m = mem();
        set(&m, 0, b"NOTARING");
        assert!(matches!(
            RingReader::open(&m, 0, BYTES),
            Err(RingError::Magic(0, _))
        ));
        for v in [1u32, 3] {
            let m = mem();
            set(&m, 8, &v.to_le_bytes());
            let e = RingReader::open(&m, 0, BYTES).unwrap_err();
            assert!(matches!(e, RingError::Version(x) if x == v), "{e}");
        }
        let m = mem();
        set(&m, 44, &64u32.to_le_bytes());
        assert!(matches!(
            RingReader::open(&m, 0, BYTES),
            Err(RingError::EntriesOffset(64))
        ));
        let m = mem();
        set(&m, 12, &8u32.to_le_bytes());
        assert!(matches!(
            RingReader::open(&m, 0, BYTES),
            Err(RingError::EntrySize(8))
        ));
        for cap in [CAP + 1, 0, u64::MAX, u64::MAX / ENTRY] {
            let m = mem();
            set(&m, 16, &cap.to_le_bytes());
            let e = RingReader::open(&m, 0, BYTES).unwrap_err();
            assert!(matches!(e, RingError::Capacity { .. }), "{cap}: {e}");
        }
        // Announced larger than the memory holds (truncated), misplaced, oversized.
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        r.bytes = 2 * BYTES;
        set(&m, 16, &(2 * CAP).to_le_bytes());
        push(&mut m.bytes.borrow_mut(), 1, KIND_EVICTED);
        m.bytes.borrow_mut()[24..32].copy_from_slice(&(CAP + 10).to_le_bytes());
        assert!(matches!(r.poll(&m), Err(RingError::Read(_))));
        assert!(matches!(
            RingReader::open(&m, 100, BYTES),
            Err(RingError::Placement(..))
        ));
        assert!(matches!(
            RingReader::open(&m, 0, MAX_BYTES + 4096),
            Err(RingError::Placement(..))
        ));
        assert!(matches!(
            parse_header(&[0u8; 20], 0, BYTES),
            Err(RingError::Read(_))
        ));
        // The module unloaded between polls.
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        set(&m, 0, &0u64.to_le_bytes());
        assert!(matches!(r.poll(&m), Err(RingError::Magic(..))));
    }

    #[test]
    fn each_eviction_comes_with_its_copy_and_releases_with_none() {
        let m = mem_with_copies();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        for round in 0..3u64 {
            for i in 0..200u64 {
                let kind = if i % 4 == 0 {
                    KIND_RELEASED
                } else {
                    KIND_EVICTED
                };
                push(&mut m.bytes.borrow_mut(), round * 1000 + i, kind);
            }
            let b = poll(&mut r, &m);
            assert_eq!(
                (b.evicted.len(), b.copies.len(), b.released.len()),
                (150, 150, 50)
            );
            for (pfn, c) in b.evicted.iter().zip(&b.copies) {
                let mut page = vec![0u8; SLOT as usize];
                m.read_at(c.data_gpa, &mut page).unwrap();
                assert!(page.iter().all(|&x| x == *pfn as u8), "copy of {pfn}");
                let mut seq = [0u8; 8];
                m.read_at(c.seq_gpa, &mut seq).unwrap();
                assert_eq!(u64::from_le_bytes(seq), c.seq);
                assert!(c.data_gpa >= BYTES, "copies live in the chunks");
            }
        }
        // Without copies, evictions come with none.
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        push(&mut m.bytes.borrow_mut(), 3, KIND_EVICTED);
        let b = poll(&mut r, &m);
        assert_eq!((b.evicted, b.copies), (vec![3], vec![]));
    }

    #[test]
    fn malformed_copy_tables_are_refused() {
        let cases: [(usize, u32, &str); 5] = [
            (32, 512, "slots of 512 bytes"),
            (36, 0, "0 slots per chunk"),
            (36, 2048, "2048 slots per chunk"),
            (40, 65, "65 chunks"),
            (40, 1, "1 chunks of 128 slots for 256"),
        ];
        for (at, v, want) in cases {
            let m = mem_with_copies();
            m.bytes.borrow_mut()[at..at + 4].copy_from_slice(&v.to_le_bytes());
            let e = RingReader::open(&m, 0, BYTES).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let m = mem_with_copies();
        m.bytes.borrow_mut()[HEADER as usize + 8..HEADER as usize + 16]
            .copy_from_slice(&(BYTES + 100).to_le_bytes());
        let e = RingReader::open(&m, 0, BYTES).unwrap_err().to_string();
        assert!(e.contains("chunk 1 at"), "{e}");
        let m = mem_with_copies();
        m.bytes.borrow_mut()[HEADER as usize..HEADER as usize + 8]
            .copy_from_slice(&(!4095u64).to_le_bytes());
        let e = RingReader::open(&m, 0, BYTES).unwrap_err().to_string();
        assert!(e.contains("chunk 0 at"), "{e}");
    }

    /// Found by the `evict_ring` fuzz target: the reader counted to head + 1, which
    /// overflowed (a panic with overflow checks, a reader at notice 0 without).
    #[test]
    fn a_head_at_the_end_of_the_count_is_refused() {
        let m = mem();
        m.bytes.borrow_mut()[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            RingReader::open(&m, 0, BYTES),
            Err(RingError::Head(u64::MAX))
        ));
        m.bytes.borrow_mut()[24..32].copy_from_slice(&0u64.to_le_bytes());
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        m.bytes.borrow_mut()[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(r.poll(&m), Err(RingError::Head(u64::MAX))));
        m.bytes.borrow_mut()[24..32].copy_from_slice(&0u64.to_le_bytes());
        push(&mut m.bytes.borrow_mut(), 8, KIND_EVICTED);
        assert_eq!(poll(&mut r, &m).evicted, vec![8]);
    }

    #[test]
    fn unknown_kinds_and_a_head_that_goes_back_do_no_harm() {
        let m = mem();
        let mut r = RingReader::open(&m, 0, BYTES).unwrap();
        push(&mut m.bytes.borrow_mut(), 5, 7);
        push(&mut m.bytes.borrow_mut(), 6, KIND_RELEASED);
        let b = poll(&mut r, &m);
        assert_eq!((b.invalid, b.released.clone()), (1, vec![6]));
        m.bytes.borrow_mut()[24..32].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(poll(&mut r, &m), Batch::default());
        push(&mut m.bytes.borrow_mut(), 8, KIND_EVICTED);
        assert_eq!(poll(&mut r, &m).evicted, vec![8]);
    }
}
