//! `rebound bench cluster-scale`: the restore protocol over a real etcd at the size
//! of a data centre's cluster, with stand-in VMs ([`StandIn`]: they take the
//! phases' time and boot nothing), so it measures the protocol and the store only.
//!
//! It starts its own single-member etcd ([`etcd`]). Per size (`--sizes`, VMs;
//! `--vms-per-host` each on simulated hosts) it runs one [`Participant`] per host in
//! this process, each with its own etcd connection, and per run (`--runs`):
//! - a restore of the plan ([`measure::Shape`]) submitted from another connection:
//!   time from the submit to every VM started and restored, start error against
//!   the line (p50, p99, max), etcd requests per VM (every connection's, the
//!   submitter's included);
//! - a second restore of the same plan whose coordinator's participant is dropped
//!   once the first wave started (its lease is no longer renewed, as with a dead
//!   daemon) and joins again at once with the same stand-ins: the failover time is
//!   from the drop to the first write of the new coordinator.
//!
//! In both, no stand-in may start twice. A run that fails is recorded and the
//! others go on; the bench exits non-zero at the end.

mod etcd;
mod measure;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rebound_coord::layout;
use rebound_coord::records::Timeouts;
use rebound_coord::report::RestoreReport;
use rebound_coord::run::{unix_now_ns, HostConfig, Participant};
use rebound_coord::standin::StandIn;
use rebound_coord::submit::{submit, wait, SubmitError};
use rebound_coord::view::ClusterView;
use rebound_coord::Plan;
use rebound_store::{Event, Op, Store, StoreError};
use serde::Serialize;

