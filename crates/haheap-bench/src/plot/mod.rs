//! SVG figures of the benchmarks' JSON results: the microbenchmark's time per transaction
//! against pages per transaction (one panel per writes-per-page, with and without the
//! backup) and its speedup over mprotect; the data-structure suite's time per transaction
//! by structure. plotters' SVG backend writes text as `<text>` elements, so no font
//! library is needed at build or run time.
//!
//! The input is a document written by `micro`/`ds` with `--json` or `--json-out`, but
//! possibly edited, truncated or from another version: it is read with a size cap and
//! every value a figure depends on is checked before anything is drawn.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

/// Largest JSON document accepted (the full micro grid with 5 repeats is ~100 KiB).
const MAX_JSON: u64 = 16 << 20;
/// Most cells accepted: far above any grid the benchmarks run.
const MAX_CELLS: usize = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is larger than {MAX_JSON} bytes: not a benchmark result")]
    TooLarge(String),
    #[error("{path} is not a rebound-ha-bench result: {why}")]
    Invalid { path: String, why: String },
    #[error("cannot draw {path}: {why}")]
    Draw { path: String, why: String },
}

#[derive(Deserialize)]
struct Doc<T> {
    command: String,
    machine: MachineInfo,
    results: Vec<T>,
}

#[derive(Deserialize)]
struct MachineInfo {
    kernel: String,
    cpus: u32,
    #[serde(default)]
    profile: String,
}

#[derive(Deserialize)]
struct MicroPoint {
    engine: String,
    backup: bool,
    ppt: u32,
    wpp: u32,
    us_per_tx: f64,
    speedup_vs_mprotect: f64,
    /// Where tend's time went (older documents may lack it).
    #[serde(default)]
    collect_us: Option<f64>,
    #[serde(default)]
    diff_us: Option<f64>,
    #[serde(default)]
    ship_us: Option<f64>,
}

impl MicroPoint {
    /// The transaction's time in parts: the stores with their write faults (the rest),
    /// the engine's collection, the diff, shipping and the ack.
    fn parts(&self) -> Option<[f64; 4]> {
        let (c, d, s) = (self.collect_us?, self.diff_us?, self.ship_us?);
        Some([(self.us_per_tx - c - d - s).max(0.0), c, d, s])
    }
}

#[derive(Deserialize)]
struct DsPoint {
    engine: String,
    backup: bool,
    structure: String,
    op: String,
    opt: u32,
    us_per_tx: f64,
}

/// Draws the figure of the result document at `json` into `svg`.
pub fn from_file(json: &Path, svg: &Path) -> Result<(), PlotError> {
    let name = json.display().to_string();
    let read = |source| PlotError::Read {
        path: name.clone(),
        source,
    };
    let f = std::fs::File::open(json).map_err(read)?;
    let mut text = Vec::new();
    f.take(MAX_JSON + 1).read_to_end(&mut text).map_err(read)?;
    if text.len() as u64 > MAX_JSON {
        return Err(PlotError::TooLarge(name));
    }
    let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| invalid(&name, e))?;
    from_value(&name, value, svg)
}

/// Draws the figure of a result document already in memory (`name` names it in errors).
pub fn from_value(name: &str, value: serde_json::Value, svg: &Path) -> Result<(), PlotError> {
    let command = value.get("command").and_then(|c| c.as_str()).unwrap_or("");
    if command.starts_with("micro:") {
        let doc: Doc<MicroPoint> = serde_json::from_value(value).map_err(|e| invalid(name, e))?;
        check_micro(&doc).map_err(|why| invalid(name, why))?;
        // One transaction size: where its time goes says more than a line of one point.
        let sizes: BTreeSet<u32> = doc.results.iter().map(|p| p.ppt).collect();
        if sizes.len() == 1 && doc.results.iter().all(|p| p.parts().is_some()) {
            draw(svg, |root| breakdown_figure(root, &doc))
        } else {
            draw(svg, |root| micro_figure(root, &doc))
        }
    } else if command.starts_with("ds:") {
        let doc: Doc<DsPoint> = serde_json::from_value(value).map_err(|e| invalid(name, e))?;
        check_ds(&doc).map_err(|why| invalid(name, why))?;
        draw(svg, |root| ds_figure(root, &doc))
    } else {
        Err(invalid(
            name,
            "its `command` is neither a micro nor a ds run (ds-writes and faults have no figure)",
        ))
    }
}

