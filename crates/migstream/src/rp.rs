//! The return path: what a postcopy destination sends back to its source
//! (`docs/design/qemu-postcopy-stream.md`, section 5). The bytes come from a QEMU
//! the guest may have taken over, so every message is checked before use.

use crate::StreamError;

/// Longer messages are refused, as QEMU's own source refuses them.
pub const MAX_MESSAGE: usize = 512;

/// Message types (QEMU 7.2's `MIG_RP_MSG_*`).
pub mod msg {
    pub const SHUT: u16 = 1;
    pub const PONG: u16 = 2;
    pub const REQ_PAGES_ID: u16 = 3;
    pub const REQ_PAGES: u16 = 4;
}

/// One message from the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// The destination is done: 0 if it loaded everything, else it had an error.
    Shut(u32),
    Pong(u32),
    /// Send these bytes of a block first. `block` is named when it differs from the
    /// previous request's.
    ReqPages {
        block: Option<String>,
        start: u64,
        len: u32,
    },
}

/// Reads one message from the front of `buf`: the message and the bytes it took,
/// `None` if `buf` does not hold a whole one yet.
pub fn next(buf: &[u8]) -> Result<Option<(Message, usize)>, StreamError> {
    let bad = |why: String| Err(StreamError::Bad { at: 0, why });
    if buf.len() < 4 {
        return Ok(None);
    }
    let ty = u16::from_be_bytes([buf[0], buf[1]]);
    let len = u16::from_be_bytes([buf[2], buf[3]]) as usize;
    if len > MAX_MESSAGE {
        return bad(format!("a return-path message of {len} bytes"));
    }
    let Some(p) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    let be32 = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
    let be64 = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
    let want = |n: usize| {
        if len == n {
            Ok(())
        } else {
            Err(StreamError::Bad {
                at: 0,
                why: format!("return-path message {ty} of {len} bytes, expected {n}"),
            })
        }
    };
    let m = match ty {
        msg::SHUT => {
            want(4)?;
            Message::Shut(be32(p))
        }
        msg::PONG => {
            want(4)?;
            Message::Pong(be32(p))
        }
        msg::REQ_PAGES => {
            want(12)?;
            Message::ReqPages {
                block: None,
                start: be64(&p[..8]),
                len: be32(&p[8..12]),
            }
        }
        msg::REQ_PAGES_ID => {
            if len < 14 {
                return bad(format!("a page request of {len} bytes"));
            }
            let n = p[12] as usize;
            want(13 + n)?;
            let name = &p[13..];
            if !name.iter().all(|c| c.is_ascii_graphic()) {
                return bad("a page request's block name is not printable".into());
            }
            Message::ReqPages {
                block: Some(String::from_utf8(name.to_vec()).expect("ASCII")),
                start: be64(&p[..8]),
                len: be32(&p[8..12]),
            }
        }
        t => return bad(format!("return-path message type {t}")),
    };
    Ok(Some((m, 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req_id(start: u64, len: u32, name: &str) -> Vec<u8> {
        let mut b = vec![0, 3, 0, (13 + name.len()) as u8];
        b.extend(start.to_be_bytes());
        b.extend(len.to_be_bytes());
        b.push(name.len() as u8);
        b.extend(name.as_bytes());
        b
    }

    #[test]
    fn requests_pongs_and_the_shut_read_one_at_a_time() {
        let mut b = req_id(0x5000, 4096, "ram");
        b.extend([0, 4, 0, 12]);
        b.extend(0x9000u64.to_be_bytes());
        b.extend(4096u32.to_be_bytes());
        b.extend([0, 2, 0, 4, 0, 0, 0, 3, 0, 1, 0, 4, 0, 0, 0, 0]);
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((m, n)) = next(&b[at..]).unwrap() {
            got.push(m);
            at += n;
        }
        assert_eq!(at, b.len());
        assert_eq!(
            got,
            [
                Message::ReqPages {
                    block: Some("ram".into()),
                    start: 0x5000,
                    len: 4096
                },
                Message::ReqPages {
                    block: None,
                    start: 0x9000,
                    len: 4096
                },
                Message::Pong(3),
                Message::Shut(0)
            ]
        );
        // A message cut short (the first is 20 bytes) is not read yet.
        for n in 0..20 {
            assert!(matches!(next(&b[..n]), Ok(None)), "{n}");
        }
    }

    #[test]
    fn malformed_messages_are_refused_with_a_reason() {
        let e = |b: &[u8]| next(b).unwrap_err().to_string();
        assert!(e(&[0, 9, 0, 0]).contains("type 9"));
        assert!(e(&[0, 1, 2, 1]).contains("513 bytes"));
        assert!(e(&[0, 1, 0, 3, 0, 0, 0]).contains("expected 4"));
        let mut bad_len = req_id(0, 4096, "ram");
        bad_len[3] += 1;
        bad_len.push(b'x');
        bad_len[16] = 2;
        assert!(e(&bad_len).contains("expected 15"), "{}", e(&bad_len));
        let mut unprintable = req_id(0, 4096, "ram");
        unprintable[18] = 0;
        assert!(e(&unprintable).contains("not printable"));
    }
}
