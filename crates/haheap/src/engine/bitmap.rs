//! A lock-free page bitmap that a signal handler or fault thread sets and `tend` drains.
//!
//! Two levels: a summary bit per 64-bit word says which words hold set bits, so draining
//! a 1 GiB region with a few dirty pages reads ~64 summary words, not 4096.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct PageBitmap {
    words: Box<[AtomicU64]>,
    summary: Box<[AtomicU64]>,
    pages: usize,
}

impl PageBitmap {
    pub fn new(pages: usize) -> PageBitmap {
        let nwords = pages.div_ceil(64);
        let nsum = nwords.div_ceil(64);
        PageBitmap {
            words: (0..nwords).map(|_| AtomicU64::new(0)).collect(),
            summary: (0..nsum).map(|_| AtomicU64::new(0)).collect(),
            pages,
        }
    }

    /// Marks `page`. Async-signal-safe: two lock-free atomic ORs, no allocation.
    pub fn set(&self, page: usize) {
        if page >= self.pages {
            return;
        }
        let w = page / 64;
        self.words[w].fetch_or(1 << (page % 64), Ordering::Release);
        self.summary[w / 64].fetch_or(1 << (w % 64), Ordering::Release);
    }

    /// Appends the marked pages in ascending order to `out` and clears them.
    pub fn drain(&self, out: &mut Vec<usize>) {
        for (si, s) in self.summary.iter().enumerate() {
            let mut sbits = s.swap(0, Ordering::Acquire);
            while sbits != 0 {
                let w = si * 64 + sbits.trailing_zeros() as usize;
                sbits &= sbits - 1;
                let mut bits = self.words[w].swap(0, Ordering::Acquire);
                while bits != 0 {
                    out.push(w * 64 + bits.trailing_zeros() as usize);
                    bits &= bits - 1;
                }
            }
        }
    }

    /// The bitmap's address, handed to the signal handler's table.
    pub fn as_ptr(&self) -> *const PageBitmap {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_returns_sorted_unique_and_clears() {
        let b = PageBitmap::new(10_000);
        for p in [9_999, 0, 63, 64, 4_095, 4_096, 63, 5_000] {
            b.set(p);
        }
        b.set(10_000); // out of range: ignored
        let mut v = Vec::new();
        b.drain(&mut v);
        assert_eq!(v, vec![0, 63, 64, 4_095, 4_096, 5_000, 9_999]);
        v.clear();
        b.drain(&mut v);
        assert!(v.is_empty());
    }
}
