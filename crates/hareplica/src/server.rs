//! The backup: holds the replica in memory and on disk, applies commits, serves takeover.
//!
//! One thread per connection. At most one primary session is *current* (its epoch is the
//! backup's epoch); a promote or a takeover bumps the epoch, after which the old session's
//! commits are refused. Acknowledgements are sent once no further frame is already
//! buffered, after one log barrier: a pipelining primary gets one fsync per burst.
//!
//! A TCP connection first proves it holds the token ([`crate::auth`]); a TCP listener
//! without a token is refused. A connection that has started no session (hello or
//! attach) by `hello_timeout` after it was accepted is dropped, so at most
//! `MAX_CONNECTIONS` peers can be silent at a time, and each only that long.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rebound_token::ClusterToken;

use crate::auth::{self, AuthError};
use crate::endpoint::{Endpoint, EndpointError, Listener, PollingReader, Stream};
use crate::replica::{ReplicaState, Verdict};
use crate::spin::{Spin, Spinner};
use crate::store::{OpenReport, Store, StoreError};
use crate::wire::{
    self, Commit, CommitKind, CompactCommit, ErrorCode, FrameReader, Hello, HelloKind, Message,
    Mode, PrimaryInfo, StatusInfo, WireError, IMAGE_CHUNK,
};

/// How long a new primary waits for a previous session to end before being refused.
const SESSION_HANDOVER: Duration = Duration::from_secs(2);
const MAX_CONNECTIONS: usize = 64;
const READ_TICK: Duration = Duration::from_millis(100);
const ACCEPT_TICK: Duration = Duration::from_millis(100);
/// Before a session exists a commit is refused anyway; do not read a big one.
const PRE_SESSION_COMMIT_CAP: u32 = 64 << 10;

