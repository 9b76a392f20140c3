//! Figures from small documents, and malformed documents refused.

use super::*;
use serde_json::json;

fn machine() -> serde_json::Value {
    json!({"kernel": "6.18.0", "cpus": 2, "profile": "release", "page_size": 4096})
}

fn micro_doc() -> serde_json::Value {
    let mut results = Vec::new();
    for backup in [false, true] {
        for wpp in [4, 16] {
            for ppt in [1, 8, 32] {
                for (engine, per_page) in [("mprotect", 9.0), ("scan", 1.5), ("log", 0.4)] {
                    let t = per_page * f64::from(ppt) * if backup { 1.5 } else { 1.0 };
                    results.push(json!({"engine": engine, "backup": backup, "ppt": ppt,
                        "wpp": wpp, "us_per_tx": t, "speedup_vs_mprotect": 9.0 / per_page}));
                }
            }
        }
    }
    json!({"command": "micro: 10000 tx", "machine": machine(), "backup": "", "results": results, "goals": []})
}

fn ds_doc() -> serde_json::Value {
    let mut results = Vec::new();
    for s in ["avl", "queue"] {
        for op in ["insert", "delete"] {
            for (engine, t) in [("mprotect", 40.0), ("scan", 12.0)] {
                results.push(json!({"engine": engine, "backup": true, "structure": s,
                    "op": op, "opt": 1, "us_per_tx": t}));
            }
        }
    }
    json!({"command": "ds: 10000 ops per phase", "machine": machine(), "results": results})
}

/// Writes `text` as a result file and plots it; returns the outcome and the SVG path.
fn plot_text(dir: &Path, text: &[u8]) -> (Result<(), PlotError>, std::path::PathBuf) {
    let json = dir.join("in.json");
    let svg = dir.join("out.svg");
    std::fs::write(&json, text).unwrap();
    (from_file(&json, &svg), svg)
}

fn plot_doc(dir: &Path, doc: &serde_json::Value) -> (Result<(), PlotError>, std::path::PathBuf) {
    plot_text(dir, serde_json::to_string(doc).unwrap().as_bytes())
}

#[test]
fn a_micro_result_becomes_a_figure_with_every_engine_and_panel() {
    let dir = tempfile::tempdir().unwrap();
    let (res, svg) = plot_doc(dir.path(), &micro_doc());
    res.unwrap();
    let text = std::fs::read_to_string(svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..80]);
    for want in [
        "mprotect",
        "scan",
        "log",
        "4 writes/page, no backup",
        "16 writes/page, with the backup: x mprotect",
        "pages per transaction",
        "no accelerator",
        "kernel 6.18.0",
    ] {
        assert!(text.contains(want), "the figure lacks {want:?}");
    }
    // A dot per measured cell: 3 engines x 3 sizes in 4 time panels, and 2 engines x 3
    // sizes in the 2 ratio panels (mprotect against itself is not drawn).
    assert_eq!(text.matches("<circle").count(), 3 * 3 * 4 + 2 * 3 * 2);
}

