//! Plain and counting implementations of [`TxMem`].

use std::collections::HashSet;

use crate::TxMem;

/// A region held in a `Vec<u8>` (tests, replays, write profiles).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VecMem(pub Vec<u8>);

impl VecMem {
    /// A zeroed region of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        VecMem(vec![0; len])
    }
}

impl TxMem for VecMem {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        buf.copy_from_slice(&self.0[off..off + buf.len()]);
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        self.0[off..off + data.len()].copy_from_slice(data);
    }
}

/// What one operation stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCount {
    /// Number of `write` calls.
    pub writes: u64,
    /// Bytes passed to `write`.
    pub bytes: u64,
    /// Distinct pages touched by those writes.
    pub pages: u64,
}

/// Wraps a region and counts writes, bytes and distinct pages since the last `take()`.
pub struct CountingMem<M: TxMem> {
    inner: M,
    page_size: usize,
    count: OpCount,
    pages: HashSet<usize>,
}

impl<M: TxMem> CountingMem<M> {
    /// Counts writes to `inner` with pages of `page_size` bytes.
    pub fn new(inner: M, page_size: usize) -> Self {
        CountingMem {
            inner,
            page_size,
            count: OpCount::default(),
            pages: HashSet::new(),
        }
    }

    /// Returns the counts since the previous call and starts a new count.
    pub fn take(&mut self) -> OpCount {
        let mut c = self.count;
        c.pages = self.pages.len() as u64;
        self.count = OpCount::default();
        self.pages.clear();
        c
    }

    /// The wrapped region.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// Gives the wrapped region back.
    pub fn into_inner(self) -> M {
        self.inner
    }
}

impl<M: TxMem> TxMem for CountingMem<M> {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn read(&self, off: usize, buf: &mut [u8]) {
        self.inner.read(off, buf)
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        self.count.writes += 1;
        self.count.bytes += data.len() as u64;
        if !data.is_empty() {
            for p in off / self.page_size..=(off + data.len() - 1) / self.page_size {
                self.pages.insert(p);
            }
        }
        self.inner.write(off, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_pages_spanned_by_a_write() {
        let mut m = CountingMem::new(VecMem::zeroed(3 * 4096), 4096);
        m.write_u64(4092, 7); // spans pages 0 and 1
        m.write_u64(8, 1);
        let c = m.take();
        assert_eq!((c.writes, c.bytes, c.pages), (2, 16, 2));
        assert_eq!(m.take(), OpCount::default());
        assert_eq!(m.read_u64(4092), 7);
    }
}
