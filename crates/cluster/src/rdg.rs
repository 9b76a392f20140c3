//! The restore dependency graph (HotRestore §4.1): one node per VM, an edge
//! i→j when VM i sent VM j at least `min_packets` dependency-carrying packets
//! (weight: how many), so j must be up before i. Rings are the strongly
//! connected components of more than one VM (they start together, rule 5);
//! orphans are VMs with no edge at all (free, rule 6).
//!
//! Why a module of its own: the graph is what an operator looks at to see why
//! the restore line is what it is, so it also renders itself as Graphviz DOT
//! and, through the `dot` program, as SVG.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

use crate::traffic::TrafficMatrix;

/// Errors building or drawing a restore dependency graph.
#[derive(Debug, thiserror::Error)]
pub enum RdgError {
    #[error("The edge {sender} -> {receiver} names a VM that is not a node of the graph.")]
    UnknownVm { sender: String, receiver: String },
    #[error("Graphviz's `dot` is not installed (install the Debian package graphviz).")]
    DotMissing,
    #[error("Could not run Graphviz's `dot`.")]
    DotSpawn(#[source] std::io::Error),
    #[error("Graphviz's `dot` failed: {stderr}")]
    DotFailed { stderr: String },
}

/// An edge of the graph: `sender` depends on `receiver`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RdgEdge {
    pub sender: String,
    pub receiver: String,
    pub packets: u64,
}

/// The restore dependency graph.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rdg {
    /// Every VM, sorted.
    pub nodes: Vec<String>,
    /// Sorted by sender, then receiver.
    pub edges: Vec<RdgEdge>,
    /// Strongly connected components of more than one VM, each sorted, sorted.
    pub rings: Vec<Vec<String>>,
    /// VMs with no edge in or out, sorted.
    pub orphans: Vec<String>,
}

impl Rdg {
    /// The graph of a traffic matrix: pairs with fewer than `min_packets`
    /// packets are no dependency (`min_packets` 0 is taken as 1).
    pub fn from_matrix(matrix: &TrafficMatrix, min_packets: u64) -> Rdg {
        let edges = matrix
            .pairs()
            .filter(|&(_, _, n)| n >= min_packets.max(1))
            .map(|(s, r, n)| RdgEdge {
                sender: s.to_owned(),
                receiver: r.to_owned(),
                packets: n,
            })
            .collect();
        Rdg::from_edges(matrix.vms.iter().cloned(), edges)
            .expect("a traffic matrix's pairs are among its VMs")
    }

    /// The graph of the given VMs and edges. Edges that repeat a pair add up;
    /// an edge from a VM to itself is dropped (it constrains nothing).
    pub fn from_edges(
        nodes: impl IntoIterator<Item = String>,
        edges: Vec<RdgEdge>,
    ) -> Result<Rdg, RdgError> {
        let nodes: BTreeSet<String> = nodes.into_iter().collect();
        let mut merged: BTreeMap<(String, String), u64> = BTreeMap::new();
        for e in edges {
            if !nodes.contains(&e.sender) || !nodes.contains(&e.receiver) {
                return Err(RdgError::UnknownVm {
                    sender: e.sender,
                    receiver: e.receiver,
                });
            }
            if e.sender != e.receiver {
                *merged.entry((e.sender, e.receiver)).or_insert(0) += e.packets;
            }
        }
        let nodes: Vec<String> = nodes.into_iter().collect();
        let edges: Vec<RdgEdge> = merged
            .into_iter()
            .map(|((sender, receiver), packets)| RdgEdge {
                sender,
                receiver,
                packets,
            })
            .collect();
        let (graph, _) = build_graph(&nodes, &edges);
        let mut rings: Vec<Vec<String>> = tarjan_scc(&graph)
            .into_iter()
            .filter(|scc| scc.len() > 1)
            .map(|scc| {
                let mut names: Vec<String> = scc.iter().map(|&i| graph[i].clone()).collect();
                names.sort();
                names
            })
            .collect();
        rings.sort();
        let touched: BTreeSet<&str> = edges
            .iter()
            .flat_map(|e| [e.sender.as_str(), e.receiver.as_str()])
            .collect();
        let orphans = nodes
            .iter()
            .filter(|n| !touched.contains(n.as_str()))
            .cloned()
            .collect();
        Ok(Rdg {
            nodes,
            edges,
            rings,
            orphans,
        })
    }

    /// Index in [`Rdg::rings`] of the ring holding `vm`, if any.
    pub fn ring_of(&self, vm: &str) -> Option<usize> {
        self.rings.iter().position(|r| r.iter().any(|n| n == vm))
    }

    /// Graphviz DOT: rings as clusters, orphans dashed, edges labelled with
    /// their packet counts, receivers drawn below their senders.
    pub fn to_dot(&self) -> String {
        let mut out = String::from("digraph rdg {\n  rankdir=TB;\n  node [shape=box];\n");
        for (i, ring) in self.rings.iter().enumerate() {
            out.push_str(&format!(
                "  subgraph cluster_ring{i} {{\n    label=\"ring {i}\";\n    style=rounded;\n"
            ));
            for vm in ring {
                out.push_str(&format!("    {};\n", quote(vm)));
            }
            out.push_str("  }\n");
        }
        for vm in &self.orphans {
            out.push_str(&format!("  {} [style=dashed];\n", quote(vm)));
        }
        for vm in &self.nodes {
            if self.ring_of(vm).is_none() && !self.orphans.contains(vm) {
                out.push_str(&format!("  {};\n", quote(vm)));
            }
        }
        for e in &self.edges {
            out.push_str(&format!(
                "  {} -> {} [label=\"{}\"];\n",
                quote(&e.sender),
                quote(&e.receiver),
                e.packets
            ));
        }
        out.push_str("}\n");
        out
    }

