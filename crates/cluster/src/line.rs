//! The restore line (HotRestore §4.2): when each VM of the cluster should start,
//! so that every VM is up before any VM that will send to it, while each VM's
//! working set changes as little as possible.
//!
//! # Model
//! VM i's de facto start time S_i is its elastic working set divided by its
//! measured load rate ([`VmLoad::start_s`]). It cannot start before 0 nor later
//! than the time to load all its RAM ([`VmLoad::upper_bound_s`]): it has no more
//! pages to load. For each dependency i→j (i sends to j) with margin W_ij
//! seconds, the receiver starts first: S*_i − S*_j ≥ W_ij. VMs of a ring (a
//! strongly connected component) start together: S*_i = S*_j. Edges inside a
//! ring are equalities, not inequalities, else every ring would be infeasible.
//! We minimise Σ|S*_i − S_i|, linearised with two auxiliary variables per VM:
//! S*_i − S_i = up_i − down_i, up_i, down_i ≥ 0, minimise Σ (up_i + down_i);
//! at an optimum one of the pair is 0, so the sum is |S*_i − S_i|. (One
//! equality row per VM rather than the two rows of t_i ≥ ±(S*_i − S_i): the
//! simplex runs about twice as fast.)
//!
//! # How
//! - Rings are contracted first ([`petgraph::algo::tarjan_scc`]): one variable
//!   per component, so the equalities need no constraints at all.
//! - Feasibility is decided exactly before any solver runs: in the condensation
//!   (a DAG), the earliest a component can start is the longest margin path to a
//!   sink. If that exceeds its bound, no line exists, and the error names that
//!   path. Otherwise starting every component at its earliest is feasible.
//! - An input that already satisfies every constraint is returned unchanged.
//! - Otherwise each weakly connected part of the condensation with an edge is
//!   one LP, solved by `good_lp`'s pure-Rust `microlp` backend; components
//!   without edges keep their own S (a ring without edges gets the LP too).
//! - The solution is checked against every constraint ([`verify`]) before it is
//!   returned.
//!
//! The restore order is the VMs by ascending S*, ties broken receivers first.

use std::collections::{BTreeMap, HashMap};

use good_lp::{
    constraint, microlp, variable, Expression, ProblemVariables, Solution, SolverModel, Variable,
};
use petgraph::algo::tarjan_scc;
use petgraph::graph::DiGraph;
use petgraph::unionfind::UnionFind;
use serde::{Deserialize, Serialize};

/// Slack allowed when checking a solution, in seconds.
pub const TOLERANCE_S: f64 = 1e-6;

/// Errors computing or checking a restore line.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    #[error("VM {0} is listed twice.")]
    DuplicateVm(String),
    #[error("VM {vm} has a load rate of {rate} pages/s; it must be a positive number.")]
    BadRate { vm: String, rate: f64 },
    #[error(
        "VM {vm} has a working set of {working_set} pages, more than its {total} pages of RAM."
    )]
    WorkingSetTooLarge {
        vm: String,
        working_set: u64,
        total: u64,
    },
    #[error("The dependency {sender} -> {receiver} names a VM that has no load figures.")]
    UnknownVm { sender: String, receiver: String },
    #[error("The dependency {sender} -> {receiver} has a margin of {margin} s; it must be a number of seconds, 0 or more.")]
    BadMargin {
        sender: String,
        receiver: String,
        margin: f64,
    },
    #[error("No restore line exists: the chain {chain} needs {vm} to start at {earliest_s:.3} s at the earliest, but loading its whole RAM takes only {bound_s:.3} s.")]
    Infeasible {
        vm: String,
        chain: String,
        earliest_s: f64,
        bound_s: f64,
    },
    #[error("The LP solver failed on a problem known to be feasible: {0}.")]
    Solver(String),
    #[error("The restore line breaks a constraint: {0}.")]
    Violation(String),
}

/// One VM's load figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmLoad {
    pub name: String,
    /// Pages of the elastic working set as estimated (§3.1.2).
    pub working_set_pages: u64,
    /// Pages of guest RAM.
    pub total_pages: u64,
    /// Measured restore load rate, pages per second.
    pub load_rate_pages_per_s: f64,
}

