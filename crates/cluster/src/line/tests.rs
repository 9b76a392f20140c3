use super::*;

const RATE: f64 = 1000.0;

/// A VM loading 1000 pages/s: `start` and `upper` in seconds.
fn vm(name: &str, start: f64, upper: f64) -> VmLoad {
    VmLoad {
        name: name.into(),
        working_set_pages: (start * RATE) as u64,
        total_pages: (upper * RATE) as u64,
        load_rate_pages_per_s: RATE,
    }
}

fn dep(s: &str, r: &str, margin_s: f64) -> Dependency {
    Dependency {
        sender: s.into(),
        receiver: r.into(),
        margin_s,
    }
}

fn get<'a>(line: &'a RestoreLine, name: &str) -> &'a VmStart {
    line.vms.iter().find(|v| v.name == name).unwrap()
}

fn pos(line: &RestoreLine, name: &str) -> usize {
    line.order.iter().position(|n| n == name).unwrap()
}

/// Checks every constraint independently of [`verify`].
fn assert_constraints_hold(input: &LineInput, line: &RestoreLine) {
    let eps = 1e-6;
    assert_eq!(line.vms.len(), input.vms.len());
    assert_eq!(line.order.len(), input.vms.len());
    for v in &input.vms {
        let got = get(line, &v.name);
        assert!(got.revised_start_s >= -eps, "{} starts before 0", v.name);
        assert!(
            got.revised_start_s <= v.upper_bound_s() + eps,
            "{} beyond its RAM",
            v.name
        );
        assert!(got.revised_working_set_pages <= v.total_pages);
        let implied = got.revised_start_s * v.load_rate_pages_per_s;
        assert!((got.revised_working_set_pages as f64 - implied).abs() <= 0.5 + 1e-6);
    }
    for ring in &line.rings {
        let first = get(line, &ring[0]).revised_start_s;
        for m in ring {
            assert!(
                (get(line, m).revised_start_s - first).abs() <= eps,
                "ring member {m} apart"
            );
        }
    }
    let same_ring = |a: &str, b: &str| {
        line.rings
            .iter()
            .any(|r| r.iter().any(|n| n == a) && r.iter().any(|n| n == b))
    };
    for d in &input.dependencies {
        if same_ring(&d.sender, &d.receiver) {
            continue;
        }
        let gap = get(line, &d.sender).revised_start_s - get(line, &d.receiver).revised_start_s;
        assert!(
            gap >= d.margin_s - eps,
            "{} -> {}: gap {gap} < {}",
            d.sender,
            d.receiver,
            d.margin_s
        );
        assert!(
            pos(line, &d.receiver) < pos(line, &d.sender),
            "{} ordered before {}",
            d.sender,
            d.receiver
        );
    }
}

#[test]
fn start_times_and_pages_convert_both_ways() {
    let v = VmLoad {
        name: "a".into(),
        working_set_pages: 50_000,
        total_pages: 100_000,
        load_rate_pages_per_s: 25_000.0,
    };
    assert_eq!(v.start_s(), 2.0);
    assert_eq!(v.upper_bound_s(), 4.0);
    assert_eq!(v.pages_for(v.start_s()), 50_000);
    assert_eq!(v.pages_for(1.5), 37_500);
    assert_eq!(v.pages_for(9.0), 100_000, "never more than all of RAM");
    assert_eq!(v.pages_for(-1.0), 0);
}

/// HotRestore figure 4(a): figure 3 without the VM3 → VM1 dependency:
/// VM1 → VM2 → VM3 and VM4 → VM3, VM5 an orphan.
fn figure4(keep_working_sets: bool) -> LineInput {
    LineInput {
        may_wait: false,
        keep_working_sets,
        vms: vec![
            vm("VM1", 5.0, 100.0),
            vm("VM2", 1.0, 100.0),
            vm("VM3", 3.0, 100.0),
            vm("VM4", 2.0, 100.0),
            vm("VM5", 4.0, 100.0),
        ],
        dependencies: vec![
            dep("VM1", "VM2", 0.5),
            dep("VM2", "VM3", 0.5),
            dep("VM4", "VM3", 0.5),
        ],
    }
}

