//! `memory plan` (Hcache section 4.2): divides the memory the VMs hold now among them
//! from their miss-ratio curves, by isolated sharing (least geometric mean of the
//! VMs' miss ratios with no VM's predicted misses more than `bound - margin` over those
//! at its allocation now: the margin covers the curves' error) or the VMware ESX idle
//! memory tax; with `apply`, each VM's
//! allocation is changed to its share (the shrinking ones first, so the host never
//! holds more than before).

use std::sync::Arc;

use rebound_api::{Applied, MemoryPlan, PlanRequest, PlannedVm};
use rebound_mrc::alloc::{self, AllocError, EsxParams, Params, Vm};

use super::error::OpError;
use super::state::Daemon;
use super::vm::{Done, Job, MemoryRequest, VmHandle};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// The least a guest keeps (as `vm memory` guards).
const GUEST_MIN: u64 = 64 * MIB;

fn alloc_error(e: AllocError) -> OpError {
    OpError::BadRequest(format!("no plan: {e}"))
}

/// Plans, and applies if asked.
pub async fn plan(d: &Arc<Daemon>, req: PlanRequest) -> Result<MemoryPlan, OpError> {
    let unit = req.unit_bytes.unwrap_or(4 * MIB);
    if unit == 0 || !unit.is_multiple_of(PAGE) {
        return Err(OpError::BadRequest(format!(
            "unit_bytes must be a positive multiple of 4096, not {unit}"
        )));
    }
    let handles: Vec<Arc<VmHandle>> = match &req.vms {
        Some(names) => names.iter().map(|n| d.find(n)).collect::<Result<_, _>>()?,
        None => d
            .list()
            .into_iter()
            .filter(|h| h.record().blk.iter().any(|p| p.serve.exclusive))
            .collect(),
    };
    if handles.is_empty() {
        return Err(OpError::BadRequest(
            "no VM has a miss-ratio curve: give some an exclusive host cache first (`rebound vm memory NAME --host-cache SIZE`)".into(),
        ));
    }
    // The curves, asked of the backends.
    let recs: Vec<_> = handles
        .iter()
        .map(|h| (h.name.clone(), h.record()))
        .collect();
    let curves = tokio::task::spawn_blocking(move || {
        recs.iter()
            .map(|(n, r)| {
                super::mrc::guest_curve(n, r).map(|(c, alloc)| (c, alloc, r.spec.memory_mib * MIB))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(OpError::Task)??;
    let unit_pages = unit / PAGE;
    let down = |b: u64| b / PAGE / unit_pages * unit_pages;
    let vms: Vec<Vm<'_>> = curves
        .iter()
        .map(|(c, allocation, booted)| {
            // Never below what the curve covers (the allocator raises it there) or
            // the guest's floor, never above what the balloon can give back.
            Vm::new(c, allocation / PAGE).limits(GUEST_MIN / PAGE, down(*booted))
        })
        .collect();
    let held: u64 = curves.iter().map(|(_, a, _)| a).sum();
    let total = down(held);
    let params = Params {
        margin: req.margin.unwrap_or(alloc::DEFAULT_MARGIN),
        ..Params::new(total, unit_pages, req.bound.unwrap_or(0.05))
    };
    let (allocation, active) = match req.policy.as_str() {
        "isolated-sharing" => (
            alloc::isolated_sharing(&vms, &params).map_err(alloc_error)?,
            None,
        ),
        "esx-idle-tax" => {
            let esx = EsxParams {
                tax_rate: req.tax_rate.unwrap_or(alloc::DEFAULT_TAX_RATE),
                idle_tolerance: alloc::DEFAULT_IDLE_TOLERANCE,
            };
            let a = alloc::esx_idle_tax(&vms, &params, &esx).map_err(alloc_error)?;
            (a.allocation, Some(a.active))
        }
        p => {
            return Err(OpError::BadRequest(format!(
                "unknown policy {p:?}: isolated-sharing or esx-idle-tax"
            )))
        }
    };
    let mut planned: Vec<PlannedVm> = handles
        .iter()
        .zip(&curves)
        .zip(&allocation.vms)
        .enumerate()
        .map(|(i, ((h, (c, alloc_now, _)), o))| PlannedVm {
            name: h.name.clone(),
            baseline_bytes: *alloc_now,
            planned_bytes: o.size * PAGE,
            curve_from_bytes: c.base() * PAGE,
            predicted_misses: o.misses,
            baseline_misses: o.baseline_misses,
            relative: o.relative,
            within_bound: o.within_bound,
            within_margin: o.within_margin,
            active_bytes: active.as_ref().map(|a| a[i] * PAGE),
            applied: None,
        })
        .collect();
    if req.apply {
        apply(&handles, &mut planned).await;
    }
    Ok(MemoryPlan {
        policy: req.policy,
        bound: params.bound,
        margin: params.margin,
        unit_bytes: unit,
        total_bytes: total * PAGE,
        held_bytes: held,
        geo_mean_relative: allocation.geo_mean_relative,
        geo_mean_miss_ratio: allocation.geo_mean_miss_ratio,
        vms: planned,
    })
}

/// Shrinking VMs first, then growing ones; each result is kept with its VM. A VM
/// that shrinks gives its host cache first (the cache holds the guest's least recently
/// used pages, and giving it back needs nothing of the guest), then guest memory; one
/// that grows grows its guest, and keeps its host cache tracing the curve.
async fn apply(handles: &[Arc<VmHandle>], planned: &mut [PlannedVm]) {
    let mut order: Vec<usize> = (0..planned.len()).collect();
    order.sort_by_key(|&i| planned[i].planned_bytes > planned[i].baseline_bytes);
    for i in order {
        let p = &planned[i];
        let (guest, allocation) = super::mrc::sizes(&handles[i].record());
        let host_cache = allocation - guest;
        let cut = p.baseline_bytes.saturating_sub(p.planned_bytes);
        let job = Job::Memory(MemoryRequest {
            host_cache_bytes: Some(host_cache.saturating_sub(cut)),
            allocation_bytes: Some(p.planned_bytes),
        });
        let (allocation_bytes, error) = match handles[i].run(job).await {
            Ok(Done::HostCache(r)) => (Some(r.allocation_mib * MIB), None),
            Ok(_) => (
                None,
                Some("the memory job answered something else".to_string()),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        planned[i].applied = Some(Applied {
            allocation_bytes,
            error,
        });
    }
}
