//! The authenticated connection between a coordinator and a cohort: a handshake that
//! proves both sides hold the cluster token, then MACed, numbered frames.
//!
//! # Wire format, version 1
//!
//! All integers are big-endian. The coordinator (client) opens the TCP connection.
//!
//! Handshake:
//!
//! | from | bytes | field |
//! |---|---|---|
//! | coordinator | 4 | magic `RBCO` |
//! | | 1 | version, `1` |
//! | | 32 | `nonce_c`, fresh random |
//! | cohort | 4 | magic `RBCO` |
//! | | 1 | version, `1` |
//! | | 32 | `nonce_s`, fresh random |
//! | | 32 | `proof_s = HMAC(token, "rebound-coord/1 cohort" ‖ nonce_c ‖ nonce_s)` |
//! | coordinator | 32 | `proof_c = HMAC(token, "rebound-coord/1 coordinator" ‖ nonce_c ‖ nonce_s)` |
//!
//! HMAC is HMAC-SHA256 and proofs are compared in constant time. Either side refuses
//! a bad magic, a version other than 1, or a wrong proof, and closes the connection.
//! Both then derive `k = HMAC(token, "rebound-coord/1 session" ‖ nonce_c ‖ nonce_s)`
//! and one key per direction, `k_cs = HMAC(k, "coordinator->cohort")` and
//! `k_sc = HMAC(k, "cohort->coordinator")`.
//!
//! Frame, in each direction:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | `len`: the bytes that follow, 40 ..= [`MAX_FRAME_LEN`] (1 MiB) |
//! | 8 | `seq`: 0 for the first frame of the direction, then +1 |
//! | len − 40 | payload (a JSON [`crate::msg::Message`]) |
//! | 32 | `tag = HMAC(k_dir, len ‖ seq ‖ payload)` |
//!
//! The receiver refuses, and drops the connection on, a length over the cap (before
//! reading it), a tag that does not verify (a modified frame, or one from another
//! connection, whose nonces and so keys differ), and a `seq` other than the next
//! expected (a replay within the connection, or a lost or reordered frame).
//!
//! # Why no TLS
//!
//! The protocol needs integrity and authentication, not confidentiality: its messages
//! carry VM names, page counts, timings and the daemon's opaque restore arguments,
//! nothing secret. What must not happen is a stranger starting, loading or aborting
//! VMs, or a changed, replayed or reordered command; the token proofs, per-connection
//! keys from both sides' nonces and the MACed sequence numbers prevent exactly that,
//! with no certificates to manage. A deployment whose restore arguments become secret
//! must add encryption.

use std::time::Duration;

use rebound_token::{hmac_bytes, hmac_verify};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::token::ClusterToken;

/// The first four bytes each side sends.
pub const MAGIC: [u8; 4] = *b"RBCO";
/// The only protocol version this build speaks.
pub const VERSION: u8 = 1;
/// The cap on a frame's `len` field.
pub const MAX_FRAME_LEN: usize = 1 << 20;
/// Bytes of a nonce, a proof and a tag.
const NONCE_LEN: usize = 32;
const TAG_LEN: usize = 32;
/// Bytes of the coordinator's hello, the cohort's hello and the coordinator's proof.
pub const CLIENT_HELLO_LEN: usize = 4 + 1 + NONCE_LEN;
pub const SERVER_HELLO_LEN: usize = 4 + 1 + NONCE_LEN + TAG_LEN;
pub const CLIENT_PROOF_LEN: usize = TAG_LEN;
const MIN_FRAME_LEN: usize = 8 + TAG_LEN;

