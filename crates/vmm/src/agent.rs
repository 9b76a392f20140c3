//! Host side of the guest agent protocol (`docs/agent-protocol.md`): JSON lines over
//! the virtio-serial port `org.rebound.agent`, exposed by QEMU as `<run>/agent.sock`.
//!
//! The link reconnects whenever the socket drops (e.g. after a daemon restart) and
//! sends `hello` until the agent answers with `ready`, so a new daemon learns the
//! facts again. Guest input is untrusted: lines over 64 KiB, invalid UTF-8 and unknown
//! or malformed messages are dropped and reported, never fatal.
//!
//! A guest must not be able to make the host do work at the rate it sends: messages
//! go to the supervisor on a bounded queue ([`QUEUE`]) and at most [`RATE`] a second
//! ([`READY_RATE`] for `ready`, each of which the supervisor records on disk); what
//! does not fit is dropped and counted, and the count goes to the supervisor as
//! [`AgentMsg::Throttled`] with the next message let through. A dropped `ready` is
//! asked for again with `hello`. Answers to the host's own requests are routed
//! before any limit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

/// Longest line the protocol allows.
pub const MAX_LINE: usize = 64 * 1024;

/// Messages waiting for the supervisor, at most.
pub const QUEUE: usize = 256;

/// Messages a second the supervisor gets from one guest (a `counter` workload at
/// 100 Hz plus heartbeats and reports fit).
pub const RATE: u32 = 200;

/// `ready` messages per [`READY_WINDOW`] the supervisor gets from one guest.
pub const READY_RATE: u32 = 5;
pub const READY_WINDOW: Duration = Duration::from_secs(10);

/// Errors on the agent link.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AgentError {
    #[error("the guest agent is not connected")]
    NotConnected,
    #[error("the guest agent did not answer within {0} s")]
    Timeout(u64),
    #[error("the guest agent reported an error: {0}")]
    Guest(String),
    #[error("agent line longer than {MAX_LINE} bytes dropped")]
    LineTooLong,
    #[error("agent line is not UTF-8")]
    NotUtf8,
    #[error("malformed agent message: {0}")]
    Malformed(String),
}

pub use rebound_api::{ReadyInfo, VmcoreinfoAddr};

/// A message from the guest agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum AgentMsg {
    Ready(ReadyInfo),
    Heartbeat {
        seq: u64,
    },
    Marker {
        id: u64,
        paddr: u64,
        len: u64,
    },
    Counter {
        seq: u64,
        checksum: String,
    },
    Memfill {
        filled_kib: u64,
        rounds: u64,
        errors: u64,
    },
    Io(rebound_api::IoReport),
    /// The `io` workload's file-set mode, after each round.
    Files(rebound_api::FilesReport),
    /// A piece of the reply to `cachelist`.
    Cachelist {
        id: u64,
        last: u8,
        files: String,
        #[serde(default)]
        cached_files: u64,
        #[serde(default)]
        cached_pages: u64,
        #[serde(default)]
        skipped: u64,
    },
    Prefetch(PrefetchDone),
    /// The guest synced its disks and calls reboot(2) now.
    Rebooting,
    /// The `peer` workload's counters, every second: a host client reads them from
    /// the guest (`STATS`) when it needs them, so the daemon keeps none.
    Peer(serde::de::IgnoredAny),
    /// A peer of the `peer` workload went silent (`dead`) or spoke again (`alive`).
    #[serde(rename = "peer_event")]
    PeerEvent(rebound_api::PeerEvent),
    Error {
        message: String,
    },
    /// Made by the link, never read from the guest: this many messages were
    /// dropped (over the rate or the queue) before the one that follows.
    #[serde(skip_deserializing)]
    Throttled {
        dropped: u64,
    },
}

/// The agent's `prefetch` answer: the report and the request it answers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PrefetchDone {
    pub id: u64,
    #[serde(flatten)]
    pub report: rebound_api::PrefetchReport,
}

/// The guest's list of cached pages, as it reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestCacheList {
    pub text: String,
    pub files: u64,
    pub pages: u64,
    pub skipped: u64,
}

/// Parses one line from the agent.
pub fn parse_line(line: &[u8]) -> Result<AgentMsg, AgentError> {
    let s = std::str::from_utf8(line).map_err(|_| AgentError::NotUtf8)?;
    serde_json::from_str(s.trim_end_matches('\r')).map_err(|e| AgentError::Malformed(e.to_string()))
}

/// Splits a byte stream into lines, dropping any line longer than [`MAX_LINE`]
/// without buffering it whole.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    discarding: bool,
}

