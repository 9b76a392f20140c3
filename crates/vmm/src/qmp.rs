//! An async QMP client: greeting, `qmp_capabilities`, commands matched to replies by
//! id, and asynchronous events delivered on a channel. When QEMU goes away the event
//! channel closes and pending commands fail.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// Longest QMP line accepted; QEMU's replies here are small.
const MAX_LINE: usize = 1 << 20;

/// Errors talking QMP.
#[derive(Debug, thiserror::Error, Clone)]
pub enum QmpError {
    #[error("cannot connect to QMP socket {0}: {1}")]
    Connect(String, String),
    #[error("QMP connection lost")]
    Closed,
    #[error("QMP I/O failed: {0}")]
    Io(String),
    #[error("QMP greeting missing or malformed: {0}")]
    Greeting(String),
    #[error("QEMU refused {0}: {1}")]
    Command(String, String),
    #[error("QMP command {0} timed out")]
    Timeout(String),
}

/// An asynchronous QMP event.
#[derive(Debug, Clone)]
pub struct QmpEvent {
    pub event: String,
    pub data: Value,
    /// QEMU's own wall-clock stamp of the event, Unix nanoseconds.
    pub unix_ns: Option<i64>,
}

/// A negotiated session and its event stream.
pub type QmpSession = (Arc<Qmp>, mpsc::UnboundedReceiver<QmpEvent>);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, QmpError>>>>>;
/// Each event's latest QEMU stamp, by name.
type Stamps = Arc<Mutex<HashMap<String, i64>>>;

/// A connected, negotiated QMP session.
pub struct Qmp {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    stamps: Stamps,
}

/// One parsed QMP message.
#[derive(Debug, PartialEq)]
enum Message {
    Greeting,
    Return(u64, Value),
    Error(u64, String),
    Event(String, Value, Option<i64>),
    /// Well-formed JSON we do not use (e.g. a reply without our id).
    Other,
}

fn parse(line: &str) -> Result<Message, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    if obj.contains_key("QMP") {
        return Ok(Message::Greeting);
    }
    if let Some(ev) = obj.get("event") {
        let name = ev.as_str().ok_or("event name is not a string")?;
        // `{"seconds": s, "microseconds": us}` from QEMU's g_get_real_time().
        let ts = obj.get("timestamp");
        let part = |k: &str| ts.and_then(|t| t.get(k)).and_then(Value::as_i64);
        let unix_ns = match (part("seconds"), part("microseconds")) {
            (Some(s), Some(us)) if s >= 0 => s
                .checked_mul(1_000_000_000)
                .and_then(|n| n.checked_add(us.checked_mul(1000)?)),
            _ => None,
        };
        return Ok(Message::Event(
            name.to_string(),
            obj.get("data").cloned().unwrap_or(Value::Null),
            unix_ns,
        ));
    }
    let Some(id) = obj.get("id").and_then(Value::as_u64) else {
        return Ok(Message::Other);
    };
    if let Some(r) = obj.get("return") {
        return Ok(Message::Return(id, r.clone()));
    }
    if let Some(e) = obj.get("error") {
        let desc = e
            .get("desc")
            .and_then(Value::as_str)
            .unwrap_or("unknown error");
        return Ok(Message::Error(id, desc.to_string()));
    }
    Ok(Message::Other)
}

