//! The curve part of `rebound bench hcache`: which guest sizes a pattern's curve is
//! checked at, what it predicts there, how far the count of a guest of that size is
//! from it, and the curve algorithm against a plain simulation of one run's accesses.

use std::path::{Path, PathBuf};

use rebound_api::MrcReport;
use serde::Serialize;

const MIB: u64 = 1 << 20;

/// Guest sizes (MiB) the curve is checked at: from its start `from` (the guest's
/// memory in the traced run) to the allocation in `steps` even steps, and one step
/// beyond it. The start is a size like any other: the curve's first point is where a
/// wrong offset or lost notices show most.
pub(super) fn sizes(from: u64, allocation: u64, steps: u64) -> Vec<u64> {
    let steps = steps.max(1);
    let step = (allocation.saturating_sub(from) / steps).max(1);
    (0..=steps + 1).map(|i| from + i * step).collect()
}

/// Misses a curve predicts for a guest of `bytes` (the last point at or below it).
pub(super) fn predicted(curve: &MrcReport, bytes: u64) -> Option<f64> {
    let d = curve.disks.first()?;
    d.points
        .iter()
        .rfind(|p| p.bytes <= bytes)
        .map(|p| p.misses)
}

/// One pattern at one guest size: the curve's prediction against the count.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Validation {
    pub pattern: String,
    pub guest_mib: u64,
    /// The size is where the curve starts (the traced run's guest memory).
    pub curve_start: bool,
    pub predicted_disk_reads: f64,
    pub measured_disk_reads: u64,
    /// |predicted − measured| / measured (measured floored at one read).
    pub relative_error: f64,
    /// |predicted − measured| / the 4 KiB blocks the requests read: the error in miss
    /// ratio, which stays meaningful where a guest misses almost nothing.
    pub miss_ratio_error: f64,
    pub blocks_read: u64,
}

impl Validation {
    pub fn new(
        pattern: &str,
        guest_mib: u64,
        curve_start: bool,
        predicted: f64,
        measured: u64,
        blocks_read: u64,
    ) -> Validation {
        let diff = (predicted - measured as f64).abs();
        Validation {
            pattern: pattern.into(),
            guest_mib,
            curve_start,
            predicted_disk_reads: predicted,
            measured_disk_reads: measured,
            relative_error: diff / measured.max(1) as f64,
            miss_ratio_error: diff / blocks_read.max(1) as f64,
            blocks_read,
        }
    }
}

/// The worst of each error over the rows, and the row it came from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(super) struct Worst {
    /// Over every pattern and every validated size, the curve's start included.
    pub relative: f64,
    pub relative_at: Option<(String, u64)>,
    pub miss_ratio: f64,
    pub miss_ratio_at: Option<(String, u64)>,
}

pub(super) fn worst(rows: &[Validation]) -> Worst {
    let mut w = Worst {
        relative: 0.0,
        relative_at: None,
        miss_ratio: 0.0,
        miss_ratio_at: None,
    };
    for v in rows {
        let at = Some((v.pattern.clone(), v.guest_mib));
        if v.relative_error >= w.relative {
            (w.relative, w.relative_at) = (v.relative_error, at.clone());
        }
        if v.miss_ratio_error >= w.miss_ratio {
            (w.miss_ratio, w.miss_ratio_at) = (v.miss_ratio_error, at);
        }
    }
    w
}

/// The curve algorithm against a plain simulation of the exclusive cache, on the
/// access log of one run: the mean absolute difference in miss ratio over `sizes`
/// sizes up to `max_blocks`, exact (the tracer's default) and sampled.
#[derive(Debug, Clone, Serialize)]
pub(super) struct MrcCheck {
    pub pattern: String,
    pub events: usize,
    pub misses: u64,
    pub sizes: usize,
    pub max_blocks: u64,
    pub mae_exact: f64,
    pub sampled_rate: f64,
    pub mae_sampled: f64,
}

