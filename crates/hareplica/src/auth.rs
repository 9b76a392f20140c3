//! Proof of the shared token on a TCP connection, before any frame (as the cluster
//! daemons do, with the same token files: `rebound-token`).
//!
//! | from    | bytes | field |
//! |---------|-------|-------|
//! | primary | 4     | magic `RHAU` |
//! |         | 1     | version, `1` |
//! |         | 32    | `nonce_p`, fresh random |
//! | backup  | 4     | magic `RHAU` |
//! |         | 1     | version, `1` |
//! |         | 32    | `nonce_b`, fresh random |
//! |         | 32    | `HMAC(token, "rebound-ha/1 backup" ‖ nonce_p ‖ nonce_b)` |
//! | primary | 32    | `HMAC(token, "rebound-ha/1 primary" ‖ nonce_p ‖ nonce_b)` |
//!
//! HMAC is HMAC-SHA256, compared in constant time; either side closes the connection on
//! a bad magic, version or proof. The proofs authenticate the connection: a peer without
//! the token cannot commit, take over, promote or read the replica. The frames after it
//! are checked by CRC, not MACed: someone who can inject into an established TCP
//! connection on the path is not kept out (use a trusted network, or a unix socket).

use std::io::{self, Read, Write};
use std::time::Instant;

use rebound_token::{ClusterToken, NONCE_LEN, PROOF_LEN};

use crate::endpoint::Stream;

const MAGIC: [u8; 4] = *b"RHAU";
const VERSION: u8 = 1;
const HELLO_LEN: usize = 4 + 1 + NONCE_LEN;
const LABEL_BACKUP: &[u8] = b"rebound-ha/1 backup";
const LABEL_PRIMARY: &[u8] = b"rebound-ha/1 primary";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the connection failed during the token handshake")]
    Io(#[source] io::Error),
    #[error("the handshake did not finish before its deadline")]
    Deadline,
    #[error("the peer does not speak the rebound-ha token handshake (bad magic)")]
    BadMagic,
    #[error("the peer speaks token handshake version {0}; this side speaks only {VERSION}")]
    Version(u8),
    #[error("the peer did not prove it holds the token")]
    NotAuthenticated,
    #[error("cannot get random bytes for a nonce")]
    Random(#[source] getrandom::Error),
}

fn hello(nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HELLO_LEN + PROOF_LEN);
    h.extend_from_slice(&MAGIC);
    h.push(VERSION);
    h.extend_from_slice(nonce);
    h
}

fn check_hello(h: &[u8]) -> Result<&[u8], AuthError> {
    if h[..4] != MAGIC {
        return Err(AuthError::BadMagic);
    }
    if h[4] != VERSION {
        return Err(AuthError::Version(h[4]));
    }
    Ok(&h[5..HELLO_LEN])
}

/// Fills `buf`, giving up at `deadline` (the stream's read timeout is changed).
fn read_full(s: &mut Stream, buf: &mut [u8], deadline: Instant) -> Result<(), AuthError> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AuthError::Deadline);
        }
        s.set_read_timeout(Some(left)).map_err(AuthError::Io)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(AuthError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(AuthError::Io(e)),
        }
    }
    Ok(())
}

/// The primary's (or an operator command's) side, on a fresh connection.
pub fn client(s: &mut Stream, token: &ClusterToken, deadline: Instant) -> Result<(), AuthError> {
    let nonce_p = rebound_token::nonce().map_err(AuthError::Random)?;
    s.write_all(&hello(&nonce_p)).map_err(AuthError::Io)?;
    let mut reply = [0u8; HELLO_LEN + PROOF_LEN];
    read_full(s, &mut reply, deadline)?;
    let nonce_b = check_hello(&reply)?;
    if !token.verify(LABEL_BACKUP, &nonce_p, nonce_b, &reply[HELLO_LEN..]) {
        return Err(AuthError::NotAuthenticated);
    }
    let proof = token.proof(LABEL_PRIMARY, &nonce_p, nonce_b);
    s.write_all(&proof).map_err(AuthError::Io)
}

/// The backup's side, on an accepted connection; it must finish by `deadline`.
pub fn server(s: &mut Stream, token: &ClusterToken, deadline: Instant) -> Result<(), AuthError> {
    let mut h = [0u8; HELLO_LEN];
    read_full(s, &mut h, deadline)?;
    let nonce_p = check_hello(&h)?.to_vec();
    let nonce_b = rebound_token::nonce().map_err(AuthError::Random)?;
    let mut reply = hello(&nonce_b);
    reply.extend_from_slice(&token.proof(LABEL_BACKUP, &nonce_p, &nonce_b));
    s.write_all(&reply).map_err(AuthError::Io)?;
    let mut proof = [0u8; PROOF_LEN];
    read_full(s, &mut proof, deadline)?;
    if !token.verify(LABEL_PRIMARY, &nonce_p, &nonce_b, &proof) {
        return Err(AuthError::NotAuthenticated);
    }
    Ok(())
}
