//! The primary's side: ships each transaction's diff runs to the backup.
//!
//! Frames of unacknowledged transactions are kept until their `Ack` arrives. When the
//! link breaks, the client reconnects (`Hello` resume in its epoch), drops what the
//! backup's `Welcome` says it already holds, and resends the rest in order; the backup's
//! tx-id rule makes a resend idempotent. With [`OnFailure::Fail`] a broken link makes the
//! call fail with [`Error::BackupUnavailable`] at once and the next call tries one
//! reconnect; with [`OnFailure::Reconnect`] calls block while retrying.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Duration;

use std::path::PathBuf;
use std::time::Instant;

use rebound_token::{ClusterToken, TokenError};

use crate::auth::{self, AuthError};
use crate::diff::DiffRun;
use crate::endpoint::{Endpoint, EndpointError, PollingReader, Stream};
use crate::spin::{Spin, Spinner};
use crate::wire::{
    self, CommitKind, ErrorCode, FrameReader, Hello, HelloKind, Message, Mode, WireError, MAX_HEAP,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the backup is unavailable")]
    BackupUnavailable {
        endpoint: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("the backup fenced this primary: {0}")]
    Fenced(String),
    #[error("the backup refused ({code:?}): {message}")]
    Rejected { code: ErrorCode, message: String },
    #[error("the backup broke the protocol: {0}")]
    Protocol(String),
    #[error("a commit of {0} bytes exceeds the wire cap; split the transaction")]
    TooLarge(u64),
    #[error("tx id {got} is out of order: the next tx must be {want}")]
    TxOrder { got: u64, want: u64 },
    #[error("max_lag {0} exceeds the limit of {MAX_LAG}")]
    LagTooLarge(u32),
    #[error("the backup is at tx {backup} but tx {acked} was acknowledged: it lost acknowledged transactions")]
    Diverged { backup: u64, acked: u64 },
    #[error("a tcp backup needs its token: set {TOKEN_FILE_ENV} to the token file (or ClientOptions::token)")]
    NoToken,
    #[error("cannot read the backup's token")]
    Token(#[source] TokenError),
    #[error("token handshake with {endpoint} failed")]
    Auth {
        endpoint: String,
        #[source]
        source: AuthError,
    },
}

/// The environment variable naming the token file of a TCP backup, read when
/// [`ClientOptions::token`] is not set (haheap's primaries, C programs, tools).
pub const TOKEN_FILE_ENV: &str = "REBOUND_HA_TOKEN_FILE";

/// Largest `max_lag`: acknowledgements are read only when the lag is exceeded, and this
/// many of them (24 bytes each) must fit in a socket buffer, or both sides would block.
pub const MAX_LAG: u32 = 4096;

/// What a commit does when the backup is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Fail with [`Error::BackupUnavailable`]; the caller decides. The transaction stays
    /// queued and is sent on the next successful reconnect.
    Fail,
    /// Block, reconnecting up to `attempts` times `delay` apart, then resend and go on.
    Reconnect { attempts: u32, delay: Duration },
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub mode: Mode,
    pub on_failure: OnFailure,
    pub connect_timeout: Duration,
    /// How long a commit waits for an awaited acknowledgement before the backup counts
    /// as gone.
    pub ack_timeout: Duration,
    /// How to wait for an awaited acknowledgement: busy-polling saves the sleeping
    /// reader's wake-up on an idle machine and burns a CPU meanwhile (see [`Spin`]).
    pub spin: Spin,
    /// The token a TCP backup requires; `None`: read the file named by
    /// [`TOKEN_FILE_ENV`] when connecting over TCP.
    pub token: Option<ClusterToken>,
}

impl ClientOptions {
    pub fn new(mode: Mode) -> ClientOptions {
        ClientOptions {
            mode,
            on_failure: OnFailure::Fail,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            spin: Spin::PRIMARY,
            token: None,
        }
    }

    /// The token for a TCP connection: the one set, or the file [`TOKEN_FILE_ENV`] names.
    fn tcp_token(&self) -> Result<ClusterToken, Error> {
        if let Some(t) = &self.token {
            return Ok(t.clone());
        }
        let path = std::env::var_os(TOKEN_FILE_ENV).ok_or(Error::NoToken)?;
        ClusterToken::from_file(&PathBuf::from(path)).map_err(Error::Token)
    }
}

