//! The allocation part of `rebound bench hcache` (Hcache section 6.4, tables 2 and 3):
//! three VMs with different needs run side by side, each with half of its allocation
//! in its exclusive host cache so its curve is traced below and above its memory; then
//! `memory plan --policy isolated-sharing --apply` moves memory between them, and each
//! VM's disk reads per request after the move are compared with before it, measured,
//! against what the plan predicted and the bound it promised. The ESX idle-tax plan of
//! the same curves is reported beside it (not applied).
//!
//! The VMs run their requests in rounds without end; rounds 3 and 4 are the baseline
//! (rounds 1 and 2 warm the caches), the plan is applied when every VM has finished
//! them, the round running then is the transition, and the two after it the outcome. Rounds draw
//! different files from the same distribution, so a measured change carries that noise,
//! and a round's reads are counted when the host sees its report (polled every 100 ms).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rebound_api::{MemoryPlan, VmStatus};
use serde::Serialize;
use serde_json::{json, Value};

use super::setup::{backend, files_reports, io_spec, make_disk, IoRun};
use crate::guest::{post, remove};
use rebound_client::Client;

const MIB: u64 = 1 << 20;
/// Each VM boots with more than its allocation, so a plan can grow it (a balloon
/// gives back only what it took); half the allocation is moved to the host cache to
/// trace the curve.
const BOOT_MIB: u64 = 384;
const ALLOCATION_MIB: u64 = 256;
const HOST_CACHE_MIB: u64 = 128;

/// The three VMs: (role, pattern, files of 1 MiB). One whose set is larger than its
/// allocation and skewed (gains from memory), one looping over more than any size
/// (gains nothing), one whose hot set fits in less (can give memory away).
const VMS: [(&str, &str, u64); 3] = [
    ("needy", "zipf", 448),
    ("loop", "seq", 448),
    ("small", "class", 160),
];

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
    /// Predicted and measured disk reads after the move over before it.
    pub predicted_relative: f64,
    pub measured_relative: f64,
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

/// Follows each VM's rounds: the disk reads counted when each round's report came.
struct Rounds {
    /// Per VM: round → disk reads when its report was seen.
    seen: BTreeMap<String, BTreeMap<u64, u64>>,
}

impl Rounds {
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
                for r in files_reports(c, name).await? {
                    if r.errors > 0 {
                        anyhow::bail!(
                            "{name}: the guest read wrong data: {}",
                            r.first_error.unwrap_or_default()
                        );
                    }
                    seen.entry(r.round).or_insert(reads);
                }
                done &= seen.contains_key(&round);
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
}

fn geo_mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x.max(1e-9).ln(), n + 1));
    if n == 0 {
        1.0
    } else {
        (sum / f64::from(n)).exp()
    }
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
    let mut rounds = Rounds {
        seen: BTreeMap::new(),
    };
    let all = |r: u64| names.iter().map(|n| (n.clone(), r)).collect();
    say("baseline: rounds 3 and 4".into());
    rounds.until(c, &all(4), deadline).await?;
    let plan = |policy: &str, apply: bool| json!({"policy": policy, "bound": bound, "vms": names, "apply": apply});
    let esx: MemoryPlan = post(c, "/v1/memory/plan", Some(&plan("esx-idle-tax", false))).await?;
    let applied: MemoryPlan =
        post(c, "/v1/memory/plan", Some(&plan("isolated-sharing", true))).await?;
    // The round each VM is in now is the transition; the next one the outcome.
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
        let before = rounds.per_request(name, 3, 4, requests);
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
            measured_relative: measured,
            within_bound: measured <= 1.0 + bound,
        });
    }
    Ok(AllocOutcome {
        policy: applied.policy.clone(),
        bound,
        requests_per_round: requests,
        bound_violations: vms.iter().filter(|v| !v.within_bound).count() as u64,
        geo_mean_predicted: geo_mean(vms.iter().map(|v| v.predicted_relative)),
        geo_mean_measured: geo_mean(vms.iter().map(|v| v.measured_relative)),
        vms,
        esx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_give_reads_per_request_and_the_geometric_mean_is_one_when_empty() {
        let mut r = Rounds {
            seen: BTreeMap::new(),
        };
        r.seen.insert(
            "a".into(),
            BTreeMap::from([(1, 100), (2, 400), (3, 500), (5, 1000)]),
        );
        assert_eq!(r.per_request("a", 2, 2, 100), 3.0);
        assert_eq!(r.per_request("a", 2, 3, 100), 2.0);
        assert_eq!(geo_mean(std::iter::empty()), 1.0);
        assert!((geo_mean([2.0, 8.0].into_iter()) - 4.0).abs() < 1e-9);
    }
}
