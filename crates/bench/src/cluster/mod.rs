//! `rebound bench cluster`: HotRestore section 6.2 on simulated hosts. A cluster of
//! `peer` guests (8 by default, on 2 simulated hosts) under each topology is
//! snapshotted once, then restored three ways side by side from the same snapshot:
//! each VM's whole working set on its own (`working-set`), elastic working sets
//! without a restore line (`elastic`), and elastic working sets revised to the restore
//! line and started on it (`line`).
//!
//! Per VM and variant: restore latency (its start after the restore began), backoff
//! (start-time difference to the VMs it sends to, the paper's approximation),
//! disruption (their sum), the guest's own TCP retransmissions and heartbeat false
//! alarms (peers it declared dead, all of which were alive: from the guest's `STATS`,
//! after the restore against before the snapshot) and the worst latency of a host
//! client's `QUERY` (each a request to all the guest's peers) sent after the VM
//! started.
//!
//! Working sets differ between VMs, as in the paper: each guest also runs `memfill`
//! over its own amount of memory (`--touch-mib`). Every restore reads its snapshot
//! cold (the page cache dropped) through each host's own emulated slow disk (a
//! block-I/O control group holding that host's daemon and its QEMUs), unless
//! `--disk-read-mbps 0`.
//!
//! The whole set (every topology, each snapshotted afresh, restored every way) runs
//! `--runs` times, round after round, so that load drifts hit every variant alike;
//! each figure is reported as its median with min and max over the rounds that
//! measured it ([`rounds`]). A restore or a cluster that fails is recorded and the
//! run goes on; it exits non-zero at the end.

mod draw;
mod rounds;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hyper::Method;
use rebound_cluster::spec::{ClusterSpec, PEER_PORT};
use rebound_cluster::Disruption;
use rebound_vmm::paths::Paths;
use serde::Serialize;
use serde_json::{json, Value};

use crate::clusters::{Clusters, PortError};
use crate::host::{host_cpus, host_kernel, load_average};
use crate::out::BenchOut;
use crate::rounds::{Failure, Incomplete};
use crate::slowdisk::SlowDisk;
use rounds::{Cell, Failed, Point};

