//! Routes of the daemon and of a VM's life: health, metrics, shutdown, the VM list,
//! start, status, remove, wait, stop, kill, markers, events and logs.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use rebound_api::{Health, VmSpec};

use super::reply::{body_field, query_u64, vm_or_404, ApiResult, D};
use crate::daemon::error::OpError;
use crate::daemon::guest;
use crate::daemon::state::WaitFor;
use crate::daemon::vm::{Done, Job};

/// Default for `wait` without `timeout_ms`.
pub(super) const DEFAULT_WAIT_MS: u64 = 120_000;

pub(super) async fn health(State(d): D) -> impl IntoResponse {
    Json(Health {
        pid: std::process::id(),
        version: crate::VERSION.to_string(),
        socket: d.socket.display().to_string(),
    })
}

pub(crate) async fn metrics(State(d): D) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::daemon::metrics::CONTENT_TYPE)],
        d.metrics_text(),
    )
}

pub(super) async fn shutdown(State(d): D) -> impl IntoResponse {
    d.shutdown.notify_one();
    (StatusCode::ACCEPTED, Json(json!({})))
}

pub(super) async fn list(State(d): D) -> impl IntoResponse {
    Json(d.list().iter().map(|v| v.status()).collect::<Vec<_>>())
}

pub(super) async fn start(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let spec: VmSpec = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid VmSpec: {e}")))?;
    let s = d.start(spec).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

pub(super) async fn status(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(vm_or_404(&d, &name)?.status()))
}

pub(super) async fn remove(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.remove(&name)?))
}

pub(super) async fn wait(
    State(d): D,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    vm_or_404(&d, &name)?;
    let w: WaitFor = q
        .get("for")
        .ok_or_else(|| OpError::BadRequest("query parameter `for` is required".into()))?
        .parse()?;
    let ms = match q.get("timeout_ms") {
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| OpError::BadRequest(format!("timeout_ms {t:?} is not a number")))?,
        None => DEFAULT_WAIT_MS,
    };
    Ok(Json(d.wait(&name, w, Duration::from_millis(ms)).await?))
}

pub(super) async fn stop(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.find(&name)?.run_for_status(Job::Stop).await?))
}

pub(super) async fn kill(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.find(&name)?.run_for_status(Job::Kill).await?))
}

pub(super) async fn marker(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let hex = body_field(&body, "value_hex", "string", |v| {
        v.as_str().map(str::to_string)
    })?;
    guest::check_marker_hex(&hex)?;
    match vm.run(Job::Marker(hex)).await? {
        Done::Marker(m) => Ok(Json(m)),
        _ => Err(OpError::Internal("marker job answered something else".into()).into()),
    }
}

/// Events one page holds without `limit`.
pub(super) const EVENTS_PAGE: u64 = 1000;

/// Serial log bytes served without `bytes` (at most the log's cap).
pub(super) const LOGS_TAIL: u64 = 1 << 20;

/// A page of the event log: after `since` (a `seq`), oldest first; else the newest.
pub(super) async fn events(
    State(d): D,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let since = query_u64(&q, "since", u64::MAX)?;
    let max = rebound_vmm::events::MAX_PAGE as u64;
    let limit = query_u64(&q, "limit", max)?.unwrap_or(EVENTS_PAGE);
    let evs = vm
        .events
        .page(since, limit as usize)
        .map_err(|e| OpError::Broken(Box::new(e)))?;
    Ok(Json(evs))
}

/// The tail of the serial log: the last `bytes` (default [`LOGS_TAIL`]).
pub(super) async fn logs(
    State(d): D,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let max = d.logs.serial;
    let bytes = query_u64(&q, "bytes", max)?.unwrap_or(LOGS_TAIL.min(max));
    let path = vm.dir.serial_log();
    let tail = rebound_vmm::logcap::tail(&path, bytes)
        .map_err(|e| OpError::Io(format!("cannot read {}", path.display()), e))?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        String::from_utf8_lossy(&tail).into_owned(),
    ))
}
