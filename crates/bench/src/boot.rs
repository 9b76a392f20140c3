//! `rebound bench boot`: boots the default image N times side by side and reports
//! spawn→agent-ready time and the memory an idle guest costs the host (allocated
//! bytes of its RAM file and QEMU's RSS after settling). A guest that does not boot
//! is recorded and left out of the figures, the others are measured, and the run
//! exits non-zero at the end.

use std::time::Duration;

use rebound_api::{VmSpec, VmStatus};
use rebound_client::{connect, Client, ClientError};
use rebound_vmm::paths::Paths;
use rebound_vmm::process;
use serde::Serialize;

use crate::guest::{create, post, remove};
use crate::rounds::{Failure, Incomplete};

/// Why the boot benchmark did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--runs must be at least 1")]
    NoRuns,
    #[error("no daemon to boot the guests")]
    Connect(#[source] ClientError),
    #[error(transparent)]
    Incomplete(#[from] Incomplete),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
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

/// Over the guests that booted; `None` when none did.
fn summary(mut v: Vec<u64>) -> Option<Summary> {
    v.sort_unstable();
    Some(Summary {
        min: *v.first()?,
        median: v[v.len() / 2],
        max: v[v.len() - 1],
    })
}

pub async fn run(
    paths: &Paths,
    runs: usize,
    memory: u64,
    settle: u64,
    parallel: bool,
    json: bool,
) -> Result<(), Error> {
    let how = if parallel {
        "side by side"
    } else {
        "one after another"
    };
    if runs == 0 {
        return Err(Error::NoRuns);
    }
    let c = connect(paths).await.map_err(Error::Connect)?;
    let names: Vec<String> = (0..runs)
        .map(|i| format!("bench-{}-{i}", std::process::id()))
        .collect();
    let result = measure(&c, &names, memory, settle, parallel, json).await;
    for n in &names {
        remove(&c, n).await;
    }
    let (accel, reason, runs, failures) = result;
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
            "runs": runs, "failures": failures, "ready_ms": ready, "ram_file_bytes": ram, "qemu_rss_bytes": rss,
            "qemu_anon_bytes": anon, "qemu_shmem_bytes": shmem, "qemu_file_bytes": file,
        });
        println!("{}", serde_json::to_string_pretty(&v).map_err(Error::Json)?);
    } else {
        println!(
            "rebound bench boot: {} of {} guests booted {how} (the figures are theirs), {memory} MiB each, accel {accel} ({reason}), {date}",
            runs.len(),
            names.len()
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
            let Some(sm) = sm else {
                println!("{label:<22} -");
                continue;
            };
            println!(
                "{label:<22} min {:>10}  median {:>10}  max {:>10}",
                f(sm.min),
                f(sm.median),
                f(sm.max)
            );
        }
        for f in &failures {
            println!("{}", f.line());
        }
    }
    Incomplete::check(&failures, names.len())?;
    Ok(())
}

async fn measure(
    c: &Client,
    names: &[String],
    memory: u64,
    settle: u64,
    parallel: bool,
    json: bool,
) -> (String, String, Vec<Run>, Vec<Failure>) {
    // One at a time unless asked: concurrent TCG boots on a small host measure CPU
    // contention, not boot time. Earlier guests stay up (idle) for the memory figures.
    let waves: Vec<&[String]> = if parallel {
        vec![names]
    } else {
        names.chunks(1).collect()
    };
    let mut statuses = Vec::new();
    let mut failures = Vec::new();
    let round = |n: &String| names.iter().position(|x| x == n).unwrap_or(0);
    for wave in waves {
        let mut created = Vec::new();
        for n in wave {
            let mut s = VmSpec::new(n);
            s.memory_mib = memory;
            match create(c, &s).await {
                Ok(_) => created.push(n),
                Err(e) => failures.push(Failure::new("boot", round(n), &e)),
            }
        }
        for n in created {
            let v: VmStatus = match post(
                c,
                &format!("/v1/vms/{n}/wait?for=ready&timeout_ms=600000"),
                None,
            )
            .await
            {
                Ok(v) => v,
                Err(e) => {
                    failures.push(Failure::new("boot", round(n), &e));
                    continue;
                }
            };
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
    let first = statuses.first();
    let accel = first.map_or("unknown", |v| v.accel.as_str()).to_string();
    let reason = first
        .and_then(|v| v.accel_reason.clone())
        .unwrap_or_default();
    (accel, reason, out, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_over_the_guests_that_booted() {
        let s = summary(vec![900, 700, 800]).expect("three booted");
        assert_eq!((s.min, s.median, s.max), (700, 800, 900));
        // No guest booted: no figures, not zeros.
        assert!(summary(Vec::new()).is_none());
    }
}
