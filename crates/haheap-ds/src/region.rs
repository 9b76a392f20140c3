//! The region layout every structure shares, its node allocator, and the bookkeeping
//! `check()` uses to prove that each node is reachable once and nothing leaked.
//!
//! Header (u64 words at offset 0, 256 bytes reserved):
//! `0 magic "RBDSHEAP"`, `1 version (1)`, `2 structure id`, `3 words per node`,
//! `4 table offset`, `5 table words`, `6 nodes offset`, `7 node capacity`,
//! `8 bump (slots ever handed out)`, `9 free-list head`, `10 root`, `11..19 aux`.
//! Nodes are numbered `1..=capacity`; 0 is nil. A freed node's word 0 links the free list.

use crate::{DsError, TxMem};

/// `"RBDSHEAP"` as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RBDSHEAP");
/// The only layout version this build reads.
pub const VERSION: u64 = 1;
/// The nil node pointer.
pub const NIL: u64 = 0;
/// Bytes reserved for the header.
pub const HEADER_LEN: usize = 256;
/// Structure-specific header words.
pub const AUX_WORDS: usize = 8;

const W_MAGIC: usize = 0;
const W_VERSION: usize = 1;
const W_ID: usize = 2;
const W_NODE_WORDS: usize = 3;
const W_TABLE_OFF: usize = 4;
const W_TABLE_WORDS: usize = 5;
const W_NODES_OFF: usize = 6;
const W_CAPACITY: usize = 7;
const W_BUMP: usize = 8;
const W_FREE: usize = 9;
const W_ROOT: usize = 10;
const W_AUX: usize = 11;
const HEADER_WORDS: usize = W_AUX + AUX_WORDS;

/// The decoded, validated geometry of a region.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    node_words: usize,
    table_off: usize,
    /// Words in the table area.
    pub table_words: usize,
    nodes_off: usize,
    /// Number of node slots.
    pub capacity: u64,
}

fn hdr_off(w: usize) -> usize {
    w * 8
}

impl Region {
    /// Writes a fresh header: `table_words` of table after the header, then as many
    /// nodes of `node_words` words as fit.
    pub fn format(
        m: &mut dyn TxMem,
        id: u64,
        node_words: usize,
        table_words: usize,
    ) -> Result<Region, DsError> {
        let len = m.len();
        let table_off = HEADER_LEN;
        let nodes_off = (table_off + table_words * 8).next_multiple_of(64);
        if nodes_off > len {
            return Err(DsError::TooSmall {
                len,
                need: nodes_off,
            });
        }
        let capacity = match node_words {
            0 => 0,
            w => ((len - nodes_off) / (w * 8)) as u64,
        };
        let mut h = [0u64; HEADER_WORDS];
        h[W_MAGIC] = MAGIC;
        h[W_VERSION] = VERSION;
        h[W_ID] = id;
        h[W_NODE_WORDS] = node_words as u64;
        h[W_TABLE_OFF] = table_off as u64;
        h[W_TABLE_WORDS] = table_words as u64;
        h[W_NODES_OFF] = nodes_off as u64;
        h[W_CAPACITY] = capacity;
        let bytes: Vec<u8> = h.iter().flat_map(|w| w.to_le_bytes()).collect();
        m.write(0, &bytes);
        Ok(Region {
            node_words,
            table_off,
            table_words,
            nodes_off,
            capacity,
        })
    }

