//! When a restored guest first answers: its service (the readiness probe given, a
//! web page, a kv request) or, where its workload serves no port, the agent's first
//! sign of that workload's work.

use std::time::{Duration, Instant};

use rebound_api::{ReadySpec, Workload};

use super::agent_wait::{AgentWait, AgentWant};
use super::RESPONSIVE_WAIT;
use crate::daemon::vm::owner::Owner;

impl Owner {
    /// A future that resolves when the restored guest first answers: its service
    /// (the readiness probe given, a web page, a kv request), or where the workload
    /// serves no port, the agent's first sign of that workload's work. Called before
    /// the vCPUs start, so an agent's answer cannot be missed.
    pub(super) fn responsive_probe(
        &mut self,
    ) -> Option<std::pin::Pin<Box<dyn std::future::Future<Output = Option<Instant>> + Send>>> {
        let rec = self.vm.record();
        let given = match &rec.spec.ready {
            Some(r) => Some(r.parse::<ReadySpec>().ok()?),
            None => None,
        };
        let answer = match (given, rec.spec.workload, rec.spec.service_port()) {
            (Some(ReadySpec::Agent) | None, Some(Workload::Web), Some(port)) => {
                Answer::Probe(ReadySpec::Http {
                    port,
                    path: "/".into(),
                })
            }
            (Some(ReadySpec::Agent) | None, Some(Workload::Kv), Some(port)) => Answer::Kv(port),
            (Some(ReadySpec::Agent) | None, w, _) => {
                let (want, count) = match w {
                    // The report after the one that ends the round under way at the
                    // snapshot point: a whole round over its memory ran after the start.
                    Some(Workload::Memfill) => (AgentWant::Memfill, 2),
                    Some(Workload::Counter) => (AgentWant::Counter, 1),
                    // The agent answering the link's `hello`.
                    _ => (AgentWant::Ready, 1),
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                self.agent_wait = Some(AgentWait { want, count, tx });
                return Some(Box::pin(async move {
                    tokio::time::timeout(RESPONSIVE_WAIT, rx).await.ok()?.ok()
                }));
            }
            (Some(spec), _, _) => Answer::Probe(spec),
        };
        let guest = match &answer {
            Answer::Probe(spec) => spec.guest_port(),
            Answer::Kv(port) => Some(*port),
        };
        let host = guest.and_then(|g| rec.forwards.iter().find(|f| f.guest == g).map(|f| f.host));
        let (serial, qmp) = (self.vm.dir.serial_log(), self.qmp.clone());
        Some(Box::pin(async move {
            let end = Instant::now() + RESPONSIVE_WAIT;
            while Instant::now() < end {
                let ok = match &answer {
                    Answer::Probe(spec) => {
                        rebound_vmm::readiness::probe(spec, host, &serial, qmp.as_deref()).await
                    }
                    Answer::Kv(_) => match host {
                        Some(p) => rebound_vmm::readiness::kv_answers(p).await,
                        None => false,
                    },
                };
                if ok {
                    return Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        }))
    }
}

/// What counts as a restored guest answering.
enum Answer {
    Probe(ReadySpec),
    /// A kv request on this guest port answered.
    Kv(u16),
}
