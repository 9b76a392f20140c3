//! Shared pieces: the stand-in VMs, quick timeouts, a cohort on 127.0.0.1, a raw
//! authenticated client, and a TCP proxy that drops or duplicates one frame.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebound_coord::cohort::CohortConfig;
use rebound_coord::msg::{unix_now_ns, Message};
use rebound_coord::wire::{
    client_handshake, FrameReader, FrameWriter, CLIENT_HELLO_LEN, CLIENT_PROOF_LEN,
    SERVER_HELLO_LEN,
};
use rebound_coord::{
    spawn_cohort, ClusterToken, CohortHandle, CohortVms, CoordinatorConfig, LoadInfo, StartInfo,
    VmError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

pub fn token() -> ClusterToken {
    ClusterToken::from_bytes(b"0123456789abcdef0123456789abcdef-test").unwrap()
}

pub fn other_token() -> ClusterToken {
    ClusterToken::from_bytes(b"fedcba9876543210fedcba9876543210-other").unwrap()
}

/// Timeouts short enough for a test file that runs in seconds.
pub fn quick() -> CoordinatorConfig {
    CoordinatorConfig {
        connect: Duration::from_millis(500),
        handshake: Duration::from_secs(1),
        retry: Duration::from_millis(100),
        ping: Duration::from_millis(50),
        peer: Duration::from_millis(500),
        load: Duration::from_secs(5),
        start: Duration::from_secs(2),
        restore: Duration::from_secs(5),
        abort: Duration::from_secs(1),
    }
}

pub fn quick_cohort() -> CohortConfig {
    CohortConfig {
        handshake_timeout: Duration::from_secs(1),
        hold_timeout: Duration::from_millis(400),
        ..CohortConfig::default()
    }
}

/// How one stand-in VM behaves.
#[derive(Clone)]
pub struct Behaviour {
    pub load: Duration,
    pub start: Duration,
    pub restore: Duration,
    pub fail_load: Option<String>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            load: Duration::from_millis(20),
            start: Duration::from_millis(10),
            restore: Duration::from_millis(30),
            fail_load: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Call {
    pub what: &'static str,
    pub vm: String,
    pub at: Instant,
}

/// A stand-in for the daemon's VMs: sleeps for load, start and restore and records
/// every call. Not a VM: the real-VM tests come with the daemon integration.
#[derive(Default)]
pub struct StandInVms {
    behaviour: HashMap<String, Behaviour>,
    calls: Mutex<Vec<Call>>,
}

impl StandInVms {
    pub fn new(behaviour: &[(&str, Behaviour)]) -> Arc<Self> {
        Arc::new(Self {
            behaviour: behaviour
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            calls: Mutex::new(Vec::new()),
        })
    }

    fn record(&self, what: &'static str, vm: &str) {
        self.calls.lock().unwrap().push(Call {
            what,
            vm: vm.to_owned(),
            at: Instant::now(),
        });
    }

    fn of(&self, vm: &str) -> Behaviour {
        self.behaviour.get(vm).cloned().unwrap_or_default()
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self, what: &str, vm: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.what == what && c.vm == vm)
            .count()
    }

    pub fn at(&self, what: &str, vm: &str) -> Option<Instant> {
        self.calls()
            .iter()
            .find(|c| c.what == what && c.vm == vm)
            .map(|c| c.at)
    }
}

#[async_trait::async_trait]
impl CohortVms for StandInVms {
    async fn load(
        &self,
        _restore_id: &str,
        vm: &str,
        ws_pages: u64,
        _args: &serde_json::Value,
    ) -> Result<LoadInfo, VmError> {
        self.record("load", vm);
        let b = self.of(vm);
        tokio::time::sleep(b.load).await;
        if let Some(e) = b.fail_load {
            self.record("load_failed", vm);
            return Err(e.into());
        }
        self.record("loaded", vm);
        Ok(LoadInfo {
            pages: ws_pages,
            load_s: b.load.as_secs_f64(),
        })
    }

    async fn start(&self, _restore_id: &str, vm: &str) -> Result<StartInfo, VmError> {
        self.record("start", vm);
        tokio::time::sleep(self.of(vm).start).await;
        let started_unix_ns = unix_now_ns();
        self.record("started", vm);
        Ok(StartInfo { started_unix_ns })
    }

    async fn restored(&self, _restore_id: &str, vm: &str) -> Result<(), VmError> {
        tokio::time::sleep(self.of(vm).restore).await;
        self.record("restored", vm);
        Ok(())
    }

    async fn abort(&self, _restore_id: &str, vm: &str) {
        self.record("abort", vm);
    }
}

pub async fn cohort(vms: Arc<StandInVms>, token: ClusterToken) -> CohortHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    spawn_cohort(listener, token, vms, quick_cohort()).unwrap()
}

