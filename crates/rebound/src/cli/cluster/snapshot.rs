//! `rebound cluster snapshot` and `rebound cluster graph`: a consistent snapshot of
//! every VM of a cluster (a coordinated pause), its manifest, and the restore
//! dependency graph from the frames recorded after the snapshot point.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use std::net::Ipv4Addr;

use rebound_cluster::spec::{ClusterSpec, VmSpec as ClusterVm, PEER_PORT};
use rebound_vmm::paths::Paths;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{enc, Cluster, GraphArgs, HostLink, SnapshotArgs};

/// The cluster manifest written next to the VMs' snapshots.
pub const MANIFEST: &str = "cluster.json";
const FORMAT: &str = "rebound-cluster-snapshot";
const VERSION: u32 = 1;
/// The largest manifest read back (a cluster of the most VMs is far smaller).
const MANIFEST_MAX: u64 = 16 << 20;
/// Seconds past the working-set sample at which every VM of a snapshot stops.
const STOP_MARGIN_S: f64 = 1.5;

/// `cluster.json`: the cluster as it was, and where each VM's snapshot is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub cluster: ClusterSpec,
    pub peer_port: u16,
    /// Seconds from the request until every VM was saved and held.
    pub all_held_after_s: f64,
    /// Seconds between the first and the last VM's stop (the pause instants the
    /// daemons report on their wall clocks).
    #[serde(default)]
    pub pause_spread_s: f64,
    /// The instant every VM was asked to stop at (Unix ns, the coordinator's clock).
    #[serde(default)]
    pub stop_at_unix_ns: i64,
    pub vms: Vec<ManifestVm>,
}

/// One VM of a cluster snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestVm {
    pub vm: String,
    pub host: String,
    pub ip: Ipv4Addr,
    pub mac: String,
    /// Its snapshot directory, relative to the cluster snapshot's.
    pub dir: String,
    /// The daemon's answer to its snapshot.
    pub snapshot: Value,
    /// Frames in flight to it at the cut, kept in `DIR/<dir>/inflight-rx.pcap` and
    /// replayed into it at a restore.
    #[serde(default)]
    pub in_flight: u64,
}

/// The in-flight frames file of a VM of a cluster snapshot.
pub const INFLIGHT: &str = "inflight-rx.pcap";

/// Each VM's in-flight frames file, for the VMs that have frames to replay.
pub fn replay_files(dir: &Path, m: &Manifest) -> std::collections::BTreeMap<String, PathBuf> {
    m.vms
        .iter()
        .filter(|v| v.in_flight > 0)
        .map(|v| (v.vm.clone(), dir.join(&v.dir).join(INFLIGHT)))
        .collect()
}

impl Manifest {
    /// Reads and checks `DIR/cluster.json`.
    pub fn read(dir: &Path) -> anyhow::Result<Manifest> {
        let mpath = dir.join(MANIFEST);
        let f = std::fs::File::open(&mpath).with_context(|| {
            format!(
                "{} is not a cluster snapshot (no {MANIFEST})",
                dir.display()
            )
        })?;
        let mut text = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(f, MANIFEST_MAX + 1), &mut text)?;
        if text.len() as u64 > MANIFEST_MAX {
            bail!(
                "{} is larger than {} MiB: not a cluster manifest",
                mpath.display(),
                MANIFEST_MAX >> 20
            );
        }
        let head: Value = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not valid JSON", mpath.display()))?;
        if head["format"] != FORMAT {
            bail!("{} is not a cluster snapshot manifest", mpath.display());
        }
        if head["version"] != VERSION {
            bail!(
                "{} has version {}; this build reads version {VERSION}",
                mpath.display(),
                head["version"]
            );
        }
        let m: Manifest = serde_json::from_value(head)
            .map_err(|e| anyhow::anyhow!("{}: {e}", mpath.display()))?;
        if m.vms.is_empty() {
            bail!("{} lists no VMs", mpath.display());
        }
        let mut seen = std::collections::HashSet::new();
        for v in &m.vms {
            if !seen.insert(&v.vm) {
                bail!("{}: VM {:?} is listed twice", mpath.display(), v.vm);
            }
            if v.dir.is_empty() || v.dir.contains('/') || v.dir == ".." || v.dir == "." {
                bail!(
                    "{}: VM directory {:?} is not inside the snapshot",
                    mpath.display(),
                    v.dir
                );
            }
        }
        Ok(m)
    }
}