    /// Reads and validates the header of a region holding structure `id`.
    pub fn open(m: &dyn TxMem, id: u64, node_words: usize) -> Result<Region, DsError> {
        let len = m.len();
        if len < HEADER_LEN {
            return Err(DsError::TooSmall {
                len,
                need: HEADER_LEN,
            });
        }
        let w = |i: usize| m.read_u64(hdr_off(i));
        if w(W_MAGIC) != MAGIC {
            return Err(DsError::BadMagic(w(W_MAGIC)));
        }
        if w(W_VERSION) != VERSION {
            return Err(DsError::BadVersion(w(W_VERSION)));
        }
        if w(W_ID) != id {
            return Err(DsError::WrongStructure {
                found: w(W_ID),
                expected: id,
            });
        }
        let bad = |s: String| Err(DsError::BadHeader(s));
        if w(W_NODE_WORDS) != node_words as u64 {
            return bad(format!(
                "{} words per node, expected {node_words}",
                w(W_NODE_WORDS)
            ));
        }
        if w(W_TABLE_OFF) != HEADER_LEN as u64 {
            return bad(format!(
                "table at {}, expected {HEADER_LEN}",
                w(W_TABLE_OFF)
            ));
        }
        let table_end = (HEADER_LEN as u64).checked_add(w(W_TABLE_WORDS).saturating_mul(8));
        let nodes_off = w(W_NODES_OFF);
        if table_end.is_none_or(|e| e > nodes_off) || nodes_off > len as u64 {
            return bad(format!(
                "table of {} words and nodes at {nodes_off} do not fit {len} bytes",
                w(W_TABLE_WORDS)
            ));
        }
        let cap = w(W_CAPACITY);
        if node_words == 0 && cap != 0 {
            return bad(format!("{cap} nodes in a structure without nodes"));
        }
        let nodes_bytes = cap.checked_mul(node_words as u64 * 8);
        if nodes_bytes.is_none_or(|b| b > len as u64 - nodes_off) {
            return bad(format!("{cap} nodes do not fit after offset {nodes_off}"));
        }
        if w(W_BUMP) > cap {
            return bad(format!("{} nodes handed out of {cap}", w(W_BUMP)));
        }
        Ok(Region {
            node_words,
            table_off: HEADER_LEN,
            table_words: w(W_TABLE_WORDS) as usize,
            nodes_off: nodes_off as usize,
            capacity: cap,
        })
    }

    fn at(&self, n: u64, field: usize) -> usize {
        debug_assert!(n != NIL && n <= self.capacity && field < self.node_words);
        self.nodes_off + (n as usize - 1) * self.node_words * 8 + field * 8
    }

    /// Field `field` of node `n`.
    pub fn get(&self, m: &dyn TxMem, n: u64, field: usize) -> u64 {
        m.read_u64(self.at(n, field))
    }

    /// Stores field `field` of node `n`.
    pub fn set(&self, m: &mut dyn TxMem, n: u64, field: usize, v: u64) {
        m.write_u64(self.at(n, field), v)
    }

    /// Word `i` of the table.
    pub fn table(&self, m: &dyn TxMem, i: usize) -> u64 {
        debug_assert!(i < self.table_words);
        m.read_u64(self.table_off + i * 8)
    }

    /// Stores word `i` of the table.
    pub fn set_table(&self, m: &mut dyn TxMem, i: usize, v: u64) {
        debug_assert!(i < self.table_words);
        m.write_u64(self.table_off + i * 8, v)
    }

    /// Zeroes table words `from..to` with one store (initialisation only).
    pub fn zero_table(&self, m: &mut dyn TxMem, from: usize, to: usize) {
        m.write(self.table_off + from * 8, &vec![0u8; (to - from) * 8])
    }

    /// The structure's root word.
    pub fn root(&self, m: &dyn TxMem) -> u64 {
        m.read_u64(hdr_off(W_ROOT))
    }

    /// Stores the root word.
    pub fn set_root(&self, m: &mut dyn TxMem, v: u64) {
        m.write_u64(hdr_off(W_ROOT), v)
    }

    /// Structure-specific header word `i` (< [`AUX_WORDS`]).
    pub fn aux(&self, m: &dyn TxMem, i: usize) -> u64 {
        debug_assert!(i < AUX_WORDS);
        m.read_u64(hdr_off(W_AUX + i))
    }

    /// Stores structure-specific header word `i`.
    pub fn set_aux(&self, m: &mut dyn TxMem, i: usize, v: u64) {
        debug_assert!(i < AUX_WORDS);
        m.write_u64(hdr_off(W_AUX + i), v)
    }

