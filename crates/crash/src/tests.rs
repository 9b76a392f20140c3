//! Whole crashes driven through the machine in milliseconds: a small world stands in
//! for the daemon (the crashed RAM shrinks as chunks are punched, the memory group
//! charges what both VMs hold, the recovery VM starts and is plugged) and records what
//! a user would notice: the report, its timeline, the events, the I/O rates, the
//! memory the recovery VM was given.

use std::path::PathBuf;

use rebound_api::{CrashPhase, CrashPolicy, CrashReport, EventData, IoPolicy, OnCrash};

use crate::policy::{MIB, SLOW};
use crate::*;

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_000 * SEC;

/// The daemon, as the machine sees it.
struct World {
    m: Option<Crash>,
    now: u64,
    crashed: u64,
    /// A memory group can be had.
    cgroup: bool,
    recovery_fails: bool,
    dump_rate: Option<u64>,
    disk_rates: Vec<u64>,
    /// The recovery VM's boot memory (`None`: all of it), once started.
    boot: Option<Option<u64>>,
    recovery_mib: u64,
    plugs: Vec<u64>,
    events: Vec<EventData>,
    steps: Vec<Step>,
    saved: Option<CrashReport>,
    dump_out: Option<PathBuf>,
    budget: Option<(u64, u64)>,
    discarded: bool,
    finished: bool,
    job: Option<&'static str>,
}

fn policy(on_crash: OnCrash, io: IoPolicy, budget_mib: Option<u64>) -> CrashPolicy {
    CrashPolicy {
        on_crash,
        io_policy: io,
        host_memory_budget_mib: budget_mib,
        min_memory_mib: 128,
        chunk_mib: 64,
        ..CrashPolicy::default()
    }
}

impl World {
    /// A 512 MiB guest that crashed at T0, handled up to the crashed QEMU's release.
    fn crash(p: CrashPolicy) -> World {
        World::crash_with(p, None)
    }

    fn crash_with(p: CrashPolicy, disk: Option<(u64, u64)>) -> World {
        let mut w = World::new();
        w.start(p, disk);
        w
    }

    fn new() -> World {
        World {
            m: None,
            now: T0,
            crashed: 512 * MIB,
            cgroup: true,
            recovery_fails: false,
            dump_rate: None,
            disk_rates: Vec::new(),
            boot: None,
            recovery_mib: 0,
            plugs: Vec::new(),
            events: Vec::new(),
            steps: Vec::new(),
            saved: None,
            dump_out: None,
            budget: None,
            discarded: false,
            finished: false,
            job: None,
        }
    }

    fn start(&mut self, p: CrashPolicy, disk: Option<(u64, u64)>) {
        self.start_moved(p, disk, None)
    }

    fn start_moved(&mut self, p: CrashPolicy, disk: Option<(u64, u64)>, not_moved: Option<&str>) {
        let start = CrashStart {
            id: "20261128T015000.000Z".into(),
            vm: "web".into(),
            cause: "panic".into(),
            policy: p,
            memory_mib: 512,
            block_mib: 2,
            dir: "/vms/web/crashes/1".into(),
            crashed_ram: "/dev/shm/web-1.ram".into(),
            crashed_at: "2026-11-28T01:50:00.000Z".into(),
            ram_bytes: self.crashed,
            disk_since_start: disk,
        };
        let Some((m, acts)) = Crash::start(start, self.seen()) else {
            return;
        };
        self.m = Some(m);
        self.run(acts);
        self.feed(Event::QemuReleased {
            ram_not_moved: not_moved.map(str::to_string),
        });
    }

    fn seen(&self) -> Seen {
        let charged = self.crashed + self.recovery_mib * MIB;
        Seen {
            now_ns: self.now,
            crashed_bytes: self.crashed,
            charged_bytes: self.budget.map(|_| charged),
        }
    }

    fn m(&self) -> &Crash {
        self.m.as_ref().expect("the crash is handled")
    }

    fn report(&self) -> CrashReport {
        self.saved.clone().expect("a report was saved")
    }

    fn at(&mut self, secs: f64) {
        self.now = T0 + (secs * 1e9) as u64;
    }

