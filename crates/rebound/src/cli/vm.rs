//! `rebound vm ...`: the daemon's client for VM commands.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use rebound_api::{Event, MarkerReply, VmSpec, VmState, VmStatus, VmcoreinfoReply};
use rebound_vmm::paths::Paths;
use serde_json::json;

// `enc` is used by name from here by the bench drivers too.
pub(super) use super::common::enc;
use super::common::{abs_file, show_progress, status};
use super::{connect, output, StartArgs, VmCmd};
use crate::client::{Client, ClientError};

pub async fn run(paths: &Paths, cmd: VmCmd) -> anyhow::Result<()> {
    match cmd {
        VmCmd::Start(a) => start(paths, *a).await,
        VmCmd::Snapshot {
            name,
            out,
            trace_s,
            stock,
            json,
        } => super::snapshot::snapshot(paths, &name, &out, trace_s, stock, json).await,
        VmCmd::Restore(a) => super::snapshot::restore(paths, *a).await,
        VmCmd::Resume { name } => simple(paths, &name, "resume", "resumed").await,
        VmCmd::Pause { name } => simple(paths, &name, "pause", "paused").await,
        VmCmd::Settle { name } => simple(paths, &name, "settle", "settled").await,
        VmCmd::Reboot {
            name,
            warm,
            hard,
            json,
        } => reboot(paths, &name, warm, hard, json).await,
        VmCmd::List {
            all_hosts: true,
            store,
            json,
        } => super::cluster::list_all_hosts(&store, json).await,
        VmCmd::List { json, .. } => {
            let c = connect(paths).await?;
            let v: Vec<VmStatus> = c.call(Method::GET, "/v1/vms", None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", output::table(&v));
            }
            Ok(())
        }
        VmCmd::Status { name, json } => {
            let v = status(&connect(paths).await?, &name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", output::status(&v));
            }
            Ok(())
        }
        VmCmd::Disks { name, json } => {
            let c = connect(paths).await?;
            let v: Vec<serde_json::Value> = c
                .call(Method::GET, &format!("/v1/vms/{}/disks", enc(&name)), None)
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            for d in &v {
                let s = &d["stats"]["cache"];
                let cache = if s.is_object() {
                    let (h, m) = (
                        s["hits"].as_u64().unwrap_or(0),
                        s["misses"].as_u64().unwrap_or(0),
                    );
                    format!(
                        "; cache {:.1}/{} MiB, {h} hits, {m} misses, {} admitted, {} invalidated",
                        s["held_bytes"].as_u64().unwrap_or(0) as f64 / 1048576.0,
                        s["capacity_bytes"].as_u64().unwrap_or(0) >> 20,
                        s["admissions"],
                        s["invalidations"]
                    )
                } else {
                    String::new()
                };
                println!(
                    "{} {} ({}{}){cache}",
                    d["id"].as_str().unwrap_or(""),
                    d["file"].as_str().unwrap_or(""),
                    d["backend"].as_str().unwrap_or(""),
                    d["pid"]
                        .as_u64()
                        .map(|p| format!(", pid {p}"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        VmCmd::Stop { name } => simple(paths, &name, "stop", "stopped").await,
        VmCmd::Kill { name } => simple(paths, &name, "kill", "killed").await,
        VmCmd::Rm { name } => {
            let c = connect(paths).await?;
            let _: VmStatus = c
                .call(Method::DELETE, &format!("/v1/vms/{}", enc(&name)), None)
                .await?;
            println!("removed {name}");
            Ok(())
        }
        VmCmd::Crash { name, hang } => {
            let op = if hang { "crash?how=hang" } else { "crash" };
            simple(paths, &name, op, "crash requested for").await
        }
        VmCmd::Console { name } => {
            let v = status(&connect(paths).await?, &name).await?;
            if v.state == VmState::Stopped {
                bail!("VM {name:?} is stopped");
            }
            super::console::attach(&Path::new(&v.run_dir).join("console.sock")).await
        }
        VmCmd::Logs { name, follow } => logs(paths, &name, follow).await,
        VmCmd::Events { name, since, limit } => {
            let c = connect(paths).await?;
            // Page by page, so the daemon never holds the whole log for us.
            let (mut since, mut left) = (since.unwrap_or(0), limit.unwrap_or(u64::MAX));
            while left > 0 {
                let n = left.min(1000);
                let path = format!("/v1/vms/{}/events?since={since}&limit={n}", enc(&name));
                let v: Vec<Event> = c.call(Method::GET, &path, None).await?;
                for e in &v {
                    println!("{}", serde_json::to_string(e)?);
                }
                match v.last() {
                    Some(e) if v.len() as u64 == n => (since, left) = (e.seq, left - n),
                    _ => break,
                }
            }
            Ok(())
        }
        VmCmd::Wait {
            name,
            state,
            timeout,
            json,
        } => {
            let c = connect(paths).await?;
            let path = format!(
                "/v1/vms/{}/wait?for={state}&timeout_ms={}",
                enc(&name),
                timeout * 1000
            );
            let v: VmStatus = c.call(Method::POST, &path, None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{name} is {}", v.state);
            }
            Ok(())
        }
        VmCmd::Memory {
            name,
            host_cache,
            size,
            json: as_json,
        } => {
            let c = connect(paths).await?;
            let v: rebound_api::HostCacheReport = c
                .call(
                    Method::POST,
                    &format!("/v1/vms/{}/memory", enc(&name)),
                    Some(&json!({"host_cache_bytes": host_cache, "allocation_bytes": size})),
                )
                .await?;
            if as_json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{name}: allocation {} MiB; guest {} -> {} MiB in {:.2} s; host cache {} MiB over {} disk(s){}",
                    v.allocation_mib,
                    v.guest_mib_before,
                    v.guest_mib,
                    v.balloon_s,
                    v.host_cache_bytes >> 20,
                    v.disks,
                    if v.exclusive { ", exclusive" } else { "" }
                );
                for n in &v.notes {
                    println!("note: {n}");
                }
            }
            Ok(())
        }
        VmCmd::Mrc {
            name,
            restart,
            rate,
            step,
            max,
            svg,
            json: as_json,
        } => {
            mrc(
                paths,
                &name,
                restart,
                rate,
                step,
                max,
                svg.as_deref(),
                as_json,
            )
            .await
        }
        VmCmd::Marker {
            name,
            hex,
            json: as_json,
        } => {
            let c = connect(paths).await?;
            let v: MarkerReply = c
                .call(
                    Method::POST,
                    &format!("/v1/vms/{}/marker", enc(&name)),
                    Some(&json!({"value_hex": hex})),
                )
                .await?;
            if as_json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                println!("paddr {:#x} len {}", v.paddr, v.len);
            }
            Ok(())
        }
        VmCmd::Dump {
            name,
            out,
            format,
            compress,
            filter,
            engine,
            mode,
            json,
        } => {
            let c = connect(paths).await?;
            let out = if out.is_absolute() {
                out
            } else {
                std::env::current_dir()?.join(out)
            };
            let req = rebound_api::DumpRequest {
                out: out.display().to_string(),
                format,
                compress,
                filter: filter.0,
                engine,
                mode,
            };
            let path = format!("/v1/vms/{}/dump", enc(&name));
            let body = serde_json::to_value(&req)?;
            let call = {
                let c = c.clone();
                tokio::spawn(async move {
                    c.call::<rebound_api::DumpResult>(Method::POST, &path, Some(&body))
                        .await
                })
            };
            let r = show_progress(&c, &name, "dump", call).await??;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{} ({} MiB, {} MiB written) in {:.2} s, guest paused {:.2} s",
                    r.path,
                    r.bytes >> 20,
                    r.io_bytes >> 20,
                    r.seconds,
                    r.paused_s
                );
                for n in &r.notes {
                    println!("note: {n}");
                }
            }
            Ok(())
        }
        VmCmd::Vmcoreinfo { name, json } => {
            let c = connect(paths).await?;
            let v: VmcoreinfoReply = c
                .call(
                    Method::GET,
                    &format!("/v1/vms/{}/vmcoreinfo", enc(&name)),
                    None,
                )
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("osrelease {}", v.osrelease);
                println!("paddr     {:#x} (from {})", v.paddr, v.source);
                println!("entries   {}", v.entries.len());
            }
            Ok(())
        }
    }
}

