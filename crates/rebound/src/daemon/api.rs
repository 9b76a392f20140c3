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
        .route("/v1/vms/{name}/crash", post(crash))
        .route("/v1/vms/{name}/marker", post(marker))
        .route("/v1/vms/{name}/events", get(events))
        .route("/v1/vms/{name}/logs", get(logs))
        .route("/v1/vms/{name}/vmcoreinfo", get(vmcoreinfo))
        .route("/v1/vms/{name}/dump", post(dump))
        .route("/v1/vms/{name}/snapshot", post(snapshot))
        .route("/v1/vms/{name}/resume", post(resume))
        .route("/v1/vms/{name}/pause", post(pause))
        .route("/v1/vms/{name}/settle", post(settle))
        .route("/v1/vms/{name}/reboot", post(reboot))
        .route("/v1/vms/{name}/restore", get(restore_report))
        .route("/v1/vms/{name}/disks", get(disks))
        .route("/v1/vms/{name}/memory", post(memory))
        .route("/v1/vms/{name}/evict", get(evict))
        .route("/v1/vms/{name}/mrc", get(mrc).post(mrc_restart))
        .route("/v1/memory/plan", post(memory_plan))
        .route("/v1/restore", post(restore))
        .route("/v1/cluster/restore", post(cluster_restore))
        .route("/v1/cluster/restores/{id}", get(cluster_restore_status))
        .route("/v1/vms/{name}/crashes", get(crashes))
        .route("/v1/vms/{name}/crashes/{id}", get(crash_report))
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

async fn crash(
    State(d): D,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> ApiResult<impl IntoResponse> {
    let hang = match q.get("how").map(String::as_str) {
        None | Some("panic") => false,
        Some("hang") => true,
        Some(other) => {
            return Err(OpError::BadRequest(format!(
                "cannot crash by {other:?}: expected panic or hang"
            ))
            .into())
        }
    };
    let s = d.find(&name)?.run_for_status(Job::Crash { hang }).await?;
    Ok((StatusCode::ACCEPTED, Json(s)))
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

async fn memory(
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
    let req = super::vm::MemoryRequest {
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

async fn dump(State(d): D, Path(name): Path<String>, body: Bytes) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let req: rebound_api::DumpRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid DumpRequest: {e}")))?;
    match vm.run(Job::Dump(Box::new(req))).await? {
        Done::Dump(r) => Ok(Json(*r)),
        _ => Err(OpError::Internal("dump job answered something else".into()).into()),
    }
}

async fn snapshot(
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

async fn reboot(
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

async fn resume(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    // A guest held by a coordinated snapshot goes on through that snapshot's job.
    if vm.release_hold() {
        return Ok(Json(vm.status()));
    }
    Ok(Json(vm.run_for_status(Job::Resume).await?))
}

async fn pause(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        vm_or_404(&d, &name)?.run_for_status(Job::Pause).await?,
    ))
}

async fn settle(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(
        vm_or_404(&d, &name)?.run_for_status(Job::Settle).await?,
    ))
}

async fn restore(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let req: rebound_api::RestoreRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid RestoreRequest: {e}")))?;
    Ok((StatusCode::CREATED, Json(d.restore(req).await?)))
}

/// Coordinates a cluster restore from here with the daemon's token; answers with
/// the report once every VM is restored or the restore was aborted.
async fn cluster_restore(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let c = d.cluster.get().ok_or_else(|| {
        OpError::BadRequest(
            "this daemon has no cluster token: start it with --cluster-token FILE".into(),
        )
    })?;
    let req: super::cluster::ClusterRestoreRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid cluster restore request: {e}")))?;
    let config = req.config.config().map_err(OpError::BadRequest)?;
    let report = rebound_coord::restore(&req.plan, &c.token, &config)
        .await
        .map_err(|e| OpError::BadRequest(chain(&e)))?;
    Ok(Json(report))
}

/// A cluster restore as this daemon's cohort saw it.
async fn cluster_restore_status(
    State(d): D,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let c = d.cluster.get().filter(|c| c.is_cohort()).ok_or_else(|| {
        OpError::BadRequest(
            "this daemon serves no cohort: start it with --listen ADDR:PORT --cluster-token FILE"
                .into(),
        )
    })?;
    Ok(Json(
        c.cohort_status(&id)
            .ok_or(OpError::UnknownClusterRestore(id))?,
    ))
}

async fn restore_report(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let r = vm.restore_report().ok_or_else(|| {
        ApiError(OpError::BadRequest(format!(
            "VM {name:?} was not restored from a snapshot"
        )))
    })?;
    Ok(Json(r))
}

/// The VM's disks: each file, what serves it, and for Rebound's backend its
/// process and statistics (asked of the backend's control socket).
async fn disks(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
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
    .map_err(|e| ApiError(OpError::Internal(e.to_string())))?;
    Ok(Json(out))
}

/// Eviction notices from the guest to the disk backends: where the ring is (or that
/// the guest has none) and what was read, lost, forwarded and answered.
async fn evict(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(vm_or_404(&d, &name)?.evict_stats()))
}

/// Divides the VMs' memory by their curves; with `apply`, moves it.
async fn memory_plan(State(d): D, body: Bytes) -> ApiResult<impl IntoResponse> {
    let req: rebound_api::PlanRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid plan request: {e}")))?;
    Ok(Json(super::memory_plan::plan(&d, req).await?))
}

/// The guest's miss-ratio curve, from its disks' exclusive host caches.
async fn mrc(
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
    let r = tokio::task::spawn_blocking(move || super::mrc::report(&name, &rec, max))
        .await
        .map_err(|e| ApiError(OpError::Internal(e.to_string())))??;
    Ok(Json(r))
}

/// Traces the curve afresh: `{"rate": R, "step_bytes": N}`, both optional.
async fn mrc_restart(
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
    let n = tokio::task::spawn_blocking(move || super::mrc::restart(&name, &rec, config))
        .await
        .map_err(|e| ApiError(OpError::Internal(e.to_string())))??;
    Ok(Json(
        json!({"disks": n, "rate": config.rate, "step_bytes": config.step_blocks * 4096}),
    ))
}

async fn crashes(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    Ok(Json(super::crashes::list(&vm.dir.path().join("crashes"))))
}

async fn crash_report(
    State(d): D,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let id = (id != "latest").then_some(id.as_str());
    Ok(Json(
        super::crashes::get(&vm.dir.path().join("crashes"), id).map_err(OpError::from)?,
    ))
}

async fn vmcoreinfo(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    Ok(Json(guest::vmcoreinfo(&d, &name).await?))
}
