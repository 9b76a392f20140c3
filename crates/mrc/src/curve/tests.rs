use super::offset::{ExclusiveTracer, OffsetError};
use super::*;
use crate::{lru_sim, stack, testutil};

/// The exact curve of `trace` must equal an LRU simulation at every size
/// up to a little beyond the number of distinct blocks.
fn assert_exact_at_every_size(trace: &[u64]) {
    let h = stack::histogram(trace.iter().copied());
    let distinct = trace.iter().collect::<std::collections::HashSet<_>>().len() as u64;
    let curve = MissRatioCurve::from_histogram(&h, distinct + 5).unwrap();
    assert_eq!(curve.accesses(), trace.len() as f64);
    for size in 0..=distinct + 5 {
        let simulated = lru_sim::misses(trace, size) as f64;
        assert_eq!(curve.misses(size).unwrap(), simulated, "size {size}");
    }
}

#[test]
fn exact_curve_matches_simulation_sequential_loop() {
    // A loop of 200 blocks misses every cache smaller than the loop.
    let trace = testutil::sequential(200, 2_000);
    assert_exact_at_every_size(&trace);
    let curve = MissRatioCurve::from_histogram(&stack::histogram(trace), 300).unwrap();
    assert_eq!(curve.miss_ratio(199).unwrap(), 1.0);
    assert_eq!(curve.misses(200).unwrap(), 200.0);
}

#[test]
fn exact_curve_matches_simulation_uniform() {
    let trace = testutil::uniform(1, 250, 2_000);
    assert_exact_at_every_size(&trace);
}

#[test]
fn exact_curve_matches_simulation_zipf() {
    let trace = testutil::zipf(2, 300, 0.9, 2_000);
    assert_exact_at_every_size(&trace);
}

#[test]
fn exact_curve_matches_simulation_classes() {
    let trace = testutil::classes(3, 2_000);
    assert_exact_at_every_size(&trace);
}

#[test]
fn wide_steps_are_exact_at_points_and_bounds_between() {
    let trace = testutil::zipf(4, 300, 0.8, 3_000);
    let mut p = stack::ExactProfiler::with_bucket_width(16);
    trace
        .iter()
        .for_each(|&b| crate::Profiler::access(&mut p, b));
    let curve = MissRatioCurve::from_histogram(&crate::Profiler::histogram(&p), 320).unwrap();
    assert_eq!(curve.step(), 16);
    // About 290 of the 300 blocks are touched: the last point is at 288 or
    // 304, where the curve is flat.
    assert!(
        (288..=304).contains(&curve.max_size()),
        "{}",
        curve.max_size()
    );
    for size in 0..=330 {
        let simulated = lru_sim::misses(&trace, size) as f64;
        let got = curve.misses(size).unwrap();
        if size % 16 == 0 {
            assert_eq!(got, simulated, "size {size}");
        } else {
            assert!(got >= simulated, "size {size}: {got} < {simulated}");
        }
    }
}

#[test]
fn points_end_where_the_histogram_does() {
    let h = stack::histogram([1, 2, 3, 1, 2, 3]);
    let curve = MissRatioCurve::from_histogram(&h, u64::MAX).unwrap();
    assert_eq!(curve.max_size(), 3);
    assert_eq!(curve.misses(u64::MAX).unwrap(), 3.0);
    let short = MissRatioCurve::from_histogram(&h, 2).unwrap();
    assert_eq!(short.max_size(), 2);
    assert_eq!(short.misses(5).unwrap(), 6.0);
}

#[test]
fn empty_trace_is_an_error() {
    let h = stack::histogram(std::iter::empty());
    assert_eq!(
        MissRatioCurve::from_histogram(&h, 10),
        Err(CurveError::EmptyHistogram)
    );
}

