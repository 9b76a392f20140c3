//! Lost and duplicated frames, a cohort that dies, a coordinator that dies, a VM
//! whose load fails.

use std::sync::atomic::Ordering;
use std::time::Duration;

use rebound_coord::cohort::CohortVmState;
use rebound_coord::msg::{LoadVm, Message};
use rebound_coord::report::{Outcome, VmState};
use rebound_coord::{restore, Plan};

use crate::common::{
    cohort, json, proxy, quick, raw_client, recv_answer, token, Behaviour, Dir, Fault, StandInVms,
};
use crate::restore::vm;

fn load(ms: u64) -> Behaviour {
    Behaviour {
        load: Duration::from_millis(ms),
        ..Behaviour::default()
    }
}

async fn two_cohorts_through_proxies(
    faults: [(Dir, Fault, &'static str); 2],
) -> (rebound_coord::RestoreReport, std::sync::Arc<StandInVms>) {
    let vms = StandInVms::new(&[("a", load(30)), ("b", load(60)), ("c", load(10))]);
    let one = cohort(vms.clone(), token()).await;
    let two = cohort(vms.clone(), token()).await;
    let p1 = proxy(one.local_addr(), faults[0].0, faults[0].1, faults[0].2).await;
    let p2 = proxy(two.local_addr(), faults[1].0, faults[1].1, faults[1].2).await;
    let plan = Plan {
        restore_id: "faulty".into(),
        vms: vec![
            vm("a", p1.addr, &["b"]),
            vm("b", p2.addr, &["a"]),
            vm("c", p1.addr, &["b"]),
        ],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    assert!(
        p1.fired.load(Ordering::SeqCst),
        "proxy 1 never met its frame"
    );
    assert!(
        p2.fired.load(Ordering::SeqCst),
        "proxy 2 never met its frame"
    );
    (report, vms)
}

fn assert_restored_once(report: &rebound_coord::RestoreReport, vms: &StandInVms) {
    assert_eq!(report.outcome, Outcome::Restored, "{report:#?}");
    for v in &report.vms {
        assert_eq!(v.state, VmState::Restored);
        assert_eq!(vms.count("load", &v.vm), 1, "{} loaded once", v.vm);
        assert_eq!(vms.count("start", &v.vm), 1, "{} started once", v.vm);
    }
    assert!(
        report.cohorts.iter().all(|c| c.reconnects >= 1),
        "each refused frame costs a reconnection: {:?}",
        report.cohorts
    );
}

#[tokio::test]
async fn lost_frames_are_recovered_by_retry() {
    let (report, vms) = two_cohorts_through_proxies([
        (Dir::ToCoordinator, Fault::Drop, "\"LOAD_FIN\""),
        (Dir::ToCohort, Fault::Drop, "\"START\""),
    ])
    .await;
    assert_restored_once(&report, &vms);
}

#[tokio::test]
async fn duplicated_frames_load_and_start_nothing_twice() {
    let (report, vms) = two_cohorts_through_proxies([
        (Dir::ToCohort, Fault::Duplicate, "\"LOAD\""),
        (Dir::ToCohort, Fault::Duplicate, "\"START\""),
    ])
    .await;
    assert_restored_once(&report, &vms);
}

#[tokio::test]
async fn repeated_commands_are_answered_again_not_run_again() {
    let vms = StandInVms::new(&[("a", load(100))]);
    let c = cohort(vms.clone(), token()).await;
    let (mut r, mut w) = raw_client(c.local_addr(), &token()).await;
    let load = Message::Load {
        restore_id: "dup".into(),
        vms: vec![LoadVm {
            vm: "a".into(),
            ws_pages: 7,
            args: serde_json::Value::Null,
        }],
    };
    // A second LOAD while loading: one load, one answer when done.
    w.write(&json(&load)).await.unwrap();
    w.write(&json(&load)).await.unwrap();
    assert!(matches!(
        recv_answer(&mut r).await,
        Some(Message::LoadFin { pages: 7, .. })
    ));
    // A LOAD once loaded: LOAD_FIN again.
    w.write(&json(&load)).await.unwrap();
    assert!(matches!(
        recv_answer(&mut r).await,
        Some(Message::LoadFin { .. })
    ));
    let start = Message::Start {
        restore_id: "dup".into(),
        vm: "a".into(),
    };
    w.write(&json(&start)).await.unwrap();
    w.write(&json(&start)).await.unwrap();
    // Answers until RESTORE_FIN: START_FIN once or twice (the second START may
    // come after the start ended), always the same start.
    let mut fins = Vec::new();
    loop {
        match recv_answer(&mut r).await {
            Some(Message::StartFin {
                started_unix_ns, ..
            }) => fins.push(started_unix_ns),
            Some(Message::RestoreFin { .. }) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let started_unix_ns = fins[0];
    assert!(fins.iter().all(|&f| f == started_unix_ns), "{fins:?}");
    w.write(&json(&start)).await.unwrap();
    assert_eq!(
        recv_answer(&mut r).await,
        Some(Message::StartFin {
            restore_id: "dup".into(),
            vm: "a".into(),
            started_unix_ns
        })
    );
    assert!(matches!(
        recv_answer(&mut r).await,
        Some(Message::RestoreFin { .. })
    ));
    assert_eq!(vms.count("load", "a"), 1);
    assert_eq!(vms.count("start", "a"), 1);
    assert_eq!(c.status("dup").unwrap().vms["a"], CohortVmState::Restored);
}

#[tokio::test]
async fn a_cohort_dying_mid_restore_is_reported_and_the_rest_aborted() {
    // x (on the cohort that dies) loads slowly; y depends on x and is held; z is
    // independent and restores.
    let vms = StandInVms::new(&[("x", load(2000)), ("y", load(20)), ("z", load(10))]);
    let one = cohort(vms.clone(), token()).await;
    let two = cohort(vms.clone(), token()).await;
    let dying = cohort(vms.clone(), token()).await;
    let dead_addr = dying.local_addr().to_string();
    let plan = Plan {
        restore_id: "dies".into(),
        vms: vec![
            vm("x", dying.local_addr(), &[]),
            vm("y", two.local_addr(), &["x"]),
            vm("z", one.local_addr(), &[]),
        ],
    };
    let run = tokio::spawn(async move { restore(&plan, &token(), &quick()).await });
    // The cohort dies mid-restore: x loading, y loaded and held for it, z restored.
    let since = tokio::time::Instant::now();
    while vms.count("load", "x") == 0
        || vms.at("loaded", "y").is_none()
        || vms.at("restored", "z").is_none()
    {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "the restore never reached x loading, y held, z restored"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(dying);
    let report = run.await.unwrap().unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    let Outcome::Aborted { reason } = &report.outcome else {
        panic!("not aborted: {report:#?}");
    };
    assert!(
        reason.contains(&dead_addr) && reason.contains("unreachable"),
        "{reason}"
    );
    let state = |n: &str| report.vms.iter().find(|v| v.vm == n).unwrap().clone();
    assert_eq!(state("x").state, VmState::Unknown);
    assert_eq!(state("y").state, VmState::Aborted);
    assert!(state("y").held);
    assert_eq!(state("z").state, VmState::Restored);
    assert_eq!(vms.count("abort", "y"), 1);
    assert_eq!(vms.count("start", "y"), 0);
    let dead = report.cohorts.iter().find(|c| c.addr == dead_addr).unwrap();
    assert!(!dead.reachable && dead.error.is_some());
    assert_eq!(report.cohorts.iter().filter(|c| c.reachable).count(), 2);
    let status = two.status("dies").unwrap();
    assert!(status.aborted.unwrap().contains("unreachable"));
    assert_eq!(
        status.vms["y"],
        CohortVmState::Aborted {
            while_loading: false
        }
    );
}

#[tokio::test]
async fn a_cohort_aborts_held_vms_when_the_coordinator_dies_after_load() {
    // q depends on p, so q is held; p is still loading when the coordinator dies.
    let vms = StandInVms::new(&[("p", load(800)), ("q", load(20))]);
    let c = cohort(vms.clone(), token()).await;
    let plan = Plan {
        restore_id: "orphaned".into(),
        vms: vec![
            vm("p", c.local_addr(), &[]),
            vm("q", c.local_addr(), &["p"]),
        ],
    };
    let run = tokio::spawn(async move { restore(&plan, &token(), &quick()).await });
    while vms.at("loaded", "q").is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run.abort();
    let died = tokio::time::Instant::now();
    assert_eq!(c.status("orphaned").unwrap().vms["q"], CohortVmState::Held);
    while vms.count("abort", "p") + vms.count("abort", "q") < 2 {
        assert!(
            died.elapsed() < Duration::from_secs(3),
            "held VMs never aborted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Not before hold_timeout (400 ms) since the last ping.
    assert!(vms.at("abort", "q").unwrap() - died > Duration::from_millis(300));
    assert_eq!(vms.count("start", "p") + vms.count("start", "q"), 0);
    let status = c.status("orphaned").unwrap();
    assert!(status.aborted.unwrap().contains("hold_timeout"));
    assert_eq!(
        status.vms["q"],
        CohortVmState::Aborted {
            while_loading: false
        }
    );
    assert_eq!(
        status.vms["p"],
        CohortVmState::Aborted {
            while_loading: true
        }
    );
}

#[tokio::test]
async fn a_vm_whose_load_fails_aborts_the_restore() {
    let vms = StandInVms::new(&[
        (
            "f",
            Behaviour {
                load: Duration::from_millis(80),
                fail_load: Some("snapshot file is truncated".into()),
                ..Behaviour::default()
            },
        ),
        ("g", load(10)),
        ("h", load(10)),
    ]);
    let one = cohort(vms.clone(), token()).await;
    let two = cohort(vms.clone(), token()).await;
    let plan = Plan {
        restore_id: "badload".into(),
        vms: vec![
            vm("f", one.local_addr(), &[]),
            vm("g", two.local_addr(), &[]),
            vm("h", two.local_addr(), &["f"]),
        ],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    let Outcome::Aborted { reason } = &report.outcome else {
        panic!("not aborted: {report:#?}");
    };
    assert_eq!(reason, "VM f failed to load: snapshot file is truncated");
    let v = |n: &str| report.vms.iter().find(|v| v.vm == n).unwrap().clone();
    assert_eq!(v("f").state, VmState::LoadFailed);
    assert_eq!(v("f").error.as_deref(), Some("snapshot file is truncated"));
    assert_eq!(v("h").state, VmState::Aborted);
    assert!(v("h").held);
    assert!(matches!(v("g").state, VmState::Started | VmState::Restored));
    assert_eq!(vms.count("abort", "h"), 1);
    assert_eq!(vms.count("start", "h"), 0);
    assert!(report.cohorts.iter().all(|c| c.reachable));
}
