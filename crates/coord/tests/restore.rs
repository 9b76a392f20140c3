//! Full restores: the Checker's order across three cohorts, ring spread, start_at.

use std::time::Duration;

use rebound_coord::report::{Outcome, VmState};
use rebound_coord::{restore, Plan, PlanVm};

use crate::common::{cohort, quick, token, Behaviour, StandInVms};

pub fn vm(name: &str, cohort: std::net::SocketAddr, deps: &[&str]) -> PlanVm {
    PlanVm {
        vm: name.into(),
        host: cohort.to_string(),
        ws_pages: 1000,
        args: serde_json::json!({ "snapshot": format!("/snapshots/{name}") }),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        start_at_s: None,
    }
}

fn load(ms: u64) -> Behaviour {
    Behaviour {
        load: Duration::from_millis(ms),
        ..Behaviour::default()
    }
}

#[tokio::test]
async fn ring_and_chain_start_in_dependency_order_across_three_cohorts() {
    // A ring r1 -> r2 -> r3 -> r1 with different load times, and a chain
    // web -> app -> db where db loads slowest and app also depends on r2; an
    // orphan with a restore-line offset.
    let vms = StandInVms::new(&[
        ("r1", load(40)),
        ("r2", load(160)),
        ("r3", load(90)),
        ("db", load(250)),
        ("app", load(20)),
        ("web", load(10)),
        ("orphan", load(10)),
    ]);
    let a = cohort(vms.clone(), token()).await;
    let b = cohort(vms.clone(), token()).await;
    let c = cohort(vms.clone(), token()).await;
    let (a, b, c) = (a, b, c);
    let mut orphan = vm("orphan", c.local_addr(), &[]);
    orphan.start_at_s = Some(0.3);
    let plan = Plan {
        restore_id: "full".into(),
        vms: vec![
            vm("r1", a.local_addr(), &["r2"]),
            vm("r2", b.local_addr(), &["r3"]),
            vm("r3", c.local_addr(), &["r1"]),
            vm("db", b.local_addr(), &[]),
            vm("app", c.local_addr(), &["db", "r2"]),
            vm("web", a.local_addr(), &["app"]),
            orphan,
        ],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert_eq!(report.outcome, Outcome::Restored);
    for v in &report.vms {
        assert_eq!(v.state, VmState::Restored, "{}", v.vm);
        assert!(v.start_fin_latency_s.is_some() && v.restore_fin_s.is_some());
        assert_eq!(v.pages, Some(1000));
        assert_eq!(vms.count("load", &v.vm), 1, "{} loaded once", v.vm);
        assert_eq!(vms.count("start", &v.vm), 1, "{} started once", v.vm);
        assert_eq!(vms.count("abort", &v.vm), 0);
        // One host: the estimated offset is near zero.
        assert!(v.clock_offset_ns.unwrap().abs() < 5_000_000, "{v:?}");
    }
    // Every dependency outside a ring started (START_FIN) before its dependent
    // was told to start.
    for (vm, dep) in [("app", "db"), ("app", "r2"), ("web", "app")] {
        let started = vms.at("started", dep).unwrap();
        let start = vms.at("start", vm).unwrap();
        assert!(started <= start, "{vm} started before {dep}");
    }
    // The ring waited for its slowest member, then started together.
    let ring_starts: Vec<_> = ["r1", "r2", "r3"]
        .iter()
        .map(|r| vms.at("start", r).unwrap())
        .collect();
    let r2_loaded = vms.at("loaded", "r2").unwrap();
    assert!(ring_starts.iter().all(|s| *s >= r2_loaded));
    let spread = *ring_starts.iter().max().unwrap() - *ring_starts.iter().min().unwrap();
    assert!(
        spread < Duration::from_millis(20),
        "stand-in spread {spread:?}"
    );
    assert_eq!(report.rings.len(), 1);
    let reported = report.rings[0].spread_s.unwrap();
    println!("ring start spread: reported {reported:.6} s, stand-in calls {spread:?}");
    assert!(reported < 0.02, "reported spread {reported}");
    let orphan = report.vms.iter().find(|v| v.vm == "orphan").unwrap();
    assert!(orphan.start_s.unwrap() >= 0.3, "{orphan:?}");
    assert!(orphan.start_sent_s.unwrap() >= 0.3);
    assert!(report.cohorts.iter().all(|c| c.reachable));
}

#[tokio::test]
async fn an_invalid_plan_is_refused_before_any_connection() {
    let plan = Plan {
        restore_id: "bad".into(),
        vms: vec![vm("a", "127.0.0.1:9".parse().unwrap(), &["nope"])],
    };
    let err = restore(&plan, &token(), &quick()).await.unwrap_err();
    assert_eq!(
        rebound_errors::chain(&err),
        "the restore plan is invalid: VM a depends on nope, which is not in the plan"
    );
}