    fn feed(&mut self, e: Event) {
        let seen = self.seen();
        let acts = self.m.as_mut().expect("the crash is handled").on(e, seen);
        self.run(acts);
    }

    /// Carries out actions in order; answers come before the actions after them.
    fn run(&mut self, acts: Vec<Action>) {
        let mut queue: std::collections::VecDeque<Action> = acts.into();
        while let Some(a) = queue.pop_front() {
            let answer = match a {
                Action::Emit(e) => {
                    self.events.push(e);
                    None
                }
                Action::Transition(s) => {
                    self.steps.push(s);
                    None
                }
                Action::HoldBudget {
                    budget_bytes,
                    limit_bytes,
                } => {
                    if self.cgroup {
                        self.budget = Some((budget_bytes, limit_bytes));
                        Some(Event::BudgetHeld {
                            enforced_by: "cgroup v2".into(),
                            group: "/sys/fs/cgroup/rebound/web".into(),
                        })
                    } else {
                        Some(Event::BudgetAccounted {
                            why: "no cgroup here".into(),
                        })
                    }
                }
                Action::ReleaseBudget => self.budget.take().map(|_| Event::BudgetReleased {
                    peak_bytes: Some(700 * MIB),
                }),
                Action::StartDump { out, rate } => {
                    self.dump_out = Some(out);
                    self.dump_rate = Some(rate);
                    None
                }
                Action::SetDumpRate(r) => {
                    self.dump_rate = Some(r);
                    None
                }
                Action::ThrottleRecoveryDisks(r) => {
                    self.disk_rates.push(r);
                    None
                }
                Action::DiscardCrashedRam | Action::DiscardDumped => {
                    self.crashed = 0;
                    self.discarded = true;
                    None
                }
                Action::ReleaseHeldLoader | Action::StopBackends | Action::WarmRecovery => None,
                Action::StartRecovery { boot_mib, .. } => {
                    if self.recovery_fails {
                        Some(Event::RecoveryFailed {
                            why: "qemu: no such file".into(),
                        })
                    } else {
                        self.boot = Some(boot_mib);
                        self.recovery_mib = boot_mib.unwrap_or(512);
                        Some(Event::RecoveryStarted {
                            pid: 42,
                            note: None,
                        })
                    }
                }
                Action::Plug { plugged_bytes, mib } => {
                    assert_eq!(
                        plugged_bytes,
                        (mib - self.boot.flatten().unwrap_or(512)) * MIB
                    );
                    self.plugs.push(mib);
                    self.recovery_mib = mib;
                    Some(Event::Plugged { mib })
                }
                Action::SaveReport => {
                    self.saved = Some(self.m().report().clone());
                    None
                }
                Action::SetJob(j) => {
                    self.job = j;
                    None
                }
                Action::Finish => {
                    self.finished = true;
                    None
                }
                Action::Then(n) => Some(Event::Then(n)),
            };
            if let Some(e) = answer {
                let seen = self.seen();
                let more = self.m.as_mut().expect("the crash is handled").on(e, seen);
                for a in more.into_iter().rev() {
                    queue.push_front(a);
                }
            }
            if self.finished {
                assert!(queue.is_empty(), "nothing after Finish: {queue:?}");
            }
        }
    }

    /// A chunk of `mib` is durable and punched out.
    fn chunk(&mut self, mib: u64) {
        self.crashed -= mib * MIB;
        let dumped = 512 * MIB - self.crashed;
        self.feed(Event::Chunk {
            dumped_bytes: dumped,
            skipped_bytes: 0,
            crashed_bytes: self.crashed,
        });
    }

    fn dump_done(&mut self) {
        self.feed(Event::DumpFinished(Ok(DumpSummary {
            bytes: 300 * MIB,
            io_bytes: 310 * MIB,
            pages_written: 70_000,
            pages_skipped: [("zero".to_string(), 61_072)].into(),
            notes: vec![],
        })));
    }

    fn timeline(&self) -> Vec<Option<String>> {
        self.report()
            .timeline
            .iter()
            .map(|s| s.event.clone())
            .collect()
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.events.iter().map(|e| e.kind()).collect()
    }
}

