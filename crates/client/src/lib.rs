//! The daemon's client: HTTP/1.1 over the unix socket (one connection per request),
//! plus starting the daemon in the background when nothing answers. The `rebound`
//! CLI and the benchmarks (`rebound-bench`) both talk to the daemon through it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::UnixStream;

/// Errors talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the rebound daemon at {0}")]
    Connect(PathBuf, #[source] std::io::Error),
    #[error("HTTP exchange with the daemon failed")]
    Http(#[source] hyper::Error),
    #[error("HTTP exchange with the daemon failed")]
    Request(#[source] hyper::http::Error),
    /// The daemon's own one-line error.
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("the daemon sent an unexpected answer")]
    Decode(#[source] serde_json::Error),
    #[error("could not start the daemon: {0}")]
    Start(String),
    #[error("could not start the daemon")]
    StartIo(#[source] std::io::Error),
    #[error("could not start the daemon: {}", .0.display())]
    StartAt(PathBuf, #[source] std::io::Error),
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Bytes,
}

/// A client bound to one daemon socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: &Path) -> Client {
        Client {
            socket: socket.to_path_buf(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends a request; returns status and body bytes whatever the status.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let r = self.exchange(method, path, body).await?;
        Ok((r.status, r.body))
    }

    /// Sends a request; returns the whole answer whatever the status.
    pub async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ClientError> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| ClientError::Connect(self.socket.clone(), e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Http)?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let data = body.map(|b| b.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "reboundd")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(data)))
            .map_err(ClientError::Request)?;
        let resp = sender.send_request(req).await.map_err(ClientError::Http)?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(ClientError::Http)?
            .to_bytes();
        Ok(Answer {
            status,
            content_type,
            body,
        })
    }

    /// Sends a request and decodes a JSON success; error statuses become [`ClientError::Api`].
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, ClientError> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(ClientError::Decode)
    }

    /// Like [`Client::call`] for a plain-text success body.
    pub async fn text(&self, path: &str) -> Result<String, ClientError> {
        let (status, bytes) = self.raw(Method::GET, path, None).await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Whether a daemon answers `/v1/health`.
    pub async fn is_up(&self) -> bool {
        self.call::<rebound_api::Health>(Method::GET, "/v1/health", None)
            .await
            .is_ok()
    }

    /// Makes sure a daemon answers: starts `rebound daemon` detached (new session,
    /// output to `log`) if none does, and waits for it.
    pub async fn ensure_daemon(&self, log: &Path) -> Result<(), ClientError> {
        if self.is_up().await {
            return Ok(());
        }
        let exe = std::env::current_exe().map_err(ClientError::StartIo)?;
        if let Some(dir) = log.parent() {
            rebound_vmm::private::create_dir_all(dir)
                .map_err(|e| ClientError::StartAt(dir.to_path_buf(), e))?;
        }
        let out = rebound_vmm::private::create_file(log, true)
            .map_err(|e| ClientError::StartAt(log.to_path_buf(), e))?;
        let err = out.try_clone().map_err(ClientError::StartIo)?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("daemon")
            .arg("--socket")
            .arg(&self.socket)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        rebound_vmm::process::new_session(&mut cmd);
        let mut child = cmd.spawn().map_err(ClientError::StartIo)?;
        let mut deadline = std::time::Instant::now() + Duration::from_secs(15);
        let mut exited: Option<String> = None;
        loop {
            if self.is_up().await {
                // The daemon lives on in its own session; reap it if it ever exits
                // while we still run.
                std::thread::spawn(move || child.wait());
                return Ok(());
            }
            if exited.is_none() {
                if let Ok(Some(st)) = child.try_wait() {
                    // Another CLI may have started a daemon at the same moment (ours
                    // then exits, "already serving"): give that one a moment.
                    exited = Some(format!("daemon exited ({st}): {}", last_line(log)));
                    deadline = deadline.min(std::time::Instant::now() + Duration::from_secs(3));
                }
            }
            if let (Some(why), true) = (&exited, std::time::Instant::now() > deadline) {
                return Err(ClientError::Start(why.clone()));
            }
            if std::time::Instant::now() > deadline {
                return Err(ClientError::Start(format!(
                    "no answer within 15 s; see {}",
                    log.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An error status as [`ClientError::Api`], with the daemon's own message when it
/// sent one.
fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    let message = serde_json::from_slice::<rebound_api::ErrorBody>(body)
        .map(|b| b.error)
        .unwrap_or_else(|_| format!("daemon answered {status}"));
    ClientError::Api {
        status: status.as_u16(),
        message,
    }
}

/// A client for the default socket, starting the daemon if needed.
pub async fn connect(paths: &rebound_vmm::paths::Paths) -> Result<Client, ClientError> {
    let c = Client::new(&paths.socket());
    c.ensure_daemon(&paths.daemon_log()).await?;
    Ok(c)
}

/// A VM name as one segment of an API path. VM names are restricted to URL-safe
/// characters, so a valid one goes as it is; anything else cannot exist.
pub fn enc(name: &str) -> String {
    if rebound_api::spec::validate_name(name).is_ok() {
        name.to_string()
    } else {
        // Still ask the daemon, which answers "unknown VM" for it.
        name.bytes().map(|b| format!("%{b:02X}")).collect()
    }
}

/// The last non-empty line of a log file, or nothing.
fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|s| {
            s.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}