impl LineSplitter {
    /// Feeds bytes; returns the complete lines (or errors for dropped ones).
    pub fn push(&mut self, mut data: &[u8]) -> Vec<Result<Vec<u8>, AgentError>> {
        let mut out = Vec::new();
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    if self.discarding {
                        self.discarding = false;
                    } else if self.buf.len() + i > MAX_LINE {
                        out.push(Err(AgentError::LineTooLong));
                    } else {
                        self.buf.extend_from_slice(&data[..i]);
                        out.push(Ok(std::mem::take(&mut self.buf)));
                    }
                    self.buf.clear();
                    data = &data[i + 1..];
                }
                None => {
                    if !self.discarding {
                        self.buf.extend_from_slice(data);
                        if self.buf.len() > MAX_LINE {
                            self.buf.clear();
                            self.discarding = true;
                            out.push(Err(AgentError::LineTooLong));
                        }
                    }
                    data = &[];
                }
            }
        }
        out
    }
}

/// A command waiting for the agent's answer, by request id.
enum Pending {
    Marker(oneshot::Sender<(u64, u64)>),
    CacheList(GuestCacheList, oneshot::Sender<GuestCacheList>),
    Prefetch(oneshot::Sender<rebound_api::PrefetchReport>),
}

type Markers = Arc<Mutex<HashMap<u64, Pending>>>;

/// Longest list the host keeps from a guest.
const CACHELIST_MAX: usize = crate::warm::MAX_BYTES as usize;

/// A live, self-reconnecting link to one guest's agent.
pub struct AgentLink {
    cmd_tx: mpsc::UnboundedSender<String>,
    markers: Markers,
    next_id: AtomicU64,
    connected: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AgentLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AgentLink {
    /// Starts connecting to `socket`; messages go to `msgs` (make it with
    /// [`channel`]).
    pub fn start(socket: &Path, msgs: mpsc::Sender<AgentMsg>) -> AgentLink {
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let markers: Markers = Arc::default();
        let connected = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(
            socket.to_path_buf(),
            msgs,
            cmd_rx,
            markers.clone(),
            connected.clone(),
        ));
        AgentLink {
            cmd_tx,
            markers,
            next_id: AtomicU64::new(1),
            connected,
            task,
        }
    }

    /// Whether the host side is connected to the agent socket now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    fn send(&self, v: serde_json::Value) -> Result<(), AgentError> {
        if !self.is_connected() {
            return Err(AgentError::NotConnected);
        }
        self.cmd_tx
            .send(v.to_string())
            .map_err(|_| AgentError::NotConnected)
    }

    /// Asks the guest to panic its kernel.
    pub fn crash(&self) -> Result<(), AgentError> {
        self.send(json!({"cmd": "crash"}))
    }

    /// Asks the guest to sync and power off.
    /// Asks the agent to stop feeding the watchdog: it then expires as for a hung guest.
    pub fn watchdog_stop(&self) -> Result<(), AgentError> {
        self.send(json!({"cmd": "watchdog_stop"}))
    }

    pub fn poweroff(&self) -> Result<(), AgentError> {
        self.send(json!({"cmd": "poweroff"}))
    }

    /// Asks the guest to sync and reboot (the same QEMU resets the machine).
    pub fn reboot(&self) -> Result<(), AgentError> {
        self.send(json!({"cmd": "reboot"}))
    }

    /// Sends `cmds` (built with the request id) and waits up to `secs` for the answer
    /// the agent link routes to `rx`.
    async fn request<T>(
        &self,
        secs: u64,
        pending: impl FnOnce(oneshot::Sender<T>) -> Pending,
        cmds: impl FnOnce(u64) -> Vec<serde_json::Value>,
    ) -> Result<T, AgentError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.markers
            .lock()
            .expect("markers lock")
            .insert(id, pending(tx));
        for c in cmds(id) {
            if let Err(e) = self.send(c) {
                self.markers.lock().expect("markers lock").remove(&id);
                return Err(e);
            }
        }
        match tokio::time::timeout(Duration::from_secs(secs), rx).await {
            Ok(Ok(r)) => Ok(r),
            _ => {
                self.markers.lock().expect("markers lock").remove(&id);
                Err(AgentError::Timeout(secs))
            }
        }
    }

    /// Has the guest write `value_hex` into a fresh locked page; returns (paddr, len).
    pub async fn marker(&self, value_hex: &str) -> Result<(u64, u64), AgentError> {
        self.request(20, Pending::Marker, |id| {
            vec![json!({"cmd": "marker", "id": id, "value_hex": value_hex})]
        })
        .await
    }

    /// The guest's cached file pages under /data (all of the agent's chunks).
    pub async fn cachelist(&self) -> Result<GuestCacheList, AgentError> {
        self.request(
            60,
            |tx| Pending::CacheList(GuestCacheList::default(), tx),
            |id| vec![json!({"cmd": "cachelist", "id": id})],
        )
        .await
    }

    /// Sends a list in chunks and waits up to `secs` for the guest to have read it.
    pub async fn prefetch(
        &self,
        chunks: &[&str],
        secs: u64,
    ) -> Result<rebound_api::PrefetchReport, AgentError> {
        let n = chunks.len();
        self.request(secs, Pending::Prefetch, |id| {
            if n == 0 {
                return vec![json!({"cmd": "prefetch", "id": id, "last": 1, "files": ""})];
            }
            chunks
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    json!({"cmd": "prefetch", "id": id, "last": u8::from(i + 1 == n), "files": c})
                })
                .collect()
        })
        .await
    }
}

