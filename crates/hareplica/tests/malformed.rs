//! Malformed, replayed and out-of-order frames sent over real sockets: refused with a
//! clear error, the connection closed, and the replica unchanged.

use crate::common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::*;
use hareplica::endpoint::Stream;
use hareplica::wire::{
    self, CommitKind, ErrorCode, FrameReader, Hello, HelloKind, Message, Mode, WireError, CRC_AT,
    HEADER_LEN, LEN_AT, MAX_COMMIT_PAYLOAD, TYPE_AT, VERSION_AT,
};
use hareplica::{diff_pages, DiffRun, ReplicaClient};

fn frame(msg: &Message) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode(msg, &mut b);
    b
}

fn reseal(mut f: Vec<u8>) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    h.update(&f[..CRC_AT]);
    h.update(&f[HEADER_LEN..]);
    let crc = h.finalize();
    f[CRC_AT..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
    f
}

/// Sends `bytes` on a new connection and collects the replies until the backup closes it.
fn exchange(ep: &hareplica::Endpoint, bytes: &[u8]) -> Vec<Message> {
    let mut s = ep.connect(Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The backup may close before reading everything (it refuses at the header).
    let _ = s.write_all(bytes);
    let _ = s.shutdown_write();
    let mut out = Vec::new();
    let reader = FrameReader {
        stall_limit: Duration::from_secs(5),
        idle_limit: Some(Duration::from_secs(5)),
        ..FrameReader::default()
    };
    loop {
        match reader.read(&mut s) {
            Ok(m) => out.push(m),
            Err(WireError::Closed) => return out,
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("reading the backup's reply: {e}"),
        }
    }
}

fn expect_refusal(ep: &hareplica::Endpoint, bytes: &[u8], code: ErrorCode, needle: &str) {
    let replies = exchange(ep, bytes);
    match replies.last() {
        Some(Message::Error { code: c, message }) => {
            assert_eq!(*c, code, "{message}");
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        other => panic!("expected an {code:?} error, got {other:?}"),
    }
}

fn commit_frame(tx: u64, epoch: u64, runs: &[DiffRun], heap: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode_commit(tx, epoch, runs, heap, &mut b).unwrap();
    b
}

/// The heap after the workload's `tx` and its runs against the state before.
fn workload_tx(tx: u64) -> (Vec<u8>, Vec<DiffRun>) {
    let shadow = model(tx - 1);
    let mut heap = shadow.clone();
    let pages = apply_tx(&mut heap, tx);
    let mut runs = Vec::new();
    diff_pages(&shadow, &heap, &pages, PAGE, &mut runs);
    (heap, runs)
}

/// The workload's `tx` in `epoch` as a standard `Commit` frame.
fn workload_frame(tx: u64, epoch: u64) -> Vec<u8> {
    let (heap, runs) = workload_tx(tx);
    commit_frame(tx, epoch, &runs, &heap)
}

/// The workload's `tx` in `epoch` as a compact frame (what a primary sends today).
fn compact_frame(tx: u64, epoch: u64) -> Vec<u8> {
    let (heap, runs) = workload_tx(tx);
    let mut b = Vec::new();
    wire::encode_compact_commit(tx, epoch, &runs, &heap, &mut b).unwrap();
    b
}

fn resume(epoch: u64) -> Vec<u8> {
    frame(&Message::Hello(Hello {
        kind: HelloKind::Resume,
        mode: Mode::Sync,
        heap_size: HEAP as u64,
        epoch,
    }))
}

/// A backup process in `tmp` holding the workload's first ten transactions, its primary
/// gone; returns it, its replica directory and its epoch.
fn backup_after_ten_txs(tmp: &std::path::Path) -> (BackupProc, std::path::PathBuf, u64) {
    let dir = tmp.join("replica");
    let backup = BackupProc::start(&format!("unix:{}/b.sock", tmp.display()), &dir, &[]);
    {
        let client = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
        let mut p = Primary::new(client, vec![0; HEAP], 0);
        for _ in 0..10 {
            p.step().unwrap();
        }
    }
    assert!(wait_for(Duration::from_secs(5), || backup
        .status()
        .primary
        .is_none()));
    let epoch = backup.status().epoch;
    (backup, dir, epoch)
}

#[test]
fn malformed_and_replayed_frames_leave_the_replica_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (backup, dir, epoch) = backup_after_ten_txs(tmp.path());
    let ep = backup.ep.clone();
    let status = frame(&Message::Status);

    // Frame-level damage.
    expect_refusal(
        &ep,
        b"hello world, hi!",
        ErrorCode::Malformed,
        "bad frame magic",
    );
    let mut v1 = status.clone();
    v1[VERSION_AT] = 1;
    expect_refusal(&ep, &reseal(v1), ErrorCode::Malformed, "version 1");
    let mut crc = status.clone();
    crc[CRC_AT] ^= 1;
    expect_refusal(&ep, &crc, ErrorCode::Malformed, "checksum");
    let mut unknown = status.clone();
    unknown[TYPE_AT] = 99;
    expect_refusal(
        &ep,
        &reseal(unknown),
        ErrorCode::Malformed,
        "unknown frame type 99",
    );
    // An oversized header is refused at once, without the payload ever being sent.
    let mut huge = commit_frame(1, epoch, &[], &[]);
    huge[LEN_AT..LEN_AT + 4].copy_from_slice(&(MAX_COMMIT_PAYLOAD + 1).to_le_bytes());
    let t = Instant::now();
    expect_refusal(
        &ep,
        &huge[..HEADER_LEN],
        ErrorCode::Malformed,
        "exceeds its cap",
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    // Commit caps tighter than the global one: before a session, and from the heap size.
    let mut pre = commit_frame(1, epoch, &[], &[]);
    pre[LEN_AT..LEN_AT + 4].copy_from_slice(&(100u32 << 10).to_le_bytes());
    expect_refusal(
        &ep,
        &pre[..HEADER_LEN],
        ErrorCode::Malformed,
        "cap of 65536",
    );
    let mut in_session = commit_frame(11, epoch, &[], &[]);
    in_session[LEN_AT..LEN_AT + 4].copy_from_slice(&(5u32 << 20).to_le_bytes());
    let t = Instant::now();
    expect_refusal(
        &ep,
        &[resume(epoch), in_session[..HEADER_LEN].to_vec()].concat(),
        ErrorCode::Malformed,
        &format!("cap of {}", 4 * HEAP + (64 << 10)),
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    // A Hello whose fields lie.
    let mut bad_hello = resume(epoch);
    bad_hello[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_refusal(&ep, &reseal(bad_hello), ErrorCode::Malformed, "heap size");
    // Truncated: half a frame, then the connection ends.
    let h = resume(epoch);
    assert!(exchange(&ep, &h[..h.len() / 2]).is_empty());
    // A commit outside any session.
    expect_refusal(
        &ep,
        &workload_frame(11, epoch),
        ErrorCode::Unexpected,
        "Commit",
    );

    // Inside a session (a primary reconnecting in the current epoch).
    let s = |extra: &[u8]| [resume(epoch), extra.to_vec()].concat();
    // The exact resend of an applied tx is acknowledged again and changes nothing…
    let replies = exchange(&ep, &s(&workload_frame(10, epoch)));
    assert!(
        matches!(
            replies[..],
            [
                Message::Welcome { last_tx: 10, .. },
                Message::Ack { tx_id: 10 }
            ]
        ),
        "{replies:?}"
    );
    // …a different tx under an applied id is a replay and refused.
    let heap = vec![7u8; HEAP];
    let other = commit_frame(10, epoch, &[DiffRun { offset: 0, len: 4 }], &heap);
    expect_refusal(&ep, &s(&other), ErrorCode::Replayed, "already applied");
    expect_refusal(
        &ep,
        &s(&commit_frame(
            3,
            epoch,
            &[DiffRun { offset: 0, len: 4 }],
            &heap,
        )),
        ErrorCode::Replayed,
        "tx 3",
    );
    expect_refusal(
        &ep,
        &s(&workload_frame(12, epoch)),
        ErrorCode::OutOfOrder,
        "tx 12 does not follow the last tx 10",
    );
    expect_refusal(
        &ep,
        &s(&workload_frame(11, epoch - 1)),
        ErrorCode::Fenced,
        "fenced",
    );
    let big = vec![1u8; HEAP + 4096];
    let outside = commit_frame(
        11,
        epoch,
        &[DiffRun {
            offset: HEAP as u64 - 2,
            len: 8,
        }],
        &big,
    );
    expect_refusal(&ep, &s(&outside), ErrorCode::OutOfBounds, "outside");
    // A run announcing more bytes than the frame holds, with a valid checksum.
    let mut cut = commit_frame(
        11,
        epoch,
        &[DiffRun {
            offset: 0,
            len: 100,
        }],
        &heap,
    );
    cut.truncate(cut.len() - 10);
    let n = (cut.len() - HEADER_LEN) as u32;
    cut[LEN_AT..LEN_AT + 4].copy_from_slice(&n.to_le_bytes());
    expect_refusal(&ep, &s(&reseal(cut)), ErrorCode::Malformed, "announced");
    // A good commit after a broken one in the same stream is never applied.
    let mut bad_crc = workload_frame(11, epoch);
    bad_crc[HEADER_LEN + 30] ^= 0xff;
    let stream = [bad_crc, workload_frame(11, epoch)].concat();
    expect_refusal(&ep, &s(&stream), ErrorCode::Malformed, "checksum");
    // Stale epoch at Hello.
    expect_refusal(&ep, &resume(epoch - 1), ErrorCode::Fenced, "stale");
    // A commit frame cut mid-payload, then the connection closes.
    let whole = workload_frame(11, epoch);
    let replies = exchange(&ep, &s(&whole[..whole.len() - 3]));
    assert!(
        matches!(replies[..], [Message::Welcome { .. }]),
        "{replies:?}"
    );

    // Compact frames: only the session's next transaction checks out.
    expect_refusal(
        &ep,
        &compact_frame(11, epoch),
        ErrorCode::Unexpected,
        "compact Commit",
    );
    for (frame, why) in [
        (compact_frame(10, epoch), "a replay of the last tx"),
        (compact_frame(5, epoch), "a replay of an old tx"),
        (compact_frame(12, epoch), "a tx ahead of its place"),
        (compact_frame(11, epoch - 1), "a stale epoch"),
    ] {
        let replies = exchange(&ep, &s(&frame));
        match replies.last() {
            Some(Message::Error { code, message }) => {
                assert_eq!(*code, ErrorCode::Malformed, "{why}: {message}");
                assert!(message.contains("not tx 11 of epoch"), "{why}: {message}");
            }
            other => panic!("{why}: expected a refusal, got {other:?}"),
        }
    }
    let mut damaged = compact_frame(11, epoch);
    *damaged.last_mut().unwrap() ^= 0x40;
    expect_refusal(&ep, &s(&damaged), ErrorCode::Malformed, "checksum");
    let whole = compact_frame(11, epoch);
    let replies = exchange(&ep, &s(&whole[..whole.len() - 3]));
    assert!(
        matches!(replies[..], [Message::Welcome { .. }]),
        "{replies:?}"
    );

    let st = backup.status();
    assert_eq!((st.last_tx, st.epoch), (10, epoch));
    drop(backup);
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 10);
    assert!(image == model(10), "the replica changed");
}

/// The frame reader on the primary's side, fed through a socket pair.
#[test]
fn frame_reader_rejects_damage_through_a_socket_pair() {
    let read = |bytes: &[u8]| {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(bytes).unwrap();
        drop(a);
        let mut s = Stream::Unix(b);
        FrameReader::default().read(&mut s)
    };
    let ack = frame(&Message::Ack { tx_id: 5 });
    assert!(matches!(read(&ack), Ok(Message::Ack { tx_id: 5 })));
    assert!(matches!(read(&[]), Err(WireError::Closed)));
    assert!(matches!(
        read(&ack[..10]),
        Err(WireError::Truncated { got: 10, want: 12 })
    ));
    assert!(matches!(
        read(&ack[..16]),
        Err(WireError::Truncated { got: 16, want: 20 })
    ));
    let mut m = ack.clone();
    m[0] = b'X';
    assert!(matches!(read(&m), Err(WireError::BadMagic(_))));
    let mut v = ack.clone();
    v[VERSION_AT] = 7;
    assert!(matches!(read(&reseal(v)), Err(WireError::BadVersion(7))));
    let mut c = ack.clone();
    c[HEADER_LEN] ^= 1;
    assert!(matches!(read(&c), Err(WireError::BadCrc { .. })));
    let mut big = ack.clone();
    big[LEN_AT..LEN_AT + 4].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(
        read(&big),
        Err(WireError::Oversized { len: 9, cap: 8, .. })
    ));
    let mut short = ack[..HEADER_LEN + 4].to_vec();
    short[LEN_AT..LEN_AT + 4].copy_from_slice(&4u32.to_le_bytes());
    assert!(matches!(
        read(&reseal(short)),
        Err(WireError::Malformed { .. })
    ));

    // A peer that stops inside a frame is dropped after the stall limit.
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&ack[..12]).unwrap();
    b.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let reader = FrameReader {
        stall_limit: Duration::from_millis(300),
        idle_limit: None,
        ..FrameReader::default()
    };
    let mut s = Stream::Unix(b);
    assert!(matches!(reader.read(&mut s), Err(WireError::Stalled(_))));
    drop(a);
}

/// A fake backup (a real unix socket): answers the first frame of each connection with
/// `replies[i]` for connection i, then reads on until the client goes (an empty reply:
/// hangs up at once).
fn fake_backup(replies: Vec<Vec<u8>>) -> (hareplica::Endpoint, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for reply in replies {
            let (s, _) = listener.accept().unwrap();
            let mut s = Stream::Unix(s);
            let _ = FrameReader::default().read_raw(&mut s);
            if reply.is_empty() {
                continue;
            }
            let _ = s.write_all(&reply);
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        }
    });
    (format!("unix:{}", path.display()).parse().unwrap(), tmp)
}

