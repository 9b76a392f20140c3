//! Restores that load before their guest starts go first: background loaders wait
//! while one does.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Restores of this daemon reading what their guest needs before it may start (a
/// working set, or an eager copy). Background loaders give way to them: on a shared
/// disk a VM waiting to start goes first, and one already running (or held, loading
/// ahead of its start) only gains pages it would otherwise fault in.
static LOADING_BEFORE_START: AtomicUsize = AtomicUsize::new(0);

/// Whether a restore is loading before its start (background readers wait).
pub(in crate::daemon::vm) fn loading_before_start() -> bool {
    LOADING_BEFORE_START.load(Ordering::Relaxed) > 0
}

/// Counts one restore in [`LOADING_BEFORE_START`] while it lives.
pub(super) struct BeforeStartGuard;

impl BeforeStartGuard {
    pub(super) fn enter() -> BeforeStartGuard {
        LOADING_BEFORE_START.fetch_add(1, Ordering::Relaxed);
        BeforeStartGuard
    }
}

impl Drop for BeforeStartGuard {
    fn drop(&mut self) {
        LOADING_BEFORE_START.fetch_sub(1, Ordering::Relaxed);
    }
}
