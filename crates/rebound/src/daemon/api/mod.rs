//! HTTP routes of `api/openapi.yaml`. Every error is `{"error": "<one line>"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use rebound_api::{ErrorBody, Health, VmSpec};

use super::error::{chain, OpError};
use super::guest;
use super::state::{Daemon, WaitFor};
use super::vm::{Done, Job, VmHandle};

mod crashes;
mod hcache;
mod snapshots;

/// Default for `wait` without `timeout_ms`.
const DEFAULT_WAIT_MS: u64 = 120_000;

struct ApiError(OpError);

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        self.into_response_with(status)
    }
}

type ApiResult<T> = Result<T, ApiError>;
type D = State<Arc<Daemon>>;

pub fn router(d: Arc<Daemon>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/daemon/shutdown", post(shutdown))
        .route("/v1/vms", get(list).post(start))
        .route("/v1/vms/{name}", get(status).delete(remove))
        .route("/v1/vms/{name}/wait", post(wait))
        .route("/v1/vms/{name}/stop", post(stop))
        .route("/v1/vms/{name}/kill", post(kill))
        .route("/v1/vms/{name}/crash", post(crashes::crash))
        .route("/v1/vms/{name}/marker", post(marker))
        .route("/v1/vms/{name}/events", get(events))
        .route("/v1/vms/{name}/logs", get(logs))
        .route("/v1/vms/{name}/vmcoreinfo", get(crashes::vmcoreinfo))
        .route("/v1/vms/{name}/dump", post(crashes::dump))
        .route("/v1/vms/{name}/snapshot", post(snapshots::snapshot))
        .route("/v1/vms/{name}/resume", post(snapshots::resume))
        .route("/v1/vms/{name}/pause", post(snapshots::pause))
        .route("/v1/vms/{name}/settle", post(snapshots::settle))
        .route("/v1/vms/{name}/reboot", post(snapshots::reboot))
        .route("/v1/vms/{name}/restore", get(snapshots::restore_report))
        .route("/v1/vms/{name}/disks", get(hcache::disks))
        .route("/v1/vms/{name}/memory", post(hcache::memory))
        .route("/v1/vms/{name}/evict", get(hcache::evict))
        .route(
            "/v1/vms/{name}/mrc",
            get(hcache::mrc).post(hcache::mrc_restart),
        )
        .route("/v1/memory/plan", post(hcache::memory_plan))
        .route("/v1/restore", post(snapshots::restore))
        .route("/v1/cluster/restore", post(snapshots::cluster_restore))
        .route(
            "/v1/cluster/restores/{id}",
            get(snapshots::cluster_restore_status),
        )
        .route("/v1/vms/{name}/crashes", get(crashes::crashes))
        .route("/v1/vms/{name}/crashes/{id}", get(crashes::crash_report))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError(OpError::BadRequest("no such endpoint".into()))
                .into_response_with(StatusCode::NOT_FOUND)
        })
        .with_state(d)
}

impl ApiError {
    /// One line naming the problem, with its sources, whatever they said.
    fn into_response_with(self, status: StatusCode) -> Response {
        if status.is_server_error() {
            tracing::error!("{}", chain(&self.0));
        }
        (
            status,
            Json(ErrorBody {
                error: chain(&self.0),
            }),
        )
            .into_response()
    }
}

async fn health(State(d): D) -> impl IntoResponse {
    Json(Health {
        pid: std::process::id(),
        version: crate::VERSION.to_string(),
        socket: d.socket.display().to_string(),
    })
}

pub(super) async fn metrics(State(d): D) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)],
        d.metrics_text(),
    )
}

async fn shutdown(State(d): D) -> impl IntoResponse {
    d.shutdown.notify_one();
    (StatusCode::ACCEPTED, Json(json!({})))
}

async fn list(State(d): D) -> impl IntoResponse {
    Json(d.list().iter().map(|v| v.status()).collect::<Vec<_>>())
}

async fn start(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let spec: VmSpec = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid VmSpec: {e}")))?;
    let s = d.start(spec).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

fn vm_or_404(d: &Daemon, name: &str) -> ApiResult<Arc<VmHandle>> {
    d.get(name)
        .ok_or_else(|| ApiError(OpError::UnknownVm(name.to_string())))
}

async fn status(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(vm_or_404(&d, &name)?.status()))
}

async fn remove(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.remove(&name)?))
}

async fn wait(
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

async fn stop(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.find(&name)?.run_for_status(Job::Stop).await?))
}

async fn kill(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(d.find(&name)?.run_for_status(Job::Kill).await?))
}

/// Field `key` of a JSON request body, converted; else a one-line bad request saying
/// what it must be.
fn body_field<T>(
    body: &[u8],
    key: &str,
    what: &str,
    conv: impl FnOnce(&serde_json::Value) -> Option<T>,
) -> Result<T, OpError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| OpError::BadRequest(format!("invalid JSON: {e}")))?;
    v.get(key)
        .and_then(conv)
        .ok_or_else(|| OpError::BadRequest(format!("{key} ({what}) is required")))
}

async fn marker(
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
const EVENTS_PAGE: u64 = 1000;
/// Serial log bytes served without `bytes` (at most the log's cap).
const LOGS_TAIL: u64 = 1 << 20;

/// Query parameter `key` as a number from 0 to `max`, if given.
fn query_u64(q: &HashMap<String, String>, key: &str, max: u64) -> Result<Option<u64>, OpError> {
    q.get(key)
        .map(|v| match v.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(OpError::BadRequest(format!(
                "{key} {v:?} is not a number from 0 to {max}"
            ))),
        })
        .transpose()
}

/// A page of the event log: after `since` (a `seq`), oldest first; else the newest.
async fn events(
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
        .map_err(|e| OpError::Internal(chain(&e)))?;
    Ok(Json(evs))
}

/// The tail of the serial log: the last `bytes` (default [`LOGS_TAIL`]).
async fn logs(
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
