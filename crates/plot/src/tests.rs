//! The figures a user opens: every label inside the picture, none over another,
//! the legend under the plot rather than on its lines.

use super::*;

/// A `<text>` element of an SVG: (x, y, anchor, text).
fn texts(svg: &str) -> Vec<(f64, f64, String, String)> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let attr = |name: &str| {
                let at = t.find(&format!(" {name}=\""))? + name.len() + 3;
                Some(t[at..].split('"').next()?.to_string())
            };
            let body = t.split_once('>')?.1.split("</text>").next()?;
            let body = body.trim().replace("&apos;", "'").replace("&amp;", "&");
            Some((
                attr("x")?.parse().ok()?,
                attr("y")?.parse().ok()?,
                attr("text-anchor").unwrap_or_else(|| "start".into()),
                body,
            ))
        })
        .collect()
}

/// A label's horizontal extent in pixels, as wide as the layout assumes.
fn extent(x: f64, anchor: &str, text: &str) -> (f64, f64) {
    let w = text.chars().count() as f64 * CHAR_PX;
    match anchor {
        "end" => (x - w, x),
        "middle" => (x - w / 2.0, x + w / 2.0),
        _ => (x, x + w),
    }
}

fn report() -> CrashReport {
    let sample = |t: f64, crashed: u64, dumped: u64, event: Option<&str>| {
        serde_json::json!({"t_s": t, "crashed_bytes": crashed << 20,
            "recovery_bytes": 512u64 << 20, "dumped_bytes": dumped << 20, "event": event})
    };
    serde_json::from_value(serde_json::json!({
        "version": 1, "id": "c1", "vm": "web", "cause": "panic",
        "policy": {}, "crashed_at": "2026-11-28T00:00:00Z", "crashed_mono_ns": 0,
        "phase": "done", "downtime_s": 3.2, "dump_s": 9.0, "recovery_s": 3.2,
        "dump_path": null, "dump_bytes": null, "pages_written": null,
        "io_policy": "fair",
        "timeline": [
            sample(0.0, 2048, 0, Some("crash")),
            sample(0.1, 2048, 0, Some("dump started")),
            sample(0.15, 2048, 0, Some("recovery started")),
            sample(3.2, 1200, 900, Some("recovery ready")),
            sample(8.9, 100, 1900, None),
            sample(9.0, 0, 2048, Some("dump finished")),
        ],
    }))
    .unwrap()
}

#[test]
fn a_crash_figure_keeps_every_label_inside_and_apart() {
    let dir = std::env::temp_dir().join(format!("rebound-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("crash.svg");
    crash_timeline(&report(), &out).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let all = texts(&svg);
    let events = [
        "crash",
        "dump started",
        "recovery started",
        "recovery ready",
        "dump finished",
    ];
    let labels: Vec<_> = all
        .iter()
        .filter(|t| events.contains(&t.3.as_str()))
        .collect();
    assert_eq!(labels.len(), events.len(), "{all:?}");
    for (x, _, anchor, text) in &labels {
        let (l, r) = extent(*x, anchor, text);
        assert!(
            l >= 0.0 && r <= 900.0,
            "{text:?} runs out of the figure: {l}..{r}"
        );
    }
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            let (al, ar) = extent(a.0, &a.2, &a.3);
            let (bl, br) = extent(b.0, &b.2, &b.3);
            let same_row = (a.1 - b.1).abs() < 12.0;
            assert!(!same_row || ar <= bl || br <= al, "{a:?} overlaps {b:?}");
        }
    }
    // The legend is below the plot (480 pixels high), not over its lines.
    for key in ["crashed VM's memory", "recovery VM's memory", "dumped"] {
        let t = all
            .iter()
            .find(|t| t.3 == key)
            .unwrap_or_else(|| panic!("{key}: {all:?}"));
        assert!(t.1 > 480.0, "{key} is drawn at y {} inside the plot", t.1);
    }
}

#[test]
fn skipped_pages_are_a_line_of_their_own() {
    let mut r = report();
    for (i, s) in r.timeline.iter_mut().enumerate() {
        // The filter's pages all come at the end, as free pages high in memory do.
        s.skipped_bytes = Some(if i == 5 { 1000 << 20 } else { 0 });
    }
    let dir = std::env::temp_dir().join(format!("rebound-plot-skip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("crash.svg");
    crash_timeline(&r, &out).unwrap();
    let svg = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let keys: Vec<String> = texts(&svg).into_iter().map(|t| t.3).collect();
    assert!(
        keys.contains(&"dumped: pages written".to_string()),
        "{keys:?}"
    );
    assert!(
        keys.contains(&"dumped: pages the filter skipped".to_string()),
        "{keys:?}"
    );
    assert!(!keys.contains(&"dumped".to_string()), "{keys:?}");
    // The skipped line is drawn, in its own colour.
    assert!(
        svg.lines()
            .any(|l| l.starts_with("<polyline") && l.contains("#96C83C")),
        "{svg}"
    );
}