impl Qmp {
    /// Connects, reads the greeting, negotiates capabilities.
    pub async fn connect(path: &Path) -> Result<QmpSession, QmpError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| QmpError::Connect(path.display().to_string(), e.to_string()))?;
        let (r, w) = stream.into_split();
        let mut lines = BufReader::new(r);
        let mut first = String::new();
        let n = tokio::time::timeout(Duration::from_secs(5), read_line(&mut lines, &mut first))
            .await
            .map_err(|_| QmpError::Greeting("no greeting within 5 s".into()))??;
        if n == 0 {
            return Err(QmpError::Closed);
        }
        match parse(first.trim_end()) {
            Ok(Message::Greeting) => {}
            Ok(other) => return Err(QmpError::Greeting(format!("{other:?}"))),
            Err(e) => return Err(QmpError::Greeting(e)),
        }
        let pending: Pending = Arc::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let stamps: Stamps = Arc::default();
        let qmp = Arc::new(Qmp {
            writer: tokio::sync::Mutex::new(w),
            pending: pending.clone(),
            next_id: AtomicU64::new(1),
            stamps: stamps.clone(),
        });
        tokio::spawn(reader(lines, pending, tx, stamps));
        qmp.execute("qmp_capabilities", None).await?;
        Ok((qmp, rx))
    }

    /// Runs a command and returns its `return` value.
    pub async fn execute(&self, cmd: &str, args: Option<Value>) -> Result<Value, QmpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut msg = json!({"execute": cmd, "id": id});
        if let Some(a) = args {
            msg["arguments"] = a;
        }
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .expect("qmp pending lock")
            .insert(id, tx);
        let mut line = msg.to_string();
        line.push('\n');
        let write = async {
            let mut w = self.writer.lock().await;
            w.write_all(line.as_bytes()).await
        };
        if let Err(e) = write.await {
            self.pending.lock().expect("qmp pending lock").remove(&id);
            return Err(QmpError::Io(e.to_string()));
        }
        match tokio::time::timeout(Duration::from_secs(30), rx).await {
            Ok(Ok(r)) => r.map_err(|e| match e {
                QmpError::Command(_, d) => QmpError::Command(cmd.to_string(), d),
                other => other,
            }),
            Ok(Err(_)) => Err(QmpError::Closed),
            Err(_) => {
                self.pending.lock().expect("qmp pending lock").remove(&id);
                Err(QmpError::Timeout(cmd.to_string()))
            }
        }
    }

    /// QEMU's stamp of the latest `event` seen (Unix ns). QEMU sends a command's
    /// events before its reply, so after `cont` returns, `RESUME` is the moment the
    /// vCPUs were started, on QEMU's clock rather than ours.
    pub fn last_event_unix_ns(&self, event: &str) -> Option<i64> {
        self.stamps
            .lock()
            .expect("qmp stamps lock")
            .get(event)
            .copied()
    }

    /// `query-status` → QEMU's run state string (e.g. `running`, `paused`, `guest-panicked`).
    pub async fn run_state(&self) -> Result<String, QmpError> {
        let v = self.execute("query-status", None).await?;
        Ok(v.get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }
}

async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut String,
) -> Result<usize, QmpError> {
    use tokio::io::AsyncReadExt;
    // Capped while reading: a QEMU (run by a guest that took it over) sending an
    // endless line must not make us buffer it whole.
    let n = r
        .take(MAX_LINE as u64 + 1)
        .read_line(buf)
        .await
        .map_err(|e| QmpError::Io(e.to_string()))?;
    if buf.len() > MAX_LINE {
        return Err(QmpError::Io(format!("line longer than {MAX_LINE} bytes")));
    }
    Ok(n)
}