fn welcome(last_tx: u64, epoch: u64, heap_size: u64) -> Vec<u8> {
    frame(&Message::Welcome {
        last_tx,
        epoch,
        heap_size,
    })
}

fn image(offset: u64, total: u64, len: usize) -> Vec<u8> {
    frame(&Message::Image {
        offset,
        total,
        data: vec![1; len],
    })
}

#[test]
fn the_client_rejects_a_misbehaving_backup() {
    use hareplica::Error;
    let heap = HEAP as u64;
    let protocol = |r: Result<ReplicaClient, Error>, needle: &str| match r {
        Err(Error::Protocol(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        Err(e) => panic!("expected a protocol error about {needle}, got {e}"),
        Ok(_) => panic!("accepted a misbehaving backup ({needle})"),
    };
    let (ep, _t) = fake_backup(vec![
        b"not a frame at all".to_vec(),
        welcome(0, 1, heap + 4096),
        welcome(5, 1, heap),
    ]);
    protocol(ReplicaClient::connect(&ep, heap, Mode::Sync), "magic");
    protocol(ReplicaClient::connect(&ep, heap, Mode::Sync), "-byte heap");
    protocol(
        ReplicaClient::connect(&ep, heap, Mode::Sync),
        "fresh heap welcomed at tx 5",
    );

    let (ep, _t) = fake_backup(vec![
        image(0, hareplica::wire::MAX_HEAP + 1, 10),
        [image(0, 8192, 4096), image(5000, 8192, 10)].concat(),
        [image(0, 8192, 4096), welcome(3, 2, 8192)].concat(),
        [image(0, 4096, 4096), frame(&Message::Ack { tx_id: 1 })].concat(),
    ]);
    let attach = || ReplicaClient::attach(&ep, Mode::Sync).map(|r| r.0);
    protocol(attach(), "out of range");
    protocol(attach(), "out of order");
    protocol(attach(), "image of 4096 bytes for a 8192-byte heap");
    protocol(attach(), "unexpected Ack during attach");

    let (ep, _t) = fake_backup(vec![
        [welcome(0, 1, heap), frame(&Message::Ack { tx_id: 7 })].concat(),
        vec![],
    ]);
    let mut c = ReplicaClient::connect(&ep, heap, Mode::Sync).unwrap();
    let h = vec![0u8; HEAP];
    match c.commit(1, &[DiffRun { offset: 0, len: 1 }], &h) {
        Err(Error::Protocol(m)) => assert!(m.contains("not awaited"), "{m}"),
        other => panic!("ack of an unsent tx accepted: {other:?}"),
    }
    // A backup that hangs up without answering is unavailable, not a protocol breach.
    assert!(matches!(
        ReplicaClient::connect(&ep, heap, Mode::Sync),
        Err(Error::BackupUnavailable { .. })
    ));
    assert!(matches!(
        ReplicaClient::connect(&ep, heap, Mode::Async { max_lag: 1 << 20 }),
        Err(Error::LagTooLarge(_))
    ));
}

/// A primary whose link stalls halfway through a commit (the connection stays open):
/// the backup drops it after `--frame-timeout-ms`, the half commit is never applied,
/// and a new primary can take over without a promote.
#[test]
fn a_commit_stalled_mid_frame_is_dropped_and_never_applied() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("replica");
    let backup = BackupProc::start(
        &format!("unix:{}/b.sock", tmp.path().display()),
        &dir,
        &["--frame-timeout-ms", "300"],
    );
    {
        let client = ReplicaClient::connect(&backup.ep, HEAP as u64, Mode::Sync).unwrap();
        let mut p = Primary::new(client, vec![0; HEAP], 0);
        for _ in 0..5 {
            p.step().unwrap();
        }
    }
    assert!(wait_for(Duration::from_secs(5), || backup
        .status()
        .primary
        .is_none()));
    let epoch = backup.status().epoch;
    let mut s = backup.ep.connect(Duration::from_secs(5)).unwrap();
    let commit = workload_frame(6, epoch);
    s.write_all(&[resume(epoch), commit[..commit.len() / 2].to_vec()].concat())
        .unwrap();
    assert!(wait_for(Duration::from_secs(2), || backup
        .status()
        .primary
        .is_some()));
    // Dropped after the frame timeout, while our end is still open.
    assert!(wait_for(Duration::from_secs(5), || backup
        .status()
        .primary
        .is_none()));
    let (_c, image, last_tx) = ReplicaClient::attach(&backup.ep, Mode::Sync).unwrap();
    assert_eq!(last_tx, 5);
    assert!(image == model(5));
    drop(s);
}

/// Streamed transactions over a real backup process: parts a primary gave up (its link
/// broke, or it sent a whole commit instead) are never applied, not even from the log
/// after a restart; broken part sequences are refused and change nothing.
#[test]
fn given_up_and_broken_part_sequences_are_never_applied() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut backup, dir, epoch) = backup_after_ten_txs(tmp.path());
    let ep = backup.ep.clone();
    let s = |extra: &[u8]| [resume(epoch), extra.to_vec()].concat();
    let junk = vec![0xAAu8; HEAP + PAGE]; // room for a run past the heap's end
    let part = |kind: CommitKind, tx: u64, offset: u64, len: u32| {
        let mut b = Vec::new();
        wire::encode_commit_frame(kind, tx, epoch, &[DiffRun { offset, len }], &junk, &mut b)
            .unwrap();
        b
    };
    let p0 = |tx| part(CommitKind::Part { index: 0 }, tx, 100, 8);
    let p1 = |tx| part(CommitKind::Part { index: 1 }, tx, 200, 8);

    // Two parts of tx 11, then the link ends: nothing is acknowledged.
    let replies = exchange(&ep, &s(&[p0(11), p1(11)].concat()));
    assert!(
        matches!(replies[..], [Message::Welcome { .. }]),
        "{replies:?}"
    );
    // The primary commits tx 11 whole instead: only that is applied.
    let replies = exchange(&ep, &s(&[p0(11), workload_frame(11, epoch)].concat()));
    assert!(
        matches!(
            replies[..],
            [Message::Welcome { .. }, Message::Ack { tx_id: 11 }]
        ),
        "{replies:?}"
    );

    // Broken sequences, each refused.
    expect_refusal(
        &ep,
        &s(&p1(12)),
        ErrorCode::OutOfOrder,
        "part 1 of tx 12 arrived after 0",
    );
    let end2 = part(CommitKind::End { parts: 2 }, 12, 300, 8);
    expect_refusal(
        &ep,
        &s(&[p0(12), end2].concat()),
        ErrorCode::OutOfOrder,
        "ends after 1 parts but announces 2",
    );
    expect_refusal(
        &ep,
        &s(&[p0(12), p1(13)].concat()),
        ErrorCode::OutOfOrder,
        "belongs to tx 13",
    );
    expect_refusal(&ep, &s(&p0(13)), ErrorCode::OutOfOrder, "does not follow");
    let whole_heap = |index| part(CommitKind::Part { index }, 12, 0, HEAP as u32);
    expect_refusal(
        &ep,
        &s(&(0..5).flat_map(whole_heap).collect::<Vec<u8>>()),
        ErrorCode::Malformed,
        "exceed the commit cap",
    );
    let outside = part(CommitKind::Part { index: 0 }, 12, HEAP as u64 - 4, 8);
    expect_refusal(&ep, &s(&outside), ErrorCode::OutOfBounds, "outside");

    assert_eq!(backup.status().last_tx, 11);
    // The log holds the given-up parts; a replay must skip them.
    backup.kill9();
    let (image, last_tx) = dump(&dir);
    assert_eq!(last_tx, 11);
    assert!(
        image == model(11),
        "given-up or refused parts reached the replica"
    );
}
