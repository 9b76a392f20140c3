//! Every structure against a std model over thousands of random operations, with
//! `check()` after each batch.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

use haheap_ds::{all, Ds, Kind, SplitMix64, TxMem, VecMem};

const REGION: usize = 1 << 20;
const OPS: usize = 6000;
const BATCH: usize = 50;

enum Model {
    Set(BTreeSet<u64>),
    Heap(BinaryHeap<Reverse<u64>>),
    Fifo(VecDeque<u64>),
}

impl Model {
    fn new(kind: Kind) -> Model {
        match kind {
            Kind::Set => Model::Set(BTreeSet::new()),
            Kind::MinHeap => Model::Heap(BinaryHeap::new()),
            Kind::Fifo => Model::Fifo(VecDeque::new()),
        }
    }
    fn insert(&mut self, k: u64) -> bool {
        match self {
            Model::Set(s) => s.insert(k),
            Model::Heap(h) => {
                h.push(Reverse(k));
                true
            }
            Model::Fifo(q) => {
                q.push_back(k);
                true
            }
        }
    }
    fn delete(&mut self, k: u64) -> Option<u64> {
        match self {
            Model::Set(s) => s.remove(&k).then_some(k),
            Model::Heap(h) => h.pop().map(|Reverse(k)| k),
            Model::Fifo(q) => q.pop_front(),
        }
    }
    fn sorted(&self) -> Vec<u64> {
        let mut v: Vec<u64> = match self {
            Model::Set(s) => s.iter().copied().collect(),
            Model::Heap(h) => h.iter().map(|Reverse(k)| *k).collect(),
            Model::Fifo(q) => q.iter().copied().collect(),
        };
        v.sort_unstable();
        v
    }
}

/// Runs `ops` random operations on `ds`, rising then falling in size, keys in
/// `0..key_range` so that duplicates and misses happen.
fn run(ds: Ds, seed: u64, ops: usize, key_range: u64) {
    let mut m = VecMem::zeroed(REGION);
    (ds.init)(&mut m).unwrap();
    assert_eq!(
        (ds.check)(&m).unwrap(),
        Vec::<u64>::new(),
        "{} empty",
        ds.name
    );
    let mut model = Model::new(ds.kind);
    let mut rng = SplitMix64::new(seed);
    for i in 0..ops {
        // First two thirds grow the structure, the last third drains it.
        let p_insert = if i < ops * 2 / 3 { 65 } else { 30 };
        let k = rng.below(key_range);
        if rng.below(100) < p_insert {
            let got = (ds.insert)(&mut m, k).unwrap();
            assert_eq!(got, model.insert(k), "{} op {i}: insert {k}", ds.name);
        } else {
            let got = (ds.delete)(&mut m, k).unwrap();
            assert_eq!(got, model.delete(k), "{} op {i}: delete {k}", ds.name);
        }
        if i % BATCH == BATCH - 1 {
            let keys = (ds.check)(&m).unwrap_or_else(|e| panic!("{} op {i}: {e}", ds.name));
            assert_eq!(keys, model.sorted(), "{} op {i}: contents", ds.name);
        }
    }
    // Drain completely and check the allocator took everything back.
    let remaining = model.sorted();
    for k in remaining {
        let got = (ds.delete)(&mut m, k).unwrap();
        assert_eq!(got, model.delete(k), "{} drain {k}", ds.name);
    }
    assert_eq!(
        (ds.check)(&m).unwrap(),
        Vec::<u64>::new(),
        "{} drained",
        ds.name
    );
    assert_eq!(
        (ds.delete)(&mut m, 1).unwrap(),
        None,
        "{} delete on empty",
        ds.name
    );
}

#[test]
fn every_structure_matches_its_model() {
    for ds in all() {
        for seed in 1..=3 {
            run(ds, seed, OPS, 3000);
        }
    }
}

#[test]
fn every_structure_matches_its_model_with_wide_keys() {
    for ds in all() {
        run(ds, 42, OPS, u64::MAX - 1);
    }
}

#[test]
fn sorted_and_reverse_inserts() {
    // Monotone input exercises the rotations and the skip list's splits on one side.
    for ds in all() {
        let mut m = VecMem::zeroed(REGION);
        (ds.init)(&mut m).unwrap();
        let keys: Vec<u64> = (0..500).chain((1000..1500).rev()).collect();
        for &k in &keys {
            assert!((ds.insert)(&mut m, k).unwrap(), "{}", ds.name);
        }
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        assert_eq!((ds.check)(&m).unwrap(), sorted, "{}", ds.name);
        for &k in keys.iter().rev() {
            (ds.delete)(&mut m, k).unwrap();
        }
        assert_eq!((ds.check)(&m).unwrap(), Vec::<u64>::new(), "{}", ds.name);
    }
}

#[test]
fn reserved_key_and_full_region_are_errors() {
    for ds in all() {
        let mut m = VecMem::zeroed(8192);
        (ds.init)(&mut m).unwrap();
        assert!((ds.insert)(&mut m, u64::MAX).is_err(), "{}", ds.name);
        let mut stored = Vec::new();
        let mut full = false;
        for k in 0..10_000u64 {
            match (ds.insert)(&mut m, k * 7919) {
                Ok(_) => stored.push(k * 7919),
                Err(haheap_ds::DsError::Full) => {
                    full = true;
                    break;
                }
                Err(e) => panic!("{}: {e}", ds.name),
            }
        }
        assert!(full, "{} never filled 8 KiB", ds.name);
        // A failed insert leaves a valid structure with everything stored before it.
        let keys = (ds.check)(&m).unwrap_or_else(|e| panic!("{} after Full: {e}", ds.name));
        assert_eq!(keys.len(), stored.len(), "{}", ds.name);
    }
}

#[test]
fn region_too_small_is_an_error() {
    for ds in all() {
        let mut m = VecMem::zeroed(100);
        assert!((ds.init)(&mut m).is_err(), "{}", ds.name);
        let m = VecMem::zeroed(4096);
        assert!(
            (ds.check)(&m).is_err(),
            "{}: unformatted region accepted",
            ds.name
        );
    }
}

#[test]
fn counting_mem_sees_every_store() {
    // The counting wrapper must see exactly the bytes that changed (and maybe more).
    for ds in all() {
        let mut plain = VecMem::zeroed(64 * 1024);
        (ds.init)(&mut plain).unwrap();
        let mut counted = haheap_ds::CountingMem::new(plain.clone(), 4096);
        for k in haheap_ds::stats::keys(9, 200) {
            let before = counted.inner().clone();
            (ds.insert)(&mut counted, k).unwrap();
            let c = counted.take();
            let changed = before
                .0
                .iter()
                .zip(&counted.inner().0)
                .filter(|(a, b)| a != b)
                .count();
            assert!(
                c.bytes as usize >= changed,
                "{}: {} bytes stored, {changed} changed",
                ds.name,
                c.bytes
            );
            assert!(c.writes > 0, "{}", ds.name);
        }
        assert_eq!(counted.len(), 64 * 1024);
    }
}