async fn reader(
    mut lines: BufReader<tokio::net::unix::OwnedReadHalf>,
    pending: Pending,
    events: mpsc::UnboundedSender<QmpEvent>,
    stamps: Stamps,
) {
    let mut buf = String::new();
    let mut bad = crate::ratelimit::RateLimit::new(5, Duration::from_secs(60));
    loop {
        buf.clear();
        match read_line(&mut lines, &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match parse(buf.trim_end()) {
            Ok(Message::Return(id, v)) => {
                if let Some(tx) = pending.lock().expect("qmp pending lock").remove(&id) {
                    let _ = tx.send(Ok(v));
                }
            }
            Ok(Message::Error(id, desc)) => {
                if let Some(tx) = pending.lock().expect("qmp pending lock").remove(&id) {
                    let _ = tx.send(Err(QmpError::Command(String::new(), desc)));
                }
            }
            Ok(Message::Event(event, data, unix_ns)) => {
                if let Some(t) = unix_ns {
                    stamps
                        .lock()
                        .expect("qmp stamps lock")
                        .insert(event.clone(), t);
                }
                let _ = events.send(QmpEvent {
                    event,
                    data,
                    unix_ns,
                });
            }
            Ok(Message::Greeting | Message::Other) => {}
            Err(e) => {
                if let Some(dropped) = bad.admit(std::time::Instant::now()) {
                    tracing::warn!(
                        dropped_since_last = dropped,
                        "qmp: ignoring a malformed line ({e})"
                    );
                }
            }
        }
    }
    for (_, tx) in pending.lock().expect("qmp pending lock").drain() {
        let _ = tx.send(Err(QmpError::Closed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_messages() {
        assert_eq!(
            parse(r#"{"QMP":{"version":{},"capabilities":[]}}"#),
            Ok(Message::Greeting)
        );
        assert_eq!(
            parse(r#"{"return":{},"id":3}"#),
            Ok(Message::Return(3, json!({})))
        );
        assert_eq!(
            parse(r#"{"error":{"class":"GenericError","desc":"nope"},"id":4}"#),
            Ok(Message::Error(4, "nope".into()))
        );
        assert_eq!(
            parse(r#"{"timestamp":{"seconds":1,"microseconds":2},"event":"STOP"}"#),
            Ok(Message::Event(
                "STOP".into(),
                Value::Null,
                Some(1_000_002_000)
            ))
        );
        // A stamp missing or out of range is no stamp, not an error.
        assert_eq!(
            parse(r#"{"event":"RESUME","timestamp":{"seconds":-1,"microseconds":0}}"#),
            Ok(Message::Event("RESUME".into(), Value::Null, None))
        );
        assert_eq!(
            parse(
                r#"{"event":"RESUME","timestamp":{"seconds":9223372036854775807,"microseconds":0}}"#
            ),
            Ok(Message::Event("RESUME".into(), Value::Null, None))
        );
        assert_eq!(parse(r#"{"return":{}}"#), Ok(Message::Other));
    }

    #[test]
    fn rejects_malformed() {
        assert!(parse("").is_err());
        assert!(parse(r#"{"return":"#).is_err());
        assert!(parse("[1,2]").is_err());
        assert!(parse(r#"{"event":5}"#).is_err());
    }

    /// A QEMU that sends one endless line: the client gives up after the cap, having
    /// read little more than it, instead of buffering everything sent.
    #[tokio::test]
    async fn an_endless_line_is_refused_at_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("q.sock");
        let l = tokio::net::UnixListener::bind(&p).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let chunk = vec![b'a'; 64 << 10];
            let mut sent = 0u64;
            while s.write_all(&chunk).await.is_ok() {
                sent += chunk.len() as u64;
                if sent > 1 << 30 {
                    break;
                }
            }
            sent
        });
        let e = Qmp::connect(&p)
            .await
            .err()
            .expect("an endless line is refused");
        assert!(e.to_string().contains("line longer than"), "{e}");
        let sent = server.await.unwrap();
        assert!(sent < 8 << 20, "{sent} bytes were read before refusing");
    }

    /// A QMP server that is a real socket speaking like QEMU, to test the session
    /// logic without a VM (the VM tests cover real QEMU).
    #[tokio::test]
    async fn session_over_a_socket() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("q.sock");
        let l = tokio::net::UnixListener::bind(&p).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let (r, mut w) = s.into_split();
            let mut r = BufReader::new(r);
            w.write_all(b"{\"QMP\":{\"version\":{},\"capabilities\":[]}}\r\n")
                .await
                .unwrap();
            let mut line = String::new();
            while r.read_line(&mut line).await.unwrap() > 0 {
                let v: Value = serde_json::from_str(&line).unwrap();
                let id = v["id"].clone();
                let reply = match v["execute"].as_str().unwrap() {
                    "query-status" => json!({"return":{"status":"running"},"id":id}),
                    "bad" => json!({"error":{"class":"GenericError","desc":"no such"},"id":id}),
                    _ => json!({"return":{},"id":id}),
                };
                w.write_all(b"{\"event\":\"STOP\",\"data\":{}}\n")
                    .await
                    .unwrap();
                w.write_all(format!("{reply}\n").as_bytes()).await.unwrap();
                line.clear();
            }
        });
        let (q, mut ev) = Qmp::connect(&p).await.unwrap();
        assert_eq!(q.run_state().await.unwrap(), "running");
        assert!(matches!(
            q.execute("bad", None).await,
            Err(QmpError::Command(c, d)) if c == "bad" && d == "no such"
        ));
        assert_eq!(ev.recv().await.unwrap().event, "STOP");
        drop(q);
        server.abort();
    }

    #[tokio::test]
    async fn wrong_greeting_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("q.sock");
        let l = tokio::net::UnixListener::bind(&p).unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"{\"hello\":1}\n").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        assert!(matches!(Qmp::connect(&p).await, Err(QmpError::Greeting(_))));
    }
}
