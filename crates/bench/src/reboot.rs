//! `rebound bench reboot`: what a reboot costs a web service, as CacheMind's figures
//! 3–5, for three variants side by side in one run (issue 12, item 5):
//!
//! - `normal`: QEMU's virtio-blk with `O_DIRECT` (cache=none): the guest's file cache
//!   is gone after the reboot and nothing on the host holds it;
//! - `normal-hostcache`: QEMU's virtio-blk through the host page cache (writeback):
//!   the guest's cache is gone, but its reads come from the host's memory (CacheMind's
//!   figure 4 case, with double caching);
//! - `warm`: Rebound's backend with a host cache and `vm reboot --warm`: the guest's
//!   cached pages are listed before the reboot and read back after it through the
//!   backend's cache;
//! - `dax`: the file set on a virtio-pmem device, mounted with DAX: the guest has no
//!   file cache of its own to lose, it reads the host's page cache directly.
//!
//! Each variant boots a fresh VM whose `/data` is a file set made by
//! `rebound image webset`, then: three full reads of the set (first, second, third),
//! a reboot, three reads again; then a steady random load for `--seconds`, a reboot
//! under the load, and the load again until `--seconds` after the service is back,
//! with the throughput of every second recorded.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use rebound_api::spec::DiskBackend;
use rebound_api::{RebootReport, RebootRequest, VmSpec, VmStatus, Workload};
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};

use crate::guest::{post, remove};
use crate::host::{host_cpus, host_kernel, load_average};
use crate::webload::{self, Load, Set};
use rebound_client::{connect, Client};

#[derive(Args, Debug)]
pub struct RebootArgs {
    /// Files in the set.
    #[arg(long, default_value_t = 1000)]
    files: u64,
    /// Size of each file.
    #[arg(long, default_value = "200K", value_parser = rebound_blk::args::parse_bytes)]
    file_size: u64,
    /// Guest memory, MiB (the set must fit in its page cache).
    #[arg(long, default_value_t = 512)]
    memory: u64,
    /// Parallel client connections.
    #[arg(long, default_value_t = 4)]
    conns: usize,
    /// Seconds of load before the reboot, and after the service is back.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Reads from the disk holding the file set are limited to this many MB/s for
    /// the VM's processes (an emulated slow disk: the host page cache and Rebound's
    /// host cache are not limited); 0: the disk's own speed. The defaults, 12 MB/s
    /// and 75 IOPS, are a 100 GiB standard cloud persistent disk.
    #[arg(long, default_value_t = 12)]
    disk_read_mbps: u64,
    /// ... and to this many read requests per second (0: unlimited).
    #[arg(long, default_value_t = 75)]
    disk_read_iops: u64,
    /// Draw `--svg` from the JSON of an earlier run (`--json` output) instead of
    /// running.
    #[arg(long, requires = "svg")]
    plot_from: Option<std::path::PathBuf>,
    /// Reboots under load per variant, each with its own `--seconds` before and after
    /// (the figures are their means: one window of a network-bound service is noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    reboots: u32,
    /// Variants: normal, normal-hostcache, warm, dax.
    #[arg(long, default_value = "normal,normal-hostcache,warm,dax")]
    variants: String,
    #[command(flatten)]
    out: crate::out::BenchOut,
}

const VARIANTS: [&str; 4] = ["normal", "normal-hostcache", "warm", "dax"];

/// One reboot under load.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Round {
    reboot_at_s: f64,
    back_at_s: f64,
    reboot_s: f64,
    outage_s: f64,
    before_mb_s: f64,
    first10_mb_s: f64,
    drop_pct: f64,
    recovery_s: Option<f64>,
}

