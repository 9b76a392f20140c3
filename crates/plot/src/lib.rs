//! Figures drawn from reports (SVG, text left to the viewer: no font library):
//! `rebound crash report --plot`, `rebound vm mrc --plot` and the benchmarks draw
//! with them.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
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

/// Where labels of vertical lines go: the top rows of the plot, above the data
/// (the y axis gets [`HEADROOM`] for them).
const LABEL_ROWS: [f64; 3] = [0.97, 0.915, 0.86];
/// The y range's top over the data's largest value: room for the labels' rows.
const HEADROOM: f64 = 1.3;
/// About how wide a character of the 12-pixel labels is, in pixels.
const CHAR_PX: f64 = 6.5;

/// Vertical lines at `marks` (x, label), each label beside its line: to the right
/// of it, or to the left when it would run past the plot's right edge; labels that
/// would overlap the previous one go to the next row down.
fn marks(
    chart: &mut Chart<'_>,
    marks: &[(f64, String)],
    x_max: f64,
    y_max: f64,
) -> Result<(), PlotError> {
    let px_per_x = chart.plotting_area().dim_in_pixel().0 as f64 / x_max;
    // Right end (in x units) of the last label drawn on each row.
    let mut row_end = [f64::NEG_INFINITY; LABEL_ROWS.len()];
    for (x, label) in marks {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(*x, 0.0), (*x, y_max)],
            BLACK.mix(0.3),
        )))?;
        let width = (label.chars().count() as f64 * CHAR_PX + 4.0) / px_per_x;
        let right = x + width > x_max;
        let (start, end) = if right {
            (x - width, *x)
        } else {
            (*x, x + width)
        };
        let row = (0..LABEL_ROWS.len())
            .find(|&r| row_end[r] < start)
            .unwrap_or(LABEL_ROWS.len() - 1);
        row_end[row] = end;
        let pos = Pos::new(if right { HPos::Right } else { HPos::Left }, VPos::Top);
        let style = TextStyle::from(("sans-serif", 12).into_font()).pos(pos);
        let nudge = if right {
            -2.0 / px_per_x
        } else {
            2.0 / px_per_x
        };
        chart.draw_series(std::iter::once(Text::new(
            label.clone(),
            (x + nudge, y_max * LABEL_ROWS[row]),
            style,
        )))?;
    }
    Ok(())
}

/// How a legend entry is drawn.
#[derive(Clone, Copy)]
enum Key {
    Line(RGBColor),
    Dot(RGBColor),
}

/// The legend, in a strip of its own under the plot, so that it covers nothing:
/// entries left to right, wrapping onto a second line when they do not fit.
fn legend(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    entries: &[(String, Key)],
) -> Result<(), PlotError> {
    let (w, _) = area.dim_in_pixel();
    let (mut x, mut y) = (70i32, 12i32);
    for (label, key) in entries {
        let width = 24 + (label.chars().count() as f64 * CHAR_PX) as i32 + 18;
        if x + width > w as i32 && x > 70 {
            (x, y) = (70, y + 20);
        }
        match key {
            Key::Line(c) => area.draw(&PathElement::new(
                vec![(x, y), (x + 18, y)],
                c.stroke_width(2),
            ))?,
            Key::Dot(c) => area.draw(&Circle::new((x + 9, y), 4, c.filled()))?,
        }
        let style =
            TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(label.clone(), (x + 24, y), style))?;
        x += width;
    }
    Ok(())
}

/// The figure's drawing area: the plot above, the legend's strip below.
type Areas<'a> = (
    DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
);

fn areas(out: &Path) -> Result<Areas<'_>, PlotError> {
    let root = SVGBackend::new(out, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root.split_vertically(480))
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
        * HEADROOM;
    let (plot, strip) = areas(out)?;
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
    let y_max = y_max.max(1.0);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
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
    // With a filter, what was written and what was skipped are two lines: skipped
    // pages cost no I/O, so counted with the written ones they make the dumped line
    // jump where the filter leaves much out.
    let filtered = r.timeline.iter().any(|s| s.skipped_bytes.is_some());
    let written: Series = if filtered {
        ("dumped: pages written", GREEN, |s| {
            s.dumped_bytes - s.skipped_bytes.unwrap_or(0).min(s.dumped_bytes)
        })
    } else {
        ("dumped", GREEN, |s| s.dumped_bytes)
    };
    let mut series: Vec<Series> = vec![
        ("crashed VM's memory", RED, |s| s.crashed_bytes),
        ("recovery VM's memory", BLUE, |s| s.recovery_bytes),
        written,
    ];
    if filtered {
        series.push((
            "dumped: pages the filter skipped",
            RGBColor(150, 200, 60),
            |s| s.skipped_bytes.unwrap_or(0),
        ));
    }
    let mut keys = Vec::new();
    for (label, color, f) in series {
        chart.draw_series(LineSeries::new(
            r.timeline.iter().map(|s| (s.t_s, f(s) as f64 / MIB)),
            color.stroke_width(2),
        ))?;
        keys.push((label.to_string(), Key::Line(color)));
    }
    // What the kernel charged to the VM's memory group, where a cgroup held the
    // budget: both QEMUs' real footprint, not the daemon's plan.
    if r.timeline.iter().any(|s| s.charged_bytes.is_some()) {
        let color = RGBColor(120, 60, 160);
        chart.draw_series(LineSeries::new(
            r.timeline
                .iter()
                .filter_map(|s| Some((s.t_s, s.charged_bytes? as f64 / MIB))),
            color.stroke_width(1),
        ))?;
        keys.push(("charged to the VM's memory group".into(), Key::Line(color)));
    }
    let events: Vec<(f64, String)> = r
        .timeline
        .iter()
        .filter_map(|s| Some((s.t_s, s.event.clone()?)))
        .collect();
    marks(&mut chart, &events, t_max, y_max)?;
    legend(&strip, &keys)?;
    plot.present()?;
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
        * HEADROOM;
    let (plot, strip) = areas(out)?;
    let title = format!(
        "{name}: reads that miss guest memory (guest {} MiB, allocation {} MiB)",
        r.guest_bytes >> 20,
        r.allocation_bytes >> 20
    );
    let x0 = r.guest_bytes as f64 / MIB;
    let x_max = x_max.max(x0 + 1.0);
    let mut chart = ChartBuilder::on(&plot)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("guest memory (MiB)")
        .y_desc("misses (4 KiB reads)")
        .draw()?;
    let colors = [BLUE, RED, GREEN, MAGENTA, CYAN];
    let mut keys = Vec::new();
    for (i, d) in drawn.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart.draw_series(LineSeries::new(
            d.points.iter().map(|p| (p.bytes as f64 / MIB, p.misses)),
            color.stroke_width(2),
        ))?;
        keys.push((
            format!("{} ({} misses traced)", d.id, d.misses),
            Key::Line(color),
        ));
    }
    if !measured.is_empty() {
        chart.draw_series(
            measured
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, BLACK.filled())),
        )?;
        keys.push((
            "measured: a guest of that size, all memory its own".into(),
            Key::Dot(BLACK),
        ));
    }
    let lines = [
        (x0, "guest memory X".to_string()),
        (
            r.allocation_bytes as f64 / MIB,
            "allocation X+Y".to_string(),
        ),
    ];
    marks(&mut chart, &lines, x_max, y_max)?;
    legend(&strip, &keys)?;
    plot.present()?;
    Ok(())
}

#[cfg(test)]
mod tests;
