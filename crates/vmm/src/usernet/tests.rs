use super::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

/// QEMU 7.2's answer to `info usernet` with one forward, as captured.
const INFO: &str = "Hub -1 (net0):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n  TCP[HOST_FORWARD]   8       127.0.0.1 45011       10.0.2.15  7070     0     0\r\n";

/// A stand-in for one QEMU's user network on a host whose ports all QEMUs share,
/// answering the HMP commands with QEMU 7.2's own texts (captured from it). It
/// stands in for QEMU because the failures tested here (a port taken between two
/// commands) cannot be produced at a chosen instant with real ones.
struct Slirp {
    host: Arc<Mutex<HashSet<u16>>>,
    held: Mutex<Vec<u16>>,
    /// Ports this QEMU refuses to bind even when free (another process's, say).
    refuse: Vec<u16>,
}

impl Slirp {
    fn new(host: &Arc<Mutex<HashSet<u16>>>, held: &[u16]) -> Slirp {
        host.lock().unwrap().extend(held);
        Slirp {
            host: host.clone(),
            held: Mutex::new(held.to_vec()),
            refuse: Vec::new(),
        }
    }
}

fn port_of(spec: &str) -> u16 {
    // tcp:127.0.0.1:PORT or tcp:127.0.0.1:PORT-:GUEST
    spec.split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches('-')
        .parse()
        .unwrap()
}

impl Monitor for Slirp {
    async fn qmp(&self, command: &str, args: Option<Value>) -> Result<Value, QmpError> {
        assert_eq!(command, "human-monitor-command");
        let line = args.unwrap()["command-line"].as_str().unwrap().to_string();
        let w: Vec<&str> = line.split(' ').collect();
        let answer = match w[0] {
            "info" => {
                let mut s = "Hub -1 (net0):\r\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\r\n".to_string();
                for p in self.held.lock().unwrap().iter() {
                    s += &format!(
                        "  TCP[HOST_FORWARD]  13       127.0.0.1 {p}       10.0.2.15  7070     0     0\r\n"
                    );
                }
                s
            }
            "hostfwd_add" => {
                let p = port_of(w[2]);
                let mut host = self.host.lock().unwrap();
                if self.refuse.contains(&p) || !host.insert(p) {
                    format!("Could not set up host forwarding rule '{}'\r\n", w[2])
                } else {
                    self.held.lock().unwrap().push(p);
                    String::new()
                }
            }
            "hostfwd_remove" => {
                let p = port_of(w[2]);
                let mut held = self.held.lock().unwrap();
                if let Some(i) = held.iter().position(|h| *h == p) {
                    held.remove(i);
                    self.host.lock().unwrap().remove(&p);
                    format!("host forwarding rule for {} removed\r\n", w[2])
                } else {
                    format!("host forwarding rule for {} not found\r\n", w[2])
                }
            }
            other => panic!("unexpected {other}"),
        };
        Ok(json!(answer))
    }
}

fn fwd(host: u16) -> HostForward {
    HostForward {
        bind: Ipv4Addr::LOCALHOST,
        host,
        guest: 7070,
    }
}

fn held(q: &Slirp) -> Vec<u16> {
    let mut v = q.held.lock().unwrap().clone();
    v.sort();
    v
}

#[test]
fn the_forwards_qemu_lists_are_read_from_its_own_text() {
    assert_eq!(listening(INFO), vec![(Ipv4Addr::LOCALHOST, 45011)]);
    assert_eq!(
        listening("Hub -1 (net0):\r\n  Protocol[State] ...\r\n"),
        vec![]
    );
    // Malformed lines are skipped, not trusted.
    assert_eq!(listening("  TCP[HOST_FORWARD]  8  not-an-ip 1\r\n"), vec![]);
    assert_eq!(
        listening("  TCP[HOST_FORWARD]  8  127.0.0.1 99999\r\n"),
        vec![]
    );
    assert_eq!(listening("  TCP[HOST_FORWARD]"), vec![]);
}

#[tokio::test]
async fn every_port_moves_to_the_new_qemu() {
    let host = Arc::new(Mutex::new(HashSet::new()));
    let old = Slirp::new(&host, &[5000, 5001]);
    let new = Slirp::new(&host, &[]);
    hand_over(&old, None, &new, &[fwd(5000), fwd(5001)])
        .await
        .unwrap();
    assert_eq!(held(&old), Vec::<u16>::new());
    assert_eq!(held(&new), vec![5000, 5001]);
}

#[tokio::test]
async fn a_port_the_new_qemu_cannot_take_leaves_every_port_with_the_old_one() {
    let host = Arc::new(Mutex::new(HashSet::new()));
    let old = Slirp::new(&host, &[5000, 5001]);
    let mut new = Slirp::new(&host, &[]);
    new.refuse = vec![5001];
    let e = hand_over(&old, None, &new, &[fwd(5000), fwd(5001)])
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "QEMU refused `hostfwd_add net0 tcp:127.0.0.1:5001-:7070`: Could not set up host forwarding rule 'tcp:127.0.0.1:5001-:7070'"
    );
    // 5000 had moved: it is back, after the new QEMU lets go of it when killed.
    assert_eq!(held(&old), vec![5001]);
    new.held.lock().unwrap().clear();
    host.lock().unwrap().remove(&5000);
    assert_eq!(
        restore(&old, &[fwd(5000), fwd(5001)]).await.unwrap(),
        vec![fwd(5000)]
    );
    assert_eq!(held(&old), vec![5000, 5001]);
}

