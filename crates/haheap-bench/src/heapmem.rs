//! A structure region backed by a haheap `Heap`: page engines get plain stores (what an
//! application does; the engine must find them), `log` gets `Heap::write` (the only writes
//! it can see).

use haheap::Heap;
use haheap_ds::TxMem;

/// [`TxMem`] over a heap inside an open transaction, counting what was stored.
pub struct HeapMem<'a> {
    heap: &'a mut Heap,
    direct: bool,
    /// `write` calls.
    pub writes: u64,
    /// Bytes stored.
    pub bytes: u64,
    /// The first `Heap::write` failure, if any (TxMem stores cannot return errors).
    pub failed: Option<haheap::Error>,
}

impl<'a> HeapMem<'a> {
    pub fn new(heap: &'a mut Heap) -> HeapMem<'a> {
        let direct = heap.engine().is_page_level();
        HeapMem {
            heap,
            direct,
            writes: 0,
            bytes: 0,
            failed: None,
        }
    }
}

impl TxMem for HeapMem<'_> {
    fn len(&self) -> usize {
        self.heap.len()
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        buf.copy_from_slice(&self.heap.as_slice()[off..off + buf.len()]);
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        self.writes += 1;
        self.bytes += data.len() as u64;
        if self.direct {
            assert!(
                off.checked_add(data.len())
                    .is_some_and(|e| e <= self.heap.len()),
                "store of {} bytes at {off} outside the heap",
                data.len()
            );
            // SAFETY: the range was checked to lie inside the heap's mapping, which lives as
            // long as `self.heap`; `data` is a separate buffer (structures never pass a slice
            // of the heap itself), so the copy does not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.heap.as_mut_ptr().add(off),
                    data.len(),
                )
            };
        } else if let Err(e) = self.heap.write(off, data) {
            self.failed.get_or_insert(e);
        }
    }
}

/// A read-only view of a heap's contents, for `check()` after takeover.
pub struct SliceMem<'a>(pub &'a [u8]);

impl TxMem for SliceMem<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        buf.copy_from_slice(&self.0[off..off + buf.len()]);
    }
    fn write(&mut self, _off: usize, _data: &[u8]) {
        panic!("SliceMem is read-only: check() must not store");
    }
}
