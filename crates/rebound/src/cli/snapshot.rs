//! `rebound vm snapshot|restore` (through the daemon) and `rebound snapshot
//! list|inspect|verify` (on the directories themselves, no daemon).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use rebound_api::{RestoreReport, RestoreRequest, SnapshotRequest, SnapshotResult};
use rebound_snapshot::Snapshot;
use rebound_vmm::paths::Paths;

use super::common::{abs_file, absolute, enc, show_progress};
use super::{connect, RestoreArgs, SnapshotCmd};

pub async fn snapshot(
    paths: &Paths,
    name: &str,
    out: &Path,
    trace_s: f64,
    stock: bool,
    json: bool,
) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let req = SnapshotRequest {
        out: absolute(out)?.display().to_string(),
        trace_s,
        stock,
        hold: false,
        netdump: false,
        stop_at_unix_ns: None,
    };
    let path = format!("/v1/vms/{}/snapshot", enc(name));
    let body = serde_json::to_value(&req)?;
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call::<SnapshotResult>(Method::POST, &path, Some(&body))
                .await
        })
    };
    let r = show_progress(&c, name, "snapshot", call).await??;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{} ({} MiB of RAM, {} KiB of device state, {} MiB of disk) in {:.2} s, guest paused {:.0} ms",
        r.dir,
        r.ram_data_bytes >> 20,
        r.device_state_bytes >> 10,
        r.disk_bytes >> 20,
        r.seconds,
        r.pause_ms
    );
    if r.trace_pages > 0 {
        println!(
            "working-set trace: {} pages first touched in the {trace_s} s after the snapshot",
            r.trace_pages
        );
    }
    if let Some(s) = &r.stock {
        println!(
            "QEMU's stock save of the same state: {} MiB in {:.2} s at its default bandwidth cap, {:.2} s with the cap raised",
            s.bytes >> 20,
            s.default_cap_s,
            s.raised_cap_s
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
    Ok(())
}

pub async fn restore(paths: &Paths, a: RestoreArgs) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let req = RestoreRequest {
        dir: absolute(&a.dir)?.display().to_string(),
        name: a.name.clone(),
        mode: a.mode,
        ws_pages: a.ws_pages,
        paused: a.paused,
        rest_order: a.rest_order,
        path: a.path,
        ram_check: a.ram_check,
        watch_s: a.watch_s,
        forwards: (!a.forwards.is_empty()).then(|| a.forwards.clone()),
        replay: (!a.replay.is_empty()).then(|| a.replay.clone()),
        kernel: a
            .kernel
            .as_deref()
            .map(|k| abs_file(k, "kernel"))
            .transpose()?,
        initrd: a
            .initrd
            .as_deref()
            .map(|i| abs_file(i, "initrd"))
            .transpose()?,
        pmem: a
            .pmem
            .iter()
            .map(|p| abs_file(p, "pmem"))
            .collect::<anyhow::Result<_>>()?,
    };
    let body = serde_json::to_value(&req)?;
    let call = {
        let c = c.clone();
        tokio::spawn(async move {
            c.call::<RestoreReport>(Method::POST, "/v1/restore", Some(&body))
                .await
        })
    };
    let mut r = show_progress(&c, &a.name, "restore", call).await??;
    if !a.paused {
        // The report is complete once the watch window is over (on the page server,
        // once the server has sent every page: the phase is `serving` until then).
        let path = format!("/v1/vms/{}/restore", enc(&a.name));
        let deadline = Instant::now() + Duration::from_secs_f64(a.watch_s + 90.0);
        while !matches!(r.phase.as_str(), "done" | "failed") && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            r = c.call(Method::GET, &path, None).await?;
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", report_text(&r));
    }
    if let Some(e) = &r.error {
        bail!("the restore failed: {e}");
    }
    Ok(())
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.2} s"))
}

pub fn report_text(r: &RestoreReport) -> String {
    let mut o = format!(
        "{} restored from {} ({}, rest {}, accel {})\n",
        r.vm,
        r.snapshot,
        r.mode.as_str(),
        match r.rest_order {
            rebound_api::RestOrder::Fafl => "in first-access order",
            rebound_api::RestOrder::FileOrder => "in file order",
        },
        r.accel.as_deref().unwrap_or("?")
    );
    for f in &r.replayed_frames {
        o += &format!(
            "  replayed on net{}: {} frames ({} bytes), queued for the guest before it ran\n",
            f.nic, f.frames, f.bytes
        );
    }
    if r.phase == "held" {
        o += &format!(
            "  held ready: {} pages ({} MiB) loaded in {:.2} s; `rebound vm resume {}` starts it\n",
            r.pages_loaded_before_start,
            r.bytes_loaded_before_start >> 20,
            r.load_before_start_s,
            r.vm
        );
        return o;
    }
    o += &format!(
        "  running after     {}  ({} pages, {} MiB loaded first in {:.2} s)\n",
        secs(r.time_to_running_s),
        r.pages_loaded_before_start,
        r.bytes_loaded_before_start >> 20,
        r.load_before_start_s
    );
    o += &format!(
        "  responsive after  {}  ({} after the start)\n",
        secs(r.time_to_responsive_s),
        secs(r.responsive_after_start_s)
    );
    if let (Some(f), Some(b)) = (r.major_faults_after_start, r.bytes_read_after_start) {
        o += &format!(
            "  after the start:  {f} major faults, {} MiB read, {} pages touched\n",
            b >> 20,
            r.pages_touched_after_start
        );
    }
    if r.working_set_pages > 0 {
        let pct = |v: Option<f64>| v.map_or("-".into(), |x| format!("{:.1}%", x * 100.0));
        o += &format!(
            "  working set:      {} pages loaded first, hit rate {}, accuracy {} (trace from {})\n",
            r.working_set_pages,
            pct(r.hit_rate),
            pct(r.accuracy),
            r.trace_source.as_deref().unwrap_or("-")
        );
    }
    if let Some(s) = r.background_s {
        o += &format!(
            "  background:       {} pages in {s:.2} s\n",
            r.background_pages
        );
    }
    match r.ram_check {
        Some(rebound_api::RamCheck::Off) => o += "  RAM image:        unchecked\n",
        Some(c) => {
            o += &format!(
                "  RAM image:        {} of {} chunks checked ({}), {} before the start{}\n",
                r.ram_chunks_checked,
                r.ram_chunks,
                c.as_str(),
                r.ram_chunks_checked_before_start,
                r.ram_check_s
                    .map_or(String::new(), |s| format!(" in {s:.2} s"))
            )
        }
        None => {}
    }
    if r.trace_recorded {
        o += "  this restore recorded the snapshot's working-set trace\n";
    }
    for n in &r.notes {
        o += &format!("  note: {n}\n");
    }
    if let Some(e) = &r.error {
        o += &format!("  error: {e}\n");
    }
    o
}