impl VmLoad {
    /// De facto start time S_i: working set over load rate, in seconds.
    pub fn start_s(&self) -> f64 {
        self.working_set_pages as f64 / self.load_rate_pages_per_s
    }

    /// The latest it can start: all its RAM loaded, in seconds.
    pub fn upper_bound_s(&self) -> f64 {
        self.total_pages as f64 / self.load_rate_pages_per_s
    }

    /// The working set that takes `start_s` seconds to load, in [0, total].
    pub fn pages_for(&self, start_s: f64) -> u64 {
        let pages = (start_s * self.load_rate_pages_per_s).round();
        if pages <= 0.0 {
            0
        } else {
            (pages as u64).min(self.total_pages)
        }
    }
}

/// `sender` will send to `receiver`, which must be up `margin_s` before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dependency {
    pub sender: String,
    pub receiver: String,
    pub margin_s: f64,
}

/// What the restore line is computed from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LineInput {
    pub vms: Vec<VmLoad>,
    pub dependencies: Vec<Dependency>,
    /// A VM may start later than its whole RAM takes to load: it waits, paused, with
    /// all its pages in (then a line always exists). Without it, the paper's model: no
    /// VM starts later than that, and margins longer than a small VM's load time
    /// leave no line.
    #[serde(default)]
    pub may_wait: bool,
    /// No VM starts before its own working set is loaded: the line only delays starts,
    /// so working sets only grow (fewer page faults after the start, later starts).
    /// Without it, the paper's model: a VM may start before S_i with less loaded.
    #[serde(default)]
    pub keep_working_sets: bool,
}

/// One VM on the restore line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmStart {
    pub name: String,
    /// Index of its ring among [`RestoreLine::rings`], if in one.
    pub ring: Option<usize>,
    /// S_i, seconds.
    pub start_s: f64,
    /// S*_i, seconds.
    pub revised_start_s: f64,
    pub upper_bound_s: f64,
    pub working_set_pages: u64,
    /// S*_i × rate, rounded, in [0, total pages].
    pub revised_working_set_pages: u64,
}

/// The restore line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestoreLine {
    /// In the input's order.
    pub vms: Vec<VmStart>,
    /// VM names by ascending S*, receivers before their senders on ties.
    pub order: Vec<String>,
    /// Rings (members sorted), as found among the dependencies.
    pub rings: Vec<Vec<String>>,
    /// Σ|S*_i − S_i|, seconds.
    pub total_shift_s: f64,
    /// Whether an LP had to run (false: the input was already consistent).
    pub solved_by_lp: bool,
}

/// The input, checked, with the condensation built.
struct Model<'a> {
    input: &'a LineInput,
    s: Vec<f64>,
    upper: Vec<f64>,
    /// The latest each VM may start: `upper`, or no limit when VMs may wait.
    limit: Vec<f64>,
    /// Component of each VM; components are numbered receivers first (a
    /// component's receivers have lower numbers).
    comp: Vec<usize>,
    members: Vec<Vec<usize>>,
    comp_upper: Vec<f64>,
    /// The earliest each component may start: 0, or its members' latest S_i when
    /// working sets are kept.
    comp_lower: Vec<f64>,
    /// Component edges (sender comp, receiver comp) → largest margin, and the
    /// VM edge that gave it.
    comp_edges: BTreeMap<(usize, usize), (f64, usize)>,
}