#[tokio::test]
async fn a_forward_the_old_qemu_does_not_hold_is_an_error_not_a_move() {
    let host = Arc::new(Mutex::new(HashSet::new()));
    let old = Slirp::new(&host, &[]);
    let new = Slirp::new(&host, &[]);
    let e = hand_over(&old, None, &new, &[fwd(5000)]).await.unwrap_err();
    assert!(e.to_string().ends_with("not found"), "{e}");
    assert_eq!(held(&new), Vec::<u16>::new());
}

#[tokio::test]
async fn only_the_ports_a_qemu_lost_are_put_back() {
    let host = Arc::new(Mutex::new(HashSet::new()));
    let q = Slirp::new(&host, &[5000]);
    assert_eq!(restore(&q, &[fwd(5000)]).await.unwrap(), vec![]);
    assert_eq!(
        restore(&q, &[fwd(5000), fwd(5002)]).await.unwrap(),
        vec![fwd(5002)]
    );
    assert_eq!(held(&q), vec![5000, 5002]);
    // A port someone else holds now: QEMU's reason comes back.
    host.lock().unwrap().insert(5003);
    let e = restore(&q, &[fwd(5003)]).await.unwrap_err();
    assert!(e.to_string().contains("Could not set up"), "{e}");
}

/// A QEMU's user network reduced to its host side, on real sockets: `hostfwd_add`
/// binds a listener that never accepts (as slirp had not yet), `hostfwd_remove`
/// closes it, `info usernet` lists each with its real descriptor number. It stands in
/// for QEMU because a connection queued at the instant of a removal cannot be made
/// at a chosen moment with a real one.
#[derive(Default)]
struct Sockets {
    held: Mutex<Vec<(u16, std::net::TcpListener)>>,
}

impl Sockets {
    fn take(&self, port: u16) -> std::net::TcpListener {
        let mut h = self.held.lock().unwrap();
        let i = h.iter().position(|(p, _)| *p == port).unwrap();
        h.remove(i).1
    }
}

impl Monitor for Sockets {
    async fn qmp(&self, command: &str, args: Option<Value>) -> Result<Value, QmpError> {
        use std::os::fd::AsRawFd;
        assert_eq!(command, "human-monitor-command");
        let line = args.unwrap()["command-line"].as_str().unwrap().to_string();
        let w: Vec<&str> = line.split(' ').collect();
        let mut held = self.held.lock().unwrap();
        let answer = match w[0] {
            "info" => held
                .iter()
                .map(|(p, l)| {
                    format!(
                        "  TCP[HOST_FORWARD]  {}       127.0.0.1 {p}       10.0.2.15  7070     0     0\r\n",
                        l.as_raw_fd()
                    )
                })
                .collect(),
            "hostfwd_add" => match std::net::TcpListener::bind(("127.0.0.1", port_of(w[2]))) {
                Ok(l) => {
                    held.push((port_of(w[2]), l));
                    String::new()
                }
                Err(e) => format!("Could not set up host forwarding rule: {e}\r\n"),
            },
            "hostfwd_remove" => {
                held.retain(|(p, _)| *p != port_of(w[2]));
                format!("host forwarding rule for {} removed\r\n", w[2])
            }
            other => panic!("unexpected {other}"),
        };
        Ok(json!(answer))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_queued_on_the_old_listener_is_relayed_not_reset() {
    use std::io::{Read, Write};
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // A client connected and asked while the old QEMU had not accepted it yet.
    let ask = move || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        c.write_all(b"GET k\n").unwrap();
        c
    };
    let answer = |mut c: std::net::TcpStream| {
        let mut got = Vec::new();
        c.read_to_end(&mut got).map(|_| got)
    };
    // QEMU alone: the removal closes the listener and the kernel resets the client.
    let (old, new) = (Sockets::default(), Sockets::default());
    add(&old, &fwd(port)).await.unwrap();
    let c = ask();
    hand_over(&old, None, &new, &[fwd(port)]).await.unwrap();
    let e = answer(c).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    drop(new.take(port));
    // With the old QEMU's process known (this one), the queued connection reaches
    // the new listener, and its answer comes back.
    let (old, new) = (Sockets::default(), Sockets::default());
    add(&old, &fwd(port)).await.unwrap();
    let c = ask();
    hand_over(&old, Some(std::process::id()), &new, &[fwd(port)])
        .await
        .unwrap();
    assert!(old.held.lock().unwrap().is_empty());
    let l = new.take(port);
    let served = tokio::task::spawn_blocking(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 6];
        s.read_exact(&mut line).unwrap();
        s.write_all(b"VALUE v\n").unwrap();
        line
    });
    let got = tokio::task::spawn_blocking(move || answer(c))
        .await
        .unwrap();
    assert_eq!(&served.await.unwrap(), b"GET k\n");
    assert_eq!(got.unwrap(), b"VALUE v\n");
}

#[test]
fn a_listener_is_taken_only_if_it_is_the_forward_s() {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let me = std::process::id();
    assert!(take_listener(me, l.as_raw_fd(), &fwd(port)).is_some());
    // Another port, another address, a descriptor that is not a listener, none.
    assert!(take_listener(me, l.as_raw_fd(), &fwd(port.wrapping_add(1))).is_none());
    let mut other = fwd(port);
    other.bind = Ipv4Addr::new(127, 0, 0, 2);
    assert!(take_listener(me, l.as_raw_fd(), &other).is_none());
    let f = std::fs::File::open("/dev/null").unwrap();
    assert!(take_listener(me, f.as_raw_fd(), &fwd(port)).is_none());
    let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(take_listener(me, c.as_raw_fd(), &fwd(port)).is_none());
    assert!(take_listener(me, 1 << 20, &fwd(port)).is_none());
}
