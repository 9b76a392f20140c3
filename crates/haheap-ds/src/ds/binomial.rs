//! Binomial queue (Weiss `binomial.c`): a forest of binomial trees (left child, next
//! sibling) indexed by order in the table area, merged with a carry like binary
//! addition. The book's temporary queues (the one-node queue of an insert, the
//! children of a deleted root) are malloc'd scratch there and are locals here.

use crate::region::{check_key, Checker, Region, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const CHILD: usize = 1;
const SIBLING: usize = 2;
const WORDS: usize = 3;
const ID: u64 = 3;
const MAX_TREES: usize = 48;
const SIZE: usize = 0; // aux word: number of keys

/// The `bin` structure.
pub struct Binomial;

fn combine(m: &mut dyn TxMem, r: &Region, t1: u64, t2: u64) -> u64 {
    let (t1, t2) = if r.get(m, t1, KEY) > r.get(m, t2, KEY) {
        (t2, t1)
    } else {
        (t1, t2)
    };
    let c = r.get(m, t1, CHILD);
    r.set(m, t2, SIBLING, c);
    r.set(m, t1, CHILD, t2);
    t1
}

/// Weiss `Merge(H1, H2)` with H1 in the region and H2 the local `h2` of `h2_size` keys.
fn merge(m: &mut dyn TxMem, r: &Region, h2: &mut [u64; MAX_TREES], h2_size: u64) {
    let size = r.aux(m, SIZE) + h2_size;
    r.set_aux(m, SIZE, size);
    let mut carry = NIL;
    let (mut i, mut j) = (0usize, 1u64);
    while j <= size && i < MAX_TREES {
        let t1 = r.table(m, i);
        let t2 = h2[i];
        match (t1 != NIL) as u8 + 2 * (t2 != NIL) as u8 + 4 * (carry != NIL) as u8 {
            2 => {
                r.set_table(m, i, t2);
                h2[i] = NIL;
            }
            4 => {
                r.set_table(m, i, carry);
                carry = NIL;
            }
            3 => {
                carry = combine(m, r, t1, t2);
                r.set_table(m, i, NIL);
                h2[i] = NIL;
            }
            5 => {
                carry = combine(m, r, t1, carry);
                r.set_table(m, i, NIL);
            }
            6 => {
                carry = combine(m, r, t2, carry);
                h2[i] = NIL;
            }
            7 => {
                r.set_table(m, i, carry);
                carry = combine(m, r, t1, t2);
                h2[i] = NIL;
            }
            _ => {}
        }
        i += 1;
        j *= 2;
    }
}

fn check_tree(
    m: &dyn TxMem,
    r: &Region,
    chk: &mut Checker,
    n: u64,
    order: usize,
    keys: &mut Vec<u64>,
) -> Result<(), DsError> {
    let k = r.get(m, n, KEY);
    keys.push(k);
    let mut c = r.get(m, n, CHILD);
    for want in (0..order).rev() {
        chk.visit(c, &format!("child of order {want} of node {n}"))?;
        if r.get(m, c, KEY) < k {
            return Err(chk.err(format!("node {c} is smaller than its parent {n}")));
        }
        check_tree(m, r, chk, c, want, keys)?;
        c = r.get(m, c, SIBLING);
    }
    if c != NIL {
        return Err(chk.err(format!(
            "node {n} of order {order} has more than {order} children"
        )));
    }
    Ok(())
}

impl Structure for Binomial {
    fn name() -> &'static str {
        "bin"
    }
    fn kind() -> Kind {
        Kind::MinHeap
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let r = Region::format(m, ID, WORDS, MAX_TREES)?;
        r.zero_table(m, 0, MAX_TREES);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let n = r.alloc(m)?;
        r.set(m, n, KEY, key);
        r.set(m, n, CHILD, NIL);
        r.set(m, n, SIBLING, NIL);
        let mut h2 = [NIL; MAX_TREES];
        h2[0] = n;
        merge(m, &r, &mut h2, 1);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, _key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        if r.aux(m, SIZE) == 0 {
            return Ok(None);
        }
        let mut min_tree = None;
        let mut min = u64::MAX;
        for i in 0..MAX_TREES {
            let t = r.table(m, i);
            if t != NIL && (min_tree.is_none() || r.get(m, t, KEY) < min) {
                min = r.get(m, t, KEY);
                min_tree = Some(i);
            }
        }
        let Some(mi) = min_tree else {
            return Ok(None);
        };
        let old_root = r.table(m, mi);
        let mut child = r.get(m, old_root, CHILD);
        r.free(m, old_root);
        let mut h2 = [NIL; MAX_TREES];
        for j in (0..mi).rev() {
            h2[j] = child;
            child = r.get(m, child, SIBLING);
            r.set(m, h2[j], SIBLING, NIL);
        }
        r.set_table(m, mi, NIL);
        let h2_size = (1u64 << mi) - 1;
        let size = r.aux(m, SIZE) - (h2_size + 1);
        r.set_aux(m, SIZE, size);
        merge(m, &r, &mut h2, h2_size);
        Ok(Some(min))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut chk = Checker::new(Self::name(), m, &r)?;
        if r.table_words < MAX_TREES {
            return Err(chk.err(format!("forest table of {} words", r.table_words)));
        }
        let mut keys = Vec::new();
        let mut total = 0u64;
        for i in 0..MAX_TREES {
            let t = r.table(m, i);
            if t == NIL {
                continue;
            }
            chk.visit(t, &format!("tree of order {i}"))?;
            if r.get(m, t, SIBLING) != NIL {
                return Err(chk.err(format!("root of order {i} has a sibling")));
            }
            check_tree(m, &r, &mut chk, t, i, &mut keys)?;
            total += 1 << i;
        }
        chk.finish()?;
        let size = r.aux(m, SIZE);
        if size != total {
            return Err(chk.err(format!("size word says {size}, the trees hold {total}")));
        }
        keys.sort_unstable();
        Ok(keys)
    }
}
