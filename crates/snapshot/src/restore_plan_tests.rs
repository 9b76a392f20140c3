//! Whole restores driven through the plan and its events, in milliseconds: what the
//! report a user reads says at the end.

use std::time::{Duration, Instant};

use rebound_api::{
    LoadPath, RamCheck as Asked, RestOrder as Order, RestoreMode as Mode, RestoreReport,
};

use super::*;
use crate::trace::TracePage;

fn facts(mode: Mode) -> Facts {
    Facts {
        vm: "r1".into(),
        snapshot: "/snaps/s1".into(),
        asked: mode,
        rest_order: Order::Fafl,
        ws_pages: None,
        ram_check: Asked::Auto,
        on_backend: false,
        trust: Trust::Own,
        trace: Some(TraceFacts {
            pages: 1000,
            default_elastic_pages: 300,
            source: "post-snapshot".into(),
        }),
        chunks: 4,
        has_stock_stream: false,
        path: LoadPath::PageCache,
        no_page_server: None,
        notes: Vec::new(),
    }
}

fn pages(r: std::ops::Range<u64>) -> Vec<TracePage> {
    r.map(|page| TracePage { block: 0, page }).collect()
}

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

/// Runs a restore from its plan to its start; the report and the restore.
fn start(plan: &Plan, t0: Instant, held: bool) -> (Restore, RestoreReport, Vec<Action>) {
    let r = Restore::new(plan, t0, held, plan.report.trace_source.is_some());
    let mut rep = plan.report.clone();
    let loaded = match plan.before_start {
        BeforeStart::WorkingSet(n) => Some((n as u64, n as u64 * 4096, 0.2)),
        BeforeStart::CopyImage => Some((2048, 2048 * 4096, 0.5)),
        BeforeStart::Nothing => None,
    };
    let before = if plan.checking == Checking::AsCopied {
        4
    } else {
        0
    };
    let a = r.on(
        &mut rep,
        Event::LoadedBeforeStart {
            loaded,
            chunks_checked: before,
            full_check_s: None,
        },
    );
    assert!(a.is_empty());
    let a = r.on(
        &mut rep,
        Event::DeviceStateLoaded {
            accel: "tcg".into(),
            replayed: Vec::new(),
        },
    );
    (r, rep, a)
}

/// The vCPUs started `at_ms` after the request (not held).
fn started(r: &Restore, rep: &mut RestoreReport, t0: Instant, at_ms: u64) -> Vec<Action> {
    r.on(
        rep,
        Event::Started {
            at: ms(t0, at_ms),
            resume_stamp: None,
            loaded_while_held: None,
        },
    )
}

fn watch<'a>(
    started: Instant,
    answered: Option<Instant>,
    touched: &'a [TracePage],
    loaded: &'a [TracePage],
) -> WatchEnd<'a> {
    WatchEnd {
        started,
        answered,
        counters: Some(((10, 1000), (15, 6000))),
        loader_bytes_after_start: 500,
        touched: Some(touched),
        loaded,
        recorded: Ok(false),
        watch_s: 5.0,
    }
}

#[test]
fn the_layout_is_checked_before_anything_is_read() {
    assert_eq!(
        check_fit(true, true, &[("ram", 1 << 30)], 1024),
        Err(PlanError::BackendRecovery)
    );
    let e = check_fit(false, false, &[("ram", 1 << 30), ("vmem", 1 << 20)], 1024).unwrap_err();
    assert_eq!(e.to_string(), "the snapshot has 2 RAM blocks; restores of guests with hot-plugged memory are not supported yet");
    let e = check_fit(false, false, &[("ram", 1 << 29)], 1024).unwrap_err();
    assert_eq!(e.to_string(), "the snapshot's RAM block \"ram\" is 536870912 bytes but its VM spec says 1024 MiB of memory: the manifest does not fit together");
    assert_eq!(check_fit(true, false, &[("ram", 1 << 30)], 1024), Ok(()));
}

