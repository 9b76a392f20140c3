//! AVL tree. Insertion is Weiss's `avltree.c` (recursive, heights stored, single and
//! double rotations); the book leaves deletion as an exercise, so deletion is the
//! standard recursive one (replace by the right subtree's minimum, rebalance upward).
//! Heights are stored plus one so that nil has height 0.

use crate::region::{check_key, check_tree, fold_up, sorted_keys, Region, TreeOrder, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LEFT: usize = 1;
const RIGHT: usize = 2;
const HEIGHT: usize = 3;
const WORDS: usize = 4;
const ID: u64 = 2;

/// The `avl` structure.
pub struct Avl;

struct T<'a> {
    m: &'a mut dyn TxMem,
    r: Region,
}

impl T<'_> {
    fn h(&self, n: u64) -> u64 {
        if n == NIL {
            0
        } else {
            self.r.get(self.m, n, HEIGHT)
        }
    }
    fn get(&self, n: u64, f: usize) -> u64 {
        self.r.get(self.m, n, f)
    }
    fn set(&mut self, n: u64, f: usize, v: u64) {
        self.r.set(self.m, n, f, v)
    }
    fn fix_height(&mut self, n: u64) {
        let h = self.h(self.get(n, LEFT)).max(self.h(self.get(n, RIGHT))) + 1;
        self.set(n, HEIGHT, h);
    }

    /// Weiss `SingleRotateWithLeft`.
    fn rotate_left_child(&mut self, k2: u64) -> u64 {
        let k1 = self.get(k2, LEFT);
        let k1r = self.get(k1, RIGHT);
        self.set(k2, LEFT, k1r);
        self.set(k1, RIGHT, k2);
        self.fix_height(k2);
        self.fix_height(k1);
        k1
    }
    fn rotate_right_child(&mut self, k1: u64) -> u64 {
        let k2 = self.get(k1, RIGHT);
        let k2l = self.get(k2, LEFT);
        self.set(k1, RIGHT, k2l);
        self.set(k2, LEFT, k1);
        self.fix_height(k1);
        self.fix_height(k2);
        k2
    }
    fn double_left(&mut self, k3: u64) -> u64 {
        let l = self.rotate_right_child(self.get(k3, LEFT));
        self.set(k3, LEFT, l);
        self.rotate_left_child(k3)
    }
    fn double_right(&mut self, k1: u64) -> u64 {
        let r = self.rotate_left_child(self.get(k1, RIGHT));
        self.set(k1, RIGHT, r);
        self.rotate_right_child(k1)
    }

    fn insert(&mut self, t: u64, key: u64, done: &mut bool) -> Result<u64, DsError> {
        if t == NIL {
            let n = self.r.alloc(self.m)?;
            self.set(n, KEY, key);
            self.set(n, HEIGHT, 1);
            self.set(n, LEFT, NIL);
            self.set(n, RIGHT, NIL);
            *done = true;
            return Ok(n);
        }
        let k = self.get(t, KEY);
        let mut t = t;
        if key < k {
            let l = self.insert(self.get(t, LEFT), key, done)?;
            self.set(t, LEFT, l);
            if self.h(l) == self.h(self.get(t, RIGHT)) + 2 {
                t = if key < self.get(l, KEY) {
                    self.rotate_left_child(t)
                } else {
                    self.double_left(t)
                };
            }
        } else if key > k {
            let r = self.insert(self.get(t, RIGHT), key, done)?;
            self.set(t, RIGHT, r);
            if self.h(r) == self.h(self.get(t, LEFT)) + 2 {
                t = if key > self.get(r, KEY) {
                    self.rotate_right_child(t)
                } else {
                    self.double_right(t)
                };
            }
        }
        self.fix_height(t);
        Ok(t)
    }

    fn rebalance(&mut self, t: u64) -> u64 {
        let (l, r) = (self.get(t, LEFT), self.get(t, RIGHT));
        let (hl, hr) = (self.h(l), self.h(r));
        if hl == hr + 2 {
            if self.h(self.get(l, LEFT)) >= self.h(self.get(l, RIGHT)) {
                self.rotate_left_child(t)
            } else {
                self.double_left(t)
            }
        } else if hr == hl + 2 {
            if self.h(self.get(r, RIGHT)) >= self.h(self.get(r, LEFT)) {
                self.rotate_right_child(t)
            } else {
                self.double_right(t)
            }
        } else {
            self.fix_height(t);
            t
        }
    }

    fn delete(&mut self, t: u64, key: u64, done: &mut bool) -> u64 {
        if t == NIL {
            return NIL;
        }
        let k = self.get(t, KEY);
        let (l, r) = (self.get(t, LEFT), self.get(t, RIGHT));
        if key < k {
            let nl = self.delete(l, key, done);
            self.set(t, LEFT, nl);
        } else if key > k {
            let nr = self.delete(r, key, done);
            self.set(t, RIGHT, nr);
        } else if l != NIL && r != NIL {
            let mut min = r;
            while self.get(min, LEFT) != NIL {
                min = self.get(min, LEFT);
            }
            let mk = self.get(min, KEY);
            self.set(t, KEY, mk);
            let nr = self.delete(r, mk, done);
            self.set(t, RIGHT, nr);
        } else {
            *done = true;
            self.r.free(self.m, t);
            return if l == NIL { r } else { l };
        }
        self.rebalance(t)
    }
}

impl Structure for Avl {
    fn name() -> &'static str {
        "avl"
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
        let mut t = T { m, r };
        let mut done = false;
        let root = t.insert(r.root(t.m), key, &mut done)?;
        r.set_root(t.m, root);
        Ok(done)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut t = T { m, r };
        let mut done = false;
        let root = t.delete(r.root(t.m), key, &mut done);
        r.set_root(t.m, root);
        Ok(done.then_some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let (r, chk, nodes) = check_tree(
            m,
            Self::name(),
            ID,
            WORDS,
            (KEY, LEFT, RIGHT),
            TreeOrder::Search,
        )?;
        fold_up(&nodes, 0u64, |t, hl, hr| {
            let h = hl.max(hr) + 1;
            let stored = r.get(m, t.n, HEIGHT);
            if stored != h {
                return Err(chk.err(format!("node {} stores height {stored}, has {h}", t.n)));
            }
            if hl.abs_diff(hr) > 1 {
                return Err(chk.err(format!("node {} is unbalanced: heights {hl} and {hr}", t.n)));
            }
            Ok(h)
        })?;
        Ok(sorted_keys(&nodes))
    }
}
