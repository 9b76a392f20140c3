//! Replication through a real backup server (hareplica) over a unix socket, and takeover.

use std::path::Path;

use haheap::{BackupFailure, EngineKind, Error, Heap, HeapConfig, ReplError, ReplMode};
use hareplica::{BackupConfig, BackupHandle, BackupServer};

const PAGE: usize = 4096;

fn backup(dir: &Path) -> BackupHandle {
    let ep = format!("unix:{}", dir.join("backup.sock").display())
        .parse()
        .unwrap();
    let (server, _report) =
        BackupServer::bind(BackupConfig::new(ep, &dir.join("replica"))).unwrap();
    server.spawn()
}

fn cfg(b: &BackupHandle, engine: EngineKind, size: usize) -> HeapConfig {
    HeapConfig {
        size,
        engine,
        backup: Some(b.endpoint().to_string()),
        mode: ReplMode::Sync,
        on_backup_failure: BackupFailure::Fail,
        spin: haheap::Spin::PRIMARY,
    }
}

/// Random writes (page engines: half of them direct stores), some transactions aborted.
fn random_txs(h: &mut Heap, rng: &mut fastrand::Rng, n: usize, check: impl Fn(&Heap)) {
    for _ in 0..n {
        h.tstart().unwrap();
        for _ in 0..rng.usize(1..8) {
            let len = rng.usize(1..200);
            let off = rng.usize(0..h.len() - len);
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            if h.engine().is_page_level() && rng.bool() {
                // SAFETY: off+len <= h.len(); page engines track direct stores.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), h.as_mut_ptr().add(off), len)
                };
            } else {
                h.write(off, &data).unwrap();
            }
        }
        if rng.u8(0..6) == 0 {
            h.abort().unwrap();
        } else {
            h.tend().unwrap();
        }
        check(h);
    }
}

#[test]
fn every_engine_replicates_and_a_new_primary_takes_over() {
    for (i, engine) in EngineKind::CONCRETE.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let b = backup(dir.path());
        let mut rng = fastrand::Rng::with_seed(100 + i as u64);
        let same = |h: &Heap| {
            let st = b.state();
            assert_eq!(
                st.last_tx,
                h.committed_tx_id(),
                "{engine}: backup at another tx"
            );
            assert!(
                st.image == h.as_slice(),
                "{engine}: backup image differs after tx {}",
                st.last_tx
            );
        };
        let mut h = Heap::create(cfg(&b, engine, 32 * PAGE)).unwrap();
        random_txs(&mut h, &mut rng, 40, same);
        let (contents, last) = (h.as_slice().to_vec(), h.committed_tx_id());
        assert!(
            h.counters().ship_ns > 0,
            "{engine}: shipping time not counted"
        );
        drop(h);

        let mut h2 = Heap::takeover(cfg(&b, engine, 0)).unwrap();
        assert_eq!(h2.engine(), engine);
        assert_eq!(
            h2.committed_tx_id(),
            last,
            "{engine}: takeover lost transactions"
        );
        assert!(
            h2.as_slice() == &contents[..],
            "{engine}: takeover image differs"
        );
        random_txs(&mut h2, &mut rng, 20, same);
        drop(h2);
        b.shutdown().unwrap();
    }
}

#[test]
fn takeover_refuses_a_wrong_size_and_a_missing_backup() {
    let dir = tempfile::tempdir().unwrap();
    let b = backup(dir.path());
    let mut h = Heap::create(cfg(&b, EngineKind::Scan, 4 * PAGE)).unwrap();
    h.tstart().unwrap();
    h.write(0, b"x").unwrap();
    h.tend().unwrap();
    drop(h);
    assert!(matches!(
        Heap::takeover(cfg(&b, EngineKind::Scan, 8 * PAGE)),
        Err(Error::SizeMismatch { .. })
    ));
    assert!(matches!(
        Heap::takeover(HeapConfig::local(0, EngineKind::Scan)),
        Err(Error::NoBackup)
    ));
    let mut bad = cfg(&b, EngineKind::Scan, 0);
    bad.backup = Some("carrier-pigeon:home".into());
    assert!(matches!(
        Heap::takeover(bad),
        Err(Error::Replication(ReplError::Endpoint(_)))
    ));
    b.shutdown().unwrap();
}

/// The backup dies: the transaction in flight is in doubt, the heap refuses new ones, and
/// once the backup is back `tend` completes it and work resumes with nothing lost.
#[test]
fn backup_restart_leaves_a_transaction_in_doubt_then_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let b = backup(dir.path());
    let mut h = Heap::create(cfg(&b, EngineKind::Scan, 8 * PAGE)).unwrap();
    for i in 0..3u8 {
        h.tstart().unwrap();
        h.write(i as usize * PAGE, &[i + 1; 100]).unwrap();
        h.tend().unwrap();
    }
    b.shutdown().unwrap();

    h.tstart().unwrap();
    h.write(5 * PAGE, b"after the backup died").unwrap();
    let err = h.tend().unwrap_err();
    assert!(
        matches!(err, Error::Replication(ReplError::InDoubt { tx: 4, .. })),
        "{err:?}"
    );
    assert!(matches!(h.tstart(), Err(Error::AwaitingAck(4))));
    assert!(matches!(h.abort(), Err(Error::AwaitingAck(4))));
    assert!(h.tend().is_err(), "no backup yet: still in doubt");

    let b = backup(dir.path());
    let st = h
        .tend()
        .expect("the restarted backup acknowledges the queued transaction");
    assert_eq!(st.tx_id, 4);
    assert_eq!(b.state().last_tx, 4);
    assert!(b.state().image == h.as_slice());
    h.tstart().unwrap();
    h.write(6 * PAGE, b"resumed").unwrap();
    assert_eq!(h.tend().unwrap().tx_id, 5);
    assert!(b.state().image == h.as_slice());
    drop(h);
    b.shutdown().unwrap();
}

#[test]
fn async_mode_flush_waits_for_every_ack() {
    let dir = tempfile::tempdir().unwrap();
    let b = backup(dir.path());
    let mut c = cfg(&b, EngineKind::Scan, 16 * PAGE);
    c.mode = ReplMode::Async { max_lag: 8 };
    let mut h = Heap::create(c).unwrap();
    let mut rng = fastrand::Rng::with_seed(9);
    random_txs(&mut h, &mut rng, 50, |_| {});
    h.flush().unwrap();
    assert_eq!(b.state().last_tx, h.committed_tx_id());
    assert!(b.state().image == h.as_slice());
    drop(h);
    b.shutdown().unwrap();
}

#[test]
fn spinning_heap_and_backup_replicate_every_commit() {
    let spin = haheap::Spin::Fixed(std::time::Duration::from_micros(200));
    for (i, engine) in EngineKind::CONCRETE.into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let ep = format!("unix:{}", dir.path().join("backup.sock").display());
        let bcfg = BackupConfig {
            spin,
            ..BackupConfig::new(ep.parse().unwrap(), &dir.path().join("replica"))
        };
        let b = BackupServer::bind(bcfg).unwrap().0.spawn();
        let mut rng = fastrand::Rng::with_seed(300 + i as u64);
        let mut h = Heap::create(HeapConfig {
            spin,
            ..cfg(&b, engine, 32 * PAGE)
        })
        .unwrap();
        random_txs(&mut h, &mut rng, 60, |h| {
            let st = b.state();
            assert_eq!(
                st.last_tx,
                h.committed_tx_id(),
                "{engine}: backup at another tx"
            );
            assert!(st.image == h.as_slice(), "{engine}: backup image differs");
        });
        drop(h);
        b.shutdown().unwrap();
    }
}
