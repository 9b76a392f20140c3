//! The crash state machine: events in, actions out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rebound_api::{
    CrashPhase, CrashPolicy, CrashReport, EventData, IoPolicy, MemoryLimit, MemorySample, OnCrash,
};

use crate::policy::{self, Recovery, MIB};

/// What the daemon sees when it feeds an event.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Seen {
    /// Monotonic nanoseconds.
    pub now_ns: u64,
    /// Bytes the crashed RAM file holds (0 once it is gone).
    pub crashed_bytes: u64,
    /// What the VM's memory group holds, where the budget is enforced.
    pub charged_bytes: Option<u64>,
}

/// A guest that just died.
#[derive(Debug, Clone)]
pub struct CrashStart {
    pub id: String,
    pub vm: String,
    pub cause: String,
    pub policy: CrashPolicy,
    pub memory_mib: u64,
    /// The recovery VM's memory device block size, MiB.
    pub block_mib: u64,
    /// The crash's directory (the dump goes there unless the policy names another).
    pub dir: PathBuf,
    /// Where the crashed RAM is moved aside.
    pub crashed_ram: PathBuf,
    /// Wall-clock time of the crash (RFC 3339).
    pub crashed_at: String,
    /// Bytes the crashed VM's RAM holds, before anything is released.
    pub ram_bytes: u64,
    /// For `auto`: bytes the crashed VM's disks moved, and since when (monotonic ns).
    pub disk_since_start: Option<(u64, u64)>,
}

/// A finished dump.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DumpSummary {
    pub bytes: u64,
    pub io_bytes: u64,
    pub pages_written: u64,
    pub pages_skipped: BTreeMap<String, u64>,
    pub notes: Vec<String>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The guest of the recovery VM (or the recovered VM) died while this crash is
    /// handled.
    CrashedAgain { cause: String },
    /// The crashed QEMU quit; its RAM was moved aside, or not (why).
    QemuReleased { ram_not_moved: Option<String> },
    /// The memory group holds the budget (`enforced_by`: its cgroup version).
    BudgetHeld { enforced_by: String, group: String },
    /// No memory group could be had: the budget is only accounted.
    BudgetAccounted { why: String },
    /// The memory group's limit was lifted; the most it held.
    BudgetReleased { peak_bytes: Option<u64> },
    /// A chunk is durable and punched out of the crashed RAM.
    Chunk {
        dumped_bytes: u64,
        /// Of `dumped_bytes`, what the page filter left out.
        skipped_bytes: u64,
        crashed_bytes: u64,
    },
    /// Time passed: fed about once a second while [`Crash::wants_ticks`], for the end
    /// of `auto`'s hold.
    Tick,
    /// The dump is whole and renamed into place, or failed (why).
    DumpFinished(Result<DumpSummary, String>),
    /// The recovery VM's QEMU runs (`note`: what its start says for the report).
    RecoveryStarted { pid: u32, note: Option<String> },
    /// The recovery VM could not be started (why).
    RecoveryFailed { why: String },
    /// The recovery VM was given more memory: it now has this much, MiB.
    Plugged { mib: u64 },
    /// The recovery VM passed its readiness condition.
    Ready,
    /// Answer to [`Action::Then`].
    Then(Next),
}

/// A transition of the VM's own state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    DumpBegins,
    Ready,
    Gone,
}

/// Where the machine goes on after [`Action::Then`]; feed it back as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Begun,
    Settle,
    ChunkStart { crashed_bytes: u64 },
    ChunkTail { crashed_bytes: u64 },
    AfterDump,
    DumpGrow,
    DumpTail,
    TakeOverStart,
    TakeOverTail,
}

