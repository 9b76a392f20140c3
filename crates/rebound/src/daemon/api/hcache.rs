//! Routes of the host cache (Hcache): the VM's memory split, its disks' backends,
//! eviction notices, miss-ratio curves and the memory plan between VMs.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::reply::{vm_or_404, ApiError, ApiResult, D};
use crate::daemon::error::OpError;
use crate::daemon::vm::{Done, Job};

pub(super) async fn memory(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let v: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid JSON: {e}")))?;
    let field = |key: &str| match v.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| {
            OpError::BadRequest(format!("{key} must be a non-negative integer, not {x}"))
        }),
    };
    let req = crate::daemon::vm::MemoryRequest {
        host_cache_bytes: field("host_cache_bytes")?,
        allocation_bytes: field("allocation_bytes")?,
    };
    if req.host_cache_bytes.is_none() && req.allocation_bytes.is_none() {
        return Err(OpError::BadRequest(
            "host_cache_bytes or allocation_bytes (a non-negative integer) is required".into(),
        )
        .into());
    }
    match vm.run(Job::Memory(req)).await? {
        Done::HostCache(r) => Ok(Json(*r)),
        _ => Err(OpError::Internal("memory job answered something else".into()).into()),
    }
}

/// The VM's disks: each file, what serves it, and for Rebound's backend its
/// process and statistics (asked of the backend's control socket).
pub(super) async fn disks(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let rec = vm.record();
    let out = tokio::task::spawn_blocking(move || {
        rec.disk_files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let blk = rec.blk.iter().find(|p| &p.serve.disk == f);
                let stats = blk.map(|p| {
                    rebound_blk::serve::ask(&p.serve.control, &serde_json::json!({"op": "stats"}))
                        .unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
                });
                serde_json::json!({
                    "id": format!("disk{i}"),
                    "file": f,
                    "backend": if blk.is_some() { "rebound" } else { "qemu" },
                    "pid": blk.map(|p| p.pid),
                    "control": blk.map(|p| &p.serve.control),
                    "stats": stats,
                })
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError(OpError::Task(e)))?;
    Ok(Json(out))
}

/// Eviction notices from the guest to the disk backends: where the ring is (or that
/// the guest has none) and what was read, lost, forwarded and answered.
pub(super) async fn evict(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(vm_or_404(&d, &name)?.evict_stats()))
}

/// Divides the VMs' memory by their curves; with `apply`, moves it.
pub(super) async fn memory_plan(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let req: rebound_api::PlanRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid plan request: {e}")))?;
    Ok(Json(crate::daemon::plan::plan(&d, req).await?))
}

/// The guest's miss-ratio curve, from its disks' exclusive host caches.
pub(super) async fn mrc(
    State(d): D,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let rec = vm_or_404(&d, &name)?.record();
    let max = match q.get("max_bytes") {
        Some(t) => Some(t.parse::<u64>().map_err(|_| {
            OpError::BadRequest(format!("max_bytes {t:?} is not a number of bytes"))
        })?),
        None => None,
    };
    let r = tokio::task::spawn_blocking(move || crate::daemon::mrc::report(&name, &rec, max))
        .await
        .map_err(|e| ApiError(OpError::Task(e)))??;
    Ok(Json(r))
}

/// Traces the curve afresh: `{"rate": R, "step_bytes": N}`, both optional.
pub(super) async fn mrc_restart(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let rec = vm_or_404(&d, &name)?.record();
    let v: serde_json::Value = match body.is_empty() {
        true => json!({}),
        false => serde_json::from_slice(&body)
            .map_err(|e| OpError::BadRequest(format!("invalid JSON: {e}")))?,
    };
    let mut config = rebound_blk::curve::TraceConfig::default();
    if let Some(r) = v.get("rate") {
        config.rate = r.as_f64().ok_or_else(|| {
            OpError::BadRequest("rate (a number in (0, 1]) is not a number".into())
        })?;
    }
    if let Some(s) = v.get("step_bytes") {
        let s = s
            .as_u64()
            .filter(|s| s % 4096 == 0 && *s > 0)
            .ok_or_else(|| {
                OpError::BadRequest("step_bytes must be a positive multiple of 4096".into())
            })?;
        config.step_blocks = s / 4096;
    }
    let n = tokio::task::spawn_blocking(move || crate::daemon::mrc::restart(&name, &rec, config))
        .await
        .map_err(|e| ApiError(OpError::Task(e)))??;
    Ok(Json(
        json!({"disks": n, "rate": config.rate, "step_bytes": config.step_blocks * 4096}),
    ))
}
