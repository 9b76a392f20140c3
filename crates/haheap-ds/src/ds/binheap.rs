//! Binary heap (Weiss `binheap.c`): an implicit array in the table area, percolate up
//! on insert and down on delete-min. The book's `MinData` sentinel in slot 0 is replaced
//! by a bound check, so every u64 key is allowed.

use crate::region::{check_key, Checker, Region, HEADER_LEN};
use crate::{DsError, Kind, Structure, TxMem};

const ID: u64 = 8;
const SIZE: usize = 0; // aux word

/// The `heap` structure.
pub struct BinHeap;

impl Structure for BinHeap {
    fn name() -> &'static str {
        "heap"
    }
    fn kind() -> Kind {
        Kind::MinHeap
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let words = m.len().saturating_sub(HEADER_LEN + 64) / 8;
        Region::format(m, ID, 0, words.max(2))?;
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, 0)?;
        let size = r.aux(m, SIZE) as usize;
        if size + 1 >= r.table_words {
            return Err(DsError::Full);
        }
        let mut i = size + 1;
        r.set_aux(m, SIZE, i as u64);
        while i > 1 && r.table(m, i / 2) > key {
            let p = r.table(m, i / 2);
            r.set_table(m, i, p);
            i /= 2;
        }
        r.set_table(m, i, key);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, _key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let size = r.aux(m, SIZE) as usize;
        if size == 0 {
            return Ok(None);
        }
        let min = r.table(m, 1);
        let last = r.table(m, size);
        let size = size - 1;
        r.set_aux(m, SIZE, size as u64);
        let mut i = 1;
        while i * 2 <= size {
            let mut child = i * 2;
            if child != size && r.table(m, child + 1) < r.table(m, child) {
                child += 1;
            }
            let c = r.table(m, child);
            if last > c {
                r.set_table(m, i, c);
            } else {
                break;
            }
            i = child;
        }
        if size > 0 {
            r.set_table(m, i, last);
        }
        Ok(Some(min))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let chk = Checker::new(Self::name(), m, &r)?;
        chk.finish()?;
        let size = r.aux(m, SIZE) as usize;
        if size >= r.table_words {
            return Err(chk.err(format!(
                "size {size} exceeds the array of {}",
                r.table_words
            )));
        }
        let mut keys = Vec::with_capacity(size);
        for i in 1..=size {
            let k = r.table(m, i);
            if i > 1 && r.table(m, i / 2) > k {
                return Err(chk.err(format!("slot {i} key {k} is below its parent")));
            }
            keys.push(k);
        }
        keys.sort_unstable();
        Ok(keys)
    }
}