/// A generous bound on a commit for a `heap_size`-byte heap: diff runs are disjoint (at
/// most the heap's bytes) with headers of a few bytes; 4x plus 64 KiB leaves room for
/// callers that send overlapping runs (a write log), and still ties the memory a peer
/// can make us hold to the heap it declared.
fn session_commit_cap(heap_size: u64) -> u32 {
    let cap = 4 * heap_size + (64 << 10);
    cap.min(u64::from(wire::MAX_COMMIT_PAYLOAD)) as u32
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot open the replica directory")]
    Store(#[from] StoreError),
    #[error("cannot listen")]
    Endpoint(#[from] EndpointError),
    #[error("cannot accept connections")]
    Accept(#[source] std::io::Error),
    #[error("a tcp listener needs a token file (--token-file, at least 32 random bytes, mode 0600); use unix:PATH for a backup on this host")]
    NoToken,
}

/// Settings of a backup.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    pub listen: Endpoint,
    pub dir: PathBuf,
    /// fsync the log before each acknowledgement (survives power loss, not only a crash).
    pub durable: bool,
    /// Let a primary announcing a fresh heap replace a replica that holds transactions.
    pub allow_reset: bool,
    /// Checkpoint the image once the log exceeds this many bytes (0: the larger of
    /// 64 MiB and the heap size).
    pub checkpoint_bytes: u64,
    /// A peer that stops sending inside a frame for this long is dropped (its partial
    /// frame discarded), so a half-sent commit cannot hold the primary session forever.
    pub frame_timeout: Duration,
    /// How to wait for the next frame: busy-polling saves the sleeping reader's wake-up
    /// on an idle machine and burns a CPU meanwhile (see [`Spin`]).
    pub spin: Spin,
    /// The shared secret a TCP peer must prove it holds (required for a TCP listener).
    pub token: Option<ClusterToken>,
    /// A connection that has not started a primary session (hello or attach) this long
    /// after it was accepted is dropped, token handshake included: silent or slow peers
    /// cannot keep the connection slots from a primary.
    pub hello_timeout: Duration,
}

impl BackupConfig {
    pub fn new(listen: Endpoint, dir: &Path) -> BackupConfig {
        BackupConfig {
            listen,
            dir: dir.to_path_buf(),
            durable: false,
            allow_reset: false,
            checkpoint_bytes: 0,
            frame_timeout: Duration::from_secs(30),
            spin: Spin::BACKUP,
            token: None,
            hello_timeout: Duration::from_secs(5),
        }
    }
}

struct Session {
    id: u64,
    peer: String,
    epoch: u64,
    mode: Mode,
}

struct Inner {
    state: ReplicaState,
    store: Store,
    session: Option<Session>,
    next_id: u64,
    txs_applied: u64,
    bytes_applied: u64,
    last_commit: Option<Instant>,
}

/// A commit frame as it arrived: standard, or compact (its tx id and epoch implied).
enum Incoming {
    Standard(Commit),
    Compact(CompactCommit),
}

struct Shared {
    inner: Mutex<Inner>,
    session_ended: Condvar,
    stop: AtomicBool,
    connections: AtomicUsize,
    conn_seq: AtomicU64,
    open_streams: Mutex<Vec<(u64, Stream)>>,
    cfg: BackupConfig,
    /// Warnings about what peers sent: a peer must not be able to flood the log.
    peer_warnings: LogBudget,
    /// Called by a connection between logging a transaction and acknowledging it (the
    /// window in which a promote and a takeover may run): lets a test hold it there.
    #[cfg(test)]
    before_ack: Mutex<Option<tests::Hook>>,
}

impl Shared {
    /// Opens the replica directory (replaying its log); no session, no connection.
    fn open(cfg: BackupConfig) -> Result<(Shared, OpenReport), ServerError> {
        let (store, state, report) = Store::open(&cfg.dir, cfg.durable)?;
        let inner = Inner {
            state,
            store,
            session: None,
            next_id: 1,
            txs_applied: 0,
            bytes_applied: 0,
            last_commit: None,
        };
        let shared = Shared {
            inner: Mutex::new(inner),
            session_ended: Condvar::new(),
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            conn_seq: AtomicU64::new(0),
            open_streams: Mutex::new(Vec::new()),
            cfg,
            peer_warnings: LogBudget::default(),
            #[cfg(test)]
            before_ack: Mutex::new(None),
        };
        Ok((shared, report))
    }
}

/// At most [`LogBudget::PER_SECOND`] log lines a second; the ones refused are counted and
/// reported by the next line allowed.
#[derive(Default)]
struct LogBudget {
    /// Start of the current second, lines allowed in it, lines refused since the last one.
    state: Mutex<(Option<Instant>, u32, u64)>,
}

impl LogBudget {
    const PER_SECOND: u32 = 10;

    /// `Some(lines refused before this one)` when this line may be logged.
    fn allow(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (start, used, refused) = &mut *st;
        let now = Instant::now();
        if start.is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1)) {
            (*start, *used) = (Some(now), 0);
        }
        if *used >= Self::PER_SECOND {
            *refused += 1;
            return None;
        }
        *used += 1;
        Some(std::mem::take(refused))
    }
}

/// A bound backup, ready to serve.
pub struct BackupServer {
    shared: Arc<Shared>,
    listener: Listener,
    local: Endpoint,
}