/// Why a connection was refused or dropped.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the connection failed")]
    Io(#[source] std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("the handshake did not finish within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("the peer does not speak the rebound-coord protocol (bad magic)")]
    BadMagic,
    #[error("the peer speaks protocol version {0}; this side speaks only version {VERSION}")]
    UnknownVersion(u8),
    #[error("the peer did not prove it holds the cluster token")]
    NotAuthenticated,
    #[error("a frame of {0} bytes is over the {MAX_FRAME_LEN}-byte cap")]
    FrameTooLarge(usize),
    #[error("a frame of {0} bytes is too short to hold a sequence number and a tag")]
    FrameTooShort(usize),
    #[error("a frame failed its MAC check (modified, or from another connection)")]
    BadMac,
    #[error("a frame reuses sequence number {seq}, expected {expected} (replayed)")]
    Replayed { seq: u64, expected: u64 },
    #[error(
        "a frame has sequence number {seq}, expected {expected} (a frame was lost or reordered)"
    )]
    OutOfOrder { seq: u64, expected: u64 },
    #[error("cannot get random bytes for a nonce")]
    Random(#[source] getrandom::Error),
}

fn io_err(e: std::io::Error) -> WireError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        WireError::Closed
    } else {
        WireError::Io(e)
    }
}

fn nonce() -> Result<[u8; NONCE_LEN], WireError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(WireError::Random)?;
    Ok(n)
}

const LABEL_COHORT: &[u8] = b"rebound-coord/1 cohort";
const LABEL_COORD: &[u8] = b"rebound-coord/1 coordinator";
const LABEL_SESSION: &[u8] = b"rebound-coord/1 session";

fn check_hello(hello: &[u8]) -> Result<(), WireError> {
    if hello[..4] != MAGIC {
        return Err(WireError::BadMagic);
    }
    if hello[4] != VERSION {
        return Err(WireError::UnknownVersion(hello[4]));
    }
    Ok(())
}

/// The per-direction keys of one connection.
struct Keys {
    coord_to_cohort: [u8; TAG_LEN],
    cohort_to_coord: [u8; TAG_LEN],
}

fn session_keys(token: &ClusterToken, nonce_c: &[u8], nonce_s: &[u8]) -> Keys {
    let k = hmac_bytes(token.bytes(), &[LABEL_SESSION, nonce_c, nonce_s]);
    Keys {
        coord_to_cohort: hmac_bytes(&k, &[b"coordinator->cohort"]),
        cohort_to_coord: hmac_bytes(&k, &[b"cohort->coordinator"]),
    }
}

/// Runs the coordinator's side of the handshake on a fresh connection.
pub async fn client_handshake(
    mut stream: TcpStream,
    token: &ClusterToken,
    timeout: Duration,
) -> Result<(FrameReader<OwnedReadHalf>, FrameWriter<OwnedWriteHalf>), WireError> {
    let run = async {
        let nonce_c = nonce()?;
        let mut hello = Vec::with_capacity(CLIENT_HELLO_LEN);
        hello.extend_from_slice(&MAGIC);
        hello.push(VERSION);
        hello.extend_from_slice(&nonce_c);
        stream.write_all(&hello).await.map_err(io_err)?;
        let mut reply = [0u8; SERVER_HELLO_LEN];
        stream.read_exact(&mut reply).await.map_err(io_err)?;
        check_hello(&reply)?;
        let nonce_s = &reply[5..5 + NONCE_LEN];
        let proof_s = &reply[5 + NONCE_LEN..];
        if !hmac_verify(token.bytes(), &[LABEL_COHORT, &nonce_c, nonce_s], proof_s) {
            return Err(WireError::NotAuthenticated);
        }
        let proof_c = hmac_bytes(token.bytes(), &[LABEL_COORD, &nonce_c, nonce_s]);
        stream.write_all(&proof_c).await.map_err(io_err)?;
        Ok(session_keys(token, &nonce_c, nonce_s))
    };
    let keys = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| WireError::HandshakeTimeout(timeout))??;
    let (r, w) = stream.into_split();
    Ok((
        FrameReader::new(r, keys.cohort_to_coord),
        FrameWriter::new(w, keys.coord_to_cohort),
    ))
}