/// The bounded queue from a link to its supervisor.
pub fn channel() -> (mpsc::Sender<AgentMsg>, mpsc::Receiver<AgentMsg>) {
    mpsc::channel(QUEUE)
}

/// What a link lets through to its supervisor.
struct Admission {
    all: crate::ratelimit::RateLimit,
    ready: crate::ratelimit::RateLimit,
    dropped: u64,
}

impl Admission {
    fn new() -> Admission {
        Admission {
            all: crate::ratelimit::RateLimit::new(RATE, Duration::from_secs(1)),
            ready: crate::ratelimit::RateLimit::new(READY_RATE, READY_WINDOW),
            dropped: 0,
        }
    }

    /// Hands `m` on if the rates and the queue allow; false when it was dropped.
    fn offer(
        &mut self,
        msgs: &mpsc::Sender<AgentMsg>,
        m: AgentMsg,
        now: std::time::Instant,
    ) -> Result<bool, ()> {
        let ok = self.all.admit(now).is_some()
            && (!matches!(m, AgentMsg::Ready(_)) || self.ready.admit(now).is_some());
        if !ok {
            self.dropped += 1;
            return Ok(false);
        }
        // Room for the count and the message, or neither goes.
        let need = if self.dropped > 0 { 2 } else { 1 };
        if msgs.is_closed() {
            return Err(());
        }
        if msgs.capacity() < need {
            self.dropped += 1;
            return Ok(false);
        }
        if self.dropped > 0 {
            let dropped = std::mem::take(&mut self.dropped);
            tracing::warn!(
                dropped,
                "agent link: a guest sent more than its rate allows"
            );
            msgs.try_send(AgentMsg::Throttled { dropped })
                .map_err(|_| ())?;
        }
        msgs.try_send(m).map_err(|_| ())?;
        Ok(true)
    }
}

/// Routes an answer to the command waiting for it; a message that answers nothing
/// goes on to the supervisor (returned).
fn route(markers: &Markers, m: AgentMsg) -> Option<AgentMsg> {
    let mut map = markers.lock().expect("markers lock");
    match m {
        AgentMsg::Marker { id, paddr, len } => {
            if let Some(Pending::Marker(tx)) = map.remove(&id) {
                let _ = tx.send((paddr, len));
            }
            None
        }
        AgentMsg::Cachelist {
            id,
            last,
            files,
            cached_files,
            cached_pages,
            skipped,
        } => {
            if let Some(Pending::CacheList(mut acc, tx)) = map.remove(&id) {
                if acc.text.len() + files.len() <= CACHELIST_MAX {
                    acc.text.push_str(&files);
                } else {
                    acc.skipped += 1;
                }
                if last != 0 {
                    acc.files = cached_files;
                    acc.pages = cached_pages;
                    acc.skipped += skipped;
                    let _ = tx.send(acc);
                } else {
                    map.insert(id, Pending::CacheList(acc, tx));
                }
            }
            None
        }
        AgentMsg::Prefetch(r) => match map.remove(&r.id) {
            Some(Pending::Prefetch(tx)) => {
                let _ = tx.send(r.report);
                None
            }
            Some(other) => {
                map.insert(r.id, other);
                Some(AgentMsg::Prefetch(r))
            }
            None => Some(AgentMsg::Prefetch(r)),
        },
        other => Some(other),
    }
}

