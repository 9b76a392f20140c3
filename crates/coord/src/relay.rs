//! The API relay: one call of a cohort host's own API (`method`, `path`, JSON
//! `body` → `status`, JSON body), carried over the same authenticated connection as
//! the restore protocol, so that a controller holding the cluster token can drive
//! the VMs of every host.
//!
//! A client ([`call`]) connects, runs the handshake of [`crate::wire`], sends one
//! `API_CALL` and waits for the `API_REPLY` with the same `call_id`. The cohort checks
//! the call's shape ([`check_call`]) and passes it to the [`CohortApi`] the daemon
//! gave [`crate::spawn_cohort_with_api`]; a cohort without one answers 501. What a
//! host lets through beyond the shape (a daemon refuses calls that would stop it) is
//! its `CohortApi`'s decision. An answer too large for one frame becomes a 502 error.
//!
//! Errors the cohort itself makes are JSON `{"error": "<one line>"}`, like the API's.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::msg::Message;
use crate::token::ClusterToken;
use crate::wire::{client_handshake, WireError, MAX_FRAME_LEN};

/// The longest relayed path, query included.
pub const MAX_PATH_LEN: usize = 2048;

/// The methods a relayed call may use.
pub const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// What a relayed call answered: the API's status and its body as JSON (a body that
/// was not JSON is a JSON string).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiAnswer {
    pub status: u16,
    pub body: serde_json::Value,
}

impl ApiAnswer {
    /// An answer `{"error": message}` with `status`.
    pub fn error(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            body: serde_json::json!({ "error": message.into() }),
        }
    }
}

/// The host's API as the cohort relays it; the daemon implements it by passing the
/// call to its own HTTP router.
#[async_trait::async_trait]
pub trait CohortApi: Send + Sync + 'static {
    /// Runs one call whose shape [`check_call`] accepted.
    async fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> ApiAnswer;
}

/// The client's timeouts.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The TCP connect. Default 2 s.
    pub connect: Duration,
    /// The handshake. Default 5 s.
    pub handshake: Duration,
    /// From sending the call to its answer. Default 300 s (a relayed restore or
    /// `wait` takes as long as it takes locally).
    pub reply: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            handshake: Duration::from_secs(5),
            reply: Duration::from_secs(300),
        }
    }
}

/// Why a relayed call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the call is not relayed: {0}")]
    BadCall(String),
    #[error("cannot connect to {addr}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {addr} took longer than {timeout:?}")]
    ConnectTimeout { addr: String, timeout: Duration },
    #[error("the relay connection to {addr} failed")]
    Wire {
        addr: String,
        #[source]
        source: WireError,
    },
    #[error("{addr} sent an undecodable message")]
    Decode {
        addr: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{addr} did not answer the call within {timeout:?}")]
    ReplyTimeout { addr: String, timeout: Duration },
}

/// Checks a call's shape, on both ends: a known method, and a path under `/v1/` of
/// at most [`MAX_PATH_LEN`] bytes whose segments are non-empty, are not `.` or `..`,
/// and hold only `A-Z a-z 0-9 _ . -`, with an optional query of printable ASCII
/// without spaces. Percent-escapes are refused, so what a host's router matches is
/// exactly what its `CohortApi` checked.
pub fn check_call(method: &str, path: &str) -> Result<(), String> {
    if !METHODS.contains(&method) {
        return Err(format!(
            "method {method:?} is not one of {}",
            METHODS.join(", ")
        ));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(format!(
            "the path is over {MAX_PATH_LEN} bytes ({})",
            path.len()
        ));
    }
    let (p, query) = match path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (path, None),
    };
    let Some(rest) = p.strip_prefix("/v1/") else {
        return Err(format!("path {path:?} is not under /v1/"));
    };
    for seg in rest.split('/') {
        let ok_chars = seg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if seg.is_empty() || seg == "." || seg == ".." || !ok_chars {
            return Err(format!(
                "path {path:?} has a segment {seg:?} that is empty, a dot segment, or holds other characters than A-Z a-z 0-9 _ . -"
            ));
        }
    }
    if let Some(q) = query {
        if !q.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the query of {path:?} holds spaces or non-printable characters"
            ));
        }
    }
    Ok(())
}

