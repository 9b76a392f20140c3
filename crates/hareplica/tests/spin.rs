//! Busy-polling client and backup (`spin`, `--spin-us`), fixed or adaptive (the default),
//! deliver every commit intact.

use crate::common;

use std::time::Duration;

use common::*;
use hareplica::{BackupConfig, ClientOptions, Endpoint, Mode, ReplicaClient, Spin};

/// Runs `n` commits in `mode` with a client waiting as `client_spin` says against a
/// backup process started with `--spin-us backup_spin_us` (adaptive without); the
/// replica must equal the primary.
fn delivers(listen: &str, mode: Mode, client_spin: Spin, backup_spin_us: Option<u64>) {
    let tmp = tempfile::tempdir().unwrap();
    let listen = listen.replace("DIR", tmp.path().to_str().unwrap());
    let dir = tmp.path().join("replica");
    let spin = backup_spin_us.map(|us| us.to_string());
    let args: Vec<&str> = match &spin {
        Some(us) => vec!["--spin-us", us],
        None => vec![],
    };
    let backup = BackupProc::start(&listen, &dir, &args);
    let mut opts = backup.options(mode);
    opts.spin = client_spin;
    let client = ReplicaClient::connect_with(&backup.ep, HEAP as u64, opts).unwrap();
    let mut primary = Primary::new(client, vec![0; HEAP], 0);
    let n = 300;
    for _ in 0..n {
        primary.step().unwrap();
    }
    primary.client.flush().unwrap();
    assert_eq!(primary.client.last_acked(), n);
    drop(primary);
    drop(backup);
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, n);
    assert!(image == model(n), "replica differs from the primary");
}

#[test]
fn spinning_client_and_backup_deliver_every_commit() {
    let spin = Spin::Fixed(Duration::from_micros(200));
    delivers("tcp:127.0.0.1:0", Mode::Sync, spin, Some(200));
    delivers("unix:DIR/b.sock", Mode::Sync, spin, Some(200));
    delivers(
        "unix:DIR/b.sock",
        Mode::Async { max_lag: 8 },
        spin,
        Some(200),
    );
    // Only one side spinning, and spin shorter than a round trip (falls back to blocking).
    delivers("tcp:127.0.0.1:0", Mode::Sync, spin, Some(0));
    delivers("unix:DIR/b.sock", Mode::Sync, Spin::Off, Some(200));
    let short = Spin::Fixed(Duration::from_micros(1));
    delivers("unix:DIR/b.sock", Mode::Sync, short, Some(1));
    // The defaults: both sides adaptive.
    delivers("unix:DIR/b.sock", Mode::Sync, Spin::PRIMARY, None);
    delivers(
        "tcp:127.0.0.1:0",
        Mode::Async { max_lag: 8 },
        Spin::PRIMARY,
        None,
    );
}

#[test]
fn spin_is_adaptive_by_default() {
    assert_eq!(ClientOptions::new(Mode::Sync).spin, Spin::PRIMARY);
    let cfg = BackupConfig::new(
        "unix:/nonexistent".parse::<Endpoint>().unwrap(),
        "/x".as_ref(),
    );
    assert_eq!(cfg.spin, Spin::BACKUP);
    let o = cli(&[
        "backup",
        "--listen",
        "unix:/x",
        "--dir",
        "/x",
        "--spin-us",
        "2000000",
    ]);
    assert!(
        !o.status.success(),
        "an out-of-range --spin-us was accepted"
    );
}
