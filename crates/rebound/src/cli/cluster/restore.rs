//! `rebound cluster restore NAME --from DIR`: a cluster snapshot restored into the
//! cluster's hosts through its store (HotRestore section 4).
//!
//! The plan is [`rebound_cluster::restore`]'s: this side opens the snapshots, probes a
//! host's load rate when none is known, keeps the rates in the cluster's state, frees
//! the VMs' names on their hosts, grants the plan's hosts access to the restore's
//! records, submits the plan to the store (the hosts' daemons elect a coordinator
//! and carry it out), follows it to its report, and reports it with each VM's
//! backoff and disruption ([`rebound_cluster::disruption`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use hyper::Method;
use rebound_cluster::restore::{PlanOpts, Rates};
use rebound_cluster::snapshot::{traffic_of, Manifest};
use rebound_cluster::{Disruption, RdgEdge, RestoreLine};
use rebound_coord::report::RestoreReport;
use serde::Serialize;
use serde_json::{json, Value};

// The bench drivers restore by these names.
pub use rebound_cluster::restore::{Variant, VmFigures};

use super::{enc, Cluster};

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
    /// How each VM's pages reach its guest.
    pub path: rebound_api::LoadPath,
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
    rebound_cluster::restore::figures(&c.spec, m, from, |cv, dir| {
        let snap = rebound_snapshot::Snapshot::open(dir)
            .with_context(|| format!("the snapshot of VM {:?} ({})", cv.name, dir.display()))?;
        Ok(snap.manifest().clone())
    })
}

/// Where cluster `c` keeps the load rates of restores on `path`: one file per path,
/// since the page server reads in runs with `O_DIRECT` and the page cache reads
/// ahead, so a host loads at a different rate on each.
fn rates_file(c: &Cluster, path: rebound_api::LoadPath) -> PathBuf {
    match path {
        rebound_api::LoadPath::PageCache => c.dir.join(Rates::FILE),
        p => c.dir.join(format!("{}-{}", p.as_str(), Rates::FILE)),
    }
}

/// The load rates recorded for cluster `c` on `path` (none if the file is missing or
/// unreadable).
fn recorded_rates(c: &Cluster, path: rebound_api::LoadPath) -> Rates {
    Rates::parse(std::fs::read(rates_file(c, path)).ok().as_deref())
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

/// Records each host's load rate as this restore measured it.
fn record_rates(c: &Cluster, path: rebound_api::LoadPath, figs: &[VmFigures], r: &RestoreReport) {
    let mut recorded = recorded_rates(c, path);
    let loads = r.vms.iter().map(|v| (v.vm.as_str(), v.pages, v.load_s));
    recorded.record(figs, &r.restore_id, loads);
    let _ = std::fs::write(rates_file(c, path), recorded.to_vec());
}

/// The coordinator's plan for one variant.
fn build_plan(
    c: &Cluster,
    figs: &[VmFigures],
    edges: &[RdgEdge],
    opts: &RestoreOpts,
    replay: &BTreeMap<String, PathBuf>,
) -> anyhow::Result<(rebound_coord::Plan, Option<RestoreLine>)> {
    let (planned, line) = rebound_cluster::restore::plan(figs, edges, &plan_opts(opts))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut vms = Vec::new();
    for (f, p) in figs.iter().zip(planned) {
        let host = c.spec.host(&f.host).context("host of a VM")?;
        let mut args = json!({
            "dir": f.dir.display().to_string(),
            "mode": opts.variant.vm_mode(),
        });
        // Named unless it is the default: a host whose daemon predates the page
        // server reads the arguments of a default restore as before.
        if opts.path != rebound_api::LoadPath::default() {
            args["path"] = json!(opts.path);
        }
        if let Some(p) = replay.get(&f.vm) {
            args["replay"] = json!([{ "nic": 1, "pcap": p.display().to_string() }]);
        }
        vms.push(rebound_coord::PlanVm {
            vm: p.vm,
            host: host.name.clone(),
            ws_pages: p.ws_pages,
            args,
            depends_on: p.depends_on,
            start_at_s: p.start_at_s,
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

fn plan_opts(o: &RestoreOpts) -> PlanOpts {
    PlanOpts {
        variant: o.variant,
        margin_s: o.margin_s,
        no_wait: o.no_wait,
    }
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
    plan_opts(opts).check()?;
    // The snapshots are checked against the cluster before their dumps are read.
    let m = Manifest::read(from)?;
    let mut figs = figures(c, &m, from)?;
    let traffic = traffic_of(from, &m, 1)?;
    let rate_source = recorded_rates(c, opts.path).assign(&mut figs, opts.load_rate, probe_rate)?;
    let edges = traffic.rdg.edges.clone();
    let replay = m.replay_files(from);
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
    let report = super::store::submit_and_wait(
        &c.admin_store().await?,
        &mut c.admin_access().await?,
        plan.clone(),
        rebound_coord::records::Timeouts::default(),
    )
    .await?;
    record_rates(c, opts.path, &figs, &report);
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
        replayed_frames: m.in_flight(),
    })
}

/// Prints an outcome as a table.
pub fn print(o: &Outcome) {
    super::report::print_report(&o.report);
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
