//! The cluster benchmark's rounds summed up: every (topology, variant) cell's figures
//! as medians with min and max over the rounds that measured them, the same over all
//! topologies per variant, and each variant's disruption against working-set's on its path ([`baseline`]) in
//! the same round. A failed restore (or a cluster that could not be set up, which
//! fails every variant of its topology in that round) is counted, never measured.

use serde::Serialize;

use super::Summary;
use crate::rounds::{show, Failure, Stat};

/// One run that failed: a restore (`variant`), or the topology's cluster or snapshot
/// in that round (`variant` `None`: none of its variants was tried).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Failed {
    pub topology: String,
    pub variant: Option<String>,
    #[serde(flatten)]
    pub failure: Failure,
}

/// One restore that measured: which cell, which round (from 0), its figures.
#[derive(Debug, Clone, Copy)]
pub(super) struct Point<'a> {
    pub topology: &'a str,
    pub round: usize,
    pub variant: &'a str,
    pub summary: &'a Summary,
}

/// A cell's figures over its rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(super) struct Cell {
    /// A topology, or `all` for the variant over every topology.
    pub topology: String,
    pub variant: String,
    /// Rounds that measured: the medians are over these.
    pub runs: usize,
    /// Rounds that failed (their errors are in the run's failures).
    pub failed: usize,
    pub max_backoff_s: Option<Stat>,
    pub avg_backoff_s: Option<Stat>,
    pub avg_disruption_s: Option<Stat>,
    pub start_spread_s: Option<Stat>,
    pub retransmits: Option<Stat>,
    pub false_alarms: Option<Stat>,
    pub false_alarms_after_peer_start: Option<Stat>,
    pub worst_request_s: Option<Stat>,
    /// Average disruption against working-set's in the same round.
    pub disruption_vs_working_set: Option<Stat>,
}

/// Several topologies' figures of one variant in one round as one: the worst of the
/// maxima, the mean of the averages, the sums of the counts.
pub(super) fn combine(sums: &[&Summary]) -> Summary {
    let n = sums.len().max(1) as f64;
    let max = |f: fn(&Summary) -> f64| sums.iter().map(|s| f(s)).fold(f64::NAN, f64::max);
    let avg = |f: fn(&Summary) -> f64| sums.iter().map(|s| f(s)).sum::<f64>() / n;
    let sum = |f: fn(&Summary) -> u64| sums.iter().map(|s| f(s)).sum();
    Summary {
        max_backoff_s: max(|s| s.max_backoff_s),
        avg_backoff_s: avg(|s| s.avg_backoff_s),
        avg_disruption_s: avg(|s| s.avg_disruption_s),
        retransmits: sum(|s| s.retransmits),
        false_alarms: sum(|s| s.false_alarms),
        false_alarms_after_peer_start: sum(|s| s.false_alarms_after_peer_start),
        worst_request_s: max(|s| s.worst_request_s),
        start_spread_s: max(|s| s.start_spread_s),
    }
}

fn cell(
    topology: &str,
    variant: &str,
    failed: usize,
    pts: &[(usize, Summary)],
    ws: &[(usize, f64)],
) -> Cell {
    let f = |g: fn(&Summary) -> f64| Stat::of(pts.iter().map(|(_, s)| g(s)));
    let u = |g: fn(&Summary) -> u64| Stat::of(pts.iter().map(|(_, s)| g(s) as f64));
    let ratio = Stat::of(pts.iter().filter_map(|(r, s)| {
        let w = ws.iter().find(|(wr, _)| wr == r)?.1;
        (w > 0.0).then(|| s.avg_disruption_s / w)
    }));
    Cell {
        topology: topology.into(),
        variant: variant.into(),
        runs: pts.len(),
        failed,
        max_backoff_s: f(|s| s.max_backoff_s),
        avg_backoff_s: f(|s| s.avg_backoff_s),
        avg_disruption_s: f(|s| s.avg_disruption_s),
        start_spread_s: f(|s| s.start_spread_s),
        retransmits: u(|s| s.retransmits),
        false_alarms: u(|s| s.false_alarms),
        false_alarms_after_peer_start: u(|s| s.false_alarms_after_peer_start),
        worst_request_s: f(|s| s.worst_request_s),
        disruption_vs_working_set: ratio,
    }
}

