//! Refused peers and frames (wrong token, modified frame, replays within and across
//! connections), each with its log line, and the cohort still serving a
//! legitimate coordinator afterwards; refused token files.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rebound_coord::msg::Message;
use rebound_coord::report::{Outcome, VmState};
use rebound_coord::token::TokenError;
use rebound_coord::wire::{CLIENT_HELLO_LEN, MAGIC, SERVER_HELLO_LEN};
use rebound_coord::{restore, ClusterToken, Plan};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{
    capture_logs, cohort, json, other_token, quick, quick_cohort, raw_client, recv, token,
    StandInVms,
};
use crate::restore::vm;

fn ping(restore_id: &str) -> Vec<u8> {
    json(&Message::Ping {
        restore_id: restore_id.into(),
        t1_unix_ns: 1,
    })
}

/// Runs the coordinator's handshake with `token` by hand, ignoring the cohort's
/// proof, so the cohort's own check is what is tested.
async fn handshake_with(addr: std::net::SocketAddr, token: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let nonce_c = [5u8; 32];
    let mut hello = MAGIC.to_vec();
    hello.push(1);
    hello.extend_from_slice(&nonce_c);
    assert_eq!(hello.len(), CLIENT_HELLO_LEN);
    s.write_all(&hello).await.unwrap();
    let mut reply = [0u8; SERVER_HELLO_LEN];
    s.read_exact(&mut reply).await.unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(token).unwrap();
    mac.update(b"rebound-coord/1 coordinator");
    mac.update(&nonce_c);
    mac.update(&reply[5..37]);
    s.write_all(&mac.finalize().into_bytes()).await.unwrap();
    s
}

/// True once the cohort closed the connection without answering.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn refused_peers_and_frames_leave_the_cohort_serving() {
    let (logs, _guard) = capture_logs();
    let vms = StandInVms::new(&[]);
    let c = cohort(vms.clone(), token()).await;
    let addr = c.local_addr();

    // A client with the wrong token: refused after its proof.
    let mut s = handshake_with(addr, b"fedcba9876543210fedcba9876543210-other").await;
    assert!(closed(&mut s).await, "wrong token accepted");

    // A coordinator with the wrong token refuses the cohort (and reports it).
    let plan = Plan {
        restore_id: "wrong".into(),
        vms: vec![vm("w", addr, &[])],
    };
    let report = restore(&plan, &other_token(), &quick()).await.unwrap();
    assert!(matches!(report.outcome, Outcome::Aborted { .. }));
    assert_eq!(report.vms[0].state, VmState::Unknown);
    assert!(!report.cohorts[0].reachable);
    assert!(
        report.cohorts[0]
            .error
            .as_deref()
            .unwrap()
            .contains("did not prove"),
        "{:?}",
        report.cohorts[0]
    );
    assert_eq!(vms.count("load", "w"), 0);

    // A modified frame.
    let (mut r, mut w) = raw_client(addr, &token()).await;
    let mut frame = w.encode_next(&ping("m")).unwrap();
    let n = frame.len();
    frame[n - 40] ^= 0x20;
    w.write_raw(&frame).await.unwrap();
    assert_eq!(recv(&mut r).await, None, "modified frame answered");

    // A frame replayed within its connection: the first copy is answered, the
    // second drops the connection.
    let (mut r, mut w) = raw_client(addr, &token()).await;
    let captured = w.encode_next(&ping("replay")).unwrap();
    w.write_raw(&captured).await.unwrap();
    assert!(matches!(recv(&mut r).await, Some(Message::Pong { .. })));
    w.write_raw(&captured).await.unwrap();
    assert_eq!(recv(&mut r).await, None, "replayed frame answered");

    // The same captured frame (sequence number 0, as a new connection expects)
    // sent on a new connection.
    let (mut r, mut w) = raw_client(addr, &token()).await;
    w.write_raw(&captured).await.unwrap();
    assert_eq!(
        recv(&mut r).await,
        None,
        "frame from another connection answered"
    );

    // A frame that skips a sequence number.
    let (mut r, mut w) = raw_client(addr, &token()).await;
    let _lost = w.encode_next(&ping("gap")).unwrap();
    w.write(&ping("gap")).await.unwrap();
    assert_eq!(recv(&mut r).await, None, "out-of-order frame answered");

    // An oversized length prefix.
    let (mut r, mut w) = raw_client(addr, &token()).await;
    w.write_raw(&(2u32 << 20).to_be_bytes()).await.unwrap();
    assert_eq!(recv(&mut r).await, None, "oversized frame answered");

    // An unknown protocol version.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = MAGIC.to_vec();
    hello.push(9);
    hello.extend_from_slice(&[0; 32]);
    s.write_all(&hello).await.unwrap();
    assert!(closed(&mut s).await, "unknown version accepted");

    // Each refusal said why.
    let text = logs.text();
    for why in [
        "did not prove it holds the cluster token",
        "failed its MAC check",
        "reuses sequence number 0, expected 1 (replayed)",
        "has sequence number 1, expected 0",
        "over the 1048576-byte cap",
        "speaks protocol version 9",
    ] {
        assert!(text.contains(why), "no log line saying {why:?} in:\n{text}");
    }

    // And the cohort still serves a legitimate coordinator.
    let plan = Plan {
        restore_id: "after".into(),
        vms: vec![vm("ok", addr, &[])],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Restored);
    assert_eq!(vms.count("start", "ok"), 1);
}

