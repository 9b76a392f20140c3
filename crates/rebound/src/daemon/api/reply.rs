//! What every route answers with: the JSON error body with its status, and the
//! checks of a request's name, body fields and query numbers.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use rebound_api::ErrorBody;

use crate::daemon::error::OpError;
use crate::daemon::state::Daemon;
use crate::daemon::vm::VmHandle;
use rebound_errors::chain;

pub(super) struct ApiError(pub(super) OpError);

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

pub(super) type ApiResult<T> = Result<T, ApiError>;

pub(super) type D = State<Arc<Daemon>>;

impl ApiError {
    /// One line naming the problem, with its sources, whatever they said.
    pub(super) fn into_response_with(self, status: StatusCode) -> Response {
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

pub(super) fn vm_or_404(d: &Daemon, name: &str) -> ApiResult<Arc<VmHandle>> {
    d.get(name)
        .ok_or_else(|| ApiError(OpError::UnknownVm(name.to_string())))
}

/// Field `key` of a JSON request body, converted; else a one-line bad request saying
/// what it must be.
pub(super) fn body_field<T>(
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

/// Query parameter `key` as a number from 0 to `max`, if given.
pub(super) fn query_u64(
    q: &HashMap<String, String>,
    key: &str,
    max: u64,
) -> Result<Option<u64>, OpError> {
    q.get(key)
        .map(|v| match v.parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(OpError::BadRequest(format!(
                "{key} {v:?} is not a number from 0 to {max}"
            ))),
        })
        .transpose()
}