    /// Takes a node from the free list, else a never-used slot.
    pub fn alloc(&self, m: &mut dyn TxMem) -> Result<u64, DsError> {
        let free = m.read_u64(hdr_off(W_FREE));
        if free != NIL {
            let next = self.get(m, free, 0);
            m.write_u64(hdr_off(W_FREE), next);
            return Ok(free);
        }
        let bump = m.read_u64(hdr_off(W_BUMP));
        if bump >= self.capacity {
            return Err(DsError::Full);
        }
        m.write_u64(hdr_off(W_BUMP), bump + 1);
        Ok(bump + 1)
    }

    /// Puts node `n` on the free list.
    pub fn free(&self, m: &mut dyn TxMem, n: u64) {
        let head = m.read_u64(hdr_off(W_FREE));
        self.set(m, n, 0, head);
        m.write_u64(hdr_off(W_FREE), n);
    }
}

/// Tracks which nodes `check()` reached, against the free list, for one structure.
pub struct Checker {
    name: &'static str,
    bump: u64,
    free: Vec<bool>,
    seen: Vec<bool>,
    nfree: u64,
    nseen: u64,
}

/// Builds a `DsError::Corrupt` for structure `name`.
pub fn corrupt(name: &'static str, detail: impl Into<String>) -> DsError {
    DsError::Corrupt {
        structure: name,
        detail: detail.into(),
    }
}

impl Checker {
    /// Walks the free list of `r`: every entry must be a handed-out slot, listed once.
    pub fn new(name: &'static str, m: &dyn TxMem, r: &Region) -> Result<Checker, DsError> {
        let bump = m.read_u64(hdr_off(W_BUMP));
        let mut c = Checker {
            name,
            bump,
            free: vec![false; bump as usize + 1],
            seen: vec![false; bump as usize + 1],
            nfree: 0,
            nseen: 0,
        };
        let mut n = m.read_u64(hdr_off(W_FREE));
        while n != NIL {
            if n > bump {
                return Err(c.err(format!(
                    "free list holds node {n} beyond the {bump} handed out"
                )));
            }
            if c.free[n as usize] {
                return Err(c.err(format!("free list loops at node {n}")));
            }
            c.free[n as usize] = true;
            c.nfree += 1;
            n = r.get(m, n, 0);
        }
        Ok(c)
    }

    /// A corruption error for this structure.
    pub fn err(&self, detail: impl Into<String>) -> DsError {
        corrupt(self.name, detail)
    }

    /// Marks node `n` (reached through `what`) as reachable; rejects nil, out-of-range,
    /// free or already reached nodes.
    pub fn visit(&mut self, n: u64, what: &str) -> Result<(), DsError> {
        if n == NIL || n > self.bump {
            return Err(self.err(format!(
                "{what} points to node {n}, outside 1..={}",
                self.bump
            )));
        }
        if self.free[n as usize] {
            return Err(self.err(format!(
                "node {n} ({what}) is reachable and on the free list"
            )));
        }
        if self.seen[n as usize] {
            return Err(self.err(format!("node {n} ({what}) is reachable twice")));
        }
        self.seen[n as usize] = true;
        self.nseen += 1;
        Ok(())
    }

    /// Every handed-out node must be either reachable or free.
    pub fn finish(&self) -> Result<(), DsError> {
        if self.nseen + self.nfree != self.bump {
            return Err(self.err(format!(
                "{} nodes leaked: {} reachable + {} free of {} handed out",
                self.bump - self.nseen - self.nfree,
                self.nseen,
                self.nfree,
                self.bump
            )));
        }
        Ok(())
    }
}

/// A node of a binary tree as seen by [`walk_binary`].
#[derive(Clone, Copy, Debug)]
pub struct TreeNode {
    /// Node number.
    pub n: u64,
    /// Its key.
    pub key: u64,
    /// Left child (nil or a visited node).
    pub left: u64,
    /// Right child.
    pub right: u64,
}

/// The ordering a binary tree must satisfy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TreeOrder {
    /// Strict binary-search-tree order.
    Search,
    /// Min-heap order (children not smaller than the parent).
    MinHeap,
}

