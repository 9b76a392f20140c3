//! Frames replayed into a restored guest before it runs (`vm restore --paused
//! --replay NIC=FILE`, the API's `replay`): they wait while the guest is held and
//! reach it when it starts, which the guest shows by answering them; bad replay
//! input fails the restore in one line and leaves nothing behind.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster_net::{daemon_in, stopped, Netns};
use crate::common::{self, Env};

/// The bridge's address: the guest answers echo requests from it, and the bridge
/// answers the guest's ARP for it.
const BRIDGE_IP: [u8; 4] = [10, 77, 0, 1];
const GUEST_IP: [u8; 4] = [10, 77, 0, 41];
const ECHO_ID: u16 = 0x5242;

fn ip(args: &[&str]) -> String {
    let o = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The MAC address of `dev` in namespace `ns`.
fn mac_of(ns: &Netns, dev: &str) -> [u8; 6] {
    let line = ip(&["-n", &ns.0, "-o", "link", "show", "dev", dev]);
    let mac = line
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .expect("link/ether");
    let m: rebound_cluster::pcap::MacAddr = mac.parse().unwrap();
    m.0
}

fn checksum(b: &[u8]) -> u16 {
    let mut s: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// An ICMP echo request from the bridge to the guest, as the bridge would send it.
fn echo_request(src_mac: [u8; 6], dst_mac: [u8; 6], seq: u16, payload: &[u8]) -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0];
    icmp.extend_from_slice(&ECHO_ID.to_be_bytes());
    icmp.extend_from_slice(&seq.to_be_bytes());
    icmp.extend_from_slice(payload);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut iph = vec![0x45, 0];
    iph.extend_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
    iph.extend_from_slice(&[0, seq as u8, 0x40, 0, 64, 1, 0, 0]);
    iph.extend_from_slice(&BRIDGE_IP);
    iph.extend_from_slice(&GUEST_IP);
    let c = checksum(&iph);
    iph[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = dst_mac.to_vec();
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&iph);
    f.extend_from_slice(&icmp);
    f
}

/// A raw ICMP socket in the namespace: it sees every ICMP packet the namespace's
/// stack receives, the guest's echo replies to the bridge's address included.
fn icmp_socket(ns: &Netns) -> OwnedFd {
    ns.run(|| {
        // SAFETY: plain socket(2); the fd it returns is owned by the OwnedFd alone.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh, open descriptor nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd) }
    })
}

/// The sequence numbers of the echo replies with our id and `payload` that arrive
/// within `wait`.
fn echo_replies(sock: &OwnedFd, payload: &[u8], wait: Duration, want: usize) -> Vec<u16> {
    let end = Instant::now() + wait;
    let mut seqs = Vec::new();
    while seqs.len() < want {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut p = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) };
        if n <= 0 {
            continue;
        }
        let mut buf = [0u8; 2048];
        // SAFETY: the buffer is valid for its length; the fd is open.
        let got = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if got <= 0 {
            continue;
        }
        let d = &buf[..got as usize];
        let ihl = usize::from(d[0] & 0x0f) * 4;
        let Some(icmp) = d.get(ihl..) else { continue };
        let is_ours = icmp.len() >= 8
            && icmp[0] == 0
            && icmp[4..6] == ECHO_ID.to_be_bytes()
            && d[12..16] == GUEST_IP
            && &icmp[8..] == payload;
        if is_ours {
            seqs.push(u16::from_be_bytes([icmp[6], icmp[7]]));
        }
    }
    seqs
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let records: Vec<(u64, &[u8])> = frames.iter().map(|f| (0, f.as_slice())).collect();
    let mut out = Vec::new();
    rebound_cluster::pcap::write_pcap(&mut out, &records).unwrap();
    std::fs::write(path, out).unwrap();
}

/// Nothing of a failed restore of `name` is left: no VM, no run dir (RAM file).
fn nothing_left(env: &Env, name: &str) {
    let (code, _) = env
        .call("GET", &format!("/v1/vms/{name}"), None)
        .expect("status call");
    assert_eq!(code, 404, "{name} must not exist");
    assert!(
        !env.run.path().join(name).exists(),
        "{name}'s run dir is left"
    );
}