fn invalid(path: &str, why: impl std::fmt::Display) -> PlotError {
    PlotError::Invalid {
        path: path.to_string(),
        why: why.to_string(),
    }
}

/// Checks shared by both kinds: a bounded, non-empty set of named cells.
fn check_common<T>(doc: &Doc<T>, engine: impl Fn(&T) -> &str) -> Result<(), String> {
    if doc.results.is_empty() {
        return Err("it has no results".into());
    }
    if doc.results.len() > MAX_CELLS {
        return Err(format!(
            "{} results, more than {MAX_CELLS}",
            doc.results.len()
        ));
    }
    if doc.machine.kernel.len() > 200 || doc.command.len() > 500 {
        return Err("its machine or command line is implausibly long".into());
    }
    if let Some(e) = doc
        .results
        .iter()
        .map(&engine)
        .find(|e| e.is_empty() || e.len() > 32)
    {
        return Err(format!(
            "engine name {e:?} is empty or longer than 32 bytes"
        ));
    }
    Ok(())
}

/// A time that can go on a log axis.
fn check_time(t: f64, at: impl Fn() -> String) -> Result<(), String> {
    if t.is_finite() && t > 0.0 && t < 1e9 {
        Ok(())
    } else {
        Err(format!("{}: us_per_tx {t} is not a positive time", at()))
    }
}

fn check_micro(doc: &Doc<MicroPoint>) -> Result<(), String> {
    check_common(doc, |p| &p.engine)?;
    for p in &doc.results {
        let at = || format!("{} at {} pages x {} writes", p.engine, p.ppt, p.wpp);
        if !(1..=1 << 20).contains(&p.ppt) || !(1..=1 << 20).contains(&p.wpp) {
            return Err(format!("{}: pages or writes per page out of range", at()));
        }
        check_time(p.us_per_tx, at)?;
        let parts = [p.collect_us, p.diff_us, p.ship_us];
        if parts.iter().flatten().any(|t| !t.is_finite() || *t < 0.0) {
            return Err(format!("{}: a part of the time is negative", at()));
        }
        // The parts are timed inside the total; rounding aside they cannot exceed it.
        if parts.iter().flatten().sum::<f64>() > p.us_per_tx * 1.01 + 0.01 {
            return Err(format!("{}: its parts add up to more than its time", at()));
        }
        if !p.speedup_vs_mprotect.is_finite() || p.speedup_vs_mprotect < 0.0 {
            return Err(format!(
                "{}: speedup {} is not a ratio",
                at(),
                p.speedup_vs_mprotect
            ));
        }
    }
    Ok(())
}

fn check_ds(doc: &Doc<DsPoint>) -> Result<(), String> {
    check_common(doc, |p| &p.engine)?;
    for p in &doc.results {
        let at = || format!("{} {} {}", p.engine, p.structure, p.op);
        if p.structure.is_empty() || p.structure.len() > 32 || p.op.len() > 32 {
            return Err(format!("{}: structure or op name empty or too long", at()));
        }
        if !(1..=1 << 20).contains(&p.opt) {
            return Err(format!("{}: ops per transaction out of range", at()));
        }
        check_time(p.us_per_tx, at)?;
    }
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `f` on a white SVG canvas and writes it; a failed figure leaves no file behind.
fn draw(svg: &Path, f: impl FnOnce(&Area) -> DrawResult) -> Result<(), PlotError> {
    let fail = |why: String| PlotError::Draw {
        path: svg.display().to_string(),
        why,
    };
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (1260, 1040)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
        f(&root).map_err(|e| fail(e.to_string()))?;
        root.present().map_err(|e| fail(e.to_string()))?;
    }
    std::fs::write(svg, text).map_err(|e| fail(e.to_string()))
}

/// The engines' colours (the rest grey), fixed so figures compare at a glance.
fn colour(engine: &str) -> RGBColor {
    match engine {
        "mprotect" => RGBColor(40, 40, 40),
        "uffd" => RGBColor(230, 120, 0),
        "scan" => RGBColor(31, 119, 180),
        "log" => RGBColor(44, 160, 44),
        _ => RGBColor(150, 150, 150),
    }
}

