//! `rebound bench hcache --svg`: one panel per pattern (its curve, the validation
//! guests' counts over it) and one for the allocation (each VM's change in disk reads,
//! predicted and measured, against the bound).

use std::fmt::Write;

use serde_json::Value;

use super::validate::predicted;
use super::Results;

const MIB: f64 = (1u64 << 20) as f64;
const PANEL: (f64, f64) = (420.0, 250.0);
const COLUMNS: usize = 3;
/// Plot area inside a panel: left, top, right and bottom margins.
const MARGIN: (f64, f64, f64, f64) = (60.0, 30.0, 15.0, 40.0);

/// An axis value with the digits its size needs.
fn num(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// Maps data to pixels inside a panel at (`x0`, `y0`).
struct Frame {
    x0: f64,
    y0: f64,
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, v: f64) -> f64 {
        self.x0 + MARGIN.0 + v / self.x_max * (PANEL.0 - MARGIN.0 - MARGIN.2)
    }
    fn y(&self, v: f64) -> f64 {
        self.y0 + PANEL.1 - MARGIN.3 - v / self.y_max * (PANEL.1 - MARGIN.1 - MARGIN.3)
    }
    /// Axes with their largest values (x only with a label), and the panel's title.
    fn axes(&self, s: &mut String, title: &str, x_label: Option<&str>, y_label: &str) {
        let (l, r) = (self.x(0.0), self.x(self.x_max));
        let (b, t) = (self.y(0.0), self.y(self.y_max));
        let _ = write!(
            s,
            r##"<text x="{:.0}" y="{:.0}" font-size="13">{title}</text>
<path d="M{l:.1},{t:.1} V{b:.1} H{r:.1}" stroke="#444" fill="none"/>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><text x="{:.1}" y="{:.1}" text-anchor="end">0</text>
<text x="{r:.1}" y="{:.1}" text-anchor="end">{}</text><text x="{:.1}" y="{:.1}" fill="#555">{y_label}</text>
"##,
            self.x0 + 10.0,
            self.y0 + 18.0,
            l - 4.0,
            t + 4.0,
            num(self.y_max),
            l - 4.0,
            b + 4.0,
            b + 16.0,
            x_label.map_or(String::new(), |x| format!("{} {x}", num(self.x_max))),
            l + 4.0,
            t + 12.0,
        );
    }
}

fn pattern_panel(s: &mut String, f: &Frame, pattern: &str, res: &Results) {
    let Some((setting, curve)) = res.curves.get(pattern) else {
        return;
    };
    let rows: Vec<_> = res
        .validation
        .iter()
        .filter(|v| v.pattern == pattern)
        .collect();
    let worst = rows.iter().map(|v| v.relative_error).fold(0.0, f64::max);
    f.axes(
        s,
        &format!(
            "{pattern}: curve at {setting}% host cache; worst error {:.1}%",
            worst * 100.0
        ),
        Some("MiB guest"),
        "disk reads",
    );
    if let Some(d) = curve.disks.first() {
        // The points inside the panel, and the curve's value at its right edge (the
        // last point reaches far past the sizes: more memory saves nothing there).
        let edge = d
            .points
            .iter()
            .any(|p| p.bytes as f64 / MIB > f.x_max)
            .then(|| predicted(curve, (f.x_max * MIB) as u64).map(|m| (f.x_max, m)))
            .flatten();
        let pts: Vec<String> = d
            .points
            .iter()
            .map(|p| (p.bytes as f64 / MIB, p.misses))
            .filter(|(x, _)| *x <= f.x_max)
            .chain(edge)
            .map(|(x, y)| format!("{:.1},{:.1}", f.x(x), f.y(y)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline points="{}" stroke="#48c" stroke-width="2" fill="none"/>"##,
            pts.join(" ")
        );
    }
    for v in rows {
        let _ = writeln!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="#000"/>"##,
            f.x(v.guest_mib as f64),
            f.y(v.measured_disk_reads as f64)
        );
    }
}