use crate::host::{host_cpus, load_average};
use crate::rounds::{show, Failure, Incomplete, Stat};
use measure::{figures, goals, host_name, hosts_for, plan, Goal, RunFigures, Shape};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("--sizes: give VM counts of at least 2; --vms-per-host and --waves at least 1")]
    Size,
    #[error(transparent)]
    Etcd(#[from] etcd::Error),
    #[error("host {0} cannot join the cluster store")]
    Join(String, #[source] rebound_coord::run::RunError),
    #[error("the restore failed")]
    Submit(#[from] SubmitError),
    #[error("the cluster store failed")]
    Store(#[from] StoreError),
    #[error("restore {0} did not reach {1} in time (limit {2:?} per restore)")]
    Stuck(String, &'static str, Duration),
    #[error("restore {0} has no coordinator")]
    NoCoordinator(String),
    #[error("{0} stand-in VMs started twice")]
    Twice(usize),
    #[error("restore {0} aborted: {1}")]
    Aborted(String, String),
    #[error("cannot encode the results as JSON")]
    Json(#[source] serde_json::Error),
    #[error(transparent)]
    Incomplete(#[from] Incomplete),
}

#[derive(Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Cluster sizes in VMs, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,300,1000")]
    sizes: Vec<usize>,
    /// VMs per simulated host.
    #[arg(long, default_value_t = 10)]
    vms_per_host: usize,
    /// Runs per size (each a restore and a failover restore).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Stand-in load time, ms.
    #[arg(long, default_value_t = 200)]
    load_ms: u64,
    /// Stand-in start time, ms.
    #[arg(long, default_value_t = 5)]
    start_ms: u64,
    /// Stand-in time from start to restored, ms.
    #[arg(long, default_value_t = 100)]
    restore_ms: u64,
    /// Waves of the restore line.
    #[arg(long, default_value_t = 10)]
    waves: usize,
    /// Time between waves, ms.
    #[arg(long, default_value_t = 100)]
    wave_ms: u64,
    /// The first wave's instant after the restore began, ms.
    #[arg(long, default_value_t = 1000)]
    line_ms: u64,
    /// Length of the dependency chain on each host (VMs 1..N-1 each depend on the
    /// one before; 0 or 1 for none).
    #[arg(long, default_value_t = 5)]
    chain: usize,
    /// Host lease TTL, seconds.
    #[arg(long, default_value_t = 5.0)]
    ttl: f64,
    /// Leave out the failover restores.
    #[arg(long)]
    no_failover: bool,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// The figures of one failover restore.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailoverFigures {
    pub dropped: String,
    pub coordinators: Vec<String>,
    /// From the drop to the first write of the new coordinator, s.
    pub failover_s: f64,
    /// From the drop to the old coordinator's election key going (its lease expired), s.
    pub lease_gone_s: f64,
    /// From the drop to the state's `coordinators` naming the new one, s (the
    /// state is rewritten only when the restore ends or aborts).
    pub state_names_new_s: f64,
    pub restored: bool,
    pub double_starts: usize,
}

#[derive(Debug, Serialize)]
struct SizeResult {
    vms: usize,
    hosts: usize,
    runs: Vec<RunFigures>,
    failovers: Vec<FailoverFigures>,
    medians: Medians,
}

#[derive(Debug, Serialize)]
struct Medians {
    all_started_s: Option<Stat>,
    all_restored_s: Option<Stat>,
    start_error_p50_ms: Option<Stat>,
    start_error_p99_ms: Option<Stat>,
    start_error_max_ms: Option<Stat>,
    behind_line_max_ms: Option<Stat>,
    requests_per_vm: Option<Stat>,
    failover_s: Option<Stat>,
    lease_gone_s: Option<Stat>,
}

#[derive(Debug, Serialize)]
struct Output {
    bench: &'static str,
    accelerator: &'static str,
    etcd: String,
    shape: Shape,
    load_ms: u64,
    start_ms: u64,
    restore_ms: u64,
    ttl_s: f64,
    host_cpus: usize,
    load_average: String,
    sizes: Vec<SizeResult>,
    goals: Vec<Goal>,
    failures: Vec<Failure>,
}

/// One simulated host: its own connection, its stand-ins, its participant.
struct SimHost {
    name: String,
    store: Arc<dyn Store>,
    vms: Arc<StandIn>,
    part: Option<Participant>,
}

impl SimHost {
    async fn join(&mut self, ttl: Duration) -> Result<(), Error> {
        let mut c = HostConfig::new(&self.name);
        c.ttl = ttl;
        let p = Participant::start(self.store.clone(), c, self.vms.clone())
            .await
            .map_err(|e| Error::Join(self.name.clone(), e))?;
        self.part = Some(p);
        Ok(())
    }
}

struct Bench {
    shape: Shape,
    ttl: Duration,
    submitter: Arc<dyn Store>,
    /// Watches and cleans up; not counted.
    admin: Arc<dyn Store>,
}

pub async fn run(a: ScaleArgs) -> Result<(), Error> {
    if a.sizes.iter().any(|&n| n < 2) || a.vms_per_host == 0 || a.waves == 0 {
        return Err(Error::Size);
    }
    let out = measure_all(&a).await?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(Error::Json)?
        );
    } else {
        print_text(&out);
    }
    let tried = a.sizes.len() * a.runs * if a.no_failover { 1 } else { 2 };
    Incomplete::check(&out.failures, tried)?;
    Ok(())
}

fn etcd_version(bin: &std::path::Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "etcd".into())
}

async fn measure_all(a: &ScaleArgs) -> Result<Output, Error> {
    let server = etcd::Etcd::start(&a.etcd).await?;
    let b = Bench {
        shape: Shape {
            vms_per_host: a.vms_per_host,
            waves: a.waves,
            line_s: a.line_ms as f64 / 1e3,
            wave_s: a.wave_ms as f64 / 1e3,
            chain: a.chain,
        },
        ttl: Duration::from_secs_f64(a.ttl),
        submitter: server.connect().await?,
        admin: server.connect().await?,
    };
    let mut failures = Vec::new();
    let mut sizes = Vec::new();
    for &n in &a.sizes {
        let nh = hosts_for(n, a.vms_per_host);
        let mut hosts = Vec::with_capacity(nh);
        for i in 0..nh {
            let mut h = SimHost {
                name: host_name(i),
                store: server.connect().await?,
                vms: Arc::new(StandIn::new(
                    Duration::from_millis(a.load_ms),
                    Duration::from_millis(a.start_ms),
                    Duration::from_millis(a.restore_ms),
                )),
                part: None,
            };
            h.join(b.ttl).await?;
            hosts.push(h);
        }
        let mut runs = Vec::new();
        let mut failovers = Vec::new();
        for r in 0..a.runs {
            let id = format!("scale-{n}-{}", r + 1);
            match b.restore(&hosts, &plan(&id, n, &b.shape)).await {
                Ok(f) => runs.push(f),
                Err(e) => failures.push(Failure::new(format!("{n} VMs restore"), r, &e)),
            }
            b.clean(&id).await;
            if a.no_failover {
                continue;
            }
            let id = format!("scale-{n}-{}-failover", r + 1);
            match b.failover(&mut hosts, &plan(&id, n, &b.shape)).await {
                Ok(f) => failovers.push(f),
                Err(e) => failures.push(Failure::new(format!("{n} VMs failover"), r, &e)),
            }
            b.clean(&id).await;
        }
        drop(hosts);
        let st = |f: fn(&RunFigures) -> f64| Stat::of(runs.iter().map(f));
        let medians = Medians {
            all_started_s: st(|f| f.all_started_s),
            all_restored_s: st(|f| f.all_restored_s),
            start_error_p50_ms: st(|f| f.start_error_p50_ms),
            start_error_p99_ms: st(|f| f.start_error_p99_ms),
            start_error_max_ms: st(|f| f.start_error_max_ms),
            behind_line_max_ms: st(|f| f.behind_line_max_ms),
            requests_per_vm: st(|f| f.requests_per_vm),
            failover_s: Stat::of(failovers.iter().map(|f| f.failover_s)),
            lease_gone_s: Stat::of(failovers.iter().map(|f| f.lease_gone_s)),
        };
        sizes.push(SizeResult {
            vms: n,
            hosts: nh,
            runs,
            failovers,
            medians,
        });
    }
    let rows: Vec<_> = sizes
        .iter()
        .map(|s| {
            (
                s.vms,
                s.medians.start_error_p99_ms,
                s.medians.failover_s,
                s.medians.requests_per_vm,
            )
        })
        .collect();
    let mut goals = goals(&rows, a.ttl);
    if a.no_failover {
        goals.retain(|g| !g.goal.starts_with("failover"));
    }
    Ok(Output {
        bench: "cluster-scale",
        accelerator: "no guests (stand-ins)",
        etcd: format!(
            "{}, one member, plain HTTP at {} (no TLS: the scale figure only), data on {}",
            etcd_version(&a.etcd),
            server.endpoint,
            if std::path::Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "the temp dir"
            }
        ),
        shape: b.shape.clone(),
        load_ms: a.load_ms,
        start_ms: a.start_ms,
        restore_ms: a.restore_ms,
        ttl_s: a.ttl,
        host_cpus: host_cpus(),
        load_average: load_average(),
        sizes,
        goals,
        failures,
    })
}

/// How long one restore may take before the run is given up.
const LIMIT: Duration = Duration::from_secs(300);

fn requests(hosts: &[SimHost], submitter: &Arc<dyn Store>) -> u64 {
    hosts.iter().map(|h| h.store.requests()).sum::<u64>() + submitter.requests()
}

/// Stand-ins of `plan` started more than once.
fn twice(hosts: &[SimHost], plan: &Plan) -> usize {
    plan.vms
        .iter()
        .filter(|v| {
            hosts
                .iter()
                .filter(|h| h.name == v.host)
                .any(|h| h.vms.calls(&plan.restore_id, &v.vm).starts > 1)
        })
        .count()
}

impl Bench {
    async fn restore(&self, hosts: &[SimHost], plan: &Plan) -> Result<RunFigures, Error> {
        let before = requests(hosts, &self.submitter);
        let t = unix_now_ns();
        submit(&*self.submitter, plan.clone(), Timeouts::default()).await?;
        let r = wait(&*self.submitter, &plan.restore_id, LIMIT, |_| {}).await?;
        let after = requests(hosts, &self.submitter);
        let mut f = figures(&r, plan, t);
        f.requests_per_vm = (after - before) as f64 / plan.vms.len() as f64;
        f.double_starts = twice(hosts, plan);
        check(&r, f.double_starts)?;
        Ok(f)
    }

    async fn failover(&self, hosts: &mut [SimHost], plan: &Plan) -> Result<FailoverFigures, Error> {
        let id = &plan.restore_id;
        let r = self.admin.range(&layout::phases(id)).await?;
        let mut view = ClusterView::from_kvs(&r.kvs, r.revision);
        let mut w = self
            .admin
            .watch(&layout::phases(id), r.revision + 1)
            .await?;
        let mut elected = self
            .admin
            .watch(&layout::election(id), r.revision + 1)
            .await?;
        submit(&*self.submitter, plan.clone(), Timeouts::default()).await?;
        let first = plan
            .vms
            .iter()
            .filter_map(|v| v.start_at_s)
            .fold(f64::INFINITY, f64::min);
        let wave0: Vec<&str> = plan
            .vms
            .iter()
            .filter(|v| v.start_at_s == Some(first))
            .map(|v| v.vm.as_str())
            .collect();
        let started = |v: &ClusterView| {
            v.restores.get(id).is_some_and(|r| {
                wave0
                    .iter()
                    .all(|vm| r.phases.get(*vm).is_some_and(|(p, _)| p.phase.ran()))
            })
        };
        let deadline = tokio::time::Instant::now() + LIMIT;
        while !started(&view) {
            for e in next(&mut w, deadline, id).await? {
                view.apply(&e);
            }
        }
        let leader = self
            .admin
            .leader(&layout::election(id))
            .await?
            .ok_or_else(|| Error::NoCoordinator(id.clone()))?;
        let coord = String::from_utf8_lossy(&leader.value).to_string();
        let i = hosts
            .iter()
            .position(|h| h.name == coord)
            .ok_or_else(|| Error::NoCoordinator(id.clone()))?;
        let dropped = unix_now_ns();
        hosts[i].part = None;
        hosts[i].join(self.ttl).await?;
        // The old coordinator's lease must go within its TTL and some slack.
        let limit = self.ttl * 4 + Duration::from_secs(20);
        let deadline = deadline.min(tokio::time::Instant::now() + limit);
        drop(w);
        let gone = 'gone: loop {
            for e in next(&mut elected, deadline, id).await? {
                if matches!(&e, Event::Delete { key, .. } if *key == leader.key) {
                    break 'gone unix_now_ns();
                }
            }
        };
        drop(elected);
        let r = wait(&*self.submitter, id, LIMIT, |_| {}).await?;
        let t0 = r.began_unix_ns;
        let at = |s: f64| t0 + (s * 1e9) as i64;
        let finished = at(r.duration_s);
        let named_new = r.coordinators.len() > 1;
        let first_write = r
            .vms
            .iter()
            .filter_map(|v| v.start_sent_s.map(at))
            .filter(|&t| t >= dropped)
            .chain(named_new.then_some(finished))
            .min();
        let secs = |t: Option<i64>| t.map_or(f64::NAN, |t| (t - dropped) as f64 / 1e9);
        let f = FailoverFigures {
            dropped: coord,
            coordinators: r.coordinators.clone(),
            failover_s: secs(first_write),
            lease_gone_s: secs(Some(gone)),
            state_names_new_s: secs(named_new.then_some(finished)),
            restored: r.outcome == rebound_coord::report::Outcome::Restored,
            double_starts: twice(hosts, plan),
        };
        check(&r, f.double_starts)?;
        Ok(f)
    }

    /// Deletes a restore's keys, so the next restore's hosts read a small store.
    async fn clean(&self, id: &str) {
        for prefix in [layout::phases(id), layout::restore(id)] {
            let Ok(r) = self.admin.range(&prefix).await else {
                return;
            };
            for chunk in r.kvs.chunks(100) {
                let ops = chunk.iter().map(|kv| Op::Delete(kv.key.clone())).collect();
                let _ = self.admin.txn(Vec::new(), ops).await;
            }
        }
    }
}