/// The distinct names in the order the document lists them (so mprotect, the baseline,
/// comes first among engines).
fn in_order<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = Vec::new();
    for n in names {
        if !seen.contains(&n) {
            seen.push(n);
        }
    }
    seen
}

fn subtitle(machine: &MachineInfo) -> String {
    format!(
        "kernel {}, {} CPUs, {} build; a host process: no VM, no accelerator",
        machine.kernel,
        machine.cpus,
        if machine.profile.is_empty() {
            "unknown"
        } else {
            &machine.profile
        }
    )
}

/// A titled panel with room for `y_labels` pixels of y-axis labels.
fn titled_panel<'a, 'b>(
    area: &'a Area<'b>,
    title: String,
    y_labels: u32,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(y_labels);
    b
}

/// Lower and upper bounds of a log axis around `values`.
fn log_bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
    (lo / 1.5, hi * 1.5)
}

/// Titles the figure with the benchmark's command line and `sub`; returns the area below.
fn headed<'a>(
    root: &Area<'a>,
    command: &str,
    sub: &str,
) -> Result<Area<'a>, Box<dyn std::error::Error>> {
    let root = root.titled(&format!("rebound-ha-bench {command}"), ("sans-serif", 18))?;
    let (head, body) = root.split_vertically(24);
    let grey = ("sans-serif", 14).into_font().color(&BLACK.mix(0.7));
    head.draw_text(sub, &grey, (10, 2))?;
    Ok(body)
}

fn micro_figure(root: &Area, doc: &Doc<MicroPoint>) -> DrawResult {
    let body = headed(root, &doc.command, &subtitle(&doc.machine))?;
    let wpps: BTreeSet<u32> = doc.results.iter().map(|p| p.wpp).collect();
    let backups: BTreeSet<bool> = doc.results.iter().map(|p| p.backup).collect();
    let ratio_row = backups.contains(&true) && doc.results.iter().any(|p| p.engine == "mprotect");
    let rows = backups.len() + usize::from(ratio_row);
    let panels = body.split_evenly((rows, wpps.len()));
    let names = in_order(doc.results.iter().map(|p| p.engine.as_str()));
    let ppts: BTreeSet<u32> = doc.results.iter().map(|p| p.ppt).collect();
    let x_max = f64::from(*ppts.last().expect("checked non-empty"))
        .log2()
        .max(1.0);
    let x_labels = x_max.ceil() as usize + 1;
    let (lo, hi) = log_bounds(doc.results.iter().map(|p| p.us_per_tx));
    let mut panel = panels.iter();
    for (row, &backup) in backups.iter().enumerate() {
        for &wpp in &wpps {
            let area = panel.next().expect("one panel per cell");
            let title = format!(
                "{wpp} writes/page, {}: µs per transaction",
                if backup {
                    "with the backup"
                } else {
                    "no backup"
                }
            );
            let mut chart = titled_panel(area, title, 52)
                .build_cartesian_2d(-0.2..x_max + 0.2, (lo..hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("pages per transaction")
                .x_labels(x_labels)
                .x_label_formatter(&whole_powers_of_two)
                .y_label_formatter(&|v| format!("{v}"))
                .draw()?;
            // One legend, in the first panel.
            let legend = row == 0 && Some(&wpp) == wpps.first();
            for &e in &names {
                let pts: Vec<(f64, f64)> = points(&doc.results, e, backup, wpp, |p| p.us_per_tx);
                series(&mut chart, e, pts, legend)?;
            }
            if legend {
                legend_box(&mut chart, SeriesLabelPosition::UpperLeft)?;
            }
        }
    }
    if ratio_row {
        let hi = doc
            .results
            .iter()
            .filter(|p| p.backup)
            .map(|p| p.speedup_vs_mprotect)
            .fold(5.0f64, f64::max)
            * 1.1;
        for &wpp in &wpps {
            let area = panel.next().expect("one panel per cell");
            let title = format!("{wpp} writes/page, with the backup: x mprotect");
            let mut chart =
                titled_panel(area, title, 52).build_cartesian_2d(-0.2..x_max + 0.2, 0.0..hi)?;
            chart
                .configure_mesh()
                .x_desc("pages per transaction")
                .x_labels(x_labels)
                .x_label_formatter(&whole_powers_of_two)
                .draw()?;
            let legend = Some(&wpp) == wpps.first();
            let goal = RGBColor(200, 30, 30);
            let mark = chart.draw_series(LineSeries::new(
                [(x_max - 0.3, 5.0), (x_max + 0.2, 5.0)],
                goal.stroke_width(2),
            ))?;
            if legend {
                mark.label("the issue's goal: 5x at 32 pages")
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], goal.stroke_width(2))
                    });
            }
            for &e in names.iter().filter(|&&e| e != "mprotect") {
                let pts = points(&doc.results, e, true, wpp, |p| p.speedup_vs_mprotect);
                series(&mut chart, e, pts, legend)?;
            }
            if legend {
                legend_box(&mut chart, SeriesLabelPosition::UpperLeft)?;
            }
        }
    }
    Ok(())
}