/// A backup serving on a background thread (tests, benchmarks).
pub struct BackupHandle {
    shared: Arc<Shared>,
    local: Endpoint,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl BackupServer {
    /// Opens the replica directory (replaying its log) and binds the endpoint.
    pub fn bind(cfg: BackupConfig) -> Result<(BackupServer, OpenReport), ServerError> {
        if matches!(cfg.listen, Endpoint::Tcp(_)) && cfg.token.is_none() {
            return Err(ServerError::NoToken);
        }
        let listener = cfg.listen.listen()?;
        let local = listener.local_endpoint().map_err(ServerError::Accept)?;
        let (shared, report) = Shared::open(cfg)?;
        let shared = Arc::new(shared);
        Ok((
            BackupServer {
                shared,
                listener,
                local,
            },
            report,
        ))
    }

    /// The contract's entry point: bind and serve until the process ends.
    pub fn run(ep: &Endpoint, dir: &Path, durable: bool) -> Result<(), ServerError> {
        let mut cfg = BackupConfig::new(ep.clone(), dir);
        cfg.durable = durable;
        Self::bind(cfg)?.0.serve()
    }

    /// The endpoint actually bound (with the real port for `tcp:…:0`).
    pub fn local_endpoint(&self) -> &Endpoint {
        &self.local
    }

    /// A snapshot of the backup's state.
    pub fn status(&self) -> StatusInfo {
        status_of(&lock(&self.shared))
    }

    /// Accepts connections until stopped.
    pub fn serve(self) -> Result<(), ServerError> {
        loop {
            // Poll with a timeout so a stop request is seen even if no one connects.
            match self.listener.wait_pending(ACCEPT_TICK) {
                _ if self.shared.stop.load(Ordering::SeqCst) => return Ok(()),
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ServerError::Accept(e)),
            }
            let stream = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if self.shared.stop.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    // Out of descriptors and similar: wait rather than spin or die.
                    tracing::warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let shared = Arc::clone(&self.shared);
            if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                shared.connections.fetch_sub(1, Ordering::SeqCst);
                let mut s = stream;
                send(
                    &mut s,
                    &error_msg(ErrorCode::Internal, "too many connections"),
                );
                continue;
            }
            std::thread::spawn(move || {
                let deadline = Instant::now() + shared.cfg.hello_timeout;
                let conn_id = shared.conn_seq.fetch_add(1, Ordering::SeqCst);
                if let Ok(clone) = stream.try_clone() {
                    shared
                        .open_streams
                        .lock()
                        .expect("streams")
                        .push((conn_id, clone));
                }
                let mut stream = stream;
                match authenticate(&shared, &mut stream, deadline) {
                    Ok(()) => Connection::new(&shared, stream, deadline).run(),
                    Err(e) => {
                        if let Some(more) = shared.peer_warnings.allow() {
                            tracing::warn!(
                                suppressed = more,
                                "{}: dropping the connection: {e}",
                                stream.peer_name()
                            );
                        }
                    }
                }
                shared
                    .open_streams
                    .lock()
                    .expect("streams")
                    .retain(|(id, _)| *id != conn_id);
                shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    /// Serves on a background thread.
    pub fn spawn(self) -> BackupHandle {
        let shared = Arc::clone(&self.shared);
        let local = self.local.clone();
        let thread = std::thread::spawn(move || self.serve());
        BackupHandle {
            shared,
            local,
            thread: Some(thread),
        }
    }
}

impl BackupHandle {
    pub fn endpoint(&self) -> &Endpoint {
        &self.local
    }

    pub fn status(&self) -> StatusInfo {
        status_of(&lock(&self.shared))
    }

    /// A copy of the replica state (tests compare images).
    pub fn state(&self) -> ReplicaState {
        lock(&self.shared).state.clone()
    }

    /// Stops accepting, drops all connections and checkpoints the image.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        self.stop()
    }

    fn stop(&mut self) -> Result<(), ServerError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, s) in self.shared.open_streams.lock().expect("streams").iter() {
            s.shutdown();
        }
        let served = thread.join().expect("backup thread panicked");
        let mut inner = lock(&self.shared);
        let inner = &mut *inner;
        if inner.state.is_initialized() {
            inner.store.checkpoint(&inner.state)?;
        }
        served
    }
}

impl Drop for BackupHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("backup shutdown: {e}");
        }
    }
}

/// A TCP peer proves it holds the token before anything else is read from it.
fn authenticate(shared: &Shared, stream: &mut Stream, deadline: Instant) -> Result<(), AuthError> {
    match (&shared.cfg.token, &*stream) {
        (Some(token), Stream::Tcp(_)) => auth::server(stream, token, deadline),
        _ => Ok(()),
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    // A panic in one connection must not take the replica down with it; the state is
    // only changed by judged, complete commits.
    shared.inner.lock().unwrap_or_else(|p| p.into_inner())
}

fn status_of(inner: &Inner) -> StatusInfo {
    StatusInfo {
        last_tx: inner.state.last_tx,
        epoch: inner.state.epoch,
        heap_size: inner.state.heap_size,
        txs_applied: inner.txs_applied,
        bytes_applied: inner.bytes_applied,
        wal_bytes: inner.store.wal_bytes(),
        durable: inner.store.durable(),
        ms_since_commit: inner.last_commit.map(|t| t.elapsed().as_millis() as u64),
        primary: inner.session.as_ref().map(|s| PrimaryInfo {
            peer: s.peer.clone(),
            epoch: s.epoch,
            mode: s.mode,
            current: s.epoch == inner.state.epoch,
        }),
    }
}

fn error_msg(code: ErrorCode, message: impl Into<String>) -> Message {
    Message::Error {
        code,
        message: message.into(),
    }
}

/// Sends one message; a vanished peer is not an error worth more than a log line.
fn send(stream: &mut Stream, msg: &Message) -> bool {
    let mut buf = Vec::new();
    wire::encode(msg, &mut buf);
    match stream.write_all(&buf) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("send to {} failed: {e}", stream.peer_name());
            false
        }
    }
}

