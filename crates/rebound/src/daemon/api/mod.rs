//! HTTP routes of `api/openapi.yaml`. Every error is `{"error": "<one line>"}`.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

use super::error::OpError;
use super::state::Daemon;

mod crashes;
mod hcache;
mod reply;
mod snapshots;
mod vms;

use reply::ApiError;
pub(crate) use vms::metrics;
use vms::*;

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
