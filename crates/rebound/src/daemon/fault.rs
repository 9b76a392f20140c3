//! Fault injection for tests: with `REBOUND_FAULT=STEP` in its environment the
//! daemon SIGKILLs itself when it reaches STEP, leaving its QEMUs, files and
//! records exactly as a daemon killed there would (no destructor, no flush runs).
//!
//! This is a fake: it stands in for a fault that cannot be produced for real at a
//! chosen instant, the daemon dying (OOM killer, `kill -9`, power loss of the
//! daemon alone) between two particular steps that are milliseconds apart. Each
//! step is named where it is reached; [`STEPS`] lists them all.

use std::sync::OnceLock;

/// Every step a fault can be injected at.
pub const STEPS: &[&str] = &[
    // A fresh VM: QEMU spawned (paused) but not yet in the record; recorded, not
    // yet running guest code.
    "start:spawned",
    "start:recorded",
    // A restore: the same two points for its incoming QEMU, then while it loads.
    "restore:spawned",
    "restore:recorded",
    "restore:loading",
    // Settling onto shared RAM: the second QEMU spawned; the host ports handed
    // to it; the guest moved into it and the old QEMU gone, before the record
    // names the new one.
    "settle:spawned",
    "settle:ports",
    "settle:migrated",
    // A crash's dump: all of it flushed in the partial file and punched out of the
    // crashed RAM, before the rename; renamed, before the report says so; the
    // report saved, before the crashed RAM file is removed.
    "crash:before-rename",
    "crash:after-rename",
    "crash:after-report",
    // A cluster restore's cohort: its VM restored and held.
    "cohort:held",
];

fn armed() -> Option<&'static str> {
    static STEP: OnceLock<Option<String>> = OnceLock::new();
    STEP.get_or_init(|| {
        let s = std::env::var("REBOUND_FAULT")
            .ok()
            .filter(|s| !s.is_empty())?;
        if !STEPS.contains(&s.as_str()) {
            tracing::warn!("REBOUND_FAULT={s} names no step: ignored (steps: {STEPS:?})");
            return None;
        }
        tracing::warn!("REBOUND_FAULT={s}: this daemon kills itself at that step");
        Some(s)
    })
    .as_deref()
}

/// Reads `REBOUND_FAULT` once, at daemon start (so a bad name is said at once).
pub fn init() {
    let _ = armed();
}

/// The daemon dies here if `REBOUND_FAULT` names `step`.
pub fn point(step: &'static str) {
    debug_assert!(STEPS.contains(&step), "unknown fault step {step}");
    if armed() == Some(step) {
        tracing::error!("REBOUND_FAULT={step}: killing the daemon");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
