//! The replication wire protocol between a primary and its backup.
//!
//! # Frames
//! Every message is one frame: a 12-byte header followed by a payload, except a whole
//! transaction's commit, which travels in a compact frame (see [`compact`]: its first
//! byte is [`COMPACT_MARK`] instead of the magic). All integers are little-endian.
//! (Version 1 had a 16-byte header with a 4-byte magic and 2-byte version and type;
//! version 2 packed it into 12; version 3 adds compact commits: the smallest commits are
//! mostly framing.)
//!
//! | bytes | field   | meaning                                                   |
//! |-------|---------|-----------------------------------------------------------|
//! | 0..2  | magic   | `RH`                                                      |
//! | 2     | version | [`VERSION`] (3); any other version is refused             |
//! | 3     | type    | [`FrameType`]                                             |
//! | 4..8  | length  | payload bytes; checked against the type's cap *before* reading |
//! | 8..12 | crc32   | CRC-32 (IEEE) of header bytes 0..8 followed by the payload |
//!
//! # Messages (payload layouts)
//! - `Hello` (primary → backup, 24 bytes): `kind u8` (0 fresh heap, 1 resume after a
//!   reconnect), `mode u8` (0 sync, 1 async), `pad u16`, `max_lag u32`, `heap_size u64`,
//!   `epoch u64` (the primary's epoch; ignored for fresh).
//! - `Welcome` (backup → primary, 24 bytes): `last_tx u64`, `epoch u64`, `heap_size u64`.
//!   Answers `Hello`, ends an `Attach` image and answers `Promote`.
//! - `Attach` (new primary → backup, 8 bytes: `mode u8`, `pad [u8; 3]`, `max_lag u32`):
//!   takeover; the backup bumps the epoch, sends the committed image as `Image` frames and
//!   then a `Welcome` with the last tx id and the new epoch.
//! - `Image` (16 + up to [`IMAGE_CHUNK`] bytes): `offset u64`, `total u64`, then bytes.
//!   Chunks arrive in order and cover `0..total`.
//! - Compact commit (primary → backup): a whole transaction; see [`compact`]. The backup
//!   expands it into the `Commit` below, with the session's next tx id and its epoch.
//! - `Commit` (primary → backup): three LEB128 varints `tx_id`, `epoch`, `run_count`
//!   (at most u32), then per run two varints, `gap` (the run's offset minus the previous
//!   run's end, zigzag-encoded so any order works; the first run counts from 0) and `len`
//!   (1..=u32::MAX), then `len` bytes. Varints keep a run header at 2–4 bytes instead of
//!   12 and the commit header at about 5 instead of 20: diffs of small writes are mostly
//!   headers. The backup applies a commit atomically iff `epoch` is current and `tx_id` is
//!   its last tx + 1. A resend of an already applied tx (same bytes) is acknowledged again
//!   without being applied; anything else out of order is refused.
//! - `CommitPart` (primary → backup): `index` varint (0, 1, …) then a `Commit` payload.
//!   A transaction with a large diff is streamed: its parts go out while the primary is
//!   still diffing, so the backup checks (epoch, order, bounds) and logs them meanwhile.
//!   Part 0 starts a transaction afresh (earlier parts were given up by the primary, as
//!   are parts followed by a whole `Commit`); a part out of sequence is refused.
//! - `CommitEnd` (primary → backup): `parts` varint (how many parts precede it) then a
//!   `Commit` payload; the transaction (parts, then these runs) is applied atomically and
//!   acknowledged like a `Commit`. The parts and the end together count against the commit cap.
//! - `Ack` (8 bytes): `tx_id u64`, the tx is in the backup's log (on disk when the backup
//!   is durable) and is applied to its image before the next frame is judged.
//! - `Status` (empty) → `StatusReply` (see [`StatusInfo::encode`]).
//! - `Promote` (empty): the backup bumps its epoch, fencing the current primary: its next
//!   commit is refused, and a new primary may attach. Answered by `Welcome`.
//! - `Error` (4 + up to [`MAX_ERROR_MESSAGE`] bytes): `code u16`, `len u16`, UTF-8 message.
//!   The sender closes the connection after it.
//!
//! # Conversations
//! - Primary: `Hello` → `Welcome`, then transactions (a compact commit or a `Commit`, or `CommitPart`s and a
//!   `CommitEnd`), each answered by an `Ack` in order
//!   (acks may be batched: the backup sends them once no further frame is buffered).
//!   A fresh `Hello` is refused (`Exists`) when the backup holds transactions, unless it
//!   runs with `--allow-reset`; a resume `Hello` needs the backup's current epoch and heap
//!   size. At most one primary session is current; a second one waits up to 2 s for the
//!   first to end and is then refused (`PrimaryActive`) unless a promote fenced it.
//! - New primary: `Attach` → `Image`… → `Welcome`, then as a primary.
//! - Operator: any number of `Status` → `StatusReply`, or `Promote` → `Welcome`.
//! - Any refusal: `Error`, then the backup closes the connection. A frame that stalls
//!   midway longer than the backup's frame timeout is dropped without a reply.
//!
//! Error codes: 1 malformed frame, 2 fenced (stale epoch), 3 out-of-order tx, 4 replayed
//! tx (an applied id with other bytes, or older than the remembered window), 5 another
//! primary is current, 6 heap size mismatch, 7 no heap yet, 8 backup storage failure,
//! 9 run outside the heap, 10 unexpected message, 11 fresh heap over an existing replica.
//! A part-sequence error (a part out of order, an end that counts wrong) is 3.
//!
//! # Caps
//! Every length is capped: frame payloads per type (a commit at most
//! [`MAX_COMMIT_PAYLOAD`]), heap sizes at [`MAX_HEAP`], messages at [`MAX_ERROR_MESSAGE`].
//! The backup caps commits tighter per connection: 64 KiB before a session exists, then
//! 4x the session's heap size plus 64 KiB. A frame whose header announces more than its
//! cap is refused before any allocation; payload buffers grow only as bytes arrive.