/// A refusal: sent to the peer, then the connection closes.
struct Refusal(ErrorCode, String);

struct Connection<'a> {
    shared: &'a Shared,
    reader: PollingReader,
    peer: String,
    session: Option<u64>,
    /// Encoded `Ack`s of transactions logged and applied, sent by [`settle`](Self::settle).
    pending_acks: Vec<u8>,
    /// A transaction was applied since the last settle (the log may need a checkpoint).
    applied: bool,
    /// Parts of the streamed transaction in progress on this connection, and their
    /// payload bytes (checked against the commit cap as each part arrives).
    parts: Vec<Commit>,
    parts_bytes: u64,
    /// Largest commit payload accepted: small until a session names its heap size.
    commit_cap: u32,
    spinner: Spinner,
    /// Until a session starts, the connection is dropped at this instant.
    hello_deadline: Instant,
}

impl<'a> Connection<'a> {
    fn new(shared: &'a Shared, stream: Stream, hello_deadline: Instant) -> Self {
        let peer = stream.peer_name();
        // A tick lets the frame reader notice stalls inside a frame.
        if let Err(e) = stream.set_read_timeout(Some(READ_TICK)) {
            tracing::warn!("{peer}: cannot set a read timeout: {e}");
        }
        Connection {
            shared,
            reader: PollingReader::with_capacity(256 << 10, stream),
            peer,
            session: None,
            pending_acks: Vec::new(),
            applied: false,
            parts: Vec::new(),
            parts_bytes: 0,
            commit_cap: PRE_SESSION_COMMIT_CAP,
            spinner: Spinner::new(shared.cfg.spin),
            hello_deadline,
        }
    }

    fn run(mut self) {
        loop {
            let mut frames = FrameReader {
                stall_limit: self.shared.cfg.frame_timeout,
                idle_limit: None,
                commit_cap: self.commit_cap,
            };
            if self.session.is_none() {
                // Operators' requests and a new primary's hello come at once.
                let left = self
                    .hello_deadline
                    .saturating_duration_since(Instant::now());
                frames.idle_limit = Some(left);
                frames.stall_limit = frames.stall_limit.min(left);
            }
            let start = self.spinner.wait(&mut self.reader);
            let read = frames.read(&mut self.reader);
            self.spinner.waited(start);
            let msg = match read {
                Ok(m) => m,
                Err(WireError::Closed) => break,
                Err(e) => {
                    if let Some(more) = self.shared.peer_warnings.allow() {
                        tracing::warn!(
                            suppressed = more,
                            "{}: dropping the connection: {e}",
                            self.peer
                        );
                    }
                    let code = match e {
                        WireError::Io(_)
                        | WireError::Truncated { .. }
                        | WireError::Stalled(_)
                        | WireError::IdleTimeout(_) => None,
                        _ => Some(ErrorCode::Malformed),
                    };
                    if let Some(code) = code {
                        send(self.reader.get_mut(), &error_msg(code, e.to_string()));
                    }
                    break;
                }
            };
            if self.shared.stop.load(Ordering::SeqCst) {
                break;
            }
            match self.handle(msg) {
                Ok(true) => {}
                Ok(false) => break,
                Err(r) => {
                    self.refuse(r);
                    break;
                }
            }
            #[cfg(test)]
            if !self.pending_acks.is_empty() {
                tests::call(&self.shared.before_ack);
            }
            // Acks go out once no further frame is buffered (a batch in async mode).
            if !self.settle(self.reader.buffer().is_empty()) {
                break;
            }
        }
        self.end();
    }

    /// Acknowledges what was accepted before the refusal, then sends the refusal.
    fn refuse(&mut self, Refusal(code, why): Refusal) {
        if let Some(more) = self.shared.peer_warnings.allow() {
            tracing::warn!(suppressed = more, "{}: refused: {why}", self.peer);
        }
        self.settle(true);
        send(self.reader.get_mut(), &error_msg(code, why));
    }

