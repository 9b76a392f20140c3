//! The page server's exact traces in `bench restore`.
//!
//! On the page server a guest's touch of a page already sent is invisible (it is
//! one of its own memory accesses), so a restore that sends a working set ahead
//! cannot see its hits. A lazy restore on the page server sees every first touch:
//! each is a request. So the hit rate and accuracy of a `ps-working-set` or
//! `ps-elastic` restore are measured as the paper measures them, a working set
//! against a later run's touches: its loaded set (the snapshot copy's trace, the
//! first `working_set_pages` of it, as it stood before the restore) against the
//! first touches of the next `ps-lazy` restore of the same snapshot (its exact
//! trace, read back from the copy it replaced). Each `ps-lazy` row also gets the
//! size of its exact trace and its overlap with the pagemap trace the snapshot was
//! taken with (the page-cache path's working set).

use std::collections::HashSet;
use std::path::Path;

use rebound_snapshot::{hit_rate_accuracy, Snapshot, TracePage};

use super::Record;

/// A restore measured after it ended: its index among the records tried, and its hit
/// rate and accuracy, or why there are none.
pub(super) type Measured = (usize, Result<(f64, f64), String>);

/// A snapshot's trace, if it has one that reads back.
pub(super) fn trace_of(dir: &Path) -> Option<Vec<TracePage>> {
    Some(Snapshot::open(dir).ok()?.trace().ok()??.pages)
}

/// One workload's exact traces as its restores go.
pub(super) struct Exact {
    /// The snapshot's own (pagemap) trace.
    pagemap: Option<HashSet<TracePage>>,
    /// Restores that sent a working set ahead, waiting for the next lazy one's
    /// touches: their index among the records tried, and the set they loaded.
    waiting: Vec<(usize, Vec<TracePage>)>,
}

impl Exact {
    pub(super) fn new(snap: &Path) -> Exact {
        Exact {
            pagemap: trace_of(snap).map(|t| t.into_iter().collect()),
            waiting: Vec::new(),
        }
    }

    /// Whether a restore waits for a lazy one's touches.
    pub(super) fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// After a measured page-server restore of `rec.mode` from `copy`, whose trace
    /// was `before` when it began; `at` is its index among the records tried. After
    /// a lazy one, returns what the restores waiting for it measured: for each, its
    /// index and its hit rate and accuracy, or why there are none.
    pub(super) fn after(
        &mut self,
        rec: &mut Record,
        at: usize,
        before: Option<Vec<TracePage>>,
        copy: &Path,
    ) -> Vec<Measured> {
        match rec.mode.as_str() {
            "ps-working-set" | "ps-elastic" => {
                if let Some(mut t) = before {
                    t.truncate(rec.working_set_pages as usize);
                    self.waiting.push((at, t));
                }
                Vec::new()
            }
            "ps-lazy" => match trace_of(copy) {
                Some(exact) => {
                    self.lazy(rec, &exact);
                    self.resolve(&exact)
                }
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// A lazy restore's exact trace: its size and overlap with the pagemap trace.
    fn lazy(&self, rec: &mut Record, exact: &[TracePage]) {
        rec.exact_trace_pages = Some(exact.len() as u64);
        if let Some(p) = &self.pagemap {
            rec.pagemap_trace_pages = Some(p.len() as u64);
            let both = exact.iter().filter(|x| p.contains(x)).count();
            rec.exact_in_pagemap = Some(both as f64 / exact.len().max(1) as f64);
        }
    }

    /// The waiting restores' loaded sets against `exact`, a later restore's first
    /// touches.
    pub(super) fn resolve(&mut self, exact: &[TracePage]) -> Vec<Measured> {
        self.waiting
            .drain(..)
            .map(|(i, loaded)| {
                let r = hit_rate_accuracy(&loaded, exact).ok_or_else(|| {
                    format!(
                        "hit rate and accuracy need {} first touches in the next lazy restore; it made {}",
                        loaded.len(),
                        exact.len()
                    )
                });
                (i, r)
            })
            .collect()
    }
}
