//! Compact commit frames: a whole transaction in 6–10 bytes of framing instead of ~16.
//!
//! Most transactions of a real application are small (a list insert writes two or three
//! words), so the 12-byte frame header and the varint tx id and epoch were most of what
//! went on the wire. A compact frame drops what the backup already knows:
//!
//! | bytes | field  | meaning                                                        |
//! |-------|--------|----------------------------------------------------------------|
//! | 0     | mark   | [`COMPACT_MARK`] (a standard frame starts with `R`)            |
//! | 1..   | length | LEB128 varint (canonical, 1–5 bytes): payload bytes            |
//! | 4     | crc32  | CRC-32 (IEEE) of the mark and length bytes, then the tx id and the epoch as u64 LE, then the payload |
//! | n     | payload| a `Commit` payload without its tx id and epoch: run count, runs |
//!
//! The tx id (the backup's last tx + 1) and the epoch (the session's) are implied, and the
//! checksum covers them: a compact frame only checks out as the next transaction of the
//! session it was made for. A replayed, reordered or damaged frame fails the check and is
//! refused; the primary never resends one the backup holds (it resends only what the
//! backup's `Welcome` says is missing, in order). Parts and ends of streamed transactions
//! keep the standard frames; the backup logs every transaction in the standard form.

use std::io::Read;

use super::commit::{encode_runs, get_varint, put_varint, put_varint_at, MAX_VARINT};
use super::{Commit, FrameReader, FrameType, WireError, MAX_COMMIT_PAYLOAD};
use crate::diff::DiffRun;

/// First byte of a compact commit frame.
pub const COMPACT_MARK: u8 = 0xC3;
/// Longest length varint: the payload cap fits in 32 bits.
const MAX_LEN_BYTES: usize = 5;
/// Longest framing: mark, length, checksum.
const MAX_HEAD: usize = 1 + MAX_LEN_BYTES + 4;

/// A compact commit as read, before the backup knows which transaction it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactCommit {
    /// The mark and the length varint as they arrived (the checksum covers them).
    head: Vec<u8>,
    crc: u32,
    payload: Vec<u8>,
}

impl CompactCommit {
    /// Frame bytes (framing and payload).
    pub fn frame_len(&self) -> usize {
        self.head.len() + 4 + self.payload.len()
    }

    /// Appends the frame's bytes to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.head);
        buf.extend_from_slice(&self.crc.to_le_bytes());
        buf.extend_from_slice(&self.payload);
    }

    /// The commit this frame is if it is transaction `tx_id` of `epoch`: checked against
    /// its checksum, then parsed and validated like a standard `Commit`.
    pub fn expand(&self, tx_id: u64, epoch: u64) -> Result<Commit, WireError> {
        let actual = checksum(&self.head, tx_id, epoch, &self.payload);
        if actual != self.crc {
            return Err(WireError::BadCrc {
                expected: self.crc,
                actual,
            });
        }
        let mut payload = Vec::with_capacity(2 * MAX_VARINT + self.payload.len());
        put_varint(&mut payload, tx_id);
        put_varint(&mut payload, epoch);
        payload.extend_from_slice(&self.payload);
        Commit::parse_as(FrameType::Commit, payload)
    }
}

