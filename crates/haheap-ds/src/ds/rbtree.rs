//! Red-black tree with top-down insertion and top-down deletion (no parent pointers, no
//! recursion): insertion flips colours and rotates on the way down as in Weiss
//! `redblack.c`; deletion pushes a red node down the search path so the node finally
//! unlinked is red (the top-down scheme the book describes, in Julienne Walker's
//! formulation). A permanent head node in the region holds the root in its right link.

use crate::region::{
    check_key, fold_up, sorted_keys, walk_binary, Checker, Region, TreeOrder, NIL,
};
use crate::{DsError, Kind, Structure, TxMem};

const KEY: usize = 0;
const LINK: usize = 1; // LINK + 0 = left, LINK + 1 = right
const RED: usize = 3;
const WORDS: usize = 4;
const ID: u64 = 9;

/// The `rb` structure.
pub struct RedBlack;

struct T<'a> {
    m: &'a mut dyn TxMem,
    r: Region,
}

impl T<'_> {
    fn key(&self, n: u64) -> u64 {
        self.r.get(self.m, n, KEY)
    }
    fn link(&self, n: u64, dir: usize) -> u64 {
        self.r.get(self.m, n, LINK + dir)
    }
    fn set_link(&mut self, n: u64, dir: usize, v: u64) {
        self.r.set(self.m, n, LINK + dir, v)
    }
    fn red(&self, n: u64) -> bool {
        n != NIL && self.r.get(self.m, n, RED) == 1
    }
    fn paint(&mut self, n: u64, red: bool) {
        self.r.set(self.m, n, RED, red as u64)
    }
    fn single(&mut self, root: u64, dir: usize) -> u64 {
        let save = self.link(root, 1 - dir);
        let inner = self.link(save, dir);
        self.set_link(root, 1 - dir, inner);
        self.set_link(save, dir, root);
        self.paint(root, true);
        self.paint(save, false);
        save
    }
    fn double(&mut self, root: u64, dir: usize) -> u64 {
        let c = self.single(self.link(root, 1 - dir), 1 - dir);
        self.set_link(root, 1 - dir, c);
        self.single(root, dir)
    }
    fn make(&mut self, key: u64) -> Result<u64, DsError> {
        let n = self.r.alloc(self.m)?;
        self.r.set(self.m, n, KEY, key);
        self.set_link(n, 0, NIL);
        self.set_link(n, 1, NIL);
        self.paint(n, true);
        Ok(n)
    }

    fn insert(&mut self, head: u64, key: u64) -> Result<bool, DsError> {
        let mut inserted = false;
        let root = self.link(head, 1);
        if root == NIL {
            let n = self.make(key)?;
            self.set_link(head, 1, n);
            inserted = true;
        } else {
            let (mut t, mut g, mut p, mut q) = (head, NIL, NIL, root);
            let (mut dir, mut last) = (0usize, 0usize);
            loop {
                if q == NIL {
                    q = self.make(key)?;
                    self.set_link(p, dir, q);
                    inserted = true;
                } else if self.red(self.link(q, 0)) && self.red(self.link(q, 1)) {
                    // Colour flip on the way down.
                    self.paint(q, true);
                    self.paint(self.link(q, 0), false);
                    self.paint(self.link(q, 1), false);
                }
                if self.red(q) && self.red(p) {
                    let dir2 = (self.link(t, 1) == g) as usize;
                    let s = if q == self.link(p, last) {
                        self.single(g, 1 - last)
                    } else {
                        self.double(g, 1 - last)
                    };
                    self.set_link(t, dir2, s);
                }
                let qk = self.key(q);
                if qk == key {
                    break;
                }
                last = dir;
                dir = (qk < key) as usize;
                if g != NIL {
                    t = g;
                }
                g = p;
                p = q;
                q = self.link(q, dir);
            }
        }
        let root = self.link(head, 1);
        self.paint(root, false);
        Ok(inserted)
    }

    fn delete(&mut self, head: u64, key: u64) -> bool {
        if self.link(head, 1) == NIL {
            return false;
        }
        let (mut q, mut p, mut f) = (head, NIL, NIL);
        let mut g;
        let mut dir = 1usize;
        while self.link(q, dir) != NIL {
            let last = dir;
            g = p;
            p = q;
            q = self.link(q, dir);
            let qk = self.key(q);
            dir = (qk < key) as usize;
            if qk == key {
                f = q;
            }
            // Push the red node down.
            if !self.red(q) && !self.red(self.link(q, dir)) {
                if self.red(self.link(q, 1 - dir)) {
                    let s = self.single(q, dir);
                    self.set_link(p, last, s);
                    p = s;
                } else {
                    let s = self.link(p, 1 - last);
                    if s != NIL {
                        if !self.red(self.link(s, 1 - last)) && !self.red(self.link(s, last)) {
                            self.paint(p, false);
                            self.paint(s, true);
                            self.paint(q, true);
                        } else {
                            let dir2 = (self.link(g, 1) == p) as usize;
                            if self.red(self.link(s, last)) {
                                let x = self.double(p, last);
                                self.set_link(g, dir2, x);
                            } else {
                                let x = self.single(p, last);
                                self.set_link(g, dir2, x);
                            }
                            let gd = self.link(g, dir2);
                            self.paint(q, true);
                            self.paint(gd, true);
                            self.paint(self.link(gd, 0), false);
                            self.paint(self.link(gd, 1), false);
                        }
                    }
                }
            }
        }
        if f != NIL {
            let qk = self.key(q);
            self.r.set(self.m, f, KEY, qk);
            let child = self.link(q, (self.link(q, 0) == NIL) as usize);
            let side = (self.link(p, 1) == q) as usize;
            self.set_link(p, side, child);
            self.r.free(self.m, q);
        }
        let root = self.link(head, 1);
        if root != NIL {
            self.paint(root, false);
        }
        f != NIL
    }
}

impl Structure for RedBlack {
    fn name() -> &'static str {
        "rb"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let r = Region::format(m, ID, WORDS, 0)?;
        let head = r.alloc(m)?;
        for f in 0..WORDS {
            r.set(m, head, f, 0);
        }
        r.set_root(m, head);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        let r = Region::open(m, ID, WORDS)?;
        let head = r.root(m);
        T { m, r }.insert(head, key)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let head = r.root(m);
        Ok(T { m, r }.delete(head, key).then_some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut chk = Checker::new(Self::name(), m, &r)?;
        let head = r.root(m);
        chk.visit(head, "head")?;
        if r.get(m, head, LINK) != NIL || r.get(m, head, RED) != 0 {
            return Err(chk.err("head node has a left link or is red"));
        }
        let root = r.get(m, head, LINK + 1);
        let nodes = walk_binary(
            m,
            &r,
            &mut chk,
            root,
            (KEY, LINK, LINK + 1),
            TreeOrder::Search,
        )?;
        chk.finish()?;
        if root != NIL && r.get(m, root, RED) != 0 {
            return Err(chk.err("root is red"));
        }
        let colour = |n: u64| if n == NIL { 0 } else { r.get(m, n, RED) };
        fold_up(&nodes, 1u64, |t, bl, br| {
            let c = colour(t.n);
            if c > 1 {
                return Err(chk.err(format!("node {} has colour word {c}", t.n)));
            }
            if c == 1 && (colour(t.left) == 1 || colour(t.right) == 1) {
                return Err(chk.err(format!("red node {} has a red child", t.n)));
            }
            if bl != br {
                return Err(chk.err(format!("node {}: black heights {bl} and {br}", t.n)));
            }
            Ok(bl + (c == 0) as u64)
        })?;
        Ok(sorted_keys(&nodes))
    }
}
