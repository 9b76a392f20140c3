//! A real three-member etcd cluster on three simulated hosts, for the cluster
//! store's tests: each member runs in its host's network namespace (the same
//! namespace + veth + backbone bridge as `rebound cluster create` makes, through
//! `rebound_vmm::net`), with peer and client TLS and `--client-cert-auth`, its
//! certificates made by `rebound cluster certs`, and etcd's users and roles set up
//! by `rebound cluster store-init`. The test process reaches the members from the
//! root namespace through the backbone's address.
//!
//! Dropping it kills the members and removes the namespaces, veths, backbone and
//! data. Needs root, like the other network tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::eventually;

/// The simulated hosts' names (also their etcd members' names).
pub const HOSTS: [&str; 3] = ["h1", "h2", "h3"];
use rebound_store::member::CLIENT_PORT;

/// One simulated host and its etcd member.
pub struct EtcdHost {
    pub name: String,
    /// Its network namespace (`ip netns` name): run its daemon there.
    pub netns: String,
    /// Its address on the backbone's subnet; its member listens there.
    pub ip: std::net::Ipv4Addr,
    /// The veth on the backbone side (down = the host is cut off).
    link: String,
    member: Option<Child>,
}

pub struct EtcdCluster {
    /// Certificates (`certs/`), members' data (`data/`), logs (`log/`), and the
    /// `rebound` commands' home.
    pub dir: tempfile::TempDir,
    pub hosts: Vec<EtcdHost>,
    backbone: String,
}

/// A subnet and interface names no other cluster of this process or of a
/// concurrent test process uses: tests run in parallel, and the subnet is routed in
/// the root namespace.
fn instance() -> (u32, u32) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (std::process::id() % 100_000, n % 10)
}

impl EtcdCluster {
    /// Makes certificates, starts the three members, waits until they serve, and
    /// runs `rebound cluster store-init` for the three hosts.
    pub fn start() -> EtcdCluster {
        let (pid, n) = instance();
        let third = 10 + (pid * 10 + n) % 240;
        let backbone = format!("rbe{pid}{n}");
        let dir = tempfile::Builder::new()
            .prefix("rb-etcd")
            .tempdir()
            .unwrap();
        rebound_vmm::net::backbone_up(
            &backbone,
            Some((std::net::Ipv4Addr::new(10, 79, third as u8, 254), 24)),
        )
        .expect("the backbone bridge (needs root)");
        let mut c = EtcdCluster {
            dir,
            hosts: Vec::new(),
            backbone,
        };
        for (i, h) in HOSTS.iter().enumerate() {
            let ip = std::net::Ipv4Addr::new(10, 79, third as u8, i as u8 + 1);
            let host = EtcdHost {
                name: h.to_string(),
                netns: format!("rbe{pid}-{n}-{h}"),
                ip,
                link: format!("rbe{pid}{n}{h}"),
                member: None,
            };
            let sim = rebound_vmm::net::SimHost {
                netns: host.netns.clone(),
                bridge: "br0".into(),
                addr: Some((ip, 24)),
            };
            // Pushed first: dropping the cluster removes what was made so far.
            c.hosts.push(host);
            rebound_vmm::net::host_up(&sim, &c.backbone, &c.hosts[i].link)
                .expect("a simulated host");
        }

        let ip_sans: Vec<String> = c
            .hosts
            .iter()
            .map(|h| format!("{}={}", h.name, h.ip))
            .collect();
        c.rebound_ok(&[
            "cluster",
            "certs",
            "--hosts",
            &HOSTS.join(","),
            "--out",
            c.certs().to_str().unwrap(),
            "--ip-sans",
            &ip_sans.join(","),
        ]);
        for d in ["data", "log"] {
            std::fs::create_dir_all(c.dir.path().join(d)).unwrap();
        }
        for i in 0..c.hosts.len() {
            c.start_member(i);
        }
        eventually(
            Duration::from_secs(60),
            "every etcd member to serve",
            || {
                let o = c.etcdctl("root", &["endpoint", "health"]);
                o.status.success().then_some(())
            },
        );
        let (crt, key) = c.cert("root");
        let o = c.store_init(&crt, &key, &HOSTS.join(","));
        assert!(o.status.success(), "store-init: {o:?}\n{}", c.logs());
        c
    }

