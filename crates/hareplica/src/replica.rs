//! The replica held by a backup: the committed image and the rules for accepting commits.
//!
//! The same rules run when a commit arrives and when the write-ahead log is replayed, so
//! a restarted backup reaches exactly the state it acknowledged.

use std::collections::VecDeque;

use crate::wire::{Commit, CommitKind, ErrorCode};

/// How many recent transactions are remembered (tx id and checksum) so that a resend of
/// an applied transaction can be acknowledged again, and a different transaction reusing
/// its id refused.
pub const DIGEST_WINDOW: usize = 4096;

/// A committed heap image and where it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaState {
    /// Zero until a primary created the heap.
    pub heap_size: u64,
    pub last_tx: u64,
    /// Bumped by every takeover, promote and reset; commits must carry the current one.
    pub epoch: u64,
    pub image: Vec<u8>,
    /// (tx id, CRC of the commit payload) of the last transactions, consecutive ids
    /// ending at `last_tx`.
    pub digests: VecDeque<(u64, u32)>,
}

/// What to do with an incoming commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The next transaction: log it, apply it, acknowledge it.
    Apply,
    /// A resend of an applied transaction: acknowledge again, change nothing.
    Duplicate,
    /// Refuse with this code and message, change nothing.
    Refuse(ErrorCode, String),
}

impl ReplicaState {
    pub fn is_initialized(&self) -> bool {
        self.heap_size > 0
    }

    /// A zeroed heap of `heap_size` bytes in a new epoch.
    pub fn reset(&mut self, heap_size: u64) {
        self.heap_size = heap_size;
        self.last_tx = 0;
        self.epoch += 1;
        self.image = vec![0u8; heap_size as usize];
        self.digests.clear();
    }

    /// Decides whether the whole commit `c` may be applied, without changing anything.
    pub fn judge(&self, c: &Commit) -> Verdict {
        self.judge_tx(&[], c)
    }

    /// May `p` join the streamed transaction whose earlier parts are `pending`? `Ok(true)`:
    /// yes, and it is new (log it); `Ok(false)`: yes, but it belongs to a transaction
    /// already applied (a resend; its end decides).
    pub fn judge_part(&self, pending: &[Commit], p: &Commit) -> Result<bool, (ErrorCode, String)> {
        let CommitKind::Part { index } = p.kind else {
            return Err((ErrorCode::Malformed, "not a commit part".into()));
        };
        if index as usize != pending.len() {
            return Err((
                ErrorCode::OutOfOrder,
                format!(
                    "part {index} of tx {} arrived after {} parts",
                    p.tx_id,
                    pending.len()
                ),
            ));
        }
        if let Some(first) = pending.first() {
            if (first.tx_id, first.epoch) != (p.tx_id, p.epoch) {
                return Err((
                    ErrorCode::OutOfOrder,
                    format!(
                        "part {index} belongs to tx {}, the parts before it to tx {}",
                        p.tx_id, first.tx_id
                    ),
                ));
            }
        }
        match self.judge_tx(&[], p) {
            Verdict::Apply => Ok(true),
            Verdict::Refuse(code, why) => match code {
                // Parts cannot be matched against a digest: the end does that.
                ErrorCode::Replayed => Ok(false),
                _ => Err((code, why)),
            },
            Verdict::Duplicate => Ok(false),
        }
    }