/// Every (topology, variant) cell in the order given, then one `all` cell per
/// variant. A round enters a variant's `all` cell only if every topology measured
/// that variant in it: a topology that failed is never averaged away.
pub(super) fn cells(
    topologies: &[String],
    variants: &[&str],
    rounds: usize,
    points: &[Point],
    failures: &[Failed],
) -> Vec<Cell> {
    let failed_in = |t: &str, v: &str, r: usize| {
        failures.iter().any(|f| {
            f.topology == t
                && f.failure.round == r + 1
                && f.variant.as_deref().is_none_or(|fv| fv == v)
        })
    };
    let of = |t: &str, v: &str| -> Vec<(usize, Summary)> {
        points
            .iter()
            .filter(|p| p.topology == t && p.variant == v && !failed_in(t, v, p.round))
            .map(|p| (p.round, p.summary.clone()))
            .collect()
    };
    let ws_of = |pts: &[(usize, Summary)]| -> Vec<(usize, f64)> {
        pts.iter().map(|(r, s)| (*r, s.avg_disruption_s)).collect()
    };
    let mut out = Vec::new();
    for t in topologies {
        for v in variants {
            let ws = ws_of(&of(t, baseline(v)));
            let pts = of(t, v);
            let failed = (0..rounds).filter(|&r| failed_in(t, v, r)).count();
            out.push(cell(t, v, failed, &pts, &ws));
        }
    }
    let all_of = |v: &str| -> (usize, Vec<(usize, Summary)>) {
        let mut pts = Vec::new();
        for r in 0..rounds {
            let per: Vec<Summary> = topologies
                .iter()
                .filter_map(|t| of(t, v).into_iter().find(|(pr, _)| *pr == r).map(|x| x.1))
                .collect();
            if per.len() == topologies.len() && !per.is_empty() {
                pts.push((r, combine(&per.iter().collect::<Vec<_>>())));
            }
        }
        (rounds - pts.len(), pts)
    };
    for v in variants {
        let ws = ws_of(&all_of(baseline(v)).1);
        let (failed, pts) = all_of(v);
        out.push(cell("all", v, failed, &pts, &ws));
    }
    out
}

/// The variant a variant's disruption is compared with: working-set on the same path
/// (`ps-` names the page server's variants).
pub(super) fn baseline(variant: &str) -> &'static str {
    if variant.starts_with("ps-") {
        "ps-working-set"
    } else {
        "working-set"
    }
}