fn ev(names: &[Option<&str>]) -> Vec<Option<String>> {
    names.iter().map(|n| n.map(str::to_string)).collect()
}

#[test]
fn dump_and_recover_grows_the_recovery_vm_as_chunks_are_reclaimed() {
    let mut w = World::crash(policy(
        OnCrash::DumpAndRecover,
        IoPolicy::DumpFirst,
        Some(640),
    ));
    // 640 MiB budget less 512 crashed: the recovery VM boots with its minimum.
    assert_eq!(w.boot, Some(Some(128)));
    assert_eq!(w.budget, Some((640 * MIB, (640 + 256) * MIB)));
    assert_eq!(w.dump_out, Some(PathBuf::from("/vms/web/crashes/1/vmcore")));
    assert_eq!((w.dump_rate, w.disk_rates.clone()), (Some(0), vec![SLOW]));
    assert_eq!(w.job, Some("dump"));
    assert_eq!(w.report().phase, CrashPhase::Dumping);
    for i in 1..=4 {
        w.at(i as f64);
        w.chunk(64);
    }
    // 256 MiB punched: the recovery VM was plugged up to 384 MiB, block by block.
    assert_eq!(w.plugs, vec![192, 256, 320, 384]);
    w.at(5.0);
    w.feed(Event::Ready);
    w.at(9.0);
    w.chunk(256);
    w.dump_done();
    assert_eq!(w.plugs.last(), Some(&512));
    assert!(w.finished && w.discarded);
    // The recovery VM's disks run free once the dump is over.
    assert_eq!(w.disk_rates, vec![SLOW, 0]);
    let r = w.report();
    assert_eq!(r.phase, CrashPhase::Done);
    assert_eq!(r.downtime_s, Some(5.0));
    assert_eq!(r.recovery_s, Some(5.0));
    assert_eq!(r.dump_s, Some(9.0));
    assert_eq!(r.dump_bytes, Some(300 * MIB));
    assert_eq!(r.pages_skipped["zero"], 61_072);
    assert_eq!(r.io_policy, "dump-first");
    let limit = r.memory_limit.unwrap();
    assert_eq!(limit.enforced_by, "cgroup v2");
    assert_eq!(limit.peak_bytes, Some(700 * MIB));
    assert_eq!(
        w.timeline(),
        ev(&[
            Some("crash"),
            Some("recovery started"),
            None,
            None,
            None,
            None,
            Some("service ready"),
            None,
            Some("dump finished"),
        ])
    );
    let t = &r.timeline;
    assert_eq!((t[0].crashed_bytes, t[0].recovery_bytes), (512 * MIB, 0));
    assert_eq!(t[0].charged_bytes, Some(512 * MIB));
    assert_eq!(t[1].recovery_bytes, 128 * MIB);
    assert_eq!((t[5].t_s, t[5].dumped_bytes), (4.0, 256 * MIB));
    assert_eq!(t[5].recovery_bytes, 384 * MIB);
    assert_eq!(
        w.kinds(),
        [
            "crash_handling",
            "dump_started",
            "recovery_started",
            "chunk_reclaimed",
            "chunk_reclaimed",
            "chunk_reclaimed",
            "chunk_reclaimed",
            "recovered",
            "chunk_reclaimed",
            "dump_finished",
        ]
    );
    assert_eq!(w.steps, [Step::DumpBegins, Step::Ready]);
    assert_eq!(w.job, None);
}

#[test]
fn recovery_ready_before_the_first_chunk() {
    let mut w = World::crash(policy(
        OnCrash::DumpAndRecover,
        IoPolicy::RecoveryFirst,
        None,
    ));
    // The default budget (memory + minimum) lets it start at its minimum; the dump is
    // held back until it is ready.
    assert_eq!(w.boot, Some(Some(128)));
    assert_eq!(w.dump_rate, Some(SLOW));
    w.at(2.0);
    w.feed(Event::Ready);
    assert_eq!(w.dump_rate, Some(0));
    assert_eq!(w.report().phase, CrashPhase::Dumping);
    assert_eq!(w.job, Some("dump"));
    assert_eq!(w.report().downtime_s, Some(2.0));
    w.at(3.0);
    w.chunk(512);
    w.dump_done();
    let r = w.report();
    assert_eq!(r.phase, CrashPhase::Done);
    assert_eq!(w.plugs, vec![512]);
    assert_eq!(
        w.timeline(),
        ev(&[
            Some("crash"),
            Some("recovery started"),
            Some("service ready"),
            None,
            Some("dump finished"),
        ])
    );
    // recovery-first never throttles the recovery VM's disks.
    assert!(w.disk_rates.is_empty());
}