fn legend_box<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    at: SeriesLabelPosition,
) -> DrawResult
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .configure_series_labels()
        .position(at)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

/// x-axis labels: pages per transaction at whole powers of two, nothing between.
fn whole_powers_of_two(v: &f64) -> String {
    at_whole(*v).map_or(String::new(), |i| format!("{}", 1u64 << i))
}

/// The index an axis position stands for, when it falls on a whole, non-negative value:
/// labels go there and nowhere between.
fn at_whole(v: f64) -> Option<usize> {
    let i = v.round();
    ((v - i).abs() < 0.01 && i >= 0.0).then_some(i as usize)
}

/// Stacked bars of where each engine's transaction time goes, one panel per
/// writes-per-page (and backup setting), for a document of one transaction size.
fn breakdown_figure(root: &Area, doc: &Doc<MicroPoint>) -> DrawResult {
    let ppt = doc.results[0].ppt;
    let sub = format!(
        "{ppt} pages per transaction: where the time goes (µs); {}",
        subtitle(&doc.machine)
    );
    let body = headed(root, &doc.command, &sub)?;
    let wpps: BTreeSet<u32> = doc.results.iter().map(|p| p.wpp).collect();
    let backups: BTreeSet<bool> = doc.results.iter().map(|p| p.backup).collect();
    let names = in_order(doc.results.iter().map(|p| p.engine.as_str()));
    let panels = body.split_evenly((wpps.len(), backups.len()));
    let hi = doc.results.iter().map(|p| p.us_per_tx).fold(0.0, f64::max) * 1.3;
    let n = names.len() as f64;
    let parts: [(&str, RGBColor); 4] = [
        ("the stores and their write faults", RGBColor(170, 170, 170)),
        ("collect the written pages", RGBColor(230, 120, 0)),
        ("diff and shadow update", RGBColor(148, 103, 189)),
        ("ship and wait for the ack", RGBColor(23, 190, 207)),
    ];
    let mut area = panels.iter();
    for (row, &wpp) in wpps.iter().enumerate() {
        for (col, &backup) in backups.iter().enumerate() {
            let legend = row == 0 && col == 0;
            let title = format!(
                "{wpp} writes/page, {}",
                if backup {
                    "with the backup"
                } else {
                    "no backup"
                }
            );
            let mut chart = titled_panel(area.next().expect("one panel per cell"), title, 80)
                .build_cartesian_2d(0.0..hi, -0.5..n - 0.5)?;
            chart
                .configure_mesh()
                .y_labels(names.len())
                .y_label_formatter(&|v| {
                    // The first engine on top.
                    at_whole(*v)
                        .and_then(|i| names.len().checked_sub(i + 1))
                        .and_then(|i| names.get(i))
                        .map_or(String::new(), |e| e.to_string())
                })
                .disable_y_mesh()
                .draw()?;
            let cells: Vec<(f64, &MicroPoint)> = doc
                .results
                .iter()
                .filter(|p| p.wpp == wpp && p.backup == backup)
                .filter_map(|p| {
                    let i = names.iter().position(|&e| e == p.engine)? as f64;
                    Some((n - 1.0 - i, p))
                })
                .collect();
            for (k, &(label, c)) in parts.iter().enumerate() {
                let bars = cells.iter().filter_map(|&(y, p)| {
                    let t = p.parts()?;
                    let x0: f64 = t[..k].iter().sum();
                    Some(Rectangle::new(
                        [(x0, y - 0.3), (x0 + t[k], y + 0.3)],
                        c.filled(),
                    ))
                });
                let drawn = chart.draw_series(bars)?;
                if legend {
                    drawn.label(label).legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled())
                    });
                }
            }
            let font = ("sans-serif", 13).into_font();
            chart.draw_series(cells.iter().map(|&(y, p)| {
                let text = if p.engine == "mprotect" || p.speedup_vs_mprotect == 0.0 {
                    format!("{:.1}", p.us_per_tx)
                } else {
                    format!("{:.1} ({:.2}x)", p.us_per_tx, p.speedup_vs_mprotect)
                };
                Text::new(text, (p.us_per_tx + hi * 0.01, y + 0.1), font.clone())
            }))?;
            if legend {
                legend_box(&mut chart, SeriesLabelPosition::LowerRight)?;
            }
        }
    }
    Ok(())
}