#[test]
fn a_held_restore_replays_frames_that_the_guest_answers_once_it_runs() {
    let ns = Netns::new("r");
    ip(&["-n", &ns.0, "addr", "add", "10.77.0.1/24", "dev", "br0"]);
    let env = Env::new();
    daemon_in(&env, &ns);
    env.ok(&[
        "vm",
        "start",
        "r1",
        "--memory",
        "160M",
        "--nic",
        "bridge=br0,ip=10.77.0.41/24",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap");
    let snap_s = snap.to_str().unwrap();
    env.ok(&["vm", "snapshot", "r1", "--out", snap_s, "--trace-s", "0"]);
    // The snapshot's guest goes: its copy takes its MAC and address on the bridge.
    env.ok(&["vm", "kill", "r1"]);
    stopped(&env, "r1");
    env.ok(&["vm", "rm", "r1"]);

    let guest_mac = rebound_api::nic::Mac::for_vm("r1", 0).0;
    let payload = format!("rebound-replay-{}", std::process::id()).into_bytes();
    let frames: Vec<Vec<u8>> = (1..=3)
        .map(|seq| echo_request(mac_of(&ns, "br0"), guest_mac, seq, &payload))
        .collect();
    let good = dir.path().join("net1.pcap");
    write_pcap(&good, &frames);
    let good_s = good.to_str().unwrap();

    // Bad replay input: one line each, and no VM, QEMU or RAM file left behind.
    let truncated = dir.path().join("truncated.pcap");
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 5]).unwrap();
    let magic = dir.path().join("magic.pcap");
    let mut b = bytes.clone();
    b[..4].copy_from_slice(b"\x0a\x0d\x0d\x0a");
    std::fs::write(&magic, &b).unwrap();
    let missing = dir.path().join("missing.pcap");
    let arg = |nic: u32, p: &Path| format!("{nic}={}", p.display());
    for (nic, file, paused, says) in [
        (1, &missing, true, "cannot open it"),
        (1, &truncated, true, "cut short"),
        (1, &magic, true, "pcap magic"),
        (2, &good, true, "has 1 bridge NIC (net1)"),
        (1, &good, false, "replay needs paused: true"),
    ] {
        let r = arg(nic, file);
        let mut a = vec!["vm", "restore", snap_s, "--name", "r2", "--mode", "eager"];
        a.extend_from_slice(&["--replay", &r]);
        if paused {
            a.push("--paused");
        }
        let e = env.fails(&a);
        assert!(e.contains(says), "{file:?}: {e}");
        nothing_left(&env, "r2");
    }
    // The same through the API: a NIC named twice.
    let (code, body) = env
        .call(
            "POST",
            "/v1/restore",
            Some(&json!({
                "dir": snap_s, "name": "r2", "paused": true,
                "replay": [{"nic": 1, "pcap": good_s}, {"nic": 1, "pcap": good_s}],
            })),
        )
        .unwrap();
    assert_eq!(code, 400, "{body}");
    let e = body["error"].as_str().unwrap();
    assert!(e.contains("twice") && !e.contains('\n'), "{e}");
    nothing_left(&env, "r2");

    // The real thing: restored and held, the frames are queued for the guest.
    let sock = icmp_socket(&ns);
    let report: Value = serde_json::from_str(&env.ok(&[
        "vm",
        "restore",
        snap_s,
        "--name",
        "r2",
        "--mode",
        "eager",
        "--paused",
        "--replay",
        &format!("net1={good_s}"),
        "--json",
    ]))
    .unwrap();
    assert_eq!(report["phase"], "held", "{report}");
    let bytes: usize = frames.iter().map(Vec::len).sum();
    assert_eq!(
        report["replayed_frames"],
        json!([{"nic": 1, "frames": 3, "bytes": bytes}]),
        "{report}"
    );
    let ev = env
        .events("r2")
        .into_iter()
        .find(|e| e["kind"] == "frames_replayed")
        .expect("a frames_replayed event");
    assert_eq!(ev["detail"], json!({"nic": 1, "frames": 3, "bytes": bytes}));
    // Held: the guest has not run, so nothing answers yet.
    assert_eq!(
        echo_replies(&sock, &payload, Duration::from_millis(700), 1),
        Vec::<u16>::new(),
        "a held guest answered"
    );
    assert!(
        std::fs::read_dir(env.run.path().join("r2"))
            .unwrap()
            .all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("replay")),
        "the replay socket is left"
    );
    let unix_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    };
    let before = unix_ns();
    env.ok(&["vm", "resume", "r2"]);
    let after = unix_ns();
    // The start instant is QEMU's own stamp of the resume, between our two readings.
    let (code, rep) = env.call("GET", "/v1/vms/r2/restore", None).unwrap();
    assert_eq!(code, 200, "{rep}");
    let started = rep["started_unix_ns"].as_i64().unwrap_or_default();
    assert!(
        (before..=after).contains(&started),
        "started_unix_ns {started} is not within the resume ({before}..{after}): {rep}"
    );
    // Running: it received the three requests, in order, and answers each.
    let seqs = echo_replies(&sock, &payload, Duration::from_secs(30), 3);
    assert_eq!(seqs, [1, 2, 3], "the guest's echo replies");
    common::eventually(Duration::from_secs(10), "r2 to run", || {
        (env.status("r2")["state"] == "running").then_some(())
    });
    env.ok(&["vm", "kill", "r2"]);
    stopped(&env, "r2");
}
