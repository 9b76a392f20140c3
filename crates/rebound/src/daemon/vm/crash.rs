//! What the owner does when its guest dies (panic or watchdog), by the VM's crash
//! policy (`rebound_api::CrashPolicy`):
//!
//! 1. the crashed QEMU's vCPU registers are saved (when dumping), its RAM file is moved
//!    out of the run directory (a rename on the same tmpfs), and the QEMU is told to
//!    quit, which flushes and releases its disks and forwarded ports (it will never run
//!    again, so no two QEMUs ever write one disk);
//! 2. the dump reads the moved RAM file chunk by chunk and punches each chunk out
//!    once it is durable, so host memory comes back at a steady rate;
//! 3. the recovery VM boots on the same disk copy and ports, with the memory the
//!    budget allows now, and is given the rest with virtio-mem as the dump frees it.
//!
//! A report (`vms/NAME/crashes/ID/report.json`) and the event log follow every step.
//!
//! Every decision is `rebound_crash::Crash`'s: this file feeds it what happens and
//! what the owner sees, and `crash_actions.rs` carries out what it answers.

use std::collections::VecDeque;

use rebound_api::IoPolicy;
use rebound_crash::{Action, Crash, CrashStart, Event, Seen};
use rebound_vmm::events::{mono_ns, wall_now};
use rebound_vmm::resolve::VIRTIO_MEM_BLOCK_MIB;

use super::crash_actions::Now;
use super::crash_state::held;
use super::crash_state::Handling;
use super::dump::DumpProgress;
use super::owner::Owner;

/// A crash id: UTC time to the millisecond, sortable.
fn crash_id() -> String {
    chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ").to_string()
}

impl Owner {
    /// Takes over a guest that just died, as its crash policy says.
    pub(super) async fn respond_to_crash(&mut self, cause: &'static str) {
        let rec = self.vm.record();
        let policy = rec.spec.crash.clone();
        if policy.on_crash == rebound_api::OnCrash::None {
            // Kept paused, as it is.
            return;
        }
        if self.crash.is_some() {
            self.feed(Event::CrashedAgain {
                cause: cause.to_string(),
            })
            .await;
            if self.crash.is_some() {
                // The earlier dump still holds memory: it is kept for the operator.
                return;
            }
        }
        let id = crash_id();
        let dir = self.vm.dir.crash_dir(&id);
        if let Err(e) = rebound_vmm::private::create_dir_all(&dir) {
            tracing::error!(vm = %self.vm.name, "cannot create {}: {e}; the guest stays paused", dir.display());
            return;
        }
        let disk_since_start = match (&self.qmp, rec.started_mono_ns) {
            (Some(q), Some(t0)) if policy.io_policy == IoPolicy::Auto => {
                super::crash_actions::disk_bytes(q).await.map(|b| (b, t0))
            }
            _ => None,
        };
        let crashed_ram = self.paths.crashed_ram(&self.vm.name, &id);
        let start = CrashStart {
            id,
            vm: self.vm.name.clone(),
            cause: cause.to_string(),
            policy,
            memory_mib: rec.spec.memory_mib,
            block_mib: VIRTIO_MEM_BLOCK_MIB,
            dir: dir.clone(),
            crashed_ram: crashed_ram.clone(),
            crashed_at: wall_now(),
            ram_bytes: held(&self.vm.run.ram()),
            disk_since_start,
        };
        let now = Seen {
            now_ns: mono_ns(),
            ..Seen::default()
        };
        let Some((m, acts)) = Crash::start(start, now) else {
            return;
        };
        let dumps = m.dumps();
        self.crash = Some(Handling::new(m, dir.clone(), crashed_ram.clone()));
        self.execute(acts).await;
        if dumps {
            let notes = self.save_cpu_notes(&dir).await;
            if let Some(h) = self.crash.as_mut() {
                h.cpu_notes = notes;
            }
        }
        // The RAM stays on the same tmpfs under a name the run directory's cleanup
        // does not touch; QEMU's mapping follows the rename.
        let moved = std::fs::rename(self.vm.run.ram(), &crashed_ram);
        self.release_crashed_qemu().await;
        self.feed(Event::QemuReleased {
            ram_not_moved: moved.err().map(|e| e.to_string()),
        })
        .await;
    }

    /// A message from the dump task.
    pub(super) async fn on_dump_progress(&mut self, p: Option<DumpProgress>) {
        let Some(h) = self.crash.as_mut() else { return };
        let done = match p {
            Some(DumpProgress::Chunk {
                dumped_bytes,
                skipped_bytes,
                crashed_bytes,
            }) => {
                let chunk = Event::Chunk {
                    dumped_bytes,
                    skipped_bytes,
                    crashed_bytes,
                };
                return self.feed(chunk).await;
            }
            Some(DumpProgress::Done(r)) => r.map_err(|e| rebound_errors::chain(&e)),
            None => Err("the dump task ended without reporting".to_string()),
        };
        if done.is_ok() {
            crate::daemon::fault::point("crash:after-rename");
        }
        h.progress = None;
        self.feed(Event::DumpFinished(done)).await;
    }

    /// A second passed while the crash machine asked for ticks (`auto`'s hold).
    pub(super) async fn on_crash_tick(&mut self) {
        if self.crash.as_ref().is_some_and(|h| h.m.wants_ticks()) {
            self.feed(Event::Tick).await;
        }
    }

    /// The recovery VM passed its readiness condition: the service is back.
    pub(super) fn on_recovered(&mut self) {
        let Some(h) = self.crash.as_mut() else { return };
        let seen = h.seen();
        let acts = h.m.on(Event::Ready, seen);
        let mut queue = acts.into();
        if let Some(a) = self.run_now(&mut queue) {
            // Readiness only logs, moves the VM's state and settles the crash.
            tracing::error!(vm = %self.vm.name, "a crash action left undone at readiness: {a:?}");
        }
    }

    /// Feeds the crash an event and carries out what it answers.
    pub(super) async fn feed(&mut self, e: Event) {
        let Some(h) = self.crash.as_mut() else { return };
        let seen = h.seen();
        let acts = h.m.on(e, seen);
        self.execute(acts).await;
    }

    /// Carries out actions in order; an action's answer is fed at once, and what it
    /// brings is done before the actions after it.
    pub(super) async fn execute(&mut self, acts: Vec<Action>) {
        let mut queue = acts.into();
        while let Some(a) = self.run_now(&mut queue) {
            let answer = self.act_later(a).await;
            self.answer(answer, &mut queue);
        }
    }

    /// Runs the actions that need no waiting; returns the first that does.
    fn run_now(&mut self, queue: &mut VecDeque<Action>) -> Option<Action> {
        while let Some(a) = queue.pop_front() {
            match self.act_now(a) {
                Now::Done(answer) => self.answer(answer, queue),
                Now::Later(a) => return Some(a),
            }
        }
        None
    }

    fn answer(&mut self, answer: Option<Event>, queue: &mut VecDeque<Action>) {
        let (Some(e), Some(h)) = (answer, self.crash.as_mut()) else {
            return;
        };
        let seen = h.seen();
        for a in h.m.on(e, seen).into_iter().rev() {
            queue.push_front(a);
        }
    }

    /// Writes the report next to the dump (atomically, private).
    pub(super) fn save_report(&self) {
        let Some(h) = &self.crash else { return };
        let data = serde_json::to_vec_pretty(h.m.report()).expect("reports serialize");
        if let Err(e) = rebound_vmm::private::write_atomic(&h.dir.join("report.json"), &data) {
            tracing::error!(vm = %self.vm.name, "cannot save the crash report: {e}");
        }
    }
}