/// What the daemon does, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Log this event.
    Emit(EventData),
    /// Move the VM's state.
    Transition(Step),
    /// Limit the VM's memory group (answer `BudgetHeld` or `BudgetAccounted`).
    HoldBudget {
        budget_bytes: u64,
        limit_bytes: u64,
    },
    /// Lift the group's limit (answer `BudgetReleased` if there is a group).
    ReleaseBudget,
    /// Start the dump task into `out` at this rate (bytes/s, 0: unlimited).
    StartDump {
        out: PathBuf,
        rate: u64,
    },
    SetDumpRate(u64),
    /// Limit the recovery VM's disks to this rate (bytes/s, 0: no limit).
    ThrottleRecoveryDisks(u64),
    /// Remove the crashed RAM: nothing dumps it.
    DiscardCrashedRam,
    /// The dump holds everything: remove the crashed RAM and earlier partial dumps.
    DiscardDumped,
    /// A restored recovery VM's background loader may read on.
    ReleaseHeldLoader,
    /// Nothing runs any more for this VM (its disk backends stop).
    StopBackends,
    /// Start the recovery VM (answer `RecoveryStarted` or `RecoveryFailed`): booted
    /// with `boot_mib` (`None`: all its memory) or restored from `restore_from`.
    StartRecovery {
        boot_mib: Option<u64>,
        free_mib: u64,
        restore_from: Option<String>,
        dumping: bool,
    },
    /// Ask the recovery VM's memory device for `plugged_bytes` (answer `Plugged`
    /// with `mib` when it took it).
    Plug {
        plugged_bytes: u64,
        mib: u64,
    },
    /// Read the last cache list into the recovered guest (`--warm`).
    WarmRecovery,
    SaveReport,
    SetJob(Option<&'static str>),
    /// The crash is handled: forget it.
    Finish,
    /// Look again and feed `Event::Then` with this.
    Then(Next),
}

/// One crash being handled.
#[derive(Debug, Clone)]
pub struct Crash {
    pub(crate) report: CrashReport,
    pub(crate) memory_mib: u64,
    pub(crate) block_mib: u64,
    pub(crate) dir: PathBuf,
    pub(crate) crashed_ram: PathBuf,
    pub(crate) dumping: bool,
    pub(crate) dump_started_ns: Option<u64>,
    /// A recovery VM is due once the budget allows it.
    pub(crate) recovery_due: bool,
    pub(crate) recovery_spawned_ns: Option<u64>,
    /// What the recovery VM is configured with now (boot + plugged), MiB.
    pub(crate) recovery_mib: u64,
    pub(crate) boot_mib: u64,
    pub(crate) dumped_bytes: u64,
    pub(crate) skipped_bytes: u64,
    /// The recovery VM's disks are throttled.
    pub(crate) throttled: bool,
    /// The I/O policy in force: `auto` resolved to dump-first or recovery-first.
    pub(crate) io: IoPolicy,
}

impl Crash {
    /// A guest died: `None` when its policy keeps it paused, as it is.
    pub fn start(s: CrashStart, seen: Seen) -> Option<(Crash, Vec<Action>)> {
        let policy = s.policy;
        if policy.on_crash == OnCrash::None {
            return None;
        }
        let report = CrashReport {
            version: rebound_api::crash::CRASH_REPORT_VERSION,
            id: s.id.clone(),
            vm: s.vm,
            cause: s.cause.clone(),
            policy: policy.clone(),
            crashed_at: s.crashed_at,
            crashed_mono_ns: seen.now_ns,
            phase: CrashPhase::Recovering,
            downtime_s: None,
            dump_s: None,
            recovery_s: None,
            dump_path: None,
            dump_bytes: None,
            dump_io_bytes: None,
            pages_written: None,
            pages_skipped: Default::default(),
            io_policy: policy.io_policy.to_string(),
            notes: Vec::new(),
            timeline: Vec::new(),
            memory_limit: None,
            recovered_from: None,
        };
        let mut c = Crash {
            report,
            memory_mib: s.memory_mib,
            block_mib: s.block_mib,
            dir: s.dir,
            crashed_ram: s.crashed_ram,
            dumping: false,
            dump_started_ns: None,
            recovery_due: policy.on_crash.recovers(),
            recovery_spawned_ns: None,
            recovery_mib: 0,
            boot_mib: 0,
            dumped_bytes: 0,
            skipped_bytes: 0,
            throttled: false,
            io: policy.io_policy,
        };
        if policy.io_policy == IoPolicy::Auto {
            let disk = s
                .disk_since_start
                .map(|(b, t0)| (b, seen.now_ns.saturating_sub(t0) as f64 / 1e9));
            if let Some((to, why)) = policy::auto_at_crash(disk) {
                c.decide(to, why);
            }
        }
        let acts = vec![
            Action::Emit(EventData::CrashHandling {
                id: s.id,
                cause: s.cause,
                on_crash: policy.on_crash,
            }),
            Action::SetJob(Some("crash")),
        ];
        Some((c, acts))
    }