/// Relays one call to the cohort at `addr` (`host:port`) with the default timeouts.
pub async fn call(
    addr: &str,
    token: &ClusterToken,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<ApiAnswer, RelayError> {
    call_with(addr, token, method, path, body, &RelayConfig::default()).await
}

/// Relays one call to the cohort at `addr` with these timeouts; the answer is the
/// host's, whatever its status.
pub async fn call_with(
    addr: &str,
    token: &ClusterToken,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    config: &RelayConfig,
) -> Result<ApiAnswer, RelayError> {
    check_call(method, path).map_err(RelayError::BadCall)?;
    let wire = |source| RelayError::Wire {
        addr: addr.to_owned(),
        source,
    };
    let stream = match tokio::time::timeout(config.connect, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => {
            return Err(RelayError::Connect {
                addr: addr.to_owned(),
                source,
            })
        }
        Err(_) => {
            return Err(RelayError::ConnectTimeout {
                addr: addr.to_owned(),
                timeout: config.connect,
            })
        }
    };
    let _ = stream.set_nodelay(true);
    let (mut reader, mut writer) = client_handshake(stream, token, config.handshake)
        .await
        .map_err(wire)?;
    let mut id = [0u8; 8];
    getrandom::fill(&mut id).map_err(|e| wire(WireError::Random(e)))?;
    let call_id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let msg = Message::ApiCall {
        call_id: call_id.clone(),
        method: method.to_owned(),
        path: path.to_owned(),
        body: body.cloned(),
    };
    let bytes = serde_json::to_vec(&msg).map_err(|e| RelayError::Decode {
        addr: addr.to_owned(),
        source: e,
    })?;
    if bytes.len() + 40 > MAX_FRAME_LEN {
        return Err(RelayError::BadCall(format!(
            "the body is over the {MAX_FRAME_LEN}-byte frame cap"
        )));
    }
    let run = async {
        writer.write(&bytes).await.map_err(wire)?;
        loop {
            let payload = reader.read().await.map_err(wire)?;
            let msg: Message =
                serde_json::from_slice(&payload).map_err(|source| RelayError::Decode {
                    addr: addr.to_owned(),
                    source,
                })?;
            if let Message::ApiReply {
                call_id: id,
                status,
                body,
            } = msg
            {
                if id == call_id {
                    return Ok(ApiAnswer { status, body });
                }
            }
        }
    };
    tokio::time::timeout(config.reply, run)
        .await
        .map_err(|_| RelayError::ReplyTimeout {
            addr: addr.to_owned(),
            timeout: config.reply,
        })?
}

/// The cohort's answer to one `API_CALL`, as the frame to send: the call checked and
/// run, or refused, and an answer over the frame cap replaced by a 502 error.
pub(crate) async fn answer(
    api: Option<&dyn CohortApi>,
    call_id: String,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Message {
    let a = match (api, check_call(method, path)) {
        (None, _) => ApiAnswer::error(501, "this host's cohort serves no API relay"),
        (_, Err(e)) => ApiAnswer::error(400, format!("the relay refuses the call: {e}")),
        (Some(api), Ok(())) => api.call(method, path, body).await,
    };
    let reply = Message::ApiReply {
        call_id: call_id.clone(),
        status: a.status,
        body: a.body,
    };
    let len = serde_json::to_vec(&reply).map_or(usize::MAX, |b| b.len());
    if len.saturating_add(40) > MAX_FRAME_LEN {
        let e = ApiAnswer::error(
            502,
            format!(
                "the answer to {method} {path} is over the relay's {MAX_FRAME_LEN}-byte frame cap"
            ),
        );
        return Message::ApiReply {
            call_id,
            status: e.status,
            body: e.body,
        };
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_of_calls() {
        for ok in [
            "/v1/vms",
            "/v1/vms/a-1.b_c/wait?for=ready&timeout_ms=100",
            "/v1/health",
        ] {
            assert_eq!(check_call("GET", ok), Ok(()), "{ok}");
        }
        for bad in [
            "/v2/vms",
            "/v1/",
            "/v1//vms",
            "/v1/vms/../daemon/shutdown",
            "/v1/daemon/shutdow%6E",
            "v1/vms",
            "/v1/vms/a b",
            "/v1/vms?for=a b",
            "/metrics",
        ] {
            assert!(check_call("GET", bad).is_err(), "{bad}");
        }
        assert!(check_call("get", "/v1/vms").is_err());
        assert!(check_call("CONNECT", "/v1/vms").is_err());
        let long = format!("/v1/{}", "a".repeat(MAX_PATH_LEN));
        assert!(check_call("GET", &long).is_err());
    }

    #[tokio::test]
    async fn an_answer_over_the_frame_cap_becomes_a_502() {
        struct Big;
        #[async_trait::async_trait]
        impl CohortApi for Big {
            async fn call(&self, _: &str, _: &str, _: Option<serde_json::Value>) -> ApiAnswer {
                ApiAnswer {
                    status: 200,
                    body: serde_json::Value::String("x".repeat(MAX_FRAME_LEN)),
                }
            }
        }
        let m = answer(Some(&Big), "c".into(), "GET", "/v1/vms/a/logs", None).await;
        let Message::ApiReply { status, body, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(status, 502);
        assert!(body["error"].as_str().unwrap().contains("frame cap"));
        let m = answer(None, "c".into(), "GET", "/v1/vms", None).await;
        assert!(matches!(m, Message::ApiReply { status: 501, .. }));
        let m = answer(Some(&Big), "c".into(), "GET", "/etc/passwd", None).await;
        assert!(matches!(m, Message::ApiReply { status: 400, .. }));
    }
}
