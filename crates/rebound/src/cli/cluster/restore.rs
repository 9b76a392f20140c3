//! `rebound cluster restore NAME --from DIR`: a cluster snapshot restored into the
//! cluster's hosts, coordinated by the first host's daemon (HotRestore section 4).
//!
//! 1. The cluster manifest and every VM's snapshot are checked against the cluster
//!    (same VMs, each snapshot of that VM with that NIC): a mismatch stops the
//!    restore before anything is touched.
//! 2. Each VM's figures: its working-set trace, its default elastic working set (half
//!    the paper's estimate) and its RAM; each host's load rate in pages per second,
//!    from the last restore of this cluster (written to `load-rates.json` in the
//!    cluster's state) or, the first time, probed by reading working-set pages of
//!    that host's snapshots.
//! 3. The plan, by variant: `working-set` (each VM loads its whole traced working set
//!    and starts when loaded), `elastic` (its default elastic working set, starts when
//!    loaded), `line` (the restore dependency graph from the frames recorded after the
//!    snapshot point, the restore line by LP, each VM's working set revised to its
//!    point on the line; it starts at that point once the VMs it sends to have
//!    started, rings together), `line-keep` (the same, with no VM started before
//!    its elastic working set is loaded: the line only delays).
//! 4. `POST /v1/cluster/restore` on the coordinator; its report, and each VM's
//!    backoff and disruption ([`rebound_cluster::disruption`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::ValueEnum;
use hyper::Method;
use rebound_cluster::{Disruption, RdgEdge, RestoreLine};
use rebound_coord::report::RestoreReport;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::snapshot::{Manifest, ManifestVm};
use super::{enc, Cluster};

/// How the VMs are restored (HotRestore section 6.2's three mechanisms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// Each VM loads its whole working set and starts when loaded.
    WorkingSet,
    /// Each VM loads its elastic working set and starts when loaded.
    Elastic,
    /// Elastic working sets revised to the restore line; started on it.
    Line,
    /// The same line with no VM started before its elastic working set is loaded:
    /// starts only move later and working sets only grow.
    LineKeep,
}

impl Variant {
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::WorkingSet => "working-set",
            Variant::Elastic => "elastic",
            Variant::Line => "line",
            Variant::LineKeep => "line-keep",
        }
    }
}

/// What a restore from a cluster snapshot is asked to do.
#[derive(Clone, Debug)]
pub struct RestoreOpts {
    pub variant: Variant,
    /// Pages per second every host loads at (else measured, see the module doc).
    pub load_rate: Option<f64>,
    /// Seconds a receiver is up before a VM that sends to it.
    pub margin_s: f64,
    /// Kill and remove the cluster's VMs that exist before restoring.
    pub replace: bool,
    /// No VM waits after its whole RAM is loaded (the paper's model; a line may then
    /// not exist).
    pub no_wait: bool,
}

/// One VM's figures.
#[derive(Clone, Debug, Serialize)]
pub struct VmFigures {
    pub vm: String,
    pub host: String,
    pub dir: PathBuf,
    pub trace_pages: u64,
    pub elastic_pages: u64,
    pub total_pages: u64,
    pub load_rate: f64,
}

/// What one restore did.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub variant: Variant,
    pub figures: Vec<VmFigures>,
    /// Where each host's load rate came from.
    pub rate_source: BTreeMap<String, String>,
    pub edges: Vec<RdgEdge>,
    pub line: Option<RestoreLine>,
    pub plan: rebound_coord::Plan,
    pub report: RestoreReport,
    /// `None` unless every VM started.
    pub disruption: Option<Disruption>,
    /// Frames replayed into guests (in flight at the cut).
    pub replayed_frames: u64,
}

