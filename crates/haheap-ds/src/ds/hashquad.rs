//! Open addressing with quadratic probing and lazy deletion (Weiss `hashquad.c`). Cells
//! are (key, state) word pairs. The book rehashes on demand; here the table is rehashed
//! into the other of two table areas when an insert would fill it past one half (the
//! bound under which quadratic probing in a prime-sized table always finds a cell), to
//! a prime near four times the live keys, so deleted cells are dropped.

use crate::region::{check_key, Checker, Region, HEADER_LEN};
use crate::{DsError, Kind, Structure, TxMem};

const ID: u64 = 5;
const EMPTY: u64 = 0;
const LEGIT: u64 = 1;
const DELETED: u64 = 2;
const MIN_SIZE: u64 = 11;
// aux words
const AREA: usize = 0; // 0 or 1: which half of the table holds the live table
const SIZE: usize = 1; // cells in the live table (prime)
const OCCUPIED: usize = 2; // legitimate + deleted cells
const LIVE: usize = 3; // legitimate cells

/// The `hashquad` structure.
pub struct HashQuad;

/// Smallest prime at least `n`.
pub fn next_prime(n: u64) -> u64 {
    let mut n = n.max(2);
    while !(2..)
        .take_while(|d| d * d <= n)
        .all(|d| !n.is_multiple_of(d))
    {
        n += 1;
    }
    n
}

struct Table {
    base: usize, // first word of the live area
    size: u64,
}

impl Table {
    fn load(m: &dyn TxMem, r: &Region) -> Table {
        let cells_per_area = r.table_words / 4;
        Table {
            base: r.aux(m, AREA) as usize * cells_per_area * 2,
            size: r.aux(m, SIZE),
        }
    }
    fn key(&self, m: &dyn TxMem, r: &Region, i: u64) -> u64 {
        r.table(m, self.base + 2 * i as usize)
    }
    fn state(&self, m: &dyn TxMem, r: &Region, i: u64) -> u64 {
        r.table(m, self.base + 2 * i as usize + 1)
    }
    fn set(&self, m: &mut dyn TxMem, r: &Region, i: u64, key: u64, state: u64) {
        // The book stores the state first, then the element.
        r.set_table(m, self.base + 2 * i as usize + 1, state);
        r.set_table(m, self.base + 2 * i as usize, key);
    }
    /// Weiss `Find`: the cell holding `key` or the empty cell ending its probe sequence.
    fn find(&self, m: &dyn TxMem, r: &Region, key: u64) -> Option<u64> {
        let mut pos = key % self.size;
        let mut collisions = 0;
        while self.state(m, r, pos) != EMPTY && self.key(m, r, pos) != key {
            collisions += 1;
            if collisions > self.size {
                return None;
            }
            pos += 2 * collisions - 1;
            while pos >= self.size {
                pos -= self.size;
            }
        }
        Some(pos)
    }
}

fn rehash(m: &mut dyn TxMem, r: &Region) -> Result<(), DsError> {
    let old = Table::load(m, r);
    let live = r.aux(m, LIVE);
    let cells_per_area = (r.table_words / 4) as u64;
    let size = next_prime((4 * live + 1).max(MIN_SIZE));
    if size > cells_per_area {
        return Err(DsError::Full);
    }
    let area = 1 - r.aux(m, AREA);
    let new = Table {
        base: area as usize * cells_per_area as usize * 2,
        size,
    };
    for i in 0..size {
        r.set_table(m, new.base + 2 * i as usize + 1, EMPTY);
    }
    for i in 0..old.size {
        if old.state(m, r, i) == LEGIT {
            let k = old.key(m, r, i);
            let pos = new.find(m, r, k).ok_or(DsError::Full)?;
            new.set(m, r, pos, k, LEGIT);
        }
    }
    r.set_aux(m, AREA, area);
    r.set_aux(m, SIZE, size);
    r.set_aux(m, OCCUPIED, live);
    Ok(())
}

impl Structure for HashQuad {
    fn name() -> &'static str {
        "hashquad"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let cells_per_area = m.len().saturating_sub(HEADER_LEN + 64) / 32;
        if (cells_per_area as u64) < MIN_SIZE {
            return Err(DsError::TooSmall {
                len: m.len(),
                need: HEADER_LEN + 64 + 32 * MIN_SIZE as usize,
            });
        }
        let r = Region::format(m, ID, 0, cells_per_area * 4)?;
        r.set_aux(m, AREA, 0);
        r.set_aux(m, SIZE, MIN_SIZE);
        r.set_aux(m, OCCUPIED, 0);
        r.set_aux(m, LIVE, 0);
        r.zero_table(m, 0, 2 * MIN_SIZE as usize);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, 0)?;
        if 2 * (r.aux(m, OCCUPIED) + 1) > r.aux(m, SIZE) {
            rehash(m, &r)?;
        }
        let t = Table::load(m, &r);
        let pos = t.find(m, &r, key).ok_or(DsError::Full)?;
        let state = t.state(m, &r, pos);
        if state == LEGIT {
            return Ok(false);
        }
        t.set(m, &r, pos, key, LEGIT);
        if state == EMPTY {
            let occ = r.aux(m, OCCUPIED) + 1;
            r.set_aux(m, OCCUPIED, occ);
        }
        let live = r.aux(m, LIVE) + 1;
        r.set_aux(m, LIVE, live);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let t = Table::load(m, &r);
        let Some(pos) = t.find(m, &r, key) else {
            return Ok(None);
        };
        if t.state(m, &r, pos) != LEGIT {
            return Ok(None);
        }
        r.set_table(m, t.base + 2 * pos as usize + 1, DELETED);
        let live = r.aux(m, LIVE) - 1;
        r.set_aux(m, LIVE, live);
        Ok(Some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let chk = Checker::new(Self::name(), m, &r)?;
        chk.finish()?;
        let cells_per_area = (r.table_words / 4) as u64;
        let (area, size) = (r.aux(m, AREA), r.aux(m, SIZE));
        if area > 1 || size < MIN_SIZE || size > cells_per_area || next_prime(size) != size {
            return Err(chk.err(format!(
                "table area {area} of size {size} (areas hold {cells_per_area})"
            )));
        }
        let t = Table::load(m, &r);
        let (mut keys, mut occupied) = (Vec::new(), 0u64);
        for i in 0..size {
            match t.state(m, &r, i) {
                EMPTY => {}
                DELETED => occupied += 1,
                LEGIT => {
                    occupied += 1;
                    let k = t.key(m, &r, i);
                    if t.find(m, &r, k) != Some(i) {
                        return Err(chk.err(format!(
                            "key {k} in cell {i} is not where its probe sequence ends"
                        )));
                    }
                    keys.push(k);
                }
                s => return Err(chk.err(format!("cell {i} has state {s}"))),
            }
        }
        let (occ_word, live_word) = (r.aux(m, OCCUPIED), r.aux(m, LIVE));
        if occ_word != occupied || live_word != keys.len() as u64 || 2 * occupied > size {
            return Err(chk.err(format!(
                "counts say {live_word} live / {occ_word} occupied, cells hold {} / {occupied} of {size}",
                keys.len()
            )));
        }
        keys.sort_unstable();
        Ok(keys)
    }
}