/// The next batch of a watch, by `deadline`.
async fn next(
    w: &mut rebound_store::Watch,
    deadline: tokio::time::Instant,
    id: &str,
) -> Result<Vec<Event>, Error> {
    match tokio::time::timeout_at(deadline, w.events.recv()).await {
        Err(_) => Err(Error::Stuck(
            id.to_string(),
            "the failover (the old coordinator's election key did not go)",
            LIMIT,
        )),
        Ok(Some(Ok(evs))) => Ok(evs),
        Ok(Some(Err(e))) => Err(Error::Store(e)),
        Ok(None) => Err(Error::Store(StoreError::Other("the watch ended".into()))),
    }
}

/// A restore that aborted or started a VM twice fails its run.
fn check(r: &RestoreReport, twice: usize) -> Result<(), Error> {
    if twice > 0 {
        return Err(Error::Twice(twice));
    }
    match &r.outcome {
        rebound_coord::report::Outcome::Restored => Ok(()),
        rebound_coord::report::Outcome::Aborted { reason } => {
            Err(Error::Aborted(r.restore_id.clone(), reason.clone()))
        }
        rebound_coord::report::Outcome::Running { status } => Err(Error::Aborted(
            r.restore_id.clone(),
            format!("still {status}"),
        )),
    }
}

