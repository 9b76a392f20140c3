//! The cluster store of a cluster's simulated hosts: one etcd member in each
//! simulated host's network namespace (client port 2379, peer port 2380 on the
//! host's cluster address), mutual TLS with certificates made for the cluster
//! (`<cluster>/pki`, as `rebound cluster certs` makes them), roles set up as
//! `rebound cluster store-init` does, and each host's daemon started with its own
//! certificate. The controller (this CLI) acts as the operator, with the `root`
//! identity: it submits restores and grants their hosts access to them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rebound_cluster::certs::{self, Mode, Request};
use rebound_cluster::spec::HostSpec;
use rebound_store::access;
use rebound_store::etcd::{EtcdConfig, EtcdStore, TlsFiles};
use rebound_store::Store;

use super::Cluster;

pub use rebound_store::member::CLIENT_PORT;

/// A simulated host's address (the spec gives every simulated host one).
fn sim_ip(h: &HostSpec) -> std::net::Ipv4Addr {
    h.addr.expect("a simulated host has an address")
}

impl Cluster {
    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    fn sims(&self) -> Vec<&HostSpec> {
        self.spec.hosts.iter().filter(|h| h.simulated).collect()
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.sims()
            .iter()
            .map(|h| format!("https://{}:{CLIENT_PORT}", sim_ip(h)))
            .collect()
    }

    /// `who`'s certificate files (a host's name, or `root`).
    pub fn tls(&self, who: &str) -> TlsFiles {
        let p = self.pki();
        TlsFiles {
            ca: p.join("ca.crt"),
            cert: p.join(format!("{who}.crt")),
            key: p.join(format!("{who}.key")),
        }
    }

    /// The arguments a simulated host's daemon joins the store with.
    pub fn daemon_store_args(&self, h: &HostSpec) -> Vec<String> {
        let t = self.tls(&h.name);
        vec![
            "--etcd".into(),
            self.endpoints().join(","),
            "--etcd-ca".into(),
            t.ca.display().to_string(),
            "--etcd-cert".into(),
            t.cert.display().to_string(),
            "--etcd-key".into(),
            t.key.display().to_string(),
            "--host".into(),
            h.name.clone(),
        ]
    }

    /// The store, as the operator (`root`).
    pub async fn admin_store(&self) -> anyhow::Result<EtcdStore> {
        let mut c = EtcdConfig::new(self.endpoints());
        c.tls = Some(self.tls("root"));
        EtcdStore::connect(&c)
            .await
            .with_context(|| format!("cannot reach cluster {}'s store", self.spec.name))
    }

    /// An access-control client, as the operator.
    pub async fn admin_access(&self) -> anyhow::Result<access::Client> {
        Ok(access::connect(&self.endpoints(), &self.tls("root")).await?)
    }
}

/// As the operator: grants the plan's hosts its records, submits it and follows it
/// to its report (the grant is taken back once it ended).
pub async fn submit_and_wait(
    store: &EtcdStore,
    access: &mut access::Client,
    plan: rebound_coord::Plan,
    timeouts: rebound_coord::records::Timeouts,
) -> anyhow::Result<rebound_coord::RestoreReport> {
    let hosts: Vec<String> = plan
        .vms
        .iter()
        .map(|v| v.host.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let id = plan.restore_id.clone();
    // A grant sent while the members elect a leader times out: it is tried again
    // (granting twice changes nothing) for as long as an election can take.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match access::grant_restore(access, &id, &hosts).await {
            Ok(()) => break,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(300)).await
            }
            Err(e) => return Err(e).context("cannot grant the hosts the restore's records"),
        }
    }
    let limit = timeouts.limit();
    rebound_coord::submit::submit(store, plan, timeouts).await?;
    let r = rebound_coord::submit::wait(store, &id, limit, |_| {}).await;
    if let Err(e) = access::revoke_restore(access, &id).await {
        eprintln!("warning: {}", rebound_errors::chain(&e));
    }
    Ok(r?)
}

/// Certificates (once), every member started, the roles set up.
pub async fn store_up(c: &Cluster) -> anyhow::Result<()> {
    let sims = c.sims();
    if sims.is_empty() {
        return Ok(());
    }
    if !c.pki().join("ca.crt").exists() {
        let hosts: Vec<String> = sims.iter().map(|h| h.name.clone()).collect();
        let sans: Vec<(String, std::net::IpAddr)> = sims
            .iter()
            .map(|h| (h.name.clone(), std::net::IpAddr::V4(sim_ip(h))))
            .collect();
        let req = Request::new(&hosts, &sans, 3650, Mode::New)?;
        certs::issue(&c.pki(), &req).context("cannot make the cluster's certificates")?;
    }
    for h in &sims {
        start_member(c, h)?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = match c.admin_store().await {
            Ok(s) => s.get(rebound_coord::layout::ROOT).await.is_ok(),
            Err(_) => false,
        };
        if ok {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster store did not answer within 60 s; see {}",
                c.host_home(sims[0]).join("etcd.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hosts: Vec<String> = sims.iter().map(|h| h.name.clone()).collect();
    let mut a = c.admin_access().await?;
    access::store_init(&mut a, &hosts)
        .await
        .context("cannot set up the store's roles")?;
    // The cluster's definition, for every host and operator that reads the store.
    let toml = std::fs::read_to_string(c.dir.join("cluster.toml"))?;
    let rec = rebound_coord::records::ClusterRecord {
        format: rebound_coord::records::FORMAT,
        name: c.spec.name.clone(),
        toml,
        updated_unix_ns: rebound_coord::run::unix_now_ns(),
    };
    c.admin_store()
        .await?
        .put(
            &rebound_coord::layout::cluster(&c.spec.name),
            rebound_coord::records::encode(&rec),
            None,
        )
        .await
        .context("cannot record the cluster's definition in its store")?;
    Ok(())
}

fn pidfile(c: &Cluster, h: &HostSpec) -> PathBuf {
    c.host_home(h).join("etcd.pid")
}

fn member_pid(c: &Cluster, h: &HostSpec) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pidfile(c, h))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "etcd").then_some(pid)
}

