//! Test builds only (cargo feature `check-faults`, binary `rebound-blk-faulty`): turn
//! off one correctness check of the exclusive cache, to show that the stress test
//! (`tests/hcache_stress.rs`) catches the wrong data that check keeps out, as Hcache's
//! section 6.2 did. `REBOUND_BLK_SKIP_CHECK` names the check; a normal build has none of
//! this (every check is unconditional there).

/// What can be turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// An evicted page (or its copy) must hash to its block's last I/O.
    Content,
    /// No write to the block may have begun since that I/O (its generation).
    Generation,
    /// P2S and S2P must agree; a displaced block must not be in a guest page again.
    /// (This keeps the cache exclusive; correctness already follows from the content
    /// and generation checks: a page that passes both equals its block on the disk.)
    Remap,
    /// A copy counts only if its notice's seq word still says so after it was read.
    /// (A torn copy fails the content check anyway: this one names the refusal.)
    CopySeq,
    /// A write drops the block's cached copy.
    WriteInvalidate,
    /// The ring is taken before every request (off: only when the daemon asks, every
    /// 20 ms: late notices, as a guest notifying asynchronously would send them).
    Order,
}

impl Check {
    pub const ALL: [(Check, &'static str); 6] = [
        (Check::Content, "content"),
        (Check::Generation, "generation"),
        (Check::Remap, "remap"),
        (Check::CopySeq, "copy_seq"),
        (Check::WriteInvalidate, "write_invalidate"),
        (Check::Order, "order"),
    ];
}

/// Whether check `c` is turned off (always false without the feature).
#[cfg(not(feature = "check-faults"))]
#[inline(always)]
pub fn skipped(_c: Check) -> bool {
    false
}

/// Whether check `c` is turned off: named in `REBOUND_BLK_SKIP_CHECK` (comma-separated).
#[cfg(feature = "check-faults")]
pub fn skipped(c: Check) -> bool {
    static OFF: std::sync::OnceLock<Vec<Check>> = std::sync::OnceLock::new();
    OFF.get_or_init(|| {
        let v = std::env::var("REBOUND_BLK_SKIP_CHECK").unwrap_or_default();
        let off: Vec<Check> = v
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                Check::ALL
                    .iter()
                    .find(|(_, n)| *n == s)
                    .map(|(c, _)| *c)
                    .unwrap_or_else(|| panic!("REBOUND_BLK_SKIP_CHECK: no check {s:?}"))
            })
            .collect();
        if !off.is_empty() {
            tracing::warn!("test build: correctness checks off: {off:?}");
        }
        off
    })
    .contains(&c)
}
