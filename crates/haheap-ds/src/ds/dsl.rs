//! Deterministic 1-2-3 skip list (Weiss `dsl.c`, after Munro, Papadakis and Sedgewick),
//! in the book's linked representation: every level is a list of nodes (key, right,
//! down) ending in an infinite key then the `tail` sentinel; a node's key is the largest
//! key of its gap (the run of nodes one level down from its `down` to the node with the
//! same key), and every gap holds 1 to 3 nodes besides that last one. `bottom` is the
//! sentinel below level 0; the list starts at the single infinite node of the top level.
//!
//! Insertion is the book's top-down splitting. The book has no deletion; this one is
//! the matching top-down 2-3-4 deletion: before descending into a gap with a single
//! node, borrow from a neighbouring gap or merge with it, so the bottom removal never
//! empties a gap; a deleted key that also separates gaps above is replaced there by its
//! predecessor. Both keep node identity where the book does (keys move, nodes stay).

use crate::region::{check_key, Checker, Region, NIL};
use crate::{DsError, Kind, Structure, TxMem, RESERVED_KEY};

const KEY: usize = 0;
const RIGHT: usize = 1;
const DOWN: usize = 2;
const WORDS: usize = 3;
const ID: u64 = 4;
const INF: u64 = RESERVED_KEY;
const BOTTOM: usize = 0; // aux words
const TAIL: usize = 1;

/// The `dsl` structure.
pub struct Dsl;

struct T<'a> {
    m: &'a mut dyn TxMem,
    r: Region,
    bottom: u64,
    tail: u64,
}

impl T<'_> {
    fn key(&self, n: u64) -> u64 {
        self.r.get(self.m, n, KEY)
    }
    fn right(&self, n: u64) -> u64 {
        self.r.get(self.m, n, RIGHT)
    }
    fn down(&self, n: u64) -> u64 {
        self.r.get(self.m, n, DOWN)
    }
    fn set(&mut self, n: u64, f: usize, v: u64) {
        self.r.set(self.m, n, f, v)
    }

    /// Nodes in the gap of `x` besides its last one.
    fn gap(&self, x: u64) -> usize {
        let k = self.key(x);
        let mut c = self.down(x);
        let mut n = 0;
        while self.key(c) != k {
            c = self.right(c);
            n += 1;
        }
        n
    }

    fn insert(&mut self, item: u64) -> Result<bool, DsError> {
        let top = self.r.root(self.m);
        let mut cur = top;
        let bottom = self.bottom;
        self.set(bottom, KEY, item);
        let mut inserted = false;
        while cur != bottom {
            while item > self.key(cur) {
                cur = self.right(cur);
            }
            let d = self.down(cur);
            let d2 = self.right(d);
            let d3 = self.right(d2);
            if self.key(d3) < self.key(cur) {
                // Gap of three (or the bottom level): promote the middle node.
                let n = self.r.alloc(self.m)?;
                let (cr, ck, d2k) = (self.right(cur), self.key(cur), self.key(d2));
                self.set(n, RIGHT, cr);
                self.set(n, DOWN, d3);
                self.set(n, KEY, ck);
                self.set(cur, RIGHT, n);
                self.set(cur, KEY, d2k);
                inserted |= d == bottom;
            } else {
                cur = d;
            }
        }
        if self.right(top) != self.tail {
            let n = self.r.alloc(self.m)?;
            self.set(n, DOWN, top);
            self.set(n, RIGHT, self.tail);
            self.set(n, KEY, INF);
            self.r.set_root(self.m, n);
        }
        Ok(inserted)
    }

    /// Makes the gap of `c` (a node in the gap of `x`, one level above the bottom or
    /// higher) hold at least two nodes besides its last; returns the node to descend.
    fn widen(&mut self, x: u64, prev: u64, c: u64) -> u64 {
        if self.gap(c) != 1 {
            return c;
        }
        if self.key(c) != self.key(x) {
            let s = self.right(c);
            if self.gap(s) >= 2 {
                // Borrow the first node of the right neighbour's gap.
                let b0 = self.down(s);
                let (bk, br) = (self.key(b0), self.right(b0));
                self.set(c, KEY, bk);
                self.set(s, DOWN, br);
            } else {
                // Merge with the right neighbour: c absorbs s.
                let (sk, sr) = (self.key(s), self.right(s));
                self.set(c, KEY, sk);
                self.set(c, RIGHT, sr);
                self.r.free(self.m, s);
            }
            c
        } else {
            let w = prev;
            if self.gap(w) >= 2 {
                // Borrow the last node of the left neighbour's gap.
                let wk = self.key(w);
                let (mut before, mut b) = (NIL, self.down(w));
                while self.key(b) != wk {
                    before = b;
                    b = self.right(b);
                }
                let bk = self.key(before);
                self.set(w, KEY, bk);
                self.set(c, DOWN, b);
                c
            } else {
                // Merge with the left neighbour: w absorbs c.
                let (ck, cr) = (self.key(c), self.right(c));
                self.set(w, KEY, ck);
                self.set(w, RIGHT, cr);
                self.r.free(self.m, c);
                w
            }
        }
    }

    fn delete(&mut self, item: u64) -> bool {
        let mut x = self.r.root(self.m);
        if self.down(x) == self.bottom {
            return false; // empty
        }
        let mut tower = Vec::new();
        let found = loop {
            let mut prev = NIL;
            let mut c = self.down(x);
            while self.key(c) < item {
                prev = c;
                c = self.right(c);
            }
            if self.down(c) == self.bottom {
                if self.key(c) != item {
                    break false;
                }
                if self.key(c) != self.key(x) {
                    // Not the gap's last node: c takes over its successor's place.
                    let nx = self.right(c);
                    let (nk, nr) = (self.key(nx), self.right(nx));
                    self.set(c, KEY, nk);
                    self.set(c, RIGHT, nr);
                    self.r.free(self.m, nx);
                } else {
                    // The gap's last node: its predecessor ends the gap and takes the
                    // deleted key's place in the levels above.
                    let cr = self.right(c);
                    self.set(prev, RIGHT, cr);
                    self.r.free(self.m, c);
                    let pk = self.key(prev);
                    for t in tower {
                        self.set(t, KEY, pk);
                    }
                }
                break true;
            }
            let c = self.widen(x, prev, c);
            if self.key(c) == item {
                tower.push(c);
            }
            x = c;
        };
        // Drop top levels whose gap is only the infinite node.
        let mut top = self.r.root(self.m);
        let old_top = top;
        while self.down(top) != self.bottom && self.key(self.down(top)) == INF {
            let d = self.down(top);
            self.r.free(self.m, top);
            top = d;
        }
        if top != old_top {
            self.r.set_root(self.m, top);
        }
        found
    }
}