/// The table of medians [min-max], one row per cell.
pub(super) fn print_table(cells: &[Cell], rounds: usize) {
    println!("medians [min–max] over the rounds that measured (ok: of {rounds} tried); disr/ws: average disruption against working-set's (ps-working-set's for ps- variants) in the same round");
    println!(
        "{:<13} {:<12} {:>4} {:>21} {:>21} {:>21} {:>21} {:>15} {:>15} {:>21} {:>21}",
        "topology",
        "variant",
        "ok",
        "max backoff s",
        "avg backoff s",
        "avg disruption s",
        "start spread s",
        "retransmits",
        "false alarms",
        "worst request s",
        "disr/ws"
    );
    for c in cells {
        let ok = format!("{}/{}", c.runs, c.runs + c.failed);
        if c.runs == 0 {
            println!(
                "{:<13} {:<12} {ok:>4} FAILED: no round measured this cell (errors below)",
                c.topology, c.variant
            );
            continue;
        }
        println!(
            "{:<13} {:<12} {ok:>4} {:>21} {:>21} {:>21} {:>21} {:>15} {:>15} {:>21} {:>21}",
            c.topology,
            c.variant,
            show(&c.max_backoff_s, 3),
            show(&c.avg_backoff_s, 3),
            show(&c.avg_disruption_s, 3),
            show(&c.start_spread_s, 3),
            show(&c.retransmits, 1),
            show(&c.false_alarms, 1),
            show(&c.worst_request_s, 3),
            show(&c.disruption_vs_working_set, 2),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(max_backoff: f64, disruption: f64, alarms: u64) -> Summary {
        Summary {
            max_backoff_s: max_backoff,
            avg_backoff_s: max_backoff / 2.0,
            avg_disruption_s: disruption,
            retransmits: 10,
            false_alarms: alarms,
            false_alarms_after_peer_start: 0,
            worst_request_s: 1.0,
            start_spread_s: max_backoff,
        }
    }

    fn failed(t: &str, v: Option<&str>, round: usize) -> Failed {
        Failed {
            topology: t.into(),
            variant: v.map(Into::into),
            failure: Failure::new(t, round, &std::io::Error::other("QEMU exited")),
        }
    }

    #[test]
    fn every_cell_is_the_median_of_its_rounds_with_min_and_max() {
        let s = [
            sum(5.0, 5.0, 30),
            sum(0.008, 3.0, 20),
            sum(4.0, 6.0, 40),
            sum(0.010, 3.3, 26),
            sum(6.0, 4.0, 35),
            sum(0.007, 2.4, 22),
        ];
        let mut points = Vec::new();
        for r in 0..3 {
            for (j, v) in ["working-set", "line"].into_iter().enumerate() {
                points.push(Point {
                    topology: "ring",
                    round: r,
                    variant: v,
                    summary: &s[2 * r + j],
                });
            }
        }
        let c = cells(&["ring".into()], &["working-set", "line"], 3, &points, &[]);
        assert_eq!(c.len(), 4);
        let line = &c[1];
        assert_eq!(
            (line.topology.as_str(), line.variant.as_str()),
            ("ring", "line")
        );
        assert_eq!((line.runs, line.failed), (3, 0));
        let mb = line.max_backoff_s.expect("measured");
        assert_eq!((mb.median, mb.min, mb.max), (0.008, 0.007, 0.010));
        assert_eq!(line.false_alarms.map(|s| s.median), Some(22.0));
        // Per round against the same round's working set: 0.6, 0.55, 0.6.
        let q = line.disruption_vs_working_set.expect("ratios");
        assert!((q.median - 0.6).abs() < 1e-9 && (q.min - 0.55).abs() < 1e-9);
        // One topology: the `all` row is the same figures.
        assert_eq!(c[3].max_backoff_s, line.max_backoff_s);
        assert_eq!(c[2].disruption_vs_working_set.map(|s| s.median), Some(1.0));
    }

    #[test]
    fn a_failed_round_is_counted_and_left_out_of_every_median() {
        let (ws, line_ok, line_bad) = (sum(5.0, 5.0, 30), sum(0.008, 3.0, 20), sum(9.0, 99.0, 0));
        let pts = vec![
            Point {
                topology: "ring",
                round: 0,
                variant: "working-set",
                summary: &ws,
            },
            Point {
                topology: "ring",
                round: 0,
                variant: "line",
                summary: &line_ok,
            },
            Point {
                topology: "all-to-all",
                round: 0,
                variant: "working-set",
                summary: &ws,
            },
            Point {
                topology: "all-to-all",
                round: 0,
                variant: "line",
                summary: &line_ok,
            },
            Point {
                topology: "ring",
                round: 1,
                variant: "working-set",
                summary: &ws,
            },
            // A run whose figures exist but whose round is recorded as failed must
            // not enter a median.
            Point {
                topology: "ring",
                round: 1,
                variant: "line",
                summary: &line_bad,
            },
        ];
        let failures = vec![
            failed("ring", Some("line"), 1),
            // all-to-all's cluster did not come up in round 2: no variant was tried.
            failed("all-to-all", None, 1),
        ];
        let tops = ["ring".to_string(), "all-to-all".to_string()];
        let c = cells(&tops, &["working-set", "line"], 2, &pts, &failures);
        let find = |t: &str, v: &str| {
            c.iter()
                .find(|c| c.topology == t && c.variant == v)
                .expect("cell")
        };
        let ring_line = find("ring", "line");
        assert_eq!((ring_line.runs, ring_line.failed), (1, 1));
        assert_eq!(ring_line.max_backoff_s.map(|s| s.max), Some(0.008));
        assert_eq!(ring_line.avg_disruption_s.map(|s| s.n), Some(1));
        let ring_ws = find("ring", "working-set");
        assert_eq!((ring_ws.runs, ring_ws.failed), (2, 0));
        let a2a = find("all-to-all", "working-set");
        assert_eq!((a2a.runs, a2a.failed), (1, 1));
        // Round 2 lacks all-to-all: the `all` rows are round 1's alone.
        let all_ws = find("all", "working-set");
        assert_eq!((all_ws.runs, all_ws.failed), (1, 1));
        let all_line = find("all", "line");
        assert_eq!(all_line.avg_disruption_s.map(|s| s.median), Some(3.0));
        assert_eq!(all_line.false_alarms.map(|s| s.median), Some(40.0));
    }

    #[test]
    fn a_cell_no_round_measured_has_no_figures() {
        let failures = vec![failed("ring", None, 0)];
        let c = cells(&["ring".into()], &["line"], 1, &[], &failures);
        assert_eq!((c[0].runs, c[0].failed), (0, 1));
        assert_eq!(c[0].max_backoff_s, None);
        assert_eq!(
            (c[1].topology.as_str(), c[1].runs, c[1].failed),
            ("all", 0, 1)
        );
    }
}