/// One variant's results.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct Variant {
    variant: String,
    /// Seconds for the first, second and third full read of the set before and after
    /// the reboot.
    reads_before_s: [f64; 3],
    reads_after_s: [f64; 3],
    /// Requests of the reads that stalled past the client's timeout and were sent again.
    read_retries: u64,
    /// From the reboot request to the service answering again.
    reboot_s: f64,
    /// From the last answer before the outage to the first after it: what clients saw
    /// (a warm reboot lists the cache first, while the service still answers).
    #[serde(default)]
    outage_s: f64,
    /// MB/s over the `--seconds` before the reboot.
    before_mb_s: f64,
    /// MB/s over the first 10 s after the service is back.
    first10_mb_s: f64,
    /// How far the first 10 s fall below the level before the reboot.
    drop_pct: f64,
    /// Seconds after the service is back until a 3-s mean reaches 95% of the level
    /// before; absent if it did not within the run.
    recovery_s: Option<f64>,
    /// MB/s per second of the load run; the reboot was asked at `reboot_at_s` and the
    /// service was back at `back_at_s`.
    series: Vec<f64>,
    reboot_at_s: f64,
    back_at_s: f64,
    /// The warm reboots' reports (what was listed and read back).
    reboots: Vec<RebootReport>,
    /// Each reboot under load (`--reboots`); the figures above are their means
    /// (`recovery_s`: the slowest, absent if one did not recover).
    #[serde(default)]
    rounds: Vec<Round>,
}

fn spec(args: &RebootArgs, name: &str, variant: &str, disk: &str) -> VmSpec {
    let mut s = VmSpec::new(name);
    s.memory_mib = args.memory;
    s.workload = Some(Workload::Web);
    s.workload_args.insert("data_disk".into(), "vdb".into());
    s.disks = vec![rebound_api::disk::entry(disk)];
    match variant {
        "normal" => s.disk_direct = true,
        "normal-hostcache" => {}
        "dax" => {
            s.disks.clear();
            s.pmem = vec![disk.into()];
            s.workload_args.insert("data_disk".into(), "pmem0".into());
        }
        _ => {
            s.disk_backend = DiskBackend::Rebound;
            // The whole set fits, plus the image's own disk and metadata.
            s.disk_cache_mib = ((args.files * args.file_size.div_ceil(4096) * 4096) >> 20) + 64;
        }
    }
    s
}

async fn reboot(c: &Client, name: &str, warm: bool) -> anyhow::Result<RebootReport> {
    let body = serde_json::to_value(RebootRequest { warm, hard: false })?;
    post(c, &format!("/v1/vms/{name}/reboot"), Some(&body)).await
}

/// Three full reads of the set with `conns` clients; the seconds of each, and the
/// requests that timed out and were sent again.
async fn three_reads(set: Set, conns: usize) -> anyhow::Result<([f64; 3], u64)> {
    let mut r = [0.0; 3];
    let mut retries = 0;
    for x in &mut r {
        let (s, again) = tokio::task::spawn_blocking(move || set.pass(conns)).await??;
        *x = s;
        retries += again;
    }
    Ok((r, retries))
}