/// `rebound snapshot ...`: reads the directories, never the daemon.
pub fn run_offline(cmd: SnapshotCmd) -> anyhow::Result<()> {
    match cmd {
        SnapshotCmd::List { dirs, json } => {
            let dirs = if dirs.is_empty() {
                vec![PathBuf::from(".")]
            } else {
                dirs
            };
            let mut rows = Vec::new();
            for d in dirs {
                if d.join("manifest.json").is_file() {
                    rows.push((d.clone(), Snapshot::open(&d).map_err(|e| e.to_string())));
                    continue;
                }
                let entries = std::fs::read_dir(&d)
                    .with_context(|| format!("cannot list {}", d.display()))?;
                let mut found: Vec<PathBuf> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join("manifest.json").is_file())
                    .collect();
                found.sort();
                for p in found {
                    let s = Snapshot::open(&p).map_err(|e| e.to_string());
                    rows.push((p, s));
                }
            }
            if json {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|(p, s)| match s {
                        Ok(s) => serde_json::json!({"dir": p, "manifest": s.manifest()}),
                        Err(e) => serde_json::json!({"dir": p, "error": e}),
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            println!(
                "{:<32} {:<16} {:<24} {:>8} {:>10} {:>8}",
                "SNAPSHOT", "VM", "CREATED", "RAM MiB", "DATA MiB", "TRACE"
            );
            for (p, s) in rows {
                match s {
                    Ok(s) => {
                        let m = s.manifest();
                        let size: u64 = m.ram_blocks.iter().map(|b| b.size).sum();
                        let data: u64 = m.ram_blocks.iter().map(|b| b.data_bytes).sum();
                        println!(
                            "{:<32} {:<16} {:<24} {:>8} {:>10} {:>8}",
                            p.display(),
                            m.vm,
                            m.created,
                            size >> 20,
                            data >> 20,
                            m.trace.as_ref().map_or("-".into(), |t| t.pages.to_string())
                        );
                    }
                    Err(e) => println!("{:<32} unreadable: {e}", p.display()),
                }
            }
            Ok(())
        }
        SnapshotCmd::Inspect { dir, json } => {
            let s = Snapshot::open(&dir)?;
            let m = s.manifest();
            if json {
                println!("{}", serde_json::to_string_pretty(m)?);
                return Ok(());
            }
            println!("snapshot   {}", dir.display());
            println!("format     {} version {}", m.format, m.version);
            println!("vm         {} (created {})", m.vm, m.created);
            println!(
                "qemu       {} machine {} accel {}",
                m.qemu_version, m.machine, m.accel
            );
            println!("paused     {:.0} ms", m.pause_ms);
            for b in &m.ram_blocks {
                println!(
                    "ram        {} {} MiB, {} MiB of data in {}, {} chunks of {} MiB",
                    b.id,
                    b.size >> 20,
                    b.data_bytes >> 20,
                    b.file,
                    b.checksums.len(),
                    b.chunk_bytes >> 20
                );
            }
            println!(
                "device     {} ({} KiB)",
                m.device_state.file,
                m.device_state.size >> 10
            );
            for d in &m.disks {
                println!(
                    "disk       {} {} ({} MiB, {}{})",
                    d.id,
                    d.file,
                    d.size >> 20,
                    d.format,
                    d.backing
                        .as_ref()
                        .map_or(String::new(), |b| format!(", over {b}"))
                );
            }
            match &m.trace {
                Some(t) => println!(
                    "trace      {} pages from {} (sampled working set {}, post-snapshot {})",
                    t.pages,
                    t.source,
                    t.wss_sample_pages.map_or("-".into(), |p| p.to_string()),
                    t.wss_snapshot_pages
                ),
                None => println!("trace      none (the first restore records one)"),
            }
            if s.path_of("stock.mig").is_file() {
                println!("stock      stock.mig (QEMU's full migration stream)");
            }
            for n in &m.notes {
                println!("note       {n}");
            }
            Ok(())
        }
        SnapshotCmd::Verify { dir, json } => {
            let s = Snapshot::open(&dir)?;
            let tty = std::io::stderr().is_terminal();
            let mut show = |done: u64, total: u64| {
                if tty && total > 0 {
                    let f = done as f64 / total as f64;
                    eprint!(
                        "\rverify [{:<30}] {:>3.0}%",
                        "#".repeat((f * 30.0) as usize),
                        f * 100.0
                    );
                    let _ = std::io::stderr().flush();
                }
            };
            let r = s.verify(&mut show);
            if tty {
                eprint!("\r{:50}\r", "");
            }
            let r = r?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("{}: every checksum matches ({r:?})", dir.display());
            }
            Ok(())
        }
    }
}
