//! Byte-level diff of written pages against the last committed state.
//!
//! The dirty-tracking engines tell us which pages were written; most of a written page is
//! usually unchanged (a list insert writes a few words). Shipping whole pages would cost
//! 4 KiB per page, so we compare each dirty page with its shadow copy and ship only the
//! byte ranges that differ. Ranges separated by fewer than [`MERGE_GAP`] equal bytes are
//! merged: a run header on the wire costs 12 bytes, so a short equal gap is cheaper to
//! ship than a new header.
//!
//! Speed: each 64-byte block of the two copies becomes a 64-bit mask of differing bytes
//! (one AVX-512BW compare when the CPU has it, else byte compares and movemask over
//! 32-byte AVX2 or 16-byte SSE2 vectors, SSE2 being part of every x86-64); runs are read off the mask with trailing-zero counts.
//! No branch depends on where the writes fell inside a block, so many small writes cost
//! little more than a few: one pass of vector loads over both copies
//! (`examples/diff_speed.rs`). Cold pages are bound by memory bandwidth.

/// Runs closer than this many equal bytes are merged into one.
pub const MERGE_GAP: u64 = 16;

const BLOCK: usize = 64;

/// A byte range of the heap whose contents changed in a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffRun {
    /// Byte offset from the start of the heap.
    pub offset: u64,
    /// Length in bytes (never zero).
    pub len: u32,
}

impl DiffRun {
    /// One past the last byte of the run.
    pub fn end(&self) -> u64 {
        self.offset + u64::from(self.len)
    }
}

/// Appends to `out` the byte runs where `current` differs from `shadow` inside `pages`.
///
/// `pages` are page indexes; pass them in ascending order so that runs spanning a page
/// boundary merge (any order gives correct runs). Runs already in `out` are never changed
/// (the caller may have shipped them). Runs never exceed a `u32` length.
///
/// # Panics
/// If the two regions differ in length, `page_size` is not a non-zero multiple of 64,
/// or a page lies outside the region: these are caller bugs, not input errors.
pub fn diff_pages(
    shadow: &[u8],
    current: &[u8],
    pages: &[usize],
    page_size: usize,
    out: &mut Vec<DiffRun>,
) {
    assert_eq!(
        shadow.len(),
        current.len(),
        "shadow and current differ in length"
    );
    assert!(
        page_size > 0 && page_size.is_multiple_of(BLOCK),
        "page size {page_size} is not a multiple of {BLOCK}"
    );
    let bounds = |page: usize| {
        page.checked_mul(page_size)
            .filter(|s| s + page_size <= current.len())
            .map(|s| s..s + page_size)
            .unwrap_or_else(|| panic!("page {page} lies outside the region"))
    };
    let mut open = None;
    for (i, &page) in pages.iter().enumerate() {
        let r = bounds(page);
        // The next page's lines are requested while this one is compared: a cold page
        // then costs bandwidth, not a miss latency per line (about 30% less time).
        let next = pages.get(i + 1).map(|&p| {
            let n = bounds(p);
            (&shadow[n.clone()], &current[n])
        });
        let span = Span {
            a: &shadow[r.clone()],
            b: &current[r.clone()],
            base: r.start as u64,
            next,
        };
        diff_range(span, out, &mut open);
    }
    if let Some(r) = open {
        out.push(r);
    }
}

/// Asks the CPU to start loading `page` of both regions into its cache, for a caller that
/// diffs a list of pages in pieces: call it with the first page of the next piece before
/// diffing the current one. Does nothing for a page outside the regions.
pub fn prefetch_page(shadow: &[u8], current: &[u8], page: usize, page_size: usize) {
    let Some(r) = page
        .checked_mul(page_size)
        .map(|s| s..s.saturating_add(page_size))
    else {
        return;
    };
    if let (Some(a), Some(b)) = (shadow.get(r.clone()), current.get(r)) {
        for (x, y) in a.chunks(BLOCK).zip(b.chunks(BLOCK)) {
            prefetch(x);
            prefetch(y);
        }
    }
}

