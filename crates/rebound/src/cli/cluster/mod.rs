//! `rebound cluster ...`: a cluster of VMs on several hosts, described by a
//! `cluster.toml` ([`rebound_cluster::spec`]).
//!
//! The CLI is the controller: it keeps the cluster's file and state under
//! `$REBOUND_HOME/clusters/NAME/`, sets up simulated hosts (a network namespace each,
//! with a bridge joined to the others through a backbone bridge, and a daemon of its
//! own started with `--netns`), and drives each host's daemon. A simulated host's
//! daemon is reached on its unix socket (it runs on this machine).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use hyper::Method;
use rebound_cluster::spec::{ClusterSpec, HostSpec, VmSpec as ClusterVm};
use rebound_vmm::paths::Paths;
use serde_json::json;

mod coord;
mod host;
mod identity;
mod report;
pub(crate) mod restore;
pub(crate) mod snapshot;
mod store;
pub use store::StoreArgs;

use host::{daemons_up, hosts_down, hosts_up, HostLink};

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Record a cluster from its file and set up its simulated hosts (namespaces,
    /// bridges, one daemon each).
    Create(CreateArgs),
    /// Start every VM of the cluster on its host and wait until all are ready; run
    /// again, it starts what is down (a host's daemon, a store member, a VM) and
    /// leaves what runs.
    Start(NameArgs),
    /// Each VM's host, address, state and readiness.
    Status(StatusArgs),
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
    /// Restore a cluster snapshot (or a plan) through the cluster store: the hosts'
    /// daemons load, hold and start their VMs, one of them coordinating; fails
    /// unless every VM is restored.
    Restore(coord::RestoreArgs),
    /// Make a CA and certificates for a cluster store (test and small setups): per
    /// host one with CN `rebound-host-<host>`, and the operator's with CN `root`.
    Certs(identity::CertsArgs),
    /// Give every host its etcd user and role (it writes only its own keys) and turn
    /// etcd's authentication on; again with more hosts to add them.
    StoreInit(identity::StoreInitArgs),
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
pub struct StatusArgs {
    /// A cluster made here (its simulated hosts' store); or give --etcd.
    #[arg(required_unless_present = "etcd")]
    pub name: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
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
pub(crate) struct Cluster {
    pub(crate) dir: PathBuf,
    pub(crate) spec: ClusterSpec,
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

    /// The MAC of a VM's cluster NIC: a function of the cluster and VM names.
    fn mac(&self, v: &ClusterVm) -> rebound_api::nic::Mac {
        rebound_api::nic::Mac::for_vm(&format!("{}/{}", self.spec.name, v.name), 0)
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
        let mac = self.mac(v);
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
        ClusterCmd::Snapshot(a) => snapshot::snapshot(paths, a).await,
        ClusterCmd::Graph(a) => snapshot::graph(a),
        ClusterCmd::Restore(a) => coord::restore(paths, a).await,
        ClusterCmd::Certs(a) => identity::certs(a),
        ClusterCmd::StoreInit(a) => identity::store_init(a).await,
    }
}

async fn create(paths: &Paths, a: CreateArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("cannot read {}", a.file.display()))?;
    let c = create_cluster(paths, &a.name, &text).await?;
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

/// Records a cluster from its file's text and sets up its simulated hosts; nothing
/// half made stays behind on failure.
pub(crate) async fn create_cluster(
    paths: &Paths,
    name: &str,
    text: &str,
) -> anyhow::Result<Cluster> {
    let a = (name, text);
    if !valid_cluster_name(name) {
        bail!(
            "invalid cluster name {name:?}: use 1-24 letters, digits, '-' or '_', starting with a letter or digit"
        );
    }
    let (name, text) = a;
    let spec = ClusterSpec::parse(text, name)?;
    for v in &spec.vms {
        // Every VM's spec must be one the daemons take, before anything is set up.
        let c = Cluster {
            dir: PathBuf::new(),
            spec: spec.clone(),
            paths: paths.clone(),
        };
        c.vm_spec(v)?;
    }
    let dir = Cluster::dir_of(paths, name);
    if dir.join("cluster.toml").exists() {
        bail!("cluster {name:?} exists already (rebound cluster rm {name} first)");
    }
    rebound_vmm::private::create_dir_all(&dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(dir.join("cluster.toml"), text)?;
    let c = Cluster::open(paths, name)?;
    let r = hosts_up(&c).await;
    if let Err(e) = r {
        // Nothing half made stays behind.
        hosts_down(&c).await;
        let _ = std::fs::remove_dir_all(&c.dir);
        return Err(e);
    }
    Ok(c)
}

use super::common::enc;

async fn start(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    let t0 = Instant::now();
    start_vms(&c).await?;
    println!(
        "cluster {}: {} VMs ready in {:.1} s",
        c.spec.name,
        c.spec.vms.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Starts every VM of the cluster on its host and waits until all are ready.
pub(crate) async fn start_vms(c: &Cluster) -> anyhow::Result<()> {
    daemons_up(c).await?;
    let restoring = restoring(c).await?;
    let mut started = Vec::new();
    for v in &c.spec.vms {
        if let Some(id) = restoring.get(&(v.name.clone(), v.host.clone())) {
            // Its host loads it for the restore (a restarted daemon carries on).
            eprintln!("{} on {} is left to restore {id}", v.name, v.host);
            continue;
        }
        let client = c.link(&v.host)?;
        // Run again after a host's daemon or store member died, it brings back what
        // is down and leaves the VMs that run (the daemon took them back) alone.
        let path = format!("/v1/vms/{}", enc(&v.name));
        if let Ok(st) = client.call(Method::GET, &path, None).await {
            if st["state"] != "stopped" {
                eprintln!("{} on {} is already {}", v.name, v.host, st["state"]);
                continue;
            }
        }
        let spec = c.vm_spec(v)?;
        client
            .call(Method::POST, "/v1/vms", Some(&serde_json::to_value(&spec)?))
            .await
            .with_context(|| format!("VM {:?} on host {:?}", v.name, v.host))?;
        eprintln!("started {} on {} ({})", v.name, v.host, v.ip);
        started.push((v, client));
    }
    for (v, client) in &started {
        client
            .call(
                Method::POST,
                &format!("/v1/vms/{}/wait?for=ready&timeout_ms=300000", enc(&v.name)),
                None,
            )
            .await
            .with_context(|| format!("VM {:?} never became ready", v.name))?;
    }
    Ok(())
}

/// The (VM, host) pairs of the restores under way in the cluster's store, with the
/// restore's id.
async fn restoring(c: &Cluster) -> anyhow::Result<BTreeMap<(String, String), String>> {
    use rebound_store::Store;
    if c.spec.hosts.iter().all(|h| !h.simulated) {
        return Ok(BTreeMap::new());
    }
    let range = c
        .admin_store()
        .await?
        .range(&rebound_coord::layout::restores())
        .await?;
    let view = rebound_coord::view::ClusterView::from_kvs(&range.kvs, range.revision);
    let mut out = BTreeMap::new();
    for (id, r) in &view.restores {
        let over = r.state().is_some_and(|(s, _)| s.status.is_final());
        if let (Some(plan), false) = (r.plan(), over || r.refused().is_some()) {
            for v in &plan.record.plan.vms {
                out.insert((v.vm.clone(), v.host.clone()), id.clone());
            }
        }
    }
    Ok(out)
}

/// The whole cluster store's status, as the store holds it.
async fn read_status(
    paths: &Paths,
    name: Option<&str>,
    store: &StoreArgs,
) -> anyhow::Result<rebound_coord::status::ClusterStatus> {
    use rebound_store::Store;
    let range = match (name, store.connect().await?) {
        (_, Some(s)) => s.range(rebound_coord::layout::ROOT).await?,
        (Some(n), None) => {
            let c = Cluster::open(paths, n)?;
            c.admin_store()
                .await?
                .range(rebound_coord::layout::ROOT)
                .await?
        }
        (None, None) => bail!("give a cluster name or --etcd"),
    };
    Ok(rebound_coord::status::status(&range.kvs))
}

async fn status(paths: &Paths, a: StatusArgs) -> anyhow::Result<()> {
    let s = read_status(paths, a.name.as_deref(), &a.store).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    if !s.clusters.is_empty() {
        println!("clusters defined in the store: {}", s.clusters.join(", "));
    }
    println!(
        "{:<16} {:<8} {:<10} {:>4} {:>10}",
        "HOST", "STATE", "VERSION", "VMS", "SNAPSHOTS"
    );
    for h in &s.hosts {
        println!(
            "{:<16} {:<8} {:<10} {:>4} {:>10}",
            h.host,
            if h.live { "live" } else { "failed" },
            h.version.as_deref().unwrap_or("-"),
            h.vms.len(),
            h.snapshots
        );
    }
    print_vms(&s);
    if !s.restores.is_empty() {
        println!(
            "{:<40} {:<10} {:>4} {:<20} REASON",
            "RESTORE", "STATUS", "VMS", "COORDINATORS"
        );
        for r in &s.restores {
            println!(
                "{:<40} {:<10} {:>4} {:<20} {}",
                r.restore_id,
                r.status,
                r.vms,
                r.coordinators.join(","),
                r.reason.as_deref().unwrap_or("")
            );
        }
    }
    for e in &s.refused {
        println!("refused: {e}");
    }
    Ok(())
}

fn print_vms(s: &rebound_coord::status::ClusterStatus) {
    println!(
        "{:<20} {:<16} {:<12} {:<6} {:>8}",
        "VM", "HOST", "STATE", "READY", "MEM_MIB"
    );
    for h in &s.hosts {
        for v in &h.vms {
            let state = if h.live {
                v.state.clone()
            } else {
                format!("{} (host failed)", v.state)
            };
            println!(
                "{:<20} {:<16} {:<12} {:<6} {:>8}",
                v.vm,
                h.host,
                state,
                if v.ready { "yes" } else { "no" },
                v.memory_mib
            );
        }
    }
}

/// `rebound vm list --all-hosts`.
pub async fn list_all_hosts(store: &StoreArgs, json: bool) -> anyhow::Result<()> {
    let s = read_status(&Paths::from_env()?, None, store).await?;
    if json {
        let vms: Vec<serde_json::Value> = s
            .hosts
            .iter()
            .flat_map(|h| {
                h.vms.iter().map(move |v| {
                    json!({"host": h.host, "host_live": h.live, "vm": v.vm, "state": v.state,
                           "ready": v.ready, "memory_mib": v.memory_mib})
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&vms)?);
    } else {
        print_vms(&s);
    }
    Ok(())
}

async fn stop(paths: &Paths, a: NameArgs) -> anyhow::Result<()> {
    let c = Cluster::open(paths, &a.name)?;
    for v in &c.spec.vms {
        let client = c.link(&v.host)?;
        match client
            .call(
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
    rm_cluster(&c).await?;
    Ok(())
}

/// Kills and removes every VM, stops the simulated hosts' daemons, removes their
/// namespaces and the cluster's state.
pub(crate) async fn rm_cluster(c: &Cluster) -> anyhow::Result<()> {
    // A host whose daemon died still has its VMs: its daemon takes them back first.
    if let Err(e) = daemons_up(c).await {
        eprintln!("warning: {}", rebound_errors::chain(e.as_ref()));
    }
    for v in &c.spec.vms {
        let Ok(client) = c.link(&v.host) else {
            continue;
        };
        if !client.is_up().await {
            continue;
        }
        restore::remove_vm(&client, &v.name).await?;
    }
    hosts_down(c).await;
    std::fs::remove_dir_all(&c.dir)
        .with_context(|| format!("cannot remove {}", c.dir.display()))?;
    Ok(())
}
