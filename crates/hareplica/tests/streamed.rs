//! Transactions streamed in parts (`send_part` … `send`) to a real backup process: the
//! replica equals the primary, also after replaying the log, and a backup that dies
//! between two parts gets the whole transaction again from a reconnecting primary.

use crate::common;

use std::time::Duration;

use common::*;
use hareplica::{ClientOptions, DiffRun, Mode, OnFailure, ReplicaClient};

/// Sends `runs` as up to three parts and an end (or whole, when there are few runs).
fn stream(c: &mut ReplicaClient, tx: u64, runs: &[DiffRun], heap: &[u8]) {
    let third = runs.len() / 3;
    if third > 0 {
        c.send_part(tx, &runs[..third], heap).unwrap();
        c.send_part(tx, &runs[third..2 * third], heap).unwrap();
        c.send(tx, &runs[2 * third..], heap).unwrap();
    } else {
        c.send(tx, runs, heap).unwrap();
    }
    c.wait().unwrap();
}

#[test]
fn streamed_transactions_reach_the_replica_and_its_log_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let mut backup = BackupProc::start(&format!("unix:{}/b.sock", tmp.path().display()), &dir, &[]);
    let mut c = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
    let (mut heap, mut shadow) = (vec![0u8; HEAP], vec![0u8; HEAP]);
    for tx in 1..=30 {
        let runs = big_tx(&mut heap, &mut shadow, tx);
        stream(&mut c, tx, &runs, &heap);
        assert_eq!(c.last_acked(), tx);
    }
    assert_eq!(backup.status().last_tx, 30);
    // Everything since the last checkpoint is in the log as parts and ends.
    backup.kill9();
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 30);
    assert!(
        image == heap,
        "the replayed replica differs from the primary"
    );
}

#[test]
fn a_backup_that_dies_between_parts_gets_the_whole_transaction_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let mut backup = BackupProc::start(&format!("unix:{}/b.sock", tmp.path().display()), &dir, &[]);
    let mut opts = ClientOptions::new(Mode::Sync);
    opts.on_failure = OnFailure::Reconnect {
        attempts: 200,
        delay: Duration::from_millis(25),
    };
    let mut c = ReplicaClient::connect_with(&backup.ep, HEAP as u64, opts).unwrap();
    let (mut heap, mut shadow) = (vec![0u8; HEAP], vec![0u8; HEAP]);
    for tx in 1..=5 {
        let runs = big_tx(&mut heap, &mut shadow, tx);
        stream(&mut c, tx, &runs, &heap);
    }
    let runs = big_tx(&mut heap, &mut shadow, 6);
    let half = runs.len() / 2;
    assert!(half > 0);
    c.send_part(6, &runs[..half], &heap).unwrap();
    backup.kill9();
    backup.restart();
    // The end finds the link broken, reconnects and resends parts and end together.
    c.send(6, &runs[half..], &heap).unwrap();
    c.wait().unwrap();
    assert_eq!((c.last_acked(), c.stats().reconnects), (6, 1));
    assert_eq!(backup.status().last_tx, 6);
    backup.kill9();
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 6);
    assert!(image == heap, "the replica differs from the primary");
}