#[test]
fn budget_never_enough_for_all_of_the_recovery_vm() {
    let mut w = World::crash(policy(OnCrash::DumpAndRecover, IoPolicy::Fair, Some(300)));
    assert_eq!(w.boot, None, "nothing left for the minimum yet");
    w.chunk(256);
    // 300 - 256 crashed = 44 MiB: still below the minimum.
    assert_eq!(w.boot, None);
    w.chunk(128);
    // 300 - 128 = 172 MiB free, rounded to the block.
    assert_eq!(w.boot, Some(Some(172)));
    w.chunk(127);
    assert_eq!(w.plugs, vec![298]);
    w.feed(Event::Ready);
    w.chunk(1);
    w.dump_done();
    // The dump finished; the recovery VM got all the budget allows and no more.
    assert_eq!(w.plugs, vec![298, 300]);
    assert!(w.finished);
    let r = w.report();
    assert_eq!(r.phase, CrashPhase::Done);
    assert_eq!(r.timeline.last().unwrap().recovery_bytes, 300 * MIB);
    assert!(r.timeline.iter().all(|s| s.recovery_bytes <= 300 * MIB));
}

#[test]
fn dump_failure_keeps_the_crashed_memory_and_fails_the_crash() {
    let mut w = World::crash(policy(OnCrash::DumpAndRecover, IoPolicy::DumpFirst, None));
    w.chunk(64);
    w.at(1.5);
    w.feed(Event::DumpFinished(Err("disk full".into())));
    assert!(!w.discarded, "what was not dumped stays in the RAM file");
    assert!(!w.finished, "the recovery VM is not ready yet");
    let r = w.report();
    assert_eq!(r.phase, CrashPhase::Failed);
    assert!(r.notes.contains(
        &"dump failed: disk full; the memory not yet dumped stays in /dev/shm/web-1.ram".into()
    ));
    assert_eq!(r.dump_bytes, None);
    assert!(matches!(
        w.events.last(),
        Some(EventData::DumpFinished { bytes: None, error: Some(e), seconds, .. })
            if e == "disk full" && *seconds == 1.5
    ));
    // The disks are no longer held for a dump that is over.
    assert_eq!(w.disk_rates, vec![SLOW, 0]);
    w.feed(Event::Ready);
    assert!(w.finished);
    assert_eq!(
        w.report().phase,
        CrashPhase::Failed,
        "a failure stays the outcome"
    );
}

