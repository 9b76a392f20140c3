//! `rebound cluster ...`: a cluster of VMs on several hosts, described by a
//! `cluster.toml` ([`rebound_cluster::spec`]).
//!
//! The CLI is the controller: it keeps the cluster's file and state under
//! `$REBOUND_HOME/clusters/NAME/`, sets up simulated hosts (a network namespace each,
//! with a bridge joined to the others through a backbone bridge, and a daemon of its
//! own started with `--netns`), and drives each host's daemon. A simulated host's
//! daemon is reached on its unix socket (it runs on this machine).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyper::Method;
use rebound_cluster::spec::{ClusterSpec, HostSpec, VmSpec as ClusterVm, PEER_PORT};
use rebound_vmm::paths::Paths;
use serde_json::{json, Value};

use crate::client::Client;

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Record a cluster from its file and set up its simulated hosts (namespaces,
    /// bridges, one daemon each).
    Create(CreateArgs),
    /// Start every VM of the cluster on its host and wait until all are ready.
    Start(NameArgs),
    /// Each VM's host, address, state and readiness.
    Status(NameArgs),
    /// Stop every VM (the guests power off).
    Stop(NameArgs),
    /// Kill and remove every VM, stop the simulated hosts' daemons, remove their
    /// namespaces and the cluster's state.
    Rm(NameArgs),
    /// A consistent snapshot of every VM: all are paused and saved before any runs
    /// on; each bridge NIC's frames are recorded from the snapshot point on.
    Snapshot(SnapshotArgs),
    /// The restore dependency graph of a cluster snapshot, from the frames recorded
    /// after its snapshot point: who sends to whom (with counts), rings, orphans, and
    /// the frames in flight at the cut.
    Graph(GraphArgs),
    /// Make a new cluster token file (mode 600, 32 random bytes as hex); copy it to
    /// every host and start each daemon with `--cluster-token FILE`.
    Token(super::cluster_restore::TokenArgs),
    /// Restore a plan across hosts' daemons, coordinated by this host's daemon (which
    /// must run with `--cluster-token`); fails unless every VM is restored.
    Restore(super::cluster_restore::RestoreArgs),
    /// One call of another host's daemon API through its cohort's relay (`--listen`);
    /// prints the JSON answer.
    Call(super::cluster_restore::CallArgs),
}

#[derive(Args, Debug)]
pub struct GraphArgs {
    /// A cluster snapshot directory (`rebound cluster snapshot --out`).
    pub dir: PathBuf,
    /// Print the graph in Graphviz's DOT language.
    #[arg(long, conflicts_with = "json")]
    pub dot: bool,
    /// Also draw it to this SVG file (with Graphviz's `dot`).
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Only edges with at least this many packets.
    #[arg(long, default_value_t = 1)]
    pub min_packets: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    pub name: String,
    /// The cluster file (`cluster.toml`).
    #[arg(long)]
    pub file: PathBuf,
}

#[derive(Args, Debug)]
pub struct NameArgs {
    pub name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    pub name: String,
    /// The snapshot directory (each VM's snapshot in `DIR/<vm>`, the cluster's
    /// manifest in `DIR/cluster.json`); it must not exist yet. Hosts must all see it
    /// at this path.
    #[arg(long)]
    pub out: PathBuf,
    /// Seconds of post-snapshot trace and packet recording.
    #[arg(long, default_value_t = 8.0)]
    pub trace_s: f64,
    #[arg(long)]
    pub json: bool,
}

/// A cluster's state directory and its checked spec.
struct Cluster {
    dir: PathBuf,
    spec: ClusterSpec,
    paths: Paths,
}

