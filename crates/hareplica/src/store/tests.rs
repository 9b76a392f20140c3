use super::*;
use crate::diff::DiffRun;
use crate::wire;

const HEAP: u64 = 64 * 1024;

fn commit(state: &ReplicaState, tx: u64, seed: u64) -> Commit {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut heap = state.image.clone();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let off = rng.u64(..HEAP - 64);
        let len = rng.u32(1..64);
        rng.fill(&mut heap[off as usize..(off + u64::from(len)) as usize]);
        runs.push(DiffRun { offset: off, len });
    }
    let mut buf = Vec::new();
    wire::encode_commit(tx, state.epoch, &runs, &heap, &mut buf).unwrap();
    Commit::parse(buf[wire::HEADER_LEN..].to_vec()).unwrap()
}

/// A store with a fresh heap and `n` logged commits; returns the expected state.
fn populated(dir: &Path, n: u64) -> ReplicaState {
    let (mut store, mut state, _) = Store::open(dir, true).unwrap();
    state.reset(HEAP);
    store.checkpoint(&state).unwrap();
    for tx in 1..=n {
        let c = commit(&state, tx, tx);
        assert_eq!(state.judge(&c), Verdict::Apply);
        store.append_commit(&c).unwrap();
        store.barrier().unwrap();
        state.apply(&c);
    }
    state
}

#[test]
fn reopen_replays_the_log_over_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 20);
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!((report.records_replayed, report.torn_tail_bytes), (20, 0));
}

#[test]
fn checkpoint_empties_the_log_and_keeps_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 5);
    {
        let (mut s, st, _) = Store::open(dir.path(), false).unwrap();
        s.checkpoint(&st).unwrap();
        assert_eq!(s.wal_bytes(), 0);
    }
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!(report.records_replayed, 0);
}

#[test]
fn log_left_over_from_before_a_checkpoint_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 5);
    let old_wal = fs::read(wal_path(dir.path())).unwrap();
    {
        let (mut s, st, _) = Store::open(dir.path(), false).unwrap();
        s.checkpoint(&st).unwrap();
    }
    // A crash between the image rename and the log truncation leaves the old records.
    fs::write(wal_path(dir.path()), &old_wal).unwrap();
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!(report.records_skipped, 5);
}

#[test]
fn a_torn_last_record_is_dropped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let full = populated(dir.path(), 10);
    let wal = fs::read(wal_path(dir.path())).unwrap();
    let nine = populated(tempfile::tempdir().unwrap().path(), 9);
    let last_len = REC_HEADER + commit(&nine, 10, 10).payload.len();
    // Cut the last record at every length: the replica is tx 9 exactly, never a mix.
    for cut in 1..last_len {
        fs::write(wal_path(dir.path()), &wal[..wal.len() - cut]).unwrap();
        let (_s, got, report) = Store::open(dir.path(), false).unwrap();
        assert_eq!(got, nine, "cut {cut}");
        // Zeros at the end of a torn record cannot be told from reserved space.
        let torn = &wal[wal.len() - last_len..wal.len() - cut];
        let nonzero = torn.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        assert_eq!(report.torn_tail_bytes as usize, nonzero, "cut {cut}");
        // The tail was cut off on disk.
        assert_eq!(
            fs::read(wal_path(dir.path())).unwrap().len(),
            wal.len() - last_len
        );
    }
    fs::write(wal_path(dir.path()), &wal).unwrap();
    assert_eq!(Store::open(dir.path(), false).unwrap().1, full);
}

#[test]
fn a_corrupt_record_ends_the_log() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path(), 3);
    let mut wal = fs::read(wal_path(dir.path())).unwrap();
    let n = wal.len();
    wal[n - 5] ^= 0xff;
    fs::write(wal_path(dir.path()), &wal).unwrap();
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got.last_tx, 2);
    assert!(report.torn_tail_bytes > 0);
}

#[test]
fn epoch_records_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path(), 2);
    {
        let (mut s, st, _) = Store::open(dir.path(), false).unwrap();
        s.append_epoch(st.epoch + 5).unwrap();
    }
    let (_s, got, _) = Store::open(dir.path(), false).unwrap();
    assert_eq!((got.epoch, got.last_tx), (6, 2));
}

#[test]
fn a_second_backup_on_the_same_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path(), false).unwrap();
    assert!(matches!(
        Store::open(dir.path(), false),
        Err(StoreError::Locked(_))
    ));
}