    /// SVG drawn by Graphviz's `dot -Tsvg` from [`Rdg::to_dot`].
    pub fn to_svg(&self) -> Result<String, RdgError> {
        render_svg(&self.to_dot())
    }
}

/// Runs `dot -Tsvg` on a DOT text.
pub fn render_svg(dot: &str) -> Result<String, RdgError> {
    let mut child = Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => RdgError::DotMissing,
            _ => RdgError::DotSpawn(e),
        })?;
    // Feed stdin from a thread so a large output cannot deadlock the pipes.
    let mut stdin = child.stdin.take().expect("stdin was piped");
    let input = dot.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().map_err(RdgError::DotSpawn)?;
    let written = writer.join().expect("the writer thread does not panic");
    if !output.status.success() {
        return Err(RdgError::DotFailed {
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    written.map_err(RdgError::DotSpawn)?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A DOT string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A petgraph of named nodes (weights: names) and edges (weights: packets).
pub(crate) fn build_graph(
    nodes: &[String],
    edges: &[RdgEdge],
) -> (DiGraph<String, u64>, BTreeMap<String, NodeIndex>) {
    let mut graph = DiGraph::with_capacity(nodes.len(), edges.len());
    let mut index = BTreeMap::new();
    for n in nodes {
        index.insert(n.clone(), graph.add_node(n.clone()));
    }
    for e in edges {
        graph.add_edge(index[&e.sender], index[&e.receiver], e.packets);
    }
    (graph, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(s: &str, r: &str, n: u64) -> RdgEdge {
        RdgEdge {
            sender: s.into(),
            receiver: r.into(),
            packets: n,
        }
    }

    fn vms(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("VM{i}")).collect()
    }

    /// HotRestore figure 3(b): VM1 → VM2 → VM3 → VM1 is a ring, VM4 → VM3,
    /// VM5 an orphan.
    pub(crate) fn figure3() -> Rdg {
        Rdg::from_edges(
            vms(5),
            vec![
                edge("VM1", "VM2", 4),
                edge("VM2", "VM3", 2),
                edge("VM3", "VM1", 3),
                edge("VM4", "VM3", 5),
            ],
        )
        .unwrap()
    }

    #[test]
    fn figure3_ring_and_orphan() {
        let g = figure3();
        assert_eq!(g.rings, vec![vec!["VM1", "VM2", "VM3"]]);
        assert_eq!(g.orphans, vec!["VM5"]);
        assert_eq!(g.ring_of("VM2"), Some(0));
        assert_eq!(g.ring_of("VM4"), None);
    }

    #[test]
    fn from_matrix_applies_the_threshold() {
        let mut m = TrafficMatrix::default();
        for v in ["a", "b", "c"] {
            m.vms.insert(v.into());
        }
        m.counts
            .entry("a".into())
            .or_default()
            .insert("b".into(), 5);
        m.counts
            .entry("b".into())
            .or_default()
            .insert("a".into(), 1);
        m.counts
            .entry("b".into())
            .or_default()
            .insert("c".into(), 2);
        let all = Rdg::from_matrix(&m, 1);
        assert_eq!(all.rings, vec![vec!["a", "b"]]);
        assert!(all.orphans.is_empty());
        let strong = Rdg::from_matrix(&m, 2);
        assert!(strong.rings.is_empty(), "one stray packet back is no ring");
        assert_eq!(strong.edges, vec![edge("a", "b", 5), edge("b", "c", 2)]);
        let none = Rdg::from_matrix(&m, 6);
        assert_eq!(none.orphans, vec!["a", "b", "c"]);
    }

    #[test]
    fn duplicate_edges_add_up_and_unknown_vms_are_refused() {
        let g = Rdg::from_edges(
            vms(2),
            vec![
                edge("VM1", "VM2", 1),
                edge("VM1", "VM2", 2),
                edge("VM1", "VM1", 9),
            ],
        )
        .unwrap();
        assert_eq!(g.edges, vec![edge("VM1", "VM2", 3)]);
        let err = Rdg::from_edges(vms(2), vec![edge("VM1", "ghost", 1)]).unwrap_err();
        assert!(err.to_string().contains("ghost"));
    }

    #[test]
    fn dot_shows_rings_orphans_and_counts() {
        let dot = figure3().to_dot();
        assert!(dot.contains("subgraph cluster_ring0"));
        let cluster = dot.split("subgraph cluster_ring0").nth(1).unwrap();
        let cluster = &cluster[..cluster.find('}').unwrap()];
        for vm in ["VM1", "VM2", "VM3"] {
            assert!(
                cluster.contains(&format!("\"{vm}\"")),
                "{vm} in the ring cluster"
            );
        }
        assert!(!cluster.contains("VM4"));
        assert!(dot.contains("\"VM5\" [style=dashed]"));
        assert!(dot.contains("\"VM4\" -> \"VM3\" [label=\"5\"]"));
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn svg_names_every_vm() {
        let mut g = figure3();
        g.nodes.push("odd \"name\"".into());
        g.orphans.push("odd \"name\"".into());
        let svg = match g.to_svg() {
            Err(RdgError::DotMissing) => {
                panic!("this test needs Graphviz: apt-get install graphviz")
            }
            other => other.unwrap(),
        };
        assert!(svg.contains("<svg"));
        for vm in ["VM1", "VM2", "VM3", "VM4", "VM5", "odd &quot;name&quot;"] {
            assert!(
                svg.contains(&format!(">{vm}</text>")),
                "{vm} missing from the SVG"
            );
        }
    }

    #[test]
    fn dot_errors_are_reported() {
        let err = render_svg("digraph { this is not dot").unwrap_err();
        assert!(matches!(err, RdgError::DotFailed { .. }), "{err}");
    }
}
