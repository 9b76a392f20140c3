//! What QEMU and the guest report to the owner: QMP events, QEMU's end, the
//! agent's messages, readiness probes.

use std::time::Duration;

use rebound_api::{EventData, ReadySpec, VmState};
use rebound_vmm::agent::AgentMsg;
use rebound_vmm::events::mono_ns;
use rebound_vmm::qmp::QmpEvent;
use rebound_vmm::readiness;
use tokio::sync::oneshot;

use super::Owner;
use crate::daemon::vm::machine::Trigger;

/// Memfill progress is logged at most this often (plus whenever errors appear).
const MEMFILL_LOG_EVERY: Duration = Duration::from_secs(5);

impl Owner {
    // ---- what QEMU and the guest report ----

    /// Applies a QMP event; returns the crash's cause when the guest just died.
    pub(in crate::daemon::vm) fn on_qmp(&mut self, ev: QmpEvent) -> Option<&'static str> {
        let data = EventData::from_qmp(&ev.event, &ev.data)?;
        let mut died = None;
        let changed = match &data {
            EventData::Panicked { .. } => {
                let c = self.apply(Trigger::Panicked);
                if c {
                    self.metrics.panics.inc();
                    died = Some("panic");
                }
                c
            }
            EventData::Watchdog { .. } => {
                if self.apply(Trigger::Panicked) {
                    self.metrics.watchdog_expiries.inc();
                    died = Some("watchdog");
                }
                true
            }
            EventData::Paused => self.apply(Trigger::Stopped),
            EventData::Resumed => self.apply(Trigger::Resumed),
            // Shutdown and balloon are facts, not state changes.
            _ => true,
        };
        if changed {
            self.event(data);
        }
        died
    }

    pub(in crate::daemon::vm) async fn on_qemu_gone(&mut self) {
        let pid = self.vm.record().qemu_pid;
        let code = match pid {
            Some(pid) => self.reap(pid).await,
            None => None,
        };
        self.metrics.exits.inc();
        self.finish(EventData::Exited {
            exit_code: code,
            error: None,
        });
    }

    pub(in crate::daemon::vm) fn on_agent(&mut self, m: AgentMsg) {
        if let Some(w) = self.agent_wait.take() {
            self.agent_wait = w.saw(&m);
        }
        match m {
            AgentMsg::Ready(info) => {
                self.vm.evict_ring(info.evict_ring);
                let first = self.vm.update(|r| {
                    let first = r.kernel_release.is_none();
                    r.kernel_release = Some(info.kernel_release.clone());
                    r.vmcoreinfo = info.vmcoreinfo;
                    if info.service_port.is_some() {
                        r.service_port = info.service_port;
                    }
                    first
                });
                self.event(if first {
                    EventData::AgentReady(info)
                } else {
                    EventData::AgentHello(info)
                });
                if matches!(self.ready, ReadySpec::Agent)
                    && matches!(
                        self.vm.record().state,
                        VmState::Running | VmState::Recovering
                    )
                {
                    self.mark_ready("agent".into());
                }
            }
            AgentMsg::Memfill {
                filled_kib,
                rounds,
                errors,
            } => {
                let now = tokio::time::Instant::now();
                let due = match self.last_memfill {
                    None => true,
                    Some((t, e)) => now.duration_since(t) >= MEMFILL_LOG_EVERY || errors != e,
                };
                if due {
                    self.last_memfill = Some((now, errors));
                    self.event(EventData::Memfill {
                        filled_kib,
                        rounds,
                        errors,
                    });
                }
            }
            AgentMsg::Error { message } => self.event(EventData::AgentError { message }),
            AgentMsg::Throttled { dropped } => self.event(EventData::AgentThrottled { dropped }),
            AgentMsg::Io(r) => self.event(EventData::Io(r)),
            AgentMsg::Files(r) => self.event(EventData::Files(r)),
            AgentMsg::PeerEvent(p) => self.event(EventData::Peer(p)),
            // A prefetch whose reboot stopped waiting still says what it read.
            AgentMsg::Prefetch(p) => self.event(EventData::Prefetched(p.report)),
            // Pieces of a list nobody waits for any more.
            AgentMsg::Cachelist { .. } | AgentMsg::Rebooting => {}
            // Ticks and heartbeats are frequent; the counter also goes to the serial log.
            AgentMsg::Heartbeat { .. }
            | AgentMsg::Counter { .. }
            | AgentMsg::Marker { .. }
            | AgentMsg::Peer(_) => {}
        }
    }

    /// Starts a readiness probe in its own task; its answer comes back as an input.
    pub(super) fn probe(&mut self) {
        if !matches!(
            self.vm.record().state,
            VmState::Running | VmState::Recovering
        ) {
            return;
        }
        let (tx, rx) = oneshot::channel();
        let pid = self.vm.record().qemu_pid;
        let (ready, port, serial, qmp) = (
            self.ready.clone(),
            self.probe_port,
            self.vm.dir.serial_log(),
            self.qmp.clone(),
        );
        tokio::spawn(async move {
            let ok = readiness::probe(&ready, port, &serial, qmp.as_deref()).await;
            let _ = tx.send((pid, ok));
        });
        self.probe_rx = Some(rx);
    }

    pub(in crate::daemon::vm) fn mark_ready(&mut self, probe: String) {
        let first = self.vm.update(|r| {
            if r.ready {
                return None;
            }
            r.ready = true;
            let ms = r
                .started_mono_ns
                .map(|t0| mono_ns().saturating_sub(t0) / 1_000_000);
            if r.ready_after_ms.is_none() {
                r.ready_after_ms = ms;
            }
            Some(r.ready_after_ms)
        });
        if let Some(ms) = first {
            if let Some(ms) = ms {
                self.metrics.ready_seconds.observe(ms as f64 / 1000.0);
            }
            self.event(EventData::Ready {
                ready_after_ms: ms,
                probe,
            });
            self.on_recovered();
        }
    }
}
