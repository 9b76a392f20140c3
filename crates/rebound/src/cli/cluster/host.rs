//! A cluster's hosts as the controller sees them: how it reaches each host's daemon
//! ([`HostLink`]), and the simulated hosts it sets up and takes down itself.
//!
//! A simulated host is a network namespace on this machine with a bridge, joined to
//! the others by a veth pair on a backbone bridge, an etcd member of the cluster's
//! store ([`super::store`]) and a daemon of its own started with `--netns` and the
//! store's address and its host's certificate: the controller reaches the daemon on
//! its unix socket. The daemons reach each other only through the store. A real
//! host's daemon is its operator's: this controller never calls into it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hyper::Method;
use rebound_cluster::spec::HostSpec;
use serde_json::Value;

use super::Cluster;
use crate::client::Client;

/// One simulated host's daemon, on its unix socket.
#[derive(Clone)]
pub struct HostLink(Client);

impl HostLink {
    /// One API call; a non-2xx answer is an error with the daemon's own message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        Ok(self.0.call::<Value>(method, path, body).await?)
    }

    /// Whether the daemon answers.
    pub async fn is_up(&self) -> bool {
        self.call(Method::GET, "/v1/health", None).await.is_ok()
    }
}

impl Cluster {
    /// How the controller reaches host `host`'s daemon (a simulated host's only).
    pub fn link(&self, host: &str) -> anyhow::Result<HostLink> {
        let h = self
            .spec
            .host(host)
            .with_context(|| format!("no host {host:?}"))?;
        if !h.simulated {
            bail!(
                "host {host:?} is not simulated: its daemon is its operator's (start its VMs there; restores reach it through the cluster store)"
            );
        }
        Ok(HostLink(Client::new(
            &self.host_home(h).join("reboundd.sock"),
        )))
    }
}

/// Namespaces, bridges, backbone, and a daemon per simulated host.
pub async fn hosts_up(c: &Cluster) -> anyhow::Result<()> {
    let sims: Vec<&HostSpec> = c.spec.hosts.iter().filter(|h| h.simulated).collect();
    if sims.is_empty() {
        return Ok(());
    }
    let bb = c.backbone();
    rebound_vmm::net::backbone_up(&bb, Some(c.spec.backbone_addr()))
        .context("cannot set up the backbone bridge (root is needed)")?;
    for h in sims {
        let sim = rebound_vmm::net::SimHost {
            netns: c.netns(h),
            bridge: c.spec.bridge.clone(),
            addr: h.addr.map(|a| (a, c.spec.subnet.1)),
        };
        let link = format!(
            "rbv{}",
            super::short(&format!("{}/{}", c.spec.name, h.name))
        );
        rebound_vmm::net::host_up(&sim, &bb, &link)
            .with_context(|| format!("cannot set up simulated host {:?}", h.name))?;
    }
    super::store::store_up(c).await?;
    for h in c.spec.hosts.iter().filter(|h| h.simulated) {
        start_host_daemon(c, h).await?;
    }
    Ok(())
}

/// Starts the daemon of every simulated host whose daemon does not answer (one that
/// died is started again and takes its VMs back).
pub async fn daemons_up(c: &Cluster) -> anyhow::Result<()> {
    super::store::store_up(c).await?;
    for h in c.spec.hosts.iter().filter(|h| h.simulated) {
        start_host_daemon(c, h).await?;
    }
    Ok(())
}

async fn start_host_daemon(c: &Cluster, h: &HostSpec) -> anyhow::Result<()> {
    let home = c.host_home(h);
    rebound_vmm::private::create_dir_all(&home)?;
    // The host's daemon boots the same images as this one.
    let images = home.join("images");
    // The link itself, not its target: a link to images not built yet is there,
    // and the VM's start says what is missing.
    if images.symlink_metadata().is_err() {
        std::os::unix::fs::symlink(c.paths.home.join("images"), &images)
            .with_context(|| format!("cannot link {}", images.display()))?;
    }
    let client = Client::new(&home.join("reboundd.sock"));
    if client.is_up().await {
        return Ok(());
    }
    let log = home.join("reboundd.log");
    let out = rebound_vmm::private::create_file(&log, true)?;
    let err = out.try_clone()?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["daemon", "--netns", &c.netns(h)])
        .args(c.daemon_store_args(h))
        .env("REBOUND_HOME", &home)
        .env("REBOUND_RUN", c.host_run(h))
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err);
    rebound_vmm::process::new_session(&mut cmd);
    let mut child = cmd.spawn().context("cannot start a host's daemon")?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while !client.is_up().await {
        if let Ok(Some(st)) = child.try_wait() {
            bail!(
                "the daemon of host {:?} exited ({st}); see {}",
                h.name,
                log.display()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the daemon of host {:?} did not answer within 15 s; see {}",
                h.name,
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// Stops the simulated hosts' daemons and removes their namespaces and the backbone.
pub async fn hosts_down(c: &Cluster) {
    for h in c.spec.hosts.iter().filter(|h| h.simulated) {
        let client = Client::new(&c.host_home(h).join("reboundd.sock"));
        if client.is_up().await {
            let _ = client
                .call::<Value>(Method::POST, "/v1/daemon/shutdown", None)
                .await;
        }
    }
    super::store::store_down(c);
    for h in c.spec.hosts.iter().filter(|h| h.simulated) {
        if let Err(e) = rebound_vmm::net::host_down(&c.netns(h)) {
            eprintln!("warning: {e}");
        }
        let _ = std::fs::remove_dir_all(c.host_run(h));
    }
    if let Err(e) = rebound_vmm::net::backbone_down(&c.backbone()) {
        eprintln!("warning: {e}");
    }
}
