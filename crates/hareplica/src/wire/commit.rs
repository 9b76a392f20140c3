//! Commit payloads: the transaction's runs, encoded straight from the heap.

use super::{begin_frame, finish_frame, FrameType, WireError, MAX_COMMIT_PAYLOAD};
use crate::diff::DiffRun;

/// Longest LEB128 encoding of a u64.
pub(super) const MAX_VARINT: usize = 10;

/// Which frame carried a commit's runs: a transaction is one `Commit` frame, or is
/// streamed as `CommitPart` frames (numbered from 0) closed by a `CommitEnd` that counts
/// them, so the backup validates and logs the first parts while the primary still diffs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitKind {
    Whole,
    Part { index: u32 },
    End { parts: u32 },
}

impl CommitKind {
    pub fn frame_type(self) -> FrameType {
        match self {
            CommitKind::Whole => FrameType::Commit,
            CommitKind::Part { .. } => FrameType::CommitPart,
            CommitKind::End { .. } => FrameType::CommitEnd,
        }
    }

    /// The varint that precedes a part's or an end's commit payload.
    fn prefix(self) -> Option<u32> {
        match self {
            CommitKind::Whole => None,
            CommitKind::Part { index } => Some(index),
            CommitKind::End { parts } => Some(parts),
        }
    }
}

/// A commit whose run structure has been validated (bounds against a heap are not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub kind: CommitKind,
    pub tx_id: u64,
    pub epoch: u64,
    pub run_count: u32,
    /// The whole frame payload, header (and part prefix) included.
    pub payload: Vec<u8>,
    /// Where the first run header starts in `payload`.
    runs_at: usize,
    /// One past the highest byte any run writes (0 without runs).
    max_end: u64,
    data_bytes: u64,
}

/// The runs of a parsed commit, decoded again on the fly: parsing only validates, so the
/// backup acknowledges without first building a list it would read once.
pub struct Runs<'a> {
    payload: &'a [u8],
    pos: usize,
    prev_end: u64,
    left: u32,
}

impl<'a> Iterator for Runs<'a> {
    type Item = (u64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // `parse` validated every header and length, so this cannot fail; stop if it did.
        let (off, len) = run_header_fast(self.payload, &mut self.pos, self.prev_end)?;
        let data = self.payload.get(self.pos..self.pos + len)?;
        self.pos += len;
        self.prev_end = off + len as u64;
        Some((off, data))
    }
}

/// Extra bytes kept at the end of the encode buffer for the fixed-size copy of short runs.
const SLACK: usize = 16;

/// Writes a varint at `pos` of a buffer with room for it; returns the position after it.
#[inline]
pub(super) fn put_varint_at(buf: &mut [u8], mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        buf[pos] = v as u8 | 0x80;
        v >>= 7;
        pos += 1;
    }
    buf[pos] = v as u8;
    pos + 1
}

pub(super) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Reads a varint at `*pos`; `None` when cut short or longer than a u64.
#[inline(always)]
pub(super) fn get_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    // Run headers are mostly 1- and 2-byte varints: decode those without the loop.
    match b.get(*pos..*pos + 2) {
        Some(&[b0, _]) if b0 < 0x80 => {
            *pos += 1;
            return Some(u64::from(b0));
        }
        Some(&[b0, b1]) if b1 < 0x80 => {
            *pos += 2;
            return Some(u64::from(b0 & 0x7f) | u64::from(b1) << 7);
        }
        _ => {}
    }
    let mut v = 0u64;
    for i in 0..MAX_VARINT {
        let byte = *b.get(*pos + i)?;
        if i == MAX_VARINT - 1 && byte > 1 {
            return None;
        }
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *pos += i + 1;
            return Some(v);
        }
    }
    None
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Decodes the run header at `*pos` given the previous run's end: (offset, len), or
/// `None` when it is malformed ([`run_header`] then says why).
#[inline(always)]
fn run_header_fast(b: &[u8], pos: &mut usize, prev_end: u64) -> Option<(u64, usize)> {
    let gap = get_varint(b, pos)?;
    let len = get_varint(b, pos)?;
    let off = prev_end.checked_add_signed(unzigzag(gap))?;
    let len = u32::try_from(len).ok().filter(|&l| l > 0)?;
    off.checked_add(u64::from(len))?;
    Some((off, len as usize))
}

/// [`run_header_fast`] with the reason for a malformed header (the slow path).
#[cold]
fn run_header(b: &[u8], pos: &mut usize, prev_end: u64) -> Result<(u64, usize), String> {
    let gap = get_varint(b, pos).ok_or("run gap is cut short or too long")?;
    let len = get_varint(b, pos).ok_or("run length is cut short or too long")?;
    let off = prev_end
        .checked_add_signed(unzigzag(gap))
        .ok_or_else(|| format!("run offset {prev_end}{:+} is outside u64", unzigzag(gap)))?;
    let len = u32::try_from(len).map_err(|_| format!("run length {len} exceeds u32"))?;
    if len == 0 {
        return Err("run of length 0".into());
    }
    off.checked_add(u64::from(len))
        .ok_or_else(|| format!("run at {off} overflows"))?;
    Ok((off, len as usize))
}

