//! `rebound cluster snapshot` and `rebound cluster graph`: a consistent snapshot of
//! every VM of a cluster (a coordinated pause), its manifest, and the restore
//! dependency graph from the frames recorded after the snapshot point.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use rebound_cluster::snapshot::{stop_at, traffic_of, ManifestVm};
use rebound_cluster::spec::{VmSpec as ClusterVm, PEER_PORT};
use rebound_vmm::paths::Paths;
use serde_json::{json, Value};

// The bench drivers read cluster snapshots by these names.
pub use rebound_cluster::snapshot::{traffic, Manifest};

use super::{enc, Cluster, GraphArgs, HostLink, SnapshotArgs};

pub async fn snapshot(paths: &Paths, a: SnapshotArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let out = crate::cli::common::absolute(&a.out)?;
    let manifest = take(&c, &out, a.trace_s).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&manifest)?);
    } else {
        println!(
            "cluster {} snapshotted into {}: {} VMs, stopped within {:.3} s of each other, all held {:.2} s after the request",
            c.spec.name,
            out.display(),
            c.spec.vms.len(),
            manifest.pause_spread_s,
            manifest.all_held_after_s
        );
    }
    Ok(())
}

/// A consistent snapshot of every VM of `c` into the new directory `out`.
pub(crate) async fn take(c: &Cluster, out: &Path, trace_s: f64) -> anyhow::Result<Manifest> {
    if out.exists() {
        bail!(
            "{} exists already: a snapshot directory must be new",
            out.display()
        );
    }
    rebound_vmm::private::create_dir_all(out)?;
    let t0 = Instant::now();
    // Every VM stops at one instant (see `stop_at`).
    let stop_at = stop_at(rebound_coord::run::unix_now_ns(), trace_s);
    // Every VM is saved and held paused; the requests answer once each is resumed
    // and its trace is done.
    let mut calls = Vec::new();
    for v in &c.spec.vms {
        let client = c.link(&v.host)?;
        let body = json!({
            "out": out.join(&v.name).display().to_string(),
            "trace_s": trace_s,
            "hold": true,
            "netdump": true,
            "stop_at_unix_ns": stop_at,
        });
        let path = format!("/v1/vms/{}/snapshot", enc(&v.name));
        let cl = client.clone();
        calls.push((
            v,
            client,
            tokio::spawn(async move { cl.call(Method::POST, &path, Some(&body)).await }),
        ));
    }
    // Wait until every VM is held (saved, paused) before letting any run on.
    let deadline = Instant::now() + Duration::from_secs(rebound_api::snapshot::HOLD_MAX_S / 2);
    let mut pending: Vec<usize> = (0..calls.len()).collect();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for i in pending {
            let (v, client, h) = &calls[i];
            if h.is_finished() {
                // It answered before being held: it failed.
                let name = v.name.clone();
                break_all(&calls).await;
                let (_, _, h) = calls.swap_remove(i);
                let e = match h.await? {
                    Err(e) => e.to_string(),
                    Ok(_) => "it answered without holding its guest".into(),
                };
                bail!("the snapshot of VM {name:?} failed: {e}; the others were let go");
            }
            if held(client, &v.name, &out.join(&v.name)).await {
                continue;
            }
            still.push(i);
        }
        pending = still;
        if Instant::now() > deadline {
            break_all(&calls).await;
            bail!(
                "not every VM was saved within {} s; the held ones were let go",
                rebound_api::snapshot::HOLD_MAX_S / 2
            );
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let held_s = t0.elapsed().as_secs_f64();
    break_all(&calls).await;
    let mut vms = Vec::new();
    for (v, _, h) in calls {
        let r = h
            .await?
            .with_context(|| format!("the snapshot of VM {:?}", v.name))?;
        vms.push(ManifestVm {
            vm: v.name.clone(),
            host: v.host.clone(),
            ip: v.ip,
            mac: c.mac(v).to_string(),
            dir: v.name.clone(),
            snapshot: r,
            in_flight: 0,
        });
    }
    let mut manifest = Manifest::new(c.spec.clone(), PEER_PORT, held_s, stop_at, vms);
    // The frames in flight at the cut, kept per receiver for the restore to replay.
    let t = traffic_of(out, &manifest, 1)?;
    manifest.keep_in_flight(out, &t.in_flight)?;
    manifest.write(out)?;
    Ok(manifest)
}

/// Resumes every VM (held or not): nothing is left paused.
async fn break_all(calls: &[(&ClusterVm, HostLink, SnapshotCall)]) {
    for (v, client, _) in calls {
        let _ = client
            .call(
                Method::POST,
                &format!("/v1/vms/{}/resume", enc(&v.name)),
                None,
            )
            .await;
    }
}

type SnapshotCall = tokio::task::JoinHandle<anyhow::Result<Value>>;

/// Whether the VM's snapshot into `out` holds it (its `snapshot_held` event is there).
async fn held(client: &HostLink, vm: &str, out: &Path) -> bool {
    let out = out.display().to_string();
    client
        .call(Method::GET, &format!("/v1/vms/{}/events", enc(vm)), None)
        .await
        .is_ok_and(|ev| {
            ev.as_array().is_some_and(|ev| {
                ev.iter()
                    .any(|e| e["kind"] == "snapshot_held" && e["detail"]["out"] == out.as_str())
            })
        })
}

pub fn graph(a: GraphArgs) -> anyhow::Result<()> {
    let (_, t) = traffic(&a.dir, a.min_packets)?;
    if let Some(svg) = &a.svg {
        std::fs::write(svg, t.rdg.to_svg()?)
            .with_context(|| format!("cannot write {}", svg.display()))?;
    }
    let mut flights: std::collections::BTreeMap<(String, String), u64> = Default::default();
    for f in &t.in_flight {
        *flights
            .entry((f.sender.clone(), f.receiver.clone()))
            .or_default() += 1;
    }
    if a.dot {
        print!("{}", t.rdg.to_dot());
    } else if a.json {
        let fl: Vec<Value> = flights
            .iter()
            .map(|((s, r), n)| json!({"sender": s, "receiver": r, "frames": n}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"rdg": t.rdg, "in_flight": fl}))?
        );
    } else {
        println!("edges (sender -> receiver: packets after the snapshot point):");
        for e in &t.rdg.edges {
            println!("  {} -> {}: {}", e.sender, e.receiver, e.packets);
        }
        for (i, r) in t.rdg.rings.iter().enumerate() {
            println!("ring {}: {}", i + 1, r.join(", "));
        }
        if !t.rdg.orphans.is_empty() {
            println!("orphans: {}", t.rdg.orphans.join(", "));
        }
        println!("in flight at the cut: {} frames", t.in_flight.len());
        for ((s, r), n) in &flights {
            println!("  {s} -> {r}: {n}");
        }
    }
    Ok(())
}
