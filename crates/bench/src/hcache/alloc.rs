//! The allocation part of `rebound bench hcache` (Hcache section 6.4, tables 2 and 3):
//! two VMs whose misses both fall with memory run side by side, each with half of its
//! allocation in its exclusive host cache so its curve is traced below and above its
//! memory; then `memory plan --policy isolated-sharing --apply` moves memory from one to
//! the other by those curves, and each VM's disk reads per request after the move are
//! compared with before it, measured, against what the plan predicted and the bound it
//! promised. Neither curve is flat, so the VM that gives memory away does read more
//! after the move, and whether that loss stays within the bound is measured, not given.
//! The ESX idle-tax plan of the same curves is reported beside it (not applied).
//!
//! The VMs run their requests in rounds without end; rounds 5 and 6 are the baseline
//! (rounds 1 to 4 warm the caches: 2,000 requests at the default 500 per round, after
//! which the uniform VM has read 95% of its files at least once), the plan is applied
//! when every VM has finished them, the round running then is the transition, and the
//! two after it the outcome.
//! Rounds draw different files from the same distribution, so a measured change
//! carries that noise (`baseline_round_ratio`, round 6 over round 5, shows its size),
//! and a round's reads are counted when the host sees its report (polled every 100 ms).
//!
//! The plan predicts from the whole trace, the warm-up's first reads of each file
//! included, which miss at every size and so dilute the change; the curve is also read
//! when rounds 4 and 6 are seen, and their difference (the baseline rounds' own misses
//! at each size) gives `window_predicted_relative`, the prediction to compare with the
//! measured change when the two differ.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use hyper::Method;
use rebound_api::{MemoryPlan, MrcReport, VmStatus};
use serde::Serialize;
use serde_json::{json, Value};

use super::setup::{backend, files_reports, io_spec, make_disk, IoRun};
use super::validate::predicted;
use crate::guest::{post, remove};
use rebound_client::Client;

const MIB: u64 = 1 << 20;
/// Each VM boots with more than its allocation, so a plan can grow it (a balloon
/// gives back only what it took); half the allocation is moved to the host cache to
/// trace the curve.
const BOOT_MIB: u64 = 384;
const ALLOCATION_MIB: u64 = 256;
const HOST_CACHE_MIB: u64 = 128;

/// The VMs: (role, pattern, files of 1 MiB). Both sets are larger than the allocation,
/// so both read less with more memory: a skewed one (Zipf, 1.0) whose popular files
/// gain much from a little more, and a uniform one whose misses fall in proportion to
/// its memory, so that it has memory to give but every MiB it gives costs it reads.
const VMS: [(&str, &str, u64); 2] = [("skewed", "zipf", 448), ("uniform", "random", 640)];

/// The baseline rounds (the ones before are the warm-up).
const BASE: (u64, u64) = (5, 6);

/// One VM's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct AllocVm {
    pub name: String,
    pub role: String,
    pub pattern: String,
    pub files: u64,
    pub baseline_mib: u64,
    pub planned_mib: u64,
    /// What its allocation became (`None`: the move failed, `error` says why).
    pub applied_mib: Option<u64>,
    pub error: Option<String>,
    pub baseline_reads_per_request: f64,
    pub outcome_reads_per_request: f64,
    /// Disk reads after the move over before it: as the plan predicted them (its whole
    /// trace), as the baseline rounds' part of the same trace predicts them, measured.
    pub predicted_relative: f64,
    pub window_predicted_relative: Option<f64>,
    pub measured_relative: f64,
    /// The second baseline round's disk reads per request over the first's, with no
    /// move between: the noise a measured change carries.
    pub baseline_round_ratio: f64,
    /// The plan's own check of its bound, and the measured one: the measured change
    /// at most 1 + bound.
    pub predicted_within_bound: bool,
    pub within_bound: bool,
}

/// The allocation experiment's results.
#[derive(Debug, Clone, Serialize)]
pub struct AllocOutcome {
    pub policy: String,
    pub bound: f64,
    pub requests_per_round: u64,
    pub vms: Vec<AllocVm>,
    /// VMs whose measured disk reads grew more than the bound.
    pub bound_violations: u64,
    /// VMs whose memory changed (no violation can be seen where nothing moved).
    pub vms_moved: u64,
    pub geo_mean_predicted: f64,
    pub geo_mean_measured: f64,
    /// The ESX idle-tax policy's plan of the same curves (not applied).
    pub esx: MemoryPlan,
}