    /// The connection closes: last acknowledgements, and its session ends.
    fn end(mut self) {
        self.settle(true);
        if let Some(id) = self.session {
            let mut inner = lock(self.shared);
            if inner.session.as_ref().is_some_and(|s| s.id == id) {
                inner.session = None;
                tracing::info!("{}: primary session ended", self.peer);
            }
            self.shared.session_ended.notify_all();
        }
    }

    /// Handles one message; `Ok(false)` ends the connection quietly.
    fn handle(&mut self, msg: Message) -> Result<bool, Refusal> {
        match msg {
            Message::Commit(c) if self.session.is_some() => {
                self.commit(Incoming::Standard(c)).map(|()| true)
            }
            Message::Compact(cc) if self.session.is_some() => {
                self.commit(Incoming::Compact(cc)).map(|()| true)
            }
            Message::Hello(h) if self.session.is_none() => self.hello(h).map(|()| true),
            Message::Attach { mode } if self.session.is_none() => self.attach(mode),
            Message::Status => {
                let status = status_of(&lock(self.shared));
                Ok(send(self.reader.get_mut(), &Message::StatusReply(status)))
            }
            Message::Promote if self.session.is_none() => self.promote(),
            m => Err(Refusal(
                ErrorCode::Unexpected,
                format!("unexpected {} message here", m.kind()),
            )),
        }
    }