fn build(input: &LineInput) -> Result<Model<'_>, LineError> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(input.vms.len());
    for (i, vm) in input.vms.iter().enumerate() {
        if index.insert(vm.name.as_str(), i).is_some() {
            return Err(LineError::DuplicateVm(vm.name.clone()));
        }
        let rate = vm.load_rate_pages_per_s;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(LineError::BadRate {
                vm: vm.name.clone(),
                rate,
            });
        }
        if vm.working_set_pages > vm.total_pages {
            return Err(LineError::WorkingSetTooLarge {
                vm: vm.name.clone(),
                working_set: vm.working_set_pages,
                total: vm.total_pages,
            });
        }
    }
    let mut graph: DiGraph<usize, usize> =
        DiGraph::with_capacity(input.vms.len(), input.dependencies.len());
    let nodes: Vec<_> = (0..input.vms.len()).map(|i| graph.add_node(i)).collect();
    let mut edges = Vec::with_capacity(input.dependencies.len());
    for (k, d) in input.dependencies.iter().enumerate() {
        let (Some(&i), Some(&j)) = (index.get(d.sender.as_str()), index.get(d.receiver.as_str()))
        else {
            return Err(LineError::UnknownVm {
                sender: d.sender.clone(),
                receiver: d.receiver.clone(),
            });
        };
        if !(d.margin_s.is_finite() && d.margin_s >= 0.0) {
            return Err(LineError::BadMargin {
                sender: d.sender.clone(),
                receiver: d.receiver.clone(),
                margin: d.margin_s,
            });
        }
        if i != j {
            graph.add_edge(nodes[i], nodes[j], k);
            edges.push((i, j, k));
        }
    }
    // Tarjan emits a component after every component it reaches: receivers first.
    let sccs = tarjan_scc(&graph);
    let mut comp = vec![0; input.vms.len()];
    let mut members = Vec::with_capacity(sccs.len());
    for (c, scc) in sccs.iter().enumerate() {
        let mut m: Vec<usize> = scc.iter().map(|&n| graph[n]).collect();
        m.sort_unstable();
        for &i in &m {
            comp[i] = c;
        }
        members.push(m);
    }
    let s: Vec<f64> = input.vms.iter().map(VmLoad::start_s).collect();
    let upper: Vec<f64> = input.vms.iter().map(VmLoad::upper_bound_s).collect();
    let limit: Vec<f64> = match input.may_wait {
        true => vec![f64::INFINITY; upper.len()],
        false => upper.clone(),
    };
    let comp_upper = members
        .iter()
        .map(|m| m.iter().map(|&i| limit[i]).fold(f64::INFINITY, f64::min))
        .collect();
    let comp_lower = members
        .iter()
        .map(|m| match input.keep_working_sets {
            true => m.iter().map(|&i| s[i]).fold(0.0, f64::max),
            false => 0.0,
        })
        .collect();
    let mut comp_edges: BTreeMap<(usize, usize), (f64, usize)> = BTreeMap::new();
    for (i, j, k) in edges {
        let (ci, cj) = (comp[i], comp[j]);
        if ci == cj {
            continue;
        }
        let w = input.dependencies[k].margin_s;
        let e = comp_edges.entry((ci, cj)).or_insert((w, k));
        if w > e.0 {
            *e = (w, k);
        }
    }
    Ok(Model {
        input,
        s,
        upper,
        limit,
        comp,
        members,
        comp_upper,
        comp_lower,
        comp_edges,
    })
}