fn print_text(o: &Output) {
    println!("rebound bench cluster-scale: the restore protocol over etcd with stand-in VMs");
    println!("accelerator: {}", o.accelerator);
    println!("etcd: {}", o.etcd);
    println!(
        "stand-ins: load {} ms, start {} ms, restore {} ms; host lease TTL {:.1} s",
        o.load_ms, o.start_ms, o.restore_ms, o.ttl_s
    );
    println!("plan: {}", o.shape.describe());
    println!(
        "failover: the coordinator's participant is dropped once the first wave started and joins again at once; failover = drop to the new coordinator's first write"
    );
    println!(
        "host: {} CPUs, load average {}; medians [min–max] over the runs",
        o.host_cpus, o.load_average
    );
    println!();
    println!(
        "{:>6} {:>5}  {:>20} {:>20} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17}",
        "VMs",
        "hosts",
        "all started s",
        "all restored s",
        "err p50 ms",
        "err p99 ms",
        "err max ms",
        "behind line ms",
        "etcd req/VM",
        "failover s",
        "lease gone s"
    );
    for s in &o.sizes {
        let m = &s.medians;
        println!(
            "{:>6} {:>5}  {:>20} {:>20} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17}",
            s.vms,
            s.hosts,
            show(&m.all_started_s, 2),
            show(&m.all_restored_s, 2),
            show(&m.start_error_p50_ms, 1),
            show(&m.start_error_p99_ms, 1),
            show(&m.start_error_max_ms, 1),
            show(&m.behind_line_max_ms, 0),
            show(&m.requests_per_vm, 2),
            show(&m.failover_s, 2),
            show(&m.lease_gone_s, 2),
        );
    }
    let twice: usize = o
        .sizes
        .iter()
        .flat_map(|s| {
            s.runs
                .iter()
                .map(|r| r.double_starts)
                .chain(s.failovers.iter().map(|f| f.double_starts))
        })
        .sum();
    println!();
    println!("stand-in VMs started twice: {twice}");
    for s in &o.sizes {
        for f in &s.failovers {
            println!(
                "{} VMs failover: dropped {}, coordinators {:?}, state named the new one {:.2} s after the drop",
                s.vms,
                f.dropped,
                f.coordinators,
                f.state_names_new_s
            );
        }
    }
    println!();
    for g in &o.goals {
        println!(
            "goal: {}: {} ({})",
            g.goal,
            if g.met { "met" } else { "NOT met" },
            g.seen
        );
    }
    for f in &o.failures {
        println!("{}", f.line());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole bench at a tiny size through a real etcd (it fails without one).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tiny_cluster_restores_and_fails_over_through_etcd() {
        let a = ScaleArgs {
            sizes: vec![20],
            vms_per_host: 5,
            runs: 1,
            load_ms: 100,
            start_ms: 5,
            restore_ms: 50,
            waves: 5,
            wave_ms: 100,
            line_ms: 800,
            chain: 3,
            ttl: 1.0,
            no_failover: false,
            etcd: "etcd".into(),
            json: false,
        };
        let o = measure_all(&a)
            .await
            .expect("etcd runs and the bench measures");
        assert!(o.failures.is_empty(), "{:?}", o.failures);
        let s = &o.sizes[0];
        assert_eq!((s.vms, s.hosts), (20, 4));
        let r = &s.runs[0];
        assert!(r.restored && r.double_starts == 0, "{r:?}");
        // Every VM started after the line's first instant and before it ended + slack.
        assert!(
            r.all_started_s > 0.8 && r.all_started_s < r.all_restored_s,
            "{r:?}"
        );
        assert!(r.requests_per_vm > 1.0 && r.requests_per_vm < 20.0, "{r:?}");
        assert!(r.start_error_p99_ms.is_finite(), "{r:?}");
        let f = &s.failovers[0];
        assert!(f.restored && f.double_starts == 0, "{f:?}");
        assert_eq!(f.coordinators.len(), 2, "{f:?}");
        assert_eq!(f.coordinators[0], f.dropped);
        // The old lease goes after its TTL, and only then can another coordinate.
        assert!(f.lease_gone_s >= 0.9 && f.failover_s >= 0.9, "{f:?}");
        assert!(f.failover_s < 10.0, "{f:?}");
        assert_eq!(o.accelerator, "no guests (stand-ins)");
    }
}
