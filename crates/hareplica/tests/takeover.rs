//! Takeover after the primary dies, promote fencing, and the `rebound-ha` commands.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use hareplica::wire::ErrorCode;
use hareplica::{Endpoint, Error, Mode, ReplicaClient};

const CHILD_ENV: &str = "HAREPLICA_TEST_PRIMARY_EP";

/// Not a test on its own: the body of the primary child process that the takeover test
/// starts by running this test binary again, with `--ignored` and `CHILD_ENV` set.
#[test]
#[ignore = "the child process of the takeover test, started by it"]
fn primary_child() {
    let ep = std::env::var(CHILD_ENV).expect("run by the takeover test, which names the backup");
    let ep: Endpoint = ep.parse().unwrap();
    let client = ReplicaClient::connect(&ep, HEAP as u64, Mode::Sync).unwrap();
    let mut p = Primary::new(client, vec![0; HEAP], 0);
    loop {
        p.step().unwrap();
        println!("acked {}", p.client.last_acked());
    }
}

#[test]
fn attach_after_the_primary_is_killed_gives_its_last_acknowledged_state() {
    for (trial, kill_after) in [7u64, 40, 133].into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("replica");
        let backup = BackupProc::start(&format!("unix:{}/b.sock", tmp.path().display()), &dir, &[]);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--ignored",
                "takeover::primary_child",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD_ENV, backup.ep.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let acked = |lines: &mut dyn Iterator<Item = std::io::Result<String>>| {
            lines
                .map_while(Result::ok)
                .find_map(|l| l.strip_prefix("acked ").map(|n| n.parse::<u64>().unwrap()))
        };
        while acked(&mut lines).is_some_and(|n| n < kill_after) {}
        child.kill().unwrap();
        child.wait().unwrap();
        // The child ran on while we read; its last printed ack is what it saw.
        let mut seen = kill_after;
        while let Some(n) = acked(&mut lines) {
            seen = n;
        }

        let (client, image, last_tx) = ReplicaClient::attach(&backup.ep, Mode::Sync).unwrap();
        // Everything the dead primary saw acknowledged, plus at most the one tx it had in
        // flight or had acknowledged but not yet printed.
        assert!(
            last_tx == seen || last_tx == seen + 1,
            "trial {trial}: attached at {last_tx}, primary saw {seen}"
        );
        assert!(
            image == model(last_tx),
            "trial {trial}: image is not exactly tx {last_tx}"
        );
        let old_epoch = client.epoch();
        let mut p = Primary::new(client, image, last_tx);
        for _ in 0..5 {
            p.step().unwrap();
        }
        let st = backup.status();
        assert_eq!((st.last_tx, st.epoch), (last_tx + 5, old_epoch));
        drop(backup);
        let (image, t) = dump(&dir);
        assert_eq!(t, last_tx + 5);
        assert!(image == model(last_tx + 5));
    }
}

#[test]
fn promote_fences_the_old_primary_and_lets_a_new_one_attach() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let backup = BackupProc::start("tcp:127.0.0.1:0", &dir, &[]);
    let ep = backup.ep.to_string();
    let opts = backup.options(Mode::Sync);
    let client = ReplicaClient::connect_with(&backup.ep, HEAP as u64, opts.clone()).unwrap();
    let mut old = Primary::new(client, vec![0; HEAP], 0);
    for _ in 0..5 {
        old.step().unwrap();
    }
    let st = backup.status();
    let p = st.primary.as_ref().expect("a primary is connected");
    assert!(p.current && p.peer.starts_with("tcp:127.0.0.1:") && p.mode == Mode::Sync);
    assert_eq!((st.last_tx, st.txs_applied), (5, 5));
    assert!(st.bytes_applied > 0 && st.wal_bytes > st.bytes_applied);
    assert!(st.ms_since_commit.is_some());
    // A second primary may not take over while the first is current.
    match ReplicaClient::attach_with(&backup.ep, opts.clone()) {
        Err(Error::Rejected {
            code: ErrorCode::PrimaryActive,
            ..
        }) => {}
        other => panic!("attach beside a live primary: {:?}", other.map(|r| r.2)),
    }
    let token = token_file().to_str().unwrap();
    let out = cli(&["promote", "--connect", &ep, "--token-file", token, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["last_tx"], 5);
    assert!(v["epoch"].as_u64().unwrap() > old.client.epoch());
    let st = backup.status();
    assert!(
        !st.primary.as_ref().unwrap().current,
        "old primary not shown as fenced"
    );

    let err = old.step().unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    let (client, image, last_tx) = ReplicaClient::attach_with(&backup.ep, opts).unwrap();
    assert_eq!(last_tx, 5);
    assert!(image == model(5));
    let mut new = Primary::new(client, image, last_tx);
    new.step().unwrap();
    // The fenced primary cannot come back either.
    assert!(matches!(old.client.reconnect(), Err(Error::Fenced(_))));
    assert_eq!(backup.status().last_tx, 6);
}

