//! A restore waiting for a message of the guest's agent: its own module, so the owner
//! can hold it without depending on the code that runs the restore.

use std::time::Instant;

use rebound_vmm::agent::AgentMsg;

/// Which agent message a restore waits for.
#[derive(Debug, Clone, Copy)]
pub(super) enum AgentWant {
    Ready,
    Counter,
    Memfill,
}

/// A restore waiting for the agent's `count`-th message of one kind after the start.
pub(in crate::daemon::vm) struct AgentWait {
    pub(super) want: AgentWant,
    pub(super) count: u32,
    pub(super) tx: tokio::sync::oneshot::Sender<Instant>,
}

impl AgentWait {
    /// Counts `m`; the wait, if it goes on.
    pub(in crate::daemon::vm) fn saw(mut self, m: &AgentMsg) -> Option<AgentWait> {
        let hit = matches!(
            (self.want, m),
            (AgentWant::Ready, AgentMsg::Ready(_))
                | (AgentWant::Counter, AgentMsg::Counter { .. })
                | (AgentWant::Memfill, AgentMsg::Memfill { .. })
        );
        if hit {
            self.count -= 1;
            if self.count == 0 {
                let _ = self.tx.send(Instant::now());
                return None;
            }
        }
        Some(self)
    }
}