/// The de facto order is [VM2, VM4, VM3, VM5, VM1], against the causal order (VM3 before VM2 and
/// VM4, VM2 before VM1).
#[test]
fn figure4_revision_follows_the_causal_order() {
    let input = figure4(false);
    let line = solve(&input).unwrap();
    assert!(line.solved_by_lp);
    assert_constraints_hold(&input, &line);
    assert!(pos(&line, "VM3") < pos(&line, "VM2"));
    assert!(pos(&line, "VM3") < pos(&line, "VM4"));
    assert!(pos(&line, "VM2") < pos(&line, "VM1"));
    assert_eq!(
        get(&line, "VM5").revised_start_s,
        4.0,
        "the orphan is free and keeps its start"
    );
    // Least movement: VM3 must come down to 0.5 s below VM2 (1 s) and VM4
    // (2 s), or they go up: any split costs 3 - 1 + 0.5 = 2.5 s in total.
    assert!(
        (line.total_shift_s - 2.5).abs() < 1e-6,
        "shift {}",
        line.total_shift_s
    );
    assert!(line.rings.is_empty());
}

/// Figure 4's cluster with working sets kept: no VM starts before its own S_i, so
/// the causal order comes from delays alone: VM3 stays at 3 s, VM2 and VM4 wait
/// until 3.5 s, and VM1 keeps its 5 s. The least shift is 2.5 +
/// 1.5 = 4 s, and every working set is at least what it was.
#[test]
fn kept_working_sets_only_delay_starts() {
    let input = figure4(true);
    let line = solve(&input).unwrap();
    assert_constraints_hold(&input, &line);
    for v in &input.vms {
        let got = get(&line, &v.name);
        assert!(got.revised_start_s >= v.start_s() - 1e-9, "{got:?}");
        assert!(
            got.revised_working_set_pages >= v.working_set_pages,
            "{got:?}"
        );
    }
    assert!((get(&line, "VM3").revised_start_s - 3.0).abs() < 1e-6);
    assert!((get(&line, "VM2").revised_start_s - 3.5).abs() < 1e-6);
    assert!((get(&line, "VM4").revised_start_s - 3.5).abs() < 1e-6);
    assert!((get(&line, "VM1").revised_start_s - 5.0).abs() < 1e-6);
    assert!(
        (line.total_shift_s - 4.0).abs() < 1e-6,
        "{}",
        line.total_shift_s
    );
    // The same with the ring of figure 3: the ring starts when its slowest is loaded.
    let ring = LineInput {
        keep_working_sets: true,
        may_wait: false,
        vms: vec![vm("r1", 1.0, 10.0), vm("r2", 2.5, 10.0)],
        dependencies: vec![dep("r1", "r2", 0.0), dep("r2", "r1", 0.0)],
    };
    let line = solve(&ring).unwrap();
    assert!((get(&line, "r1").revised_start_s - 2.5).abs() < 1e-6);
    assert!((get(&line, "r2").revised_start_s - 2.5).abs() < 1e-6);
    // Kept working sets beyond what a VM may load: no line, said in one line.
    let over = LineInput {
        keep_working_sets: true,
        may_wait: false,
        vms: vec![vm("a", 1.0, 1.2), vm("b", 2.0, 10.0)],
        dependencies: vec![dep("a", "b", 0.5)],
    };
    let e = solve(&over).unwrap_err().to_string();
    assert!(e.contains('a') && !e.contains('\n'), "{e}");
}