#[test]
fn an_elastic_restore_without_a_trace_runs_lazily_and_records_one() {
    let t0 = Instant::now();
    let p = plan(Facts {
        trace: None,
        ..facts(Mode::Elastic)
    })
    .unwrap();
    assert_eq!(p.mode, Mode::Lazy);
    assert_eq!(p.memory, Memory::PrivateImage);
    assert_eq!(p.before_start, BeforeStart::Nothing);
    assert_eq!(p.loader, None);
    assert_eq!(p.checking, Checking::BesideGuest);
    assert_eq!(p.report.working_set_pages, 0);
    assert_eq!(p.report.trace_source, None);
    assert_eq!(p.report.notes[0], "the snapshot has no working-set trace: restored lazily instead of elastic; this restore records one");
    assert!(p.report.notes[1]
        .starts_with("RAM checked in the background (the snapshot is this daemon's own)"));
    let (r, mut rep, a) = start(&p, t0, false);
    assert_eq!(
        a,
        vec![
            Action::CheckBesideGuest,
            Action::Publish,
            Action::GuardImage,
            Action::ArmTrace { held: false },
            Action::Cont
        ]
    );
    assert_eq!(r.settle_after(), SettleAfter::Window);
    let a = r.on(
        &mut rep,
        Event::Started {
            at: ms(t0, 100),
            resume_stamp: Some(7),
            loaded_while_held: None,
        },
    );
    assert_eq!(a, vec![Action::Publish]);
    assert_eq!(
        rep.memory_loaded_s, None,
        "a lazy guest's memory is not all in yet"
    );
    let touched = pages(0..50);
    assert!(r.records_trace(Some(&touched)));
    assert!(!r.records_trace(Some(&[])));
    let mut w = watch(ms(t0, 100), Some(ms(t0, 900)), &touched, &[]);
    w.recorded = Ok(true);
    r.on(&mut rep, Event::WatchEnded(&w));
    r.on(&mut rep, Event::Settled { at: ms(t0, 6000) });
    assert_eq!(rep.phase, "done");
    assert!(rep.trace_recorded);
    assert_eq!(rep.time_to_responsive_s, Some(0.9));
    assert_eq!(rep.responsive_after_start_s, Some(0.8));
    assert_eq!(rep.hit_rate, None);
    assert_eq!(
        rep.memory_loaded_s,
        Some(6.0),
        "a lazy restore's memory is complete once settled"
    );
}

#[test]
fn disks_on_rebounds_backend_make_a_working_set_restore_eager() {
    let t0 = Instant::now();
    let p = plan(Facts {
        on_backend: true,
        ..facts(Mode::WorkingSet)
    })
    .unwrap();
    assert_eq!(
        (p.mode, p.memory, p.before_start),
        (Mode::Eager, Memory::SharedCopy, BeforeStart::CopyImage)
    );
    assert_eq!(p.report.notes, vec!["its disks are served by Rebound's backend, which needs the guest's RAM shared: restored eagerly instead of working-set".to_string()]);
    assert_eq!(p.report.ram_check, Some(Asked::Full));
    assert_eq!(p.report.working_set_pages, 0);
    let (r, mut rep, a) = start(&p, t0, false);
    assert!(
        !a.contains(&Action::GuardImage),
        "a copy cannot change under the guest"
    );
    assert_eq!(r.settle_after(), SettleAfter::Never);
    started(&r, &mut rep, t0, 2500);
    assert_eq!(
        rep.memory_loaded_s,
        Some(2.5),
        "every page was read before the start"
    );
    assert_eq!(rep.time_to_running_s, Some(2.5));
    assert_eq!(
        (rep.ram_chunks_checked, rep.ram_chunks_checked_before_start),
        (4, 4)
    );
    assert_eq!(rep.pages_loaded_before_start, 2048);
}

#[test]
fn an_image_another_user_can_write_is_copied_not_mapped() {
    let p = plan(Facts {
        trust: Trust::Mutable,
        ..facts(Mode::Elastic)
    })
    .unwrap();
    assert_eq!(p.mode, Mode::Eager);
    assert!(p.ram_check.copy_instead);
    assert_eq!(p.checking, Checking::AsCopied);
    assert!(p.report.notes[0].contains("restored by a checked copy instead of mapping it"));
    // Off wins even then: the user said so.
    let p = plan(Facts {
        trust: Trust::Mutable,
        ram_check: Asked::Off,
        ..facts(Mode::Lazy)
    })
    .unwrap();
    assert_eq!(
        (p.mode, p.checking, p.report.ram_check),
        (Mode::Lazy, Checking::None, Some(Asked::Off))
    );
    // A snapshot from elsewhere is checked in full before the start.
    let p = plan(Facts {
        trust: Trust::Stable,
        ..facts(Mode::Elastic)
    })
    .unwrap();
    assert_eq!(p.checking, Checking::FullBeforeStart);
}