async fn run_variant(
    c: &Client,
    args: &RebootArgs,
    variant: &str,
    name: &str,
    disk: &str,
    progress: bool,
) -> anyhow::Result<(Variant, VmStatus)> {
    let say = |m: &str| {
        if progress {
            eprintln!("bench reboot: {variant}: {m}");
        }
    };
    let s = spec(args, name, variant, disk);
    // Each variant starts with the disk cold on the host.
    rebound_snapshot::drop_page_cache(std::path::Path::new(disk))?;
    let _: VmStatus = post(c, "/v1/vms", Some(&serde_json::to_value(&s)?)).await?;
    let st: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=300000"),
        None,
    )
    .await?;
    // QEMU and the disk backends read from the slow disk from now on (the boot
    // itself is not measured).
    let _slow = if args.disk_read_mbps > 0 || args.disk_read_iops > 0 {
        let g = crate::slowdisk::SlowDisk::new(
            name,
            std::path::Path::new(disk),
            args.disk_read_mbps * 1_000_000,
            args.disk_read_iops,
        )?;
        let disks: Vec<Value> = c
            .call(hyper::Method::GET, &format!("/v1/vms/{name}/disks"), None)
            .await?;
        let pids = st.qemu_pid.into_iter().chain(
            disks
                .iter()
                .filter_map(|d| d["pid"].as_u64().map(|p| p as u32)),
        );
        for pid in pids {
            g.add(pid)?;
        }
        Some(g)
    } else {
        None
    };
    let port = st
        .forwards
        .iter()
        .find(|f| f.guest == 8080)
        .map(|f| f.host)
        .ok_or_else(|| anyhow::anyhow!("{name}: no forward for the web service"))?;
    let set = Set {
        port,
        files: args.files,
        file_size: args.file_size,
    };
    let warm = variant == "warm";
    let mut reboots = Vec::new();

    say("three reads, reboot, three reads");
    let (reads_before_s, r1) = three_reads(set, args.conns)
        .await
        .context("the reads before the reboot")?;
    reboots.push(reboot(c, name, warm).await?);
    let (reads_after_s, r2) = three_reads(set, args.conns)
        .await
        .context("the reads after the reboot")?;

    say(&format!(
        "{} s of load, reboot under load, {} s after (x{})",
        args.seconds, args.seconds, args.reboots
    ));
    let load = Load::start(set, args.conns, 0x5eed);
    let mut times = Vec::new();
    for k in 0..args.reboots {
        // The window before each reboot is clean: the previous one's after-window
        // (with its recovery) is over before it starts.
        let wait = if k == 0 {
            args.seconds
        } else {
            2 * args.seconds
        };
        tokio::time::sleep(Duration::from_secs(wait)).await;
        let reboot_at_s = load.now();
        let r = reboot(c, name, warm).await;
        // The service is back at the first request answered after it went down (a
        // warm reboot lists the cache first, with the service still up).
        let back_at_s = loop {
            if let Some(t) = load.back_after(reboot_at_s) {
                break t;
            }
            if load.now() - reboot_at_s > 300.0 {
                let done = load.stop();
                let ok = done.iter().filter(|d| d.ok && d.t >= reboot_at_s).count();
                let failed = done.iter().filter(|d| !d.ok && d.t >= reboot_at_s).count();
                anyhow::bail!(
                    "{name}: the service did not come back within 300 s of the reboot ({ok} requests answered and {failed} failed since; the reboot answered {:?})",
                    r.map(|r| r.reboot_ms).map_err(|e| e.to_string())
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        reboots.push(r?);
        times.push((reboot_at_s, back_at_s));
        if args.reboots > 1 {
            say(&format!("reboot {} of {} done", k + 1, args.reboots));
        }
    }
    let end = times.last().expect("at least one reboot").1 + args.seconds as f64;
    tokio::time::sleep(Duration::from_secs_f64((end - load.now()).max(0.0) + 1.0)).await;
    let done = load.stop();
    let series = webload::per_second(&done, end.ceil());
    let rounds: Vec<Round> = times
        .iter()
        .map(|&(reboot_at_s, back_at_s)| {
            let before_mb_s =
                webload::mean(&series, reboot_at_s - args.seconds as f64, reboot_at_s);
            let first10_mb_s = webload::mean(&series, back_at_s.ceil(), back_at_s.ceil() + 10.0);
            Round {
                reboot_at_s,
                back_at_s,
                reboot_s: back_at_s - reboot_at_s,
                outage_s: back_at_s - webload::went_down(&done, reboot_at_s).unwrap_or(reboot_at_s),
                before_mb_s,
                first10_mb_s,
                drop_pct: if before_mb_s > 0.0 {
                    100.0 * (1.0 - first10_mb_s / before_mb_s)
                } else {
                    0.0
                },
                recovery_s: webload::recovery(&series, back_at_s, before_mb_s, 0.95),
            }
        })
        .collect();
    let mean = |f: fn(&Round) -> f64| rounds.iter().map(f).sum::<f64>() / rounds.len() as f64;
    let recovery_s = rounds
        .iter()
        .map(|r| r.recovery_s)
        .collect::<Option<Vec<f64>>>()
        .map(|v| v.into_iter().fold(0.0, f64::max));
    Ok((
        Variant {
            variant: variant.into(),
            reads_before_s,
            reads_after_s,
            read_retries: r1 + r2,
            reboot_s: mean(|r| r.reboot_s),
            outage_s: mean(|r| r.outage_s),
            before_mb_s: mean(|r| r.before_mb_s),
            first10_mb_s: mean(|r| r.first10_mb_s),
            drop_pct: mean(|r| r.drop_pct),
            recovery_s,
            series,
            reboot_at_s: rounds[0].reboot_at_s,
            back_at_s: rounds[0].back_at_s,
            reboots,
            rounds,
        },
        st,
    ))
}

pub async fn run(paths: &Paths, args: RebootArgs) -> anyhow::Result<()> {
    if let (Some(from), Some(svg)) = (&args.plot_from, &args.out.svg) {
        let v: Value = serde_json::from_slice(&std::fs::read(from)?)
            .with_context(|| format!("{}", from.display()))?;
        let rows: Vec<Variant> = serde_json::from_value(v["variants"].clone())
            .with_context(|| format!("{}: no variants of `bench reboot --json`", from.display()))?;
        return draw(&v["meta"], &rows, svg);
    }
    let want: Vec<&str> = args.variants.split(',').map(str::trim).collect();
    if let Some(bad) = want.iter().find(|v| !VARIANTS.contains(v)) {
        anyhow::bail!("unknown variant {bad:?}: expected {}", VARIANTS.join(", "));
    }
    if args.seconds < 12 || args.files == 0 {
        anyhow::bail!("--seconds must be at least 12 and --files at least 1");
    }
    let dir = args.out.scratch("reboot")?;
    let disk = dir.join(webload::SET_IMAGE);
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    if !disk.exists() {
        if progress {
            eprintln!(
                "bench reboot: making the file set ({} files of {} bytes)",
                args.files, args.file_size
            );
        }
        webload::make_set(&dir, args.files, args.file_size)?;
    }
    let c = connect(paths).await?;
    let (load_before, date) = (load_average(), rebound_vmm::events::wall_now());
    let tag = format!("br{}", std::process::id());
    let mut rows = Vec::new();
    let mut accel = String::new();
    let r: anyhow::Result<()> = async {
        for v in &want {
            let name = format!("{tag}-{v}");
            let r = run_variant(&c, &args, v, &name, &disk.display().to_string(), progress).await;
            remove(&c, &name).await;
            let (row, st) = r.with_context(|| format!("variant {v}"))?;
            accel = st.accel.as_str().to_string();
            rows.push(row);
        }
        Ok(())
    }
    .await;
    if args.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    r?;
    let meta = json!({
        "date": date, "accel": accel, "host_cpus": host_cpus(), "host_kernel": host_kernel(),
        "files": args.files, "file_size": args.file_size, "memory_mib": args.memory,
        "conns": args.conns, "seconds": args.seconds, "reboots": args.reboots,
        "disk_read_mbps": args.disk_read_mbps, "disk_read_iops": args.disk_read_iops,
        "load_before": load_before, "load_after": load_average(),
    });
    if let Some(svg) = &args.out.svg {
        draw(&meta, &rows, svg)?;
    }
    if args.out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"meta": meta, "variants": rows}))?
        );
        return Ok(());
    }
    println!(
        "rebound bench reboot: {} files of {} KiB ({:.0} MiB) on /data, guest {} MiB, {} clients, disk reads limited to {} MB/s and {} IOPS (0: none); accel {}; {}",
        args.files,
        args.file_size >> 10,
        (args.files * args.file_size) as f64 / 1048576.0,
        args.memory,
        args.conns,
        args.disk_read_mbps,
        args.disk_read_iops,
        meta["accel"].as_str().unwrap_or(""),
        date
    );
    println!(
        "{:<18} {:>23} {:>23} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10}",
        "variant",
        "reads before (s)",
        "reads after (s)",
        "reboot s",
        "outage s",
        "MB/s bef",
        "MB/s 10s",
        "drop %",
        "recovery s"
    );
    let three = |r: &[f64; 3]| format!("{:.1} / {:.1} / {:.1}", r[0], r[1], r[2]);
    for r in &rows {
        println!(
            "{:<18} {:>23} {:>23} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>7.1} {:>10}",
            r.variant,
            three(&r.reads_before_s),
            three(&r.reads_after_s),
            r.reboot_s,
            r.outage_s,
            r.before_mb_s,
            r.first10_mb_s,
            r.drop_pct,
            r.recovery_s
                .map(|s| format!("{s:.1}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    for r in rows.iter().filter(|r| r.read_retries > 0) {
        println!(
            "{}: {} requests of the reads stalled past {} s and were sent again",
            r.variant,
            r.read_retries,
            webload::REQUEST_TIMEOUT_S
        );
    }
    for r in rows.iter().filter(|r| r.variant == "warm") {
        for (k, b) in r.reboots.iter().enumerate() {
            if let Some(p) = &b.prefetch {
                println!(
                    "warm reboot {}: listed {:.1} MiB in {:.2} s, read back {:.1} MiB in {:.2} s ({:.2} s per 256 MiB)",
                    k + 1,
                    b.cached_pages as f64 / 256.0,
                    b.list_ms.unwrap_or(0) as f64 / 1000.0,
                    p.bytes as f64 / 1048576.0,
                    p.ms as f64 / 1000.0,
                    if p.bytes > 0 { p.ms as f64 / 1000.0 * (256.0 * 1048576.0) / p.bytes as f64 } else { 0.0 }
                );
            }
            if let Some(w) = &b.cold_reason {
                println!("warm reboot {}: went cold: {w}", k + 1);
            }
        }
    }
    Ok(())
}

/// Throughput per second across the reboot, one line per variant, aligned on the
/// reboot request (CacheMind's figure 5), plus the reads before and after (figure 3).
fn draw(meta: &Value, rows: &[Variant], out: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(out, (900, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(420);
    let colors = [
        RGBColor(200, 60, 60),
        RGBColor(230, 150, 60),
        RGBColor(50, 120, 200),
        RGBColor(60, 160, 90),
    ];
    let secs = meta["seconds"].as_f64().unwrap_or(30.0);
    let y_max = rows
        .iter()
        .flat_map(|r| r.series.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let x_max = rows
        .iter()
        .map(|r| r.series.len() as f64 - r.reboot_at_s)
        .fold(secs, f64::max);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "Web throughput across a reboot: {} files of {} KiB, {} clients, disk {} MB/s {} IOPS, accel {}, {}",
                meta["files"],
                meta["file_size"].as_u64().unwrap_or(0) >> 10,
                meta["conns"],
                meta["disk_read_mbps"],
                meta["disk_read_iops"],
                meta["accel"].as_str().unwrap_or(""),
                meta["date"].as_str().unwrap_or("")
            ),
            ("sans-serif", 15),
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
    for (k, r) in rows.iter().enumerate() {
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
            .label(format!(
                "{}: drop {:.0}%, back after {:.1} s",
                r.variant, r.drop_pct, r.reboot_s
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    // Reads: six bars per variant (before 1-3, after 1-3), seconds.
    let r_max = rows
        .iter()
        .flat_map(|r| {
            r.reads_before_s
                .iter()
                .chain(r.reads_after_s.iter())
                .copied()
        })
        .fold(0.1, f64::max)
        * 1.15;
    let n = rows.len() as f64;
    let mut bars = ChartBuilder::on(&bottom)
        .caption(
            "Seconds to read the whole set: 1st, 2nd, 3rd read before the reboot | after it",
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
    for (k, r) in rows.iter().enumerate() {
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
            ("sans-serif", 13),
        )))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_choose_the_backend_and_caching() {
        let a = RebootArgs {
            files: 1000,
            file_size: 200 << 10,
            memory: 512,
            conns: 4,
            seconds: 30,
            disk_read_mbps: 0,
            disk_read_iops: 0,
            plot_from: None,
            reboots: 1,
            variants: String::new(),
            out: Default::default(),
        };
        let s = |v| spec(&a, "x", v, "/w.img");
        assert!(s("normal").disk_direct);
        let hc = s("normal-hostcache");
        assert!(!hc.disk_direct && hc.disk_backend == DiskBackend::Qemu);
        let w = s("warm");
        assert_eq!(w.disk_backend, DiskBackend::Rebound);
        assert_eq!(w.disk_cache_mib, 195 + 64);
        assert_eq!(w.workload_args["data_disk"], "vdb");
        w.validate().unwrap();
        let d = s("dax");
        assert!(d.disks.is_empty() && d.pmem == ["/w.img"]);
        assert_eq!(d.workload_args["data_disk"], "pmem0");
        d.validate().unwrap();
    }
}
