//! `rebound bench boot`: boots the default image N times side by side and reports
//! spawn→agent-ready time and the memory an idle guest costs the host (allocated
//! bytes of its RAM file and QEMU's RSS after settling).

use std::time::Duration;

use hyper::Method;
use rebound_api::{VmSpec, VmStatus};
use rebound_vmm::paths::Paths;
use rebound_vmm::process;
use serde::Serialize;
use serde_json::Value;

use super::{connect, BenchCmd};
use crate::client::Client;

/// Where a guest benchmark keeps its files and how it reports.
#[derive(clap::Args, Debug, Default)]
pub struct BenchOut {
    /// Scratch directory for snapshots and dumps (default:
    /// /var/tmp/rebound-bench-KIND-PID); removed after unless given.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also draw the results to this SVG file.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
}

impl BenchOut {
    /// The scratch directory, created; `kind` names the default one.
    pub fn scratch(&self, kind: &str) -> anyhow::Result<std::path::PathBuf> {
        let dir = self.dir.clone().unwrap_or_else(|| {
            format!("/var/tmp/rebound-bench-{kind}-{}", std::process::id()).into()
        });
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

#[derive(Debug, Serialize)]
struct Run {
    name: String,
    ready_ms: u64,
    ram_file_bytes: u64,
    qemu_rss_bytes: u64,
    /// QEMU's private memory (TCG code cache, device state, heap).
    qemu_anon_bytes: u64,
    /// Shared memory QEMU has mapped: guest RAM when the run dir is on tmpfs.
    qemu_shmem_bytes: u64,
    /// File pages QEMU has mapped: its binary and libraries (and guest RAM when the
    /// run dir is not on tmpfs).
    qemu_file_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Summary {
    min: u64,
    median: u64,
    max: u64,
}

fn summary(mut v: Vec<u64>) -> Summary {
    v.sort_unstable();
    Summary {
        min: v[0],
        median: v[v.len() / 2],
        max: v[v.len() - 1],
    }
}

pub async fn run(paths: &Paths, cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Ha { args } => ha(&args),
        BenchCmd::Crash(args) => super::bench_crash::run(paths, args).await,
        BenchCmd::Restore(args) => super::bench_restore::run(paths, args).await,
        BenchCmd::Disk(args) => super::bench_disk::run(paths, args).await,
        BenchCmd::Hcache(args) => super::bench_hcache::run(paths, args).await,
        BenchCmd::Reboot(args) => super::bench_reboot::run(paths, args).await,
        BenchCmd::Cluster(args) => super::bench_cluster::run(paths, args).await,
        BenchCmd::Boot {
            runs,
            memory,
            settle,
            parallel,
            json,
        } => boot(paths, runs, memory, settle, parallel, json).await,
    }
}

/// `rebound bench ha ...`: the HA heap benchmarks live in their own binary, built
/// with the workspace; run it from next to this executable, else from PATH.
fn ha(args: &[String]) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let sibling = exe.with_file_name("rebound-ha-bench");
    let prog = if sibling.is_file() {
        sibling
    } else {
        std::path::PathBuf::from("rebound-ha-bench")
    };
    let status = std::process::Command::new(&prog)
        .args(args)
        .status()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", prog.display()))?;
    if !status.success() {
        anyhow::bail!("{} failed ({status})", prog.display());
    }
    Ok(())
}

async fn boot(
    paths: &Paths,
    runs: usize,
    memory: u64,
    settle: u64,
    parallel: bool,
    json: bool,
) -> anyhow::Result<()> {
    let how = if parallel {
        "side by side"
    } else {
        "one after another"
    };
    if runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    let c = connect(paths).await?;
    let names: Vec<String> = (0..runs)
        .map(|i| format!("bench-{}-{i}", std::process::id()))
        .collect();
    let result = measure(&c, &names, memory, settle, parallel, json).await;
    for n in &names {
        let _ = c
            .call::<Value>(Method::POST, &format!("/v1/vms/{n}/kill"), None)
            .await;
        let _ = c
            .call::<Value>(Method::DELETE, &format!("/v1/vms/{n}"), None)
            .await;
    }
    let (accel, reason, runs) = result?;
    let date = rebound_vmm::events::wall_now();
    let ready = summary(runs.iter().map(|r| r.ready_ms).collect());
    let ram = summary(runs.iter().map(|r| r.ram_file_bytes).collect());
    let rss = summary(runs.iter().map(|r| r.qemu_rss_bytes).collect());
    let anon = summary(runs.iter().map(|r| r.qemu_anon_bytes).collect());
    let shmem = summary(runs.iter().map(|r| r.qemu_shmem_bytes).collect());
    let file = summary(runs.iter().map(|r| r.qemu_file_bytes).collect());
    if json {
        let v = serde_json::json!({
            "date": date, "mode": how, "accel": accel, "accel_reason": reason, "memory_mib": memory,
            "runs": runs, "ready_ms": ready, "ram_file_bytes": ram, "qemu_rss_bytes": rss,
            "qemu_anon_bytes": anon, "qemu_shmem_bytes": shmem, "qemu_file_bytes": file,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "rebound bench boot: {} guests {how}, {memory} MiB each, accel {accel} ({reason}), {date}",
            runs.len()
        );
        let ms = |v: u64| format!("{v} ms");
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
        for (label, sm, f) in [
            (
                "spawn -> agent ready",
                &ready,
                &ms as &dyn Fn(u64) -> String,
            ),
            ("RAM file allocated", &ram, &mib),
            ("QEMU RSS", &rss, &mib),
            ("  RssShmem (guest RAM)", &shmem, &mib),
            ("  RssAnon (QEMU's own)", &anon, &mib),
            ("  RssFile (binaries)", &file, &mib),
        ] {
            println!(
                "{label:<22} min {:>10}  median {:>10}  max {:>10}",
                f(sm.min),
                f(sm.median),
                f(sm.max)
            );
        }
    }
    Ok(())
}

async fn measure(
    c: &Client,
    names: &[String],
    memory: u64,
    settle: u64,
    parallel: bool,
    json: bool,
) -> anyhow::Result<(String, String, Vec<Run>)> {
    // One at a time unless asked: concurrent TCG boots on a small host measure CPU
    // contention, not boot time. Earlier guests stay up (idle) for the memory figures.
    let waves: Vec<&[String]> = if parallel {
        vec![names]
    } else {
        names.chunks(1).collect()
    };
    let mut statuses = Vec::new();
    for wave in waves {
        for n in wave {
            let mut s = VmSpec::new(n);
            s.memory_mib = memory;
            let _: VmStatus = c
                .call(Method::POST, "/v1/vms", Some(&serde_json::to_value(&s)?))
                .await?;
        }
        for n in wave {
            let v: VmStatus = c
                .call(
                    Method::POST,
                    &format!("/v1/vms/{n}/wait?for=ready&timeout_ms=600000"),
                    None,
                )
                .await?;
            if !json {
                eprintln!("{n}: ready after {} ms", v.ready_after_ms.unwrap_or(0));
            }
            statuses.push(v);
        }
    }
    tokio::time::sleep(Duration::from_secs(settle)).await;
    let mut out = Vec::new();
    for v in &statuses {
        let pid = v.qemu_pid.unwrap_or(0);
        let ram = std::path::PathBuf::from(&v.ram_file);
        out.push(Run {
            name: v.name.clone(),
            ready_ms: v.ready_after_ms.unwrap_or(0),
            ram_file_bytes: process::allocated_bytes(&ram).unwrap_or(0),
            qemu_rss_bytes: process::rss_bytes(pid).unwrap_or(0),
            qemu_anon_bytes: process::status_bytes(pid, "RssAnon").unwrap_or(0),
            qemu_shmem_bytes: process::status_bytes(pid, "RssShmem").unwrap_or(0),
            qemu_file_bytes: process::status_bytes(pid, "RssFile").unwrap_or(0),
        });
    }
    let accel = statuses[0].accel.as_str().to_string();
    let reason = statuses[0].accel_reason.clone().unwrap_or_default();
    Ok((accel, reason, out))
}