    /// Decides whether the transaction made of `parts` (streamed `CommitPart`s, in order)
    /// and its last frame `c` (a `CommitEnd`, or a whole `Commit` without parts) may be
    /// applied, without changing anything.
    pub fn judge_tx(&self, parts: &[Commit], c: &Commit) -> Verdict {
        let expected = match c.kind {
            CommitKind::Whole | CommitKind::Part { .. } => 0,
            CommitKind::End { parts } => parts as usize,
        };
        if parts.len() != expected {
            return Verdict::Refuse(
                ErrorCode::OutOfOrder,
                format!(
                    "tx {} ends after {} parts but announces {expected}",
                    c.tx_id,
                    parts.len()
                ),
            );
        }
        if let Some(p) = parts.iter().enumerate().find(|(i, p)| {
            (p.tx_id, p.epoch, p.kind) != (c.tx_id, c.epoch, CommitKind::Part { index: *i as u32 })
        }) {
            return Verdict::Refuse(
                ErrorCode::OutOfOrder,
                format!("part {} does not belong to tx {}", p.0, c.tx_id),
            );
        }
        if !self.is_initialized() {
            return Verdict::Refuse(ErrorCode::Empty, "the backup holds no heap yet".into());
        }
        if c.epoch != self.epoch {
            return Verdict::Refuse(
                ErrorCode::Fenced,
                format!(
                    "commit of tx {} carries epoch {}, the backup is at epoch {}: this primary was fenced",
                    c.tx_id, c.epoch, self.epoch
                ),
            );
        }
        if c.tx_id <= self.last_tx {
            let back = (self.last_tx - c.tx_id) as usize;
            let digest = tx_digest(parts, c);
            return match self
                .digests
                .len()
                .checked_sub(back + 1)
                .map(|i| self.digests[i])
            {
                Some((id, d)) if id == c.tx_id && d == digest => Verdict::Duplicate,
                _ => Verdict::Refuse(
                    ErrorCode::Replayed,
                    format!(
                        "tx {} was already applied (last tx {}) and this one differs or is too old",
                        c.tx_id, self.last_tx
                    ),
                ),
            };
        }
        if c.tx_id != self.last_tx + 1 {
            return Verdict::Refuse(
                ErrorCode::OutOfOrder,
                format!(
                    "tx {} does not follow the last tx {}",
                    c.tx_id, self.last_tx
                ),
            );
        }
        if let Some((off, len)) = parts
            .iter()
            .chain([c])
            .find_map(|p| p.out_of_bounds(self.heap_size))
        {
            return Verdict::Refuse(
                ErrorCode::OutOfBounds,
                format!(
                    "run of {len} bytes at {off} lies outside the {}-byte heap",
                    self.heap_size
                ),
            );
        }
        Verdict::Apply
    }

    /// Applies a whole commit that [`judge`](Self::judge) accepted.
    pub fn apply(&mut self, c: &Commit) {
        self.apply_tx(&[], c)
    }

    /// Applies a transaction that [`judge_tx`](Self::judge_tx) accepted.
    pub fn apply_tx(&mut self, parts: &[Commit], c: &Commit) {
        debug_assert_eq!(self.judge_tx(parts, c), Verdict::Apply);
        // The cheap half of the judgement, kept in release builds: a transaction applied
        // out of turn (a fenced epoch, a reused or skipped id) would leave the image
        // disagreeing with the log's replay.
        assert!(
            c.epoch == self.epoch && c.tx_id == self.last_tx + 1,
            "tx {} of epoch {} applied out of turn (last tx {}, epoch {})",
            c.tx_id,
            c.epoch,
            self.last_tx,
            self.epoch
        );
        for p in parts.iter().chain([c]) {
            for (off, data) in p.runs() {
                let off = off as usize;
                self.image[off..off + data.len()].copy_from_slice(data);
            }
        }
        self.last_tx = c.tx_id;
        self.digests.push_back((c.tx_id, tx_digest(parts, c)));
        if self.digests.len() > DIGEST_WINDOW {
            self.digests.pop_front();
        }
    }
}