/// Starts host `h`'s member in its namespace unless it runs (on its data, if any).
fn start_member(c: &Cluster, h: &HostSpec) -> anyhow::Result<()> {
    if member_pid(c, h).is_some() {
        return Ok(());
    }
    let home = c.host_home(h);
    rebound_vmm::private::create_dir_all(&home)?;
    let ip = sim_ip(h).to_string();
    let cluster: Vec<(String, String)> = c
        .sims()
        .iter()
        .map(|o| (o.name.clone(), sim_ip(o).to_string()))
        .collect();
    let data = home.join("etcd");
    let t = c.tls(&h.name);
    let member = rebound_store::member::Member {
        name: &h.name,
        ip: &ip,
        data_dir: &data,
        cluster: &cluster,
        token: &format!("rebound-{}", c.spec.name),
        tls: &t,
    };
    let log = rebound_vmm::private::create_file(&home.join("etcd.log"), false)?;
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &c.netns(h), "etcd"])
        .args(member.args())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    rebound_vmm::process::new_session(&mut cmd);
    let child = cmd
        .spawn()
        .context("cannot start etcd (install Debian's etcd-server)")?;
    std::fs::write(pidfile(c, h), child.id().to_string())?;
    std::thread::spawn(move || {
        let mut child = child;
        child.wait()
    });
    Ok(())
}

/// Stops every member (their data stays until the cluster is removed): SIGTERM,
/// then SIGKILL for a member still there after 3 s (a leader whose peers are gone
/// can wait long to hand its leadership over).
pub fn store_down(c: &Cluster) {
    use nix::sys::signal::{kill, Signal};
    let pids: Vec<nix::unistd::Pid> = c
        .sims()
        .iter()
        .filter_map(|h| member_pid(c, h))
        .map(nix::unistd::Pid::from_raw)
        .collect();
    for &p in &pids {
        let _ = kill(p, Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && pids.iter().any(|&p| kill(p, None).is_ok()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for &p in &pids {
        let _ = kill(p, Signal::SIGKILL);
    }
    for h in c.sims() {
        let _ = std::fs::remove_file(pidfile(c, h));
    }
}

/// Where a command finds a cluster store and as whom (the operator's certificate
/// for writes; any host's certificate reads).
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// etcd's client URLs, comma-separated (e.g.
    /// https://10.0.0.5:2379,https://10.0.0.6:2379).
    #[arg(long = "etcd", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The CA certificate (PEM) that signed the etcd members' and hosts' certificates.
    #[arg(long, requires = "etcd")]
    pub etcd_ca: Option<PathBuf>,
    /// The certificate to act as (PEM; its CN is its etcd user: a host's for a
    /// daemon, `root` for the operator; `rebound cluster certs` makes them).
    #[arg(long, requires = "etcd")]
    pub etcd_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, requires = "etcd")]
    pub etcd_key: Option<PathBuf>,
}

impl StoreArgs {
    /// The connection these arguments describe; `None` without `--etcd`.
    pub fn config(&self) -> anyhow::Result<Option<EtcdConfig>> {
        if self.etcd.is_empty() {
            return Ok(None);
        }
        let mut c = EtcdConfig::new(self.etcd.clone());
        c.tls = match (&self.etcd_ca, &self.etcd_cert, &self.etcd_key) {
            (None, None, None) => None,
            (Some(ca), Some(cert), Some(key)) => Some(TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => bail!("--etcd-ca, --etcd-cert and --etcd-key go together"),
        };
        Ok(Some(c))
    }

    /// The TLS files, which acting as the operator needs.
    pub fn operator_tls(&self) -> anyhow::Result<TlsFiles> {
        match self.config()?.and_then(|c| c.tls) {
            Some(t) => Ok(t),
            None => bail!("submitting to a cluster store needs the operator's certificate: --etcd-ca, --etcd-cert and --etcd-key"),
        }
    }

    pub async fn connect(&self) -> anyhow::Result<Option<EtcdStore>> {
        match self.config()? {
            Some(c) => Ok(Some(EtcdStore::connect(&c).await.with_context(|| {
                format!(
                    "cannot reach the cluster store at {}",
                    c.endpoints.join(",")
                )
            })?)),
            None => Ok(None),
        }
    }
}