#[test]
fn daemon_restarted_mid_dump_resumes_from_the_report() {
    let mut w = World::crash(policy(
        OnCrash::DumpAndRecover,
        IoPolicy::DumpFirst,
        Some(640),
    ));
    w.at(1.0);
    w.chunk(128);
    let saved = w.report();
    assert_eq!(saved.phase, CrashPhase::Dumping);
    // A new daemon: the report as saved, the RAM file as the dump task left it.
    let mut report = saved.clone();
    let state = check_dump(&mut report, DumpFile::Absent, T0 + 4 * SEC).unwrap();
    assert_eq!(
        state,
        DumpState::Unfinished("/vms/web/crashes/1/vmcore".into())
    );
    let mut w2 = World::new();
    w2.crashed = w.crashed;
    w2.recovery_mib = 128;
    w2.budget = Some((640 * MIB, 896 * MIB));
    w2.boot = Some(Some(128));
    w2.at(4.0);
    let facts = ResumeFacts {
        report,
        dump: state,
        memory_mib: 512,
        block_mib: 2,
        dir: "/vms/web/crashes/1".into(),
        crashed_ram: "/dev/shm/web-1.ram".into(),
        crashed_ram_exists: true,
        has_qemu: true,
        wall_now: "2026-11-28T01:50:04.000Z".into(),
    };
    let (m, acts) = Crash::resume(facts, w2.seen()).unwrap();
    w2.m = Some(m);
    w2.run(acts);
    // The dump goes on into the same file; the running recovery VM is kept, not
    // started again, and its disks are held again.
    assert_eq!(
        w2.dump_out,
        Some(PathBuf::from("/vms/web/crashes/1/vmcore"))
    );
    assert_eq!(w2.kinds(), ["dump_started"]);
    assert_eq!(w2.disk_rates, vec![SLOW]);
    assert!(w2.m().report().notes.last().unwrap().ends_with(
        "while this crash was handled; the next daemon took it over and resumed the dump"
    ));
    w2.at(6.0);
    w2.chunk(384);
    assert_eq!(w2.plugs, vec![512]);
    w2.feed(Event::Ready);
    w2.dump_done();
    let r = w2.report();
    assert_eq!(r.phase, CrashPhase::Done);
    // dump_s counts from the crash: the time no daemon ran is part of it.
    assert_eq!(r.dump_s, Some(6.0));
    // The saved timeline (chunks are not saved one by one) and what followed.
    assert_eq!(
        w2.timeline(),
        ev(&[
            Some("crash"),
            Some("recovery started"),
            None,
            Some("service ready"),
            Some("dump finished"),
        ])
    );
    assert_eq!(r.timeline[2].recovery_bytes, 512 * MIB);
}

#[test]
fn restart_recognises_a_dump_finished_before_the_daemon_stopped() {
    let w = World::crash(policy(OnCrash::DumpAndRecover, IoPolicy::Fair, Some(640)));
    let mut report = w.report();
    let whole = DumpFile::Whole {
        file_bytes: 9 * MIB,
        pages_dumped: 2_000,
    };
    let state = check_dump(&mut report, whole, T0 + 3 * SEC).unwrap();
    assert_eq!(
        state,
        DumpState::Finished("/vms/web/crashes/1/vmcore".into())
    );
    assert_eq!(
        (report.dump_s, report.dump_bytes),
        (Some(3.0), Some(9 * MIB))
    );
    let bad = check_dump(
        &mut w.report(),
        DumpFile::Damaged {
            problems: vec!["short".into(), "no notes".into()],
        },
        T0,
    )
    .unwrap_err();
    assert_eq!(
        bad.to_string(),
        "its dump /vms/web/crashes/1/vmcore is there but damaged (short; no notes); it is kept as it is"
    );
    let facts = |dump, has_qemu, exists| ResumeFacts {
        report: report.clone(),
        dump,
        memory_mib: 512,
        block_mib: 2,
        dir: "/vms/web/crashes/1".into(),
        crashed_ram: "/dev/shm/web-1.ram".into(),
        crashed_ram_exists: exists,
        has_qemu,
        wall_now: "now".into(),
    };
    let gone = Crash::resume(
        facts(DumpState::Finished("x".into()), false, false),
        Seen::default(),
    );
    assert_eq!(gone.unwrap_err().to_string(), "its recovery VM is gone");
    let gone = Crash::resume(
        facts(DumpState::Unfinished("x".into()), true, false),
        Seen::default(),
    );
    assert_eq!(
        gone.unwrap_err().to_string(),
        "its RAM file /dev/shm/web-1.ram is gone"
    );
    // Finished and its recovery VM still booting: waited for, nothing started.
    let (m, acts) = Crash::resume(
        facts(DumpState::Finished("x".into()), true, false),
        Seen::default(),
    )
    .unwrap();
    assert!(!m.dumping());
    assert!(!acts
        .iter()
        .any(|a| matches!(a, Action::StartDump { .. } | Action::StartRecovery { .. })));
    assert!(acts.contains(&Action::SetJob(None)));
}