async fn run(
    socket: PathBuf,
    msgs: mpsc::Sender<AgentMsg>,
    mut cmd_rx: mpsc::UnboundedReceiver<String>,
    markers: Markers,
    connected: Arc<AtomicBool>,
) {
    loop {
        let Ok(stream) = UnixStream::connect(&socket).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        connected.store(true, Ordering::Relaxed);
        let end = session(stream, &msgs, &mut cmd_rx, &markers).await;
        connected.store(false, Ordering::Relaxed);
        if end.is_err() {
            // The supervisor is gone: nobody to report to.
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One connection; `Err` means the message receiver is gone.
async fn session(
    stream: UnixStream,
    msgs: &mpsc::Sender<AgentMsg>,
    cmd_rx: &mut mpsc::UnboundedReceiver<String>,
    markers: &Markers,
) -> Result<(), ()> {
    let (mut r, mut w) = stream.into_split();
    let mut split = LineSplitter::default();
    let mut buf = vec![0u8; 8192];
    let mut ready_seen = false;
    let mut admit = Admission::new();
    // The guest controls these bytes: a few warnings a minute at most.
    let mut bad = crate::ratelimit::RateLimit::new(5, Duration::from_secs(60));
    let mut hello = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            n = r.read(&mut buf) => {
                let n = match n { Ok(0) | Err(_) => return Ok(()), Ok(n) => n };
                for line in split.push(&buf[..n]) {
                    match line.and_then(|l| parse_line(&l)) {
                        Ok(m) => {
                            if let Some(m) = route(markers, m) {
                                let ready = matches!(m, AgentMsg::Ready(_));
                                let passed = admit.offer(msgs, m, std::time::Instant::now())?;
                                // A dropped `ready` is asked for again (`hello`).
                                ready_seen |= ready && passed;
                            }
                        }
                        Err(e) => {
                            if let Some(dropped) = bad.admit(std::time::Instant::now()) {
                                tracing::warn!(dropped_since_last = dropped, "agent link: dropped a line: {e}");
                            }
                        }
                    }
                }
            }
            _ = hello.tick(), if !ready_seen => {
                if w.write_all(b"{\"cmd\":\"hello\"}\n").await.is_err() { return Ok(()); }
            }
            cmd = cmd_rx.recv() => {
                let Some(mut line) = cmd else { return Err(()) };
                line.push('\n');
                if w.write_all(line.as_bytes()).await.is_err() { return Ok(()); }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_protocol_messages() {
        let r = parse_line(br#"{"type":"ready","agent_version":1,"kernel_release":"6.1.0-28-amd64","mem_total_kib":200000,"vmcoreinfo":{"paddr":123,"size":4096},"evict_ring":{"gpa":8388608,"bytes":1048576},"workload":"web","service_port":8080,"uptime_ms":1500}"#).unwrap();
        match r {
            AgentMsg::Ready(i) => {
                assert_eq!(i.kernel_release, "6.1.0-28-amd64");
                assert_eq!(
                    i.vmcoreinfo,
                    Some(VmcoreinfoAddr {
                        paddr: 123,
                        size: 4096
                    })
                );
                assert_eq!(i.service_port, Some(8080));
                assert_eq!(
                    i.evict_ring,
                    Some(rebound_api::EvictRingAddr {
                        gpa: 8 << 20,
                        bytes: 1 << 20
                    })
                );
            }
            other => panic!("{other:?}"),
        }
        let r = parse_line(br#"{"type":"ready","agent_version":1,"kernel_release":"x","vmcoreinfo":null,"service_port":null}"#).unwrap();
        assert!(matches!(
            r,
            AgentMsg::Ready(ReadyInfo {
                vmcoreinfo: None,
                evict_ring: None,
                ..
            })
        ));
        assert_eq!(
            parse_line(br#"{"type":"marker","id":1,"paddr":4096,"len":4}"#).unwrap(),
            AgentMsg::Marker {
                id: 1,
                paddr: 4096,
                len: 4
            }
        );
        assert_eq!(
            parse_line(br#"{"type":"rebooting"}"#).unwrap(),
            AgentMsg::Rebooting
        );
        assert_eq!(
            parse_line(br#"{"type":"memfill","filled_kib":1,"rounds":2,"errors":0}"#).unwrap(),
            AgentMsg::Memfill {
                filled_kib: 1,
                rounds: 2,
                errors: 0
            }
        );
        assert!(matches!(
            parse_line(b"{\"type\":\"heartbeat\",\"seq\":5}\r").unwrap(),
            AgentMsg::Heartbeat { seq: 5 }
        ));
        // As wl_files.c writes it, without and with an error.
        let line = br#"{"type":"files","round":1,"pattern":"zipf","requests":200,"reads":180,"writes":20,"bytes_read":188743680,"bytes_written":20971520,"seconds":3.250000,"errors":0,"first_error":null,"footprint_kib":98304,"cached_kib":120000,"mem_total_kib":230000}"#;
        let AgentMsg::Files(f) = parse_line(line).unwrap() else {
            panic!("not files")
        };
        assert_eq!((f.round, f.requests, f.writes), (1, 200, 20));
        assert_eq!((f.errors, f.first_error), (0, None));
        assert_eq!((f.footprint_kib, f.mem_total_kib), (98304, 230000));
        let line = br#"{"type":"files","round":2,"pattern":"seq","requests":96,"reads":96,"writes":0,"bytes_read":1,"bytes_written":0,"seconds":1.5,"errors":3,"first_error":"f00017 offset 7168: expected version word 5242000000000003, found 5242000000000002 (stale version)","footprint_kib":1,"cached_kib":2,"mem_total_kib":3}"#;
        let AgentMsg::Files(f) = parse_line(line).unwrap() else {
            panic!("not files")
        };
        assert!(f.first_error.unwrap().starts_with("f00017 offset 7168"));
    }

    #[test]
    fn rejects_malformed_messages() {
        for bad in [
            &b"{\"type\":\"ready\""[..],            // truncated
            b"{\"type\":\"bogus\"}",                // unknown type
            b"{\"type\":\"marker\",\"id\":1}",      // missing fields
            b"{\"type\":\"heartbeat\",\"seq\":-1}", // wrong type
            b"[]",
            b"",
        ] {
            assert!(
                matches!(parse_line(bad), Err(AgentError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(parse_line(b"\xff\xfe"), Err(AgentError::NotUtf8));
        // Only the link says how much it dropped.
        assert!(matches!(
            parse_line(br#"{"type":"throttled","dropped":1}"#),
            Err(AgentError::Malformed(_))
        ));
    }

    #[test]
    fn splits_lines_across_reads() {
        let mut s = LineSplitter::default();
        assert!(s.push(b"{\"a\"").is_empty());
        let out = s.push(b":1}\n{\"b\":2}\npartial");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].as_ref().unwrap(), b"{\"a\":1}");
        assert_eq!(out[1].as_ref().unwrap(), b"{\"b\":2}");
        assert_eq!(s.push(b"\n")[0].as_ref().unwrap(), b"partial");
    }

    #[test]
    fn drops_oversized_lines_and_recovers() {
        let mut s = LineSplitter::default();
        let big = vec![b'x'; MAX_LINE + 10];
        let out = s.push(&big);
        assert_eq!(out, vec![Err(AgentError::LineTooLong)]);
        // The rest of the oversized line is skipped, the next line survives.
        let out = s.push(b"yyy\nok\n");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].as_ref().unwrap(), b"ok");
        // Oversized within one read, with its newline.
        let mut big = vec![b'x'; MAX_LINE + 1];
        big.extend_from_slice(b"\nok2\n");
        let out = s.push(&big);
        assert_eq!(out[0], Err(AgentError::LineTooLong));
        assert_eq!(out[1].as_ref().unwrap(), b"ok2");
    }

    #[test]
    fn admission_holds_a_flood_to_the_rate_and_counts_the_rest() {
        let (tx, mut rx) = channel();
        let mut a = Admission::new();
        let t = std::time::Instant::now();
        let hb = |seq| AgentMsg::Heartbeat { seq };
        let mut passed = 0;
        for i in 0..(RATE as u64 + 50) {
            passed += u32::from(a.offer(&tx, hb(i), t).unwrap());
            // The supervisor keeps up.
            while rx.try_recv().is_ok() {}
        }
        assert_eq!(passed, RATE);
        // The next window: the count comes first, then the message.
        let t2 = t + Duration::from_millis(1100);
        assert!(a.offer(&tx, hb(0), t2).unwrap());
        assert_eq!(rx.try_recv().unwrap(), AgentMsg::Throttled { dropped: 50 });
        assert_eq!(rx.try_recv().unwrap(), hb(0));
        // A supervisor that does not read: the queue stays bounded.
        for w in 0..2u64 {
            let tw = t + Duration::from_secs(5) + Duration::from_millis(1100 * w);
            for i in 0..RATE as u64 {
                let _ = a.offer(&tx, hb(i), tw).unwrap();
            }
        }
        assert_eq!(tx.capacity(), 0);
        assert_eq!(a.dropped, 2 * RATE as u64 - QUEUE as u64);
        // `ready` has its own, lower rate.
        let mut b = Admission::new();
        let (tx, _rx) = channel();
        let ready = || {
            parse_line(br#"{"type":"ready","agent_version":1,"kernel_release":"x","vmcoreinfo":null,"service_port":null}"#).unwrap()
        };
        let n = (0..20)
            .filter(|_| b.offer(&tx, ready(), t).unwrap())
            .count();
        assert_eq!(n, READY_RATE as usize);
    }
}