/// A hint to load the cache line holding `bytes[0]`; no effect on what the program sees.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes no memory; the address is inside a live
    // slice anyway. SSE is part of every x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// The two copies of the page to request while the current one is compared.
type Next<'a> = Option<(&'a [u8], &'a [u8])>;

/// One page-aligned range to diff: its two copies, its offset in the heap, and the page
/// to prefetch meanwhile.
#[derive(Clone, Copy)]
struct Span<'a> {
    a: &'a [u8],
    b: &'a [u8],
    base: u64,
    next: Next<'a>,
}

/// The run being grown; it goes into the output once a later difference cannot join it.
type Open = Option<DiffRun>;

/// Diffs one page-aligned range with the widest vector compare the CPU has.
fn diff_range(s: Span, out: &mut Vec<DiffRun>, open: &mut Open) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU supports AVX-512F/BW (BW implies F), the only precondition.
            unsafe { diff_range_avx512(s, out, open) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above), the only precondition.
            unsafe { diff_range_avx2(s, out, open) };
            return;
        }
    }
    scan::<PLAIN>(s, out, open);
}

/// Which compare [`scan`] is built with.
const PLAIN: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// The scan compiled with AVX2 enabled, so its block masks use 32-byte compares.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn diff_range_avx2(s: Span, out: &mut Vec<DiffRun>, open: &mut Open) {
    scan::<AVX2>(s, out, open);
}

/// The scan compiled with AVX-512BW: one 64-byte compare gives a block's mask.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn diff_range_avx512(s: Span, out: &mut Vec<DiffRun>, open: &mut Open) {
    scan::<AVX512>(s, out, open);
}