/// Disk reads (the backend's cache misses) of VM `name` so far.
async fn disk_reads(c: &Client, name: &str) -> anyhow::Result<u64> {
    let (stats, _, _) = backend(c, name).await?;
    stats["cache"]["misses"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("{name}: its backend reports no cache misses: {stats}"))
}

/// Follows each VM's rounds: the disk reads counted when each round's report came,
/// and the curve then at the rounds in `curve_at`.
struct Rounds {
    /// Per VM: round → disk reads when its report was seen.
    seen: BTreeMap<String, BTreeMap<u64, u64>>,
    curve_at: Vec<u64>,
    curves: BTreeMap<(String, u64), MrcReport>,
}

impl Rounds {
    fn new(curve_at: Vec<u64>) -> Rounds {
        Rounds {
            seen: BTreeMap::new(),
            curve_at,
            curves: BTreeMap::new(),
        }
    }

    /// Waits until every VM has reported round `want(vm)`, recording each new round.
    async fn until(
        &mut self,
        c: &Client,
        want: &BTreeMap<String, u64>,
        deadline: Instant,
    ) -> anyhow::Result<()> {
        loop {
            let mut done = true;
            for (name, &round) in want {
                let reads = disk_reads(c, name).await?;
                let seen = self.seen.entry(name.clone()).or_default();
                let mut new = Vec::new();
                for r in files_reports(c, name).await? {
                    if r.errors > 0 {
                        anyhow::bail!(
                            "{name}: the guest read wrong data: {}",
                            r.first_error.unwrap_or_default()
                        );
                    }
                    if let std::collections::btree_map::Entry::Vacant(e) = seen.entry(r.round) {
                        e.insert(reads);
                        new.push(r.round);
                    }
                }
                done &= seen.contains_key(&round);
                for r in new.into_iter().filter(|r| self.curve_at.contains(r)) {
                    let mrc: MrcReport = c
                        .call(Method::GET, &format!("/v1/vms/{name}/mrc"), None)
                        .await?;
                    self.curves.insert((name.clone(), r), mrc);
                }
            }
            if done {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("the allocation VMs did not reach their rounds {want:?} in time");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Disk reads per request in rounds `from..=to` of `name`.
    fn per_request(&self, name: &str, from: u64, to: u64, requests: u64) -> f64 {
        let s = &self.seen[name];
        (s[&to] - s[&(from - 1)]) as f64 / ((to + 1 - from) * requests) as f64
    }

    /// What the curve's growth over rounds `from..=to` predicts: the misses those
    /// rounds would have had at `planned` bytes over those at `baseline`.
    fn window_relative(
        &self,
        name: &str,
        from: u64,
        to: u64,
        baseline: u64,
        planned: u64,
    ) -> Option<f64> {
        let a = self.curves.get(&(name.to_string(), from - 1))?;
        let b = self.curves.get(&(name.to_string(), to))?;
        window_relative(a, b, baseline, planned)
    }
}

/// Misses between curve `a` and the later `b` of the same VM at `planned` bytes over
/// those at `baseline` (floored at half a miss, as the allocator floors them).
fn window_relative(a: &MrcReport, b: &MrcReport, baseline: u64, planned: u64) -> Option<f64> {
    let between = |bytes| Some(predicted(b, bytes)? - predicted(a, bytes).unwrap_or(0.0));
    let floor = rebound_mrc::alloc::MISS_FLOOR;
    Some(between(planned)?.max(floor) / between(baseline)?.max(floor))
}

fn geo_mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x.max(1e-9).ln(), n + 1));
    if n == 0 {
        1.0
    } else {
        (sum / f64::from(n)).exp()
    }
}

/// VMs whose measured change is over `1 + bound`, and VMs whose memory moved.
fn violations(vms: &[AllocVm], bound: f64) -> (u64, u64) {
    let over = vms
        .iter()
        .filter(|v| v.measured_relative > 1.0 + bound)
        .count();
    let moved = vms
        .iter()
        .filter(|v| v.applied_mib.is_some_and(|a| a != v.baseline_mib))
        .count();
    (over as u64, moved as u64)
}