#[test]
fn every_policy_sets_its_rates() {
    let run = |io| {
        let mut w = World::crash(policy(OnCrash::DumpAndRecover, io, None));
        let at_start = (w.dump_rate, w.disk_rates.clone());
        w.feed(Event::Ready);
        let ready = (w.dump_rate, w.disk_rates.clone());
        w.chunk(512);
        w.dump_done();
        (
            at_start,
            ready,
            (w.dump_rate, w.disk_rates.clone()),
            w.report().io_policy,
        )
    };
    let fair = run(IoPolicy::Fair);
    assert_eq!(
        fair,
        (
            (Some(0), vec![]),
            (Some(0), vec![]),
            (Some(0), vec![]),
            "fair".into()
        )
    );
    let dump_first = run(IoPolicy::DumpFirst);
    assert_eq!(dump_first.0, (Some(0), vec![SLOW]));
    assert_eq!(dump_first.1, (Some(0), vec![SLOW]));
    assert_eq!(dump_first.2, (Some(0), vec![SLOW, 0]));
    let recovery_first = run(IoPolicy::RecoveryFirst);
    assert_eq!(recovery_first.0, (Some(SLOW), vec![]));
    assert_eq!(recovery_first.1, (Some(0), vec![]));
    let rates = run(IoPolicy::Rates {
        dump_mbps: 30,
        recovery_mbps: 5,
    });
    assert_eq!(rates.0, (Some(30_000_000), vec![5_000_000]));
    assert_eq!(rates.2, (Some(0), vec![5_000_000, 0]));
    assert_eq!(rates.3, "30:5");
}

#[test]
fn auto_holds_the_dump_while_the_recovery_vm_boots() {
    // Memory-critical: the budget (600 MiB) has no room for the recovery VM's minimum
    // while the crashed RAM is whole, and the service was not disk-bound. The dump
    // goes at full rate until the VM can start (it frees the memory it starts with).
    let mut w = World::crash_with(
        policy(OnCrash::DumpAndRecover, IoPolicy::Auto, Some(600)),
        Some((1_000, T0 - 100 * SEC)),
    );
    assert_eq!(w.boot, None, "no room yet");
    assert_eq!(w.dump_rate, Some(0));
    assert!(!w.m().wants_ticks());
    // A chunk gives it room: it starts, and from then on its boot has the disk.
    w.at(1.0);
    w.chunk(64);
    assert_eq!(w.boot, Some(Some(152)));
    assert_eq!(w.dump_rate, Some(SLOW));
    assert!(w.disk_rates.is_empty(), "its disks are not held");
    assert_eq!(w.report().io_policy, "auto");
    assert!(w.m().wants_ticks());
    w.at(3.0);
    w.feed(Event::Tick);
    assert_eq!(w.dump_rate, Some(SLOW), "2 s into the hold");
    // Its service answers: the dump runs at full rate again, and the report says why.
    w.at(5.0);
    w.feed(Event::Ready);
    assert_eq!(w.dump_rate, Some(0));
    assert_eq!(w.report().io_policy, "auto: recovery-first");
    assert!(w.report().notes.iter().any(|n| n
        == "I/O policy auto chose recovery-first: the recovery VM's boot had the disk first \
            (the dump held to 10 MB/s) and its service answered 4.0 s after it started"));
    assert!(!w.m().wants_ticks());
}

#[test]
fn auto_ends_its_hold_for_a_recovery_vm_that_takes_long() {
    let mut w = World::crash(policy(OnCrash::DumpAndRecover, IoPolicy::Auto, Some(1100)));
    assert_eq!(w.boot, Some(None), "all its memory at once");
    assert_eq!(w.dump_rate, Some(SLOW));
    w.at(9.9);
    w.feed(Event::Tick);
    assert_eq!(w.dump_rate, Some(SLOW));
    assert_eq!(w.report().io_policy, "auto");
    // Not ready 10 s after it started: more likely waiting for memory than for the
    // disk, so the dump goes first (its disks held, as dump-first does).
    w.at(10.0);
    w.feed(Event::Tick);
    assert_eq!(w.dump_rate, Some(0));
    assert_eq!(w.disk_rates, vec![SLOW]);
    assert_eq!(w.m().report().io_policy, "auto: dump-first");
    assert!(w.m().report().notes.iter().any(|n| n
        == "I/O policy auto chose dump-first: the recovery VM was not ready 10 s after it \
            started: the dump, which frees the memory it grows into, goes first"));
    assert!(!w.m().wants_ticks());
    w.at(12.0);
    w.feed(Event::Ready);
    assert_eq!(w.report().io_policy, "auto: dump-first");
    assert_eq!(w.disk_rates, vec![SLOW], "held until the dump ends");
    w.dump_done();
    assert_eq!(w.disk_rates, vec![SLOW, 0]);
}