    /// Waits for a current primary session to end; refuses when it does not.
    fn wait_no_current_session<'g>(
        &self,
        mut inner: MutexGuard<'g, Inner>,
    ) -> Result<MutexGuard<'g, Inner>, Refusal> {
        let deadline = Instant::now() + SESSION_HANDOVER;
        loop {
            let Some(s) = &inner.session else {
                return Ok(inner);
            };
            if s.epoch != inner.state.epoch {
                return Ok(inner); // fenced by a promote: may be replaced
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Refusal(
                    ErrorCode::PrimaryActive,
                    format!(
                        "a primary ({}) is connected in epoch {}; promote the backup first to fence it",
                        s.peer, s.epoch
                    ),
                ));
            }
            inner = self
                .shared
                .session_ended
                .wait_timeout(inner, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn start_session(&mut self, inner: &mut Inner, mode: Mode) {
        let id = inner.next_id;
        inner.next_id += 1;
        self.commit_cap = session_commit_cap(inner.state.heap_size);
        inner.session = Some(Session {
            id,
            peer: self.peer.clone(),
            epoch: inner.state.epoch,
            mode,
        });
        self.session = Some(id);
    }

    fn hello(&mut self, h: Hello) -> Result<(), Refusal> {
        let inner = lock(self.shared);
        if h.kind == HelloKind::Resume {
            // A fenced primary is told so at once, not after waiting for the current one.
            check_resume(&inner.state, &h)?;
        }
        let mut inner = self.wait_no_current_session(inner)?;
        let inner = &mut *inner;
        let st = &mut inner.state;
        match h.kind {
            HelloKind::Fresh => {
                if st.last_tx > 0 && !self.shared.cfg.allow_reset {
                    return Err(Refusal(
                        ErrorCode::Exists,
                        format!(
                            "the backup holds a {}-byte heap at tx {} (epoch {}); take it over (haheap_takeover, Heap::takeover), or start the backup with --allow-reset",
                            st.heap_size, st.last_tx, st.epoch
                        ),
                    ));
                }
                // On disk first: a failed write must leave the old replica in place.
                let mut fresh = ReplicaState {
                    epoch: st.epoch,
                    ..ReplicaState::default()
                };
                fresh.reset(h.heap_size);
                inner.store.reset(&fresh).map_err(internal)?;
                *st = fresh;
                tracing::info!(
                    "{}: new heap of {} bytes, epoch {}",
                    self.peer,
                    h.heap_size,
                    st.epoch
                );
            }
            HelloKind::Resume => {
                check_resume(st, &h)?;
                tracing::info!("{}: primary resumed at tx {}", self.peer, st.last_tx);
            }
        }
        let welcome = Message::Welcome {
            last_tx: inner.state.last_tx,
            epoch: inner.state.epoch,
            heap_size: inner.state.heap_size,
        };
        self.start_session(inner, h.mode);
        send(self.reader.get_mut(), &welcome);
        Ok(())
    }

    fn attach(&mut self, mode: Mode) -> Result<bool, Refusal> {
        let (image, last_tx, epoch) = {
            let inner = lock(self.shared);
            let mut inner = self.wait_no_current_session(inner)?;
            let inner = &mut *inner;
            let epoch = bump_epoch(inner, "take over")?;
            self.start_session(inner, mode);
            tracing::info!(
                "{}: takeover at tx {}, epoch {epoch}",
                self.peer,
                inner.state.last_tx
            );
            (inner.state.image.clone(), inner.state.last_tx, epoch)
        };
        let total = image.len() as u64;
        let mut buf = Vec::with_capacity(IMAGE_CHUNK + 64);
        let stream = self.reader.get_mut();
        for (i, chunk) in image.chunks(IMAGE_CHUNK).enumerate() {
            let msg = Message::Image {
                offset: (i * IMAGE_CHUNK) as u64,
                total,
                data: chunk.to_vec(),
            };
            wire::encode(&msg, &mut buf);
            if stream.write_all(&buf).is_err() {
                return Ok(false);
            }
        }
        Ok(send(
            stream,
            &Message::Welcome {
                last_tx,
                epoch,
                heap_size: total,
            },
        ))
    }

    fn promote(&mut self) -> Result<bool, Refusal> {
        let welcome = {
            let mut inner = lock(self.shared);
            let inner = &mut *inner;
            let epoch = bump_epoch(inner, "promote")?;
            tracing::info!("promoted to epoch {epoch} at tx {}", inner.state.last_tx);
            Message::Welcome {
                last_tx: inner.state.last_tx,
                epoch,
                heap_size: inner.state.heap_size,
            }
        };
        self.shared.session_ended.notify_all();
        Ok(send(self.reader.get_mut(), &welcome))
    }

    fn commit(&mut self, incoming: Incoming) -> Result<(), Refusal> {
        let mut inner = lock(self.shared);
        let inner = &mut *inner;
        let session_epoch = inner
            .session
            .as_ref()
            .filter(|s| Some(s.id) == self.session)
            .map(|s| s.epoch);
        if session_epoch != Some(inner.state.epoch) {
            return Err(Refusal(
                ErrorCode::Fenced,
                format!(
                    "this primary's session was fenced; the backup is at epoch {}",
                    inner.state.epoch
                ),
            ));
        }
        let c = match incoming {
            Incoming::Standard(c) => c,
            // The session's next transaction, in its (current) epoch.
            Incoming::Compact(cc) => {
                let (tx_id, epoch) = (inner.state.last_tx + 1, inner.state.epoch);
                cc.expand(tx_id, epoch).map_err(|e| {
                    Refusal(
                        ErrorCode::Malformed,
                        format!("a compact commit that is not tx {tx_id} of epoch {epoch} (damaged, replayed or out of order): {e}"),
                    )
                })?
            }
        };
        let tx_id = c.tx_id;
        if let CommitKind::Part { index } = c.kind {
            if index == 0 {
                // A new run of parts: whatever came before was given up by the primary.
                self.parts.clear();
                self.parts_bytes = 0;
            }
            let total = self.parts_bytes + c.payload.len() as u64;
            if total > u64::from(self.commit_cap) {
                return Err(Refusal(
                    ErrorCode::Malformed,
                    format!(
                        "the parts of tx {tx_id} exceed the commit cap of {} bytes",
                        self.commit_cap
                    ),
                ));
            }
            let new = inner
                .state
                .judge_part(&self.parts, &c)
                .map_err(|(code, why)| Refusal(code, why))?;
            if new {
                // Logged as it arrives, so the end has little left to write.
                inner.store.append_commit(&c).map_err(internal)?;
            }
            self.parts.push(c);
            self.parts_bytes = total;
            return Ok(());
        }
        // A whole commit after parts: the primary gave those up (the log drops them too).
        let parts = std::mem::take(&mut self.parts);
        self.parts_bytes = 0;
        let parts = match c.kind {
            CommitKind::End { .. } => parts,
            _ => Vec::new(),
        };
        match inner.state.judge_tx(&parts, &c) {
            // In the log (on disk once the barrier before the ack passed) it is committed
            // here: a restarted backup replays it. The image takes it under the same lock,
            // so nothing can see the log holding a transaction the image lacks: a promote
            // and a takeover that run before this connection acknowledges it hand the new
            // primary an image with it, and the ack the old primary then gets is true.
            Verdict::Apply => {
                inner.store.append_commit(&c).map_err(internal)?;
                inner.state.apply_tx(&parts, &c);
                inner.txs_applied += 1;
                inner.bytes_applied += parts
                    .iter()
                    .chain([&c])
                    .map(Commit::data_bytes)
                    .sum::<u64>();
                inner.last_commit = Some(Instant::now());
                self.applied = true;
            }
            Verdict::Duplicate => {
                tracing::info!("{}: tx {tx_id} resent, acknowledged again", self.peer)
            }
            Verdict::Refuse(code, why) => return Err(Refusal(code, why)),
        }
        let mut ack = Vec::new();
        wire::encode(&Message::Ack { tx_id }, &mut ack);
        self.pending_acks.extend_from_slice(&ack);
        Ok(())
    }

    /// With `send_acks`, makes the logged commits durable and acknowledges them, then
    /// checkpoints a long log. Returns false when the acknowledgements could not be made
    /// durable or sent.
    fn settle(&mut self, send_acks: bool) -> bool {
        if !send_acks || (self.pending_acks.is_empty() && !self.applied) {
            return true;
        }
        let mut guard = lock(self.shared);
        let inner = &mut *guard;
        let mut ok = true;
        if !self.pending_acks.is_empty() {
            ok = match inner.store.barrier() {
                Ok(()) => self.reader.get_mut().write_all(&self.pending_acks).is_ok(),
                Err(e) => {
                    tracing::error!("log barrier failed, acknowledgements withheld: {e}");
                    false
                }
            };
            self.pending_acks.clear();
        }
        if !std::mem::take(&mut self.applied) {
            return ok;
        }
        let limit = match self.shared.cfg.checkpoint_bytes {
            0 => inner.state.heap_size.max(64 << 20),
            n => n,
        };
        if inner.store.wal_bytes() > limit {
            // A failed checkpoint keeps the log, which still holds every commit.
            if let Err(e) = inner
                .store
                .barrier()
                .and_then(|()| inner.store.checkpoint(&inner.state))
            {
                tracing::error!("replica checkpoint failed, the log keeps growing: {e}");
            }
        }
        // Between transactions: the log's next pages get ready off the commit path.
        inner.store.idle();
        ok
    }
}