fn expect_bad_image(dir: &Path, bytes: &[u8], needle: &str) {
    fs::write(img_path(dir), bytes).unwrap();
    let err = Store::open(dir, false).unwrap_err();
    assert!(matches!(err, StoreError::BadImage { .. }), "{err}");
    assert!(err.to_string().contains(needle), "{err} lacks {needle}");
    assert_eq!(
        fs::read(img_path(dir)).unwrap(),
        bytes,
        "bad image was modified"
    );
}

#[test]
fn malformed_images_are_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path(), 0);
    let good = fs::read(img_path(dir.path())).unwrap();
    fs::remove_file(wal_path(dir.path())).unwrap();
    expect_bad_image(dir.path(), &good[..30], "truncated");
    expect_bad_image(dir.path(), &good[..good.len() - 1], "truncated");
    let mut big = good.clone();
    big.push(0);
    expect_bad_image(dir.path(), &big, "oversized");
    let mut magic = good.clone();
    magic[0] = b'X';
    expect_bad_image(dir.path(), &magic, "bad magic");
    let mut version = good.clone();
    version[8] = 9;
    expect_bad_image(dir.path(), &version, "version 9");
    let mut huge = good.clone();
    huge[16..24].copy_from_slice(&(MAX_HEAP + 1).to_le_bytes());
    expect_bad_image(dir.path(), &huge, "out of range");
    let mut flipped = good.clone();
    flipped[IMG_HEADER + 100] ^= 1;
    expect_bad_image(dir.path(), &flipped, "checksum");
}

#[test]
fn malformed_logs_are_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    populated(dir.path(), 1);
    let good = fs::read(wal_path(dir.path())).unwrap();
    for (i, needle) in [(0usize, "bad magic"), (8, "version")] {
        let mut bad = good.clone();
        bad[i] ^= 0x40;
        fs::write(wal_path(dir.path()), &bad).unwrap();
        let err = Store::open(dir.path(), false).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(fs::read(wal_path(dir.path())).unwrap(), bad);
    }
}

#[test]
fn zero_pages_become_holes_and_read_back_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let mut st = ReplicaState::default();
    st.reset(8 << 20);
    st.image[5 << 20] = 1;
    let (mut s, _, _) = Store::open(dir.path(), false).unwrap();
    s.checkpoint(&st).unwrap();
    drop(s);
    let (_, got, _) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, st);
}

#[test]
fn a_record_announcing_an_oversized_payload_is_a_torn_tail_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 4);
    let mut wal = fs::read(wal_path(dir.path())).unwrap();
    let good_len = wal.len();
    let mut rec = [0u8; REC_HEADER];
    rec[0] = REC_COMMIT;
    rec[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    wal.extend_from_slice(&rec);
    wal.extend_from_slice(&[0xab; 100]);
    fs::write(wal_path(dir.path()), &wal).unwrap();
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!(report.torn_tail_bytes as usize, REC_HEADER + 100);
    assert_eq!(fs::read(wal_path(dir.path())).unwrap().len(), good_len);
}