fn open(m: &mut dyn TxMem) -> Result<T<'_>, DsError> {
    let r = Region::open(m, ID, WORDS)?;
    let (bottom, tail) = (r.aux(m, BOTTOM), r.aux(m, TAIL));
    Ok(T { m, r, bottom, tail })
}

impl Structure for Dsl {
    fn name() -> &'static str {
        "dsl"
    }
    fn kind() -> Kind {
        Kind::Set
    }
    fn init(m: &mut dyn TxMem) -> Result<(), DsError> {
        let r = Region::format(m, ID, WORDS, 0)?;
        let (bottom, tail, top) = (r.alloc(m)?, r.alloc(m)?, r.alloc(m)?);
        for (n, k, right, down) in [
            (bottom, 0, bottom, bottom),
            (tail, INF, tail, tail),
            (top, INF, tail, bottom),
        ] {
            r.set(m, n, KEY, k);
            r.set(m, n, RIGHT, right);
            r.set(m, n, DOWN, down);
        }
        r.set_aux(m, BOTTOM, bottom);
        r.set_aux(m, TAIL, tail);
        r.set_root(m, top);
        Ok(())
    }
    fn insert(m: &mut dyn TxMem, key: u64) -> Result<bool, DsError> {
        check_key(key)?;
        open(m)?.insert(key)
    }
    fn delete(m: &mut dyn TxMem, key: u64) -> Result<Option<u64>, DsError> {
        if key == INF {
            return Ok(None);
        }
        Ok(open(m)?.delete(key).then_some(key))
    }
    fn check(m: &dyn TxMem) -> Result<Vec<u64>, DsError> {
        let r = Region::open(m, ID, WORDS)?;
        let mut chk = Checker::new(Self::name(), m, &r)?;
        let (bottom, tail, top) = (r.aux(m, BOTTOM), r.aux(m, TAIL), r.root(m));
        chk.visit(bottom, "bottom sentinel")?;
        chk.visit(tail, "tail sentinel")?;
        chk.visit(top, "top of the list")?;
        let g = |n: u64, f: usize| r.get(m, n, f);
        if g(bottom, RIGHT) != bottom || g(bottom, DOWN) != bottom {
            return Err(chk.err("bottom sentinel does not point to itself"));
        }
        if g(tail, KEY) != INF || g(tail, RIGHT) != tail {
            return Err(chk.err("tail sentinel is not an infinite self loop"));
        }
        if g(top, KEY) != INF || g(top, RIGHT) != tail {
            return Err(chk.err("top level is not a single infinite node"));
        }
        let mut level = vec![top];
        loop {
            let at_bottom = g(level[0], DOWN) == bottom;
            if let Some(&n) = level.iter().find(|&&n| (g(n, DOWN) == bottom) != at_bottom) {
                return Err(chk.err(format!(
                    "node {n} is on a level that mixes bottom and upper nodes"
                )));
            }
            if at_bottom {
                break;
            }
            // Collect the level below and check that the gaps partition it.
            let mut below = Vec::new();
            let mut n = g(level[0], DOWN);
            while n != tail {
                chk.visit(n, "level list")?;
                below.push(n);
                n = g(n, RIGHT);
            }
            check_sorted(&chk, m, &r, &below)?;
            let mut i = 0;
            for &x in &level {
                if below.get(i) != Some(&g(x, DOWN)) {
                    return Err(chk.err(format!(
                        "node {x} does not point down to the start of its gap"
                    )));
                }
                let kx = g(x, KEY);
                let Some(j) = (i..below.len()).find(|&j| g(below[j], KEY) == kx) else {
                    return Err(chk.err(format!("gap of node {x} has no node with key {kx}")));
                };
                if !(1..=3).contains(&(j - i)) {
                    return Err(chk.err(format!(
                        "gap of node {x} holds {} nodes besides its last",
                        j - i
                    )));
                }
                i = j + 1;
            }
            if i != below.len() {
                return Err(chk.err("a level continues past the last gap of the level above"));
            }
            level = below;
        }
        check_sorted(&chk, m, &r, &level)?;
        chk.finish()?;
        Ok(level[..level.len() - 1]
            .iter()
            .map(|&n| g(n, KEY))
            .collect())
    }
}

/// A level's keys rise strictly and end with the single infinite node.
fn check_sorted(chk: &Checker, m: &dyn TxMem, r: &Region, level: &[u64]) -> Result<(), DsError> {
    let keys: Vec<u64> = level.iter().map(|&n| r.get(m, n, KEY)).collect();
    if keys.last() != Some(&INF) || keys.windows(2).any(|w| w[0] >= w[1]) {
        return Err(chk.err("a level is not strictly increasing up to one infinite node"));
    }
    Ok(())
}