#[test]
fn one_transaction_size_becomes_a_breakdown_of_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut doc = micro_doc();
    let cells = doc["results"].as_array_mut().unwrap();
    cells.retain(|c| c["ppt"] == 32);
    for c in cells.iter_mut() {
        let t = c["us_per_tx"].as_f64().unwrap();
        c["collect_us"] = json!(t * 0.1);
        c["diff_us"] = json!(t * 0.2);
        c["ship_us"] = json!(t * 0.3);
    }
    let (res, svg) = plot_doc(dir.path(), &doc);
    res.unwrap();
    let text = std::fs::read_to_string(svg).unwrap();
    for want in [
        "32 pages per transaction: where the time goes",
        "the stores and their write faults",
        "ship and wait for the ack",
        "16 writes/page, with the backup",
        // scan's total and its ratio against mprotect, at the end of its bar.
        "72.0 (6.00x)",
    ] {
        assert!(text.contains(want), "the figure lacks {want:?}");
    }
    // A grey part (the stores) per engine in each of the 2 x 2 panels, and one legend.
    assert_eq!(text.matches(r##"fill="#AAAAAA""##).count(), 3 * 4 + 1);
}

#[test]
fn a_ds_result_becomes_a_bar_chart_per_operation() {
    let dir = tempfile::tempdir().unwrap();
    let (res, svg) = plot_doc(dir.path(), &ds_doc());
    res.unwrap();
    let text = std::fs::read_to_string(svg).unwrap();
    for want in [
        "avl",
        "queue",
        "insert, 1 op(s)",
        "delete, 1 op(s)",
        "with the backup",
    ] {
        assert!(text.contains(want), "the figure lacks {want:?}");
    }
}

/// Plots a malformed input: one line naming the file and the problem, and no figure.
fn refused(dir: &Path, text: &[u8], want: &str) {
    let (res, svg) = plot_text(dir, text);
    let msg = res.expect_err("a malformed result was plotted").to_string();
    assert!(msg.contains(want), "{msg:?} does not say {want:?}");
    assert!(!msg.contains('\n'), "{msg:?} spans lines");
    assert!(!svg.exists(), "a figure was written for a bad input");
}

#[test]
fn malformed_results_are_refused_without_a_figure() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = serde_json::to_string(&micro_doc()).unwrap();
    refused(d, &good.as_bytes()[..good.len() / 2], "EOF while parsing");
    refused(d, b"\x7fELF\x02\x01", "not a rebound-ha-bench result");
    let kind = |cmd: &str| {
        let mut doc = micro_doc();
        doc["command"] = json!(cmd);
        serde_json::to_vec(&doc).unwrap()
    };
    refused(
        d,
        &kind("faults: 20 trials"),
        "neither a micro nor a ds run",
    );
    refused(d, b"[1, 2]", "neither a micro nor a ds run");
    let edit = |f: &dyn Fn(&mut serde_json::Value), want: &str| {
        let mut doc = micro_doc();
        f(&mut doc);
        refused(d, &serde_json::to_vec(&doc).unwrap(), want);
    };
    edit(&|doc| doc["results"] = json!([]), "no results");
    edit(
        &|doc| {
            doc.as_object_mut()
                .unwrap()
                .remove("results")
                .map(drop)
                .unwrap()
        },
        "missing field `results`",
    );
    edit(
        &|doc| doc["machine"] = json!({"cpus": 2}),
        "missing field `kernel`",
    );
    edit(
        &|doc| doc["results"][0]["us_per_tx"] = json!(-3.0),
        "is not a positive time",
    );
    edit(
        &|doc| doc["results"][0]["us_per_tx"] = json!(0),
        "is not a positive time",
    );
    edit(
        &|doc| doc["results"][0]["us_per_tx"] = json!("fast"),
        "invalid type",
    );
    edit(&|doc| doc["results"][0]["ppt"] = json!(0), "out of range");
    edit(
        &|doc| doc["results"][0]["ppt"] = json!(1u64 << 40),
        "invalid value",
    );
    edit(
        &|doc| doc["results"][0]["engine"] = json!("x".repeat(33)),
        "longer than 32 bytes",
    );
    edit(
        &|doc| doc["results"][1]["speedup_vs_mprotect"] = json!(-1),
        "is not a ratio",
    );
    edit(
        &|doc| doc["results"][2]["diff_us"] = json!(-1.0),
        "a part of the time is negative",
    );
    edit(
        &|doc| doc["results"][2]["ship_us"] = json!(1e6),
        "add up to more than its time",
    );
    edit(
        &|doc| doc["results"] = json!(vec![doc["results"][0].clone(); MAX_CELLS + 1]),
        "more than",
    );
    let mut ds = ds_doc();
    ds["results"][2]["structure"] = json!("");
    refused(d, &serde_json::to_vec(&ds).unwrap(), "structure or op name");
    // A file past the size cap is refused before it is parsed.
    let big = d.join("big.json");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(MAX_JSON + 1)
        .unwrap();
    let err = from_file(&big, &d.join("big.svg")).unwrap_err().to_string();
    assert!(err.contains("larger than"), "{err}");
    let err = from_file(&d.join("absent.json"), &d.join("x.svg"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot read") && err.contains("absent.json"),
        "{err}"
    );
}

#[test]
fn a_figure_that_cannot_be_written_is_an_error_and_the_input_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("in.json");
    let text = serde_json::to_vec(&micro_doc()).unwrap();
    std::fs::write(&json, &text).unwrap();
    let err = from_file(&json, &dir.path().join("no/such/dir/out.svg")).unwrap_err();
    assert!(err.to_string().starts_with("cannot draw"), "{err}");
    assert_eq!(std::fs::read(&json).unwrap(), text);
}
