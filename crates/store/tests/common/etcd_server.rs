//! Real etcd members for the tests: each on free ports, its data in a temporary
//! directory (in memory where /dev/shm exists), killed when dropped. A missing
//! `etcd` binary fails the test that needs it; it never skips.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Server-side TLS for the members' client URLs (peers talk plain HTTP).
pub struct ServerTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A cluster of etcd members on 127.0.0.1.
pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    pub endpoints: Vec<String>,
    dir: tempfile::TempDir,
}

fn free_ports(n: usize) -> Vec<u16> {
    // Hold every listener until all ports are chosen, so none repeats.
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

pub fn temp_dir() -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    let builder = tempfile::Builder::new()
        .prefix("rebound-store-test")
        .tempdir_in(base);
    builder
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory")
}

impl EtcdCluster {
    /// One member, plain HTTP.
    pub fn single() -> EtcdCluster {
        Self::start(1, None)
    }

    /// `n` members, started together; returns once each is ready for clients.
    pub fn start(n: usize, tls: Option<&ServerTls>) -> EtcdCluster {
        let dir = temp_dir();
        let ports = free_ports(2 * n);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = |i: usize| format!("{scheme}://127.0.0.1:{}", ports[2 * i]);
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let cluster: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
        let members = (0..n)
            .map(|i| {
                let log = dir.path().join(format!("m{i}.log"));
                let mut cmd = Command::new("etcd");
                cmd.arg("--name")
                    .arg(format!("m{i}"))
                    .arg("--data-dir")
                    .arg(dir.path().join(format!("m{i}")))
                    .args(["--listen-client-urls", &client(i)])
                    .args(["--advertise-client-urls", &client(i)])
                    .args(["--listen-peer-urls", &peer(i)])
                    .args(["--initial-advertise-peer-urls", &peer(i)])
                    .args(["--initial-cluster", &cluster.join(",")])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--initial-cluster-token", "rebound-store-test"])
                    // Fast elections; they also make etcd's minimum lease TTL 1 s
                    // (1.5 election timeouts, rounded up to a second).
                    .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                    .args(["--logger", "zap", "--log-outputs", "stderr"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(File::create(&log).expect("etcd log file"));
                if let Some(tls) = tls {
                    cmd.arg("--cert-file")
                        .arg(&tls.cert)
                        .arg("--key-file")
                        .arg(&tls.key)
                        .arg("--trusted-ca-file")
                        .arg(&tls.ca)
                        .arg("--client-cert-auth");
                }
                let child = cmd.spawn().unwrap_or_else(|e| {
                    panic!("cannot start `etcd` (install Debian's etcd-server): {e}")
                });
                Some(child)
            })
            .collect();
        let cluster = EtcdCluster {
            members,
            endpoints: (0..n).map(client).collect(),
            dir,
        };
        for i in 0..n {
            cluster.wait_ready(i);
        }
        cluster
    }

    fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default()
    }

    fn wait_ready(&self, i: usize) {
        let start = Instant::now();
        while !self.log(i).contains("serving client traffic") {
            if start.elapsed() > Duration::from_secs(30) {
                let log = self.log(i);
                let tail = &log[log.len().saturating_sub(3000)..];
                panic!("etcd member {i} not ready within 30 s; its log ends:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Kills member `i` (SIGKILL) and waits for it to be gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops (SIGSTOP) or continues (SIGCONT) member `i`: a member that hangs.
    pub fn pause(&self, i: usize, pause: bool) {
        let child = self.members[i].as_ref().expect("a running member");
        let signal = if pause { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
