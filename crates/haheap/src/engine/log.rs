//! `log` engine (the talk's "emulation"): every write goes through `Heap::write`, which logs
//! its (offset, length) and the bytes it overwrites. No faults, no page tables: the cost is
//! per write, so it wins for small transactions. At the end it ships exactly the written
//! byte ranges, coalesced; abort replays the undo log backwards. Direct stores through the
//! heap's pointer are invisible to this engine.

use super::{Dirty, EngineError, Tracker};
use crate::config::EngineKind;

pub struct LogEngine {
    page: usize,
    /// (offset, len, position in `undo_bytes`) of each write, in order.
    writes: Vec<(usize, usize, usize)>,
    undo_bytes: Vec<u8>,
}

impl LogEngine {
    pub fn new(page: usize) -> LogEngine {
        LogEngine {
            page,
            writes: Vec::new(),
            undo_bytes: Vec::new(),
        }
    }
}

impl Tracker for LogEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Log
    }

    fn begin(&mut self) -> Result<(), EngineError> {
        self.writes.clear();
        self.undo_bytes.clear();
        Ok(())
    }

    fn before_write(&mut self, mem: &[u8], off: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.writes.push((off, len, self.undo_bytes.len()));
        self.undo_bytes.extend_from_slice(&mem[off..off + len]);
    }

    fn take(&mut self, out: &mut Dirty) -> Result<(), EngineError> {
        out.clear();
        out.ranges
            .extend(self.writes.iter().map(|&(o, l, _)| (o, l)));
        out.ranges.sort_unstable();
        // Merge overlapping and touching ranges.
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(out.ranges.len());
        for &(o, l) in &out.ranges {
            match merged.last_mut() {
                Some((mo, ml)) if o <= *mo + *ml => *ml = (*ml).max(o + l - *mo),
                _ => merged.push((o, l)),
            }
        }
        out.ranges = merged;
        for &(o, l) in &out.ranges {
            let (first, last) = (o / self.page, (o + l - 1) / self.page);
            let from = match out.pages.last() {
                Some(&p) if p >= first => p + 1,
                _ => first,
            };
            out.pages.extend(from..=last);
        }
        Ok(())
    }

    fn rearm(&mut self, _taken: &Dirty) -> Result<(), EngineError> {
        // Nothing is protected; the next transaction starts a new log.
        self.writes.clear();
        self.undo_bytes.clear();
        Ok(())
    }

    fn restore(
        &mut self,
        _taken: &Dirty,
        mem: &mut [u8],
        _shadow: &[u8],
    ) -> Result<(), EngineError> {
        for &(off, len, pos) in self.writes.iter().rev() {
            mem[off..off + len].copy_from_slice(&self.undo_bytes[pos..pos + len]);
        }
        self.writes.clear();
        self.undo_bytes.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalesces_overlapping_and_adjacent_writes() {
        let mut mem = vec![0u8; 16384];
        let mut e = LogEngine::new(4096);
        e.begin().unwrap();
        for (o, l) in [
            (5000, 10),
            (100, 8),
            (104, 8),
            (112, 4),
            (4090, 12),
            (9000, 1),
        ] {
            e.before_write(&mem, o, l);
            mem[o..o + l].fill(1);
        }
        let mut d = Dirty::default();
        e.take(&mut d).unwrap();
        assert_eq!(d.ranges, vec![(100, 16), (4090, 12), (5000, 10), (9000, 1)]);
        assert_eq!(d.pages, vec![0, 1, 2]);
        e.restore(&d, &mut mem, &[]).unwrap();
        assert!(mem.iter().all(|&b| b == 0));
    }
}