impl Model<'_> {
    fn comp_name(&self, c: usize) -> String {
        let names: Vec<&str> = self.members[c]
            .iter()
            .map(|&i| self.input.vms[i].name.as_str())
            .collect();
        if names.len() == 1 {
            names[0].to_owned()
        } else {
            format!("ring {{{}}}", names.join(", "))
        }
    }

    /// Earliest start of each component, and the edge of the longest path.
    fn earliest(&self) -> (Vec<f64>, Vec<Option<(usize, usize)>>) {
        let n = self.members.len();
        let mut out: Vec<Vec<(usize, f64, usize)>> = vec![Vec::new(); n];
        for (&(ci, cj), &(w, k)) in &self.comp_edges {
            out[ci].push((cj, w, k));
        }
        let mut earliest = self.comp_lower.clone();
        let mut via = vec![None; n];
        // Receivers have lower numbers, so they are done first.
        for c in 0..n {
            for &(d, w, k) in &out[c] {
                debug_assert!(d < c);
                if earliest[d] + w > earliest[c] {
                    earliest[c] = earliest[d] + w;
                    via[c] = Some((d, k));
                }
            }
        }
        (earliest, via)
    }

    fn check_feasible(&self) -> Result<(), LineError> {
        let (earliest, via) = self.earliest();
        // The component closest to the senders' end shows the longest chain.
        for c in (0..self.members.len()).rev() {
            let bound = self.comp_upper[c];
            if earliest[c] <= bound + TOLERANCE_S {
                continue;
            }
            let vm = self.members[c]
                .iter()
                .copied()
                .min_by(|&a, &b| self.upper[a].total_cmp(&self.upper[b]))
                .expect("a component has a member");
            let mut chain = self.comp_name(c);
            let mut at = c;
            while let Some((d, k)) = via[at] {
                let dep = &self.input.dependencies[k];
                chain.push_str(&format!(
                    " -({} -> {}, {:.3} s)-> {}",
                    dep.sender,
                    dep.receiver,
                    dep.margin_s,
                    self.comp_name(d)
                ));
                at = d;
            }
            return Err(LineError::Infeasible {
                vm: self.input.vms[vm].name.clone(),
                chain,
                earliest_s: earliest[c],
                bound_s: bound,
            });
        }
        Ok(())
    }

    fn consistent(&self, x: &[f64]) -> bool {
        let rings_equal = self
            .members
            .iter()
            .all(|m| m.iter().all(|&i| self.s[i] == self.s[m[0]]));
        rings_equal
            && self
                .comp_edges
                .iter()
                .all(|(&(ci, cj), &(w, _))| x[ci] - x[cj] >= w)
    }

    /// Solves the LP of every weakly connected part that has an edge or a ring.
    fn solve_lp(&self, x: &mut [f64]) -> Result<(), LineError> {
        let n = self.members.len();
        let mut parts = UnionFind::<usize>::new(n);
        for &(ci, cj) in self.comp_edges.keys() {
            parts.union(ci, cj);
        }
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let mut has_edge = vec![false; n];
        for &(ci, _) in self.comp_edges.keys() {
            has_edge[parts.find(ci)] = true;
        }
        for c in 0..n {
            let root = parts.find(c);
            if has_edge[root] || self.members[c].len() > 1 {
                groups.entry(root).or_default().push(c);
            }
        }
        let mut edges_of: BTreeMap<usize, Vec<(usize, usize, f64)>> = BTreeMap::new();
        for (&(ci, cj), &(w, _)) in &self.comp_edges {
            edges_of
                .entry(parts.find(ci))
                .or_default()
                .push((ci, cj, w));
        }
        for (root, comps) in groups {
            let edges = edges_of.remove(&root).unwrap_or_default();
            self.solve_group(&comps, &edges, x)?;
        }
        Ok(())
    }

    fn solve_group(
        &self,
        comps: &[usize],
        edges: &[(usize, usize, f64)],
        x: &mut [f64],
    ) -> Result<(), LineError> {
        let mut vars = ProblemVariables::new();
        let mut xv: HashMap<usize, Variable> = HashMap::with_capacity(comps.len());
        for &c in comps {
            let v = match self.comp_upper[c] {
                u if u.is_finite() => variable().min(self.comp_lower[c]).max(u),
                _ => variable().min(self.comp_lower[c]),
            };
            xv.insert(c, vars.add(v));
        }
        // x_c - S_i = up_i - down_i with up, down ≥ 0: one row per VM; at
        // the optimum one of the two is 0, so up + down = |x_c - S_i|.
        let mut shifts = Vec::new();
        for &c in comps {
            for &i in &self.members[c] {
                let up = vars.add(variable().min(0.0));
                let down = vars.add(variable().min(0.0));
                shifts.push((xv[&c], up, down, self.s[i]));
            }
        }
        let objective: Expression = shifts.iter().map(|&(_, up, down, _)| up + down).sum();
        let mut problem = vars.minimise(objective).using(microlp);
        for &(xc, up, down, s) in &shifts {
            problem.add_constraint(constraint!(xc - up + down == s));
        }
        for &(ci, cj, w) in edges {
            problem.add_constraint(constraint!(xv[&ci] - xv[&cj] >= w));
        }
        let solution = problem
            .solve()
            .map_err(|e| LineError::Solver(e.to_string()))?;
        for &c in comps {
            x[c] = solution
                .value(xv[&c])
                .clamp(self.comp_lower[c], self.comp_upper[c]);
        }
        Ok(())
    }
}