fn alloc_panel(s: &mut String, f: &Frame, res: &Results) {
    let Some(a) = &res.alloc else { return };
    f.axes(
        s,
        &format!(
            "allocation, bound {}: {} of {} VMs over it, {} beyond the noise",
            a.bound,
            a.bound_violations,
            a.vms.len(),
            a.bound_violations_beyond_noise
        ),
        None,
        "reads after / before",
    );
    // One row across the top, above the bars (they reach 1/1.3 of the height).
    let keys = [
        (0.0, "plan", "#8bd"),
        (50.0, "baseline rounds", "#48c"),
        (160.0, "measured", "#333"),
    ];
    for (dx, label, color) in keys {
        let (x, y) = (f.x0 + MARGIN.0 + 120.0 + dx, f.y0 + MARGIN.1 + 3.0);
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{y:.1}" width="10" height="9" fill="{color}"/><text x="{:.1}" y="{:.1}">{label}</text>"##,
            x + 14.0,
            y + 8.5
        );
    }
    let bound = f.y(1.0 + a.bound);
    let _ = writeln!(
        s,
        r##"<path d="M{:.1},{bound:.1} H{:.1}" stroke="#c44" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#c44">bound</text><path d="M{:.1},{:.1} H{:.1}" stroke="#999"/>"##,
        f.x(0.0),
        f.x(f.x_max),
        f.x(f.x_max),
        bound - 3.0,
        f.x(0.0),
        f.y(1.0),
        f.x(f.x_max),
    );
    // Per VM: the plan's prediction, the baseline rounds' and the measured change.
    for (i, v) in a.vms.iter().enumerate() {
        let bars = [
            (v.predicted_relative, "#8bd"),
            (v.window_predicted_relative.unwrap_or(0.0), "#48c"),
            (v.measured_relative, "#333"),
        ];
        for (j, (val, color)) in bars.iter().enumerate() {
            let x = f.x(i as f64 + 0.15 + j as f64 * 0.23);
            let w = f.x(0.2) - f.x(0.0);
            let top = f.y(val.min(f.y_max));
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{top:.1}" width="{w:.1}" height="{:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{val:.2}</text>"##,
                f.y(0.0) - top,
                x + w / 2.0,
                top - 3.0
            );
        }
        // The measured change's noise (two standard errors) as a whisker on its bar.
        let x = f.x(i as f64 + 0.15 + 2.0 * 0.23 + 0.1);
        let lo = f.y((v.measured_relative - v.noise).max(0.0));
        let hi = f.y((v.measured_relative + v.noise).min(f.y_max));
        let _ = writeln!(
            s,
            r##"<path d="M{x:.1},{lo:.1} V{hi:.1} M{:.1},{lo:.1} H{:.1} M{:.1},{hi:.1} H{:.1}" stroke="#c80" stroke-width="1.5"/>"##,
            x - 4.0,
            x + 4.0,
            x - 4.0,
            x + 4.0
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} {} {}→{} MiB</text>"##,
            f.x(i as f64 + 0.5),
            f.y(0.0) + 28.0,
            v.role,
            v.pattern,
            v.baseline_mib,
            v.applied_mib.unwrap_or(v.baseline_mib)
        );
    }
}