/// The experiment; its VMs are removed whatever happens.
pub async fn run(
    c: &Client,
    dir: &Path,
    tag: &str,
    requests: u64,
    bound: f64,
    progress: bool,
) -> anyhow::Result<AllocOutcome> {
    let names: Vec<String> = VMS.iter().map(|v| format!("{tag}-alloc-{}", v.0)).collect();
    let r = run_vms(c, dir, &names, requests, bound, progress).await;
    for n in &names {
        remove(c, n).await;
    }
    r
}

async fn run_vms(
    c: &Client,
    dir: &Path,
    names: &[String],
    requests: u64,
    bound: f64,
    progress: bool,
) -> anyhow::Result<AllocOutcome> {
    let say = |m: String| {
        if progress {
            eprintln!("bench hcache: allocation: {m}");
        }
    };
    for ((role, pattern, files), name) in VMS.iter().zip(names) {
        let sub = dir.join(format!("alloc-{role}"));
        std::fs::create_dir_all(&sub)?;
        let disk = make_disk(&sub, *files)?;
        say(format!("starting {name} ({pattern} over {files} files)"));
        let run = IoRun {
            pattern,
            files: *files,
            requests,
            rounds: 0,
            write_ratio: 0.0,
        };
        let s = io_spec(name, &disk, BOOT_MIB, &run);
        let _: VmStatus = post(c, "/v1/vms", Some(&serde_json::to_value(&s)?)).await?;
    }
    for name in names {
        let _: VmStatus = post(
            c,
            &format!("/v1/vms/{name}/wait?for=ready&timeout_ms=600000"),
            None,
        )
        .await?;
        let _: Value = post(
            c,
            &format!("/v1/vms/{name}/memory"),
            Some(&json!({"allocation_bytes": ALLOCATION_MIB * MIB, "host_cache_bytes": HOST_CACHE_MIB * MIB})),
        )
        .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(3600);
    let (from, to) = BASE;
    let mut rounds = Rounds::new(vec![from - 1, to]);
    let all = |r: u64| names.iter().map(|n| (n.clone(), r)).collect();
    say(format!("baseline: rounds {from} and {to}"));
    rounds.until(c, &all(to), deadline).await?;
    let plan = |policy: &str, apply: bool| json!({"policy": policy, "bound": bound, "vms": names, "apply": apply});
    let esx: MemoryPlan = post(c, "/v1/memory/plan", Some(&plan("esx-idle-tax", false))).await?;
    let applied: MemoryPlan =
        post(c, "/v1/memory/plan", Some(&plan("isolated-sharing", true))).await?;
    // The round each VM is in now is the transition; the next two the outcome.
    let mut outcome_round = BTreeMap::new();
    for name in names {
        let now = files_reports(c, name)
            .await?
            .iter()
            .map(|r| r.round)
            .max()
            .unwrap_or(0);
        outcome_round.insert(name.clone(), now + 3);
    }
    say(format!("plan applied; outcome rounds {outcome_round:?}"));
    rounds.until(c, &outcome_round, deadline).await?;
    let mut vms = Vec::new();
    for ((role, pattern, files), name) in VMS.iter().zip(names) {
        let p = applied
            .vms
            .iter()
            .find(|v| &v.name == name)
            .ok_or_else(|| anyhow::anyhow!("the plan left out {name}"))?;
        let before = rounds.per_request(name, from, to, requests);
        let end = outcome_round[name];
        let after = rounds.per_request(name, end - 1, end, requests);
        let measured = after / before.max(1e-9);
        vms.push(AllocVm {
            name: name.clone(),
            role: role.to_string(),
            pattern: pattern.to_string(),
            files: *files,
            baseline_mib: p.baseline_bytes / MIB,
            planned_mib: p.planned_bytes / MIB,
            applied_mib: p
                .applied
                .as_ref()
                .and_then(|a| a.allocation_bytes)
                .map(|b| b / MIB),
            error: p.applied.as_ref().and_then(|a| a.error.clone()),
            baseline_reads_per_request: before,
            outcome_reads_per_request: after,
            predicted_relative: p.relative,
            window_predicted_relative: rounds.window_relative(
                name,
                from,
                to,
                p.baseline_bytes,
                p.planned_bytes,
            ),
            measured_relative: measured,
            baseline_round_ratio: rounds.per_request(name, to, to, requests)
                / rounds.per_request(name, from, from, requests).max(1e-9),
            predicted_within_bound: p.within_bound,
            within_bound: measured <= 1.0 + bound,
        });
    }
    let (bound_violations, vms_moved) = violations(&vms, bound);
    Ok(AllocOutcome {
        policy: applied.policy.clone(),
        bound,
        requests_per_round: requests,
        bound_violations,
        vms_moved,
        geo_mean_predicted: geo_mean(vms.iter().map(|v| v.predicted_relative)),
        geo_mean_measured: geo_mean(vms.iter().map(|v| v.measured_relative)),
        vms,
        esx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_api::{DiskMrc, MrcPoint};

    #[test]
    fn rounds_give_reads_per_request_and_the_geometric_mean_is_one_when_empty() {
        let mut r = Rounds::new(Vec::new());
        r.seen.insert(
            "a".into(),
            BTreeMap::from([(1, 100), (2, 400), (3, 500), (5, 1000)]),
        );
        assert_eq!(r.per_request("a", 2, 2, 100), 3.0);
        assert_eq!(r.per_request("a", 2, 3, 100), 2.0);
        assert_eq!(geo_mean(std::iter::empty()), 1.0);
        assert!((geo_mean([2.0, 8.0].into_iter()) - 4.0).abs() < 1e-9);
    }

    fn curve(points: &[(u64, f64)]) -> MrcReport {
        MrcReport {
            guest_bytes: points[0].0 * MIB,
            allocation_bytes: 256 * MIB,
            disks: vec![DiskMrc {
                id: "disk0".into(),
                host_cache_bytes: 128 * MIB,
                rate: 1.0,
                misses: points[0].1 as u64,
                evicted_blocks: 0,
                inconsistent_blocks: 0,
                points: points
                    .iter()
                    .map(|&(m, misses)| MrcPoint {
                        bytes: m * MIB,
                        misses,
                        vs_allocation: None,
                    })
                    .collect(),
                detail: None,
            }],
        }
    }

    #[test]
    fn the_window_leaves_out_the_warm_ups_misses() {
        // Warm-up: 1000 first reads, a miss at every size. The baseline rounds then
        // miss 400 at 256 MiB and 500 at 224: 1.25x, where the whole trace says 1.07x.
        let a = curve(&[(128, 1600.0), (224, 1100.0), (256, 1080.0)]);
        let b = curve(&[(128, 2400.0), (224, 1600.0), (256, 1480.0)]);
        let w = window_relative(&a, &b, 256 * MIB, 224 * MIB).unwrap();
        assert!((w - 1.25).abs() < 1e-12, "{w}");
        let whole = predicted(&b, 224 * MIB).unwrap() / predicted(&b, 256 * MIB).unwrap();
        assert!(whole < 1.1);
        // No misses in the window at either size: the floor, not a division by zero.
        assert_eq!(window_relative(&b, &b, 256 * MIB, 224 * MIB), Some(1.0));
        // A size below where the later curve starts has no prediction.
        assert_eq!(window_relative(&a, &b, 256 * MIB, 64 * MIB), None);
    }

    fn vm(baseline: u64, applied: Option<u64>, measured: f64) -> AllocVm {
        AllocVm {
            name: "v".into(),
            role: "r".into(),
            pattern: "random".into(),
            files: 640,
            baseline_mib: baseline,
            planned_mib: applied.unwrap_or(baseline),
            applied_mib: applied,
            error: None,
            baseline_reads_per_request: 100.0,
            outcome_reads_per_request: 100.0 * measured,
            predicted_relative: 1.0,
            window_predicted_relative: None,
            measured_relative: measured,
            baseline_round_ratio: 1.0,
            predicted_within_bound: true,
            within_bound: measured <= 1.05,
        }
    }

    #[test]
    fn a_violation_is_a_measured_loss_over_the_bound() {
        let vms = [
            vm(256, Some(220), 1.049),
            vm(256, Some(292), 0.6),
            vm(256, Some(256), 1.2),
            vm(256, None, 1.051),
        ];
        // The third did not move yet read more (noise): still over the bound, counted.
        assert_eq!(violations(&vms, 0.05), (2, 2));
        assert_eq!(violations(&vms, 0.25), (0, 2));
        assert_eq!(violations(&vms[..2], 0.0), (1, 2));
    }
}