async fn simple(paths: &Paths, name: &str, op: &str, done: &str) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let _: VmStatus = c
        .call(Method::POST, &format!("/v1/vms/{}/{op}", enc(name)), None)
        .await?;
    println!("{done} {name}");
    Ok(())
}

/// A `--disk` entry with its file made absolute; the file must exist unless `size=`
/// asks for it to be made.
fn abs_disk(entry: &str) -> anyhow::Result<String> {
    let mut d: rebound_api::disk::DiskOpts = entry.parse()?;
    let p = Path::new(&d.path);
    d.path = if d.size.is_some() && !p.exists() {
        let parent = p
            .parent()
            .filter(|x| !x.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let dir = std::fs::canonicalize(parent)
            .with_context(|| format!("directory of disk {}", p.display()))?;
        dir.join(p.file_name().context("a disk file name")?)
            .to_string_lossy()
            .into_owned()
    } else {
        abs_file(p, "disk")?
    };
    Ok(d.to_string())
}

/// A directory the daemon will write into: made absolute, created private if missing.
fn abs_dir(p: &Path) -> anyhow::Result<String> {
    rebound_vmm::private::create_dir_all(p)
        .with_context(|| format!("cannot create dump directory {}", p.display()))?;
    Ok(std::fs::canonicalize(p)
        .with_context(|| format!("dump directory {}", p.display()))?
        .to_string_lossy()
        .into_owned())
}

/// Builds the spec from flags; user files are checked and made absolute here
/// because the daemon runs in another directory.
pub fn spec_from_args(a: &StartArgs) -> anyhow::Result<VmSpec> {
    let mut s = VmSpec::new(&a.name);
    s.image = a.image.clone();
    if let Some(k) = &a.kernel {
        s.kernel = Some(abs_file(k, "kernel")?);
    }
    if let Some(i) = &a.initrd {
        s.initrd = Some(abs_file(i, "initrd")?);
    }
    s.append = a.append.clone();
    for d in &a.disks {
        s.disks.push(abs_disk(d)?);
    }
    s.memory_mib = a.memory;
    s.cpus = a.cpus;
    if let Some(w) = &a.workload {
        let (first, rest) = w.split_once(',').unwrap_or((w, ""));
        s.workload = Some(first.parse()?);
        if !rest.is_empty() {
            s.workload_args.insert("also".into(), rest.to_string());
        }
    }
    if let Some(m) = &a.memfill {
        s.workload_args.insert("memfill".into(), m.clone());
    }
    if let Some(w) = a.watchdog {
        s.workload_args.insert("watchdog_s".into(), w.to_string());
    }
    if let Some(d) = &a.disk_io {
        s.workload_args.insert("disk_io".into(), d.clone());
    }
    for kv in &a.workload_args {
        let Some((k, v)) = kv.split_once('=') else {
            anyhow::bail!("--workload-arg {kv:?}: expected KEY=VALUE");
        };
        s.workload_args.insert(k.to_string(), v.to_string());
    }
    s.accel = a.accel;
    s.crash = rebound_api::CrashPolicy {
        on_crash: a.on_crash,
        dump_dir: match &a.dump_dir {
            Some(d) => Some(abs_dir(d)?),
            None => None,
        },
        dump_format: a.dump_format,
        compress: a.compress,
        filter: a.filter.0.clone(),
        chunk_mib: a.chunk,
        min_memory_mib: a.min_memory,
        io_policy: a.io_policy,
        host_memory_budget_mib: a.host_memory_budget,
        recover_from: match &a.recover_from {
            Some(d) => Some(
                std::fs::canonicalize(d)
                    .with_context(|| format!("--recover-from {}", d.display()))?
                    .to_string_lossy()
                    .into_owned(),
            ),
            None => None,
        },
        warm: a.warm,
    };
    s.ready = a.ready.clone();
    s.forwards = a.forwards.clone();
    s.disk_backend = a.disk_backend;
    s.disk_cache_mib = a.disk_cache;
    s.disk_direct = a.disk_direct;
    for p in &a.pmem {
        s.pmem.push(abs_file(p, "pmem")?);
    }
    s.nics = a.nic.clone();
    s.validate()?;
    Ok(s)
}

async fn start(paths: &Paths, a: StartArgs) -> anyhow::Result<()> {
    let spec = spec_from_args(&a)?;
    // The daemon checks again, but it may run with another environment: say it here
    // before anything is spawned.
    rebound_vmm::process::find_qemu()?;
    let c = connect(paths).await?;
    let t0 = Instant::now();
    let v: VmStatus = c
        .call(Method::POST, "/v1/vms", Some(&serde_json::to_value(&spec)?))
        .await?;
    let v = if a.no_wait {
        v
    } else {
        wait_ready(&c, &a.name, Duration::from_secs(a.timeout), t0).await?
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", output::status(&v));
    }
    Ok(())
}

/// Waits for readiness in short slices so a terminal shows progress.
async fn wait_ready(
    c: &Client,
    name: &str,
    timeout: Duration,
    t0: Instant,
) -> anyhow::Result<VmStatus> {
    let tty = std::io::stderr().is_terminal();
    let deadline = Instant::now() + timeout;
    loop {
        let path = format!("/v1/vms/{}/wait?for=ready&timeout_ms=1000", enc(name));
        match c.call::<VmStatus>(Method::POST, &path, None).await {
            Ok(v) => {
                if tty {
                    eprintln!(
                        "\r{name}: ready after {:.1} s        ",
                        t0.elapsed().as_secs_f64()
                    );
                }
                return Ok(v);
            }
            Err(ClientError::Api { status: 408, .. }) => {
                if Instant::now() > deadline {
                    bail!(
                        "VM {name:?} not ready after {} s (see `rebound vm logs {name}`)",
                        timeout.as_secs()
                    );
                }
                if tty {
                    eprint!("\r{name}: booting... {:.0} s", t0.elapsed().as_secs_f64());
                    let _ = std::io::stderr().flush();
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn logs(paths: &Paths, name: &str, follow: bool) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let path = format!("/v1/vms/{}/logs", enc(name));
    // The end of what was printed: the next tail goes on after it.
    let mut last: Vec<u8> = Vec::new();
    loop {
        let text = c.text(&path).await?;
        let b = text.as_bytes();
        let from = match last.is_empty() {
            true => 0,
            false => b
                .windows(last.len())
                .rposition(|w| w == last.as_slice())
                .map_or(0, |i| i + last.len()), // not found: a new boot, or far behind
        };
        let mut out = std::io::stdout();
        out.write_all(&b[from..])?;
        out.flush()?;
        if from < b.len() || last.is_empty() {
            last = b[b.len().saturating_sub(256)..].to_vec();
        }
        if !follow {
            return Ok(());
        }
        let st = status(&c, name).await?;
        if st.state == VmState::Stopped {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn reboot(
    paths: &Paths,
    name: &str,
    warm: bool,
    hard: bool,
    json: bool,
) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let req = rebound_api::RebootRequest { warm, hard };
    let body = serde_json::to_value(&req)?;
    let r: rebound_api::RebootReport = c
        .call(
            Method::POST,
            &format!("/v1/vms/{}/reboot", enc(name)),
            Some(&body),
        )
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let back = match r.reboot_ms {
        Some(ms) => format!("agent up again after {:.1} s", ms as f64 / 1000.0),
        None => "reset (no agent: the readiness probe says when it is back)".into(),
    };
    println!("rebooted {name} ({}): {back}", r.how);
    if warm {
        println!(
            "  cache listed before: {} pages ({:.1} MiB) of {} files",
            r.cached_pages,
            r.cached_pages as f64 / 256.0,
            r.cached_files
        );
    }
    if let Some(p) = &r.prefetch {
        println!(
            "  read back: {:.1} MiB of {} files in {:.2} s{}",
            p.bytes as f64 / 1048576.0,
            p.files,
            p.ms as f64 / 1000.0,
            if p.missing > 0 {
                format!(" ({} files gone since)", p.missing)
            } else {
                String::new()
            }
        );
    }
    if let Some(why) = &r.cold_reason {
        println!("  cold: {why}");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)] // one per flag of `vm mrc`
async fn mrc(
    paths: &Paths,
    name: &str,
    restart: bool,
    rate: Option<f64>,
    step: Option<u64>,
    max: Option<u64>,
    svg: Option<&std::path::Path>,
    as_json: bool,
) -> anyhow::Result<()> {
    let c = connect(paths).await?;
    let path = format!("/v1/vms/{}/mrc", enc(name));
    if restart {
        let mut body = json!({});
        if let Some(r) = rate {
            body["rate"] = json!(r);
        }
        if let Some(s) = step {
            body["step_bytes"] = json!(s);
        }
        let v: serde_json::Value = c.call(Method::POST, &path, Some(&body)).await?;
        if as_json {
            println!("{v}");
        } else {
            println!(
                "{name}: tracing afresh on {} disk(s), rate {}, a point every {} KiB",
                v["disks"],
                v["rate"],
                v["step_bytes"].as_u64().unwrap_or(0) >> 10
            );
        }
        return Ok(());
    }
    let q = max.map(|m| format!("?max_bytes={m}")).unwrap_or_default();
    let r: rebound_api::MrcReport = c.call(Method::GET, &format!("{path}{q}"), None).await?;
    if let Some(f) = svg {
        rebound_plot::mrc(name, &r, &[], f)?;
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "{name}: guest {} MiB, allocation {} MiB",
        r.guest_bytes >> 20,
        r.allocation_bytes >> 20
    );
    for d in &r.disks {
        println!(
            "{}: {} misses traced, {} blocks held as evicted{}{}",
            d.id,
            d.misses,
            d.evicted_blocks,
            if d.rate < 1.0 {
                format!(", sampled at {}", d.rate)
            } else {
                String::new()
            },
            if d.inconsistent_blocks > 0 {
                format!(
                    ", {} inconsistent (lost or reordered notices)",
                    d.inconsistent_blocks
                )
            } else {
                String::new()
            }
        );
        if let Some(why) = &d.detail {
            println!("  {why}");
        }
        // About a dozen rows: the curve's shape, not every point.
        let every = d.points.len().div_ceil(12).max(1);
        for (i, p) in d.points.iter().enumerate() {
            if i % every == 0 || i + 1 == d.points.len() {
                println!(
                    "  {:>8} MiB  {:>10.0} misses{}",
                    p.bytes >> 20,
                    p.misses,
                    p.vs_allocation
                        .map(|v| format!("  {v:.3} of the allocation's"))
                        .unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}