pub type Reader = FrameReader<OwnedReadHalf>;
pub type Writer = FrameWriter<OwnedWriteHalf>;

/// A coordinator-side connection driven by hand.
pub async fn raw_client(addr: SocketAddr, token: &ClusterToken) -> (Reader, Writer) {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    client_handshake(s, token, Duration::from_secs(1))
        .await
        .unwrap()
}

pub fn json(m: &Message) -> Vec<u8> {
    serde_json::to_vec(m).unwrap()
}

/// The next message, or `None` when the cohort closed the connection (or said
/// nothing for a second).
pub async fn recv(r: &mut Reader) -> Option<Message> {
    match tokio::time::timeout(Duration::from_secs(1), r.read()).await {
        Ok(Ok(p)) => Some(serde_json::from_slice(&p).unwrap()),
        _ => None,
    }
}

/// Reads messages until one that is not a PONG.
pub async fn recv_answer(r: &mut Reader) -> Option<Message> {
    loop {
        match recv(r).await? {
            Message::Pong { .. } => continue,
            m => return Some(m),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
pub enum Dir {
    ToCohort,
    ToCoordinator,
}

#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    Drop,
    Duplicate,
}

/// A TCP proxy in front of a cohort that drops or duplicates the first frame going
/// `dir` whose JSON contains `needle` (once, over all its connections).
pub struct Proxy {
    pub addr: SocketAddr,
    pub fired: Arc<AtomicBool>,
}

pub async fn proxy(target: SocketAddr, dir: Dir, fault: Fault, needle: &'static str) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let to_cohort = Some((fault, needle, f.clone())).filter(|_| dir == Dir::ToCohort);
            let to_coord = Some((fault, needle, f.clone())).filter(|_| dir == Dir::ToCoordinator);
            tokio::spawn(pump(
                cr,
                sw,
                vec![CLIENT_HELLO_LEN, CLIENT_PROOF_LEN],
                to_cohort,
            ));
            tokio::spawn(pump(sr, cw, vec![SERVER_HELLO_LEN], to_coord));
        }
    });
    Proxy { addr, fired }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    handshake: Vec<usize>,
    fault: Option<(Fault, &'static str, Arc<AtomicBool>)>,
) {
    for n in handshake {
        let mut buf = vec![0u8; n];
        if from.read_exact(&mut buf).await.is_err() || to.write_all(&buf).await.is_err() {
            return;
        }
    }
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        if from.read_exact(&mut body).await.is_err() {
            return;
        }
        let frame = [&len[..], &body].concat();
        let mut copies = 1;
        if let Some((fault, needle, fired)) = &fault {
            let payload = String::from_utf8_lossy(&body[8..body.len().saturating_sub(32)]);
            if payload.contains(needle) && !fired.swap(true, Ordering::SeqCst) {
                copies = if *fault == Fault::Drop { 0 } else { 2 };
            }
        }
        for _ in 0..copies {
            if to.write_all(&frame).await.is_err() {
                return;
            }
        }
    }
}

/// Log lines written while the guard lives (current-thread tests only).
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn capture_logs() -> (Logs, tracing::subscriber::DefaultGuard) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || LogWriter(b.clone()))
        .finish();
    (Logs(buf), tracing::subscriber::set_default(subscriber))
}
