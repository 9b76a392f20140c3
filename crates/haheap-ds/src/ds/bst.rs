//! Unbalanced binary search tree (Weiss `tree.c`): recursive insert and delete that
//! re-store the child pointer at every level, as the book does.

use crate::region::{check_key, check_tree, sorted_keys, Region, TreeOrder, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LEFT: usize = 1;
const RIGHT: usize = 2;
const WORDS: usize = 3;
const ID: u64 = 11;

/// The `tree` structure.
pub struct Bst;

fn insert_at(
    m: &mut dyn TxMem,
    r: &Region,
    t: u64,
    key: u64,
    done: &mut bool,
) -> Result<u64, DsError> {
    if t == NIL {
        let n = r.alloc(m)?;
        r.set(m, n, KEY, key);
        r.set(m, n, LEFT, NIL);
        r.set(m, n, RIGHT, NIL);
        *done = true;
        return Ok(n);
    }
    let k = r.get(m, t, KEY);
    if key < k {
        let l = r.get(m, t, LEFT);
        let l = insert_at(m, r, l, key, done)?;
        r.set(m, t, LEFT, l);
    } else if key > k {
        let rt = r.get(m, t, RIGHT);
        let rt = insert_at(m, r, rt, key, done)?;
        r.set(m, t, RIGHT, rt);
    }
    Ok(t)
}

fn find_min(m: &dyn TxMem, r: &Region, mut t: u64) -> u64 {
    while r.get(m, t, LEFT) != NIL {
        t = r.get(m, t, LEFT);
    }
    t
}

fn delete_at(m: &mut dyn TxMem, r: &Region, t: u64, key: u64, done: &mut bool) -> u64 {
    if t == NIL {
        return NIL;
    }
    let k = r.get(m, t, KEY);
    let (l, rt) = (r.get(m, t, LEFT), r.get(m, t, RIGHT));
    if key < k {
        let nl = delete_at(m, r, l, key, done);
        r.set(m, t, LEFT, nl);
    } else if key > k {
        let nr = delete_at(m, r, rt, key, done);
        r.set(m, t, RIGHT, nr);
    } else if l != NIL && rt != NIL {
        let min = r.get(m, find_min(m, r, rt), KEY);
        r.set(m, t, KEY, min);
        let nr = delete_at(m, r, rt, min, done);
        r.set(m, t, RIGHT, nr);
    } else {
        *done = true;
        r.free(m, t);
        return if l == NIL { rt } else { l };
    }
    t
}

impl Structure for Bst {
    fn name() -> &'static str {
        "tree"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        Region::format(m, ID, WORDS, 0)?;
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let mut done = false;
        let root = r.root(m);
        let root = insert_at(m, &r, root, key, &mut done)?;
        r.set_root(m, root);
        Ok(done)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut done = false;
        let root = r.root(m);
        let root = delete_at(m, &r, root, key, &mut done);
        r.set_root(m, root);
        Ok(done.then_some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let (_, _, nodes) = check_tree(
            m,
            Self::name(),
            ID,
            WORDS,
            (KEY, LEFT, RIGHT),
            TreeOrder::Search,
        )?;
        Ok(sorted_keys(&nodes))
    }
}
