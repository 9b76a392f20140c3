//! The backup killed with SIGKILL and restarted, against a live primary.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use hareplica::{ClientOptions, Error, Mode, OnFailure, ReplicaClient};

fn opts(backup: &BackupProc, mode: Mode, on_failure: OnFailure) -> ClientOptions {
    let mut o = backup.options(mode);
    o.on_failure = on_failure;
    o.ack_timeout = Duration::from_secs(5);
    o
}

const RETRY: OnFailure = OnFailure::Reconnect {
    attempts: 200,
    delay: Duration::from_millis(25),
};

/// Reconnect mode: the primary blocks while the backup is down, then resumes; the
/// replica ends equal to the primary.
fn blocking_mode_resumes(listen: &str, mode: Mode, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let listen = listen.replace("DIR", tmp.path().to_str().unwrap());
    let dir = tmp.path().join("replica");
    let mut backup = BackupProc::start(&listen, &dir, extra);
    let client =
        ReplicaClient::connect_with(&backup.ep, HEAP as u64, opts(&backup, mode, RETRY)).unwrap();
    let mut primary = Primary::new(client, vec![0; HEAP], 0);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (d2, s2) = (Arc::clone(&done), Arc::clone(&stop));
    // Commits until told to stop, so both kills land mid-stream however fast it runs.
    let worker = std::thread::spawn(move || {
        while !s2.load(Ordering::SeqCst) {
            primary.step().expect("commit in blocking mode");
            d2.store(primary.next_tx - 1, Ordering::SeqCst);
        }
        primary.client.flush().unwrap();
        primary
    });
    let progress = |n: u64| {
        let before = done.load(Ordering::SeqCst);
        assert!(wait_for(Duration::from_secs(20), || done
            .load(Ordering::SeqCst)
            > before + n));
    };
    // How long the backup stays dead each time: the primary must ride out an outage
    // of this length, not just a reconnect.
    const OUTAGE: Duration = Duration::from_millis(300);
    for _ in 0..2 {
        progress(50);
        backup.kill9();
        std::thread::sleep(OUTAGE);
        backup.restart();
    }
    progress(50);
    stop.store(true, Ordering::SeqCst);
    let primary = worker.join().unwrap();
    let n = primary.next_tx - 1;
    assert!(
        primary.client.stats().reconnects >= 2,
        "{:?}",
        primary.client.stats()
    );
    assert_eq!(primary.client.last_acked(), n);
    assert_eq!(backup.status().last_tx, n);
    drop(backup);
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, n);
    assert!(image == primary.heap, "replica differs from the primary");
}

#[test]
fn sync_primary_blocks_and_resumes_over_tcp() {
    blocking_mode_resumes("tcp:127.0.0.1:0", Mode::Sync, &[]);
}

#[test]
fn async_primary_blocks_and_resumes_over_unix_durable() {
    blocking_mode_resumes(
        "unix:DIR/b.sock",
        Mode::Async { max_lag: 16 },
        &["--durable"],
    );
}

#[test]
fn fail_mode_fails_cleanly_then_resumes_the_same_tx() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let listen = format!("unix:{}/b.sock", tmp.path().display());
    let mut backup = BackupProc::start(&listen, &dir, &[]);
    let client = ReplicaClient::connect_with(
        &backup.ep,
        HEAP as u64,
        opts(&backup, Mode::Sync, OnFailure::Fail),
    )
    .unwrap();
    let mut primary = Primary::new(client, vec![0; HEAP], 0);
    for _ in 0..20 {
        primary.step().unwrap();
    }
    backup.kill9();
    let err = primary.step().unwrap_err();
    assert!(matches!(err, Error::BackupUnavailable { .. }), "{err}");
    // Still down: fails again, at once.
    assert!(matches!(
        primary.step().unwrap_err(),
        Error::BackupUnavailable { .. }
    ));
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 20);
    assert!(image == model(20));
    backup.restart();
    primary
        .step()
        .expect("the failed tx goes through after the restart");
    for _ in 0..10 {
        primary.step().unwrap();
    }
    assert_eq!(primary.client.last_acked(), 31);
    drop(backup);
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 31);
    assert!(image == model(31));
}

/// SIGKILL at random points of a pipelined stream: after restart the replica holds every
/// acknowledged transaction and at most whole unacknowledged ones.
#[test]
fn kill9_mid_stream_keeps_acknowledged_txs_and_no_partial_one() {
    for trial in 0..6u64 {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("replica");
        let listen = format!("unix:{}/b.sock", tmp.path().display());
        // Odd trials fsync; trials from 3 on checkpoint every 4 KiB of log (a few dozen
        // txs), so kills also land inside checkpoints.
        let mut extra = vec![];
        if trial % 2 == 1 {
            extra.push("--durable");
        }
        if trial >= 3 {
            extra.extend(["--checkpoint-kb", "4"]);
        }
        let extra = &extra[..];
        let mut backup = BackupProc::start(&listen, &dir, extra);
        let mode = Mode::Async { max_lag: 32 };
        let client = ReplicaClient::connect_with(
            &backup.ep,
            HEAP as u64,
            opts(&backup, mode, OnFailure::Fail),
        )
        .unwrap();
        let worker = std::thread::spawn(move || {
            let mut primary = Primary::new(client, vec![0; HEAP], 0);
            // Runs until the backup's death makes a commit fail.
            while primary.step().is_ok() {}
            // `next_tx` is the tx whose commit failed: it may have been sent whole.
            (primary.client.last_acked(), primary.next_tx)
        });
        let delay = 50 + fastrand::u64(..400);
        std::thread::sleep(Duration::from_millis(delay));
        backup.kill9();
        let (last_acked, next_tx) = worker.join().unwrap();
        assert!(
            last_acked > 0,
            "trial {trial}: nothing acknowledged in {delay} ms"
        );
        let (image, last_tx) = dump(&dir);
        eprintln!("trial {trial}: killed after {delay} ms; acked {last_acked}, replica {last_tx}, sent at most {next_tx}");
        assert!(
            last_acked <= last_tx && last_tx <= next_tx,
            "trial {trial}: replica at tx {last_tx}, acknowledged {last_acked}, sent at most {next_tx}"
        );
        assert!(
            image == model(last_tx),
            "trial {trial}: replica is not exactly tx {last_tx}"
        );
        // And a restarted backup serves exactly that state.
        backup.restart();
        assert_eq!(backup.status().last_tx, last_tx);
    }
}