#[test]
fn fresh_heap_does_not_overwrite_a_replica_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let listen = format!("unix:{}/b.sock", tmp.path().display());
    let mut backup = BackupProc::start(&listen, &dir, &[]);
    {
        let c = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
        let mut p = Primary::new(c, vec![0; HEAP], 0);
        p.step().unwrap();
    }
    assert!(wait_for(Duration::from_secs(5), || backup
        .status()
        .primary
        .is_none()));
    match ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync) {
        Err(Error::Rejected {
            code: ErrorCode::Exists,
            message,
        }) => assert!(message.contains("haheap_takeover")),
        other => panic!("fresh connect over a replica: {:?}", other.err()),
    }
    assert_eq!(backup.status().last_tx, 1);
    backup.kill9();
    backup = BackupProc::start(&listen, &dir, &["--allow-reset"]);
    let c = ReplicaClient::connect(&backup.ep, 2 * HEAP as u64, Mode::Sync).unwrap();
    assert_eq!(
        (c.last_acked(), backup.status().heap_size),
        (0, 2 * HEAP as u64)
    );
}

#[test]
fn commands_refuse_bad_replica_files_without_touching_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let listen = format!("unix:{}/b.sock", tmp.path().display());
    let backup = BackupProc::start(&listen, &dir, &[]);
    {
        let c = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
        let mut p = Primary::new(c, vec![0; HEAP], 0);
        for _ in 0..3 {
            p.step().unwrap();
        }
    }
    let st = cli(&["status", "--connect", &backup.ep.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(
        (v["last_tx"].as_u64(), v["heap_size"].as_u64()),
        (Some(3), Some(HEAP as u64))
    );
    drop(backup);
    let text = cli(&["status", "--dir", dir.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("last tx    3"));

    let img = dir.join("replica.img");
    let good = std::fs::read(&img).unwrap();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("truncated", good[..20].to_vec()),
        ("oversized", [good.clone(), vec![0; 100]].concat()),
    ];
    let mut magic = good.clone();
    magic[..4].copy_from_slice(b"ELF\x7f");
    cases.push(("bad magic", magic));
    let mut version = good.clone();
    version[8] = 2;
    cases.push(("version 2", version));
    let out_file = tmp.path().join("out.img");
    let out_path = out_file.to_str().unwrap();
    for (needle, bytes) in cases {
        std::fs::write(&img, &bytes).unwrap();
        for args in [
            vec!["status", "--dir", dir.to_str().unwrap()],
            vec!["dump", "--dir", dir.to_str().unwrap(), "--out", out_path],
            vec![
                "backup",
                "--listen",
                &listen,
                "--dir",
                dir.to_str().unwrap(),
            ],
        ] {
            let out = cli(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} accepted a {needle} image");
            assert!(err.contains(needle), "{args:?}: {err:?} lacks {needle:?}");
            assert_eq!(
                err.trim_end().lines().count(),
                1,
                "{args:?}: not one line: {err:?}"
            );
            assert_eq!(
                std::fs::read(&img).unwrap(),
                bytes,
                "{args:?} modified the image"
            );
        }
        assert!(!out_file.exists(), "dump wrote output from a bad image");
    }
    let out = cli(&["status", "--connect", "unix:/nonexistent/sock"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unavailable"));
    let out = cli(&["backup", "--listen", "udp:1:2", "--dir", "/tmp/x"]);
    assert!(!out.status.success());
}
