//! The eviction-notice ring, read from guest memory the guest controls.

use rebound_guestmem::evict_ring::{RingReader, RingSource, ENTRIES_OFF};
use rebound_guestmem::memory::MemoryError;

use crate::{err, Verdict};

/// Bytes of the input that are the ring's header page (the fixed header and the
/// chunk table); the rest are its entries.
pub const RING_HEAD: usize = 576;

/// Guest memory for the ring reader: the header page at GPA 0, the entries at
/// [`ENTRIES_OFF`], nothing else (a read elsewhere fails, as one outside RAM does).
struct Mem {
    head: Vec<u8>,
    entries: Vec<u8>,
}

impl RingSource for Mem {
    fn read_at(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let outside = || MemoryError::NotRam {
            gpa,
            why: "outside the fuzzed ring",
        };
        let (mem, at) = match gpa.checked_sub(ENTRIES_OFF) {
            Some(at) => (&self.entries, at),
            None => (&self.head, gpa),
        };
        let at = usize::try_from(at).map_err(|_| outside())?;
        let src = at.checked_add(buf.len()).and_then(|end| mem.get(at..end));
        // Header reads run past the header's 64 bytes into the chunk table: zeros, as
        // in the guest's page.
        match src {
            Some(s) => buf.copy_from_slice(s),
            None if gpa < ENTRIES_OFF && at + buf.len() <= ENTRIES_OFF as usize => {
                buf.fill(0);
                let n = mem.len().saturating_sub(at).min(buf.len());
                buf[..n].copy_from_slice(&mem[at..at + n]);
            }
            None => return Err(outside()),
        }
        Ok(())
    }
}

/// The ring the guest announced: the input's first 4 bytes are the ring's length as
/// the agent reports it (little-endian), the next [`RING_HEAD`] its header page, the
/// rest its entries. The reader is opened, rewound to the first notice, and polled
/// twice, as the block backend polls it.
pub fn evict_ring(data: &[u8]) -> Verdict {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return Err("shorter than the ring length".into());
    };
    let bytes = u64::from(u32::from_le_bytes(*len));
    let (head, entries) = rest.split_at(rest.len().min(RING_HEAD));
    let mem = Mem {
        head: head.to_vec(),
        entries: entries.to_vec(),
    };
    let mut reader = RingReader::open(&mem, 0, bytes).map_err(err)?.from_start();
    for _ in 0..2 {
        let batch = reader.poll(&mem).map_err(err)?;
        let _ = reader.pending(&mem);
        let _ = (
            batch.evicted.len(),
            batch.copies.len(),
            batch.released.len(),
        );
    }
    Ok(())
}
