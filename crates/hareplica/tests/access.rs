//! Who may talk to a backup: its unix socket and files are private, a TCP listener
//! requires the token, and silent connections cannot keep a primary out.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use hareplica::wire::{self, Hello, HelloKind, Message};
use hareplica::{ClusterToken, Endpoint, Error, Mode, ReplicaClient};

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_socket_and_the_replica_files_are_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let sock = tmp.path().join("b.sock");
    let mut backup = BackupProc::start(
        &format!("unix:{}", sock.display()),
        &dir,
        &["--checkpoint-kb", "1"],
    );
    let c = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
    let mut p = Primary::new(c, vec![0; HEAP], 0);
    for _ in 0..20 {
        p.step().unwrap();
    }
    assert_eq!(mode_of(&sock), 0o600, "socket");
    assert_eq!(mode_of(&dir), 0o700, "replica directory");
    for f in ["replica.img", "replica.wal", "lock"] {
        assert_eq!(mode_of(&dir.join(f)), 0o600, "{f}");
    }
    // Files an older version left readable are made private when the backup opens them.
    backup.kill9();
    std::fs::set_permissions(dir.join("replica.wal"), PermissionsExt::from_mode(0o644)).unwrap();
    backup.restart();
    assert_eq!(mode_of(&dir.join("replica.wal")), 0o600);
    let out = tmp.path().join("heap.img");
    let o = cli(&[
        "dump",
        "--dir",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode_of(&out), 0o600, "dumped heap");
}

/// Opens `n` connections that never send a byte.
fn silent(ep: &Endpoint, n: usize) -> Vec<Box<dyn Send>> {
    (0..n)
        .map(|_| -> Box<dyn Send> {
            match ep {
                Endpoint::Unix(p) => Box::new(UnixStream::connect(p).unwrap()),
                Endpoint::Tcp(a) => Box::new(TcpStream::connect(a).unwrap()),
            }
        })
        .collect()
}

/// 70 silent connections take every slot; a primary retrying meanwhile gets in once the
/// backup drops them (5 s after they were accepted, by default) and commits.
fn silent_clients_do_not_keep_a_primary_out(listen: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let listen = listen.replace("DIR", tmp.path().to_str().unwrap());
    let backup = BackupProc::start(&listen, &tmp.path().join("replica"), &[]);
    let _silent = silent(&backup.ep, 70);
    let start = Instant::now();
    let client = loop {
        match ReplicaClient::connect_with(&backup.ep, HEAP as u64, backup.options(Mode::Sync)) {
            Ok(c) => break c,
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                assert!(
                    e.to_string().contains("unavailable") || format!("{e:?}").contains("too many"),
                    "{e:?}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no primary could connect beside 70 silent clients: {e:?}"),
        }
    };
    let mut p = Primary::new(client, vec![0; HEAP], 0);
    for _ in 0..10 {
        p.step().unwrap();
    }
    assert_eq!(backup.status().last_tx, 10);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn silent_clients_do_not_keep_a_primary_out_of_a_unix_backup() {
    silent_clients_do_not_keep_a_primary_out("unix:DIR/b.sock");
}

#[test]
fn silent_clients_do_not_keep_a_primary_out_of_a_tcp_backup() {
    silent_clients_do_not_keep_a_primary_out("tcp:127.0.0.1:0");
}

#[test]
fn a_tcp_backup_needs_a_private_token_and_talks_only_to_its_holders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let dir_s = dir.to_str().unwrap();
    // No token, a loose token file, a short one: refused with one line, nothing made.
    let o = cli(&["backup", "--listen", "tcp:127.0.0.1:0", "--dir", dir_s]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--token-file"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    for (name, bytes, mode, needle) in [
        ("loose", &[7u8; 40][..], 0o640, "chmod 600"),
        ("short", &[7u8; 16][..], 0o600, "at least 32"),
    ] {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, PermissionsExt::from_mode(mode)).unwrap();
        let o = cli(&[
            "backup",
            "--listen",
            "tcp:127.0.0.1:0",
            "--dir",
            dir_s,
            "--token-file",
            path.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{name}: {err}");
    }
    assert!(!dir.exists(), "a refused start made the replica directory");

    let backup = BackupProc::start("tcp:127.0.0.1:0", &dir, &["--hello-timeout-ms", "1000"]);
    let c = ReplicaClient::connect_with(&backup.ep, HEAP as u64, backup.options(Mode::Sync));
    let mut p = Primary::new(c.unwrap(), vec![0; HEAP], 0);
    for _ in 0..3 {
        p.step().unwrap();
    }
    drop(p);
    // Without the token, or with another one, no session and no status.
    let mut no_token = backup.options(Mode::Sync);
    no_token.token = None;
    let e = ReplicaClient::attach_with(&backup.ep, no_token)
        .err()
        .unwrap();
    assert!(matches!(e, Error::NoToken), "{e:?}");
    let mut wrong = backup.options(Mode::Sync);
    wrong.token = ClusterToken::from_bytes(&[9; 32]);
    let e = ReplicaClient::attach_with(&backup.ep, wrong).err().unwrap();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let o = cli(&["status", "--connect", &backup.ep.to_string()]);
    assert!(!o.status.success());
    // A peer that skips the handshake and speaks the replication protocol gets nothing.
    let Endpoint::Tcp(addr) = &backup.ep else {
        unreachable!()
    };
    let mut raw = TcpStream::connect(addr).unwrap();
    let mut hello = Vec::new();
    wire::encode(
        &Message::Hello(Hello {
            kind: HelloKind::Fresh,
            mode: Mode::Sync,
            heap_size: HEAP as u64,
            epoch: 0,
        }),
        &mut hello,
    );
    raw.write_all(&hello).unwrap();
    raw.write_all(&[0u8; 64]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert!(got.is_empty(), "answered {} bytes", got.len());
    let token = token_file().to_str().unwrap();
    let o = cli(&[
        "status",
        "--connect",
        &backup.ep.to_string(),
        "--token-file",
        token,
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["last_tx"], 3, "the replica is unchanged");
}
