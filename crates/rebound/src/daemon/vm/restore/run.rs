//! A restored guest from its load to the end of its watch: the background loader,
//! the trace armed before the first instruction, the start (`cont`), the watch
//! window's counters and first answer, and the settle onto shared RAM. What the
//! report says at each step is the plan's ([`rebound_snapshot::restore_plan`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::VmState;
use rebound_snapshot::restore_plan::{Action, Event, Restore, SettleAfter, WatchEnd};
use rebound_snapshot::{Snapshot, Trace};
use rebound_vmm::port::Runtime;

use super::state::ArmedTrace;
use super::RECOVERY_READY_WAIT;
use crate::daemon::error::OpError;
use crate::daemon::vm::machine::Trigger;
use crate::daemon::vm::owner::Owner;

impl Owner {
    /// Starts the restored guest's vCPUs and the watcher.
    pub(in crate::daemon::vm) async fn begin_restored_run(
        &mut self,
    ) -> Result<rebound_api::RestoreReport, OpError> {
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        let pid = self.vm.record().qemu_pid.ok_or(OpError::NoQmp)?;
        let Some(r) = self.restore.as_mut() else {
            return Err(OpError::Internal("no restore under way".into()));
        };
        let loader = r.loader.take();
        let background = r.background.take();
        let armed = r.armed.take();
        let server = r.server.take();
        let (machine, watch_s, snap, ram, size, loaded) = (
            r.machine.clone(),
            r.watch_s,
            r.snap.clone(),
            r.ram.clone(),
            r.size,
            r.loaded.clone(),
        );
        // Watch from before the first instruction (the tracer armed before `cont`):
        // the first touches are the ones the trace is for.
        // The page server's requests are its trace: no page-table watch beside it.
        let armed = match (armed, &server) {
            (Some(a), _) => Some(a),
            (None, None) => Some(ArmedTrace::arm(pid, ram, size, watch_s, false).await),
            (None, Some(_)) => None,
        };
        let (trace_task, tracing_stop, go) = match armed {
            Some(a) => (Some(a.task), a.stop, a.go),
            None => (
                None,
                Arc::new(std::sync::atomic::AtomicBool::new(false)),
                None,
            ),
        };
        let probe = self.responsive_probe();
        let before = rebound_vmm::procfs::proc_counters(pid);
        if let Some(go) = go {
            let _ = go.send(());
        }
        let resumed_before = q.last_event_unix_ns("RESUME");
        self.command("cont", None).await?;
        let started = Instant::now();
        if let Some(go) = server {
            go.send();
        }
        let after = q.last_event_unix_ns("RESUME");
        let resumed = after.filter(|_| after != resumed_before);
        // The owner applies the change before QMP's RESUME arrives, which then
        // changes nothing: the event is written here.
        if self.apply(Trigger::Resumed) {
            self.event(rebound_api::EventData::Resumed);
        }
        // Bytes a held restore's loader read while it waited; the rest count as read
        // after the start.
        let loaded_while_held = background
            .as_ref()
            .map(|b| b.done.load(Ordering::Relaxed).saturating_sub(b.base));
        let mut report = self.vm.restore_report().unwrap_or_default();
        let mut bg = background;
        for a in machine.on(
            &mut report,
            Event::Started {
                at: started,
                resume_stamp: resumed,
                loaded_while_held,
            },
        ) {
            match a {
                Action::Publish => self.vm.set_restore_report(Some(report.clone())),
                Action::StartLoader(order) => {
                    bg = match (loader, self.restore.as_ref()) {
                        (Some(l), Some(rs)) => Some(rs.spawn_background(l, order, self.vm.clone())),
                        _ => None,
                    };
                    break;
                }
                other => unreachable!("a start asks for {other:?}"),
            }
        }
        let (loaded_bytes, at_start) = match &bg {
            Some(b) => (Some(b.done.clone()), b.done.load(Ordering::Relaxed)),
            None => (None, 0),
        };
        let bg = bg.map(|b| b.task);
        self.schedule_settle(&machine, bg, watch_s, started);

        // The first service answer.
        let vm = self.vm.clone();
        tokio::spawn(async move {
            // The counters and the trace end with the watch window, whenever the
            // first answer comes (a settle after the window replaces this QEMU).
            let window = Duration::from_secs_f64(watch_s.max(0.1));
            let counted = async {
                tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
                let after = rebound_vmm::procfs::proc_counters(pid);
                tracing_stop.store(true, Ordering::Relaxed);
                let touched = match trace_task {
                    Some(t) => t.await.ok().and_then(Result::ok),
                    None => None,
                };
                (after, touched)
            };
            let answer = async {
                match probe {
                    Some(p) => p.await,
                    None => None,
                }
            };
            let (answered, (after, touched)) = tokio::join!(answer, counted);
            let touched: Option<Trace> = touched;
            let pages = touched.as_ref().map(|t| t.pages.as_slice());
            let recorded = match &touched {
                Some(t) if machine.records_trace(pages) => record_trace(&snap, t).await,
                _ => Ok(false),
            };
            let counters = match (before, after) {
                (Some(b), Some(a)) => Some((
                    (b.major_faults, b.read_bytes),
                    (a.major_faults, a.read_bytes),
                )),
                _ => None,
            };
            let loader_bytes_after_start = loaded_bytes
                .as_ref()
                .map_or(0, |l| l.load(Ordering::Relaxed).saturating_sub(at_start));
            let end = WatchEnd {
                started,
                answered,
                counters,
                loader_bytes_after_start,
                touched: pages,
                loaded: &loaded,
                recorded,
                watch_s,
            };
            vm.update_restore_report(|rep| {
                machine.on(rep, Event::WatchEnded(&end));
            });
        });
        Ok(report)
    }

