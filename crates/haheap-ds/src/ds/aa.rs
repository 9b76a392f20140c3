//! AA tree (Weiss `aatree.c`): recursive insert with skew and split, and the book's
//! deletion that remembers the last node visited and the node holding the key.
//! Nil has level 0 (the book's `NullNode`); rotations never touch nil.

use crate::region::{check_key, check_tree, sorted_keys, Region, TreeOrder, NIL};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LEFT: usize = 1;
const RIGHT: usize = 2;
const LEVEL: usize = 3;
const WORDS: usize = 4;
const ID: u64 = 1;

/// The `aa` structure.
pub struct Aa;

struct T<'a> {
    m: &'a mut dyn TxMem,
    r: Region,
    delete_ptr: u64,
    last_ptr: u64,
}

impl T<'_> {
    fn get(&self, n: u64, f: usize) -> u64 {
        self.r.get(self.m, n, f)
    }
    fn set(&mut self, n: u64, f: usize, v: u64) {
        self.r.set(self.m, n, f, v)
    }
    fn level(&self, n: u64) -> u64 {
        if n == NIL {
            0
        } else {
            self.get(n, LEVEL)
        }
    }

    /// Rotates a left horizontal link into a right one.
    fn skew(&mut self, t: u64) -> u64 {
        if t == NIL {
            return t;
        }
        let l = self.get(t, LEFT);
        if l != NIL && self.level(l) == self.level(t) {
            let lr = self.get(l, RIGHT);
            self.set(t, LEFT, lr);
            self.set(l, RIGHT, t);
            return l;
        }
        t
    }

    /// Removes two consecutive right horizontal links.
    fn split(&mut self, t: u64) -> u64 {
        if t == NIL {
            return t;
        }
        let r = self.get(t, RIGHT);
        if r != NIL && self.level(self.get(r, RIGHT)) == self.level(t) {
            let rl = self.get(r, LEFT);
            self.set(t, RIGHT, rl);
            self.set(r, LEFT, t);
            let lv = self.level(r) + 1;
            self.set(r, LEVEL, lv);
            return r;
        }
        t
    }

    fn insert(&mut self, t: u64, key: u64, done: &mut bool) -> Result<u64, DsError> {
        if t == NIL {
            let n = self.r.alloc(self.m)?;
            self.set(n, KEY, key);
            self.set(n, LEVEL, 1);
            self.set(n, LEFT, NIL);
            self.set(n, RIGHT, NIL);
            *done = true;
            return Ok(n);
        }
        let k = self.get(t, KEY);
        if key < k {
            let l = self.insert(self.get(t, LEFT), key, done)?;
            self.set(t, LEFT, l);
        } else if key > k {
            let r = self.insert(self.get(t, RIGHT), key, done)?;
            self.set(t, RIGHT, r);
        }
        let t = self.skew(t);
        Ok(self.split(t))
    }

    fn remove(&mut self, t: u64, key: u64, done: &mut bool) -> u64 {
        if t == NIL {
            return t;
        }
        let mut t = t;
        self.last_ptr = t;
        if key < self.get(t, KEY) {
            let l = self.remove(self.get(t, LEFT), key, done);
            self.set(t, LEFT, l);
        } else {
            self.delete_ptr = t;
            let r = self.remove(self.get(t, RIGHT), key, done);
            self.set(t, RIGHT, r);
        }
        if t == self.last_ptr {
            // At the bottom: the last node visited replaces the one holding the key.
            if self.delete_ptr != NIL && self.get(self.delete_ptr, KEY) == key {
                let k = self.get(t, KEY);
                self.set(self.delete_ptr, KEY, k);
                self.delete_ptr = NIL;
                let next = self.get(t, RIGHT);
                self.r.free(self.m, t);
                *done = true;
                return next;
            }
        } else {
            let lv = self.level(t);
            let (l, r) = (self.get(t, LEFT), self.get(t, RIGHT));
            if self.level(l) + 1 < lv || self.level(r) + 1 < lv {
                let lv = lv - 1;
                self.set(t, LEVEL, lv);
                if self.level(r) > lv {
                    self.set(r, LEVEL, lv);
                }
                t = self.skew(t);
                let r = self.skew(self.get(t, RIGHT));
                self.set(t, RIGHT, r);
                if r != NIL {
                    let rr = self.skew(self.get(r, RIGHT));
                    self.set(r, RIGHT, rr);
                }
                t = self.split(t);
                let r = self.split(self.get(t, RIGHT));
                self.set(t, RIGHT, r);
            }
        }
        t
    }
}

impl Structure for Aa {
    fn name() -> &'static str {
        "aa"
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
        let mut t = T {
            m,
            r,
            delete_ptr: NIL,
            last_ptr: NIL,
        };
        let mut done = false;
        let root = t.insert(r.root(t.m), key, &mut done)?;
        r.set_root(t.m, root);
        Ok(done)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut t = T {
            m,
            r,
            delete_ptr: NIL,
            last_ptr: NIL,
        };
        let mut done = false;
        let root = t.remove(r.root(t.m), key, &mut done);
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
        let level = |n: u64| if n == NIL { 0 } else { r.get(m, n, LEVEL) };
        for t in &nodes {
            let lv = level(t.n);
            let (ll, rl) = (level(t.left), level(t.right));
            let rrl = if t.right == NIL {
                0
            } else {
                level(r.get(m, t.right, RIGHT))
            };
            let bad = if lv == 0 {
                Some("level 0")
            } else if t.left == NIL && t.right == NIL && lv != 1 {
                Some("a leaf above level 1")
            } else if ll + 1 != lv {
                Some("left child not exactly one level down")
            } else if rl != lv && rl + 1 != lv {
                Some("right child neither level nor one down")
            } else if rrl >= lv {
                Some("two consecutive horizontal links")
            } else {
                None
            };
            if let Some(what) = bad {
                return Err(chk.err(format!("node {} at level {lv}: {what}", t.n)));
            }
        }
        Ok(sorted_keys(&nodes))
    }
}