/// Peers that connect and say nothing hold at most `max_handshakes` slots for at
/// most the handshake timeout; connections past `max_connections` are closed at
/// once; the refusals are counted in a bounded number of log lines; and a
/// legitimate coordinator is served once the silent ones have timed out.
#[tokio::test]
async fn silent_and_surplus_connections_are_capped() {
    let (logs, _guard) = capture_logs();
    let vms = StandInVms::new(&[]);
    let c = cohort(vms.clone(), token()).await;
    let addr = c.local_addr();
    let cfg = quick_cohort();
    let total = cfg.max_connections + 36;
    let mut silent = Vec::new();
    for _ in 0..total {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    // Give the cohort a moment to accept them all, then count who it kept.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut open = 0;
    for s in &mut silent {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await {
            Err(_) => open += 1,             // nothing to read, still open
            Ok(Ok(n)) if n > 0 => open += 1, // its server hello: mid-handshake
            Ok(_) => {}                      // closed by the cohort
        }
    }
    assert!(
        open <= cfg.max_handshakes,
        "{open} of {total} silent connections held open (at most {} handshakes)",
        cfg.max_handshakes
    );
    let lines = logs
        .text()
        .lines()
        .filter(|l| l.contains("cohort closed a connection"))
        .count();
    assert!(
        (1..=16).contains(&lines),
        "{lines} log lines for {total} refusals"
    );
    // After the handshake timeout the silent ones are gone and a coordinator is served.
    tokio::time::sleep(cfg.handshake_timeout + Duration::from_millis(200)).await;
    let plan = Plan {
        restore_id: "after-flood".into(),
        vms: vec![vm("ok", addr, &[])],
    };
    let report = restore(&plan, &token(), &quick()).await.unwrap();
    assert_eq!(report.outcome, Outcome::Restored);
    drop(silent);
}

#[test]
fn token_files_too_short_or_readable_by_others_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    ClusterToken::create_file(&good).unwrap();
    ClusterToken::from_file(&good).unwrap();

    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = ClusterToken::from_file(&good).unwrap_err();
    assert!(matches!(err, TokenError::Permissions { mode: 0o644, .. }));
    let line = err.to_string();
    assert!(line.contains("chmod 600") && !line.contains('\n'), "{line}");

    let short = dir.path().join("short");
    std::fs::write(&short, b"only-twenty-bytes-xx\n").unwrap();
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = ClusterToken::from_file(&short).unwrap_err();
    assert!(matches!(err, TokenError::TooShort { len: 20, .. }), "{err}");
    assert!(!err.to_string().contains('\n'));
}
