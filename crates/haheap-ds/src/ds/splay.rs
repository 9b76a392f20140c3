//! Top-down splay tree (Weiss `splay.c`). The book's temporary `Header` node is a local
//! variable there, outside the heap, so it is one here too: links into it are not
//! region writes.

use crate::region::{check_key, check_tree, sorted_keys, Region, TreeOrder, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LEFT: usize = 1;
const RIGHT: usize = 2;
const WORDS: usize = 3;
const ID: u64 = 10;

/// The `splay` structure.
pub struct Splay;

/// Splays the node nearest `key` to the root of the tree at `x` (not nil).
fn splay(m: &mut dyn TxMem, r: &Region, key: u64, mut x: u64) -> u64 {
    // The header's two halves: right tree hangs off `hdr_left`, left tree off `hdr_right`.
    let (mut hdr_left, mut hdr_right) = (NIL, NIL);
    let (mut left_max, mut right_min) = (NIL, NIL); // NIL = the header itself
    loop {
        let k = r.get(m, x, KEY);
        if key < k {
            let mut l = r.get(m, x, LEFT);
            if l == NIL {
                break;
            }
            if key < r.get(m, l, KEY) {
                let lr = r.get(m, l, RIGHT);
                r.set(m, x, LEFT, lr);
                r.set(m, l, RIGHT, x);
                x = l;
                l = r.get(m, x, LEFT);
                if l == NIL {
                    break;
                }
            }
            // Link right.
            if right_min == NIL {
                hdr_left = x;
            } else {
                r.set(m, right_min, LEFT, x);
            }
            right_min = x;
            x = l;
        } else if key > k {
            let mut rt = r.get(m, x, RIGHT);
            if rt == NIL {
                break;
            }
            if key > r.get(m, rt, KEY) {
                let rl = r.get(m, rt, LEFT);
                r.set(m, x, RIGHT, rl);
                r.set(m, rt, LEFT, x);
                x = rt;
                rt = r.get(m, x, RIGHT);
                if rt == NIL {
                    break;
                }
            }
            // Link left.
            if left_max == NIL {
                hdr_right = x;
            } else {
                r.set(m, left_max, RIGHT, x);
            }
            left_max = x;
            x = rt;
        } else {
            break;
        }
    }
    // Reassemble.
    let (xl, xr) = (r.get(m, x, LEFT), r.get(m, x, RIGHT));
    if left_max == NIL {
        hdr_right = xl;
    } else {
        r.set(m, left_max, RIGHT, xl);
    }
    if right_min == NIL {
        hdr_left = xr;
    } else {
        r.set(m, right_min, LEFT, xr);
    }
    r.set(m, x, LEFT, hdr_right);
    r.set(m, x, RIGHT, hdr_left);
    x
}

impl Structure for Splay {
    fn name() -> &'static str {
        "splay"
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
        let root = r.root(m);
        if root == NIL {
            let n = r.alloc(m)?;
            r.set(m, n, KEY, key);
            r.set(m, n, LEFT, NIL);
            r.set(m, n, RIGHT, NIL);
            r.set_root(m, n);
            return Ok(true);
        }
        let t = splay(m, &r, key, root);
        let k = r.get(m, t, KEY);
        if k == key {
            r.set_root(m, t);
            return Ok(false);
        }
        let n = match r.alloc(m) {
            Ok(n) => n,
            Err(e) => {
                r.set_root(m, t);
                return Err(e);
            }
        };
        r.set(m, n, KEY, key);
        if key < k {
            let tl = r.get(m, t, LEFT);
            r.set(m, n, LEFT, tl);
            r.set(m, n, RIGHT, t);
            r.set(m, t, LEFT, NIL);
        } else {
            let tr = r.get(m, t, RIGHT);
            r.set(m, n, RIGHT, tr);
            r.set(m, n, LEFT, t);
            r.set(m, t, RIGHT, NIL);
        }
        r.set_root(m, n);
        Ok(true)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let root = r.root(m);
        if root == NIL {
            return Ok(None);
        }
        let t = splay(m, &r, key, root);
        if r.get(m, t, KEY) != key {
            r.set_root(m, t);
            return Ok(None);
        }
        let (l, rt) = (r.get(m, t, LEFT), r.get(m, t, RIGHT));
        let new_root = if l == NIL {
            rt
        } else {
            let nt = splay(m, &r, key, l);
            r.set(m, nt, RIGHT, rt);
            nt
        };
        r.free(m, t);
        r.set_root(m, new_root);
        Ok(Some(key))
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