    /// Starts (or starts again, on its data) host `i`'s member in its namespace.
    fn start_member(&mut self, i: usize) {
        let h = &self.hosts[i];
        let cluster: Vec<(String, String)> = self
            .hosts
            .iter()
            .map(|o| (o.name.clone(), o.ip.to_string()))
            .collect();
        let certs = self.certs();
        let tls = rebound_store::access::TlsFiles {
            ca: self.ca(),
            cert: certs.join(format!("{}.crt", h.name)),
            key: certs.join(format!("{}.key", h.name)),
        };
        let data = self.dir.path().join("data").join(&h.name);
        let ip = h.ip.to_string();
        let member = rebound_store::member::Member {
            name: &h.name,
            ip: &ip,
            data_dir: &data,
            cluster: &cluster,
            token: &self.backbone,
            tls: &tls,
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log").join(format!("{}.log", h.name)))
            .unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &h.netns, "etcd"])
            .args(member.args())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.hosts[i].member = Some(child);
    }

    fn host(&self, name: &str) -> usize {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.hosts.iter().map(|h| self.endpoint(&h.name)).collect()
    }

    /// Host `name`'s member's client URL.
    pub fn endpoint(&self, name: &str) -> String {
        format!("https://{}:{CLIENT_PORT}", self.hosts[self.host(name)].ip)
    }

    pub fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    pub fn ca(&self) -> PathBuf {
        self.certs().join("ca.crt")
    }

    /// The certificate and key of `who`: a host's name, or `root` (the operator).
    pub fn cert(&self, who: &str) -> (PathBuf, PathBuf) {
        let c = self.certs();
        (c.join(format!("{who}.crt")), c.join(format!("{who}.key")))
    }

    /// The TLS files of `who`, as the store's client takes them.
    pub fn tls(&self, who: &str) -> rebound_store::access::TlsFiles {
        let (cert, key) = self.cert(who);
        rebound_store::access::TlsFiles {
            ca: self.ca(),
            cert,
            key,
        }
    }

    /// The cluster store options of host `name`'s daemon (`rebound daemon --netns
    /// <its netns> ...`): every member, and the host's own certificate.
    pub fn daemon_args(&self, name: &str) -> Vec<String> {
        let (crt, key) = self.cert(name);
        let path = |p: PathBuf| p.display().to_string();
        vec![
            "--etcd".into(),
            self.endpoints().join(","),
            "--etcd-cert".into(),
            path(crt),
            "--etcd-key".into(),
            path(key),
            "--etcd-ca".into(),
            path(self.ca()),
            "--host".into(),
            name.into(),
        ]
    }

    /// `rebound ARGS` with this cluster's directory as its home.
    pub fn rebound(&self, args: &[&str]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rebound"));
        self.home(c.args(args)).output().expect("run rebound")
    }

    /// `rebound ARGS`, which must succeed; its stdout.
    pub fn rebound_ok(&self, args: &[&str]) -> String {
        let o = self.rebound(args);
        assert!(
            o.status.success(),
            "rebound {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// `rebound cluster store-init` on every member, for `hosts` (comma-separated),
    /// with the operator's certificate `cert`.
    pub fn store_init(&self, cert: &Path, key: &Path, hosts: &str) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rebound"));
        c.args([
            "cluster",
            "store-init",
            "--etcd",
            &self.endpoints().join(","),
        ])
        .arg("--ca")
        .arg(self.ca())
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["--hosts", hosts]);
        self.home(&mut c).output().expect("run rebound")
    }

    fn home<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("REBOUND_HOME", self.dir.path().join("home"))
            .env("REBOUND_RUN", self.dir.path().join("run"))
    }

    /// `etcdctl ARGS` as `who` (a host or `root`), on every member.
    pub fn etcdctl(&self, who: &str, args: &[&str]) -> Output {
        let (crt, key) = self.cert(who);
        etcdctl(&self.endpoints(), &self.ca(), &crt, &key, args)
    }

    /// `etcdctl ARGS` as `who` on host `member`'s member only.
    pub fn etcdctl_on(&self, member: &str, who: &str, args: &[&str]) -> Output {
        let (crt, key) = self.cert(who);
        etcdctl(&[self.endpoint(member)], &self.ca(), &crt, &key, args)
    }

    /// The host whose member leads now, as the members that answer see it.
    pub fn leader(&self) -> String {
        eventually(Duration::from_secs(30), "a leader", || {
            let o = self.etcdctl("root", &["endpoint", "status", "-w", "json"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
            let s = v.as_array()?.iter().find(|e| {
                e["Status"]["leader"].as_u64().is_some()
                    && e["Status"]["leader"] == e["Status"]["header"]["member_id"]
            })?;
            let ep = s["Endpoint"].as_str()?;
            let h = self.hosts.iter().find(|h| self.endpoint(&h.name) == ep)?;
            Some(h.name.clone())
        })
    }

    /// SIGKILLs host `name`'s member.
    pub fn kill_member(&mut self, name: &str) {
        let i = self.host(name);
        if let Some(mut m) = self.hosts[i].member.take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }

    /// Starts host `name`'s member again on its data.
    pub fn restart_member(&mut self, name: &str) {
        let i = self.host(name);
        self.kill_member(name);
        self.start_member(i);
    }

    /// Cuts host `name` off the network (its veth down): it reaches nobody and nobody
    /// reaches it, as when its link fails.
    pub fn cut(&self, name: &str) {
        link(&self.hosts[self.host(name)].link, "down");
    }

    /// Joins host `name` to the network again.
    pub fn heal(&self, name: &str) {
        link(&self.hosts[self.host(name)].link, "up");
    }

    /// Host `name`'s member's log so far.
    pub fn log(&self, name: &str) -> String {
        let p = self.dir.path().join("log").join(format!("{name}.log"));
        std::fs::read_to_string(p).unwrap_or_default()
    }

    /// The last lines of every member's log (for a failing test's message).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for h in &self.hosts {
            let text = self.log(&h.name);
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {} ---\n", h.name);
            for l in &lines[lines.len().saturating_sub(15)..] {
                out += l;
                out.push('\n');
            }
        }
        out
    }
}

