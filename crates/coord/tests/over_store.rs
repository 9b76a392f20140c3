//! The restore protocol over the in-memory store: three simulated hosts (one
//! participant each, each with its own store handle and stand-in VMs), a plan with
//! dependencies and a line, a coordinator whose host dies mid-restore, a host cut
//! off, a failed load, and a malformed plan.

use std::sync::Arc;
use std::time::Duration;

use rebound_coord::records::{Phase, Timeouts};
use rebound_coord::report::{Outcome, RestoreReport, VmState};
use rebound_coord::run::{HostConfig, Participant};
use rebound_coord::standin::StandIn;
use rebound_coord::submit::{submit, wait, SubmitError};
use rebound_coord::{layout, run::unix_now_ns};
use rebound_coord::{Plan, PlanVm};
use rebound_store::mem::MemStore;
use rebound_store::Store;

const TTL: Duration = Duration::from_millis(800);

fn vm(name: &str, host: &str, deps: &[&str], at: Option<f64>) -> PlanVm {
    PlanVm {
        vm: name.into(),
        host: host.into(),
        ws_pages: 100,
        args: serde_json::Value::Null,
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        start_at_s: at,
    }
}

struct Host {
    store: MemStore,
    vms: Arc<StandIn>,
    part: Option<Participant>,
    name: String,
}

impl Host {
    async fn join(&mut self) {
        let mut c = HostConfig::new(&self.name);
        c.ttl = TTL;
        self.part = Some(
            Participant::start(Arc::new(self.store.clone()), c, self.vms.clone())
                .await
                .unwrap(),
        );
    }
}

async fn hosts(store: &MemStore, n: usize, load: Duration) -> Vec<Host> {
    let mut out = Vec::new();
    for i in 1..=n {
        let mut h = Host {
            store: store.handle(),
            vms: Arc::new(StandIn::new(
                load,
                Duration::from_millis(5),
                Duration::from_millis(50),
            )),
            part: None,
            name: format!("h{i}"),
        };
        h.join().await;
        out.push(h);
    }
    out
}

fn by_vm<'a>(r: &'a RestoreReport, vm: &str) -> &'a rebound_coord::report::VmReport {
    r.vms.iter().find(|v| v.vm == vm).unwrap()
}

