//! The figure of `bench reboot`: throughput per second across the reboot, one line per
//! variant aligned on the reboot request (CacheMind's figure 5), and the reads before
//! and after it (figure 3). With several runs each variant is drawn from its run of
//! median drop (so the line is a run that happened, not a blend), and the legend gives
//! the median with min and max over the runs.

use serde_json::Value;

use super::report::{stat, variant_names};
use super::Variant;

/// Each variant's run of median drop, in the order the variants ran.
fn median_runs(rows: &[Variant]) -> Vec<(&Variant, String)> {
    variant_names(rows)
        .iter()
        .filter_map(|&v| {
            let mut runs: Vec<&Variant> = rows.iter().filter(|r| r.variant == v).collect();
            runs.sort_by(|a, b| a.drop_pct.total_cmp(&b.drop_pct));
            let pick = *runs.get(runs.len().saturating_sub(1) / 2)?;
            let d = stat(runs.iter().map(|r| r.drop_pct))?;
            let b = stat(runs.iter().map(|r| r.drop_vs_best_pct))?;
            let label = if runs.len() > 1 {
                format!(
                    "{v}: drop {:.0}% [{:.0}..{:.0}], vs best {:.0}%, back after {:.1} s (run {} of {})",
                    d.median,
                    d.min,
                    d.max,
                    b.median,
                    pick.reboot_s,
                    pick.run,
                    runs.len()
                )
            } else {
                format!(
                    "{v}: drop {:.0}%, vs best {:.0}%, back after {:.1} s",
                    d.median, b.median, pick.reboot_s
                )
            };
            Some((pick, label))
        })
        .collect()
}

/// The figure could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw the figure to {}", .0.display())]
pub struct DrawError(
    std::path::PathBuf,
    #[source] plotters::drawing::DrawingAreaErrorKind<std::io::Error>,
);

/// Draws the run to the SVG file `out`.
pub fn draw(meta: &Value, rows: &[Variant], out: &std::path::Path) -> Result<(), DrawError> {
    paint(meta, rows, out).map_err(|e| DrawError(out.to_path_buf(), e))
}

fn paint(
    meta: &Value,
    rows: &[Variant],
    out: &std::path::Path,
) -> Result<(), plotters::drawing::DrawingAreaErrorKind<std::io::Error>> {
    use plotters::prelude::*;
    let picked = median_runs(rows);
    let root = SVGBackend::new(out, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(420);
    let colors = [
        RGBColor(200, 60, 60),
        RGBColor(230, 150, 60),
        RGBColor(50, 120, 200),
        RGBColor(60, 160, 90),
        RGBColor(140, 80, 170),
    ];
    let secs = meta["seconds"].as_f64().unwrap_or(30.0);
    let y_max = picked
        .iter()
        .flat_map(|(r, _)| r.series.iter().copied())
        .fold(1.0, f64::max)
        // Headroom above the lines for the legend.
        * 1.5;
    let x_max = picked
        .iter()
        .map(|(r, _)| r.series.len() as f64 - r.reboot_at_s)
        .fold(secs, f64::max);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "Web throughput across a reboot: {} files of {} KiB, {} clients, disk {} MB/s {} IOPS, {} run(s), accel {}, {}",
                meta["files"],
                meta["file_size"].as_u64().unwrap_or(0) >> 10,
                meta["conns"],
                meta["disk_read_mbps"],
                meta["disk_read_iops"],
                meta["runs"].as_u64().unwrap_or(1),
                meta["accel"].as_str().unwrap_or(""),
                meta["date"].as_str().unwrap_or("")
            ),
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(-secs..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("seconds from the reboot request")
        .y_desc("MB/s served")
        .draw()?;
    for (k, (r, label)) in picked.iter().enumerate() {
        let c = colors[k % colors.len()];
        let pts: Vec<(f64, f64)> = r
            .series
            .iter()
            .enumerate()
            .map(|(s, v)| (s as f64 + 0.5 - r.reboot_at_s, *v))
            .filter(|(t, _)| *t >= -secs)
            .collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    // Reads: six bars per variant (before 1-3, after 1-3), seconds.
    let r_max = picked
        .iter()
        .flat_map(|(r, _)| {
            r.reads_before_s
                .iter()
                .chain(r.reads_after_s.iter())
                .copied()
        })
        .fold(0.1, f64::max)
        * 1.15;
    let n = picked.len() as f64;
    let mut bars = ChartBuilder::on(&bottom)
        .caption(
            "Seconds to read the whole set (the runs drawn above): 1st, 2nd, 3rd read before the reboot | after it",
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..n * 7.0, 0f64..r_max)?;
    bars.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("seconds")
        .draw()?;
    for (k, (r, _)) in picked.iter().enumerate() {
        let c = colors[k % colors.len()];
        let x0 = k as f64 * 7.0;
        let vals = r.reads_before_s.iter().chain(r.reads_after_s.iter());
        bars.draw_series(vals.enumerate().map(|(j, v)| {
            let x = x0 + j as f64 + if j >= 3 { 0.4 } else { 0.0 };
            let style = if j >= 3 {
                c.filled()
            } else {
                c.mix(0.45).filled()
            };
            Rectangle::new([(x + 0.1, 0.0), (x + 0.9, *v)], style)
        }))?;
        bars.draw_series(std::iter::once(Text::new(
            r.variant.clone(),
            (x0 + 0.2, r_max * 0.96),
            ("sans-serif", 12),
        )))?;
    }
    root.present()?;
    Ok(())
}