/// Why the cluster benchmark did not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--vms must be 2 to 32 and --hosts 1 to 8")]
    Size,
    #[error("--{what}: {value:?} is not valid")]
    List { what: String, value: String },
    #[error("--topologies: {0:?} is not client-server, all-to-all or ring")]
    UnknownTopology(String),
    #[error("--variants: {0:?} is not working-set, elastic, line or line-keep, nor one of them after ps-")]
    Variant(String),
    #[error("--touch-mib: give MiB values that leave the guest at least 96 MiB")]
    Touch,
    #[error("no daemon to run the cluster from")]
    Connect(#[source] rebound_client::ClientError),
    #[error(transparent)]
    Scratch(#[from] crate::out::ScratchError),
    #[error("{ip}: STATS answered {line:?}")]
    Stats {
        ip: Ipv4Addr,
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{ip} does not answer STATS")]
    NoStats {
        ip: Ipv4Addr,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("VM {0} does not reach all its peers")]
    Peers(String),
    #[error("the {variant} restore did not start every VM: {outcome}")]
    NotRestored { variant: String, outcome: String },
    #[error("host {0}: health without pid")]
    NoPid(String),
    #[error("cannot {what}")]
    Port {
        what: String,
        #[source]
        source: PortError,
    },
    #[error("the snapshot cannot be restored cold")]
    Cold(#[source] crate::host::CacheError),
    #[error("cannot emulate the slow disk")]
    SlowDisk(#[source] crate::slowdisk::Error),
    #[error("topology {0}")]
    InTopology(String, #[source] Box<Error>),
    #[error("cannot write {}", .0.display())]
    Svg(std::path::PathBuf, #[source] std::io::Error),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
    #[error(transparent)]
    Incomplete(#[from] Incomplete),
}

/// What failed in a call to the cluster commands, for [`Error::Port`].
fn port(what: impl Into<String>) -> impl FnOnce(PortError) -> Error {
    let what = what.into();
    move |source| Error::Port { what, source }
}

#[derive(Args, Debug)]
pub struct ClusterArgs {
    /// VMs in each cluster.
    #[arg(long, default_value_t = 8)]
    vms: usize,
    /// Simulated hosts the VMs are spread over (round robin).
    #[arg(long, default_value_t = 2)]
    hosts: usize,
    /// Guest memory, e.g. 224M (a bare number is MiB).
    #[arg(long, default_value = "224M", value_parser = rebound_api::spec::parse_memory_mib)]
    memory: u64,
    /// Topologies: client-server (distcc-like), all-to-all (Elasticsearch-like), ring.
    #[arg(long, default_value = "client-server,all-to-all,ring")]
    topologies: String,
    /// Variants, in the order they run: working-set, elastic, line, line-keep on the
    /// page cache, and the same with `ps-` (ps-line...) on the page server (each VM
    /// restored with `--path page-server`; its disr/ws is against ps-working-set).
    #[arg(long, default_value = "working-set,elastic,line")]
    variants: String,
    /// MiB each VM's memfill touches every second, one value per VM (cycled).
    #[arg(long, default_value = "8,40,16,56,24,48,12,32")]
    touch_mib: String,
    /// Seconds of post-snapshot trace and packet recording.
    #[arg(long, default_value_t = 6.0)]
    trace_s: f64,
    /// Seconds the guests run after the last one started before their counters are
    /// read.
    #[arg(long, default_value_t = 6.0)]
    settle_s: f64,
    /// Read limit of each host's emulated disk, MB/s (0: the real disk, cold).
    #[arg(long, default_value_t = 40)]
    disk_read_mbps: u32,
    /// Rounds of the whole set (every topology and variant); medians are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    #[command(flatten)]
    out: BenchOut,
}

/// One VM in one restore.
#[derive(Debug, Clone, Serialize)]
struct VmRow {
    vm: String,
    host: String,
    touch_mib: u64,
    ws_pages: u64,
    restore_latency_s: f64,
    backoff_s: f64,
    disruption_s: f64,
    retransmits: u64,
    false_alarms: u64,
    /// The host client's worst QUERY latency among those sent after the VM started.
    worst_request_s: Option<f64>,
    /// QUERYs sent after it started that were not answered within the timeout.
    unanswered: u64,
    /// Each peer this VM declared dead after the restore began.
    alarms: Vec<Alarm>,
}

/// One false alarm: when a VM declared `peer` dead, and whether that peer had been
/// running longer than the silence (a stall after its start, not the start order).
#[derive(Debug, Clone, Serialize)]
struct Alarm {
    peer: String,
    /// Seconds after the restore began.
    at_s: f64,
    silent_ms: u64,
    /// The peer's start, seconds after the restore began.
    peer_start_s: f64,
    /// The peer ran the whole silence: it went quiet after its start.
    after_peer_start: bool,
}

/// The figures of one restore (or, for `normal`, of as long a run without one).
#[derive(Debug, Clone, Serialize)]
struct Summary {
    max_backoff_s: f64,
    avg_backoff_s: f64,
    avg_disruption_s: f64,
    retransmits: u64,
    false_alarms: u64,
    /// Those of `false_alarms` about a peer that had run longer than the silence.
    false_alarms_after_peer_start: u64,
    worst_request_s: f64,
    start_spread_s: f64,
}

#[derive(Debug, Serialize)]
struct Run<V, O> {
    variant: V,
    vms: Vec<VmRow>,
    summary: Summary,
    outcome: O,
}

#[derive(Debug, Serialize)]
struct TopologyResult<V, O> {
    topology: String,
    /// The round, from 1.
    round: usize,
    /// The guests' accelerator.
    accel: String,
    edges: Vec<(String, String, u64)>,
    rings: Vec<Vec<String>>,
    /// The guests' retransmissions and false alarms over `settle_s` of normal running.
    normal_retransmits: u64,
    normal_false_alarms: u64,
    /// Seconds between the first and the last VM's stop at the snapshot.
    snapshot_pause_spread_s: f64,
    /// The cluster store's watch latency, in seconds, one per probe write.
    watch_latency_s: Vec<f64>,
    /// The restores that measured; those that failed are in the run's failures.
    runs: Vec<Run<V, O>>,
}

/// A guest's counters, from its `STATS` line.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    retrans: u64,
    dead: u64,
}

fn ask(addr: SocketAddr, line: &str, timeout: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300))?;
    request(&mut s, line, timeout)
}

/// Sends one line on a connection and reads the answer line.
fn request(s: &mut TcpStream, line: &str, timeout: Duration) -> std::io::Result<String> {
    s.set_read_timeout(Some(timeout))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut out = String::new();
    BufReader::new(s).read_line(&mut out)?;
    if out.is_empty() {
        return Err(std::io::Error::other("closed"));
    }
    Ok(out)
}

/// A guest's counters; a guest still busy loading its memory from the slow disk
/// gets a minute.
fn counters(ip: Ipv4Addr) -> Result<Counters, Error> {
    let addr = SocketAddr::from((ip, PEER_PORT));
    let mut last = None;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) {
        let r = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .and_then(|mut s| request(&mut s, "STATS", Duration::from_secs(5)));
        match r {
            Ok(l) => {
                let v: Value = serde_json::from_str(l.trim()).map_err(|source| Error::Stats {
                    ip,
                    line: l.clone(),
                    source,
                })?;
                return Ok(Counters {
                    retrans: v["retrans_segs"].as_u64().unwrap_or(0),
                    dead: v["declared_dead"].as_u64().unwrap_or(0),
                });
            }
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(Error::NoStats { ip, source: last })
}

/// One QUERY: when it was sent (unix ns) and its latency (`None`: no answer).
type Sample = (i64, Option<f64>);

/// A host client asking every guest `QUERY` in turn, one at a time per guest.
struct Client {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<BTreeMap<String, Vec<Sample>>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Client {
    fn start(vms: &[(String, Ipv4Addr)]) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<BTreeMap<String, Vec<Sample>>>> = Default::default();
        let threads = vms
            .iter()
            .cloned()
            .map(|(vm, ip)| {
                let (stop, samples) = (stop.clone(), samples.clone());
                std::thread::spawn(move || {
                    let addr = SocketAddr::from((ip, PEER_PORT));
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        // A guest that is not there (loading, or not yet answering
                        // ARP) takes no request: only connected requests count.
                        let Ok(mut conn) =
                            TcpStream::connect_timeout(&addr, Duration::from_millis(300))
                        else {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        };
                        let sent = rebound_coord::run::unix_now_ns();
                        let t = Instant::now();
                        let lat =
                            request(&mut conn, &format!("QUERY b{n}"), Duration::from_secs(5))
                                .ok()
                                .filter(|l| l.starts_with("RESULT"))
                                .map(|_| t.elapsed().as_secs_f64());
                        samples
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(vm.clone())
                            .or_default()
                            .push((sent, lat));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
            })
            .collect();
        Client {
            stop,
            samples,
            threads,
        }
    }

    fn finish(self) -> BTreeMap<String, Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn parse_list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>, Error> {
    s.split(',')
        .filter(|x| !x.trim().is_empty())
        .map(|x| {
            x.trim().parse().map_err(|_| Error::List {
                what: what.to_string(),
                value: x.to_string(),
            })
        })
        .collect()
}

fn cluster_file(a: &ClusterArgs, topology: &str, subnet: u8, touch: &[u64]) -> String {
    let mut t = format!(
        "[network]\nsubnet = \"10.86.{subnet}.0/24\"\ntopology = \"{topology}\"\n[defaults]\nmemory = \"{}M\"\nworkload = \"peer\"\n",
        a.memory
    );
    for h in 0..a.hosts {
        t += &format!("[[host]]\nname = \"h{}\"\nsimulated = true\n", h + 1);
    }
    for i in 0..a.vms {
        t += &format!(
            "[[vm]]\nname = \"vm{}\"\nhost = \"h{}\"\n[vm.workload_args]\nalso = \"memfill\"\nmemfill = \"{}M\"\n",
            i + 1,
            i % a.hosts + 1,
            touch[i % touch.len()]
        );
    }
    t
}

/// Waits until every guest answers a QUERY with all its peers.
fn wait_connected(spec: &ClusterSpec, timeout: Duration) -> Result<(), Error> {
    let t = Instant::now();
    for v in &spec.vms {
        let addr = SocketAddr::from((v.ip, PEER_PORT));
        loop {
            let ok = ask(addr, "QUERY w", Duration::from_secs(3))
                .is_ok_and(|l| l.split_whitespace().nth(2) == Some(&v.peers.len().to_string()));
            if ok {
                break;
            }
            if t.elapsed() > timeout {
                return Err(Error::Peers(v.name.clone()));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    Ok(())
}

fn all_counters(spec: &ClusterSpec) -> Result<BTreeMap<String, Counters>, Error> {
    spec.vms
        .iter()
        .map(|v| Ok((v.name.clone(), counters(v.ip)?)))
        .collect()
}

async fn daemon_pids<P: Clusters>(cl: &P, c: &P::Cluster) -> Result<Vec<(String, u32)>, Error> {
    let mut out = Vec::new();
    for h in &P::spec(c).hosts {
        let v = cl
            .call(c, &h.name, Method::GET, "/v1/health")
            .await
            .map_err(port(format!("ask host {} for its health", h.name)))?;
        let pid = v["pid"]
            .as_u64()
            .ok_or_else(|| Error::NoPid(h.name.clone()))? as u32;
        out.push((h.name.clone(), pid));
    }
    Ok(out)
}

/// Each VM's `dead` verdicts since the restore began, from its events, with the
/// declared peer's start (the hosts' wall clocks: one machine's here).
async fn alarms<P: Clusters>(
    cl: &P,
    c: &P::Cluster,
    o: &P::Outcome,
) -> BTreeMap<String, Vec<Alarm>> {
    let began = P::began_unix_ns(o);
    let spec = P::spec(c);
    let start_of = |vm: &str| {
        P::disruption(o)
            .and_then(|d| d.vms.iter().find(|x| x.vm == vm))
            .map(|d| d.start_s)
    };
    let mut out = BTreeMap::new();
    for v in &spec.vms {
        let evs = cl
            .call(
                c,
                &v.host,
                Method::GET,
                &format!("/v1/vms/{}/events", v.name),
            )
            .await
            .ok();
        let evs: Vec<rebound_api::Event> = evs
            .and_then(|e| serde_json::from_value(e).ok())
            .unwrap_or_default();
        let mut list = Vec::new();
        for e in evs {
            let rebound_api::EventData::Peer(p) = &e.data else {
                continue;
            };
            let Ok(wall) = chrono::DateTime::parse_from_rfc3339(&e.wall) else {
                continue;
            };
            let at_s = (wall.timestamp_nanos_opt().unwrap_or(0) - began) as f64 / 1e9;
            if p.event != "dead" || at_s < 0.0 {
                continue;
            }
            let ip = p.peer.split(':').next().unwrap_or_default();
            let peer = spec
                .vms
                .iter()
                .find(|x| x.ip.to_string() == ip)
                .map_or(p.peer.clone(), |x| x.name.clone());
            let peer_start_s = start_of(&peer).unwrap_or(f64::NAN);
            list.push(Alarm {
                after_peer_start: at_s - peer_start_s > p.silent_ms as f64 / 1e3,
                peer,
                at_s,
                silent_ms: p.silent_ms,
                peer_start_s,
            });
        }
        out.insert(v.name.clone(), list);
    }
    out
}

fn summarize(vms: &[VmRow], d: Option<&Disruption>) -> Summary {
    Summary {
        max_backoff_s: d.map_or(f64::NAN, |d| d.max_backoff_s),
        avg_backoff_s: d.map_or(f64::NAN, |d| d.avg_backoff_s),
        avg_disruption_s: d.map_or(f64::NAN, |d| d.avg_disruption_s),
        start_spread_s: d.map_or(f64::NAN, |d| d.start_spread_s),
        retransmits: vms.iter().map(|v| v.retransmits).sum(),
        false_alarms: vms.iter().map(|v| v.false_alarms).sum(),
        false_alarms_after_peer_start: vms
            .iter()
            .flat_map(|v| &v.alarms)
            .filter(|a| a.after_peer_start)
            .count() as u64,
        worst_request_s: vms
            .iter()
            .filter_map(|v| v.worst_request_s)
            .fold(0.0, f64::max),
    }
}

#[allow(clippy::too_many_arguments)]
async fn one_restore<P: Clusters>(
    cl: &P,
    c: &P::Cluster,
    snap: &Path,
    variant: P::Variant,
    a: &ClusterArgs,
    before: &BTreeMap<String, Counters>,
    touch: &BTreeMap<String, u64>,
    say: &dyn Fn(&str),
) -> Result<Run<P::Variant, P::Outcome>, Error> {
    // The VMs of the previous restore go first: their QEMUs map the snapshot's
    // images, and pages mapped by a process stay in the page cache whatever we
    // advise, so the next variant would read them warm.
    let spec = P::spec(c);
    for v in &spec.vms {
        cl.remove_vm(c, &v.host, &v.name)
            .await
            .map_err(port(format!("remove VM {}", v.name)))?;
    }
    crate::host::drop_cache(snap).map_err(Error::Cold)?;
    let disks = if a.disk_read_mbps > 0 {
        let mut v = Vec::new();
        for (h, pid) in daemon_pids(cl, c).await? {
            let d = SlowDisk::new(
                &format!("rebound-bench-cluster-{}-{h}", std::process::id()),
                snap,
                a.disk_read_mbps as u64 * 1_000_000,
                0,
            )
            .map_err(Error::SlowDisk)?;
            d.add(pid).map_err(Error::SlowDisk)?;
            v.push(d);
        }
        v
    } else {
        Vec::new()
    };
    let vms: Vec<(String, Ipv4Addr)> = spec.vms.iter().map(|v| (v.name.clone(), v.ip)).collect();
    let client = Client::start(&vms);
    let r = cl.restore(c, snap, variant, 0.05).await;
    let o = match r {
        Ok(o) => o,
        Err(e) => {
            client.finish();
            return Err(port(format!(
                "restore the cluster ({})",
                P::variant_name(variant)
            ))(e));
        }
    };
    if P::disruption(&o).is_none() {
        // An aborted restore measured nothing: a failure, with the store's reason.
        client.finish();
        let doc = serde_json::to_value(&o).unwrap_or(Value::Null);
        return Err(Error::NotRestored {
            variant: P::variant_name(variant).to_string(),
            outcome: doc["report"]["outcome"].to_string(),
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(a.settle_s)).await;
    let samples = client.finish();
    drop(disks);
    let after = all_counters(spec)?;
    let began = P::began_unix_ns(&o);
    let alarms = alarms(cl, c, &o).await;
    let mut rows = Vec::new();
    for v in &spec.vms {
        let d = P::disruption(&o).and_then(|d| d.vms.iter().find(|x| x.vm == v.name));
        let start_ns = d.map(|d| began + (d.start_s * 1e9) as i64);
        let after_start: Vec<&Sample> = samples
            .get(&v.name)
            .map(|s| {
                s.iter()
                    .filter(|(t, _)| start_ns.is_some_and(|st| *t >= st))
                    .collect()
            })
            .unwrap_or_default();
        let (b, f) = (before[&v.name], after[&v.name]);
        rows.push(VmRow {
            vm: v.name.clone(),
            host: v.host.clone(),
            touch_mib: touch[&v.name],
            ws_pages: P::plan(&o)
                .vms
                .iter()
                .find(|p| p.vm == v.name)
                .map_or(0, |p| p.ws_pages),
            restore_latency_s: d.map_or(f64::NAN, |d| d.start_s),
            backoff_s: d.map_or(f64::NAN, |d| d.backoff_s),
            disruption_s: d.map_or(f64::NAN, |d| d.disruption_s),
            retransmits: f.retrans.saturating_sub(b.retrans),
            false_alarms: f.dead.saturating_sub(b.dead),
            worst_request_s: after_start
                .iter()
                .map(|(_, l)| l.unwrap_or(5.0))
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))),
            unanswered: after_start.iter().filter(|(_, l)| l.is_none()).count() as u64,
            alarms: alarms.get(&v.name).cloned().unwrap_or_default(),
        });
    }
    let summary = summarize(&rows, P::disruption(&o));
    say(&format!(
        "  {:<12} backoff max {:.3} s avg {:.3} s, disruption avg {:.3} s, retransmits {}, false alarms {} ({} about a peer running longer than the silence), worst request {:.3} s",
        P::variant_name(variant),
        summary.max_backoff_s,
        summary.avg_backoff_s,
        summary.avg_disruption_s,
        summary.retransmits,
        summary.false_alarms,
        summary.false_alarms_after_peer_start,
        summary.worst_request_s
    ));
    Ok(Run {
        variant,
        vms: rows,
        summary,
        outcome: o,
    })
}

/// One topology in one round (from 0): its cluster made, snapshotted and restored
/// every way. A restore that fails is pushed to `failures` and the next variant is
/// tried; an error is the cluster's or its snapshot's (no variant measured).
#[allow(clippy::too_many_arguments)]
async fn one_topology<P: Clusters>(
    cl: &P,
    a: &ClusterArgs,
    topology: &str,
    (k, round): (usize, usize),
    variants: &[P::Variant],
    scratch: &Path,
    say: &dyn Fn(&str),
    failures: &mut Vec<Failed>,
) -> Result<TopologyResult<P::Variant, P::Outcome>, Error> {
    let touch: Vec<u64> = parse_list(&a.touch_mib, "touch-mib")?;
    let name = format!("bc{}{k}r{round}", std::process::id() % 100_000);
    let text = cluster_file(a, topology, 10 + k as u8, &touch);
    let c = cl
        .create(&name, &text)
        .await
        .map_err(port(format!("create cluster {name}")))?;
    let spec = P::spec(&c);
    let r = async {
        say(&format!(
            "{topology}, round {}: starting {} VMs on {} hosts",
            round + 1,
            a.vms,
            a.hosts
        ));
        cl.start_vms(&c)
            .await
            .map_err(port("start the cluster's VMs"))?;
        wait_connected(spec, Duration::from_secs(120))?;
        let watch_latency_s = cl
            .watch_latency(&c, WATCH_PROBES)
            .await
            .map_err(port("measure the cluster store's watch latency"))?;
        let first = &spec.vms[0];
        let st = cl
            .call(
                &c,
                &first.host,
                Method::GET,
                &format!("/v1/vms/{}", rebound_client::enc(&first.name)),
            )
            .await
            .map_err(port(format!("ask host {} about VM {}", first.host, first.name)))?;
        let accel = st["accel"].as_str().unwrap_or("unknown").to_string();
        // Normal running, as long as a restore is watched: what noise looks like.
        let n0 = all_counters(spec)?;
        tokio::time::sleep(Duration::from_secs_f64(a.settle_s)).await;
        let before = all_counters(spec)?;
        let (normal_retransmits, normal_false_alarms) = n0.iter().fold((0, 0), |(r, d), (vm, c0)| {
            let c1 = before[vm];
            (
                r + c1.retrans.saturating_sub(c0.retrans),
                d + c1.dead.saturating_sub(c0.dead),
            )
        });
        let snap = scratch.join(format!("{topology}-snap"));
        let _ = std::fs::remove_dir_all(&snap);
        let pause_spread_s = cl
            .snapshot(&c, &snap, a.trace_s)
            .await
            .map_err(port("snapshot the cluster"))?;
        let rdg = cl
            .traffic(&snap)
            .map_err(port("read the snapshot's recorded traffic"))?;
        say(&format!(
            "{topology}: snapshot taken, the VMs stopped within {:.3} s of each other; {} edges, {} rings; over {:.0} s of normal running: {normal_retransmits} retransmits, {normal_false_alarms} false alarms",
            pause_spread_s,
            rdg.edges.len(),
            rdg.rings.len(),
            a.settle_s
        ));
        let touch_of: BTreeMap<String, u64> = spec
            .vms
            .iter()
            .enumerate()
            .map(|(i, v)| (v.name.clone(), touch[i % touch.len()]))
            .collect();
        let mut runs = Vec::new();
        for &v in variants {
            match one_restore(cl, &c, &snap, v, a, &before, &touch_of, say).await {
                Ok(r) => runs.push(r),
                Err(e) => {
                    let case = format!("{topology}/{}", P::variant_name(v));
                    let f = Failure::new(case, round, &e);
                    say(&f.line());
                    failures.push(Failed {
                        topology: topology.to_string(),
                        variant: Some(P::variant_name(v).to_string()),
                        failure: f,
                    });
                }
            }
        }
        let _ = std::fs::remove_dir_all(&snap);
        Ok::<_, Error>(TopologyResult {
            topology: topology.to_string(),
            round: round + 1,
            accel,
            edges: rdg
                .edges
                .iter()
                .map(|e| (e.sender.clone(), e.receiver.clone(), e.packets))
                .collect(),
            rings: rdg.rings.clone(),
            normal_retransmits,
            normal_false_alarms,
            snapshot_pause_spread_s: pause_spread_s,
            watch_latency_s,
            runs,
        })
    }
    .await;
    if r.is_err() {
        // The hosts' daemon logs go with the cluster: keep them for the post-mortem.
        for h in &spec.hosts {
            let log = P::dir(&c).join("hosts").join(&h.name).join("reboundd.log");
            let keep = scratch.join(format!("{topology}-r{}-{}-reboundd.log", round + 1, h.name));
            if std::fs::copy(&log, &keep).is_ok() {
                say(&format!("kept {}", keep.display()));
            }
        }
    }
    if let Err(e) = cl.rm(&c).await {
        say(&format!(
            "warning: cannot remove cluster {name}: {}",
            rebound_errors::chain(e.as_ref())
        ));
    }
    r.map_err(|e| Error::InTopology(topology.to_string(), Box::new(e)))
}

/// Probe writes per cluster for the store's watch latency.
const WATCH_PROBES: usize = 200;

/// The p50 and p99 of samples in seconds, in milliseconds (nearest rank).
fn p50_p99_ms(samples: &[f64]) -> Option<(f64, f64)> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1] * 1e3;
    Some((at(0.50), at(0.99)))
}

pub async fn run<P: Clusters>(paths: &Paths, a: ClusterArgs, cl: &P) -> Result<(), Error> {
    if a.vms < 2 || a.hosts < 1 || a.hosts > 8 || a.vms > 32 {
        return Err(Error::Size);
    }
    let topologies: Vec<String> = parse_list(&a.topologies, "topologies")?;
    for t in &topologies {
        if !["client-server", "all-to-all", "ring"].contains(&t.as_str()) {
            return Err(Error::UnknownTopology(t.clone()));
        }
    }
    let variants: Vec<P::Variant> = a
        .variants
        .split(',')
        .map(|v| {
            <P::Variant as clap::ValueEnum>::from_str(v.trim(), false)
                .map_err(|_| Error::Variant(v.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let touch: Vec<u64> = parse_list(&a.touch_mib, "touch-mib")?;
    if touch.is_empty() || touch.iter().any(|&t| t + 96 > a.memory) {
        return Err(Error::Touch);
    }
    rebound_client::connect(paths)
        .await
        .map_err(Error::Connect)?;
    let scratch = a.out.scratch("cluster")?;
    let json_out = a.out.json;
    let say = move |s: &str| {
        if json_out {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let t0 = Instant::now();
    let rounds = a.runs as usize;
    let mut results = Vec::new();
    let mut failures: Vec<Failed> = Vec::new();
    // Round after round over every topology, so that a drift of the machine's load
    // meets every topology and variant alike.
    for round in 0..rounds {
        for (k, t) in topologies.iter().enumerate() {
            let r = one_topology(
                cl,
                &a,
                t,
                (k, round),
                &variants,
                &scratch,
                &say,
                &mut failures,
            );
            match r.await {
                Ok(r) => results.push(r),
                Err(e) => {
                    let f = Failure::new(format!("{t} (cluster or snapshot)"), round, &e);
                    say(&f.line());
                    failures.push(Failed {
                        topology: t.clone(),
                        variant: None,
                        failure: f,
                    });
                }
            }
        }
    }
    if a.out.dir.is_none() {
        let _ = std::fs::remove_dir_all(&scratch);
    }
    let names: Vec<&str> = variants.iter().map(|v| P::variant_name(*v)).collect();
    let points: Vec<Point> = results
        .iter()
        .flat_map(|r| {
            r.runs.iter().map(|x| Point {
                topology: &r.topology,
                round: r.round - 1,
                variant: P::variant_name(x.variant),
                summary: &x.summary,
            })
        })
        .collect();
    let cells = rounds::cells(&topologies, &names, rounds, &points, &failures);
    let all = |v: &str| cells.iter().find(|c| c.topology == "all" && c.variant == v);
    let med = |c: Option<&Cell>, f: fn(&Cell) -> Option<crate::rounds::Stat>| {
        c.and_then(f).map(|s| s.median)
    };
    // The goals, for the line on each path that ran it and its working-set.
    let goals_of = |line: &str| match (all(line), all(rounds::baseline(line))) {
        (Some(l), Some(_)) if l.runs > 0 => json!({
            "on": "medians over the rounds of the figures over all topologies",
            "max_backoff_at_most_50ms": med(Some(l), |c| c.max_backoff_s).map(|m| m <= 0.05),
            "disruption_at_most_half_of_working_set": med(Some(l), |c| c.disruption_vs_working_set).map(|m| m <= 0.5),
            "disruption_ratio_line_to_working_set": med(Some(l), |c| c.disruption_vs_working_set),
            "zero_false_alarms_with_line": med(Some(l), |c| c.false_alarms).map(|m| m == 0.0),
        }),
        _ => Value::Null,
    };
    let goals = goals_of("line");
    let page_server_goals = goals_of("ps-line");
    let watch: Vec<f64> = results
        .iter()
        .flat_map(|r| r.watch_latency_s.iter().copied())
        .collect();
    let watch_ms = p50_p99_ms(&watch)
        .map(|(p50, p99)| json!({"p50_ms": p50, "p99_ms": p99, "samples": watch.len()}));
    let mut accel: Vec<&str> = results.iter().map(|r| r.accel.as_str()).collect();
    accel.dedup();
    let failure_list: Vec<&Failed> = failures.iter().collect();
    let doc = json!({
        "bench": "cluster",
        "accelerator": accel,
        "host": { "cpus": host_cpus(), "kernel": host_kernel(), "load_average_after": load_average() },
        "vms": a.vms, "hosts": a.hosts, "memory_mib": a.memory,
        "disk_read_mbps": a.disk_read_mbps,
        "rounds": rounds,
        "seconds": t0.elapsed().as_secs_f64(),
        "medians": cells,
        "goals": goals,
        "page_server_goals": page_server_goals,
        "store_watch_latency": watch_ms,
        "failures": failure_list,
        "topologies": results,
    });
    if let Some(svg) = &a.out.svg {
        std::fs::write(
            svg,
            draw::draw::<P>(&topologies, &results, &variants, rounds),
        )
        .map_err(|e| Error::Svg(svg.clone(), e))?;
    }
    if a.out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).map_err(Error::Json)?
        );
    } else {
        println!(
            "rebound bench cluster: {} VMs of {} MiB on {} hosts, {rounds} round(s); accel {}; host {} CPUs, kernel {}; load after {}; {:.0} s",
            a.vms,
            a.memory,
            a.hosts,
            accel.join(","),
            host_cpus(),
            host_kernel(),
            load_average(),
            t0.elapsed().as_secs_f64()
        );
        rounds::print_table(&cells, rounds);
        println!("goals: {goals}");
        if let Some((p50, p99)) = p50_p99_ms(&watch) {
            println!(
                "cluster store (etcd, one member per simulated host, mutual TLS): watch latency p50 {p50:.2} ms, p99 {p99:.2} ms over {} probe writes",
                watch.len()
            );
        }
        for f in &failures {
            println!("{}", f.failure.line());
        }
    }
    let tried = rounds * topologies.len() * variants.len();
    let failed_runs: Vec<Failure> = failures
        .iter()
        .flat_map(|f| {
            let n = if f.variant.is_some() {
                1
            } else {
                variants.len()
            };
            std::iter::repeat_n(f.failure.clone(), n)
        })
        .collect();
    Incomplete::check(&failed_runs, tried)?;
    Ok(())
}

#[cfg(test)]
mod watch_tests {
    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(|i| i as f64 / 1e3).collect();
        assert_eq!(super::p50_p99_ms(&s), Some((50.0, 99.0)));
        assert_eq!(super::p50_p99_ms(&[]), None);
        assert_eq!(super::p50_p99_ms(&[0.002]), Some((2.0, 2.0)));
    }
}