async fn run(store: &MemStore, plan: Plan) -> Result<RestoreReport, SubmitError> {
    let id = plan.restore_id.clone();
    submit(store, plan, Timeouts::default()).await?;
    wait(store, &id, Duration::from_secs(30), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_restores_in_dependency_order_on_the_line() {
    let store = MemStore::new();
    let hs = hosts(&store, 3, Duration::from_millis(50)).await;
    // c sends to b, b to a: a starts first. d starts 0.6 s into the line.
    let plan = Plan {
        restore_id: "r1".into(),
        vms: vec![
            vm("a", "h1", &[], None),
            vm("b", "h2", &["a"], None),
            vm("c", "h3", &["b"], None),
            vm("d", "h3", &[], Some(0.6)),
        ],
    };
    let r = run(&store, plan).await.unwrap();
    assert_eq!(r.outcome, Outcome::Restored, "{r:#?}");
    let start = |v: &str| by_vm(&r, v).start_unix_ns.unwrap();
    assert!(start("a") < start("b") && start("b") < start("c"), "{r:#?}");
    let d = by_vm(&r, "d");
    assert!((d.start_at_s.unwrap() - 0.6).abs() < 1e-6, "{d:?}");
    assert!(d.start_error_ms.unwrap().abs() < 50.0, "{d:?}");
    for h in &hs {
        for v in ["a", "b", "c", "d"] {
            assert!(h.vms.calls("r1", v).starts <= 1);
        }
    }
    assert!(r.vms.iter().all(|v| v.state == VmState::Restored && v.held));
    // A second restore with the same id is refused; nothing runs again.
    let again = Plan {
        restore_id: "r1".into(),
        vms: vec![vm("a", "h1", &[], None)],
    };
    assert!(matches!(
        run(&store, again).await,
        Err(SubmitError::Exists(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_coordinator_is_replaced_and_no_vm_starts_twice() {
    let store = MemStore::new();
    let mut hs = hosts(&store, 3, Duration::from_millis(20)).await;
    let plan = Plan {
        restore_id: "r2".into(),
        vms: vec![
            vm("a", "h1", &[], Some(0.0)),
            vm("b", "h2", &[], Some(0.0)),
            vm("c", "h3", &[], Some(0.0)),
            vm("a2", "h1", &[], Some(2.5)),
            vm("b2", "h2", &[], Some(2.5)),
            vm("c2", "h3", &[], Some(2.5)),
        ],
    };
    submit(&store, plan, Timeouts::default()).await.unwrap();
    // Wait until the first VMs started, then kill the coordinator's daemon.
    let mut coord = None;
    wait_until(&store, Duration::from_secs(10), |s| {
        let v = s.restores.get("r2")?;
        let (st, _) = v.state()?;
        let started = ["a", "b", "c"]
            .iter()
            .all(|vm| v.phases.get(*vm).is_some_and(|(p, _)| p.phase.ran()));
        if started {
            coord = st.coordinators.first().cloned();
        }
        started.then_some(())
    })
    .await;
    let coord = coord.unwrap();
    let i = hs.iter().position(|h| h.name == coord).unwrap();
    let killed_at = unix_now_ns();
    hs[i].part = None;
    // Its daemon comes back (its VMs kept running).
    tokio::time::sleep(Duration::from_millis(300)).await;
    hs[i].join().await;
    let r = wait(&store, "r2", Duration::from_secs(30), |_| {})
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Restored, "{r:#?}");
    assert_eq!(r.coordinators.len(), 2, "{:?}", r.coordinators);
    assert_ne!(r.coordinators[1], coord);
    for h in &hs {
        for v in ["a", "b", "c", "a2", "b2", "c2"] {
            assert!(h.vms.calls("r2", v).starts <= 1, "{v} started twice");
        }
    }
    // The second wave started on its line instant although the coordinator died
    // before writing its STARTs... or after: either way within the failover time.
    let late = by_vm(&r, "a2").start_unix_ns.unwrap();
    assert!(late > killed_at);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cut_off_aborts_the_restore_naming_it_and_held_vms_are_released() {
    let store = MemStore::new();
    let hs = hosts(&store, 3, Duration::from_millis(20)).await;
    // c waits on a line instant far away, so a and b are held when h3 goes.
    let plan = Plan {
        restore_id: "r3".into(),
        vms: vec![
            vm("a", "h1", &["c"], None),
            vm("b", "h2", &["c"], None),
            vm("c", "h3", &[], Some(60.0)),
        ],
    };
    submit(&store, plan, Timeouts::default()).await.unwrap();
    wait_until(&store, Duration::from_secs(10), |s| {
        let v = s.restores.get("r3")?;
        ["a", "b", "c"]
            .iter()
            .all(|vm| {
                v.phases
                    .get(*vm)
                    .is_some_and(|(p, _)| p.phase == Phase::Loaded)
            })
            .then_some(())
    })
    .await;
    hs[2].store.fake_cut_off(true);
    let r = wait(&store, "r3", Duration::from_secs(30), |_| {})
        .await
        .unwrap();
    match &r.outcome {
        Outcome::Aborted { reason } => {
            assert!(reason.contains("host h3's lease expired"), "{reason}")
        }
        o => panic!("{o:?}"),
    }
    for (h, v) in [(0, "a"), (1, "b")] {
        assert_eq!(by_vm(&r, v).state, VmState::Aborted);
        assert_eq!(hs[h].vms.calls("r3", v).aborts, 1);
        assert_eq!(hs[h].vms.calls("r3", v).starts, 0);
    }
    assert!(!r.hosts.iter().find(|h| h.host == "h3").unwrap().live);
    // Its link back, the host joins again under a new lease and takes part in the
    // next restore.
    hs[2].store.fake_cut_off(false);
    wait_until(&store, Duration::from_secs(10), |v| {
        v.live().contains("h3").then_some(())
    })
    .await;
    let plan = Plan {
        restore_id: "r3-again".into(),
        vms: vec![vm("c", "h3", &[], None), vm("a", "h1", &["c"], None)],
    };
    submit(&store, plan, Timeouts::default()).await.unwrap();
    let r = wait(&store, "r3-again", Duration::from_secs(30), |_| {})
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Restored, "{r:#?}");
    assert_eq!(hs[2].vms.calls("r3-again", "c").starts, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_aborts_with_its_reason() {
    let store = MemStore::new();
    let mut hs = hosts(&store, 2, Duration::from_millis(20)).await;
    let mut vms = StandIn::new(Duration::from_millis(20), Duration::ZERO, Duration::ZERO);
    vms.fail_load
        .insert("b".into(), "no snapshot named b".into());
    hs[1].vms = Arc::new(vms);
    hs[1].part = None;
    hs[1].join().await;
    let plan = Plan {
        restore_id: "r4".into(),
        vms: vec![vm("a", "h1", &["b"], None), vm("b", "h2", &[], None)],
    };
    let r = run(&store, plan).await.unwrap();
    match &r.outcome {
        Outcome::Aborted { reason } => {
            assert!(
                reason.contains("VM b: load failed on host h2: no snapshot named b"),
                "{reason}"
            )
        }
        o => panic!("{o:?}"),
    }
    assert_eq!(hs[0].vms.calls("r4", "a").starts, 0);
    assert_eq!(by_vm(&r, "a").state, VmState::Aborted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_records_are_refused_and_nothing_starts() {
    let store = MemStore::new();
    let hs = hosts(&store, 2, Duration::from_millis(20)).await;
    let cases: &[(&str, &[u8], &str)] = &[
        ("m1", b"{\"format\":1,\"plan\":", "not a valid restore plan"),
        ("m2", br#"{"format":7,"plan":{"restore_id":"m2","vms":[]},"submitted_unix_ns":0}"#, "format 7"),
        (
            "m3",
            br#"{"format":1,"plan":{"restore_id":"m3","vms":[{"vm":"a","host":"h1","ws_pages":1,"depends_on":["zz"]}]},"submitted_unix_ns":0}"#,
            "cannot run",
        ),
        (
            "m4",
            br#"{"format":1,"plan":{"restore_id":"other","vms":[{"vm":"a","host":"h1","ws_pages":1}]},"submitted_unix_ns":0}"#,
            "its key says",
        ),
    ];
    for (id, bytes, why) in cases {
        store
            .put(&layout::plan(id), bytes.to_vec(), None)
            .await
            .unwrap();
        let e = wait(&store, id, Duration::from_secs(5), |_| {})
            .await
            .unwrap_err();
        let text = rebound_errors::chain(&e);
        assert!(text.contains(why), "{id}: {text}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for h in &hs {
        assert_eq!(
            h.vms.calls("m3", "a").loads + h.vms.calls("m4", "a").loads,
            0
        );
    }
    // Nothing was begun: no state was written for any of them.
    for (id, _, _) in cases {
        assert!(store.get(&layout::state(id)).await.unwrap().is_none());
    }
}

/// Polls the store's view until `f` says yes.
async fn wait_until(
    store: &MemStore,
    limit: Duration,
    mut f: impl FnMut(&rebound_coord::view::ClusterView) -> Option<()>,
) {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let r = store.range(layout::ROOT).await.unwrap();
        let v = rebound_coord::view::ClusterView::from_kvs(&r.kvs, r.revision);
        if f(&v).is_some() {
            return;
        }
        assert!(tokio::time::Instant::now() < end, "timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