#[test]
fn the_elastic_working_set_is_the_estimate_or_what_was_asked_capped_by_the_trace() {
    let p = plan(facts(Mode::Elastic)).unwrap();
    assert_eq!(
        (p.before_start, p.report.working_set_pages),
        (BeforeStart::WorkingSet(300), 300)
    );
    assert_eq!(p.checking, Checking::WithLoader);
    let p = plan(Facts {
        ws_pages: Some(5000),
        ..facts(Mode::Elastic)
    })
    .unwrap();
    assert_eq!(p.report.working_set_pages, 1000);
    let p = plan(Facts {
        ws_pages: Some(5000),
        ..facts(Mode::WorkingSet)
    })
    .unwrap();
    assert_eq!(
        p.report.working_set_pages, 1000,
        "working-set reads the whole trace"
    );
    let p = plan(Facts {
        rest_order: Order::FileOrder,
        ..facts(Mode::WorkingSet)
    })
    .unwrap();
    assert_eq!(p.loader, Some(RestOrder::FileOrder));
}

#[test]
fn a_stock_restore_needs_its_stream_and_reports_no_ram_check() {
    assert_eq!(
        plan(facts(Mode::Stock)).unwrap_err(),
        PlanError::NoStockStream
    );
    let p = plan(Facts {
        has_stock_stream: true,
        ..facts(Mode::Stock)
    })
    .unwrap();
    assert!(p.stock_stream && !p.ignore_shared);
    assert_eq!((p.report.ram_check, p.report.ram_chunks), (None, 0));
    let mut rep = p.report.clone();
    let r = Restore::new(&p, Instant::now(), false, true);
    r.on(
        &mut rep,
        Event::LoadedBeforeStart {
            loaded: None,
            chunks_checked: 3,
            full_check_s: Some(1.0),
        },
    );
    assert_eq!((rep.ram_chunks_checked, rep.ram_check_s), (0, None));
}

#[test]
fn a_working_set_restore_whose_guest_answers_before_the_loader_is_done() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::WorkingSet)).unwrap();
    let (r, mut rep, a) = start(&p, t0, false);
    assert_eq!(a.last(), Some(&Action::Cont));
    assert_eq!(r.settle_after(), SettleAfter::Loader);
    let a = r.on(
        &mut rep,
        Event::Started {
            at: ms(t0, 400),
            resume_stamp: Some(42),
            loaded_while_held: Some(0),
        },
    );
    assert_eq!(
        a,
        vec![Action::Publish, Action::StartLoader(RestOrder::Fafl)]
    );
    assert_eq!(
        (rep.phase.as_str(), rep.started_unix_ns),
        ("watching", Some(42))
    );
    // The guest answers and the window ends while the loader still reads.
    let loaded = pages(0..1000);
    let touched = pages(100..1300);
    let w = watch(ms(t0, 400), Some(ms(t0, 1400)), &touched, &loaded);
    r.on(&mut rep, Event::WatchEnded(&w));
    assert_eq!(rep.phase, "done");
    assert_eq!(rep.memory_loaded_s, None);
    assert_eq!(
        (rep.major_faults_after_start, rep.bytes_read_after_start),
        (Some(5), Some(5500))
    );
    assert_eq!(rep.pages_touched_after_start, 1200);
    assert_eq!((rep.hit_rate, rep.accuracy), (Some(0.9), Some(0.9)));
    assert!(!rep.trace_recorded);
    r.on(
        &mut rep,
        Event::LoaderDone {
            at: ms(t0, 9000),
            pages: 5000,
            seconds: 8.6,
            stopped: false,
            chunks_checked: 4,
        },
    );
    assert_eq!(rep.memory_loaded_s, Some(9.0));
    assert_eq!(
        (
            rep.background_pages,
            rep.background_s,
            rep.ram_chunks_checked
        ),
        (5000, Some(8.6), 4)
    );
    // The settle after it changes nothing the loader measured.
    r.on(&mut rep, Event::Settled { at: ms(t0, 9500) });
    assert_eq!(rep.memory_loaded_s, Some(9.0));
    assert_eq!(rep.ram_chunks_checked_before_start, 0);
}