#[test]
fn serde_round_trip_and_malformed_input() {
    let curve = MissRatioCurve::from_histogram(&stack::histogram([1, 2, 1, 3, 1]), 4).unwrap();
    let json = serde_json::to_string(&curve).unwrap();
    let back: MissRatioCurve = serde_json::from_str(&json).unwrap();
    assert_eq!(back, curve);
    assert_eq!(back.misses(2).unwrap(), 3.0);

    for (bad, why) in [
        (
            r#"{"base":0,"step":0,"accesses":5.0,"misses":[5.0]}"#,
            "step",
        ),
        (r#"{"base":0,"step":1,"accesses":5.0,"misses":[]}"#, "point"),
        (
            r#"{"base":0,"step":1,"accesses":0.0,"misses":[0.0]}"#,
            "accesses",
        ),
        (
            r#"{"base":0,"step":1,"accesses":5.0,"misses":[3.0,4.0]}"#,
            "growing",
        ),
        (
            r#"{"base":0,"step":1,"accesses":5.0,"misses":[6.0]}"#,
            "at most",
        ),
    ] {
        let err = serde_json::from_str::<MissRatioCurve>(bad).unwrap_err();
        assert!(err.to_string().contains(why), "{bad}: {err}");
    }
}

/// The host-side curve, shifted by the guest's direct memory, must give the
/// guest's LRU misses at every larger size exactly.
fn assert_shift_exact(trace: &[u64], direct: u64, host_max: u64) {
    let mut tracer = ExclusiveTracer::new();
    lru_sim::guest_events(trace, direct)
        .into_iter()
        .for_each(|e| tracer.record(e));
    assert_eq!(tracer.inconsistent_pages(), 0);
    let host = MissRatioCurve::from_histogram(&tracer.histogram(), host_max).unwrap();
    assert_eq!(host.accesses(), lru_sim::misses(trace, direct) as f64);

    let guest = host.shifted(direct, Some(trace.len() as u64)).unwrap();
    assert_eq!(guest.base(), direct);
    for s in 0..=host_max {
        let simulated = lru_sim::misses(trace, direct + s) as f64;
        assert_eq!(guest.misses(direct + s).unwrap(), simulated, "X+{s}");
        let ratio = guest.miss_ratio(direct + s).unwrap();
        assert_eq!(ratio, simulated / trace.len() as f64);
    }
    assert_eq!(
        guest.misses(direct - 1),
        Err(CurveError::BelowBase {
            size: direct - 1,
            base: direct
        })
    );
    // Without the guest's count, ratios are out of the traced misses.
    let relative = host.shifted(direct, None).unwrap();
    assert_eq!(relative.miss_ratio(direct).unwrap(), 1.0);
}

#[test]
fn shifted_curve_matches_simulation() {
    assert_shift_exact(&testutil::zipf(5, 300, 0.9, 2_000), 40, 280);
    assert_shift_exact(&testutil::classes(6, 2_000), 15, 620);
    assert_shift_exact(&testutil::uniform(7, 300, 2_000), 100, 210);
    assert_shift_exact(&testutil::sequential(120, 1_000), 60, 80);
}

#[test]
fn miss_stream_alone_is_not_enough() {
    // The module doc's example: X = 2, accesses a b a c b.
    let trace = [1, 2, 1, 3, 2];
    let stream = lru_sim::miss_stream(&trace, 2);
    assert_eq!(stream, [1, 2, 3, 2]);
    let naive = MissRatioCurve::from_histogram(&stack::histogram(stream), 4).unwrap();
    assert_eq!(naive.misses(1).unwrap(), 4.0);
    assert_eq!(lru_sim::misses(&trace, 3), 3);
    let mut tracer = ExclusiveTracer::new();
    lru_sim::guest_events(&trace, 2)
        .into_iter()
        .for_each(|e| tracer.record(e));
    let host = MissRatioCurve::from_histogram(&tracer.histogram(), 4).unwrap();
    assert_eq!(host.shifted(2, None).unwrap().misses(3).unwrap(), 3.0);
}

#[test]
fn shift_rejects_bad_inputs() {
    let host = MissRatioCurve::from_histogram(&stack::histogram([1, 2, 1, 2]), 4).unwrap();
    assert_eq!(
        host.shifted(8, Some(3)),
        Err(OffsetError::TooFewGuestAccesses {
            guest: 3,
            traced: 4.0
        })
    );
    let once = host.shifted(8, None).unwrap();
    assert_eq!(once.shifted(8, None), Err(OffsetError::AlreadyShifted(8)));
}

#[test]
fn tracer_flags_double_evictions() {
    let mut t = ExclusiveTracer::new();
    t.evict(1);
    t.evict(1);
    assert_eq!(t.inconsistent_pages(), 1);
    t.miss(1);
    assert_eq!(t.inconsistent_pages(), 0);
}

/// Mean absolute error in miss ratio between the sampled tracer's guest curve
/// and the guest's simulated LRU, over sizes `direct..=direct + host_max`.
fn sampled_tracer_mae(trace: &[u64], direct: u64, host_max: u64, rate: f64) -> f64 {
    let mut tracer = ExclusiveTracer::sampled(rate, 1).unwrap();
    lru_sim::guest_events(trace, direct)
        .into_iter()
        .for_each(|e| tracer.record(e));
    let host = MissRatioCurve::from_histogram(&tracer.histogram(), host_max).unwrap();
    let guest = host.shifted(direct, Some(trace.len() as u64)).unwrap();
    // The exact curve of the whole stream (equal to LRU simulation at every size, as
    // the tests above check), instead of one simulation per size.
    let exact =
        MissRatioCurve::from_histogram(&stack::histogram(trace.iter().copied()), direct + host_max)
            .unwrap();
    let errs: Vec<f64> = (0..=host_max)
        .map(|s| {
            let size = direct + s;
            (guest.miss_ratio(size).unwrap() - exact.miss_ratio(size).unwrap()).abs()
        })
        .collect();
    errs.iter().sum::<f64>() / errs.len() as f64
}

#[test]
fn sampled_tracer_is_close_to_simulation() {
    // 20,000 pages, so a 10% sample still holds 2,000 of them.
    let trace = testutil::zipf(11, 20_000, 0.8, 200_000);
    let mae = sampled_tracer_mae(&trace, 2_000, 12_000, 0.1);
    assert!(mae < 0.01, "MAE {mae}");
    // Rate 1 is the exact tracer.
    assert!(sampled_tracer_mae(&trace[..20_000], 500, 3_000, 1.0) == 0.0);
    assert!(ExclusiveTracer::sampled(0.0, 1).is_err());
    assert!(ExclusiveTracer::sampled(1.5, 1).is_err());
}

#[test]
fn returned_pages_leave_the_evicted_stack_uncounted() {
    let mut t = ExclusiveTracer::new();
    t.evict(1);
    t.evict(2);
    t.returned(1);
    assert_eq!(t.evicted_pages(), 1);
    t.miss(2);
    let h = t.histogram();
    // 2 was the only evicted page left: rank 1, and one miss in all.
    assert_eq!(h.accesses(), 1);
    assert_eq!(h.buckets()[0], 1.0);
}