/// Why a pattern's access log could not be checked against the simulation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the access log {}", .0.display())]
    Read(PathBuf, #[source] std::io::Error),
    #[error("{}:{line}: not t,block,kind", .path.display())]
    Line { path: PathBuf, line: usize },
    #[error("no curve of the {0} pattern's log")]
    Curve(String, #[source] rebound_mrc::curve::CurveError),
    #[error("no sampled tracer for the {0} pattern's log")]
    Sampled(String, #[source] rebound_mrc::shards::ShardsError),
}

/// The sampled tracer's rate in the check (SHARDS' fixed rate).
const CHECK_RATE: f64 = 0.1;

pub(super) fn mrc_check(
    pattern: &str,
    trace: &Path,
    max_blocks: u64,
    sizes: u64,
) -> Result<MrcCheck, Error> {
    use rebound_mrc::{ExclusiveTracer, GuestEvent, MissRatioCurve};
    let text = std::fs::read_to_string(trace).map_err(|e| Error::Read(trace.into(), e))?;
    let mut events = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut f = line.split(',');
        let (_, block, kind) = (f.next(), f.next(), f.next());
        let block: u64 = block
            .and_then(|b| b.parse().ok())
            .ok_or_else(|| Error::Line {
                path: trace.into(),
                line: i + 1,
            })?;
        events.push(match kind {
            Some("h") | Some("m") => GuestEvent::Miss(block),
            Some("e") => GuestEvent::Evict(block),
            _ => GuestEvent::Returned(block),
        });
    }
    let misses = events
        .iter()
        .filter(|e| matches!(e, GuestEvent::Miss(_)))
        .count() as u64;
    let step = (max_blocks / sizes).max(1);
    let grid: Vec<u64> = (0..=sizes).map(|i| i * step).collect();
    let sim: Vec<f64> = grid
        .iter()
        .map(|&s| rebound_mrc::lru_sim::exclusive_misses(&events, s) as f64 / misses.max(1) as f64)
        .collect();
    let curve_error = |e| Error::Curve(pattern.to_string(), e);
    let mae = |mut t: ExclusiveTracer| -> Result<f64, Error> {
        events.iter().for_each(|e| t.record(*e));
        let c = MissRatioCurve::from_histogram(&t.histogram(), max_blocks + step)
            .map_err(curve_error)?;
        let mut sum = 0.0;
        for (s, want) in grid.iter().zip(&sim) {
            sum += (c.miss_ratio(*s).map_err(curve_error)? - want).abs();
        }
        Ok(sum / grid.len() as f64)
    };
    Ok(MrcCheck {
        pattern: pattern.into(),
        events: events.len(),
        misses,
        sizes: grid.len(),
        max_blocks,
        mae_exact: mae(ExclusiveTracer::with_bucket_width(1))?,
        sampled_rate: CHECK_RATE,
        mae_sampled: mae(ExclusiveTracer::sampled(CHECK_RATE, 1)
            .map_err(|e| Error::Sampled(pattern.to_string(), e))?)?,
    })
}

/// The curve's guest size in MiB.
pub(super) fn start_mib(curve: &MrcReport) -> u64 {
    curve.guest_bytes / MIB
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_api::{DiskMrc, MrcPoint};

    #[test]
    fn sizes_start_at_the_curve_are_even_and_reach_a_step_past_the_allocation() {
        // The defaults: 75% of 512 MiB in the host cache, so the curve starts at 128.
        assert_eq!(sizes(128, 512, 3), vec![128, 256, 384, 512, 640]);
        assert_eq!(sizes(128, 512, 1), vec![128, 512, 896]);
        // An uneven span: the steps stay even, the allocation itself may fall between.
        let s = sizes(100, 512, 3);
        assert_eq!(s[0], 100);
        assert!(s.windows(2).all(|w| w[1] - w[0] == 137), "{s:?}");
        assert!(*s.last().unwrap() > 512);
        // Zero steps is taken as one rather than a single size.
        assert_eq!(sizes(128, 512, 0), sizes(128, 512, 1));
    }

    #[test]
    fn a_size_takes_the_last_point_at_or_below_it() {
        let point = |mib: u64, misses: f64| MrcPoint {
            bytes: mib * MIB,
            misses,
            vs_allocation: None,
        };
        let curve = MrcReport {
            guest_bytes: 96 * MIB,
            allocation_bytes: 192 * MIB,
            disks: vec![DiskMrc {
                id: "disk1".into(),
                host_cache_bytes: 96 * MIB,
                rate: 1.0,
                misses: 10,
                evicted_blocks: 0,
                inconsistent_blocks: 0,
                points: vec![point(96, 10.0), point(100, 7.0), point(768, 7.0)],
                detail: None,
            }],
        };
        assert_eq!(predicted(&curve, 96 * MIB), Some(10.0));
        assert_eq!(predicted(&curve, 99 * MIB), Some(10.0));
        assert_eq!(predicted(&curve, 300 * MIB), Some(7.0));
        assert_eq!(predicted(&curve, 64 * MIB), None);
        assert_eq!(start_mib(&curve), 96);
    }

    #[test]
    fn errors_are_relative_to_the_count_and_to_the_blocks_read() {
        let v = Validation::new("zipf", 128, true, 1100.0, 1000, 100_000);
        assert!((v.relative_error - 0.1).abs() < 1e-12);
        assert!((v.miss_ratio_error - 0.001).abs() < 1e-12);
        // Near zero misses the relative error explodes; the miss-ratio error does not.
        let v = Validation::new("class", 640, false, 3.0, 0, 384_000);
        assert_eq!(v.relative_error, 3.0);
        assert!(v.miss_ratio_error < 1e-5);
        // Too few predicted is as wrong as too many.
        let v = Validation::new("seq", 256, false, 900.0, 1000, 100_000);
        assert!((v.relative_error - 0.1).abs() < 1e-12);
    }

    #[test]
    fn the_worst_error_names_its_pattern_and_size_over_every_row() {
        let rows = [
            Validation::new("seq", 128, true, 1000.0, 1000, 1_000),
            Validation::new("zipf", 128, true, 1200.0, 1000, 100_000),
            Validation::new("web", 640, false, 2.0, 1, 10),
        ];
        let w = worst(&rows);
        assert_eq!(w.relative, 1.0);
        assert_eq!(w.relative_at, Some(("web".into(), 640)));
        assert!((w.miss_ratio - 0.1).abs() < 1e-12);
        assert_eq!(w.miss_ratio_at, Some(("web".into(), 640)));
        let w = worst(&rows[..2]);
        assert_eq!(w.relative_at, Some(("zipf".into(), 128)));
        assert!((w.relative - 0.2).abs() < 1e-12);
        assert_eq!(worst(&[]).relative_at, None);
    }
}