#[test]
fn a_held_restore_loads_and_arms_its_trace_before_its_start() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::Elastic)).unwrap();
    let (r, mut rep, a) = start(&p, t0, true);
    assert_eq!(
        a,
        vec![
            Action::ArmTrace { held: true },
            Action::StartLoader(RestOrder::Fafl),
            Action::Publish,
            Action::GuardImage
        ]
    );
    assert_eq!(rep.phase, "held");
    assert_eq!(rep.accel.as_deref(), Some("tcg"));
    let a = r.on(
        &mut rep,
        Event::Started {
            at: ms(t0, 30_000),
            resume_stamp: None,
            loaded_while_held: Some(1 << 20),
        },
    );
    assert_eq!(a, vec![Action::Publish], "its loader runs already");
    assert_eq!(rep.bytes_loaded_while_held, 1 << 20);
    assert_eq!(rep.time_to_running_s, Some(30.0));
}

#[test]
fn a_failed_loader_leaves_memory_never_loaded_until_a_settle() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::Elastic)).unwrap();
    let (r, mut rep, _) = start(&p, t0, false);
    started(&r, &mut rep, t0, 300);
    r.on(
        &mut rep,
        Event::LoaderFailed {
            error: "read /snaps/s1/ram-ram.img: EIO".into(),
            chunks_checked: 2,
        },
    );
    assert_eq!(
        rep.background_error.as_deref(),
        Some("read /snaps/s1/ram-ram.img: EIO")
    );
    assert_eq!((rep.memory_loaded_s, rep.ram_chunks_checked), (None, 2));
    // A stopped loader's end says nothing about memory either.
    r.on(
        &mut rep,
        Event::LoaderDone {
            at: ms(t0, 900),
            pages: 10,
            seconds: 0.5,
            stopped: true,
            chunks_checked: 0,
        },
    );
    assert_eq!((rep.memory_loaded_s, rep.ram_chunks_checked), (None, 2));
}

#[test]
fn a_damaged_chunk_found_after_the_start_fails_the_restore_and_stops_the_guest() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::Lazy)).unwrap();
    let (r, mut rep, _) = start(&p, t0, false);
    started(&r, &mut rep, t0, 100);
    r.on(&mut rep, Event::ChunksChecked(1));
    let err = "ram-ram.img: checksum mismatch in chunk 2 (bytes 128..192): the snapshot's RAM image is damaged";
    let a = r.on(
        &mut rep,
        Event::Damaged {
            error: err.into(),
            running: true,
        },
    );
    let said = format!("{err}: the guest was stopped");
    assert_eq!(
        a,
        vec![
            Action::Publish,
            Action::Fail(said.clone()),
            Action::StopGuest
        ]
    );
    assert_eq!(
        (rep.phase.as_str(), rep.error.as_deref()),
        ("failed", Some(said.as_str()))
    );
    assert_eq!(rep.ram_chunks_checked, 1);
    // Found after the guest is gone: nothing left to stop.
    let a = r.on(
        &mut rep,
        Event::Damaged {
            error: err.into(),
            running: false,
        },
    );
    assert_eq!(a, vec![Action::Publish, Action::Fail(err.into())]);
}

#[test]
fn a_refused_settle_leaves_a_lazy_restores_memory_unloaded() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::Lazy)).unwrap();
    let (r, mut rep, _) = start(&p, t0, false);
    started(&r, &mut rep, t0, 100);
    let w = WatchEnd {
        answered: None,
        touched: None,
        recorded: Err("disk full".into()),
        ..watch(ms(t0, 100), None, &[], &[])
    };
    r.on(&mut rep, Event::WatchEnded(&w));
    // The settle was refused (a tap NIC, say): no Settled event comes.
    assert_eq!(rep.memory_loaded_s, None);
    assert_eq!(rep.phase, "done");
    assert_eq!(
        rep.notes.last().map(String::as_str),
        Some("the trace could not be saved in the snapshot: disk full")
    );
    assert!(rep
        .notes
        .iter()
        .any(|n| n.starts_with("no service answer to time")));
    assert_eq!(rep.time_to_responsive_s, None);
}