/// HotRestore figure 3(b): VM1, VM2, VM3 a ring, VM4 → VM3, VM5 an orphan.
#[test]
fn figure3_ring_starts_together_before_its_sender() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![
            vm("VM1", 1.0, 100.0),
            vm("VM2", 2.0, 100.0),
            vm("VM3", 6.0, 100.0),
            vm("VM4", 2.25, 100.0),
            vm("VM5", 4.0, 100.0),
        ],
        dependencies: vec![
            dep("VM1", "VM2", 0.5),
            dep("VM2", "VM3", 0.5),
            dep("VM3", "VM1", 0.5),
            dep("VM4", "VM3", 0.5),
        ],
    };
    let line = solve(&input).unwrap();
    assert_constraints_hold(&input, &line);
    assert_eq!(line.rings, vec![vec!["VM1", "VM2", "VM3"]]);
    assert_eq!(get(&line, "VM1").ring, Some(0));
    assert_eq!(get(&line, "VM4").ring, None);
    let ring = get(&line, "VM1").revised_start_s;
    for m in ["VM2", "VM3"] {
        assert_eq!(get(&line, m).revised_start_s, ring);
    }
    // Σ|x - S| over the ring is least at its members' median, 2 s; VM4 must
    // then move from 2.25 s to 2.5 s. Any ring start x in [1, 2] costs
    // (x - 1) + (2 - x) + (6 - x) + max(0, x + 0.5 - 2.25) = 7 - x + ..., and
    // beyond 1.75 s VM4's part grows as fast as the ring's shrinks: every x
    // in [1.75, 2] is optimal, none outside.
    assert!((1.75 - 1e-6..=2.0 + 1e-6).contains(&ring), "ring at {ring}");
    assert!(
        (line.total_shift_s - 5.25).abs() < 1e-6,
        "shift {}",
        line.total_shift_s
    );
    assert!(get(&line, "VM4").revised_start_s >= ring + 0.5 - 1e-6);
    for m in ["VM1", "VM2", "VM3"] {
        assert!(pos(&line, m) < pos(&line, "VM4"));
    }
}

#[test]
fn consistent_input_is_returned_unchanged() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![
            vm("db", 1.0, 10.0),
            vm("web", 3.0, 10.0),
            vm("lb", 3.25, 10.0),
            vm("r1", 2.0, 10.0),
            vm("r2", 2.0, 10.0),
            vm("lone", 7.0, 10.0),
        ],
        dependencies: vec![
            dep("web", "db", 1.0),
            dep("lb", "web", 0.25),
            dep("r1", "r2", 0.1),
            dep("r2", "r1", 0.1),
            dep("r1", "db", 0.5),
        ],
    };
    let line = solve(&input).unwrap();
    assert!(!line.solved_by_lp);
    assert_eq!(line.total_shift_s, 0.0);
    for (v, got) in input.vms.iter().zip(&line.vms) {
        assert_eq!(got.revised_start_s, v.start_s(), "{}", v.name);
        assert_eq!(
            got.revised_working_set_pages, v.working_set_pages,
            "{}",
            v.name
        );
    }
    assert_eq!(line.order, ["db", "r1", "r2", "web", "lb", "lone"]);

    // The LP itself, run on the same input, moves nothing either.
    let model = build(&input).unwrap();
    let mut x: Vec<f64> = vec![f64::NAN; model.members.len()];
    for (c, m) in model.members.iter().enumerate() {
        if m.len() == 1 && !model.comp_edges.keys().any(|&(a, b)| a == c || b == c) {
            x[c] = model.s[m[0]]; // the LP leaves edgeless VMs alone
        }
    }
    model.solve_lp(&mut x).unwrap();
    for (i, v) in input.vms.iter().enumerate() {
        let got = x[model.comp[i]];
        assert!((got - v.start_s()).abs() < 1e-6, "{}: {got}", v.name);
    }
}

#[test]
fn equal_starts_put_the_receiver_first() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![vm("a", 1.0, 10.0), vm("b", 1.0, 10.0)],
        dependencies: vec![dep("a", "b", 0.0)],
    };
    let line = solve(&input).unwrap();
    assert_eq!(line.order, ["b", "a"]);
}

#[test]
fn infeasible_chain_is_named_in_one_line() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![
            vm("a", 1.0, 5.0),
            vm("b", 1.0, 50.0),
            vm("c", 1.0, 50.0),
            vm("x", 1.0, 50.0),
        ],
        dependencies: vec![dep("a", "b", 3.0), dep("b", "c", 3.0), dep("x", "c", 9.0)],
    };
    let err = solve(&input).unwrap_err();
    let msg = err.to_string();
    assert!(!msg.contains('\n'));
    match &err {
        LineError::Infeasible {
            vm,
            chain,
            earliest_s,
            bound_s,
        } => {
            assert_eq!(vm, "a");
            assert!(
                chain.starts_with("a ") && chain.contains(" b ") && chain.ends_with(" c"),
                "{chain}"
            );
            assert!(
                !chain.contains('x'),
                "x is not part of the problem: {chain}"
            );
            assert!((earliest_s - 6.0).abs() < 1e-9 && (bound_s - 5.0).abs() < 1e-9);
        }
        other => panic!("{other}"),
    }
}

