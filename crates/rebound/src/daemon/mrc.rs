//! `vm mrc` (Hcache section 3.4): each Rebound-served disk with an exclusive host cache
//! traces the guest's misses and evictions and ranks every miss among the evicted
//! blocks; here those host-side curves are read from the backends and relabelled by
//! the guest's memory X, so that a point says how many reads a guest of that size
//! would have missed. The curve starts at X (every access that misses X is seen) and
//! reaches as far as the guest's evictions do.

use rebound_api::{DiskMrc, MrcPoint, MrcReport};
use rebound_blk::curve::{TraceConfig, TraceReport};
use rebound_mrc::MissRatioCurve;
use rebound_vmm::record::VmRecord;
use serde_json::json;

use super::backend_control::{self, ControlError};
use super::error::OpError;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// Default reach of a curve: this many times the VM's allocation.
const DEFAULT_REACH: u64 = 4;

/// The guest's memory X and its allocation X + Y (guest plus exclusive host caches),
/// bytes.
pub fn sizes(rec: &VmRecord) -> (u64, u64) {
    let total = rec.allocation_mib.unwrap_or(rec.spec.memory_mib) * MIB;
    let cache: u64 = rec
        .blk
        .iter()
        .filter(|p| p.serve.exclusive)
        .map(|p| p.serve.cache_bytes)
        .sum();
    (total.saturating_sub(cache), total)
}

fn no_exclusive_cache(name: &str) -> OpError {
    OpError::BadRequest(format!(
        "VM {name:?} has no exclusive host cache, so nothing traces what misses its memory: run `rebound vm memory {name} --host-cache SIZE` first (its disks must be served by Rebound's backend)"
    ))
}

fn ask(
    control: &std::path::Path,
    req: &serde_json::Value,
) -> Result<serde_json::Value, ControlError> {
    backend_control::ask(control, req).map_err(|e| match e {
        // The backend's own words: the report names the disk already.
        ControlError::Refused { answer, .. } => {
            ControlError::Said(answer.as_str().unwrap_or_default().to_string())
        }
        e => e,
    })
}

/// The backend's trace, up to `max_bytes` of host-side size (`None`: all of it).
fn trace(control: &std::path::Path, max_bytes: Option<u64>) -> Result<TraceReport, ControlError> {
    let v = ask(control, &json!({"op": "curve", "max_bytes": max_bytes}))?;
    serde_json::from_value(v).map_err(ControlError::Decode)
}

/// The curve of every disk with an exclusive cache, up to `max_bytes` of guest memory
/// (default: 4 times the allocation). Blocking: it asks the backends.
pub fn report(name: &str, rec: &VmRecord, max_bytes: Option<u64>) -> Result<MrcReport, OpError> {
    let (guest, allocation) = sizes(rec);
    let max = max_bytes.unwrap_or(allocation * DEFAULT_REACH);
    if max <= guest {
        return Err(OpError::BadRequest(format!(
            "max_bytes {} MiB is not above the guest's memory ({} MiB), where the curve starts",
            max / MIB,
            guest / MIB
        )));
    }
    let mut disks = Vec::new();
    for (i, f) in rec.disk_files.iter().enumerate() {
        let Some(p) = rec
            .blk
            .iter()
            .find(|p| &p.serve.disk == f && p.serve.exclusive)
        else {
            continue;
        };
        let id = format!("disk{i}");
        disks.push(match trace(&p.serve.control, Some(max - guest)) {
            Ok(t) => disk_curve(id, p.serve.cache_bytes, guest, max, &t),
            Err(e) => DiskMrc {
                id,
                host_cache_bytes: p.serve.cache_bytes,
                rate: 0.0,
                misses: 0,
                evicted_blocks: 0,
                inconsistent_blocks: 0,
                points: Vec::new(),
                detail: Some(format!(
                    "the disk's backend did not answer: {}",
                    rebound_errors::Chain(&e)
                )),
            },
        });
    }
    if disks.is_empty() {
        return Err(no_exclusive_cache(name));
    }
    Ok(MrcReport {
        guest_bytes: guest,
        allocation_bytes: allocation,
        disks,
    })
}

