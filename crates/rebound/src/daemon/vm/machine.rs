//! A VM's states and every transition between them, in one place.
//!
//! The owner task (`owner.rs`) is the only writer of a VM's state, and it changes the
//! state only through [`next`]. Later capabilities (dumping, recovering, snapshotting,
//! restoring, settling) add their states to `rebound_api::VmState`, their triggers
//! here, and their rows to the table.

use rebound_api::VmState;

/// What happened to the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger<'a> {
    /// QEMU answered `query-status` with this run state (at start or re-attach).
    QemuStatus(&'a str),
    /// QMP `STOP`.
    Stopped,
    /// QMP `RESUME`.
    Resumed,
    /// QMP `GUEST_PANICKED`, or `WATCHDOG` (a hung guest): either way the guest is
    /// dead, paused by QEMU with its RAM kept.
    Panicked,
    /// A stop or kill job begins tearing QEMU down.
    TearDown,
    /// The crashed QEMU is gone; its memory is being dumped.
    DumpBegins,
    /// A recovery VM's QEMU was spawned.
    RecoveryBegins,
    /// The VM's readiness condition held.
    Ready,
    /// A restore's QEMU is up and waits for its device state.
    RestoreBegins,
    /// A restore's device state is loaded; the vCPUs have not run yet.
    Restored,
    /// QEMU is gone (exited, killed, or never came up).
    Gone,
}

/// The state after `t` happens in `s`; `None` when `t` changes nothing in `s`.
pub fn next(s: VmState, t: Trigger<'_>) -> Option<VmState> {
    use VmState::*;
    let to = match (s, t) {
        // Nothing revives a stopped VM but a new start (a new owner).
        (Stopped, _) => return None,
        (_, Trigger::Gone) => Stopped,
        // While tearing down, QEMU's own events no longer change what the user sees.
        (Stopping, _) => return None,
        (_, Trigger::TearDown) => Stopping,
        (Panicked, Trigger::DumpBegins) => Dumping,
        (Panicked | Dumping, Trigger::RecoveryBegins) => Recovering,
        (_, Trigger::DumpBegins | Trigger::RecoveryBegins) => return None,
        (Recovering, Trigger::Ready) => Running,
        (Starting, Trigger::RestoreBegins) => Restoring,
        (Restoring, Trigger::Restored) => Paused,
        (Restoring, Trigger::Resumed) => Running,
        (_, Trigger::RestoreBegins | Trigger::Restored) => return None,
        // A restoring QEMU reports `inmigrate` and `paused`: only the restore moves it on.
        (Restoring, Trigger::QemuStatus(_) | Trigger::Stopped) => return None,
        (_, Trigger::Ready) => return None,
        // A dumping VM has no QEMU whose events could still arrive.
        (Dumping, _) => return None,
        (_, Trigger::Panicked) => Panicked,
        // A recovery VM runs before it is ready: it is still recovering.
        (Recovering, Trigger::Resumed) => return None,
        (Recovering, Trigger::QemuStatus("running")) => return None,
        // A panicked guest stays panicked (QEMU also reports STOP and `paused`).
        (Panicked, Trigger::Stopped | Trigger::Resumed) => return None,
        (Panicked, Trigger::QemuStatus(q)) if q != "running" => return None,
        (_, Trigger::Stopped) => Paused,
        (_, Trigger::Resumed) => Running,
        (_, Trigger::QemuStatus(q)) => match q {
            "running" => Running,
            "guest-panicked" => Panicked,
            "shutdown" | "paused" | "watchdog" | "debug" | "io-error" | "internal-error"
            | "suspended" | "postmigrate" | "prelaunch" | "inmigrate" => Paused,
            _ => return None,
        },
    };
    (to != s).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_api::VmState::*;

    #[test]
    fn the_table() {
        let q = Trigger::QemuStatus;
        for (from, t, to) in [
            (Starting, q("running"), Some(Running)),
            (Starting, q("guest-panicked"), Some(Panicked)),
            (Starting, q("paused"), Some(Paused)),
            (Starting, q("what"), None),
            (Running, Trigger::Stopped, Some(Paused)),
            (Paused, Trigger::Resumed, Some(Running)),
            (Running, Trigger::Panicked, Some(Panicked)),
            (Panicked, Trigger::Stopped, None),
            (Panicked, q("paused"), None),
            (Panicked, q("running"), Some(Running)),
            (Panicked, Trigger::Resumed, None),
            (Running, Trigger::Resumed, None),
            (Running, Trigger::TearDown, Some(Stopping)),
            (Panicked, Trigger::TearDown, Some(Stopping)),
            (Stopping, Trigger::Panicked, None),
            (Stopping, Trigger::Resumed, None),
            (Stopping, Trigger::Gone, Some(Stopped)),
            (Running, Trigger::Gone, Some(Stopped)),
            (Starting, Trigger::Gone, Some(Stopped)),
            (Stopped, Trigger::Gone, None),
            (Stopped, q("running"), None),
            (Stopped, Trigger::TearDown, None),
            (Panicked, Trigger::DumpBegins, Some(Dumping)),
            (Running, Trigger::DumpBegins, None),
            (Dumping, Trigger::RecoveryBegins, Some(Recovering)),
            (Panicked, Trigger::RecoveryBegins, Some(Recovering)),
            (Running, Trigger::RecoveryBegins, None),
            (Recovering, q("running"), None),
            (Recovering, Trigger::Resumed, None),
            (Recovering, Trigger::Ready, Some(Running)),
            (Running, Trigger::Ready, None),
            (Recovering, Trigger::Panicked, Some(Panicked)),
            (Dumping, Trigger::Panicked, None),
            (Dumping, Trigger::Gone, Some(Stopped)),
            (Dumping, Trigger::TearDown, Some(Stopping)),
            (Starting, Trigger::RestoreBegins, Some(Restoring)),
            (Running, Trigger::RestoreBegins, None),
            (Restoring, q("inmigrate"), None),
            (Restoring, Trigger::Stopped, None),
            (Restoring, Trigger::Restored, Some(Paused)),
            (Running, Trigger::Restored, None),
            (Restoring, Trigger::Resumed, Some(Running)),
            (Paused, Trigger::Resumed, Some(Running)),
            (Restoring, Trigger::Panicked, Some(Panicked)),
            (Restoring, Trigger::Gone, Some(Stopped)),
            (Restoring, Trigger::TearDown, Some(Stopping)),
        ] {
            assert_eq!(next(from, t), to, "{from} + {t:?}");
        }
    }

    #[test]
    fn every_state_can_reach_stopped() {
        for s in VmState::ALL {
            let end = next(s, Trigger::Gone).unwrap_or(s);
            assert_eq!(end, Stopped, "{s}");
        }
    }
}
