//! The kv workload's host side: writing its keys before the snapshot, and a client
//! that keeps reading them through the snapshot and every restore.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Error, KV_VALUE};

/// A host client reading kv keys as fast as one connection allows, reconnecting
/// when the service is away; the answers' times since its start.
pub(super) struct KvLoad {
    t0: Instant,
    answers: Arc<std::sync::Mutex<Vec<f64>>>,
    stop: Arc<AtomicBool>,
}

impl KvLoad {
    /// Reads every `stride`-th of `keys` keys, in a scattered order.
    pub(super) fn start(port: u16, keys: u64, stride: u64) -> KvLoad {
        let hot = (keys / stride).max(1);
        let t0 = Instant::now();
        let answers = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (answers.clone(), stop.clone());
        let seq = AtomicU64::new(0);
        tokio::spawn(async move {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
            while !s.load(Ordering::Relaxed) {
                let Ok(Ok(conn)) = tokio::time::timeout(
                    Duration::from_millis(500),
                    tokio::net::TcpStream::connect(("127.0.0.1", port)),
                )
                .await
                else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let mut conn = tokio::io::BufReader::new(conn);
                let mut line = String::new();
                while !s.load(Ordering::Relaxed) {
                    let i = seq.fetch_add(7919, Ordering::Relaxed) % hot * stride;
                    if conn
                        .get_mut()
                        .write_all(format!("GET k{i}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        break;
                    }
                    line.clear();
                    match tokio::time::timeout(Duration::from_secs(2), conn.read_line(&mut line))
                        .await
                    {
                        Ok(Ok(n)) if n > 0 => a.lock().unwrap().push(t0.elapsed().as_secs_f64()),
                        _ => break,
                    }
                }
            }
        });
        KvLoad { t0, answers, stop }
    }

    /// Answers in the `window` seconds after `from`.
    pub(super) fn answers_within(&self, from: Instant, window: f64) -> u64 {
        let lo = from.duration_since(self.t0).as_secs_f64();
        self.answers
            .lock()
            .unwrap()
            .iter()
            .filter(|&&t| t >= lo && t < lo + window)
            .count() as u64
    }
}

impl Drop for KvLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Writes the kv guest's keys (pipelined on one connection).
pub(super) async fn kv_fill(port: u16, keys: u64) -> Result<(), Error> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(Error::KvConnect)?;
    let (r, mut w) = conn.into_split();
    let writer = tokio::spawn(async move {
        let v = "v".repeat(KV_VALUE as usize);
        for i in 0..keys {
            w.write_all(format!("SET k{i} {v}\n").as_bytes()).await?;
        }
        Ok::<_, std::io::Error>(w)
    });
    let mut r = tokio::io::BufReader::new(r);
    let mut line = String::new();
    for i in 0..keys {
        line.clear();
        if r.read_line(&mut line).await.map_err(Error::KvWrite)? == 0 {
            return Err(Error::KvClosed { got: i, keys });
        }
        if line.starts_with("ERR") {
            return Err(Error::KvRefused {
                key: i,
                answer: line.trim().to_string(),
            });
        }
    }
    writer
        .await
        .map_err(Error::KvTask)?
        .map_err(Error::KvWrite)?;
    Ok(())
}