fn disk_curve(id: String, cache: u64, guest: u64, max: u64, t: &TraceReport) -> DiskMrc {
    let shifted = t
        .curve
        .as_ref()
        .map(|c| c.shifted(guest / PAGE, None).map_err(|e| e.to_string()));
    let (points, detail) = match shifted {
        None => (
            Vec::new(),
            Some("no read has missed the guest yet".to_string()),
        ),
        Some(Err(e)) => (Vec::new(), Some(e)),
        Some(Ok(c)) => (points(&c, guest + cache, max), None),
    };
    DiskMrc {
        id,
        host_cache_bytes: cache,
        rate: t.config.rate,
        misses: t.misses,
        evicted_blocks: t.evicted_blocks,
        inconsistent_blocks: t.inconsistent_blocks,
        points,
        detail,
    }
}

/// The curve's points in bytes of guest memory, with misses relative to those at
/// `allocation`. Past the farthest eviction a miss was found at, more memory saves
/// nothing: a last point at `max` shows that plateau.
fn points(c: &MissRatioCurve, allocation: u64, max: u64) -> Vec<MrcPoint> {
    let at_allocation = c.misses(allocation / PAGE).ok().filter(|m| *m > 0.0);
    let point = |(pages, misses): (u64, f64)| MrcPoint {
        bytes: pages * PAGE,
        misses,
        vs_allocation: at_allocation.map(|a| misses / a),
    };
    let mut v: Vec<MrcPoint> = c.points().map(point).collect();
    let end = max / PAGE / c.step() * c.step();
    if end > c.max_size() {
        v.push(point((end, c.misses(end).unwrap_or(0.0))));
    }
    v
}

/// Starts every exclusive disk's tracing afresh (`rate` < 1 samples blocks as SHARDS
/// does; `step_bytes` is the distance between points). Blocking.
pub fn restart(name: &str, rec: &VmRecord, config: TraceConfig) -> Result<u64, OpError> {
    let mut n = 0;
    for p in rec.blk.iter().filter(|p| p.serve.exclusive) {
        let req = json!({"op": "curve", "max_bytes": 0, "restart": config});
        ask(&p.serve.control, &req)
            .map_err(|e| OpError::Backend("restarting the curve".into(), e))?;
        n += 1;
    }
    if n == 0 {
        return Err(no_exclusive_cache(name));
    }
    Ok(n)
}

/// The guest's curve (shifted: sizes are the guest's memory, in pages) and its
/// allocation in bytes, for the allocator: exactly one disk must have traced one.
pub fn guest_curve(name: &str, rec: &VmRecord) -> Result<(MissRatioCurve, u64), OpError> {
    let (guest, allocation) = sizes(rec);
    let mut curves = Vec::new();
    for p in rec.blk.iter().filter(|p| p.serve.exclusive) {
        let t = trace(&p.serve.control, None)
            .map_err(|e| OpError::Backend(format!("VM {name:?}: its disk's backend"), e))?;
        if let Some(c) = t.curve {
            curves.push(c);
        }
    }
    match curves.len() {
        0 if rec.blk.iter().any(|p| p.serve.exclusive) => Err(OpError::BadRequest(format!(
            "VM {name:?} has no curve yet: no read has missed its memory since its host cache became exclusive"
        ))),
        0 => Err(no_exclusive_cache(name)),
        1 => {
            let c = curves.remove(0);
            let shifted = c
                .shifted(guest / PAGE, None)
                .map_err(|e| OpError::Broken(Box::new(e)))?;
            Ok((shifted, allocation))
        }
        n => Err(OpError::BadRequest(format!(
            "VM {name:?} has curves on {n} disks: one guest curve from several is not computed"
        ))),
    }
}
