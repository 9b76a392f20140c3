//! Routes of a VM's crashes: crash it on request, dump it now, its crash reports and
//! the VMCOREINFO its guest published.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;

use super::reply::{vm_or_404, ApiResult, D};
use crate::daemon::error::OpError;
use crate::daemon::guest;
use crate::daemon::vm::{Done, Job};

pub(super) async fn crash(
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

pub(super) async fn dump(
    State(d): D,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let req: rebound_api::DumpRequest = serde_json::from_slice(&body)
        .map_err(|e| OpError::BadRequest(format!("invalid DumpRequest: {e}")))?;
    match vm.run(Job::Dump(Box::new(req))).await? {
        Done::Dump(r) => Ok(Json(*r)),
        _ => Err(OpError::Internal("dump job answered something else".into()).into()),
    }
}

pub(super) async fn crashes(State(d): D, Path(name): Path<String>) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    Ok(Json(crate::daemon::crashes::list(
        &vm.dir.path().join("crashes"),
    )))
}

pub(super) async fn crash_report(
    State(d): D,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let vm = vm_or_404(&d, &name)?;
    let id = (id != "latest").then_some(id.as_str());
    Ok(Json(
        crate::daemon::crashes::get(&vm.dir.path().join("crashes"), id).map_err(OpError::from)?,
    ))
}

pub(super) async fn vmcoreinfo(
    State(d): D,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(guest::vmcoreinfo(&d, &name).await?))
}