pub(super) fn draw(meta: &Value, res: &Results) -> String {
    let patterns: Vec<&String> = res.curves.keys().collect();
    let panels = patterns.len() + usize::from(res.alloc.is_some());
    let rows = panels.div_ceil(COLUMNS).max(1);
    let (w, h) = (PANEL.0 * COLUMNS as f64, PANEL.1 * rows as f64 + 60.0);
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">
<text x="10" y="18" font-size="14">rebound bench hcache: allocation {} MiB, accel {}, {}</text>
<text x="10" y="36" fill="#555">line: the curve traced with the largest host cache (predicted disk reads); dots: a guest of that size, all memory its own; bars: plan, baseline rounds, measured</text>
"##,
        meta["allocation_mib"],
        meta["accel"].as_str().unwrap_or(""),
        meta["date"].as_str().unwrap_or("")
    );
    let origin = |i: usize| {
        (
            PANEL.0 * (i % COLUMNS) as f64,
            50.0 + PANEL.1 * (i / COLUMNS) as f64,
        )
    };
    for (i, p) in patterns.iter().enumerate() {
        let (x0, y0) = origin(i);
        let rows = res.validation.iter().filter(|v| &&v.pattern == p);
        let x_max = rows
            .clone()
            .map(|v| v.guest_mib as f64)
            .fold(meta["allocation_mib"].as_f64().unwrap_or(1.0), f64::max)
            * 1.1;
        let curve_max = res.curves[*p]
            .1
            .disks
            .first()
            .and_then(|d| d.points.first())
            .map_or(0.0, |p| p.misses);
        let y_max = rows
            .map(|v| v.measured_disk_reads as f64)
            .fold(curve_max, f64::max)
            .max(1.0)
            * 1.1;
        let f = Frame {
            x0,
            y0,
            x_max,
            y_max,
        };
        pattern_panel(&mut s, &f, p, res);
    }
    if let Some(a) = &res.alloc {
        let (x0, y0) = origin(patterns.len());
        let y_max = a
            .vms
            .iter()
            .flat_map(|v| {
                [
                    v.predicted_relative,
                    v.measured_relative,
                    v.window_predicted_relative.unwrap_or(0.0),
                ]
            })
            .fold(1.0 + a.bound, f64::max)
            * 1.3;
        let f = Frame {
            x0,
            y0,
            x_max: a.vms.len().max(1) as f64,
            y_max,
        };
        alloc_panel(&mut s, &f, res);
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hcache::validate::Validation;
    use rebound_api::{DiskMrc, MrcPoint, MrcReport};
    use std::collections::BTreeMap;

    fn curve() -> MrcReport {
        MrcReport {
            guest_bytes: 128 << 20,
            allocation_bytes: 512 << 20,
            disks: vec![DiskMrc {
                id: "disk0".into(),
                host_cache_bytes: 384 << 20,
                rate: 1.0,
                misses: 1000,
                evicted_blocks: 0,
                inconsistent_blocks: 0,
                points: [(128, 1000.0), (512, 400.0), (2048, 100.0)]
                    .iter()
                    .map(|&(m, misses)| MrcPoint {
                        bytes: m << 20,
                        misses,
                        vs_allocation: None,
                    })
                    .collect(),
                detail: None,
            }],
        }
    }

    #[test]
    fn every_pattern_gets_a_panel_with_its_counts_and_points_past_the_sizes_are_cut() {
        let res = Results {
            runs: Vec::new(),
            curves: BTreeMap::from([
                ("seq".to_string(), (75.0, curve())),
                ("zipf".to_string(), (75.0, curve())),
            ]),
            validation: vec![
                Validation::new("seq", 128, true, 1000.0, 1100, 10_000),
                Validation::new("seq", 640, false, 300.0, 300, 10_000),
                Validation::new("zipf", 128, true, 1000.0, 1000, 10_000),
            ],
            checks: Vec::new(),
            alloc: None,
        };
        let svg = draw(&serde_json::json!({"allocation_mib": 512}), &res);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("seq: curve at 75% host cache; worst error 9.1%"));
        assert!(svg.contains("zipf: curve at 75% host cache; worst error 0.0%"));
        assert_eq!(svg.matches("<circle").count(), 3);
        // The curve's plateau at 2048 MiB lies beyond the panel (640 x 1.1): the line
        // ends at the panel's edge, at the curve's value there.
        assert_eq!(svg.matches("<polyline").count(), 2);
        let line = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        assert_eq!(line.matches(',').count(), 3, "{line}");
        assert_eq!(num(1.2345), "1.23");
        assert_eq!(num(56076.4), "56076");
    }
}
