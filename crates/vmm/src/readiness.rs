//! Readiness probes for guests without our agent: a TCP port, an HTTP path, or a
//! regex over the serial log. (Agent readiness is the agent's `ready` message.)
//!
//! QEMU user networking accepts a connection on a forwarded host port before the
//! guest has answered (the host side never sees the guest's SYN-ACK): a TCP probe
//! therefore connects, then asks QEMU (`info usernet`) whether slirp's connection to
//! the guest port reached ESTABLISHED.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::qmp::Qmp;
use rebound_api::ReadySpec;

/// How much of the end of the serial log a serial probe reads (it runs every
/// 250 ms: a guest's prompt is in the last lines; a flooding guest's log is not read whole).
const SERIAL_TAIL: u64 = 64 * 1024;

/// How long an accepted connection must stay open to count as a listening guest.
const SETTLE: Duration = Duration::from_millis(300);

/// One probe attempt. `host_port` is the forwarded host port for TCP/HTTP probes;
/// `qmp` lets a TCP probe see slirp's view of the guest connection.
pub async fn probe(
    spec: &ReadySpec,
    host_port: Option<u16>,
    serial_log: &Path,
    qmp: Option<&Qmp>,
) -> bool {
    match spec {
        ReadySpec::Agent => false,
        ReadySpec::Tcp(guest) => match (host_port, qmp) {
            (Some(p), Some(q)) => tcp_established(p, *guest, q).await,
            (Some(p), None) => tcp_open(p).await,
            _ => false,
        },
        ReadySpec::Http { path, .. } => match host_port {
            Some(p) => http_ok(p, path).await,
            None => false,
        },
        ReadySpec::Serial(re) => match crate::logcap::tail(serial_log, SERIAL_TAIL) {
            Ok(b) => re.is_match(&String::from_utf8_lossy(&b)),
            Err(_) => false,
        },
    }
}

/// Whether `info usernet` lists an ESTABLISHED TCP connection to `guest_port`.
pub fn usernet_established(info: &str, guest_port: u16) -> bool {
    info.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // Protocol[State] FD SrcAddr SrcPort DstAddr DstPort RecvQ SendQ
        f.len() >= 6 && f[0] == "TCP[ESTABLISHED]" && f[5].parse::<u16>() == Ok(guest_port)
    })
}

async fn tcp_established(host_port: u16, guest_port: u16, qmp: &Qmp) -> bool {
    let Ok(Ok(_conn)) =
        tokio::time::timeout(SETTLE, TcpStream::connect(("127.0.0.1", host_port))).await
    else {
        return false;
    };
    // Give slirp a moment to hear back from the guest while we hold the connection.
    tokio::time::sleep(SETTLE).await;
    let args = serde_json::json!({"command-line": "info usernet"});
    match qmp.execute("human-monitor-command", Some(args)).await {
        Ok(v) => usernet_established(v.as_str().unwrap_or_default(), guest_port),
        Err(_) => false,
    }
}

/// Without QMP: a connection that stays open and silent, or greets us.
async fn tcp_open(port: u16) -> bool {
    let Ok(Ok(mut s)) = tokio::time::timeout(SETTLE, TcpStream::connect(("127.0.0.1", port))).await
    else {
        return false;
    };
    let mut b = [0u8; 1];
    match tokio::time::timeout(SETTLE, s.read(&mut b)).await {
        Err(_) => true,     // still open, silent: a listener
        Ok(Ok(n)) => n > 0, // greeted us, or closed (n == 0)
        Ok(Err(_)) => false,
    }
}

/// Parses the status code from an HTTP response's first line.
pub fn http_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    parts.next()?.parse().ok()
}

async fn http_ok(port: u16, path: &str) -> bool {
    let go = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut head = vec![0u8; 256];
        let mut n = 0;
        while n < head.len() {
            let k = s.read(&mut head[n..]).await.ok()?;
            if k == 0 {
                break;
            }
            n += k;
            if head[..n].contains(&b'\n') {
                break;
            }
        }
        http_status(&head[..n])
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), go).await, Ok(Some(s)) if s < 400)
}

/// One `COUNT` request to a kv service on host port `port`: true when it answers
/// with a line (a restored kv guest's first answer).
pub async fn kv_answers(port: u16) -> bool {
    use tokio::io::AsyncBufReadExt;
    let ask = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(b"COUNT\n").await.ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(s)
            .read_line(&mut line)
            .await
            .ok()?;
        Some(!line.trim().is_empty() && !line.starts_with("ERR"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), ask).await,
        Ok(Some(true))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(http_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(http_status(b"HTTP/1.0 404 Not Found\r\n"), Some(404));
        assert_eq!(http_status(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(http_status(b"HTTP/1.1 abc"), None);
        assert_eq!(http_status(b""), None);
    }

    #[test]
    fn usernet_table() {
        let t = "Hub -1 (n):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n  TCP[SYN_SENT]       9       127.0.0.1 45671       10.0.2.15    22     0     0\r\n  TCP[HOST_FORWARD]   8       127.0.0.1 45671       10.0.2.15    22     0     0\r\n";
        assert!(!usernet_established(t, 22));
        let t2 = t.replace("TCP[SYN_SENT]", "TCP[ESTABLISHED]");
        assert!(usernet_established(&t2, 22));
        assert!(!usernet_established(&t2, 23));
        assert!(!usernet_established("garbage", 22));
        assert!(!usernet_established("TCP[ESTABLISHED] 1 2", 22));
    }

    #[tokio::test]
    async fn probes_real_sockets() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("serial.log");
        let re: ReadySpec = "serial:login: ?$".parse().unwrap();
        assert!(!probe(&re, None, &log, None).await);
        std::fs::write(&log, "booting\nlogin: ").unwrap();
        assert!(probe(&re, None, &log, None).await);

        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 512];
                    let _ = s.read(&mut b).await;
                    let _ = s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                });
            }
        });
        assert!(probe(&"tcp:80".parse().unwrap(), Some(port), &log, None).await);
        assert!(probe(&"http:80/x".parse().unwrap(), Some(port), &log, None).await);
        // Nothing listens on a port we just released.
        let free = crate::process::free_port().unwrap();
        assert!(!probe(&"tcp:80".parse().unwrap(), Some(free), &log, None).await);
        assert!(!probe(&"http:80/".parse().unwrap(), Some(free), &log, None).await);
    }
}