/// Checks the snapshot against the cluster and reads each VM's figures (rates not
/// yet known: 0).
fn figures(c: &Cluster, m: &Manifest, from: &Path) -> anyhow::Result<Vec<VmFigures>> {
    let by_name: BTreeMap<&str, &ManifestVm> = m.vms.iter().map(|v| (v.vm.as_str(), v)).collect();
    for v in &m.vms {
        if !c.spec.vms.iter().any(|cv| cv.name == v.vm) {
            bail!(
                "the cluster snapshot holds VM {:?}, which cluster {} does not have",
                v.vm,
                c.spec.name
            );
        }
    }
    let mut out = Vec::new();
    for cv in &c.spec.vms {
        let Some(mv) = by_name.get(cv.name.as_str()) else {
            bail!(
                "VM {:?} of cluster {} is not in the cluster snapshot {}",
                cv.name,
                c.spec.name,
                from.display()
            );
        };
        if mv.ip != cv.ip {
            bail!(
                "VM {:?} had address {} in the cluster snapshot but has {} in cluster {}",
                cv.name,
                mv.ip,
                cv.ip,
                c.spec.name
            );
        }
        let dir = from.join(&mv.dir);
        let snap = rebound_snapshot::Snapshot::open(&dir)
            .with_context(|| format!("the snapshot of VM {:?} ({})", cv.name, dir.display()))?;
        let man = snap.manifest();
        let nic0 = man.spec["nics"][0].as_str().unwrap_or_default();
        if man.vm != cv.name || !nic0.contains(&format!("mac={}", mv.mac)) {
            bail!(
                "{} is a snapshot of VM {:?} (NIC {:?}), not of VM {:?} with MAC {}",
                dir.display(),
                man.vm,
                nic0,
                cv.name,
                mv.mac
            );
        }
        let Some(info) = &man.trace else {
            bail!(
                "the snapshot of VM {:?} has no working-set trace: it cannot be restored on a line",
                cv.name
            );
        };
        let total: u64 = man.ram_blocks.iter().map(|b| b.size / 4096).sum();
        out.push(VmFigures {
            vm: cv.name.clone(),
            host: cv.host.clone(),
            dir,
            trace_pages: info.pages,
            elastic_pages: info.default_elastic_pages().min(info.pages),
            total_pages: total,
            load_rate: 0.0,
        });
    }
    Ok(out)
}

const RATES: &str = "load-rates.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Rates {
    /// Host → (pages per second, the restore that measured it).
    hosts: BTreeMap<String, (f64, String)>,
}

impl Rates {
    /// The rates recorded for cluster `c` (none if the file is missing or unreadable).
    fn load(c: &Cluster) -> Rates {
        std::fs::read(c.dir.join(RATES))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }
}

/// Reads working-set pages of one snapshot in trace order, for at most 0.5 s or
/// 16,384 pages: pages per second.
fn probe_rate(dir: &Path) -> anyhow::Result<f64> {
    use std::os::unix::fs::FileExt;
    let snap = rebound_snapshot::Snapshot::open(dir)?;
    let trace = snap.trace()?.context("no trace")?;
    let files: Vec<std::fs::File> = snap
        .manifest()
        .ram_blocks
        .iter()
        .map(|b| std::fs::File::open(snap.path_of(&b.file)))
        .collect::<Result<_, _>>()?;
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let mut n = 0u64;
    for p in trace.pages.iter().take(16_384) {
        files[p.block as usize].read_at(&mut buf, p.page * 4096)?;
        n += 1;
        if t.elapsed().as_secs_f64() > 0.5 {
            break;
        }
    }
    let s = t.elapsed().as_secs_f64().max(1e-6);
    Ok(n.max(1) as f64 / s)
}

/// Each host's load rate, and where it came from.
fn rates(
    c: &Cluster,
    figs: &mut [VmFigures],
    given: Option<f64>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let recorded = Rates::load(c);
    let mut source = BTreeMap::new();
    let mut per_host: BTreeMap<String, f64> = BTreeMap::new();
    for f in figs.iter() {
        if per_host.contains_key(&f.host) {
            continue;
        }
        let (rate, from) = match (given, recorded.hosts.get(&f.host)) {
            (Some(r), _) => (r, "--load-rate".to_string()),
            (None, Some((r, by))) if r.is_finite() && *r > 0.0 => (*r, format!("measured by {by}")),
            _ => (
                probe_rate(&f.dir)?,
                format!("probed on the snapshot of {}", f.vm),
            ),
        };
        if !(rate.is_finite() && rate > 0.0) {
            bail!("the load rate must be a positive number of pages per second, got {rate}");
        }
        per_host.insert(f.host.clone(), rate);
        source.insert(f.host.clone(), from);
    }
    for f in figs.iter_mut() {
        f.load_rate = per_host[&f.host];
    }
    Ok(source)
}