    /// The report as it stands.
    pub fn report(&self) -> &CrashReport {
        &self.report
    }

    /// The dump task runs.
    pub fn dumping(&self) -> bool {
        self.dumping
    }

    /// This crash's policy dumps (the crashed vCPUs' registers are worth saving).
    pub fn dumps(&self) -> bool {
        self.report.policy.on_crash.dumps()
    }

    /// `auto` holds the dump while the recovery VM boots, for a bounded time: feed
    /// [`Event::Tick`] while this holds.
    pub fn wants_ticks(&self) -> bool {
        self.io == IoPolicy::Auto && self.dumping && self.recovery() == Recovery::Booting
    }

    /// Where the recovery VM stands.
    fn recovery(&self) -> Recovery {
        match (self.recovery_spawned_ns, self.report.downtime_s) {
            (Some(_), Some(_)) => Recovery::Ready,
            // One that failed to start or died before it was ready holds nothing up.
            (Some(_), None) if self.report.phase != CrashPhase::Failed => Recovery::Booting,
            _ => Recovery::Absent,
        }
    }

    /// Feeds one event; returns what to do, in order.
    pub fn on(&mut self, event: Event, seen: Seen) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::CrashedAgain { cause } => self.crashed_again(&cause, &mut out),
            Event::QemuReleased { ram_not_moved } => {
                self.released(ram_not_moved, seen.now_ns, &mut out)
            }
            Event::BudgetHeld { enforced_by, group } => {
                let (budget, limit) = policy::budget_bytes(&self.report.policy, self.memory_mib);
                self.report.memory_limit = Some(MemoryLimit {
                    enforced_by,
                    budget_bytes: budget,
                    limit_bytes: Some(limit),
                    group: Some(group),
                    peak_bytes: None,
                    why_not: None,
                });
            }
            Event::BudgetAccounted { why } => {
                let (budget, _) = policy::budget_bytes(&self.report.policy, self.memory_mib);
                self.report.notes.push(format!(
                    "the memory budget is accounted, not enforced: {why}"
                ));
                self.report.memory_limit = Some(MemoryLimit {
                    enforced_by: "accounted".into(),
                    budget_bytes: budget,
                    limit_bytes: None,
                    group: None,
                    peak_bytes: None,
                    why_not: Some(why),
                });
            }
            Event::BudgetReleased { peak_bytes } => {
                if let Some(m) = self.report.memory_limit.as_mut() {
                    m.peak_bytes = peak_bytes;
                }
            }
            Event::Chunk {
                dumped_bytes,
                skipped_bytes,
                crashed_bytes,
            } => {
                self.dumped_bytes = dumped_bytes;
                self.skipped_bytes = skipped_bytes;
                self.grow(seen, Next::ChunkStart { crashed_bytes }, &mut out);
            }
            Event::Tick => self.hold_over(seen.now_ns, &mut out),
            Event::DumpFinished(r) => self.dump_finished(r, seen, &mut out),
            Event::RecoveryStarted { pid, note } => {
                out.push(Action::Emit(EventData::RecoveryStarted {
                    id: self.report.id.clone(),
                    pid,
                    boot_memory_mib: self.boot_mib,
                }));
                self.report.notes.extend(note);
                self.sample(seen, Some("recovery started"));
                self.apply_io_policy(&mut out);
                out.push(Action::SaveReport);
            }
            Event::RecoveryFailed { why } => {
                let how = match &self.report.policy.recover_from {
                    Some(dir) => format!("could not be restored from {dir}"),
                    None => "failed to start".into(),
                };
                self.report
                    .notes
                    .push(format!("the recovery VM {how}: {why}"));
                self.recovery_due = false;
                self.report.phase = CrashPhase::Failed;
                self.apply_io_policy(&mut out);
                out.push(Action::SaveReport);
            }
            Event::Plugged { mib } => self.recovery_mib = mib,
            Event::Ready => self.ready(seen, &mut out),
            Event::Then(next) => self.then(next, seen, &mut out),
        }
        out
    }

    fn crashed_again(&mut self, cause: &str, out: &mut Vec<Action>) {
        if self.report.downtime_s.is_none() {
            // The recovery VM died before it was ready: that crash failed to recover.
            self.report.notes.push(format!(
                "the recovery VM crashed too ({cause}) before it was ready"
            ));
            self.report.phase = CrashPhase::Failed;
            self.recovery_due = false;
            self.apply_io_policy(out);
        } else {
            self.report.notes.push(format!(
                "the recovered VM crashed again ({cause}) while this dump ran"
            ));
        }
        out.push(Action::SaveReport);
        // A dump still running holds memory: that crash is kept for the operator.
        if !self.dumping {
            out.push(Action::Finish);
        }
    }

    fn released(&mut self, ram_not_moved: Option<String>, now_ns: u64, out: &mut Vec<Action>) {
        let policy = self.report.policy.clone();
        let moved = ram_not_moved.is_none();
        if let Some(e) = ram_not_moved {
            self.report
                .notes
                .push(format!("cannot move the crashed RAM aside: {e}"));
        }
        if policy.on_crash.recovers() {
            let (budget_bytes, limit_bytes) = policy::budget_bytes(&policy, self.memory_mib);
            out.push(Action::HoldBudget {
                budget_bytes,
                limit_bytes,
            });
        }
        if policy.on_crash.dumps() && moved {
            self.report.phase = CrashPhase::Dumping;
            out.push(Action::Transition(Step::DumpBegins));
            self.start_dump(now_ns, out);
        } else {
            out.push(Action::DiscardCrashedRam);
        }
        if policy.on_crash == OnCrash::DumpThenRecover {
            self.recovery_due = !self.dumping;
        }
        out.push(Action::Then(Next::Begun));
    }

    /// Starts the dump (into the policy's dump directory, else the crash's own).
    pub(crate) fn start_dump(&mut self, now_ns: u64, out: &mut Vec<Action>) {
        let path = match &self.report.policy.dump_dir {
            Some(d) => {
                PathBuf::from(d).join(format!("{}-{}.vmcore", self.report.vm, self.report.id))
            }
            None => self.dir.join("vmcore"),
        };
        self.dumping = true;
        self.dump_started_ns = Some(now_ns);
        self.report.dump_path = Some(path.display().to_string());
        out.push(Action::Emit(EventData::DumpStarted {
            id: self.report.id.clone(),
            path: path.display().to_string(),
        }));
        let (rate, _) = policy::io_rates(self.io, self.recovery());
        out.push(Action::StartDump { out: path, rate });
    }

    fn then(&mut self, next: Next, seen: Seen, out: &mut Vec<Action>) {
        match next {
            Next::Begun => {
                self.sample_at(seen, 0, Some("crash"));
                // Readable at once, also while a recovery VM is restored (which takes
                // longer than a spawn).
                out.push(Action::SaveReport);
                self.try_recovery(seen, Next::Settle, out);
            }
            Next::Settle => self.settle(out),
            Next::ChunkStart { crashed_bytes } => {
                self.try_recovery(seen, Next::ChunkTail { crashed_bytes }, out)
            }
            Next::ChunkTail { crashed_bytes } => {
                self.sample(seen, None);
                out.push(Action::Emit(EventData::ChunkReclaimed {
                    id: self.report.id.clone(),
                    dumped_bytes: self.dumped_bytes,
                    crashed_bytes,
                    recovery_bytes: self.recovery_mib * MIB,
                }));
            }
            Next::AfterDump => self.try_recovery(seen, Next::DumpGrow, out),
            Next::DumpGrow => self.grow(seen, Next::DumpTail, out),
            Next::TakeOverStart => self.try_recovery(seen, Next::TakeOverTail, out),
            Next::DumpTail | Next::TakeOverTail => {
                self.apply_io_policy(out);
                self.settle(out);
            }
        }
    }

    /// Starts the recovery VM if one is due and the budget has room for its minimum,
    /// then goes on with `next`; otherwise it starts at a later chunk.
    fn try_recovery(&mut self, seen: Seen, next: Next, out: &mut Vec<Action>) {
        let p = &self.report.policy;
        let free = policy::free_mib(p, self.memory_mib, seen.crashed_bytes);
        let boot = match policy::boot_mib(p, self.memory_mib, self.block_mib, free) {
            Some(b) if self.recovery_due && self.recovery_spawned_ns.is_none() => b,
            _ => return self.then(next, seen, out),
        };
        let restore_from = p.recover_from.clone();
        self.recovery_spawned_ns = Some(seen.now_ns);
        self.boot_mib = boot.unwrap_or(self.memory_mib);
        self.recovery_mib = self.boot_mib;
        if restore_from.is_some() {
            self.report.recovered_from = restore_from.clone();
        }
        out.push(Action::StartRecovery {
            boot_mib: boot,
            free_mib: free,
            restore_from,
            dumping: self.dumping,
        });
        out.push(Action::Then(next));
    }

    /// Grows the recovery VM into memory the dump gave back, then goes on with `next`.
    fn grow(&mut self, seen: Seen, next: Next, out: &mut Vec<Action>) {
        let free = policy::free_mib(&self.report.policy, self.memory_mib, seen.crashed_bytes);
        let target = match self.recovery_spawned_ns {
            Some(_) => policy::grown_mib(self.memory_mib, self.block_mib, self.recovery_mib, free),
            None => None,
        };
        let Some(mib) = target else {
            return self.then(next, seen, out);
        };
        out.push(Action::Plug {
            plugged_bytes: (mib - self.boot_mib) * MIB,
            mib,
        });
        out.push(Action::Then(next));
    }

    fn dump_finished(&mut self, r: Result<DumpSummary, String>, seen: Seen, out: &mut Vec<Action>) {
        self.dumping = false;
        out.push(Action::ReleaseHeldLoader);
        let secs = self
            .dump_started_ns
            .map(|t| seen.now_ns.saturating_sub(t) as f64 / 1e9)
            .unwrap_or(0.0);
        self.report.dump_s = Some(secs);
        let (bytes, error) = match r {
            Ok(d) => {
                self.report.dump_bytes = Some(d.bytes);
                self.report.dump_io_bytes = Some(d.io_bytes);
                self.report.pages_written = Some(d.pages_written);
                self.report.pages_skipped = d.pages_skipped;
                self.report.notes.extend(d.notes);
                (Some(d.bytes), None)
            }
            Err(e) => {
                // What was not dumped stays in the RAM file: nothing is lost.
                self.report.notes.push(format!(
                    "dump failed: {e}; the memory not yet dumped stays in {}",
                    self.crashed_ram.display()
                ));
                self.report.phase = CrashPhase::Failed;
                (None, Some(e))
            }
        };
        self.sample(seen, Some("dump finished"));
        if bytes.is_some() {
            // Everything is in the dump: once the report says so, the crashed
            // memory and the partial dumps of earlier daemons go.
            out.push(Action::SaveReport);
            out.push(Action::DiscardDumped);
        }
        out.push(Action::Emit(EventData::DumpFinished {
            id: self.report.id.clone(),
            bytes,
            seconds: secs,
            error,
        }));
        match self.report.policy.on_crash {
            OnCrash::DumpThenRecover => self.recovery_due = true,
            OnCrash::Dump => {
                out.push(Action::StopBackends);
                out.push(Action::Transition(Step::Gone));
            }
            _ => {}
        }
        out.push(Action::Then(Next::AfterDump));
    }

    fn ready(&mut self, seen: Seen, out: &mut Vec<Action>) {
        let Some(spawned) = self.recovery_spawned_ns else {
            return;
        };
        if self.report.downtime_s.is_some() {
            return;
        }
        let downtime = seen.now_ns.saturating_sub(self.report.crashed_mono_ns);
        self.report.downtime_s = Some(downtime as f64 / 1e9);
        let recovery_s = seen.now_ns.saturating_sub(spawned) as f64 / 1e9;
        if self.io == IoPolicy::Auto {
            let (to, why) = policy::auto_at_ready(recovery_s);
            self.decide(to, why);
        }
        if self.dumping {
            out.push(Action::SetDumpRate(
                policy::io_rates(self.io, Recovery::Ready).0,
            ));
        }
        self.report.recovery_s = Some(recovery_s);
        self.sample(seen, Some("service ready"));
        out.push(Action::Transition(Step::Ready));
        out.push(Action::Emit(EventData::Recovered {
            id: self.report.id.clone(),
            downtime_ms: downtime / 1_000_000,
        }));
        out.push(Action::WarmRecovery);
        self.settle(out);
    }

    /// `auto`'s hold of the dump for a booting recovery VM ends after a while.
    fn hold_over(&mut self, now: u64, out: &mut Vec<Action>) {
        let Some(spawned) = self.recovery_spawned_ns.filter(|_| self.wants_ticks()) else {
            return;
        };
        if let Some((to, why)) = policy::auto_hold_over(spawned, now) {
            self.decide(to, why);
            self.apply_io_policy(out);
        }
    }

    /// Sets the dump's rate and the recovery VM's disk throttling for where the crash
    /// stands: limits only while both run, cleared when the dump ends.
    pub(crate) fn apply_io_policy(&mut self, out: &mut Vec<Action>) {
        let (dump_rate, rec_rate) = if self.dumping {
            policy::io_rates(self.io, self.recovery())
        } else {
            (0, 0)
        };
        out.push(Action::SetDumpRate(dump_rate));
        let running = self.recovery_spawned_ns.is_some();
        let want = running && rec_rate > 0;
        if want == self.throttled || !running {
            return;
        }
        self.throttled = want;
        out.push(Action::ThrottleRecoveryDisks(rec_rate));
    }

    /// Marks the crash done once nothing of it runs any more, and saves the report.
    fn settle(&mut self, out: &mut Vec<Action>) {
        let recovering = self.recovery_due && self.report.downtime_s.is_none();
        // A failure stays the crash's outcome, whatever finishes after it.
        if self.report.phase != CrashPhase::Failed {
            if !self.dumping && !recovering {
                self.report.phase = CrashPhase::Done;
            } else if !self.dumping {
                self.report.phase = CrashPhase::Recovering;
            }
        }
        let finished = !self.dumping && !recovering;
        if finished {
            out.push(Action::ReleaseBudget);
        }
        out.push(Action::SaveReport);
        if finished {
            out.push(Action::SetJob(None));
            out.push(Action::Finish);
        } else if !self.dumping {
            out.push(Action::SetJob(None));
        } else {
            out.push(Action::SetJob(Some("dump")));
        }
    }

    /// Resolves `auto` and says why in the report.
    fn decide(&mut self, to: IoPolicy, why: String) {
        self.io = to;
        self.report.io_policy = format!("auto: {to}");
        self.report
            .notes
            .push(format!("I/O policy auto chose {to}: {why}"));
    }

    fn sample(&mut self, seen: Seen, event: Option<&str>) {
        self.sample_at(seen, self.dumped_bytes, event)
    }

    /// Adds a point to the memory timeline.
    fn sample_at(&mut self, seen: Seen, dumped_bytes: u64, event: Option<&str>) {
        let t_s = seen.now_ns.saturating_sub(self.report.crashed_mono_ns) as f64 / 1e9;
        self.report.timeline.push(MemorySample {
            t_s,
            crashed_bytes: seen.crashed_bytes,
            recovery_bytes: self.recovery_mib * MIB,
            dumped_bytes,
            // Only where a filter left pages out: the dumped line is then drawn as
            // what was written and what was skipped.
            skipped_bytes: (!self.report.policy.filter.is_empty()).then_some(self.skipped_bytes),
            charged_bytes: seen.charged_bytes,
            event: event.map(str::to_string),
        });
    }
}
