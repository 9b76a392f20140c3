//! Array queue (Weiss `queue.c`): a circular array in the table area with front, rear
//! and size words; enqueue bumps rear, dequeue bumps front.

use crate::region::{check_key, Checker, Region, HEADER_LEN};
use crate::{DsError, Kind, Structure, TxMem};

const ID: u64 = 13;
// aux words
const FRONT: usize = 0;
const REAR: usize = 1;
const SIZE: usize = 2;

/// The `queue` structure.
pub struct Queue;

fn succ(v: u64, cap: u64) -> u64 {
    if v + 1 == cap {
        0
    } else {
        v + 1
    }
}

impl Structure for Queue {
    fn name() -> &'static str {
        "queue"
    }
    fn kind() -> Kind {
        Kind::Fifo
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let words = m.len().saturating_sub(HEADER_LEN + 64) / 8;
        let r = Region::format(m, ID, 0, words.max(2))?;
        // MakeEmpty: Front = 1, Rear = 0.
        r.set_aux(m, FRONT, 1);
        r.set_aux(m, REAR, 0);
        r.set_aux(m, SIZE, 0);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, 0)?;
        let cap = r.table_words as u64;
        let size = r.aux(m, SIZE);
        if size == cap {
            return Err(DsError::Full);
        }
        r.set_aux(m, SIZE, size + 1);
        let rear = succ(r.aux(m, REAR), cap);
        r.set_aux(m, REAR, rear);
        r.set_table(m, rear as usize, key);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, _key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let size = r.aux(m, SIZE);
        if size == 0 {
            return Ok(None);
        }
        let front = r.aux(m, FRONT);
        let key = r.table(m, front as usize);
        r.set_aux(m, SIZE, size - 1);
        r.set_aux(m, FRONT, succ(front, r.table_words as u64));
        Ok(Some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, 0)?;
        let chk = Checker::new(Self::name(), m, &r)?;
        chk.finish()?;
        let cap = r.table_words as u64;
        let (front, rear, size) = (r.aux(m, FRONT), r.aux(m, REAR), r.aux(m, SIZE));
        if cap == 0
            || front >= cap
            || rear >= cap
            || size > cap
            || (front + size + cap - 1) % cap != rear
        {
            return Err(chk.err(format!(
                "front {front}, rear {rear} and size {size} disagree in an array of {cap}"
            )));
        }
        let mut keys: Vec<u64> = (0..size)
            .map(|i| r.table(m, ((front + i) % cap) as usize))
            .collect();
        keys.sort_unstable();
        Ok(keys)
    }
}
