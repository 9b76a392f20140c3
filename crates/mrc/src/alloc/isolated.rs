//! Isolated sharing (paper section 4.2): minimise the geometric mean of the
//! VMs' miss ratios, keeping every VM's predicted misses within
//! `(1 + bound - margin)` times its misses at its baseline allocation (the
//! margin for the curves' error: see the parent module).
//!
//! The paper searches every allocation for up to three VMs (about 10 000
//! for three VMs of 100 sizes each) and suggests a greedy search beyond. A
//! greedy search can stop at a local optimum when curves are not convex, so
//! beyond three VMs this uses dynamic programming instead, which is exact on
//! the grid:
//!
//! - Minimising the geometric mean is minimising the sum of the logarithms
//!   of the miss ratios (the geometric mean is `exp` of their mean, and
//!   `exp` is increasing), and that sum is separable: VM `i`'s term depends
//!   on its own size only.
//! - The constraints are per VM (the bound, the limits), which only remove
//!   sizes from a VM's choices, plus one coupling constraint, that the
//!   sizes add up to the total.
//! - So with `best(i, m)` the least sum for VMs `0..=i` using exactly `m`
//!   units, `best(i, m) = min over k of best(i - 1, m - k) + cost_i(k)`: an
//!   optimal allocation of `m` units to the first `i + 1` VMs gives VM `i`
//!   some `k` and the others an allocation of `m - k` units that must itself
//!   be optimal, or swapping in a better one would improve the whole. The
//!   table therefore holds the exact optimum, found in `O(n * U * K)` steps
//!   (`U` units in all, at most `K` sizes per VM) rather than `K^(n-1)`.
//!
//! Both methods add the terms in VM order, so they compute bit-identical
//! objective values for the same allocation; ties go to the allocation
//! found first, so the two may return different allocations of equal value.

use super::{AllocError, Allocation, Grid, Params, Vm};

/// How to search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Exhaustive search up to [`EXHAUSTIVE_MAX_VMS`] VMs, dynamic programming beyond.
    Auto,
    /// Try every allocation: `K^(n-1)` of them.
    Exhaustive,
    /// Dynamic programming over VMs and units (see the module doc).
    Dynamic,
}

/// Up to this many VMs, [`Method::Auto`] searches exhaustively, as the paper does.
pub const EXHAUSTIVE_MAX_VMS: usize = 3;

/// Isolated sharing with [`Method::Auto`].
pub fn isolated_sharing(vms: &[Vm<'_>], params: &Params) -> Result<Allocation, AllocError> {
    isolated_sharing_with(vms, params, Method::Auto)
}

/// Isolated sharing by the given method.
pub fn isolated_sharing_with(
    vms: &[Vm<'_>],
    params: &Params,
    method: Method,
) -> Result<Allocation, AllocError> {
    let grid = Grid::new(vms, params)?;
    let exhaustive = match method {
        Method::Auto => vms.len() <= EXHAUSTIVE_MAX_VMS,
        Method::Exhaustive => true,
        Method::Dynamic => false,
    };
    let units = if exhaustive {
        exhaustive_search(&grid)
    } else {
        dynamic(&grid)
    };
    units
        .map(|u| grid.outcome(&u))
        .ok_or(AllocError::Infeasible)
}

/// The best allocation by trying them all, or `None` if none is feasible.
fn exhaustive_search(grid: &Grid) -> Option<Vec<u64>> {
    struct Search<'g> {
        grid: &'g Grid,
        current: Vec<u64>,
        best: Option<(f64, Vec<u64>)>,
    }

    impl Search<'_> {
        /// Sizes VM `i` and the rest with `left` units, `sum` so far.
        fn visit(&mut self, i: usize, left: u64, sum: f64) {
            let t = &self.grid.tables[i];
            let last = i + 1 == self.grid.tables.len();
            let range = if last {
                // The last VM takes what is left, if it can.
                if left < t.min_units || left > t.max_units() {
                    return;
                }
                left..=left
            } else {
                t.min_units..=t.max_units().min(left)
            };
            for k in range {
                let j = t.index(k);
                if !t.feasible[j] {
                    continue;
                }
                let total = sum + t.cost[j];
                self.current.push(k);
                if last {
                    if self.best.as_ref().is_none_or(|(b, _)| total < *b) {
                        self.best = Some((total, self.current.clone()));
                    }
                } else {
                    self.visit(i + 1, left - k, total);
                }
                self.current.pop();
            }
        }
    }

    let mut search = Search {
        grid,
        current: Vec::with_capacity(grid.tables.len()),
        best: None,
    };
    search.visit(0, grid.units, 0.0);
    search.best.map(|(_, units)| units)
}

/// The best allocation by dynamic programming, or `None` if none is feasible.
fn dynamic(grid: &Grid) -> Option<Vec<u64>> {
    let width = grid.units as usize + 1;
    // best[m]: least sum for the VMs so far using m units; choice[i][m]:
    // the units VM i takes in that optimum.
    let mut best = vec![f64::INFINITY; width];
    let mut choice: Vec<Vec<u64>> = Vec::with_capacity(grid.tables.len());
    let mut first = true;
    for t in &grid.tables {
        let mut next = vec![f64::INFINITY; width];
        let mut took = vec![0u64; width];
        for k in t.min_units..=t.max_units() {
            let j = t.index(k);
            if !t.feasible[j] {
                continue;
            }
            for m in k as usize..width {
                let before = if first {
                    // The first VM's term alone, as the exhaustive search adds it.
                    if m != k as usize {
                        continue;
                    }
                    0.0
                } else {
                    best[m - k as usize]
                };
                let total = before + t.cost[j];
                if total < next[m] {
                    next[m] = total;
                    took[m] = k;
                }
            }
        }
        first = false;
        best = next;
        choice.push(took);
    }
    if !best[grid.units as usize].is_finite() {
        return None;
    }
    // Walk back from the last VM.
    let mut units = vec![0; grid.tables.len()];
    let mut m = grid.units as usize;
    for i in (0..grid.tables.len()).rev() {
        units[i] = choice[i][m];
        m -= units[i] as usize;
    }
    Some(units)
}