#[test]
fn infeasible_ring_names_its_tightest_member() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![
            vm("r1", 0.5, 1.0),
            vm("r2", 0.5, 60.0),
            vm("sink", 0.0, 60.0),
        ],
        dependencies: vec![
            dep("r1", "r2", 0.1),
            dep("r2", "r1", 0.1),
            dep("r2", "sink", 2.0),
        ],
    };
    match solve(&input).unwrap_err() {
        LineError::Infeasible { vm, chain, .. } => {
            assert_eq!(vm, "r1");
            assert!(
                chain.starts_with("ring {r1, r2}") && chain.ends_with("sink"),
                "{chain}"
            );
        }
        other => panic!("{other}"),
    }
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let ok = || LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![vm("a", 1.0, 5.0), vm("b", 1.0, 5.0)],
        dependencies: vec![dep("a", "b", 0.1)],
    };
    let mut i = ok();
    i.vms[1].name = "a".into();
    assert!(matches!(solve(&i), Err(LineError::DuplicateVm(_))));
    for rate in [0.0, -3.0, f64::NAN, f64::INFINITY] {
        let mut i = ok();
        i.vms[0].load_rate_pages_per_s = rate;
        assert!(
            matches!(solve(&i), Err(LineError::BadRate { .. })),
            "{rate}"
        );
    }
    let mut i = ok();
    i.vms[0].working_set_pages = i.vms[0].total_pages + 1;
    assert!(matches!(
        solve(&i),
        Err(LineError::WorkingSetTooLarge { .. })
    ));
    let mut i = ok();
    i.dependencies.push(dep("a", "ghost", 0.1));
    assert!(matches!(solve(&i), Err(LineError::UnknownVm { .. })));
    for margin in [-0.1, f64::NAN] {
        let mut i = ok();
        i.dependencies[0].margin_s = margin;
        assert!(matches!(solve(&i), Err(LineError::BadMargin { .. })));
    }
    assert!(solve(&LineInput::default()).unwrap().order.is_empty());
}

#[test]
fn verify_rejects_a_broken_line() {
    let input = LineInput {
        may_wait: false,
        keep_working_sets: false,
        vms: vec![vm("a", 1.0, 10.0), vm("b", 5.0, 10.0)],
        dependencies: vec![dep("a", "b", 0.5)],
    };
    let line = solve(&input).unwrap();
    verify(&input, &line, TOLERANCE_S).unwrap();
    let mut swapped = line.clone();
    swapped.order.reverse();
    assert!(matches!(
        verify(&input, &swapped, TOLERANCE_S),
        Err(LineError::Violation(_))
    ));
    let mut early = line.clone();
    early.vms[0].revised_start_s = early.vms[1].revised_start_s;
    early.vms[0].revised_working_set_pages = input.vms[0].pages_for(early.vms[0].revised_start_s);
    let err = verify(&input, &early, TOLERANCE_S).unwrap_err();
    assert!(err.to_string().contains("margin"), "{err}");
    let mut greedy = line;
    greedy.vms[1].revised_working_set_pages += 1;
    assert!(verify(&input, &greedy, TOLERANCE_S).is_err());
}

#[test]
fn synthetic_thousand_vms_solve_and_hold_every_constraint() {
    let input = synthetic(1000, 7);
    assert_eq!(input.vms.len(), 1000);
    assert_eq!(synthetic(1000, 7), input, "same seed, same cluster");
    let line = solve(&input).unwrap();
    assert!(line.solved_by_lp);
    assert!(line.rings.len() >= 20, "{} rings", line.rings.len());
    let connected: std::collections::HashSet<&str> = input
        .dependencies
        .iter()
        .flat_map(|d| [d.sender.as_str(), d.receiver.as_str()])
        .collect();
    let orphans: Vec<_> = input
        .vms
        .iter()
        .filter(|v| !connected.contains(v.name.as_str()))
        .collect();
    assert!(orphans.len() >= 30, "{} orphans", orphans.len());
    for o in orphans {
        assert_eq!(
            get(&line, &o.name).revised_start_s,
            o.start_s(),
            "orphan {} moved",
            o.name
        );
    }
    assert_constraints_hold(&input, &line);
    // The de facto starts broke some dependencies, so something had to move.
    assert!(line.total_shift_s > 0.0);
}