#[test]
fn auto_gives_a_disk_bound_service_the_disk_until_it_answers() {
    // Memory-critical and disk-bound before the crash (600 MB over 100 s).
    let mut w = World::crash_with(
        policy(OnCrash::DumpAndRecover, IoPolicy::Auto, None),
        Some((600_000_000, T0 - 100 * SEC)),
    );
    assert_eq!(w.boot, Some(Some(128)));
    assert_eq!(w.report().io_policy, "auto: recovery-first");
    assert!(w.report().notes.iter().any(|n| n
        == "I/O policy auto chose recovery-first: the crashed VM's disks moved 6.0 MB/s on average over 100 s"));
    assert_eq!(w.dump_rate, Some(SLOW));
    assert!(!w.m().wants_ticks(), "no bound on the hold");
    w.at(30.0);
    w.feed(Event::Tick);
    assert_eq!(w.dump_rate, Some(SLOW));
    w.feed(Event::Ready);
    assert_eq!(w.dump_rate, Some(0));
    assert_eq!(w.report().io_policy, "auto: recovery-first");
}

#[test]
fn recover_only_boots_with_all_memory_and_no_dump() {
    let mut w = World::crash(policy(OnCrash::Recover, IoPolicy::DumpFirst, None));
    assert!(w.discarded && w.dump_out.is_none());
    assert_eq!(w.boot, Some(None));
    assert_eq!(w.report().phase, CrashPhase::Recovering);
    assert_eq!(w.report().timeline[0].crashed_bytes, 0);
    assert!(w.disk_rates.is_empty(), "no dump, no throttling");
    w.at(7.0);
    w.feed(Event::Ready);
    assert!(w.finished);
    assert_eq!(w.report().phase, CrashPhase::Done);
    assert_eq!(w.report().downtime_s, Some(7.0));
}

#[test]
fn dump_only_stops_the_vm_and_holds_no_budget() {
    let mut p = policy(OnCrash::Dump, IoPolicy::Fair, None);
    p.dump_dir = Some("/var/dumps".into());
    let mut w = World::crash(p);
    assert_eq!(w.budget, None);
    assert_eq!(
        w.dump_out,
        Some(PathBuf::from("/var/dumps/web-20261128T015000.000Z.vmcore"))
    );
    w.chunk(512);
    assert_eq!(w.boot, None);
    w.dump_done();
    assert!(w.finished && w.boot.is_none());
    assert_eq!(w.steps, [Step::DumpBegins, Step::Gone]);
    assert_eq!(w.report().phase, CrashPhase::Done);
    assert_eq!(w.report().memory_limit, None);
}

#[test]
fn dump_then_recover_waits_for_the_dump() {
    let mut w = World::crash(policy(OnCrash::DumpThenRecover, IoPolicy::Fair, None));
    w.chunk(500);
    assert_eq!(w.boot, None);
    w.chunk(12);
    w.at(4.0);
    w.dump_done();
    assert_eq!(w.boot, Some(None));
    assert_eq!(w.report().phase, CrashPhase::Recovering);
    w.feed(Event::Ready);
    assert!(w.finished);
    assert_eq!(w.report().recovery_s, Some(0.0));
}

#[test]
fn keep_paused_is_no_crash_to_handle() {
    let w = World::crash(policy(OnCrash::None, IoPolicy::Fair, None));
    assert!(w.m.is_none() && w.events.is_empty());
}

#[test]
fn recovery_vm_crashing_before_ready_fails_the_crash() {
    let mut w = World::crash(policy(OnCrash::DumpAndRecover, IoPolicy::Fair, None));
    w.feed(Event::CrashedAgain {
        cause: "hang".into(),
    });
    // The dump still holds memory: kept for the operator.
    assert!(!w.finished);
    assert_eq!(w.report().phase, CrashPhase::Failed);
    w.chunk(512);
    w.dump_done();
    assert!(w.finished);
    assert_eq!(w.report().phase, CrashPhase::Failed);
    let mut w = World::crash(policy(OnCrash::Recover, IoPolicy::Fair, None));
    w.feed(Event::Ready);
    assert!(w.finished);
    let mut w = World::crash(policy(OnCrash::Recover, IoPolicy::Fair, None));
    w.feed(Event::CrashedAgain {
        cause: "panic".into(),
    });
    assert!(w.finished);
    assert!(w
        .report()
        .notes
        .contains(&"the recovery VM crashed too (panic) before it was ready".into()));
}