use std::io::{self, Read};
use std::time::{Duration, Instant};

mod commit;
pub mod compact;

pub use commit::{encode_commit, encode_commit_frame, Commit, CommitKind, Runs};
pub use compact::{encode_compact_commit, CompactCommit, COMPACT_MARK};

pub const MAGIC: [u8; 2] = *b"RH";
pub const VERSION: u8 = 3;
pub const HEADER_LEN: usize = 12;
/// Header field offsets (for tests that damage frames on purpose).
pub const VERSION_AT: usize = 2;
pub const TYPE_AT: usize = 3;
pub const LEN_AT: usize = 4;
pub const CRC_AT: usize = 8;
/// Largest heap a backup will hold.
pub const MAX_HEAP: u64 = 64 << 30;
/// Largest commit payload; a transaction that changed more must be split by the caller.
pub const MAX_COMMIT_PAYLOAD: u32 = 256 << 20;
/// Image bytes per `Image` frame.
pub const IMAGE_CHUNK: usize = 1 << 20;
pub const MAX_ERROR_MESSAGE: usize = 1024;
const MAX_PEER_NAME: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("I/O error on the replication link")]
    Io(#[from] io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("the connection ended inside a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("bad frame magic {0:02x?}: not a rebound-ha peer")]
    BadMagic([u8; 2]),
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    BadVersion(u8),
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("{ty:?} frame of {len} bytes exceeds its cap of {cap}")]
    Oversized { ty: FrameType, len: u32, cap: u32 },
    #[error("frame checksum mismatch (header says {expected:08x}, bytes give {actual:08x})")]
    BadCrc { expected: u32, actual: u32 },
    #[error("malformed {ty:?} frame: {why}")]
    Malformed { ty: FrameType, why: String },
    #[error("the peer stalled inside a frame for over {0:?}")]
    Stalled(Duration),
    #[error("no frame arrived within {0:?}")]
    IdleTimeout(Duration),
}

/// Frame types; the numbers are part of the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    Hello = 1,
    Welcome = 2,
    Attach = 3,
    Image = 4,
    Commit = 5,
    Ack = 6,
    Status = 7,
    StatusReply = 8,
    Promote = 9,
    Error = 10,
    CommitPart = 11,
    CommitEnd = 12,
}

impl FrameType {
    fn from_u8(v: u8) -> Option<Self> {
        use FrameType::*;
        Some(match v {
            1 => Hello,
            2 => Welcome,
            3 => Attach,
            4 => Image,
            5 => Commit,
            6 => Ack,
            7 => Status,
            8 => StatusReply,
            9 => Promote,
            10 => Error,
            11 => CommitPart,
            12 => CommitEnd,
            _ => return None,
        })
    }