/// May a primary reconnect into this replica?
fn check_resume(st: &ReplicaState, h: &Hello) -> Result<(), Refusal> {
    if !st.is_initialized() {
        return Err(Refusal(
            ErrorCode::Empty,
            "the backup holds no heap to resume".into(),
        ));
    }
    if h.heap_size != st.heap_size {
        return Err(Refusal(
            ErrorCode::HeapMismatch,
            format!(
                "heap is {} bytes, the backup holds {}",
                h.heap_size, st.heap_size
            ),
        ));
    }
    if h.epoch != st.epoch {
        return Err(Refusal(
            ErrorCode::Fenced,
            format!(
                "epoch {} is stale, the backup is at epoch {}: this primary was fenced",
                h.epoch, st.epoch
            ),
        ));
    }
    Ok(())
}

/// Fences every earlier primary (takeover, promote): the new epoch is in the log before it
/// takes effect, so a restarted backup never forgets it.
fn bump_epoch(inner: &mut Inner, to: &str) -> Result<u64, Refusal> {
    if !inner.state.is_initialized() {
        return Err(Refusal(
            ErrorCode::Empty,
            format!("the backup holds no heap to {to}"),
        ));
    }
    let epoch = inner.state.epoch + 1;
    inner.store.append_epoch(epoch).map_err(internal)?;
    inner.state.epoch = epoch;
    Ok(epoch)
}

fn internal(e: StoreError) -> Refusal {
    tracing::error!("replica store: {e}");
    Refusal(ErrorCode::Internal, format!("backup storage failed: {e}"))
}

#[cfg(test)]
mod tests;