/// Computes the restore line.
pub fn solve(input: &LineInput) -> Result<RestoreLine, LineError> {
    let model = build(input)?;
    model.check_feasible()?;
    // A start per component: the first member's S (exact for an already
    // consistent input, where ring members agree).
    let mut x: Vec<f64> = model.members.iter().map(|m| model.s[m[0]]).collect();
    let solved_by_lp = !model.consistent(&x);
    if solved_by_lp {
        model.solve_lp(&mut x)?;
    }
    let line = assemble(&model, &x, solved_by_lp);
    verify(input, &line, TOLERANCE_S)?;
    Ok(line)
}

fn assemble(model: &Model<'_>, x: &[f64], solved_by_lp: bool) -> RestoreLine {
    let mut ring_ids: HashMap<usize, usize> = HashMap::new();
    let mut rings: Vec<(Vec<String>, usize)> = model
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.len() > 1)
        .map(|(c, m)| {
            let mut names: Vec<String> =
                m.iter().map(|&i| model.input.vms[i].name.clone()).collect();
            names.sort();
            (names, c)
        })
        .collect();
    rings.sort();
    for (id, (_, c)) in rings.iter().enumerate() {
        ring_ids.insert(*c, id);
    }
    let vms: Vec<VmStart> = model
        .input
        .vms
        .iter()
        .enumerate()
        .map(|(i, vm)| {
            let c = model.comp[i];
            VmStart {
                name: vm.name.clone(),
                ring: ring_ids.get(&c).copied(),
                start_s: model.s[i],
                revised_start_s: x[c],
                upper_bound_s: model.upper[i],
                working_set_pages: vm.working_set_pages,
                revised_working_set_pages: vm.pages_for(x[c]),
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..vms.len()).collect();
    order.sort_by(|&a, &b| {
        let (ca, cb) = (model.comp[a], model.comp[b]);
        x[ca]
            .total_cmp(&x[cb])
            .then(ca.cmp(&cb))
            .then_with(|| vms[a].name.cmp(&vms[b].name))
    });
    let total_shift_s = vms
        .iter()
        .map(|v| (v.revised_start_s - v.start_s).abs())
        .sum();
    RestoreLine {
        order: order.into_iter().map(|i| vms[i].name.clone()).collect(),
        vms,
        rings: rings.into_iter().map(|(names, _)| names).collect(),
        total_shift_s,
        solved_by_lp,
    }
}

/// Checks a restore line against every constraint of its input: bounds,
/// dependency margins, equal starts within rings, pages matching starts, and
/// an order that never puts a sender before its receiver.
pub fn verify(input: &LineInput, line: &RestoreLine, tolerance_s: f64) -> Result<(), LineError> {
    let model = build(input)?;
    let by_name: HashMap<&str, &VmStart> = line.vms.iter().map(|v| (v.name.as_str(), v)).collect();
    let fail = |msg: String| Err(LineError::Violation(msg));
    if by_name.len() != input.vms.len() {
        return fail(format!(
            "it has {} VMs for {} in the input",
            by_name.len(),
            input.vms.len()
        ));
    }
    let mut start = vec![0.0; input.vms.len()];
    for (i, vm) in input.vms.iter().enumerate() {
        let Some(v) = by_name.get(vm.name.as_str()) else {
            return fail(format!("VM {} is missing", vm.name));
        };
        let s = v.revised_start_s;
        start[i] = s;
        let lower = model.comp_lower[model.comp[i]];
        if !(s >= lower - tolerance_s && s <= model.limit[i] + tolerance_s) {
            return fail(format!(
                "VM {} starts at {s} s, outside [{lower}, {}]",
                vm.name, model.limit[i]
            ));
        }
        if v.revised_working_set_pages != vm.pages_for(s) {
            return fail(format!(
                "VM {} loads {} pages, not the {} its start needs",
                vm.name,
                v.revised_working_set_pages,
                vm.pages_for(s)
            ));
        }
    }
    let position: HashMap<&str, usize> = line
        .order
        .iter()
        .enumerate()
        .map(|(p, n)| (n.as_str(), p))
        .collect();
    if position.len() != input.vms.len()
        || line.order.iter().any(|n| !by_name.contains_key(n.as_str()))
    {
        return fail("the order is not the list of the VMs, each once".to_owned());
    }
    let index: HashMap<&str, usize> = input
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| (v.name.as_str(), i))
        .collect();
    for d in &input.dependencies {
        let (i, j) = (index[d.sender.as_str()], index[d.receiver.as_str()]);
        if i == j {
            continue;
        }
        let gap = start[i] - start[j];
        if model.comp[i] == model.comp[j] {
            if gap.abs() > tolerance_s {
                return fail(format!(
                    "{} and {} share a ring but start {gap} s apart",
                    d.sender, d.receiver
                ));
            }
        } else {
            if gap < d.margin_s - tolerance_s {
                return fail(format!(
                    "{} starts {gap} s after {}, less than the margin of {} s",
                    d.sender, d.receiver, d.margin_s
                ));
            }
            if position.get(d.sender.as_str()) < position.get(d.receiver.as_str()) {
                return fail(format!(
                    "the order puts {} before {}, which it sends to",
                    d.sender, d.receiver
                ));
            }
        }
    }
    Ok(())
}

