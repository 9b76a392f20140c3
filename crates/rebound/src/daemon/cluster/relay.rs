//! The API relay's far end ([`rebound_coord::relay::CohortApi`]): an authenticated
//! call from another host goes to this daemon's own router in-process, so every
//! endpoint answers with the same validation and errors as on the socket.
//!
//! A peer holds the cluster token, not this daemon's user's rights, so the relay
//! carries an allow-list ([`admit`]): the reads an operator needs, the lifecycle
//! calls a cluster controller makes (start a VM from a spec that names no host path,
//! wait, stop, kill, pause, resume, remove) and the cluster-restore operations. A
//! relayed snapshot is written into this daemon's snapshot store. Nothing else is
//! relayed: no dump, no restore from a directory, no daemon control, no memory plan.

use std::sync::{Arc, Weak};

use axum::body::Body;
use axum::http::{header, Request};
use rebound_coord::relay::{ApiAnswer, CohortApi};
use tower::ServiceExt;

use crate::daemon::api;
use crate::daemon::state::Daemon;
use rebound_vmm::paths::Paths;

/// The most bytes of one relayed answer read from the router (the relay's frame
/// cap is smaller still; a larger answer becomes a 502 there).
const MAX_ANSWER: usize = 8 << 20;

pub struct DaemonApi {
    d: Weak<Daemon>,
    /// A peer sending refused calls in a loop must not flood the log.
    refusals: std::sync::Mutex<rebound_vmm::ratelimit::RateLimit>,
}

impl DaemonApi {
    pub fn new(d: &Arc<Daemon>) -> Self {
        Self {
            d: Arc::downgrade(d),
            refusals: std::sync::Mutex::new(rebound_vmm::ratelimit::RateLimit::new(
                10,
                std::time::Duration::from_secs(60),
            )),
        }
    }
}

/// What a relayed call may be: its method and path pattern (`*` is one segment).
const ALLOWED: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("GET", "/v1/vms"),
    ("GET", "/v1/vms/*"),
    ("GET", "/v1/vms/*/events"),
    ("GET", "/v1/vms/*/logs"),
    ("GET", "/v1/vms/*/restore"),
    ("GET", "/v1/vms/*/disks"),
    ("GET", "/v1/vms/*/crashes"),
    ("GET", "/v1/vms/*/crashes/*"),
    ("GET", "/v1/cluster/restores/*"),
    ("GET", "/metrics"),
    ("POST", "/v1/vms"),
    ("POST", "/v1/vms/*/wait"),
    ("POST", "/v1/vms/*/stop"),
    ("POST", "/v1/vms/*/kill"),
    ("POST", "/v1/vms/*/pause"),
    ("POST", "/v1/vms/*/resume"),
    ("POST", "/v1/vms/*/snapshot"),
    ("DELETE", "/v1/vms/*"),
    ("POST", "/v1/cluster/restore"),
];