/// One engine's (log2 pages per transaction, value) points of one panel, in x order.
fn points(
    cells: &[MicroPoint],
    engine: &str,
    backup: bool,
    wpp: u32,
    value: impl Fn(&MicroPoint) -> f64,
) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = cells
        .iter()
        .filter(|p| p.engine == engine && p.backup == backup && p.wpp == wpp)
        .map(|p| (f64::from(p.ppt).log2(), value(p)))
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

/// An engine's line with dots, labelled in the legend when `legend`.
fn series<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    engine: &str,
    pts: Vec<(f64, f64)>,
    legend: bool,
) -> DrawResult
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    if pts.is_empty() {
        return Ok(());
    }
    let c = colour(engine);
    let line = chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
    if legend {
        line.label(engine.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    Ok(())
}

fn ds_figure(root: &Area, doc: &Doc<DsPoint>) -> DrawResult {
    // The backup runs when the document has them; otherwise the runs without.
    let backup = doc.results.iter().any(|p| p.backup);
    let sub = format!(
        "µs per transaction, {}; {}",
        if backup {
            "with the backup"
        } else {
            "no backup"
        },
        subtitle(&doc.machine)
    );
    let body = headed(root, &doc.command, &sub)?;
    let cells: Vec<&DsPoint> = doc.results.iter().filter(|p| p.backup == backup).collect();
    let structures = in_order(cells.iter().map(|p| p.structure.as_str()));
    let names = in_order(cells.iter().map(|p| p.engine.as_str()));
    let mut groups: Vec<(&str, u32)> = Vec::new();
    for p in &cells {
        if !groups.contains(&(p.op.as_str(), p.opt)) {
            groups.push((p.op.as_str(), p.opt));
        }
    }
    let cols = groups.len().min(2);
    let panels = body.split_evenly((groups.len().div_ceil(cols), cols));
    let (lo, hi) = log_bounds(cells.iter().map(|p| p.us_per_tx));
    let n = structures.len() as f64;
    let bar = 0.8 / names.len() as f64;
    for (gi, (&(op, opt), area)) in groups.iter().zip(panels.iter()).enumerate() {
        let title = format!("{op}, {opt} op(s) per transaction");
        let mut chart = titled_panel(area, title, 90)
            .build_cartesian_2d((lo..hi).log_scale(), -0.5..n - 0.5)?;
        chart
            .configure_mesh()
            .x_desc("µs per transaction (log)")
            .x_label_formatter(&|v| format!("{v}"))
            .y_labels(structures.len())
            .y_label_formatter(&|v| {
                at_whole(*v)
                    .and_then(|i| structures.get(i))
                    .map_or(String::new(), |s| s.to_string())
            })
            .disable_y_mesh()
            .draw()?;
        for (k, &e) in names.iter().enumerate() {
            let c = colour(e);
            let bars: Vec<Rectangle<(f64, f64)>> = cells
                .iter()
                .filter(|p| p.engine == e && p.op == op && p.opt == opt)
                .filter_map(|p| {
                    let i = structures.iter().position(|&s| s == p.structure)? as f64;
                    // The legend's order, top to bottom.
                    let y0 = i + 0.4 - (k + 1) as f64 * bar;
                    Some(Rectangle::new(
                        [(lo, y0), (p.us_per_tx, y0 + bar * 0.9)],
                        c.filled(),
                    ))
                })
                .collect();
            let drawn = chart.draw_series(bars)?;
            if gi == 0 {
                drawn.label(e.to_string()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], c.filled())
                });
            }
        }
        if gi == 0 {
            legend_box(&mut chart, SeriesLabelPosition::UpperRight)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