/// Records each host's load rate as this restore measured it (pages over load time,
/// QEMU's start included, summed over the host's VMs).
fn record_rates(c: &Cluster, figs: &[VmFigures], r: &RestoreReport) {
    let mut recorded = Rates::load(c);
    let mut sums: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for v in &r.vms {
        let (Some(p), Some(s), Some(f)) = (v.pages, v.load_s, figs.iter().find(|f| f.vm == v.vm))
        else {
            continue;
        };
        let e = sums.entry(f.host.as_str()).or_default();
        e.0 += p;
        e.1 += s;
    }
    for (h, (p, s)) in sums {
        if p > 0 && s > 0.0 {
            recorded.hosts.insert(
                h.to_string(),
                (p as f64 / s, format!("restore {}", r.restore_id)),
            );
        }
    }
    if let Ok(b) = serde_json::to_vec_pretty(&recorded) {
        let _ = std::fs::write(c.dir.join(RATES), b);
    }
}

/// The coordinator's plan for one variant.
fn build_plan(
    c: &Cluster,
    figs: &[VmFigures],
    edges: &[RdgEdge],
    opts: &RestoreOpts,
    replay: &BTreeMap<String, PathBuf>,
) -> anyhow::Result<(rebound_coord::Plan, Option<RestoreLine>)> {
    let line = match opts.variant {
        Variant::Line | Variant::LineKeep => {
            let input = rebound_cluster::LineInput {
                vms: figs
                    .iter()
                    .map(|f| rebound_cluster::VmLoad {
                        name: f.vm.clone(),
                        working_set_pages: f.elastic_pages,
                        total_pages: f.total_pages,
                        load_rate_pages_per_s: f.load_rate,
                    })
                    .collect(),
                dependencies: edges
                    .iter()
                    .map(|e| rebound_cluster::Dependency {
                        sender: e.sender.clone(),
                        receiver: e.receiver.clone(),
                        margin_s: opts.margin_s,
                    })
                    .collect(),
                may_wait: !opts.no_wait,
                keep_working_sets: opts.variant == Variant::LineKeep,
            };
            Some(rebound_cluster::line::solve(&input)?)
        }
        _ => None,
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut vms = Vec::new();
    for f in figs {
        let host = c.spec.host(&f.host).context("host of a VM")?;
        let mut args = json!({
            "dir": f.dir.display().to_string(),
            "mode": if opts.variant == Variant::WorkingSet { "working-set" } else { "elastic" },
        });
        if let Some(p) = replay.get(&f.vm) {
            args["replay"] = json!([{ "nic": 1, "pcap": p.display().to_string() }]);
        }
        let (ws, deps, at) = match (&line, opts.variant) {
            (Some(l), _) => {
                let s = l
                    .vms
                    .iter()
                    .find(|v| v.name == f.vm)
                    .context("a VM on the line")?;
                let deps = edges
                    .iter()
                    .filter(|e| e.sender == f.vm)
                    .map(|e| e.receiver.clone())
                    .collect();
                (s.revised_working_set_pages, deps, Some(s.revised_start_s))
            }
            (None, Variant::WorkingSet) => (f.trace_pages, Vec::new(), None),
            (None, _) => (f.elastic_pages, Vec::new(), None),
        };
        vms.push(rebound_coord::PlanVm {
            vm: f.vm.clone(),
            cohort: host.daemon.to_string(),
            // 0 would mean "the daemon's default"; a VM on the line at 0 s loads
            // one page.
            ws_pages: ws.clamp(1, f.trace_pages.max(1)),
            args,
            depends_on: deps,
            start_at_s: at,
        });
    }
    Ok((
        rebound_coord::Plan {
            restore_id: format!("{}-{}-{stamp}", c.spec.name, opts.variant.as_str()),
            vms,
        },
        line,
    ))
}

/// Kills and removes a VM if its host has it; whether it had.
pub async fn remove_vm(link: &super::HostLink, vm: &str) -> anyhow::Result<bool> {
    let path = format!("/v1/vms/{}", enc(vm));
    if link.call(Method::GET, &path, None).await.is_err() {
        return Ok(false);
    }
    let _ = link.call(Method::POST, &format!("{path}/kill"), None).await;
    let _ = link
        .call(
            Method::POST,
            &format!("{path}/wait?for=stopped&timeout_ms=20000"),
            None,
        )
        .await;
    link.call(Method::DELETE, &path, None)
        .await
        .with_context(|| format!("cannot remove VM {vm:?}"))?;
    Ok(true)
}

/// Restores the cluster snapshot `from` into cluster `c`.
pub async fn restore(c: &Cluster, from: &Path, opts: &RestoreOpts) -> anyhow::Result<Outcome> {
    if !(opts.margin_s >= 0.0 && opts.margin_s < 60.0) {
        bail!("--margin-s must be 0 or more seconds (and under 60)");
    }
    // The snapshots are checked against the cluster before their dumps are read.
    let m = Manifest::read(from)?;
    let mut figs = figures(c, &m, from)?;
    let traffic = super::snapshot::traffic_of(from, &m, 1)?;
    let rate_source = rates(c, &mut figs, opts.load_rate)?;
    let edges = traffic.rdg.edges.clone();
    let replay = super::snapshot::replay_files(from, &m);
    let (plan, line) = build_plan(c, &figs, &edges, opts, &replay)?;
    // The names must be free on their hosts.
    for f in &figs {
        let link = c.link(&f.host)?;
        if opts.replace {
            remove_vm(&link, &f.vm).await?;
            continue;
        }
        let path = format!("/v1/vms/{}", enc(&f.vm));
        if link.call(Method::GET, &path, None).await.is_ok() {
            bail!(
                "VM {:?} exists on host {:?}: pass --replace to kill and remove the cluster's VMs first",
                f.vm,
                f.host
            );
        }
    }
    let coordinator = c.link(&c.spec.hosts[0].name)?;
    let body = json!({ "plan": plan });
    let report: RestoreReport = serde_json::from_value(
        coordinator
            .call(Method::POST, "/v1/cluster/restore", Some(&body))
            .await
            .context("the cluster restore")?,
    )
    .context("the coordinator's report")?;
    record_rates(c, &figs, &report);
    let starts: BTreeMap<String, f64> = report
        .vms
        .iter()
        .filter_map(|v| v.start_s.map(|s| (v.vm.clone(), s)))
        .collect();
    let disruption = if starts.len() == figs.len() {
        Some(rebound_cluster::disruption(&starts, &edges)?)
    } else {
        None
    };
    Ok(Outcome {
        variant: opts.variant,
        figures: figs,
        rate_source,
        edges,
        line,
        plan,
        report,
        disruption,
        replayed_frames: replay_count(&m),
    })
}

fn replay_count(m: &Manifest) -> u64 {
    m.vms.iter().map(|v| v.in_flight).sum()
}

/// Prints an outcome as a table.
pub fn print(o: &Outcome) {
    super::coord::print_report(&o.report);
    for (h, s) in &o.rate_source {
        let rate = o
            .figures
            .iter()
            .find(|f| &f.host == h)
            .map_or(0.0, |f| f.load_rate);
        println!("host {h}: load rate {rate:.0} pages/s ({s})");
    }
    if let Some(d) = &o.disruption {
        println!(
            "{:<20} {:>10} {:>9} {:>10} {:>12}",
            "VM", "WS_PAGES", "START_S", "BACKOFF_S", "DISRUPTION_S"
        );
        for v in &d.vms {
            let ws = o
                .plan
                .vms
                .iter()
                .find(|p| p.vm == v.vm)
                .map_or(0, |p| p.ws_pages);
            println!(
                "{:<20} {:>10} {:>9.3} {:>10.3} {:>12.3}",
                v.vm, ws, v.start_s, v.backoff_s, v.disruption_s
            );
        }
        println!(
            "{} restore: backoff max {:.3} s, average {:.3} s over {} pairs; disruption average {:.3} s; starts spread over {:.3} s",
            o.variant.as_str(),
            d.max_backoff_s,
            d.avg_backoff_s,
            o.edges.len(),
            d.avg_disruption_s,
            d.start_spread_s
        );
    }
}

/// The CLI's JSON of an outcome.
pub fn to_json(o: &Outcome) -> Value {
    serde_json::to_value(o).unwrap_or(Value::Null)
}