fn link(name: &str, state: &str) {
    let o = Command::new("ip")
        .args(["link", "set", name, state])
        .output()
        .expect("run ip");
    assert!(
        o.status.success(),
        "ip link set {name} {state}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `etcdctl` (v3 API) on `endpoints` with a TLS identity, arguments to follow; it
/// gives up quickly on an endpoint that does not answer.
pub fn etcdctl_cmd(endpoints: &[String], ca: &Path, cert: &Path, key: &Path) -> Command {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg(format!("--cacert={}", ca.display()))
        .arg(format!("--cert={}", cert.display()))
        .arg(format!("--key={}", key.display()))
        .args(["--dial-timeout=3s", "--command-timeout=8s"]);
    c
}

/// `etcdctl ARGS`, as [`etcdctl_cmd`] runs it.
pub fn etcdctl(endpoints: &[String], ca: &Path, cert: &Path, key: &Path, args: &[&str]) -> Output {
    etcdctl_cmd(endpoints, ca, cert, key)
        .args(args)
        .output()
        .expect("run etcdctl")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for h in &mut self.hosts {
            if let Some(mut m) = h.member.take() {
                let _ = m.kill();
                let _ = m.wait();
            }
        }
        for h in &self.hosts {
            if let Err(e) = rebound_vmm::net::host_down(&h.netns) {
                eprintln!("warning: {e}");
            }
        }
        if let Err(e) = rebound_vmm::net::backbone_down(&self.backbone) {
            eprintln!("warning: {e}");
        }
    }
}