/// A small deterministic generator (SplitMix64), so a synthetic cluster is the
/// same for the same seed everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Uniform in [lo, hi).
    fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

/// A synthetic cluster of `n` VMs: about a tenth in rings of 2 to 4, about a
/// tenth orphans, the rest with one to three dependencies each on VMs of a
/// lower rank (so the rings are exactly the planted ones), load rates of 20k to
/// 200k pages/s, RAM of 30 to 120 s of loading, working sets of 2 to 30 % of
/// RAM, margins of 50 ms. Always feasible for any `n` a machine can solve.
pub fn synthetic(n: usize, seed: u64) -> LineInput {
    let mut rng = SplitMix64(seed);
    let vms: Vec<VmLoad> = (0..n)
        .map(|i| {
            let rate = rng.range_f64(20_000.0, 200_000.0).round();
            let total = (rate * rng.range_f64(30.0, 120.0)) as u64;
            let ws = (total as f64 * rng.range_f64(0.02, 0.30)) as u64;
            VmLoad {
                name: format!("vm{i:05}"),
                working_set_pages: ws,
                total_pages: total,
                load_rate_pages_per_s: rate,
            }
        })
        .collect();
    // Units: a ring or a single VM; each unit has one rank (its index).
    let mut units: Vec<Vec<usize>> = Vec::new();
    let mut orphans = Vec::new();
    let mut i = 0;
    while i < n {
        let roll = rng.below(20);
        if roll < 2 {
            orphans.push(i);
            i += 1;
        } else if roll < 4 && n - i >= 2 {
            let size = (2 + rng.below(3)).min(n - i);
            units.push((i..i + size).collect());
            i += size;
        } else {
            units.push(vec![i]);
            i += 1;
        }
    }
    // Shuffle the ranks so names say nothing about the order.
    for k in (1..units.len()).rev() {
        units.swap(k, rng.below(k + 1));
    }
    let margin_s = 0.05;
    let dep = |s: usize, r: usize| Dependency {
        sender: vms[s].name.clone(),
        receiver: vms[r].name.clone(),
        margin_s,
    };
    let mut dependencies = Vec::new();
    for (rank, unit) in units.iter().enumerate() {
        if unit.len() > 1 {
            for (k, &v) in unit.iter().enumerate() {
                dependencies.push(dep(v, unit[(k + 1) % unit.len()]));
            }
        }
        if rank == 0 {
            continue;
        }
        for _ in 0..1 + rng.below(3) {
            let target = &units[rng.below(rank)];
            let from = unit[rng.below(unit.len())];
            dependencies.push(dep(from, target[rng.below(target.len())]));
        }
    }
    debug_assert!(orphans
        .iter()
        .all(|&o| units.iter().all(|u| !u.contains(&o))));
    LineInput {
        vms,
        dependencies,
        may_wait: false,
        keep_working_sets: false,
    }
}

#[cfg(test)]
mod tests;