/// Runs the cohort's side of the handshake on an accepted connection.
pub async fn server_handshake(
    mut stream: TcpStream,
    token: &ClusterToken,
    timeout: Duration,
) -> Result<(FrameReader<OwnedReadHalf>, FrameWriter<OwnedWriteHalf>), WireError> {
    let run = async {
        let mut hello = [0u8; CLIENT_HELLO_LEN];
        stream.read_exact(&mut hello).await.map_err(io_err)?;
        check_hello(&hello)?;
        let nonce_c = &hello[5..];
        let nonce_s = nonce()?;
        let proof_s = hmac_bytes(token.bytes(), &[LABEL_COHORT, nonce_c, &nonce_s]);
        let mut reply = Vec::with_capacity(SERVER_HELLO_LEN);
        reply.extend_from_slice(&MAGIC);
        reply.push(VERSION);
        reply.extend_from_slice(&nonce_s);
        reply.extend_from_slice(&proof_s);
        stream.write_all(&reply).await.map_err(io_err)?;
        let mut proof_c = [0u8; CLIENT_PROOF_LEN];
        stream.read_exact(&mut proof_c).await.map_err(io_err)?;
        if !hmac_verify(token.bytes(), &[LABEL_COORD, nonce_c, &nonce_s], &proof_c) {
            return Err(WireError::NotAuthenticated);
        }
        Ok(session_keys(token, nonce_c, &nonce_s))
    };
    let keys = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| WireError::HandshakeTimeout(timeout))??;
    let (r, w) = stream.into_split();
    Ok((
        FrameReader::new(r, keys.coord_to_cohort),
        FrameWriter::new(w, keys.cohort_to_coord),
    ))
}

/// Reads and checks the frames of one direction.
pub struct FrameReader<R> {
    inner: R,
    key: [u8; TAG_LEN],
    next_seq: u64,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of frames MACed under `key`. A connection's key comes from the
    /// handshake; the fuzz harness passes its own to reach the checks after the MAC.
    pub fn new(inner: R, key: [u8; TAG_LEN]) -> Self {
        Self {
            inner,
            key,
            next_seq: 0,
        }
    }

    /// The next frame's payload, once its length, tag and sequence number are checked.
    pub async fn read(&mut self) -> Result<Vec<u8>, WireError> {
        let mut len_be = [0u8; 4];
        self.inner.read_exact(&mut len_be).await.map_err(io_err)?;
        let len = u32::from_be_bytes(len_be) as usize;
        if len > MAX_FRAME_LEN {
            return Err(WireError::FrameTooLarge(len));
        }
        if len < MIN_FRAME_LEN {
            return Err(WireError::FrameTooShort(len));
        }
        let mut body = vec![0u8; len];
        self.inner.read_exact(&mut body).await.map_err(io_err)?;
        let (signed, tag) = body.split_at(len - TAG_LEN);
        if !hmac_verify(&self.key, &[&len_be, signed], tag) {
            return Err(WireError::BadMac);
        }
        let mut seq_be = [0u8; 8];
        seq_be.copy_from_slice(&signed[..8]);
        let seq = u64::from_be_bytes(seq_be);
        if seq != self.next_seq {
            let expected = self.next_seq;
            return Err(if seq < expected {
                WireError::Replayed { seq, expected }
            } else {
                WireError::OutOfOrder { seq, expected }
            });
        }
        self.next_seq += 1;
        body.truncate(len - TAG_LEN);
        body.drain(..8);
        Ok(body)
    }
}

/// Numbers, MACs and writes the frames of one direction.
pub struct FrameWriter<W> {
    inner: W,
    key: [u8; TAG_LEN],
    next_seq: u64,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer of frames MACed under `key` (see [`FrameReader::new`]).
    pub fn new(inner: W, key: [u8; TAG_LEN]) -> Self {
        Self {
            inner,
            key,
            next_seq: 0,
        }
    }