/// Counters of one client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub commits: u64,
    /// Frame bytes written, resends included.
    pub bytes_sent: u64,
    pub reconnects: u64,
    pub resent: u64,
}

struct Streaming {
    tx_id: u64,
    frames: Vec<u8>,
    parts: u32,
}

fn too_large(runs: &[DiffRun]) -> Error {
    Error::TooLarge(crate::diff::run_bytes(runs) + 12 * runs.len() as u64)
}

struct Conn {
    writer: Stream,
    reader: PollingReader,
}

/// A primary's link to its backup.
pub struct ReplicaClient {
    ep: Endpoint,
    opts: ClientOptions,
    heap_size: u64,
    epoch: u64,
    conn: Option<Conn>,
    last_acked: u64,
    next_tx: u64,
    unacked: VecDeque<(u64, Vec<u8>)>,
    /// The transaction being streamed by `send_part`: its frames so far.
    streaming: Option<Streaming>,
    spare: Vec<Vec<u8>>,
    stats: ClientStats,
    spinner: Spinner,
}

fn unavailable(ep: &Endpoint, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::BackupUnavailable {
        endpoint: ep.to_string(),
        source: Box::new(e),
    }
}

impl ReplicaClient {
    /// Starts replicating a fresh (zeroed) heap of `heap_size` bytes.
    pub fn connect(ep: &Endpoint, heap_size: u64, mode: Mode) -> Result<Self, Error> {
        Self::connect_with(ep, heap_size, ClientOptions::new(mode))
    }

    pub fn connect_with(ep: &Endpoint, heap_size: u64, opts: ClientOptions) -> Result<Self, Error> {
        let mode = opts.mode;
        let mut c = Self::unconnected(ep, heap_size, opts)?;
        let mut conn = c.open()?;
        let hello = Hello {
            kind: HelloKind::Fresh,
            mode,
            heap_size,
            epoch: 0,
        };
        c.send_msg(&mut conn, &Message::Hello(hello))?;
        let (last_tx, epoch) = c.read_welcome(&mut conn)?;
        if last_tx != 0 {
            return Err(Error::Protocol(format!(
                "fresh heap welcomed at tx {last_tx}"
            )));
        }
        c.epoch = epoch;
        c.conn = Some(conn);
        Ok(c)
    }

    /// Takes over the backup's replica: returns the client (continuing at the last tx + 1
    /// in a new epoch), the committed image and the last committed tx id.
    pub fn attach(ep: &Endpoint, mode: Mode) -> Result<(Self, Vec<u8>, u64), Error> {
        Self::attach_with(ep, ClientOptions::new(mode))
    }

    pub fn attach_with(ep: &Endpoint, opts: ClientOptions) -> Result<(Self, Vec<u8>, u64), Error> {
        let mode = opts.mode;
        let mut c = Self::unconnected(ep, 0, opts)?;
        let mut conn = c.open()?;
        c.send_msg(&mut conn, &Message::Attach { mode })?;
        let mut image: Option<Vec<u8>> = None;
        let (last_tx, epoch) = loop {
            match c.read_msg(&mut conn)? {
                Message::Image {
                    offset,
                    total,
                    data,
                } => {
                    if total == 0 || total > MAX_HEAP {
                        return Err(Error::Protocol(format!("image size {total} out of range")));
                    }
                    let img = image.get_or_insert_with(|| Vec::with_capacity(total as usize));
                    if offset != img.len() as u64 || offset + data.len() as u64 > total {
                        return Err(Error::Protocol(format!(
                            "image chunk at {offset} out of order"
                        )));
                    }
                    img.extend_from_slice(&data);
                }
                Message::Welcome {
                    last_tx,
                    epoch,
                    heap_size,
                } => {
                    let got = image.as_ref().map_or(0, |i| i.len() as u64);
                    if got != heap_size {
                        return Err(Error::Protocol(format!(
                            "image of {got} bytes for a {heap_size}-byte heap"
                        )));
                    }
                    break (last_tx, epoch);
                }
                m => {
                    return Err(Error::Protocol(format!(
                        "unexpected {} during attach",
                        m.kind()
                    )))
                }
            }
        };
        let image = image.unwrap_or_default();
        c.heap_size = image.len() as u64;
        c.epoch = epoch;
        c.last_acked = last_tx;
        c.next_tx = last_tx + 1;
        c.conn = Some(conn);
        Ok((c, image, last_tx))
    }