#[test]
fn too_few_touches_for_a_hit_rate_say_so() {
    let t0 = Instant::now();
    let p = plan(facts(Mode::WorkingSet)).unwrap();
    let (r, mut rep, _) = start(&p, t0, false);
    let (loaded, touched) = (pages(0..1000), pages(0..10));
    let w = watch(ms(t0, 100), Some(ms(t0, 200)), &touched, &loaded);
    r.on(&mut rep, Event::WatchEnded(&w));
    assert_eq!(rep.hit_rate, None);
    assert!(rep.notes.contains(
        &"hit rate and accuracy need 1000 touched pages; the guest touched 10 in 5 s".to_string()
    ));
}

#[test]
fn a_checker_that_cannot_start_says_the_guest_runs_unchecked() {
    let p = plan(facts(Mode::Lazy)).unwrap();
    let (r, mut rep, _) = start(&p, Instant::now(), false);
    r.on(&mut rep, Event::CheckerUnavailable("no threads".into()));
    assert_eq!(rep.ram_check, Some(Asked::Off));
    assert_eq!(
        rep.notes.last().map(String::as_str),
        Some("the RAM check could not start (no threads): the guest runs unchecked")
    );
}

#[test]
fn the_page_server_runs_where_it_can_and_the_report_says_why_not_elsewhere() {
    let served = |f: Facts| plan(f).unwrap();
    let f = |mode| Facts {
        path: LoadPath::Auto,
        ..facts(mode)
    };
    // Every image-fed mode runs on the page server: shared RAM, no settle, no
    // loader of the daemon's, each chunk checked before its pages leave.
    for (mode, before) in [
        (Mode::Lazy, BeforeStart::Nothing),
        (Mode::Eager, BeforeStart::CopyImage),
    ] {
        let p = served(f(mode));
        assert_eq!(
            (p.memory, p.before_start, p.loader),
            (Memory::Served, before, None)
        );
        assert_eq!(p.checking, Checking::AsServed);
        assert_eq!(p.report.path, Some(LoadPath::PageServer));
        assert_eq!(p.report.ram_check, Some(Asked::Full));
        let r = Restore::new(&p, Instant::now(), false, true);
        assert_eq!(r.settle_after(), SettleAfter::Never);
    }
    // A host or snapshot the page server cannot serve: the page cache, with why.
    let p = served(Facts {
        no_page_server: Some("no userfaultfd".into()),
        ..f(Mode::Lazy)
    });
    assert_eq!(
        (p.memory, p.report.path),
        (Memory::PrivateImage, Some(LoadPath::PageCache))
    );
    assert!(p
        .report
        .notes
        .iter()
        .any(|n| n.contains("not the page server: no userfaultfd")));
    // Asked for by name, it is an error instead.
    let e = plan(Facts {
        no_page_server: Some("no userfaultfd".into()),
        path: LoadPath::PageServer,
        ..facts(Mode::Lazy)
    })
    .unwrap_err();
    assert_eq!(e, PlanError::NoPageServer("no userfaultfd".into()));
    // Disks on Rebound's backend, an image others can change, or --ram-check off.
    let p = served(Facts {
        on_backend: true,
        ..f(Mode::Lazy)
    });
    assert_eq!((p.mode, p.memory), (Mode::Eager, Memory::SharedCopy));
    let p = served(Facts {
        trust: Trust::Mutable,
        ..f(Mode::Elastic)
    });
    assert_eq!((p.mode, p.memory), (Mode::Eager, Memory::SharedCopy));
    let p = served(Facts {
        ram_check: Asked::Off,
        ..f(Mode::Lazy)
    });
    assert_eq!((p.memory, p.checking), (Memory::Served, Checking::None));
    // Stock stays QEMU's own.
    let p = served(Facts {
        has_stock_stream: true,
        ..f(Mode::Stock)
    });
    assert_eq!((p.memory, p.report.path), (Memory::SharedStream, None));
}