pub async fn snapshot(paths: &Paths, a: SnapshotArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let out = crate::cli::snapshot::absolute(&a.out)?;
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
    // Every VM stops at one instant, after its working-set sample (`trace_s`) and a
    // margin for arming it on a busy host: stopped one by one as each sample ended,
    // they stopped up to a second apart, and a guest still running declared its
    // stopped peers dead before its own snapshot point, where the restores inherit it.
    // Hosts' clocks are assumed synchronized (NTP: milliseconds); the manifest says how
    // far apart the stops were.
    let stop_at =
        rebound_coord::msg::unix_now_ns() + ((trace_s.max(0.0) + STOP_MARGIN_S) * 1e9) as i64;
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
    let stops: Vec<i64> = vms
        .iter()
        .filter_map(|v| v.snapshot["paused_unix_ns"].as_i64())
        .collect();
    let pause_spread_s = match (stops.iter().min(), stops.iter().max()) {
        (Some(a), Some(b)) => (b - a) as f64 / 1e9,
        _ => 0.0,
    };
    let mut manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        cluster: c.spec.clone(),
        peer_port: PEER_PORT,
        all_held_after_s: held_s,
        pause_spread_s,
        stop_at_unix_ns: stop_at,
        vms,
    };
    // The frames in flight at the cut, kept per receiver for the restore to replay.
    let t = traffic_of(out, &manifest, 1)?;
    for v in &mut manifest.vms {
        let path = out.join(&v.dir).join(INFLIGHT);
        v.in_flight = rebound_cluster::inflight::write_replay(&t.in_flight, &v.vm, &path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if v.in_flight == 0 {
            let _ = std::fs::remove_file(&path);
        }
    }
    // Written whole, then renamed: a cluster snapshot without its manifest is not one.
    let tmp = out.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&manifest)?)?;
    std::fs::rename(&tmp, out.join(MANIFEST))?;
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

/// A cluster snapshot's traffic after the snapshot point, its graph and the frames in
/// flight at the cut.
pub struct Traffic {
    pub rdg: rebound_cluster::Rdg,
    pub in_flight: Vec<rebound_cluster::inflight::InFlight>,
}

/// Reads a cluster snapshot's manifest and dumps.
pub fn traffic(dir: &Path, min_packets: u64) -> anyhow::Result<(Manifest, Traffic)> {
    let m = Manifest::read(dir)?;
    let t = traffic_of(dir, &m, min_packets)?;
    Ok((m, t))
}

/// The dumps of the cluster snapshot in `dir` whose manifest is `m`.
pub(crate) fn traffic_of(dir: &Path, m: &Manifest, min_packets: u64) -> anyhow::Result<Traffic> {
    let mut ep = rebound_cluster::Endpoints::new();
    let (mut rx, mut tx) = (Vec::new(), Vec::new());
    for v in &m.vms {
        ep.add_ipv4(v.ip, &v.vm)?;
        for (q, list) in [("rx", &mut rx), ("tx", &mut tx)] {
            list.push(rebound_cluster::DumpFile {
                vm: v.vm.clone(),
                path: dir.join(&v.dir).join(format!("net1-{q}.pcap")),
            });
        }
    }
    let opts = rebound_cluster::pcap::PcapOptions::default();
    let mut b = rebound_cluster::TrafficBuilder::new(ep.clone());
    for d in tx.iter().chain(&rx) {
        b.add_dump_file(&d.vm, &d.path, opts)
            .with_context(|| format!("{}", d.path.display()))?;
    }
    let (matrix, _) = b.finish();
    let rdg = rebound_cluster::Rdg::from_matrix(&matrix, min_packets);
    let in_flight = rebound_cluster::inflight::in_flight(&ep, &rx, &tx, opts)?;
    Ok(Traffic { rdg, in_flight })
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