    fn unconnected(ep: &Endpoint, heap_size: u64, opts: ClientOptions) -> Result<Self, Error> {
        if let Mode::Async { max_lag } = opts.mode {
            if max_lag > MAX_LAG {
                return Err(Error::LagTooLarge(max_lag));
            }
        }
        Ok(ReplicaClient {
            spinner: Spinner::new(opts.spin),
            ep: ep.clone(),
            opts,
            heap_size,
            epoch: 0,
            conn: None,
            last_acked: 0,
            next_tx: 1,
            unacked: VecDeque::new(),
            streaming: None,
            spare: Vec::new(),
            stats: ClientStats::default(),
        })
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn heap_size(&self) -> u64 {
        self.heap_size
    }

    /// The newest transaction the backup acknowledged.
    pub fn last_acked(&self) -> u64 {
        self.last_acked
    }

    /// Transactions sent or queued but not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.unacked.len()
    }

    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// Ships transaction `tx_id` (the previous one + 1): the bytes of `runs` taken from
    /// `heap`. Returns the frame bytes shipped. Sync mode returns once acknowledged;
    /// async mode once at most `max_lag` transactions are unacknowledged.
    ///
    /// Calling again with the id of a transaction whose commit failed waits for that
    /// transaction instead (after a reconnect and resend).
    pub fn commit(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, Error> {
        let bytes = self.send(tx_id, runs, heap)?;
        self.wait()?;
        Ok(bytes)
    }

    /// The first half of [`commit`](Self::commit): queues and sends the transaction (or,
    /// for the id of a failed commit, gets it resent) without waiting for the backup.
    /// The caller can do its own work meanwhile, then [`wait`](Self::wait).
    pub fn send(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, Error> {
        let is_last = tx_id + 1 == self.next_tx;
        if is_last && tx_id > 0 && tx_id <= self.last_acked {
            return Ok(0); // a failed commit that a reconnect has since seen acknowledged
        }
        let retry = is_last && self.unacked.back().is_some_and(|(t, _)| *t == tx_id);
        let bytes = if retry {
            self.unacked.back().map_or(0, |(_, f)| f.len() as u64)
        } else {
            if tx_id != self.next_tx {
                return Err(Error::TxOrder {
                    got: tx_id,
                    want: self.next_tx,
                });
            }
            // The end of a streamed transaction joins its parts; anything else is whole.
            let (mut frame, kind) = match self.streaming.take() {
                Some(st) if st.tx_id == tx_id => (st.frames, CommitKind::End { parts: st.parts }),
                other => {
                    if let Some(st) = other {
                        self.spare.push(st.frames);
                    }
                    (self.empty_frame_buffer(), CommitKind::Whole)
                }
            };
            let start = frame.len();
            // A whole transaction goes compact: the backup knows its id and epoch.
            let n = match kind {
                CommitKind::Whole => {
                    wire::encode_compact_commit(tx_id, self.epoch, runs, heap, &mut frame)
                }
                _ => wire::encode_commit_frame(kind, tx_id, self.epoch, runs, heap, &mut frame),
            }
            .ok_or_else(|| too_large(runs))?;
            self.next_tx += 1;
            self.stats.commits += 1;
            self.unacked.push_back((tx_id, frame));
            if let Some(conn) = self.conn.as_mut() {
                // Earlier parts went out already (or, after a broken link, the reconnect
                // below resends the whole transaction).
                let frame = &self.unacked.back().expect("just pushed").1[start..];
                match conn.writer.write_all(frame) {
                    Ok(()) => self.stats.bytes_sent += n as u64,
                    Err(e) => self.link_failed(unavailable(&self.ep, e))?,
                }
            }
            n as u64
        };
        if self.conn.is_none() {
            // Sends the queued frames, this one included.
            self.reconnect_per_policy()?;
        }
        Ok(bytes)
    }

    /// Streams a part of transaction `tx_id` (the next one) to the backup before the rest
    /// is known, so the backup checks and logs it while the caller diffs on; the
    /// transaction is complete, and queued, only when [`send`](Self::send) ends it. Returns
    /// the frame bytes sent. A broken link is not reported here: `send` reconnects per
    /// policy and resends the whole transaction.
    pub fn send_part(&mut self, tx_id: u64, runs: &[DiffRun], heap: &[u8]) -> Result<u64, Error> {
        if tx_id != self.next_tx {
            return Err(Error::TxOrder {
                got: tx_id,
                want: self.next_tx,
            });
        }
        if self.streaming.as_ref().is_none_or(|st| st.tx_id != tx_id) {
            let frames = self.empty_frame_buffer();
            if let Some(old) = self.streaming.replace(Streaming {
                tx_id,
                frames,
                parts: 0,
            }) {
                self.spare.push(old.frames);
            }
        }
        let st = self.streaming.as_mut().expect("set just above");
        let start = st.frames.len();
        let kind = CommitKind::Part { index: st.parts };
        let n = wire::encode_commit_frame(kind, tx_id, self.epoch, runs, heap, &mut st.frames)
            .ok_or_else(|| too_large(runs))?;
        st.parts += 1;
        if let Some(conn) = self.conn.as_mut() {
            match conn.writer.write_all(&st.frames[start..]) {
                Ok(()) => self.stats.bytes_sent += n as u64,
                Err(e) => {
                    tracing::warn!("replication link lost while streaming tx {tx_id}: {e}");
                    if let Some(c) = self.conn.take() {
                        c.writer.shutdown();
                    }
                }
            }
        }
        Ok(n as u64)
    }

    /// A recycled (or new) frame buffer, emptied.
    fn empty_frame_buffer(&mut self) -> Vec<u8> {
        let mut f = self.spare.pop().unwrap_or_default();
        f.clear();
        f
    }

    /// The second half of [`commit`](Self::commit): sync mode returns once every sent
    /// transaction is acknowledged, async mode once at most `max_lag` are not.
    pub fn wait(&mut self) -> Result<(), Error> {
        let allowed = match self.opts.mode {
            Mode::Sync => 0,
            Mode::Async { max_lag } => max_lag as usize,
        };
        self.wait_until(|c| c.unacked.len() <= allowed)
    }

    /// Waits until every transaction sent so far is acknowledged.
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.conn.is_none() && !self.unacked.is_empty() {
            self.reconnect_per_policy()?;
        }
        self.wait_until(|c| c.unacked.is_empty())
    }

    /// Reconnects now (one attempt), resending unacknowledged transactions; returns the
    /// backup's last tx.
    pub fn reconnect(&mut self) -> Result<u64, Error> {
        self.conn = None;
        self.try_reconnect()
    }

    fn wait_until(&mut self, done: impl Fn(&Self) -> bool) -> Result<(), Error> {
        while !done(self) {
            let Some(conn) = self.conn.as_mut() else {
                self.reconnect_per_policy()?;
                continue;
            };
            let frames = FrameReader {
                stall_limit: self.opts.ack_timeout,
                idle_limit: Some(self.opts.ack_timeout),
                ..FrameReader::default()
            };
            let start = self.spinner.wait(&mut conn.reader);
            let read = frames.read(&mut conn.reader);
            self.spinner.waited(start);
            let res = match read {
                Ok(Message::Ack { tx_id }) => self.acked(tx_id),
                Ok(Message::Error { code, message }) => Err(refusal(code, message)),
                Ok(m) => Err(Error::Protocol(format!(
                    "unexpected {} instead of an ack",
                    m.kind()
                ))),
                Err(e) => Err(self.classify(e)),
            };
            match res {
                Ok(()) => {}
                Err(e @ Error::BackupUnavailable { .. }) => self.link_failed(e)?,
                Err(e) => {
                    // A refusing or misbehaving backup: this link is done.
                    if let Some(c) = self.conn.take() {
                        c.writer.shutdown();
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn acked(&mut self, tx_id: u64) -> Result<(), Error> {
        match self.unacked.front() {
            Some((t, _)) if *t == tx_id => {
                let (_, frame) = self.unacked.pop_front().expect("front exists");
                self.spare.push(frame);
                self.last_acked = tx_id;
                Ok(())
            }
            _ if tx_id <= self.last_acked => Ok(()),
            _ => Err(Error::Protocol(format!(
                "ack of tx {tx_id} that was not awaited"
            ))),
        }
    }

    /// The link broke: drop it; in reconnect mode get it back, else report `err`.
    fn link_failed(&mut self, err: Error) -> Result<(), Error> {
        if let Some(c) = self.conn.take() {
            c.writer.shutdown();
        }
        tracing::warn!("replication link lost: {err}");
        match self.opts.on_failure {
            OnFailure::Fail => Err(err),
            OnFailure::Reconnect { .. } => self.reconnect_per_policy().map(|_| ()),
        }
    }

    fn reconnect_per_policy(&mut self) -> Result<u64, Error> {
        let (attempts, delay) = match self.opts.on_failure {
            OnFailure::Fail => (1, Duration::ZERO),
            OnFailure::Reconnect { attempts, delay } => (attempts.max(1), delay),
        };
        let mut last = None;
        for i in 0..attempts {
            if i > 0 {
                std::thread::sleep(delay);
            }
            match self.try_reconnect() {
                Ok(t) => return Ok(t),
                Err(e @ Error::BackupUnavailable { .. }) => last = Some(e),
                Err(Error::Rejected {
                    code: ErrorCode::PrimaryActive,
                    message,
                }) => {
                    // The backup has not yet noticed our previous connection is gone.
                    last = Some(Error::Rejected {
                        code: ErrorCode::PrimaryActive,
                        message,
                    })
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn try_reconnect(&mut self) -> Result<u64, Error> {
        let mut conn = self.open()?;
        let hello = Hello {
            kind: HelloKind::Resume,
            mode: self.opts.mode,
            heap_size: self.heap_size,
            epoch: self.epoch,
        };
        self.send_msg(&mut conn, &Message::Hello(hello))?;
        let (last_tx, epoch) = self.read_welcome(&mut conn)?;
        if epoch != self.epoch {
            return Err(Error::Fenced(format!(
                "the backup is at epoch {epoch}, this primary at {}",
                self.epoch
            )));
        }
        if last_tx < self.last_acked {
            return Err(Error::Diverged {
                backup: last_tx,
                acked: self.last_acked,
            });
        }
        while self.unacked.front().is_some_and(|(t, _)| *t <= last_tx) {
            let (t, frame) = self.unacked.pop_front().expect("front exists");
            self.last_acked = t;
            self.spare.push(frame);
        }
        if self.unacked.front().is_some_and(|(t, _)| *t != last_tx + 1) {
            return Err(Error::Diverged {
                backup: last_tx,
                acked: self.last_acked,
            });
        }
        for (_, frame) in &self.unacked {
            conn.writer
                .write_all(frame)
                .map_err(|e| unavailable(&self.ep, e))?;
            self.stats.bytes_sent += frame.len() as u64;
            self.stats.resent += 1;
        }
        self.stats.reconnects += 1;
        tracing::info!(
            "reconnected to {} at tx {last_tx}, resent {}",
            self.ep,
            self.unacked.len()
        );
        self.conn = Some(conn);
        Ok(last_tx)
    }

    fn open(&self) -> Result<Conn, Error> {
        let map = |e: EndpointError| unavailable(&self.ep, e);
        let token = match self.ep {
            Endpoint::Tcp(_) => Some(self.opts.tcp_token()?),
            Endpoint::Unix(_) => None,
        };
        let deadline = Instant::now() + self.opts.connect_timeout;
        let mut writer = self.ep.connect(self.opts.connect_timeout).map_err(map)?;
        if let Some(token) = token {
            auth::client(&mut writer, &token, deadline).map_err(|e| match e {
                // A backup that went away mid-handshake is unavailable, as on connect.
                AuthError::Io(_) | AuthError::Deadline => unavailable(&self.ep, e),
                source => Error::Auth {
                    endpoint: self.ep.to_string(),
                    source,
                },
            })?;
        }
        let io = |e: std::io::Error| unavailable(&self.ep, e);
        writer
            .set_read_timeout(Some(self.opts.ack_timeout))
            .map_err(io)?;
        writer
            .set_write_timeout(Some(self.opts.ack_timeout))
            .map_err(io)?;
        let reader = PollingReader::with_capacity(64 << 10, writer.try_clone().map_err(io)?);
        Ok(Conn { writer, reader })
    }

    fn send_msg(&self, conn: &mut Conn, msg: &Message) -> Result<(), Error> {
        let mut buf = Vec::new();
        wire::encode(msg, &mut buf);
        conn.writer
            .write_all(&buf)
            .map_err(|e| unavailable(&self.ep, e))
    }

    fn read_msg(&self, conn: &mut Conn) -> Result<Message, Error> {
        let frames = FrameReader {
            stall_limit: self.opts.ack_timeout,
            idle_limit: Some(self.opts.ack_timeout),
            ..FrameReader::default()
        };
        match frames.read(&mut conn.reader) {
            Ok(Message::Error { code, message }) => Err(refusal(code, message)),
            Ok(m) => Ok(m),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// A broken link means the backup is unavailable; damaged frames are its fault.
    fn classify(&self, e: WireError) -> Error {
        match e {
            WireError::Io(_)
            | WireError::Closed
            | WireError::Truncated { .. }
            | WireError::IdleTimeout(_)
            | WireError::Stalled(_) => unavailable(&self.ep, e),
            e => Error::Protocol(e.to_string()),
        }
    }

    fn read_welcome(&self, conn: &mut Conn) -> Result<(u64, u64), Error> {
        match self.read_msg(conn)? {
            Message::Welcome {
                last_tx,
                epoch,
                heap_size,
            } if heap_size == self.heap_size => Ok((last_tx, epoch)),
            Message::Welcome { heap_size, .. } => Err(Error::Protocol(format!(
                "welcomed with a {heap_size}-byte heap, expected {}",
                self.heap_size
            ))),
            m => Err(Error::Protocol(format!(
                "expected Welcome, got {}",
                m.kind()
            ))),
        }
    }
}

fn refusal(code: ErrorCode, message: String) -> Error {
    match code {
        ErrorCode::Fenced => Error::Fenced(message),
        code => Error::Rejected { code, message },
    }
}

/// Asks a running backup for its state.
pub fn query_status(ep: &Endpoint, timeout: Duration) -> Result<crate::wire::StatusInfo, Error> {
    query_status_with(ep, admin_options(timeout))
}

/// [`query_status`] with options: `connect_timeout` and `ack_timeout` bound the request,
/// `token` is the TCP backup's token.
pub fn query_status_with(
    ep: &Endpoint,
    opts: ClientOptions,
) -> Result<crate::wire::StatusInfo, Error> {
    match admin_request(ep, opts, &Message::Status)? {
        Message::StatusReply(s) => Ok(s),
        m => Err(Error::Protocol(format!(
            "expected StatusReply, got {}",
            m.kind()
        ))),
    }
}

/// Promotes a running backup: bumps its epoch so the current primary is fenced and a new
/// primary may attach. Returns (new epoch, last tx).
pub fn promote(ep: &Endpoint, timeout: Duration) -> Result<(u64, u64), Error> {
    promote_with(ep, admin_options(timeout))
}

/// [`promote`] with options, as [`query_status_with`].
pub fn promote_with(ep: &Endpoint, opts: ClientOptions) -> Result<(u64, u64), Error> {
    match admin_request(ep, opts, &Message::Promote)? {
        Message::Welcome { last_tx, epoch, .. } => Ok((epoch, last_tx)),
        m => Err(Error::Protocol(format!(
            "expected Welcome, got {}",
            m.kind()
        ))),
    }
}

/// Options of an operator's request that must finish within `timeout`.
pub fn admin_options(timeout: Duration) -> ClientOptions {
    let mut opts = ClientOptions::new(Mode::Sync);
    opts.connect_timeout = timeout;
    opts.ack_timeout = timeout;
    opts
}

fn admin_request(ep: &Endpoint, opts: ClientOptions, msg: &Message) -> Result<Message, Error> {
    let c = ReplicaClient::unconnected(ep, 0, opts)?;
    let mut conn = c.open()?;
    c.send_msg(&mut conn, msg)?;
    c.read_msg(&mut conn)
}