    /// Builds the next frame's bytes without sending them (the sequence number is
    /// used up). Fault-injection tests send such bytes twice, or changed.
    pub fn encode_next(&mut self, payload: &[u8]) -> Result<Vec<u8>, WireError> {
        let len = 8 + payload.len() + TAG_LEN;
        if len > MAX_FRAME_LEN {
            return Err(WireError::FrameTooLarge(len));
        }
        let len_be = (len as u32).to_be_bytes();
        let mut frame = Vec::with_capacity(4 + len);
        frame.extend_from_slice(&len_be);
        frame.extend_from_slice(&self.next_seq.to_be_bytes());
        frame.extend_from_slice(payload);
        let tag = hmac_bytes(&self.key, &[&frame[..4], &frame[4..]]);
        frame.extend_from_slice(&tag);
        self.next_seq += 1;
        Ok(frame)
    }

    /// Sends `payload` as the next frame.
    pub async fn write(&mut self, payload: &[u8]) -> Result<(), WireError> {
        let frame = self.encode_next(payload)?;
        self.write_raw(&frame).await
    }

    /// Sends bytes as they are (for fault-injection tests; see [`Self::encode_next`]).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.inner.write_all(bytes).await.map_err(io_err)?;
        self.inner.flush().await.map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (FrameWriter<Vec<u8>>, [u8; 32]) {
        (FrameWriter::new(Vec::new(), [9; 32]), [9; 32])
    }

    async fn read_all(bytes: Vec<u8>, key: [u8; 32]) -> Vec<Result<Vec<u8>, WireError>> {
        let mut r = FrameReader::new(&bytes[..], key);
        let mut out = Vec::new();
        loop {
            match r.read().await {
                Err(WireError::Closed) => return out,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
                ok => out.push(ok),
            }
        }
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let (mut w, key) = pair();
        w.write(b"one").await.unwrap();
        w.write(b"").await.unwrap();
        let got = read_all(w.inner, key).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].as_ref().unwrap(), b"one");
        assert_eq!(got[1].as_ref().unwrap(), b"");
    }

    #[tokio::test]
    async fn modified_replayed_reordered_and_foreign_frames_are_refused() {
        let (mut w, key) = pair();
        let a = w.encode_next(b"first").unwrap();
        let b = w.encode_next(b"second").unwrap();

        let mut modified = a.clone();
        modified[14] ^= 1;
        let got = read_all(modified, key).await;
        assert!(matches!(got[0], Err(WireError::BadMac)));

        let got = read_all([a.clone(), a.clone()].concat(), key).await;
        assert!(matches!(
            got[1],
            Err(WireError::Replayed {
                seq: 0,
                expected: 1
            })
        ));

        let got = read_all(b.clone(), key).await;
        assert!(matches!(
            got[0],
            Err(WireError::OutOfOrder {
                seq: 1,
                expected: 0
            })
        ));

        let got = read_all(a, [8; 32]).await;
        assert!(matches!(got[0], Err(WireError::BadMac)));
    }

    #[tokio::test]
    async fn oversized_length_is_refused_before_reading_it() {
        let bytes = ((MAX_FRAME_LEN + 1) as u32).to_be_bytes().to_vec();
        let got = read_all(bytes, [9; 32]).await;
        assert!(matches!(got[0], Err(WireError::FrameTooLarge(_))));
        let (mut w, _) = pair();
        assert!(matches!(
            w.encode_next(&vec![0; MAX_FRAME_LEN]),
            Err(WireError::FrameTooLarge(_))
        ));
    }

    #[test]
    fn unknown_version_and_magic_are_refused() {
        let mut hello = [0u8; CLIENT_HELLO_LEN];
        hello[..4].copy_from_slice(&MAGIC);
        hello[4] = 2;
        assert!(matches!(
            check_hello(&hello),
            Err(WireError::UnknownVersion(2))
        ));
        hello[0] = b'X';
        assert!(matches!(check_hello(&hello), Err(WireError::BadMagic)));
    }
}