fn checksum(head: &[u8], tx_id: u64, epoch: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    h.update(&tx_id.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends the compact frame of transaction `tx_id` of `epoch` (its `runs`, bytes taken
/// from `heap`) to `buf`; returns the frame length, or `None` (and `buf` as it was) when
/// the payload would exceed [`MAX_COMMIT_PAYLOAD`].
///
/// # Panics
/// If a run lies outside `heap`.
pub fn encode_compact_commit(
    tx_id: u64,
    epoch: u64,
    runs: &[DiffRun],
    heap: &[u8],
    buf: &mut Vec<u8>,
) -> Option<usize> {
    let frame_start = buf.len();
    // The payload goes after room for the longest framing, which is then written right
    // before it and the gap closed: the length is known only once the runs are encoded.
    buf.resize(frame_start + MAX_HEAD, 0);
    let body = buf.len();
    if encode_runs(runs, heap, buf).is_none() || buf.len() - body > MAX_COMMIT_PAYLOAD as usize {
        buf.truncate(frame_start);
        return None;
    }
    let mut mark_and_len = [COMPACT_MARK; 1 + MAX_LEN_BYTES];
    let n = put_varint_at(&mut mark_and_len, 1, (buf.len() - body) as u64);
    let head = &mark_and_len[..n];
    let crc = checksum(head, tx_id, epoch, &buf[body..]);
    let at = body - 4 - head.len();
    buf[at..at + head.len()].copy_from_slice(head);
    buf[body - 4..body].copy_from_slice(&crc.to_le_bytes());
    buf.drain(frame_start..at);
    Some(buf.len() - frame_start)
}

impl FrameReader {
    /// Reads the rest of a compact frame whose mark was just read: its length (checked
    /// against the commit cap before anything is allocated), checksum and payload.
    pub(super) fn read_compact<R: Read>(&self, r: &mut R) -> Result<CompactCommit, WireError> {
        let bad = |why: String| WireError::Malformed {
            ty: FrameType::Commit,
            why: format!("compact frame: {why}"),
        };
        let mut head = vec![COMPACT_MARK];
        loop {
            let mut b = [0u8; 1];
            self.fill(r, &mut b, head.len(), head.len() + 1)?;
            head.push(b[0]);
            if b[0] & 0x80 == 0 {
                break;
            }
            if head.len() > MAX_LEN_BYTES {
                return Err(bad("length is longer than 5 bytes".into()));
            }
        }
        let mut pos = 1;
        let len = get_varint(&head, &mut pos).ok_or_else(|| bad("unreadable length".into()))?;
        // Canonical only: the checksum covers these bytes, so one length, one encoding.
        if head.len() > 2 && head[head.len() - 1] == 0 {
            return Err(bad("length is not minimally encoded".into()));
        }
        let cap = self.commit_cap.min(MAX_COMMIT_PAYLOAD);
        if len > u64::from(cap) {
            return Err(WireError::Oversized {
                ty: FrameType::Commit,
                len: u32::try_from(len).unwrap_or(u32::MAX),
                cap,
            });
        }
        let mut crc = [0u8; 4];
        let want = head.len() + 4 + len as usize;
        self.fill(r, &mut crc, head.len(), want)?;
        let payload = self.read_payload(r, len as usize, head.len() + 4, want)?;
        Ok(CompactCommit {
            head,
            crc: u32::from_le_bytes(crc),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Message;

    fn heap() -> Vec<u8> {
        (0..1 << 16).map(|i: u32| (i * 7) as u8).collect()
    }

    fn frame(tx: u64, epoch: u64, runs: &[DiffRun]) -> Vec<u8> {
        let mut buf = vec![0xAA; 3]; // bytes of an earlier frame stay as they are
        let n = encode_compact_commit(tx, epoch, runs, &heap(), &mut buf).unwrap();
        assert_eq!(&buf[..3], &[0xAA; 3]);
        assert_eq!(n, buf.len() - 3);
        buf.split_off(3)
    }

    fn read(bytes: &[u8]) -> Result<CompactCommit, WireError> {
        match FrameReader::default().read(&mut &bytes[..])? {
            Message::Compact(c) => Ok(c),
            m => panic!("read {} instead of a compact commit", m.kind()),
        }
    }

    #[test]
    fn a_compact_commit_expands_to_the_runs_it_was_made_of() {
        let runs = [
            DiffRun {
                offset: 40_000,
                len: 8,
            },
            DiffRun { offset: 16, len: 8 },
            DiffRun {
                offset: 1000,
                len: 300,
            },
        ];
        let f = frame(20_000, 3, &runs);
        let cc = read(&f).unwrap();
        assert_eq!(cc.frame_len(), f.len());
        let mut again = Vec::new();
        cc.encode(&mut again);
        assert_eq!(again, f);
        let c = cc.expand(20_000, 3).unwrap();
        assert_eq!((c.tx_id, c.epoch, c.run_count), (20_000, 3, 3));
        let h = heap();
        let got: Vec<(u64, Vec<u8>)> = c.runs().map(|(o, d)| (o, d.to_vec())).collect();
        let want: Vec<(u64, Vec<u8>)> = runs
            .iter()
            .map(|r| (r.offset, h[r.offset as usize..r.end() as usize].to_vec()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_two_word_transaction_costs_seven_bytes_of_framing() {
        // Two 8-byte writes far apart in a 10 MiB heap, at a tx id past 16384: its
        // standard frame was 43 bytes, 2.7x the bytes written.
        let heap = vec![1u8; 10 << 20];
        let runs = [
            DiffRun {
                offset: 9_000_000,
                len: 8,
            },
            DiffRun {
                offset: 1_048_576,
                len: 8,
            },
        ];
        let mut buf = Vec::new();
        let n = encode_compact_commit(40_000, 2, &runs, &heap, &mut buf).unwrap();
        // Mark, length, checksum, run count; each run a 4-byte gap, a 1-byte length and
        // its 8 bytes.
        assert_eq!(n, 1 + 1 + 4 + 1 + 2 * (4 + 1 + 8));
        let mut standard = Vec::new();
        crate::wire::encode_commit(40_000, 2, &runs, &heap, &mut standard).unwrap();
        assert_eq!(standard.len(), n + 10);
    }

    #[test]
    fn a_compact_commit_is_only_the_transaction_it_was_made_for() {
        let runs = [DiffRun { offset: 8, len: 4 }];
        let cc = read(&frame(7, 2, &runs)).unwrap();
        assert!(cc.expand(7, 2).is_ok());
        // A replay (an earlier id), a frame for another place in the sequence, a stale epoch.
        for (tx, epoch) in [(8, 2), (6, 2), (7, 1), (7, 3)] {
            let e = cc.expand(tx, epoch).unwrap_err();
            assert!(matches!(e, WireError::BadCrc { .. }), "{tx}/{epoch}: {e}");
        }
    }

    #[test]
    fn malformed_compact_frames_are_refused() {
        let runs = [DiffRun {
            offset: 100,
            len: 200,
        }];
        let good = frame(5, 1, &runs);
        // Truncated anywhere: after the mark, inside the checksum, inside the payload.
        for cut in [1, 3, 6, good.len() - 1] {
            let e = read(&good[..cut]).unwrap_err();
            assert!(matches!(e, WireError::Truncated { .. }), "cut {cut}: {e}");
        }
        // A damaged payload byte fails the checksum on expansion.
        let mut damaged = good.clone();
        *damaged.last_mut().unwrap() ^= 1;
        let e = read(&damaged).unwrap().expand(5, 1).unwrap_err();
        assert!(matches!(e, WireError::BadCrc { .. }), "{e}");
        // A length over the cap is refused before the payload is read or allocated.
        let mut huge = vec![COMPACT_MARK];
        put_varint(&mut huge, u64::from(MAX_COMMIT_PAYLOAD) + 1);
        let e = read(&huge).unwrap_err();
        assert!(matches!(e, WireError::Oversized { .. }), "{e}");
        let tight = FrameReader {
            commit_cap: 64,
            ..FrameReader::default()
        };
        let e = tight.read(&mut &good[..]).unwrap_err();
        assert!(matches!(e, WireError::Oversized { cap: 64, .. }), "{e}");
        // A length of more than 5 bytes, and a padded (non-minimal) length.
        let e = read(&[COMPACT_MARK, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]).unwrap_err();
        assert!(e.to_string().contains("longer than 5 bytes"), "{e}");
        let e = read(&[COMPACT_MARK, 0x85, 0x00, 0, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap_err();
        assert!(e.to_string().contains("not minimally encoded"), "{e}");
        // A payload whose runs do not parse checks out but is refused as a commit.
        let mut junk = vec![COMPACT_MARK, 3];
        let crc = checksum(&junk, 5, 1, &[9, 1, 2]);
        junk.extend_from_slice(&crc.to_le_bytes());
        junk.extend_from_slice(&[9, 1, 2]);
        let e = read(&junk).unwrap().expand(5, 1).unwrap_err();
        assert!(matches!(e, WireError::Malformed { .. }), "{e}");
    }
}
