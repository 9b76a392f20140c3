//! The miss-ratio curve below the guest (Hcache section 3.4): while the cache is
//! exclusive, every read that reaches this disk missed the guest's memory, and every
//! eviction notice says which block left it. The [`ExclusiveTracer`] ranks each miss
//! among the evicted blocks, which gives the guest's misses at every memory size from
//! its current one up. A write puts a block back in the guest without a miss.
//!
//! One tracer per disk: its ranks count the evicted blocks of this disk only, which
//! is the guest's whole eviction order when this is the disk its file cache reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rebound_mrc::curve::offset::ExclusiveTracer;
use rebound_mrc::curve::MissRatioCurve;
use serde::{Deserialize, Serialize};

use crate::units::BLOCK;

/// Histogram buckets of the default tracer: 256 KiB, exact at each point.
pub const DEFAULT_STEP_BLOCKS: u64 = 64;

/// How the tracer samples and how fine its curve is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TraceConfig {
    /// Fraction of blocks traced (SHARDS' spatial sampling); 1: exact.
    pub rate: f64,
    /// Distance between two points of the curve, in blocks.
    pub step_blocks: u64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            rate: 1.0,
            step_blocks: DEFAULT_STEP_BLOCKS,
        }
    }
}

/// What the tracer has seen since it started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    pub config: TraceConfig,
    /// Reads that missed the guest (host-cache hits and disk reads alike).
    pub misses: u64,
    /// Blocks held as evicted (sampled ones only, when sampling).
    pub evicted_blocks: u64,
    /// Blocks reported evicted twice without a miss between: lost or reordered
    /// notices, which make the curve approximate.
    pub inconsistent_blocks: u64,
    /// Misses by the host-side size, in blocks (add the guest's memory for its
    /// curve); `None` before the first miss.
    pub curve: Option<MissRatioCurve>,
}

/// Errors of starting a tracer.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("bad sampling rate: {0}")]
    Rate(#[from] rebound_mrc::shards::ShardsError),
    #[error("a curve step must be 1 to 65536 blocks, not {0}")]
    Step(u64),
}

/// The tracer of one disk, fed by the cache on every access while it runs.
#[derive(Default)]
pub struct CurveTracer {
    on: AtomicBool,
    inner: Mutex<Option<(TraceConfig, ExclusiveTracer)>>,
}

impl CurveTracer {
    /// Starts afresh with `config` (what was traced so far is dropped).
    pub fn start(&self, config: TraceConfig) -> Result<(), TraceError> {
        if !(1..=65536).contains(&config.step_blocks) {
            return Err(TraceError::Step(config.step_blocks));
        }
        let t = ExclusiveTracer::sampled(config.rate, config.step_blocks)?;
        *self.inner.lock().expect("tracer lock") = Some((config, t));
        self.on.store(true, Ordering::Release);
        Ok(())
    }

    pub fn stop(&self) {
        self.on.store(false, Ordering::Release);
        *self.inner.lock().expect("tracer lock") = None;
    }

    pub fn running(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// One access of the cache's access-log kinds: `h`/`m` a read (a guest miss),
    /// `e` an eviction, `w` a write or discard.
    pub(crate) fn feed(&self, block: u64, kind: char) {
        if !self.running() {
            return;
        }
        if let Some((_, t)) = self.inner.lock().expect("tracer lock").as_mut() {
            match kind {
                'h' | 'm' => t.miss(block),
                'e' => t.evict(block),
                _ => t.returned(block),
            }
        }
    }

    /// The curve so far, up to `max_bytes` of host-side size (`None`: as far as
    /// the evictions reach); `None` when the tracer is not running.
    pub fn report(&self, max_bytes: Option<u64>) -> Option<TraceReport> {
        let g = self.inner.lock().expect("tracer lock");
        let (config, t) = g.as_ref()?;
        let h = t.histogram();
        let max = max_bytes.map_or(u64::MAX, |b| b / BLOCK);
        Some(TraceReport {
            config: *config,
            misses: h.accesses(),
            evicted_blocks: t.evicted_pages() as u64,
            inconsistent_blocks: t.inconsistent_pages() as u64,
            curve: MissRatioCurve::from_histogram(&h, max).ok(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feeds_only_while_running_and_ranks_misses_among_evictions() {
        let t = CurveTracer::default();
        t.feed(1, 'e');
        assert!(t.report(None).is_none());
        t.start(TraceConfig {
            rate: 1.0,
            step_blocks: 1,
        })
        .unwrap();
        for b in [1, 2, 3] {
            t.feed(b, 'e');
        }
        t.feed(2, 'w'); // back in the guest by a whole write: no miss
        t.feed(1, 'm'); // evicted 1st of the 2 left: rank 2
        t.feed(9, 'h'); // never evicted: a miss at every size
        let r = t.report(None).unwrap();
        assert_eq!(
            (r.misses, r.evicted_blocks, r.inconsistent_blocks),
            (2, 1, 0)
        );
        let c = r.curve.unwrap();
        assert_eq!(c.misses(0).unwrap(), 2.0);
        assert_eq!(c.misses(1).unwrap(), 2.0);
        assert_eq!(c.misses(2).unwrap(), 1.0);
        t.stop();
        assert!(t.report(None).is_none());
    }

    #[test]
    fn bad_configs_are_refused() {
        let t = CurveTracer::default();
        let bad = |rate, step_blocks| t.start(TraceConfig { rate, step_blocks }).is_err();
        assert!(bad(0.0, 64));
        assert!(bad(2.0, 64));
        assert!(bad(1.0, 0));
        assert!(bad(1.0, 1 << 20));
        assert!(!t.running());
    }
}
