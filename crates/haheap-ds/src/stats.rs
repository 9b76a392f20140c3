//! Writes and pages per operation, the talk's "Data Structures" table: insert `ops`
//! random keys one by one, then delete them (heaps and the queue: delete-min/dequeue
//! `ops` times), counting each operation's stores through a [`CountingMem`].

use crate::{CountingMem, Ds, DsError, Kind, SplitMix64, VecMem};

/// Average, minimum and maximum of one measure.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spread {
    /// Mean over the operations.
    pub avg: f64,
    /// Smallest.
    pub min: u64,
    /// Largest.
    pub max: u64,
}

impl Spread {
    fn of(v: &[u64]) -> Spread {
        if v.is_empty() {
            return Spread::default();
        }
        Spread {
            avg: v.iter().sum::<u64>() as f64 / v.len() as f64,
            min: *v.iter().min().unwrap_or(&0),
            max: *v.iter().max().unwrap_or(&0),
        }
    }
}

/// Writes and distinct pages of one kind of operation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OpProfile {
    /// `write` calls per operation.
    pub writes: Spread,
    /// Distinct pages written per operation.
    pub pages: Spread,
    /// Bytes stored per operation.
    pub bytes: Spread,
}

/// Profiles of insert and delete for one structure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// Structure name.
    pub name: &'static str,
    /// Inserts.
    pub insert: OpProfile,
    /// Deletes.
    pub delete: OpProfile,
}

/// Keys for a run: distinct, random, never the reserved key.
pub fn keys(seed: u64, n: usize) -> Vec<u64> {
    let mut rng = SplitMix64::new(seed);
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = rng.next_u64() >> 1;
        if seen.insert(k) {
            out.push(k);
        }
    }
    out
}

/// Measures `ds` over `ops` inserts then `ops` deletes in a region of `region_len`.
pub fn profile(
    ds: Ds,
    region_len: usize,
    ops: usize,
    seed: u64,
    page_size: usize,
) -> Result<Profile, DsError> {
    let mut m = CountingMem::new(VecMem::zeroed(region_len), page_size);
    (ds.init)(&mut m)?;
    m.take();
    let ks = keys(seed, ops);
    let mut ins = Vec::with_capacity(ops);
    for &k in &ks {
        (ds.insert)(&mut m, k)?;
        ins.push(m.take());
    }
    let mut order = ks.clone();
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut del = Vec::with_capacity(ops);
    for &k in &order {
        let key = if ds.kind == Kind::Set { k } else { 0 };
        (ds.delete)(&mut m, key)?;
        del.push(m.take());
    }
    let summarize = |v: &[crate::OpCount]| OpProfile {
        writes: Spread::of(&v.iter().map(|c| c.writes).collect::<Vec<_>>()),
        pages: Spread::of(&v.iter().map(|c| c.pages).collect::<Vec<_>>()),
        bytes: Spread::of(&v.iter().map(|c| c.bytes).collect::<Vec<_>>()),
    };
    Ok(Profile {
        name: ds.name,
        insert: summarize(&ins),
        delete: summarize(&del),
    })
}

/// The profiles as a table like the talk's.
pub fn table(profiles: &[Profile]) -> String {
    let mut s = format!(
        "{:<14}{:<8}{:>10}{:>8}{:>8}{:>10}{:>8}{:>8}\n",
        "structure", "op", "writes", "min", "max", "pages", "min", "max"
    );
    for p in profiles {
        for (op, o) in [("insert", &p.insert), ("delete", &p.delete)] {
            s += &format!(
                "{:<14}{:<8}{:>10.2}{:>8}{:>8}{:>10.2}{:>8}{:>8}\n",
                p.name,
                op,
                o.writes.avg,
                o.writes.min,
                o.writes.max,
                o.pages.avg,
                o.pages.min,
                o.pages.max
            );
        }
    }
    s
}