fn valid_cluster_name(n: &str) -> bool {
    (1..=24).contains(&n.len())
        && n.as_bytes()[0].is_ascii_alphanumeric()
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A short, stable hash for interface names (15 bytes at most).
fn short(s: &str) -> String {
    format!("{:08x}", rebound_api::nic::short_hash(s))
}

impl Cluster {
    fn dir_of(paths: &Paths, name: &str) -> PathBuf {
        paths.home.join("clusters").join(name)
    }

    fn open(paths: &Paths, name: &str) -> anyhow::Result<Cluster> {
        let dir = Self::dir_of(paths, name);
        let file = dir.join("cluster.toml");
        let text = std::fs::read_to_string(&file).map_err(|_| {
            anyhow::anyhow!(
                "no cluster {name:?} (rebound cluster create {name} --file cluster.toml)"
            )
        })?;
        let spec = ClusterSpec::parse(&text, name)?;
        Ok(Cluster {
            dir,
            spec,
            paths: paths.clone(),
        })
    }

    fn netns(&self, h: &HostSpec) -> String {
        format!("rb-{}-{}", self.spec.name, h.name)
    }

    fn backbone(&self) -> String {
        format!("rbb{}", short(&self.spec.name))
    }

    fn host_home(&self, h: &HostSpec) -> PathBuf {
        self.dir.join("hosts").join(&h.name)
    }

    fn host_run(&self, h: &HostSpec) -> PathBuf {
        self.paths
            .run
            .join(format!("cluster-{}-{}", self.spec.name, h.name))
    }

    /// The daemon of the host `vm` runs on.
    fn client(&self, host: &str) -> anyhow::Result<Client> {
        let h = self
            .spec
            .host(host)
            .with_context(|| format!("no host {host:?}"))?;
        if !h.simulated {
            bail!(
                "host {:?} is a real host ({}): driving real hosts' daemons from here needs the authenticated relay, which this build does not have yet",
                h.name,
                h.daemon
            );
        }
        Ok(Client::new(&self.host_home(h).join("reboundd.sock")))
    }

    /// The API spec of one VM of the cluster.
    fn vm_spec(&self, v: &ClusterVm) -> anyhow::Result<rebound_api::VmSpec> {
        let mut s = rebound_api::VmSpec::new(&v.name);
        s.image = Some(v.image.clone().unwrap_or_else(|| "default".into()));
        if let Some(m) = &v.memory {
            let bytes = rebound_api::spec::parse_size(m)
                .with_context(|| format!("VM {:?}: memory {m:?}", v.name))?;
            s.memory_mib = bytes >> 20;
        }
        if let Some(c) = v.cpus {
            s.cpus = c;
        }
        if let Some(w) = &v.workload {
            s.workload = Some(w.parse()?);
        }
        s.workload_args = v.workload_args.clone();
        if s.workload == Some(rebound_api::Workload::Peer) {
            let peers: Vec<String> = self
                .spec
                .peer_addrs(v)
                .iter()
                .map(|a| a.to_string())
                .collect();
            if !peers.is_empty() {
                s.workload_args.insert("peers".into(), peers.join(","));
            }
        }
        let mac = rebound_api::nic::Mac::for_vm(&format!("{}/{}", self.spec.name, v.name), 0);
        s.nics = vec![format!(
            "bridge={},mac={mac},ip={}/{}",
            self.spec.bridge, v.ip, self.spec.subnet.1
        )];
        s.validate()
            .with_context(|| format!("VM {:?} of the cluster file", v.name))?;
        Ok(s)
    }
}

pub async fn run(paths: &Paths, c: ClusterCmd) -> anyhow::Result<()> {
    match c {
        ClusterCmd::Create(a) => create(paths, a).await,
        ClusterCmd::Start(a) => start(paths, a).await,
        ClusterCmd::Status(a) => status(paths, a).await,
        ClusterCmd::Stop(a) => stop(paths, a).await,
        ClusterCmd::Rm(a) => rm(paths, a).await,
        ClusterCmd::Snapshot(a) => snapshot(paths, a).await,
        ClusterCmd::Graph(a) => graph(a),
        ClusterCmd::Token(a) => super::cluster_restore::token(a),
        ClusterCmd::Restore(a) => super::cluster_restore::restore(paths, a).await,
        ClusterCmd::Call(a) => super::cluster_restore::call(a).await,
    }
}

async fn create(paths: &Paths, a: CreateArgs) -> anyhow::Result<()> {
    if !valid_cluster_name(&a.name) {
        bail!(
            "invalid cluster name {:?}: use 1-24 letters, digits, '-' or '_', starting with a letter or digit",
            a.name
        );
    }
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let spec = ClusterSpec::parse(&text, &a.name)?;
    for v in &spec.vms {
        // Every VM's spec must be one the daemons take, before anything is set up.
        let c = Cluster {
            dir: PathBuf::new(),
            spec: spec.clone(),
            paths: paths.clone(),
        };
        c.vm_spec(v)?;
    }
    let dir = Cluster::dir_of(paths, &a.name);
    if dir.join("cluster.toml").exists() {
        bail!(
            "cluster {:?} exists already (rebound cluster rm {0} first)",
            a.name
        );
    }
    rebound_vmm::private::create_dir_all(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("cluster.toml"), &text)?;
    let c = Cluster::open(paths, &a.name)?;
    let r = hosts_up(&c).await;
    if let Err(e) = r {
        // Nothing half made stays behind.
        hosts_down(&c).await;
        let _ = std::fs::remove_dir_all(&c.dir);
        return Err(e);
    }
    println!(
        "cluster {} created: {} hosts, {} VMs on {}/{}",
        c.spec.name,
        c.spec.hosts.len(),
        c.spec.vms.len(),
        c.spec.subnet.0,
        c.spec.subnet.1
    );
    Ok(())
}

/// Namespaces, bridges, backbone, and a daemon per simulated host.
async fn hosts_up(c: &Cluster) -> anyhow::Result<()> {
    let sims: Vec<&HostSpec> = c.spec.hosts.iter().filter(|h| h.simulated).collect();
    if sims.is_empty() {
        return Ok(());
    }
    let bb = c.backbone();
    rebound_vmm::net::backbone_up(&bb, Some(c.spec.backbone_addr()))
        .context("cannot set up the backbone bridge (root is needed)")?;
    for h in sims {
        let sim = rebound_vmm::net::SimHost {
            netns: c.netns(h),
            bridge: c.spec.bridge.clone(),
            addr: Some((*h.daemon.ip(), c.spec.subnet.1)),
        };
        let link = format!("rbv{}", short(&format!("{}/{}", c.spec.name, h.name)));
        rebound_vmm::net::host_up(&sim, &bb, &link)
            .with_context(|| format!("cannot set up simulated host {:?}", h.name))?;
        start_host_daemon(c, h).await?;
    }
    Ok(())
}

async fn start_host_daemon(c: &Cluster, h: &HostSpec) -> anyhow::Result<()> {
    let home = c.host_home(h);
    rebound_vmm::private::create_dir_all(&home)?;
    // The host's daemon boots the same images as this one.
    let images = home.join("images");
    if !images.exists() {
        std::os::unix::fs::symlink(c.paths.home.join("images"), &images)
            .with_context(|| format!("cannot link {}", images.display()))?;
    }
    let client = Client::new(&home.join("reboundd.sock"));
    if client.is_up().await {
        return Ok(());
    }
    let log = home.join("reboundd.log");
    let out = rebound_vmm::private::create_file(&log, true)?;
    let err = out.try_clone()?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["daemon", "--netns", &c.netns(h)])
        .env("REBOUND_HOME", &home)
        .env("REBOUND_RUN", c.host_run(h))
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    rebound_vmm::process::new_session(&mut cmd);
    let mut child = cmd.spawn().context("cannot start a host's daemon")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !client.is_up().await {
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "the daemon of host {:?} exited ({st}); see {}",
                h.name,
                log.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the daemon of host {:?} did not answer within 15 s; see {}",
                h.name,
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// Stops the simulated hosts' daemons and removes their namespaces and the backbone.
async fn hosts_down(c: &Cluster) {
    for h in c.spec.hosts.iter().filter(|h| h.simulated) {
        let client = Client::new(&c.host_home(h).join("reboundd.sock"));
        if client.is_up().await {
            let _ = client
                .call::<Value>(Method::POST, "/v1/daemon/shutdown", None)
                .await;
        }
        if let Err(e) = rebound_vmm::net::host_down(&c.netns(h)) {
            eprintln!("warning: {e}");
        }
        let _ = std::fs::remove_dir_all(c.host_run(h));
    }
    if let Err(e) = rebound_vmm::net::backbone_down(&c.backbone()) {
        eprintln!("warning: {e}");
    }
}

use super::vm::enc;

async fn start(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let t0 = Instant::now();
    let mut started = Vec::new();
    for v in &c.spec.vms {
        let client = c.client(&v.host)?;
        let spec = c.vm_spec(v)?;
        client
            .call::<Value>(Method::POST, "/v1/vms", Some(&serde_json::to_value(&spec)?))
            .await
            .with_context(|| format!("VM {:?} on host {:?}", v.name, v.host))?;
        eprintln!("started {} on {} ({})", v.name, v.host, v.ip);
        started.push((v, client));
    }
    for (v, client) in &started {
        client
            .call::<Value>(
                Method::POST,
                &format!("/v1/vms/{}/wait?for=ready&timeout_ms=300000", enc(&v.name)),
                None,
            )
            .await
            .with_context(|| format!("VM {:?} never became ready", v.name))?;
    }
    println!(
        "cluster {}: {} VMs ready in {:.1} s",
        c.spec.name,
        started.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn status(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let mut rows = Vec::new();
    for v in &c.spec.vms {
        let st = match c.client(&v.host) {
            Ok(cl) => cl
                .call::<Value>(Method::GET, &format!("/v1/vms/{}", enc(&v.name)), None)
                .await
                .unwrap_or_else(|e| json!({ "state": "unknown", "error": e.to_string() })),
            Err(e) => json!({ "state": "unknown", "error": e.to_string() }),
        };
        rows.push(json!({
            "vm": v.name,
            "host": v.host,
            "ip": v.ip.to_string(),
            "peers": v.peers,
            "state": st["state"],
            "ready": st["ready"],
            "error": st.get("error"),
        }));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<16} {:<8} {:<15} {:<10} {:<6} peers",
        "vm", "host", "ip", "state", "ready"
    );
    for r in rows {
        println!(
            "{:<16} {:<8} {:<15} {:<10} {:<6} {}",
            r["vm"].as_str().unwrap_or(""),
            r["host"].as_str().unwrap_or(""),
            r["ip"].as_str().unwrap_or(""),
            r["state"].as_str().unwrap_or("unknown"),
            r["ready"]
                .as_bool()
                .map_or("-", |b| if b { "yes" } else { "no" }),
            r["peers"]
                .as_array()
                .map(|p| p
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default()
        );
    }
    Ok(())
}

async fn stop(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    for v in &c.spec.vms {
        let client = c.client(&v.host)?;
        match client
            .call::<Value>(
                Method::POST,
                &format!("/v1/vms/{}/stop", enc(&v.name)),
                None,
            )
            .await
        {
            Ok(_) => eprintln!("stopped {}", v.name),
            Err(e) => eprintln!("{}: {e}", v.name),
        }
    }
    Ok(())
}

async fn rm(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    for v in &c.spec.vms {
        let Ok(client) = c.client(&v.host) else {
            continue;
        };
        if !client.is_up().await {
            continue;
        }
        let path = format!("/v1/vms/{}", enc(&v.name));
        if client
            .call::<Value>(Method::GET, &path, None)
            .await
            .is_err()
        {
            continue;
        }
        let _ = client
            .call::<Value>(Method::POST, &format!("{path}/kill"), None)
            .await;
        let _ = client
            .call::<Value>(
                Method::POST,
                &format!("{path}/wait?for=stopped&timeout_ms=20000"),
                None,
            )
            .await;
        client
            .call::<Value>(Method::DELETE, &path, None)
            .await
            .with_context(|| format!("cannot remove VM {:?}", v.name))?;
    }
    hosts_down(&c).await;
    std::fs::remove_dir_all(&c.dir)
        .with_context(|| format!("cannot remove {}", c.dir.display()))?;
    println!("cluster {} removed", c.spec.name);
    Ok(())
}

/// The cluster manifest written next to the VMs' snapshots.
pub const MANIFEST: &str = "cluster.json";

async fn snapshot(paths: &Paths, a: SnapshotArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let out = super::snapshot::absolute(&a.out)?;
    if out.exists() {
        bail!(
            "{} exists already: a snapshot directory must be new",
            out.display()
        );
    }
    rebound_vmm::private::create_dir_all(&out)?;
    let t0 = Instant::now();
    // Every VM is saved and held paused; the requests answer once each is resumed
    // and its trace is done.
    let mut calls = Vec::new();
    for v in &c.spec.vms {
        let client = c.client(&v.host)?;
        let body = json!({
            "out": out.join(&v.name).display().to_string(),
            "trace_s": a.trace_s,
            "hold": true,
            "netdump": true,
        });
        let path = format!("/v1/vms/{}/snapshot", enc(&v.name));
        let cl = client.clone();
        calls.push((
            v,
            client,
            tokio::spawn(async move { cl.call::<Value>(Method::POST, &path, Some(&body)).await }),
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
        vms.push(json!({
            "vm": v.name,
            "host": v.host,
            "ip": v.ip.to_string(),
            "mac": rebound_api::nic::Mac::for_vm(&format!("{}/{}", c.spec.name, v.name), 0).to_string(),
            "dir": v.name,
            "snapshot": r,
        }));
    }
    let manifest = json!({
        "format": "rebound-cluster-snapshot",
        "version": 1,
        "cluster": c.spec,
        "peer_port": PEER_PORT,
        "all_held_after_s": held_s,
        "vms": vms,
    });
    std::fs::write(out.join(MANIFEST), serde_json::to_vec_pretty(&manifest)?)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&manifest)?);
    } else {
        println!(
            "cluster {} snapshotted into {}: {} VMs, all held {:.2} s after the request",
            c.spec.name,
            out.display(),
            c.spec.vms.len(),
            held_s
        );
    }
    Ok(())
}

/// Resumes every VM (held or not): nothing is left paused.
async fn break_all(calls: &[(&ClusterVm, Client, SnapshotCall)]) {
    for (v, client, _) in calls {
        let _ = client
            .call::<Value>(
                Method::POST,
                &format!("/v1/vms/{}/resume", enc(&v.name)),
                None,
            )
            .await;
    }
}

type SnapshotCall = tokio::task::JoinHandle<Result<Value, crate::client::ClientError>>;

/// Whether the VM's snapshot into `out` holds it (its `snapshot_held` event is there).
async fn held(client: &Client, vm: &str, out: &Path) -> bool {
    let out = out.display().to_string();
    client
        .call::<Vec<Value>>(Method::GET, &format!("/v1/vms/{}/events", enc(vm)), None)
        .await
        .is_ok_and(|ev| {
            ev.iter()
                .any(|e| e["kind"] == "snapshot_held" && e["detail"]["out"] == out.as_str())
        })
}

/// A cluster snapshot's traffic after the snapshot point, its graph and the frames in
/// flight at the cut.
pub struct Traffic {
    pub rdg: rebound_cluster::Rdg,
    pub in_flight: Vec<rebound_cluster::inflight::InFlight>,
}

/// Reads a cluster snapshot's manifest and dumps.
pub fn traffic(dir: &Path, min_packets: u64) -> anyhow::Result<(Value, Traffic)> {
    let mpath = dir.join(MANIFEST);
    let text = std::fs::read(&mpath).with_context(|| {
        format!(
            "{} is not a cluster snapshot (no {MANIFEST})",
            dir.display()
        )
    })?;
    let m: Value = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not valid JSON", mpath.display()))?;
    if m["format"] != "rebound-cluster-snapshot" {
        bail!("{} is not a cluster snapshot manifest", mpath.display());
    }
    if m["version"] != 1 {
        bail!(
            "{} has version {}; this build reads version 1",
            mpath.display(),
            m["version"]
        );
    }
    let vms = m["vms"]
        .as_array()
        .filter(|v| !v.is_empty())
        .with_context(|| format!("{} lists no VMs", mpath.display()))?;
    let mut ep = rebound_cluster::Endpoints::new();
    let (mut rx, mut tx) = (Vec::new(), Vec::new());
    for v in vms {
        let (Some(name), Some(ip), Some(sub)) = (
            v["vm"].as_str(),
            v["ip"].as_str().and_then(|i| i.parse().ok()),
            v["dir"].as_str(),
        ) else {
            bail!(
                "{}: a VM entry lacks its name, address or directory",
                mpath.display()
            );
        };
        if sub.contains('/') || sub == ".." {
            bail!(
                "{}: VM directory {sub:?} is not inside the snapshot",
                mpath.display()
            );
        }
        ep.add_ipv4(ip, name)?;
        for (q, list) in [("rx", &mut rx), ("tx", &mut tx)] {
            list.push(rebound_cluster::DumpFile {
                vm: name.to_string(),
                path: dir.join(sub).join(format!("net1-{q}.pcap")),
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
    Ok((m, Traffic { rdg, in_flight }))
}

fn graph(a: GraphArgs) -> anyhow::Result<()> {
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
