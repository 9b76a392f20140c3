//! One task per VM: turns QMP events, agent messages and readiness probes into
//! state changes and event-log lines, and notices when QEMU goes away.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::lifecycle;
use super::state::VmHandle;
use crate::spec::ReadySpec;
use crate::vm::agent::AgentMsg;
use crate::vm::events::mono_ns;
use crate::vm::process;
use crate::vm::qmp::QmpEvent;
use crate::vm::readiness;
use crate::vm::record::VmState;

/// Memfill progress is logged at most this often (plus whenever errors appear).
const MEMFILL_LOG_EVERY: Duration = Duration::from_secs(5);

pub async fn run(
    vm: Arc<VmHandle>,
    mut qmp: UnboundedReceiver<QmpEvent>,
    mut agent: UnboundedReceiver<AgentMsg>,
    ready: ReadySpec,
    mut child: Option<tokio::process::Child>,
) {
    let mut probe = tokio::time::interval(Duration::from_millis(250));
    let probe_port = ready.guest_port().and_then(|g| {
        vm.record()
            .forwards
            .iter()
            .find(|f| f.guest == g)
            .map(|f| f.host)
    });
    let mut agent_open = true;
    let mut last_memfill: Option<(tokio::time::Instant, u64)> = None;
    loop {
        tokio::select! {
            ev = qmp.recv() => match ev {
                Some(ev) => on_qmp(&vm, ev),
                None => break,
            },
            msg = agent.recv(), if agent_open => match msg {
                Some(m) => on_agent(&vm, m, &ready, &mut last_memfill),
                None => agent_open = false,
            },
            _ = probe.tick(), if !matches!(ready, ReadySpec::Agent) && !vm.record().ready => {
                if vm.record().state == VmState::Running && readiness::probe(&ready, probe_port, &vm.run.serial_log(), vm.qmp().as_deref()).await {
                    mark_ready(&vm, Some(json!({"probe": ready.to_string()})));
                }
            }
        }
    }
    // QMP closed: QEMU is exiting (or was killed). Reap it if it is our child.
    let code = match child.as_mut() {
        Some(c) => match tokio::time::timeout(Duration::from_secs(10), c.wait()).await {
            Ok(Ok(st)) => st.code(),
            _ => None,
        },
        None => {
            if let Some(pid) = vm.record().qemu_pid {
                process::wait_gone(pid, Duration::from_secs(10)).await;
            }
            None
        }
    };
    lifecycle::exited(&vm, json!({"exit_code": code}));
}

fn on_qmp(vm: &VmHandle, ev: QmpEvent) {
    let data = ev.data.clone();
    match ev.event.as_str() {
        "GUEST_PANICKED" => {
            vm.update(|r| {
                r.state = VmState::Panicked;
                r.ready = false;
            });
            vm.event("panicked", Some(data));
        }
        "STOP" => {
            let changed = vm.update(|r| {
                if r.state == VmState::Panicked {
                    false
                } else {
                    r.state = VmState::Paused;
                    true
                }
            });
            if changed {
                vm.event("paused", None);
            }
        }
        "RESUME" => {
            vm.update(|r| r.state = VmState::Running);
            vm.event("resumed", None);
        }
        "WATCHDOG" => {
            vm.event("watchdog", Some(data));
        }
        "SHUTDOWN" => {
            vm.event("shutdown", Some(data));
        }
        "BALLOON_CHANGE" => {
            vm.event("balloon", Some(data));
        }
        _ => {}
    }
}

fn mark_ready(vm: &VmHandle, detail: Option<serde_json::Value>) {
    let first = vm.update(|r| {
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
        let mut d = detail.unwrap_or_else(|| json!({}));
        d["ready_after_ms"] = json!(ms);
        vm.event("ready", Some(d));
    }
}

fn on_agent(
    vm: &VmHandle,
    m: AgentMsg,
    ready: &ReadySpec,
    last_memfill: &mut Option<(tokio::time::Instant, u64)>,
) {
    match m {
        AgentMsg::Ready(info) => {
            let detail = serde_json::to_value(&info).ok();
            let first = vm.update(|r| {
                let first = r.kernel_release.is_none();
                r.kernel_release = Some(info.kernel_release.clone());
                r.vmcoreinfo = info.vmcoreinfo;
                if info.service_port.is_some() {
                    r.service_port = info.service_port;
                }
                first
            });
            vm.event(if first { "agent_ready" } else { "agent_hello" }, detail);
            if matches!(ready, ReadySpec::Agent) && vm.record().state == VmState::Running {
                mark_ready(vm, Some(json!({"probe": "agent"})));
            }
        }
        AgentMsg::Memfill {
            filled_kib,
            rounds,
            errors,
        } => {
            let now = tokio::time::Instant::now();
            let due = match last_memfill {
                None => true,
                Some((t, e)) => now.duration_since(*t) >= MEMFILL_LOG_EVERY || errors != *e,
            };
            if due {
                *last_memfill = Some((now, errors));
                vm.event(
                    "memfill",
                    Some(json!({"filled_kib": filled_kib, "rounds": rounds, "errors": errors})),
                );
            }
        }
        AgentMsg::Error { message } => {
            vm.event("agent_error", Some(json!({"message": message})));
        }
        // Ticks and heartbeats are frequent; the counter also goes to the serial log.
        AgentMsg::Heartbeat { .. } | AgentMsg::Counter { .. } | AgentMsg::Marker { .. } => {}
    }
}