impl Commit {
    /// Parses and structurally validates a `Commit` frame's payload.
    pub fn parse(payload: Vec<u8>) -> Result<Commit, WireError> {
        Commit::parse_as(FrameType::Commit, payload)
    }

    /// Parses and structurally validates the payload of a `Commit`, `CommitPart` or
    /// `CommitEnd` frame.
    pub fn parse_as(ty: FrameType, payload: Vec<u8>) -> Result<Commit, WireError> {
        let bad = |why: String| WireError::Malformed { ty, why };
        let mut pos = 0;
        let mut field = |name: &str| {
            get_varint(&payload, &mut pos)
                .ok_or_else(|| bad(format!("{name} is cut short or too long")))
        };
        let small = |name: &str, v: u64| {
            u32::try_from(v).map_err(|_| bad(format!("{name} {v} exceeds u32")))
        };
        let kind = match ty {
            FrameType::CommitPart => CommitKind::Part {
                index: small("part index", field("part index")?)?,
            },
            FrameType::CommitEnd => CommitKind::End {
                parts: small("part count", field("part count")?)?,
            },
            _ => CommitKind::Whole,
        };
        let tx_id = field("tx id")?;
        let epoch = field("epoch")?;
        let run_count =
            u32::try_from(field("run count")?).map_err(|_| bad("run count exceeds u32".into()))?;
        let runs_at = pos;
        let (mut prev_end, mut max_end, mut data_bytes) = (0u64, 0u64, 0u64);
        for i in 0..run_count {
            let mut again = pos;
            let Some((off, len)) = run_header_fast(&payload, &mut pos, prev_end) else {
                let why = run_header(&payload, &mut again, prev_end)
                    .err()
                    .unwrap_or_default();
                return Err(bad(format!("run {i} of {run_count}: {why}")));
            };
            if payload.len() - pos < len {
                return Err(bad(format!(
                    "run {i} of {run_count}: {len} bytes announced, {} left",
                    payload.len() - pos
                )));
            }
            pos += len;
            prev_end = off + len as u64;
            max_end = max_end.max(prev_end);
            data_bytes += len as u64;
        }
        if pos != payload.len() {
            return Err(bad(format!("{} trailing bytes", payload.len() - pos)));
        }
        Ok(Commit {
            kind,
            tx_id,
            epoch,
            run_count,
            payload,
            runs_at,
            max_end,
            data_bytes,
        })
    }

    /// The runs as (heap offset, bytes).
    pub fn runs(&self) -> Runs<'_> {
        Runs {
            payload: &self.payload,
            pos: self.runs_at,
            prev_end: 0,
            left: self.run_count,
        }
    }

    /// The first run that does not fit in a heap of `heap_size` bytes, if any.
    pub fn out_of_bounds(&self, heap_size: u64) -> Option<(u64, usize)> {
        if self.max_end <= heap_size {
            return None;
        }
        self.runs()
            .find(|(off, d)| off + d.len() as u64 > heap_size)
            .map(|(off, d)| (off, d.len()))
    }

    /// Diff bytes carried (without headers).
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }
}

/// Encodes a commit frame straight from the heap into `buf`, returning the frame length,
/// or `None` when the payload would exceed [`MAX_COMMIT_PAYLOAD`].
///
/// # Panics
/// If a run lies outside `heap` (a caller bug: runs come from [`crate::diff_pages`]).
pub fn encode_commit(
    tx_id: u64,
    epoch: u64,
    runs: &[DiffRun],
    heap: &[u8],
    buf: &mut Vec<u8>,
) -> Option<usize> {
    buf.clear();
    encode_commit_frame(CommitKind::Whole, tx_id, epoch, runs, heap, buf)
}

/// Appends a commit frame of `kind` to `buf` (which may hold earlier frames of the same
/// transaction); returns this frame's length, or `None` (and `buf` as it was) when the
/// payload would exceed [`MAX_COMMIT_PAYLOAD`].
///
/// # Panics
/// If a run lies outside `heap`.
pub fn encode_commit_frame(
    kind: CommitKind,
    tx_id: u64,
    epoch: u64,
    runs: &[DiffRun],
    heap: &[u8],
    buf: &mut Vec<u8>,
) -> Option<usize> {
    let frame_start = buf.len();
    begin_frame(buf, kind.frame_type());
    if let Some(v) = kind.prefix() {
        put_varint(buf, u64::from(v));
    }
    put_varint(buf, tx_id);
    put_varint(buf, epoch);
    if encode_runs(runs, heap, buf).is_none()
        || buf.len() - frame_start - super::HEADER_LEN > MAX_COMMIT_PAYLOAD as usize
    {
        buf.truncate(frame_start);
        return None;
    }
    finish_frame(&mut buf[frame_start..]);
    Some(buf.len() - frame_start)
}

