//! Leftist heap (Weiss `leftheap.c`): recursive merge down the right paths, children
//! swapped when the null path length of the left falls below the right. The null path
//! length is stored plus one so nil has 0.

use crate::region::{check_key, check_tree, fold_up, sorted_keys, Region, TreeOrder, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LEFT: usize = 1;
const RIGHT: usize = 2;
const NPL: usize = 3;
const WORDS: usize = 4;
const ID: u64 = 7;

/// The `leftheap` structure.
pub struct Leftist;

fn npl(m: &dyn TxMem, r: &Region, n: u64) -> u64 {
    if n == NIL {
        0
    } else {
        r.get(m, n, NPL)
    }
}

fn merge(m: &mut dyn TxMem, r: &Region, h1: u64, h2: u64) -> u64 {
    if h1 == NIL {
        return h2;
    }
    if h2 == NIL {
        return h1;
    }
    if r.get(m, h1, KEY) < r.get(m, h2, KEY) {
        merge1(m, r, h1, h2)
    } else {
        merge1(m, r, h2, h1)
    }
}

fn merge1(m: &mut dyn TxMem, r: &Region, h1: u64, h2: u64) -> u64 {
    let l = r.get(m, h1, LEFT);
    if l == NIL {
        // A single node; its right is nil and its npl stays.
        r.set(m, h1, LEFT, h2);
    } else {
        let right = r.get(m, h1, RIGHT);
        let right = merge(m, r, right, h2);
        r.set(m, h1, RIGHT, right);
        let (nl, nr) = (npl(m, r, l), npl(m, r, right));
        if nl < nr {
            r.set(m, h1, LEFT, right);
            r.set(m, h1, RIGHT, l);
        }
        r.set(m, h1, NPL, nl.min(nr) + 1);
    }
    h1
}

impl Structure for Leftist {
    fn name() -> &'static str {
        "leftheap"
    }
    fn kind() -> Kind {
        Kind::MinHeap
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        Region::format(m, ID, WORDS, 0)?;
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let n = r.alloc(m)?;
        r.set(m, n, KEY, key);
        r.set(m, n, LEFT, NIL);
        r.set(m, n, RIGHT, NIL);
        r.set(m, n, NPL, 1);
        let root = r.root(m);
        let root = merge(m, &r, n, root);
        r.set_root(m, root);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, _key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let root = r.root(m);
        if root == NIL {
            return Ok(None);
        }
        let min = r.get(m, root, KEY);
        let (l, rt) = (r.get(m, root, LEFT), r.get(m, root, RIGHT));
        r.free(m, root);
        let root = merge(m, &r, l, rt);
        r.set_root(m, root);
        Ok(Some(min))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let (r, chk, nodes) = check_tree(
            m,
            Self::name(),
            ID,
            WORDS,
            (KEY, LEFT, RIGHT),
            TreeOrder::MinHeap,
        )?;
        fold_up(&nodes, 0u64, |t, nl, nr| {
            let stored = r.get(m, t.n, NPL);
            if nl < nr {
                return Err(chk.err(format!("node {}: left npl {nl} < right npl {nr}", t.n)));
            }
            if stored != nr + 1 {
                return Err(chk.err(format!("node {} stores npl {stored}, has {}", t.n, nr + 1)));
            }
            Ok(stored)
        })?;
        Ok(sorted_keys(&nodes))
    }
}