fn matches(pattern: &str, path: &str) -> bool {
    let (mut p, mut q) = (pattern.split('/'), path.split('/'));
    loop {
        match (p.next(), q.next()) {
            (None, None) => return true,
            (Some("*"), Some(seg)) if !seg.is_empty() && seg != "." && seg != ".." => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Whether a relayed call may run, and the body it runs with: `Err` says why not.
/// A snapshot's `out` is rewritten into this daemon's snapshot store; a VM spec must
/// name no host path.
pub fn admit(
    paths: &Paths,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, String> {
    let p = path.split('?').next().unwrap_or(path);
    if !ALLOWED
        .iter()
        .any(|(m, pat)| m.eq_ignore_ascii_case(method) && matches(pat, p))
    {
        return Err(format!(
            "{method} {p} is not relayed: a cluster peer may read VMs, start, stop and snapshot them, and run cluster restores, nothing else"
        ));
    }
    if method.eq_ignore_ascii_case("POST") && p == "/v1/vms" {
        let spec: rebound_api::VmSpec = serde_json::from_value(body.clone().unwrap_or_default())
            .map_err(|e| format!("invalid VmSpec: {e}"))?;
        if let Some(h) = spec.host_paths().first() {
            return Err(format!(
                "a relayed VM spec names no host path, and {} names {:?}: start such VMs on their host",
                h.field, h.path
            ));
        }
    }
    if method.eq_ignore_ascii_case("POST") && p.ends_with("/snapshot") {
        let mut b = body.unwrap_or_default();
        let out = b["out"]
            .as_str()
            .ok_or("a relayed snapshot needs \"out\", a name in the snapshot store")?;
        let dir =
            super::confine::snapshot_out(paths, out).map_err(|e| rebound_errors::chain(&e))?;
        b["out"] = dir.display().to_string().into();
        return Ok(Some(b));
    }
    Ok(body)
}

#[async_trait::async_trait]
impl CohortApi for DaemonApi {
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> ApiAnswer {
        let Some(d) = self.d.upgrade() else {
            return ApiAnswer::error(503, "the daemon is shutting down");
        };
        let body = match admit(&d.paths, method, path, body) {
            Ok(b) => b,
            Err(why) => {
                let now = std::time::Instant::now();
                let admitted = self
                    .refusals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .admit(now);
                if let Some(dropped) = admitted {
                    tracing::warn!(%method, %path, dropped, "relayed call refused: {why}");
                }
                return ApiAnswer::error(403, why);
            }
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
    use super::*;
    use crate::daemon::cluster::confine::tests::paths;
    use serde_json::json;

    #[test]
    fn only_the_allowed_calls_are_relayed() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(t.path());
        for (m, path) in [
            ("GET", "/v1/vms"),
            ("GET", "/v1/vms/a"),
            ("GET", "/v1/vms/a/events?since=3"),
            ("GET", "/v1/vms/a/crashes/1"),
            ("POST", "/v1/vms/a/wait?for=ready"),
            ("POST", "/v1/vms/a/kill"),
            ("DELETE", "/v1/vms/a"),
            ("GET", "/v1/cluster/restores/r1"),
        ] {
            assert!(admit(&p, m, path, None).is_ok(), "{m} {path}");
        }
        for (m, path) in [
            ("POST", "/v1/daemon/shutdown"),
            ("POST", "/v1/vms/a/dump"),
            ("POST", "/v1/restore"),
            ("POST", "/v1/memory/plan"),
            ("POST", "/v1/vms/a/memory"),
            ("POST", "/v1/vms/a/crash"),
            ("POST", "/v1/vms/a/settle"),
            ("POST", "/v1/vms/a/reboot"),
            ("GET", "/v1/vms/a/vmcoreinfo"),
            ("GET", "/v1/vms/../daemon"),
            ("GET", "/v1/vms/a/b/c"),
            ("DELETE", "/v1/vms"),
        ] {
            let e = admit(&p, m, path, None).unwrap_err();
            assert!(e.contains("is not relayed"), "{m} {path}: {e}");
        }
    }

    #[test]
    fn relayed_specs_name_no_host_path_and_snapshots_go_to_the_store() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(t.path());
        let ok = json!({"name": "a", "workload": "kv", "nics": ["bridge=br0"]});
        assert!(admit(&p, "POST", "/v1/vms", Some(ok)).is_ok());
        for (field, spec) in [
            ("pmem", json!({"name": "a", "pmem": ["/var/lib/x.img"]})),
            (
                "disks",
                json!({"name": "a", "disks": ["/root/.ssh/authorized_keys,size=1M"]}),
            ),
            ("kernel", json!({"name": "a", "kernel": "/boot/vmlinuz"})),
            (
                "crash.dump_dir",
                json!({"name": "a", "crash": {"dump_dir": "/tmp"}}),
            ),
            (
                "crash.recover_from",
                json!({"name": "a", "crash": {"recover_from": "/s"}}),
            ),
        ] {
            let e = admit(&p, "POST", "/v1/vms", Some(spec)).unwrap_err();
            assert!(e.contains(field), "{field}: {e}");
        }
        let b = admit(
            &p,
            "POST",
            "/v1/vms/a/snapshot",
            Some(json!({"out": "c1/a", "trace_s": 1.0})),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            b["out"],
            p.snapshot_store().join("c1/a").display().to_string()
        );
        assert_eq!(b["trace_s"], 1.0);
        for out in ["/tmp/x", "../x"] {
            let e = admit(&p, "POST", "/v1/vms/a/snapshot", Some(json!({"out": out}))).unwrap_err();
            assert!(e.contains("snapshot"), "{out}: {e}");
        }
    }
}
