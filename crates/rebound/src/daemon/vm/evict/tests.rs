use super::*;

#[test]
fn backend_answers_add_what_grew_and_a_restarted_backend_counts_from_zero() {
    let mut s = EvictStats::default();
    let mut seen = BTreeMap::new();
    let answer = |ev: u64, ign: u64, adm: u64, nm: u64| {
        Ok(serde_json::json!({
            "ring": {"ring": [4096, 32768], "evicted": ev, "released": 1, "lost": 2,
                     "invalid": 0, "ignored": ign, "error": null},
            "admitted": adm, "refused": {"no_mapping": nm}, "released": 1,
        }))
    };
    let (a, b) = (PathBuf::from("a.ctl"), PathBuf::from("b.ctl"));
    let fresh = take(
        &mut s,
        &mut seen,
        vec![
            (a.clone(), answer(100, 40, 50, 10)),
            (b.clone(), answer(100, 40, 0, 60)),
        ],
    );
    assert_eq!(fresh, 101);
    assert_eq!(
        (s.evicted, s.released, s.lost, s.unforwarded),
        (100, 1, 2, 40)
    );
    assert_eq!(
        (s.forwarded, s.admitted, s.refused["no_mapping"]),
        (122, 50, 70)
    );
    assert_eq!(s.backend_released, 2, "each backend's releases, summed");
    assert_eq!(s.state, "forwarding");
    // Only what grew counts; b restarted (its totals went back) and one failed.
    let fresh = take(
        &mut s,
        &mut seen,
        vec![
            (a.clone(), answer(130, 40, 70, 20)),
            (
                b,
                Err(ControlError::Refused {
                    control: "b.ctl".into(),
                    answer: "gone".into(),
                }),
            ),
        ],
    );
    assert_eq!(
        (fresh, s.evicted, s.admitted, s.refused["no_mapping"]),
        (30, 130, 70, 80)
    );
    assert_eq!(
        (s.backend_errors, s.last_error.as_deref()),
        (1, Some("b.ctl: \"gone\""))
    );
    let fresh = take(&mut s, &mut seen, vec![(a, answer(5, 0, 1, 0))]);
    assert_eq!((fresh, s.evicted, s.admitted), (5, 135, 71));
    assert_eq!(s.polls, 3);
}

#[test]
fn a_batch_the_daemon_reads_itself_is_counted_as_unforwarded() {
    let stats = Mutex::new(EvictStats::default());
    let b = Batch {
        evicted: vec![1, 2, 3],
        copies: Vec::new(),
        released: vec![4],
        lost: 2,
        invalid: 1,
    };
    account(&stats, &b);
    let s = stats.lock().unwrap().clone();
    assert_eq!((s.evicted, s.released, s.lost, s.invalid), (3, 1, 2, 1));
    assert_eq!(
        (s.polls, s.forwarded, s.unforwarded, s.admitted),
        (1, 0, 4, 0)
    );
    account(&stats, &b);
    assert_eq!(stats.lock().unwrap().unforwarded, 8);
}