    /// Largest payload a frame of this type may carry.
    pub fn cap(self) -> u32 {
        use FrameType::*;
        match self {
            Hello | Welcome => 24,
            Status | Promote => 0,
            Attach | Ack => 8,
            Image => (16 + IMAGE_CHUNK) as u32,
            Commit | CommitPart | CommitEnd => MAX_COMMIT_PAYLOAD,
            StatusReply => 80 + MAX_PEER_NAME as u32,
            Error => (4 + MAX_ERROR_MESSAGE) as u32,
        }
    }
}

/// Replication mode, as the primary announces it (and as [`crate::ReplicaClient`] runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Mode {
    /// `commit` returns after the backup acknowledged the transaction.
    Sync,
    /// `commit` returns at once unless more than `max_lag` transactions are unacknowledged.
    Async { max_lag: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloKind {
    /// A new heap: the backup starts an empty replica of `heap_size` bytes.
    Fresh = 0,
    /// A primary reconnecting after a broken link, still in `epoch`.
    Resume = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub kind: HelloKind,
    pub mode: Mode,
    pub heap_size: u64,
    pub epoch: u64,
}

/// Error codes carried by `Error` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[repr(u16)]
pub enum ErrorCode {
    Malformed = 1,
    Fenced = 2,
    OutOfOrder = 3,
    Replayed = 4,
    PrimaryActive = 5,
    HeapMismatch = 6,
    Empty = 7,
    Internal = 8,
    OutOfBounds = 9,
    Unexpected = 10,
    Exists = 11,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Self {
        use ErrorCode::*;
        match v {
            1 => Malformed,
            2 => Fenced,
            3 => OutOfOrder,
            4 => Replayed,
            5 => PrimaryActive,
            6 => HeapMismatch,
            7 => Empty,
            9 => OutOfBounds,
            10 => Unexpected,
            11 => Exists,
            _ => Internal,
        }
    }
}

/// A backup's state as `Status` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StatusInfo {
    pub last_tx: u64,
    pub epoch: u64,
    pub heap_size: u64,
    /// Transactions applied since the backup started.
    pub txs_applied: u64,
    /// Diff bytes applied since the backup started.
    pub bytes_applied: u64,
    /// Bytes in the write-ahead log since the last checkpoint.
    pub wal_bytes: u64,
    pub durable: bool,
    /// Milliseconds since the last applied commit (the replica's staleness), if any.
    pub ms_since_commit: Option<u64>,
    pub primary: Option<PrimaryInfo>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PrimaryInfo {
    pub peer: String,
    pub epoch: u64,
    pub mode: Mode,
    /// False once a promote fenced this primary.
    pub current: bool,
}

/// A decoded message. `Commit` keeps its raw payload: the backup logs it as is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Welcome {
        last_tx: u64,
        epoch: u64,
        heap_size: u64,
    },
    Attach {
        mode: Mode,
    },
    Image {
        offset: u64,
        total: u64,
        data: Vec<u8>,
    },
    Commit(Commit),
    /// A whole transaction in a compact frame; [`CompactCommit::expand`] makes it a
    /// `Commit` once the reader knows which transaction it must be.
    Compact(CompactCommit),
    Ack {
        tx_id: u64,
    },
    Status,
    StatusReply(StatusInfo),
    Promote,
    Error {
        code: ErrorCode,
        message: String,
    },
}

impl Message {
    /// The message's name, for errors (never its bytes).
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Welcome { .. } => "Welcome",
            Message::Attach { .. } => "Attach",
            Message::Image { .. } => "Image",
            Message::Commit(_) => "Commit",
            Message::Compact(_) => "compact Commit",
            Message::Ack { .. } => "Ack",
            Message::Status => "Status",
            Message::StatusReply(_) => "StatusReply",
            Message::Promote => "Promote",
            Message::Error { .. } => "Error",
        }
    }
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

pub(crate) fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes(b[..2].try_into().expect("2 bytes"))
}

/// Starts a frame in `buf` (cleared); finish it with [`finish_frame`].
/// Appends a frame header (length and checksum still zero) to `buf`.
pub(crate) fn begin_frame(buf: &mut Vec<u8>, ty: FrameType) {
    buf.extend_from_slice(&MAGIC);
    buf.extend_from_slice(&[VERSION, ty as u8]);
    buf.extend_from_slice(&[0u8; 8]);
}