/// Bit i set where byte i of two 64-byte blocks differs, with the compare `LEVEL` names
/// (the AVX levels are only instantiated inside the functions that checked for them).
#[inline(always)]
fn differing_bytes<const LEVEL: u8>(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    match LEVEL {
        // SAFETY: this instance is inlined only into `diff_range_avx512`, which runs only
        // after AVX-512BW was detected.
        AVX512 => return unsafe { differing_bytes_avx512(a, b) },
        // SAFETY: likewise inside `diff_range_avx2`, after AVX2 was detected.
        AVX2 => return unsafe { differing_bytes_avx2(a, b) },
        _ => {}
    }
    differing_bytes_plain(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn differing_bytes_avx512(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{_mm512_cmpneq_epi8_mask, _mm512_loadu_si512};
    // SAFETY: each unaligned load reads the 64 bytes of the arrays `a` and `b` borrow.
    let (x, y) = unsafe {
        (
            _mm512_loadu_si512(a.as_ptr().cast()),
            _mm512_loadu_si512(b.as_ptr().cast()),
        )
    };
    _mm512_cmpneq_epi8_mask(x, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn differing_bytes_avx2(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{__m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8};
    let (pa, pb) = (a.as_ptr().cast::<__m256i>(), b.as_ptr().cast::<__m256i>());
    // SAFETY: the two unaligned loads per side read bytes 0..32 and 32..64 of the 64-byte
    // arrays that `a` and `b` borrow for this call.
    let (lo, hi) = unsafe {
        (
            _mm256_cmpeq_epi8(_mm256_loadu_si256(pa), _mm256_loadu_si256(pb)),
            _mm256_cmpeq_epi8(_mm256_loadu_si256(pa.add(1)), _mm256_loadu_si256(pb.add(1))),
        )
    };
    let eq = u64::from(_mm256_movemask_epi8(lo) as u32)
        | u64::from(_mm256_movemask_epi8(hi) as u32) << 32;
    !eq
}

/// SSE2 (part of every x86-64): four 16-byte compares.
#[cfg(target_arch = "x86_64")]
#[inline]
fn differing_bytes_plain(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{__m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8};
    let (pa, pb) = (a.as_ptr().cast::<__m128i>(), b.as_ptr().cast::<__m128i>());
    let mut eq = 0u64;
    for i in 0..BLOCK / 16 {
        // SAFETY: SSE2 is part of the x86_64 baseline; each unaligned load reads the 16
        // bytes at lane i*16 < 64 of the 64-byte arrays `a` and `b` borrow for this call.
        let m = unsafe {
            _mm_movemask_epi8(_mm_cmpeq_epi8(
                _mm_loadu_si128(pa.add(i)),
                _mm_loadu_si128(pb.add(i)),
            ))
        };
        eq |= u64::from(m as u16) << (16 * i);
    }
    !eq
}

/// Portable: one bit per byte from word XORs.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn differing_bytes_plain(a: &[u8; BLOCK], b: &[u8; BLOCK]) -> u64 {
    let mut d = 0u64;
    for i in 0..BLOCK {
        d |= u64::from(a[i] != b[i]) << i;
    }
    d
}

/// Diffs one page-aligned range; `base` is its offset in the heap. Each 64-byte block
/// gives a 64-bit mask of differing bytes; runs are read off the mask with bit counts.
#[inline(always)]
fn scan<const LEVEL: u8>(s: Span, out: &mut Vec<DiffRun>, open: &mut Open) {
    let Span { a, b, base, next } = s;
    // Fixed-size chunks: no length checks inside the hot loop; the open run lives in a
    // local, not in `out`, while it grows.
    let (ablocks, _) = a.as_chunks::<BLOCK>();
    let (bblocks, _) = b.as_chunks::<BLOCK>();
    let (na, nb) = next.unwrap_or_default();
    let (na, nb) = (na.as_chunks::<BLOCK>().0, nb.as_chunks::<BLOCK>().0);
    let mut run = *open;
    // Two passes per 64 blocks: the compares first, with no branch on the data, so the
    // loads of cold lines overlap; then the runs, visiting only blocks that differ (one
    // hard-to-predict branch per differing block instead of one per block).
    let mut masks = [0u64; 64];
    for (g, (ag, bg)) in ablocks.chunks(64).zip(bblocks.chunks(64)).enumerate() {
        let mut nonzero = 0u64;
        for (i, (ablk, bblk)) in ag.iter().zip(bg).enumerate() {
            let n = g * 64 + i;
            if let (Some(x), Some(y)) = (na.get(n), nb.get(n)) {
                prefetch(x);
                prefetch(y);
            }
            let d = differing_bytes::<LEVEL>(ablk, bblk);
            masks[i] = d;
            nonzero |= u64::from(d != 0) << i;
        }
        while nonzero != 0 {
            let i = nonzero.trailing_zeros() as usize;
            nonzero &= nonzero - 1;
            let mut d = masks[i];
            let blk = base + ((g * 64 + i) * BLOCK) as u64;
            while d != 0 {
                let first = d.trailing_zeros();
                let len = (!(d >> first)).trailing_zeros(); // 64 - first when the run reaches the end
                add_range(
                    out,
                    &mut run,
                    blk + u64::from(first),
                    blk + u64::from(first + len),
                );
                // Clear bits first..first+len (shifts of 64 would overflow: use checked).
                d &= u64::MAX.checked_shl(first + len).unwrap_or(0);
            }
        }
    }
    *open = run;
}

/// Adds the differing range `[first, last)` to the open run when the equal gap between
/// them is shorter than [`MERGE_GAP`], else closes that run into `out` and opens this one.
#[inline(always)]
fn add_range(out: &mut Vec<DiffRun>, open: &mut Open, first: u64, last: u64) {
    if let Some(prev) = open {
        let prev_end = prev.end();
        if first >= prev_end && first - prev_end < MERGE_GAP {
            if let Ok(len) = u32::try_from(last - prev.offset) {
                prev.len = len;
                return;
            }
        }
        out.push(*prev);
    }
    *open = Some(DiffRun {
        offset: first,
        len: (last - first) as u32,
    });
}

/// Total bytes covered by `runs`.
pub fn run_bytes(runs: &[DiffRun]) -> u64 {
    runs.iter().map(|r| u64::from(r.len)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PS: usize = 4096;

    fn apply(shadow: &mut [u8], current: &[u8], runs: &[DiffRun]) {
        for r in runs {
            let (s, e) = (r.offset as usize, r.end() as usize);
            shadow[s..e].copy_from_slice(&current[s..e]);
        }
    }

    /// Maximal ranges of differing bytes, found one byte at a time (the reference).
    fn exact_runs(a: &[u8], b: &[u8]) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                let s = i;
                while i < a.len() && a[i] != b[i] {
                    i += 1;
                }
                runs.push((s, i));
            } else {
                i += 1;
            }
        }
        runs
    }

    /// Pages of other sizes than 4 KiB (fewer than, more than, and not a multiple of the
    /// 64 blocks compared per pass) give the runs of the byte-by-byte reference.
    #[test]
    fn any_multiple_of_64_works_as_page_size() {
        let mut rng = fastrand::Rng::with_seed(7);
        for ps in [64, 192, 4096 + 3 * 64, 16384] {
            let shadow: Vec<u8> = (0..8 * ps).map(|_| rng.u8(..)).collect();
            let mut cur = shadow.clone();
            for _ in 0..200 {
                let i = rng.usize(..cur.len());
                cur[i] = cur[i].wrapping_add(1);
            }
            let mut out = Vec::new();
            diff_pages(&shadow, &cur, &(0..8).collect::<Vec<_>>(), ps, &mut out);
            let mut applied = shadow.clone();
            apply(&mut applied, &cur, &out);
            assert_eq!(applied, cur, "page size {ps}");
            // Every reference run lies inside one shipped run.
            for (s, e) in exact_runs(&shadow, &cur) {
                assert!(
                    out.iter()
                        .any(|r| r.offset as usize <= s && e <= r.end() as usize),
                    "page size {ps}: {s}..{e} not covered"
                );
            }
        }
    }

    #[test]
    fn single_byte_change_gives_one_byte_run() {
        let shadow = vec![0u8; 2 * PS];
        let mut cur = shadow.clone();
        cur[PS + 13] = 7;
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[0, 1], PS, &mut out);
        assert_eq!(
            out,
            vec![DiffRun {
                offset: PS as u64 + 13,
                len: 1
            }]
        );
    }

    #[test]
    fn gaps_below_16_merge_and_16_split() {
        let shadow = vec![0u8; PS];
        let mut cur = shadow.clone();
        cur[100] = 1;
        cur[115] = 1; // 14 equal bytes between: merged
        cur[132] = 1; // 16 equal bytes between: separate
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[0], PS, &mut out);
        assert_eq!(
            out,
            vec![
                DiffRun {
                    offset: 100,
                    len: 16
                },
                DiffRun {
                    offset: 132,
                    len: 1
                }
            ]
        );
    }

    #[test]
    fn runs_merge_across_page_boundary() {
        let shadow = vec![0u8; 2 * PS];
        let mut cur = shadow.clone();
        cur[PS - 1] = 1;
        cur[PS] = 1;
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[0, 1], PS, &mut out);
        assert_eq!(
            out,
            vec![DiffRun {
                offset: PS as u64 - 1,
                len: 2
            }]
        );
    }

    /// A caller diffing in chunks may already have shipped the runs of the first call: a
    /// second call never extends them, even when its first run could merge.
    #[test]
    fn runs_from_an_earlier_call_are_left_alone() {
        let shadow = vec![0u8; 2 * PS];
        let mut cur = shadow.clone();
        cur[PS - 1] = 1;
        cur[PS] = 1;
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[0], PS, &mut out);
        diff_pages(&shadow, &cur, &[1], PS, &mut out);
        assert_eq!(
            out,
            vec![
                DiffRun {
                    offset: PS as u64 - 1,
                    len: 1
                },
                DiffRun {
                    offset: PS as u64,
                    len: 1
                }
            ]
        );
    }

    #[test]
    fn only_listed_pages_are_compared() {
        let shadow = vec![0u8; 3 * PS];
        let mut cur = shadow.clone();
        cur[10] = 1;
        cur[2 * PS + 10] = 1;
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[2], PS, &mut out);
        assert_eq!(
            out,
            vec![DiffRun {
                offset: 2 * PS as u64 + 10,
                len: 1
            }]
        );
    }

    #[test]
    fn whole_page_rewrite_is_one_run() {
        let shadow = vec![0u8; PS];
        let cur = vec![0xffu8; PS];
        let mut out = Vec::new();
        diff_pages(&shadow, &cur, &[0], PS, &mut out);
        assert_eq!(
            out,
            vec![DiffRun {
                offset: 0,
                len: PS as u32
            }]
        );
    }

    #[test]
    #[should_panic(expected = "outside the region")]
    fn page_outside_region_panics() {
        let a = vec![0u8; PS];
        diff_pages(&a, &a, &[1], PS, &mut Vec::new());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn runs_reproduce_current_and_stay_small(
            seed in any::<u64>(),
            npages in 1usize..6,
            writes in 0usize..200,
            maxlen in 1usize..40,
        ) {
            let mut rng = fastrand::Rng::with_seed(seed);
            let len = npages * PS;
            let shadow: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let mut cur = shadow.clone();
            for _ in 0..writes {
                let off = rng.usize(..len);
                let n = rng.usize(1..=maxlen).min(len - off);
                for b in &mut cur[off..off + n] {
                    // Writes of equal values happen in real programs too.
                    *b = if rng.u8(..4) == 0 { *b } else { rng.u8(..) };
                }
            }
            let pages: Vec<usize> = (0..npages).collect();
            let mut out = Vec::new();
            diff_pages(&shadow, &cur, &pages, PS, &mut out);

            let mut applied = shadow.clone();
            apply(&mut applied, &cur, &out);
            prop_assert_eq!(&applied, &cur);

            // Every compare level this CPU has gives the same runs as the one dispatched.
            let (mut plain, mut avx2) = (Vec::new(), Vec::new());
            let (mut plain_open, mut avx2_open) = (None, None);
            for &p in &pages {
                let r = p * PS..(p + 1) * PS;
                let (a, b) = (&shadow[r.clone()], &cur[r.clone()]);
                // Prefetching the first page again changes nothing but the cache.
                let next = Some((&shadow[..PS], &cur[..PS]));
                let span = Span { a, b, base: r.start as u64, next };
                scan::<PLAIN>(span, &mut plain, &mut plain_open);
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: AVX2 was detected just above.
                    unsafe { diff_range_avx2(Span { next: None, ..span }, &mut avx2, &mut avx2_open) };
                }
            }
            plain.extend(plain_open);
            avx2.extend(avx2_open);
            prop_assert_eq!(&plain, &out);
            if !avx2.is_empty() || out.is_empty() {
                prop_assert_eq!(&avx2, &out);
            }

            let exact = exact_runs(&shadow, &cur);
            let changed: usize = exact.iter().map(|(s, e)| e - s).sum();
            let shipped = run_bytes(&out) as usize;
            // Each merge swallows a gap of at most 15 equal bytes.
            prop_assert!(shipped <= changed + 15 * (exact.len() - out.len()));
            for w in out.windows(2) {
                prop_assert!(w[1].offset >= w[0].end() + MERGE_GAP);
            }
            for r in &out {
                let (s, e) = (r.offset as usize, r.end() as usize - 1);
                prop_assert!(shadow[s] != cur[s] && shadow[e] != cur[e]);
            }
        }
    }
}
