//! Figures drawn from reports (SVG, text left to the viewer: no font library):
//! `rebound crash report --plot`, `rebound vm mrc --plot` and the benchmarks draw
//! with them.

use std::path::Path;

use plotters::prelude::*;
use rebound_api::CrashReport;

/// Why a figure was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("crash {0} has no memory timeline to plot")]
    NoTimeline(String),
    #[error("{0} has no curve to plot yet: no read has missed the guest")]
    NoCurve(String),
    /// Writing the SVG failed; plotters' message says where.
    #[error(transparent)]
    Draw(#[from] DrawingAreaErrorKind<std::io::Error>),
    /// The report's crash policy has no name.
    #[error(transparent)]
    Policy(#[from] serde_json::Error),
}

const MIB: f64 = (1u64 << 20) as f64;

type Chart<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// A labelled vertical line at `x`.
fn mark(chart: &mut Chart<'_>, x: f64, y_max: f64, label: String) -> Result<(), PlotError> {
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(x, 0.0), (x, y_max)],
        BLACK.mix(0.3),
    )))?;
    chart.draw_series(std::iter::once(Text::new(
        label,
        (x, y_max * 0.97),
        ("sans-serif", 12),
    )))?;
    Ok(())
}

/// Both VMs' memory and the dump's progress over time, events marked (as Vicover's
/// figures of memory during recovery).
pub fn crash_timeline(r: &CrashReport, out: &Path) -> Result<(), PlotError> {
    if r.timeline.is_empty() {
        return Err(PlotError::NoTimeline(r.id.clone()));
    }
    let t_max = r.timeline.iter().map(|s| s.t_s).fold(0.1, f64::max) * 1.05;
    let y_max = r
        .timeline
        .iter()
        .flat_map(|s| {
            [
                s.crashed_bytes,
                s.recovery_bytes,
                s.dumped_bytes,
                s.charged_bytes.unwrap_or(0),
            ]
        })
        .max()
        .unwrap_or(1) as f64
        / MIB
        * 1.1;
    let root = SVGBackend::new(out, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{} crash {} ({}): downtime {}",
        r.vm,
        r.id,
        serde_json::to_value(r.policy.on_crash)?
            .as_str()
            .unwrap_or("?"),
        r.downtime_s
            .map(|d| format!("{d:.2} s"))
            .unwrap_or_else(|| "-".into())
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the crash")
        .y_desc("MiB")
        .draw()?;
    type Series = (
        &'static str,
        RGBColor,
        fn(&rebound_api::MemorySample) -> u64,
    );
    let series: [Series; 3] = [
        ("crashed VM's memory", RED, |s| s.crashed_bytes),
        ("recovery VM's memory", BLUE, |s| s.recovery_bytes),
        ("dumped", GREEN, |s| s.dumped_bytes),
    ];
    for (label, color, f) in series {
        chart
            .draw_series(LineSeries::new(
                r.timeline.iter().map(|s| (s.t_s, f(s) as f64 / MIB)),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    // What the kernel charged to the VM's memory group, where a cgroup held the
    // budget: both QEMUs' real footprint, not the daemon's plan.
    if r.timeline.iter().any(|s| s.charged_bytes.is_some()) {
        let color = RGBColor(120, 60, 160);
        chart
            .draw_series(LineSeries::new(
                r.timeline
                    .iter()
                    .filter_map(|s| Some((s.t_s, s.charged_bytes? as f64 / MIB))),
                color.stroke_width(1),
            ))?
            .label("charged to the VM's memory group")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    for s in r.timeline.iter().filter(|s| s.event.is_some()) {
        mark(
            &mut chart,
            s.t_s,
            y_max,
            s.event.clone().unwrap_or_default(),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::MiddleRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Each disk's miss-ratio curve: misses against guest memory, with the guest's
/// memory X and its allocation X + Y marked (as the paper's figure 11).
/// The curve; `measured`, (guest MiB, misses) counted with guests of those sizes, is
/// drawn over it as points (the curve's validation).
pub fn mrc(
    name: &str,
    r: &rebound_api::MrcReport,
    measured: &[(f64, f64)],
    out: &Path,
) -> Result<(), PlotError> {
    let drawn: Vec<_> = r.disks.iter().filter(|d| !d.points.is_empty()).collect();
    if drawn.is_empty() {
        return Err(PlotError::NoCurve(name.to_string()));
    }
    let x_max = drawn
        .iter()
        .flat_map(|d| d.points.iter().map(|p| p.bytes as f64 / MIB))
        .chain(measured.iter().map(|m| m.0))
        .fold(1.0, f64::max);
    let y_max = drawn
        .iter()
        .flat_map(|d| d.points.iter().map(|p| p.misses))
        .chain(measured.iter().map(|m| m.1))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(out, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!(
        "{name}: reads that miss guest memory (guest {} MiB, allocation {} MiB)",
        r.guest_bytes >> 20,
        r.allocation_bytes >> 20
    );
    let x0 = r.guest_bytes as f64 / MIB;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max.max(x0 + 1.0), 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("guest memory (MiB)")
        .y_desc("misses (4 KiB reads)")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN];
    for (i, d) in drawn.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                d.points.iter().map(|p| (p.bytes as f64 / MIB, p.misses)),
                color.stroke_width(2),
            ))?
            .label(format!("{} ({} misses traced)", d.id, d.misses))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    if !measured.is_empty() {
        chart
            .draw_series(
                measured
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, BLACK.filled())),
            )?
            .label("measured: a guest of that size, all memory its own")
            .legend(|(x, y)| Circle::new((x + 8, y), 4, BLACK.filled()));
    }
    for (x, label) in [
        (x0, "guest memory X"),
        (r.allocation_bytes as f64 / MIB, "allocation X+Y"),
    ] {
        mark(&mut chart, x, y_max, label.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