/// Fills in the length and checksum of the frame built in `buf`.
pub(crate) fn finish_frame(buf: &mut [u8]) {
    let len = (buf.len() - HEADER_LEN) as u32;
    buf[LEN_AT..LEN_AT + 4].copy_from_slice(&len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&buf[..CRC_AT]);
    h.update(&buf[HEADER_LEN..]);
    let crc = h.finalize();
    buf[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Encodes `msg` as one frame into `buf` (cleared first).
pub fn encode(msg: &Message, buf: &mut Vec<u8>) {
    buf.clear();
    match msg {
        Message::Hello(h) => {
            begin_frame(buf, FrameType::Hello);
            let (mode, lag) = encode_mode(h.mode);
            buf.extend_from_slice(&[h.kind as u8, mode, 0, 0]);
            buf.extend_from_slice(&lag.to_le_bytes());
            buf.extend_from_slice(&h.heap_size.to_le_bytes());
            buf.extend_from_slice(&h.epoch.to_le_bytes());
        }
        Message::Welcome {
            last_tx,
            epoch,
            heap_size,
        } => {
            begin_frame(buf, FrameType::Welcome);
            for v in [last_tx, epoch, heap_size] {
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        Message::Attach { mode } => {
            begin_frame(buf, FrameType::Attach);
            let (m, lag) = encode_mode(*mode);
            buf.extend_from_slice(&[m, 0, 0, 0]);
            buf.extend_from_slice(&lag.to_le_bytes());
        }
        Message::Image {
            offset,
            total,
            data,
        } => {
            begin_frame(buf, FrameType::Image);
            buf.extend_from_slice(&offset.to_le_bytes());
            buf.extend_from_slice(&total.to_le_bytes());
            buf.extend_from_slice(data);
        }
        Message::Commit(c) => {
            begin_frame(buf, c.kind.frame_type());
            buf.extend_from_slice(&c.payload);
        }
        Message::Compact(c) => {
            // Its own framing, made when it was encoded.
            c.encode(buf);
            return;
        }
        Message::Ack { tx_id } => {
            begin_frame(buf, FrameType::Ack);
            buf.extend_from_slice(&tx_id.to_le_bytes());
        }
        Message::Status => begin_frame(buf, FrameType::Status),
        Message::StatusReply(s) => {
            begin_frame(buf, FrameType::StatusReply);
            s.encode(buf);
        }
        Message::Promote => begin_frame(buf, FrameType::Promote),
        Message::Error { code, message } => {
            begin_frame(buf, FrameType::Error);
            let msg = truncate_utf8(message, MAX_ERROR_MESSAGE);
            buf.extend_from_slice(&(*code as u16).to_le_bytes());
            buf.extend_from_slice(&(msg.len() as u16).to_le_bytes());
            buf.extend_from_slice(msg.as_bytes());
        }
    }
    finish_frame(buf);
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl StatusInfo {
    /// Layout: `last_tx, epoch, heap_size, txs_applied, bytes_applied, wal_bytes,
    /// ms_since_commit (u64::MAX = none)` as u64, `flags u8` (bit 0 durable, bit 1 primary
    /// connected, bit 2 primary current), `primary_mode u8`, `pad u16`, `max_lag u32`,
    /// `primary_epoch u64`, `peer_len u16`, peer name bytes.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let since = self.ms_since_commit.unwrap_or(u64::MAX);
        for v in [
            self.last_tx,
            self.epoch,
            self.heap_size,
            self.txs_applied,
            self.bytes_applied,
            self.wal_bytes,
            since,
        ] {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        let mut flags = u8::from(self.durable);
        let (mut mode, mut lag, mut pepoch, mut peer) = (0u8, 0u32, 0u64, "");
        if let Some(p) = &self.primary {
            flags |= 2 | if p.current { 4 } else { 0 };
            (mode, lag) = encode_mode(p.mode);
            pepoch = p.epoch;
            peer = truncate_utf8(&p.peer, MAX_PEER_NAME);
        }
        buf.extend_from_slice(&[flags, mode, 0, 0]);
        buf.extend_from_slice(&lag.to_le_bytes());
        buf.extend_from_slice(&pepoch.to_le_bytes());
        buf.extend_from_slice(&(peer.len() as u16).to_le_bytes());
        buf.extend_from_slice(peer.as_bytes());
    }

    fn decode(p: &[u8]) -> Result<StatusInfo, String> {
        if p.len() < 74 {
            return Err(format!("{} bytes, needs at least 74", p.len()));
        }
        let u = |i: usize| le_u64(&p[i * 8..]);
        let (flags, mode, lag) = (p[56], p[57], le_u32(&p[60..]));
        let pepoch = le_u64(&p[64..]);
        let peer_len = le_u16(&p[72..]) as usize;
        if p.len() != 74 + peer_len || peer_len > MAX_PEER_NAME {
            return Err(format!(
                "peer name length {peer_len} does not match the frame"
            ));
        }
        let peer = String::from_utf8(p[74..].to_vec()).map_err(|_| "peer name is not UTF-8")?;
        let primary = (flags & 2 != 0).then(|| PrimaryInfo {
            peer,
            epoch: pepoch,
            mode: decode_mode(mode, lag).unwrap_or(Mode::Sync),
            current: flags & 4 != 0,
        });
        Ok(StatusInfo {
            last_tx: u(0),
            epoch: u(1),
            heap_size: u(2),
            txs_applied: u(3),
            bytes_applied: u(4),
            wal_bytes: u(5),
            ms_since_commit: (u(6) != u64::MAX).then(|| u(6)),
            durable: flags & 1 != 0,
            primary,
        })
    }
}

fn encode_mode(mode: Mode) -> (u8, u32) {
    match mode {
        Mode::Sync => (0, 0),
        Mode::Async { max_lag } => (1, max_lag),
    }
}

fn decode_mode(mode: u8, max_lag: u32) -> Option<Mode> {
    match mode {
        0 => Some(Mode::Sync),
        1 => Some(Mode::Async { max_lag }),
        _ => None,
    }
}

/// Decodes a frame's payload into a message.
pub fn decode(ty: FrameType, payload: Vec<u8>) -> Result<Message, WireError> {
    let bad = |why: String| WireError::Malformed { ty, why };
    let exact = |n: usize| {
        if payload.len() == n {
            Ok(())
        } else {
            Err(bad(format!("{} bytes, expected {n}", payload.len())))
        }
    };
    Ok(match ty {
        FrameType::Hello => {
            exact(24)?;
            let kind = match payload[0] {
                0 => HelloKind::Fresh,
                1 => HelloKind::Resume,
                k => return Err(bad(format!("unknown kind {k}"))),
            };
            let mode = decode_mode(payload[1], le_u32(&payload[4..]))
                .ok_or_else(|| bad(format!("unknown mode {}", payload[1])))?;
            let heap_size = le_u64(&payload[8..]);
            if heap_size == 0 || heap_size > MAX_HEAP {
                return Err(bad(format!("heap size {heap_size} outside 1..={MAX_HEAP}")));
            }
            Message::Hello(Hello {
                kind,
                mode,
                heap_size,
                epoch: le_u64(&payload[16..]),
            })
        }
        FrameType::Welcome => {
            exact(24)?;
            Message::Welcome {
                last_tx: le_u64(&payload[0..]),
                epoch: le_u64(&payload[8..]),
                heap_size: le_u64(&payload[16..]),
            }
        }
        FrameType::Attach => {
            exact(8)?;
            let mode = decode_mode(payload[0], le_u32(&payload[4..]))
                .ok_or_else(|| bad(format!("unknown mode {}", payload[0])))?;
            Message::Attach { mode }
        }
        FrameType::Status => Message::Status,
        FrameType::Promote => Message::Promote,
        FrameType::Image => {
            if payload.len() < 16 {
                return Err(bad(format!("{} bytes, header needs 16", payload.len())));
            }
            let offset = le_u64(&payload[0..]);
            let total = le_u64(&payload[8..]);
            Message::Image {
                offset,
                total,
                data: payload[16..].to_vec(),
            }
        }
        FrameType::Commit | FrameType::CommitPart | FrameType::CommitEnd => {
            Message::Commit(Commit::parse_as(ty, payload)?)
        }
        FrameType::Ack => {
            exact(8)?;
            Message::Ack {
                tx_id: le_u64(&payload),
            }
        }
        FrameType::StatusReply => Message::StatusReply(StatusInfo::decode(&payload).map_err(bad)?),
        FrameType::Error => {
            if payload.len() < 4 {
                return Err(bad(format!("{} bytes, header needs 4", payload.len())));
            }
            let code = ErrorCode::from_u16(le_u16(&payload[0..]));
            let n = le_u16(&payload[2..]) as usize;
            if payload.len() != 4 + n {
                return Err(bad(format!("message length {n} does not match the frame")));
            }
            let message = String::from_utf8_lossy(&payload[4..]).into_owned();
            Message::Error { code, message }
        }
    })
}

/// Reads frames from a stream, tolerating socket read timeouts between frames.
///
/// Sockets are given a short read timeout so a reader can notice a stall: a peer that
/// stops inside a frame for longer than `stall_limit` is dropped; between frames the
/// reader waits up to `idle_limit` (forever when `None`).
#[derive(Debug, Clone, Copy)]
pub struct FrameReader {
    pub stall_limit: Duration,
    pub idle_limit: Option<Duration>,
    /// A tighter cap for `Commit` payloads than [`MAX_COMMIT_PAYLOAD`] (the backup sets it
    /// from the session's heap size).
    pub commit_cap: u32,
}

impl Default for FrameReader {
    fn default() -> Self {
        FrameReader {
            stall_limit: Duration::from_secs(30),
            idle_limit: None,
            commit_cap: MAX_COMMIT_PAYLOAD,
        }
    }
}

impl FrameReader {
    /// Reads one frame and decodes it.
    pub fn read<R: Read>(&self, r: &mut R) -> Result<Message, WireError> {
        let first = self.first_byte(r)?;
        if first == COMPACT_MARK {
            return self.read_compact(r).map(Message::Compact);
        }
        let (ty, payload) = self.read_standard(r, first)?;
        decode(ty, payload)
    }

    /// Reads one standard frame, checking magic, version, type, cap and checksum (a
    /// compact frame is refused here).
    pub fn read_raw<R: Read>(&self, r: &mut R) -> Result<(FrameType, Vec<u8>), WireError> {
        let first = self.first_byte(r)?;
        self.read_standard(r, first)
    }

    /// Waits for a frame's first byte (between frames: the idle limit applies).
    fn first_byte<R: Read>(&self, r: &mut R) -> Result<u8, WireError> {
        let mut first = [0u8; 1];
        self.fill(r, &mut first, 0, 1)?;
        Ok(first[0])
    }

    /// Reads the rest of a standard frame whose first byte was `first`.
    fn read_standard<R: Read>(
        &self,
        r: &mut R,
        first: u8,
    ) -> Result<(FrameType, Vec<u8>), WireError> {
        let mut hdr = [0u8; HEADER_LEN];
        hdr[0] = first;
        self.fill(r, &mut hdr[1..], 1, HEADER_LEN)?;
        let magic = [hdr[0], hdr[1]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let version = hdr[VERSION_AT];
        if version != VERSION {
            return Err(WireError::BadVersion(version));
        }
        let raw_ty = hdr[TYPE_AT];
        let ty = FrameType::from_u8(raw_ty).ok_or(WireError::UnknownType(raw_ty))?;
        let len = le_u32(&hdr[LEN_AT..]);
        let cap = match ty {
            FrameType::Commit | FrameType::CommitPart | FrameType::CommitEnd => {
                ty.cap().min(self.commit_cap)
            }
            _ => ty.cap(),
        };
        if len > cap {
            return Err(WireError::Oversized { ty, len, cap });
        }
        let want = HEADER_LEN + len as usize;
        let payload = self.read_payload(r, len as usize, HEADER_LEN, want)?;
        let mut h = crc32fast::Hasher::new();
        h.update(&hdr[..CRC_AT]);
        h.update(&payload);
        let actual = h.finalize();
        let expected = le_u32(&hdr[CRC_AT..]);
        if actual != expected {
            return Err(WireError::BadCrc { expected, actual });
        }
        Ok((ty, payload))
    }

    /// Reads a payload of `len` bytes that starts `before` bytes into a frame of `want`.
    /// Grows by at most 1 MiB ahead of the bytes that arrived, so a lying header cannot
    /// make us allocate; reads straight into the payload (no bounce buffer to zero).
    fn read_payload<R: Read>(
        &self,
        r: &mut R,
        len: usize,
        before: usize,
        want: usize,
    ) -> Result<Vec<u8>, WireError> {
        const STEP: usize = 1 << 20;
        let mut payload = Vec::with_capacity(len.min(STEP));
        while payload.len() < len {
            let start = payload.len();
            payload.resize(start + (len - start).min(STEP), 0);
            self.fill(r, &mut payload[start..], before + start, want)?;
        }
        Ok(payload)
    }

    /// Fills `buf` completely; it starts `already` bytes into a frame of `want` bytes.
    /// Once bytes of the frame were read, EOF is a truncation and waiting counts against
    /// the stall limit; before, EOF is a close and waiting against the idle limit.
    pub(super) fn fill<R: Read>(
        &self,
        r: &mut R,
        buf: &mut [u8],
        already: usize,
        want: usize,
    ) -> Result<(), WireError> {
        let mut got = 0;
        let started = Instant::now();
        while got < buf.len() {
            match r.read(&mut buf[got..]) {
                Ok(0) if already + got == 0 => return Err(WireError::Closed),
                Ok(0) => {
                    return Err(WireError::Truncated {
                        got: already + got,
                        want,
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    let waited = started.elapsed();
                    if already + got > 0 {
                        if waited > self.stall_limit {
                            return Err(WireError::Stalled(self.stall_limit));
                        }
                    } else if let Some(limit) = self.idle_limit {
                        if waited > limit {
                            return Err(WireError::IdleTimeout(limit));
                        }
                    }
                }
                Err(e) => return Err(WireError::Io(e)),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::DiffRun;

    fn roundtrip(msg: Message) {
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        let got = FrameReader::default().read(&mut &buf[..]).unwrap();
        assert_eq!(got, msg);
    }

    #[test]
    fn the_module_doc_names_the_version_spoken() {
        let doc = format!("[`VERSION`] ({VERSION}); any other version is refused");
        assert!(
            include_str!("mod.rs").contains(&doc),
            "update the header table"
        );
    }

    #[test]
    fn every_message_roundtrips() {
        roundtrip(Message::Hello(Hello {
            kind: HelloKind::Resume,
            mode: Mode::Async { max_lag: 7 },
            heap_size: 1 << 20,
            epoch: 3,
        }));
        roundtrip(Message::Welcome {
            last_tx: 9,
            epoch: 2,
            heap_size: 4096,
        });
        roundtrip(Message::Attach {
            mode: Mode::Async { max_lag: 3 },
        });
        roundtrip(Message::Image {
            offset: 4096,
            total: 8192,
            data: vec![5; 100],
        });
        let heap: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let runs = [
            DiffRun { offset: 10, len: 5 },
            DiffRun {
                offset: 5000,
                len: 20,
            },
        ];
        let mut buf = Vec::new();
        encode_commit(7, 2, &runs, &heap, &mut buf).unwrap();
        let Message::Commit(c) = FrameReader::default().read(&mut &buf[..]).unwrap() else {
            panic!("not a commit")
        };
        assert_eq!((c.tx_id, c.epoch, c.run_count), (7, 2, 2));
        let runs: Vec<_> = c.runs().map(|(o, d)| (o, d.to_vec())).collect();
        assert_eq!(
            runs,
            vec![
                (10, heap[10..15].to_vec()),
                (5000, heap[5000..5020].to_vec())
            ]
        );
        roundtrip(Message::Commit(c));
        roundtrip(Message::Ack { tx_id: u64::MAX });
        roundtrip(Message::Status);
        roundtrip(Message::StatusReply(StatusInfo {
            last_tx: 1,
            epoch: 2,
            heap_size: 3,
            txs_applied: 4,
            bytes_applied: 5,
            wal_bytes: 6,
            durable: true,
            ms_since_commit: Some(8),
            primary: Some(PrimaryInfo {
                peer: "tcp:127.0.0.1:5".into(),
                epoch: 2,
                mode: Mode::Async { max_lag: 4 },
                current: true,
            }),
        }));
        roundtrip(Message::Promote);
        roundtrip(Message::Error {
            code: ErrorCode::Fenced,
            message: "stale".into(),
        });
    }

    #[test]
    fn long_error_messages_are_cut_on_a_char_boundary() {
        let mut buf = Vec::new();
        let long = "é".repeat(MAX_ERROR_MESSAGE);
        encode(
            &Message::Error {
                code: ErrorCode::Internal,
                message: long,
            },
            &mut buf,
        );
        let Message::Error { message, .. } = FrameReader::default().read(&mut &buf[..]).unwrap()
        else {
            panic!("not an error")
        };
        assert!(message.len() <= MAX_ERROR_MESSAGE && message.starts_with('é'));
    }
}