/// Appends the run count and the runs (headers and bytes taken from `heap`) to `buf`:
/// the part of a commit payload after its ids. `None`, with `buf` possibly extended,
/// when the runs' bytes alone exceed [`MAX_COMMIT_PAYLOAD`].
///
/// # Panics
/// If a run lies outside `heap`.
pub(super) fn encode_runs(runs: &[DiffRun], heap: &[u8], buf: &mut Vec<u8>) -> Option<()> {
    let data = crate::diff::run_bytes(runs);
    if data > u64::from(MAX_COMMIT_PAYLOAD) {
        return None;
    }
    put_varint(buf, runs.len() as u64);
    let bound = 2 * MAX_VARINT as u64 * runs.len() as u64 + data;
    // Encode into a zeroed buffer of the worst-case size by index, then cut it to what
    // was used: a run header and a short run cost a few stores, not a push per byte.
    let start = buf.len();
    let room = bound.min(u64::from(MAX_COMMIT_PAYLOAD)) as usize;
    buf.resize(start + room + SLACK, 0);
    let mut pos = start;
    let mut prev_end = 0u64;
    for r in runs {
        // Only when the worst case exceeds the payload cap can the room run out.
        if pos + 2 * MAX_VARINT + (r.len as usize).max(SLACK) > buf.len() {
            return None;
        }
        pos = put_varint_at(buf, pos, zigzag(r.offset.wrapping_sub(prev_end) as i64));
        pos = put_varint_at(buf, pos, u64::from(r.len));
        let (off, len) = (r.offset as usize, r.len as usize);
        match heap.get(off..off + SLACK) {
            // Short runs: one fixed-size copy (the bytes past `len` are overwritten next).
            Some(src) if len <= SLACK => buf[pos..pos + SLACK].copy_from_slice(src),
            _ => buf[pos..pos + len].copy_from_slice(&heap[off..off + len]),
        }
        pos += len;
        prev_end = r.end();
    }
    buf.truncate(pos);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_roundtrip(v in any::<u64>(), d in any::<i64>()) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            put_varint(&mut b, zigzag(d));
            let mut pos = 0;
            prop_assert_eq!(get_varint(&b, &mut pos), Some(v));
            prop_assert_eq!(get_varint(&b, &mut pos).map(unzigzag), Some(d));
            prop_assert_eq!(pos, b.len());
        }

        #[test]
        fn runs_in_any_order_roundtrip(offs in proptest::collection::vec((0u64..60_000, 1u32..100), 0..20)) {
            let heap: Vec<u8> = (0..60_100u32).map(|i| (i * 7) as u8).collect();
            let runs: Vec<DiffRun> = offs.iter().map(|&(offset, len)| DiffRun { offset, len }).collect();
            let mut buf = Vec::new();
            encode_commit(3, 4, &runs, &heap, &mut buf).unwrap();
            let c = Commit::parse(buf[super::super::HEADER_LEN..].to_vec()).unwrap();
            let got: Vec<(u64, Vec<u8>)> = c.runs().map(|(o, d)| (o, d.to_vec())).collect();
            let want: Vec<(u64, Vec<u8>)> = runs.iter()
                .map(|r| (r.offset, heap[r.offset as usize..r.end() as usize].to_vec())).collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn overlong_and_cut_varints_are_refused() {
        let mut pos = 0;
        assert_eq!(get_varint(&[0x80; 11], &mut pos), None);
        assert_eq!(
            get_varint(
                &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                &mut pos
            ),
            None
        );
        assert_eq!(get_varint(&[0x80], &mut pos), None);
        assert_eq!(pos, 0);
    }

    #[test]
    fn cut_headers_are_refused() {
        for (bytes, needle) in [
            (&[][..], "tx id"),
            (&[5][..], "epoch"),
            (&[5, 1][..], "run count"),
            (&[5, 1, 0x80][..], "run count"),
            (&[5, 1, 0xff, 0xff, 0xff, 0xff, 0x7f][..], "exceeds u32"),
        ] {
            let e = Commit::parse(bytes.to_vec()).unwrap_err().to_string();
            assert!(e.contains(needle), "{e} lacks {needle}");
        }
    }

    #[test]
    fn negative_offsets_and_zero_lengths_are_refused() {
        let mut p = vec![];
        for v in [9, 1, 1] {
            put_varint(&mut p, v); // tx 9, epoch 1, one run
        }
        let mut bad_neg = p.clone();
        put_varint(&mut bad_neg, zigzag(-5));
        put_varint(&mut bad_neg, 1);
        bad_neg.push(0);
        assert!(Commit::parse(bad_neg)
            .unwrap_err()
            .to_string()
            .contains("outside u64"));
        let mut zero = p.clone();
        put_varint(&mut zero, 0);
        put_varint(&mut zero, 0);
        assert!(Commit::parse(zero)
            .unwrap_err()
            .to_string()
            .contains("length 0"));
        let mut short = p;
        put_varint(&mut short, 0);
        put_varint(&mut short, 10);
        short.extend_from_slice(&[1; 9]);
        assert!(Commit::parse(short)
            .unwrap_err()
            .to_string()
            .contains("10 bytes announced"));
    }
}