/// Visits every node of the binary tree at `root` (fields `key`, `left`, `right`)
/// without recursion, checking `order`; returns the nodes in pre-order.
pub fn walk_binary(
    m: &dyn TxMem,
    r: &Region,
    chk: &mut Checker,
    root: u64,
    (key, left, right): (usize, usize, usize),
    order: TreeOrder,
) -> Result<Vec<TreeNode>, DsError> {
    let mut out = Vec::new();
    if root == NIL {
        return Ok(out);
    }
    chk.visit(root, "root")?;
    // (node, exclusive lower bound, exclusive upper bound) for search order;
    // for heap order the lower bound is the parent's key, inclusive.
    let mut stack = vec![(root, None::<u64>, None::<u64>)];
    while let Some((n, lo, hi)) = stack.pop() {
        let t = TreeNode {
            n,
            key: r.get(m, n, key),
            left: r.get(m, n, left),
            right: r.get(m, n, right),
        };
        let ok = match order {
            TreeOrder::Search => lo.is_none_or(|l| t.key > l) && hi.is_none_or(|h| t.key < h),
            TreeOrder::MinHeap => lo.is_none_or(|l| t.key >= l),
        };
        if !ok {
            return Err(chk.err(format!(
                "node {n} key {} violates {:?} order (bounds {lo:?}..{hi:?})",
                t.key, order
            )));
        }
        for (child, side) in [(t.right, "right"), (t.left, "left")] {
            if child == NIL {
                continue;
            }
            chk.visit(child, &format!("{side} child of node {n}"))?;
            let bounds = match (order, side) {
                (TreeOrder::Search, "left") => (lo, Some(t.key)),
                (TreeOrder::Search, _) => (Some(t.key), hi),
                (TreeOrder::MinHeap, _) => (Some(t.key), None),
            };
            stack.push((child, bounds.0, bounds.1));
        }
        out.push(t);
    }
    Ok(out)
}

/// Folds a value bottom-up over nodes from [`walk_binary`] (children before parents):
/// `f(node, left value, right value)`, nil children get `nil`. Returns the root's value.
pub fn fold_up<T: Copy>(
    nodes: &[TreeNode],
    nil: T,
    mut f: impl FnMut(&TreeNode, T, T) -> Result<T, DsError>,
) -> Result<T, DsError> {
    let mut val: std::collections::HashMap<u64, T> = std::collections::HashMap::new();
    for t in nodes.iter().rev() {
        let l = if t.left == NIL { nil } else { val[&t.left] };
        let r = if t.right == NIL { nil } else { val[&t.right] };
        val.insert(t.n, f(t, l, r)?);
    }
    Ok(nodes.first().map_or(nil, |t| val[&t.n]))
}

/// The keys of `nodes`, ascending.
pub fn sorted_keys(nodes: &[TreeNode]) -> Vec<u64> {
    let mut k: Vec<u64> = nodes.iter().map(|t| t.key).collect();
    k.sort_unstable();
    k
}

/// Rejects the reserved sentinel key.
pub fn check_key(key: u64) -> Result<(), DsError> {
    if key == crate::RESERVED_KEY {
        return Err(DsError::ReservedKey(key));
    }
    Ok(())
}

/// `check()` of a binary tree whose root is the header's root word: opens the region,
/// walks the tree, proves the allocator accounts for every node. Returns the region,
/// the checker (for further errors) and the nodes in pre-order.
pub fn check_tree(
    m: &dyn TxMem,
    name: &'static str,
    id: u64,
    words: usize,
    fields: (usize, usize, usize),
    order: TreeOrder,
) -> Result<(Region, Checker, Vec<TreeNode>), DsError> {
    let r = Region::open(m, id, words)?;
    let mut chk = Checker::new(name, m, &r)?;
    let nodes = walk_binary(m, &r, &mut chk, r.root(m), fields, order)?;
    chk.finish()?;
    Ok((r, chk, nodes))
}