#[test]
fn a_recovery_vm_that_dies_or_cannot_start_holds_the_dump_no_longer() {
    for io in [IoPolicy::Auto, IoPolicy::RecoveryFirst] {
        let mut w = World::crash(policy(OnCrash::DumpAndRecover, io, None));
        assert_eq!(w.dump_rate, Some(SLOW), "{io}");
        w.feed(Event::CrashedAgain {
            cause: "panic".into(),
        });
        assert_eq!(w.dump_rate, Some(0), "{io}");
        assert!(!w.m().wants_ticks());
        let mut w = World::new();
        w.recovery_fails = true;
        w.start(policy(OnCrash::DumpAndRecover, io, None), None);
        assert_eq!(w.report().phase, CrashPhase::Failed);
        assert_eq!(w.dump_rate, Some(0), "{io}");
    }
}

#[test]
fn recovery_that_cannot_start_fails_once_the_dump_ends() {
    let mut w = World::new();
    w.recovery_fails = true;
    w.start(policy(OnCrash::DumpThenRecover, IoPolicy::Fair, None), None);
    w.chunk(512);
    w.dump_done();
    assert!(w.finished);
    let r = w.report();
    assert_eq!(r.phase, CrashPhase::Failed);
    assert!(r
        .notes
        .contains(&"the recovery VM failed to start: qemu: no such file".into()));
}

#[test]
fn budget_without_a_memory_group_is_accounted() {
    let mut p = policy(OnCrash::Recover, IoPolicy::Fair, Some(700));
    p.min_memory_mib = 64;
    let mut w = World::new();
    w.cgroup = false;
    w.start_moved(p, None, Some("cross-device link"));
    let r = w.report();
    let limit = r.memory_limit.clone().unwrap();
    assert_eq!(limit.enforced_by, "accounted");
    assert_eq!(limit.budget_bytes, 700 * MIB);
    assert_eq!(limit.why_not.as_deref(), Some("no cgroup here"));
    assert!(r
        .notes
        .contains(&"cannot move the crashed RAM aside: cross-device link".into()));
    assert!(r.timeline[0].charged_bytes.is_none());
    w.feed(Event::Ready);
    assert!(w.finished);
    assert_eq!(w.report().memory_limit.unwrap().peak_bytes, None);
}

#[test]
fn a_filtered_dump_keeps_what_it_skipped_apart_in_the_timeline() {
    let mut p = policy(OnCrash::DumpAndRecover, IoPolicy::DumpFirst, Some(640));
    p.filter = vec![rebound_api::PageClass::Free];
    let mut w = World::crash(p);
    w.at(1.0);
    w.crashed -= 64 * MIB;
    w.feed(Event::Chunk {
        dumped_bytes: 64 * MIB,
        skipped_bytes: 30 * MIB,
        crashed_bytes: w.crashed,
    });
    let t = w.m().report().timeline.clone();
    let last = t
        .iter()
        .rev()
        .find(|s| s.dumped_bytes > 0)
        .cloned()
        .unwrap_or_else(|| panic!("{t:?}"));
    assert_eq!(last.dumped_bytes, 64 * MIB);
    assert_eq!(last.skipped_bytes, Some(30 * MIB));
    // Without a filter nothing is skipped, and the sample says nothing of it.
    let mut w = World::crash(policy(
        OnCrash::DumpAndRecover,
        IoPolicy::DumpFirst,
        Some(640),
    ));
    w.at(1.0);
    w.chunk(64);
    let t = &w.m().report().timeline;
    assert!(t.iter().any(|s| s.dumped_bytes > 0));
    assert!(t.iter().all(|s| s.skipped_bytes.is_none()));
}
