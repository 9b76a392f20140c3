//! The backup SIGKILLed at random moments while an async primary streams multi-part
//! transactions and a tiny `--checkpoint-kb` makes the backup checkpoint every few
//! transactions: every restart must open its replica and hold every transaction the
//! primary was told was acknowledged, and the replica ends equal to the primary.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hareplica::{ClientOptions, Mode, OnFailure, ReplicaClient};

const KILLS: usize = 200;
/// A small heap: each of the many checkpoints writes it whole.
const SMALL_HEAP: usize = 256 << 10;

fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[test]
fn every_restart_opens_and_holds_every_acknowledged_transaction() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let listen = format!("unix:{}/b.sock", tmp.path().display());
    // 4 KiB of log: a checkpoint every few transactions. The primary may run 256
    // transactions ahead and pauses between parts (diffing, as haheap does), so when
    // the backup, busy with a checkpoint, catches up, it mostly stops after a part:
    // the next checkpoint comes with the transaction in progress half logged. The
    // backup sleeps between frames (no busy-polling, as on a one-CPU host).
    let mut backup = BackupProc::start(&listen, &dir, &["--checkpoint-kb", "4", "--spin-us", "0"]);
    let mut opts = ClientOptions::new(Mode::Async { max_lag: 256 });
    opts.on_failure = OnFailure::Reconnect {
        attempts: 400,
        delay: Duration::from_millis(10),
    };
    opts.ack_timeout = Duration::from_secs(5);
    let mut c = ReplicaClient::connect_with(&backup.ep, SMALL_HEAP as u64, opts).unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (acked2, stop2) = (Arc::clone(&acked), Arc::clone(&stop));
    let worker = std::thread::spawn(move || {
        let (mut heap, mut shadow) = (vec![0u8; SMALL_HEAP], vec![0u8; SMALL_HEAP]);
        let mut rng = fastrand::Rng::with_seed(3);
        let mut tx = 0;
        while !stop2.load(Ordering::SeqCst) {
            tx += 1;
            let runs = big_tx(&mut heap, &mut shadow, tx);
            // Three parts and an end; a broken link makes `send` resend them all.
            let third = runs.len().div_ceil(4);
            let mut chunks = runs.chunks(third.max(1)).collect::<Vec<_>>();
            let last = chunks.pop().unwrap_or(&[]);
            for part in chunks {
                c.send_part(tx, part, &heap).expect("send a part");
                // The time haheap spends diffing the next pages before the next part.
                spin_for(Duration::from_micros(rng.u64(0..300)));
            }
            c.send(tx, last, &heap)
                .and_then(|_| c.wait())
                .unwrap_or_else(|e| panic!("tx {tx}: {e}"));
            acked2.store(c.last_acked(), Ordering::SeqCst);
        }
        c.flush().expect("flush");
        (c.last_acked(), tx, heap)
    });
    let mut rng = fastrand::Rng::with_seed(31);
    let mut checked = 0;
    for kill in 0..KILLS {
        // Let the primary get past its reconnect, then kill anywhere in the stream.
        let before = acked.load(Ordering::SeqCst);
        assert!(
            wait_for(Duration::from_secs(10), || acked.load(Ordering::SeqCst)
                > before),
            "kill {kill}: the primary made no progress after a restart"
        );
        std::thread::sleep(Duration::from_micros(rng.u64(0..8000)));
        let told = acked.load(Ordering::SeqCst);
        backup.kill9();
        // Panics with the backup's log when the replica does not open.
        backup.restart();
        let last_tx = backup.status().last_tx;
        assert!(
            last_tx >= told,
            "kill {kill}: the restarted backup is at tx {last_tx}, tx {told} was acknowledged"
        );
        checked += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (last_acked, n, heap) = worker.join().expect("the primary failed");
    assert_eq!((last_acked, checked), (n, KILLS));
    backup.kill9();
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, n);
    assert!(image == heap, "the replica differs from the primary");
    eprintln!("{KILLS} kills, {n} transactions in {:?}", started.elapsed());
}