/// CRC of a transaction's frame payloads in order (of the payload alone for a whole commit).
fn tx_digest(parts: &[Commit], c: &Commit) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts.iter().chain([c]) {
        h.update(&p.payload);
    }
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::DiffRun;
    use crate::wire::{self, FrameReader, Message};

    fn commit(tx: u64, epoch: u64, off: u64, byte: u8, heap: &mut [u8]) -> Commit {
        heap[off as usize] = byte;
        let mut buf = Vec::new();
        wire::encode_commit(
            tx,
            epoch,
            &[DiffRun {
                offset: off,
                len: 1,
            }],
            heap,
            &mut buf,
        );
        match FrameReader::default().read(&mut &buf[..]).unwrap() {
            Message::Commit(c) => c,
            m => panic!("{m:?}"),
        }
    }

    /// One commit frame of `kind` for tx `tx` writing `byte` at `off`.
    fn frame(kind: CommitKind, tx: u64, off: u64, byte: u8, heap: &mut [u8]) -> Commit {
        heap[off as usize] = byte;
        let mut buf = Vec::new();
        let run = [DiffRun {
            offset: off,
            len: 1,
        }];
        wire::encode_commit_frame(kind, tx, 1, &run, heap, &mut buf).unwrap();
        match FrameReader::default().read(&mut &buf[..]).unwrap() {
            Message::Commit(c) => c,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_streamed_transaction_is_judged_and_applied_whole() {
        let mut r = ReplicaState::default();
        r.reset(64);
        let mut heap = vec![0u8; 64];
        let p0 = frame(CommitKind::Part { index: 0 }, 1, 1, 5, &mut heap);
        let p1 = frame(CommitKind::Part { index: 1 }, 1, 2, 6, &mut heap);
        let end = frame(CommitKind::End { parts: 2 }, 1, 3, 7, &mut heap);
        assert_eq!(r.judge_part(&[], &p0), Ok(true));
        assert!(r.judge_part(&[], &p1).is_err(), "part 1 first");
        assert_eq!(r.judge_part(std::slice::from_ref(&p0), &p1), Ok(true));
        let parts = [p0.clone(), p1.clone()];
        assert!(matches!(
            r.judge_tx(&parts[..1], &end),
            Verdict::Refuse(ErrorCode::OutOfOrder, _)
        ));
        assert!(matches!(
            r.judge_tx(&[p1.clone(), p0.clone()], &end),
            Verdict::Refuse(ErrorCode::OutOfOrder, _)
        ));
        assert_eq!(r.judge_tx(&parts, &end), Verdict::Apply);
        r.apply_tx(&parts, &end);
        assert_eq!((&r.image[..4], r.last_tx), (&[0, 5, 6, 7][..], 1));
        // The same frames again: a resend, acknowledged without a change; other frames
        // under the applied id: a replay.
        assert_eq!(r.judge_part(&[], &p0), Ok(false));
        assert_eq!(r.judge_tx(&parts, &end), Verdict::Duplicate);
        let other = frame(CommitKind::End { parts: 2 }, 1, 3, 8, &mut heap.clone());
        assert!(matches!(
            r.judge_tx(&parts, &other),
            Verdict::Refuse(ErrorCode::Replayed, _)
        ));
    }

    #[test]
    fn rules_in_order() {
        let mut r = ReplicaState::default();
        let mut heap = vec![0u8; 64];
        let c1 = commit(1, 1, 3, 9, &mut heap);
        assert!(matches!(r.judge(&c1), Verdict::Refuse(ErrorCode::Empty, _)));
        r.reset(64);
        assert_eq!(r.epoch, 1);
        assert_eq!(r.judge(&c1), Verdict::Apply);
        r.apply(&c1);
        assert_eq!(r.image[3], 9);
        assert_eq!(r.judge(&c1), Verdict::Duplicate);
        let mut other = heap.clone();
        let c1b = commit(1, 1, 4, 1, &mut other);
        assert!(matches!(
            r.judge(&c1b),
            Verdict::Refuse(ErrorCode::Replayed, _)
        ));
        let c3 = commit(3, 1, 5, 1, &mut heap.clone());
        assert!(matches!(
            r.judge(&c3),
            Verdict::Refuse(ErrorCode::OutOfOrder, _)
        ));
        let stale = commit(2, 0, 5, 1, &mut heap.clone());
        assert!(matches!(
            r.judge(&stale),
            Verdict::Refuse(ErrorCode::Fenced, _)
        ));
        let mut big = vec![0u8; 128];
        let outside = commit(2, 1, 100, 1, &mut big);
        assert!(matches!(
            r.judge(&outside),
            Verdict::Refuse(ErrorCode::OutOfBounds, _)
        ));
        assert_eq!((r.last_tx, r.image[4], r.image[5]), (1, 0, 0));
    }
}