    /// Once everything is loaded (or, without a background loader, once the watch
    /// window is over), the guest moves onto shared RAM.
    fn schedule_settle(
        &self,
        machine: &Restore,
        bg: Option<
            tokio::task::JoinHandle<
                Result<rebound_snapshot::LoadStats, rebound_snapshot::LoadError>,
            >,
        >,
        watch_s: f64,
        started: Instant,
    ) {
        if machine.settle_after() == SettleAfter::Never {
            return;
        }
        let vm = self.vm.clone();
        let window = Duration::from_secs_f64(watch_s.max(0.1));
        tokio::spawn(async move {
            match bg {
                Some(h) => {
                    let _ = h.await;
                }
                None => tokio::time::sleep(window).await,
            }
            // The watch window ends first: settling moves every page, which
            // would blur what the window measures.
            tokio::time::sleep(window.saturating_sub(started.elapsed())).await;
            // A recovery VM settles once it serves (a settle needs a running VM).
            let end = Instant::now() + RECOVERY_READY_WAIT;
            while vm.record().state == VmState::Recovering && Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            if vm.record().ram_private {
                if let Err(e) = vm.run(crate::daemon::vm::Job::Settle).await {
                    tracing::warn!(vm = %vm.name, "no settle onto shared RAM: {}", rebound_errors::chain(&e));
                }
            }
        });
    }
}

/// Saves the touches of a restore whose snapshot had no trace as its trace: whether
/// it was saved, or why not.
async fn record_trace(snap: &Arc<Snapshot>, t: &Trace) -> Result<bool, String> {
    let (snap, t) = (snap.clone(), t.clone());
    match tokio::task::spawn_blocking(move || save_trace(&snap, &t, "restore")).await {
        Ok(r) => r.map(|()| true),
        Err(_) => Ok(false),
    }
}

/// Replaces the snapshot's trace with `t`, recorded as `source`; why not, if it failed.
pub(super) fn save_trace(snap: &Snapshot, t: &Trace, source: &str) -> Result<(), String> {
    let info = rebound_snapshot::TraceInfo {
        file: "trace.fafl".into(),
        pages: t.pages.len() as u64,
        source: source.into(),
        wss_sample_pages: None,
        wss_snapshot_pages: t.pages.len() as u64,
    };
    snap.replace_trace(t, info)
        .map_err(|e| rebound_errors::chain(&e))
}
