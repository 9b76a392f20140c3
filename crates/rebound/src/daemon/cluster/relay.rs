//! The API relay's far end ([`rebound_coord::relay::CohortApi`]): an authenticated
//! call from another host goes to this daemon's own router in-process, so every
//! endpoint answers with the same validation and errors as on the socket. Calls
//! under `/v1/daemon/` are refused: a remote host must not stop this daemon.

use std::sync::{Arc, Weak};

use axum::body::Body;
use axum::http::{header, Request};
use rebound_coord::relay::{ApiAnswer, CohortApi};
use tower::ServiceExt;

use crate::daemon::api;
use crate::daemon::state::Daemon;

/// The most bytes of one relayed answer read from the router (the relay's frame
/// cap is smaller still; a larger answer becomes a 502 there).
const MAX_ANSWER: usize = 8 << 20;

pub struct DaemonApi {
    d: Weak<Daemon>,
}

impl DaemonApi {
    pub fn new(d: &Arc<Daemon>) -> Self {
        Self {
            d: Arc::downgrade(d),
        }
    }
}

/// Why a relayed call is refused before it reaches the router, if it is.
pub fn refused(path: &str) -> Option<String> {
    let p = path.split('?').next().unwrap_or(path);
    (p == "/v1/daemon" || p.starts_with("/v1/daemon/")).then(|| {
        format!("{p} is not relayed: a remote host must not stop or reconfigure this daemon")
    })
}

#[async_trait::async_trait]
impl CohortApi for DaemonApi {
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> ApiAnswer {
        if let Some(why) = refused(path) {
            tracing::warn!(%method, %path, "relayed call refused");
            return ApiAnswer::error(403, why);
        }
        let Some(d) = self.d.upgrade() else {
            return ApiAnswer::error(503, "the daemon is shutting down");
        };
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = match Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(bytes))
        {
            Ok(r) => r,
            Err(e) => return ApiAnswer::error(400, format!("the relayed call is malformed: {e}")),
        };
        let resp = match api::router(d).oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let status = resp.status().as_u16();
        let json = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json"));
        let bytes = match axum::body::to_bytes(resp.into_body(), MAX_ANSWER).await {
            Ok(b) => b,
            Err(e) => {
                return ApiAnswer::error(502, format!("cannot read the daemon's answer: {e}"))
            }
        };
        let body = if json {
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => {
                    return ApiAnswer::error(502, format!("the daemon's answer is not JSON: {e}"))
                }
            }
        } else {
            serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        ApiAnswer { status, body }
    }
}

#[cfg(test)]
mod tests {
    use super::refused;

    #[test]
    fn daemon_calls_are_refused() {
        assert!(refused("/v1/daemon/shutdown").is_some());
        assert!(refused("/v1/daemon/shutdown?now=1").is_some());
        assert!(refused("/v1/daemon").is_some());
        assert!(refused("/v1/vms/daemon").is_none());
        assert!(refused("/v1/vms").is_none());
    }
}