#[test]
fn space_a_killed_backup_reserved_is_neither_replayed_nor_reported() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 6);
    let records = fs::read(wal_path(dir.path())).unwrap();
    // What a SIGKILLed backup leaves: its records, then the zeros of reserved space.
    let mut wal = records.clone();
    wal.resize(records.len() + (4 << 20), 0);
    fs::write(wal_path(dir.path()), &wal).unwrap();
    let (mut s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!((report.records_replayed, report.torn_tail_bytes), (6, 0));
    assert_eq!(fs::read(wal_path(dir.path())).unwrap(), records);
    // Appending goes on right after the last record.
    let mut st = got;
    let c = commit(&st, 7, 7);
    s.append_commit(&c).unwrap();
    st.apply(&c);
    drop(s);
    let (_s, again, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(again, st);
    assert_eq!((report.records_replayed, report.torn_tail_bytes), (7, 0));
}

#[test]
fn appends_reach_the_file_before_the_store_is_closed() {
    // A backup killed after acknowledging must find the record in the file: read it
    // while the appending store is still open, as a restarted backup would after a kill.
    let dir = tempfile::tempdir().unwrap();
    let mut want = populated(dir.path(), 2);
    let (mut s, _, _) = Store::open(dir.path(), false).unwrap();
    for tx in 3..=40 {
        let c = commit(&want, tx, tx);
        s.append_commit(&c).unwrap();
        s.idle();
        want.apply(&c);
    }
    let (got, report) = Store::load_readonly(dir.path()).unwrap();
    assert_eq!(got, want);
    assert_eq!((report.records_replayed, report.torn_tail_bytes), (40, 0));
    assert!(fs::metadata(wal_path(dir.path())).unwrap().len() > report.wal_bytes + 16);
    drop(s);
    let closed = fs::metadata(wal_path(dir.path())).unwrap().len();
    assert_eq!(
        closed,
        report.wal_bytes + 16,
        "a clean close trims the reserved space"
    );
}

#[test]
fn without_fallocate_the_log_appends_with_write() {
    // Named fake: no local filesystem here lacks fallocate, so the fallback is forced.
    let dir = tempfile::tempdir().unwrap();
    let mut want = populated(dir.path(), 1);
    let (mut s, _, _) = Store::open(dir.path(), false).unwrap();
    s.wal.force_plain();
    for tx in 2..=9 {
        let c = commit(&want, tx, tx);
        s.append_commit(&c).unwrap();
        want.apply(&c);
    }
    let len = fs::metadata(wal_path(dir.path())).unwrap().len();
    assert_eq!(len, s.wal_bytes() + 16, "no space reserved");
    drop(s);
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!(report.records_replayed, 9);
}

/// Transaction `tx` streamed as `parts` parts and an end, each with a few random runs.
fn streamed(state: &ReplicaState, tx: u64, parts: u32, seed: u64) -> (Vec<Commit>, Commit) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut heap = state.image.clone();
    let mut frame = |kind: CommitKind| {
        let mut runs = Vec::new();
        for _ in 0..3 {
            let off = rng.u64(..HEAP - 64);
            let len = rng.u32(1..64);
            rng.fill(&mut heap[off as usize..(off + u64::from(len)) as usize]);
            runs.push(DiffRun { offset: off, len });
        }
        let mut buf = Vec::new();
        wire::encode_commit_frame(kind, tx, state.epoch, &runs, &heap, &mut buf).unwrap();
        Commit::parse_as(kind.frame_type(), buf[wire::HEADER_LEN..].to_vec()).unwrap()
    };
    let p = (0..parts)
        .map(|index| frame(CommitKind::Part { index }))
        .collect();
    (p, frame(CommitKind::End { parts }))
}

fn checkpoint_between_parts(plain: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut want = populated(dir.path(), 3);
    let (mut s, _, _) = Store::open(dir.path(), false).unwrap();
    if plain {
        s.wal.force_plain();
    }
    let (parts, end) = streamed(&want, 4, 3, 4);
    s.append_commit(&parts[0]).unwrap();
    s.append_commit(&parts[1]).unwrap();
    // The image written does not hold tx 4: its parts so far must stay in the log.
    s.checkpoint(&want).unwrap();
    s.append_commit(&parts[2]).unwrap();
    s.append_commit(&end).unwrap();
    assert_eq!(want.judge_tx(&parts, &end), Verdict::Apply);
    want.apply_tx(&parts, &end);
    drop(s);
    let (_s, got, report) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want);
    assert_eq!(report.records_replayed, 4, "three parts and the end");
}

#[test]
fn a_checkpoint_keeps_the_parts_of_the_transaction_in_progress() {
    checkpoint_between_parts(false);
    checkpoint_between_parts(true);
}

#[test]
fn an_end_whose_parts_are_not_in_the_log_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let want = populated(dir.path(), 2);
    let (mut s, _, _) = Store::open(dir.path(), false).unwrap();
    let (parts, end) = streamed(&want, 3, 2, 3);
    s.append_commit(&parts[0]).unwrap();
    let err = s.append_commit(&end).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::PartsMissing {
                tx: 3,
                want: 2,
                have: 1
            }
        ),
        "{err}"
    );
    // A new heap gives up the parts in progress.
    s.append_commit(&parts[1]).unwrap();
    s.reset(&want).unwrap();
    assert!(matches!(
        s.append_commit(&end),
        Err(StoreError::PartsMissing { have: 0, .. })
    ));
    drop(s);
    let (_s, got, _) = Store::open(dir.path(), false).unwrap();
    assert_eq!(got, want, "the log opens, without tx 3");
}
