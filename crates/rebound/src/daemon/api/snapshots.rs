//! Routes of snapshots and restores: save, restore (one VM or a cluster), resume a
//! held restore, pause, settle, reboot, and a restore's report.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::reply::{vm_or_404, ApiError, ApiResult, D};
use crate::daemon::error::OpError;
use crate::daemon::state::Daemon;
use crate::daemon::vm::{Done, Job};

pub(super) async fn snapshot(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let req: rebound_api::SnapshotRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid SnapshotRequest: {e}")))?;
    match vm.run(Job::Snapshot(Box::new(req))).await? {
        Done::Snapshot(r) => Ok((StatusCode::CREATED, Json(*r))),
        _ => Err(OpError::Internal("snapshot job answered something else".into()).into()),
    }
}

pub(super) async fn reboot(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let req: rebound_api::RebootRequest = if body.is_empty() {
        Default::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| OpError::BadRequest(format!("invalid RebootRequest: {e}")))?
    };
    match vm.run(Job::Reboot(req)).await? {
        Done::Reboot(r) => Ok(Json(*r)),
        _ => Err(OpError::Internal("reboot job answered something else".into()).into()),
    }
}

pub(super) async fn resume(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    // A guest held by a coordinated snapshot goes on through that snapshot's job.
    if vm.release_hold() {
        return Ok(Json(vm.status()));
    }
    Ok(Json(vm.run_for_status(Job::Resume).await?))
}

pub(super) async fn pause(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        vm_or_404(&d, &name)?.run_for_status(Job::Pause).await?,
    ))
}

pub(super) async fn settle(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        vm_or_404(&d, &name)?.run_for_status(Job::Settle).await?,
    ))
}

pub(super) async fn restore(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let req: rebound_api::RestoreRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid RestoreRequest: {e}")))?;
    Ok((StatusCode::CREATED, Json(d.restore(req).await?)))
}

/// Submits a cluster restore to the cluster store and follows it to its end;
/// answers with the report once every VM is restored or the restore was aborted.
pub(super) async fn cluster_restore(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let c = cluster(&d)?;
    let req: crate::daemon::cluster::request::ClusterRestoreRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid cluster restore request: {e}")))?;
    let id = req.plan.restore_id.clone();
    let limit = req.timeouts.limit();
    rebound_coord::submit::submit(&*c.store, req.plan, req.timeouts)
        .await
        .map_err(|e| OpError::BadInput(Box::new(e)))?;
    let report = rebound_coord::submit::wait(&*c.store, &id, limit, |_| {})
        .await
        .map_err(|e| OpError::BadInput(Box::new(e)))?;
    Ok(Json(report))
}

/// A cluster restore as the cluster store records it (running or ended).
pub(super) async fn cluster_restore_status(
    State(d): D,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let c = cluster(&d)?;
    // Read from the store: this daemon follows only its own VMs' phases.
    let report = rebound_coord::submit::read_report(&*c.store, &id)
        .await
        .map_err(|e| OpError::BadInput(Box::new(e)))?;
    Ok(Json(report.ok_or(OpError::UnknownClusterRestore(id))?))
}

fn cluster(d: &Daemon) -> Result<&crate::daemon::cluster::Cluster, OpError> {
    d.cluster
        .get()
        .ok_or_else(|| OpError::BadRequest("this daemon takes no part in cluster restores".into()))
}

pub(super) async fn restore_report(
    State(d): D,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let r = vm.restore_report().ok_or_else(|| {
        ApiError(OpError::BadRequest(format!(
            "VM {name:?} was not restored from a snapshot"
        )))
    })?;
    Ok(Json(r))
}
