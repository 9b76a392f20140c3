//! Running the daemon: one instance per socket (a lock file beside it, plus a
//! connect test for a clear message), stale socket removal, private state (older
//! state tightened once), re-attaching to VMs, serving until `/v1/daemon/shutdown`
//! or SIGTERM/SIGINT. VMs outlive the daemon.
//!
//! Who can reach what: the socket is the daemon user's alone (mode 0600 in a 0700
//! directory) unless `--socket-group` lets one group of operators in; metrics are
//! also served on `--metrics-addr` (loopback unless the operator says otherwise).
//! The daemon listens on nothing else: other hosts reach it only through the
//! cluster store (etcd, mutual TLS), where it reads what it acts on.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};

use rebound_vmm::paths::Paths;
use rebound_vmm::private;

use super::api;
use super::state::Daemon;

/// How the daemon serves, beyond its socket's path.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// A group whose members may use the socket (mode 0660, that group).
    pub socket_group: Option<String>,
    /// Also serve `GET /metrics` over TCP here.
    pub metrics_addr: Option<SocketAddr>,
    /// Take part in cluster restores (the cluster store and this host's name in it).
    pub cluster: super::ClusterOptions,
    /// Caps on the logs a guest can fill.
    pub logs: super::state::LogCaps,
}

/// Errors running the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("another rebound daemon is already serving {0}")]
    AlreadyRunning(PathBuf),
    #[error("cannot create {0}")]
    Dir(PathBuf, #[source] std::io::Error),
    #[error("the runtime directory is unsafe")]
    RunDir(#[from] private::OwnDirError),
    #[error("cannot lock {0}")]
    Lock(PathBuf, #[source] std::io::Error),
    #[error("cannot listen on {0}")]
    Bind(PathBuf, #[source] std::io::Error),
    #[error("cannot serve metrics on {0}")]
    Metrics(SocketAddr, #[source] std::io::Error),
    #[error("unknown group {0:?} for the daemon's socket")]
    NoGroup(String),
    #[error("group {1:?} cannot reach the socket: its directory {0} does not let the group in (put the socket in a directory of that group, e.g. --socket /run/rebound/reboundd.sock)")]
    GroupCannotReach(PathBuf, String),
    #[error("cannot give the socket {0} to its group")]
    SocketGroup(PathBuf, #[source] std::io::Error),
    #[error("cannot tighten the permissions of {0}")]
    Tighten(PathBuf, #[source] std::io::Error),
    #[error("serving the API failed")]
    Serve(#[source] std::io::Error),
    #[error("cannot take part in cluster restores")]
    Cluster(#[from] super::cluster::ClusterError),
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// How long a new daemon waits for the lock of one that is exiting.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a daemon answers HTTP on `socket` within a second (a dying one does not).
fn answers(socket: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = StdUnixStream::connect(socket) else {
        return false;
    };
    let t = Some(std::time::Duration::from_secs(1));
    if s.set_read_timeout(t).is_err() || s.set_write_timeout(t).is_err() {
        return false;
    }
    if s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: rebound\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n > 0)
}

/// Runs the daemon in the foreground until shut down.
pub async fn run(paths: Paths, socket: PathBuf, opts: ServeOptions) -> Result<(), ServerError> {
    private::restrict_umask();
    super::fault::init();
    // The run dir's default is a predictable path in the shared /dev/shm: anyone may
    // have made it first, or made it a link to where they can read guest RAM.
    private::own_dir(&paths.run)?;
    for dir in [&paths.home, &paths.vms_dir()] {
        private::create_dir_all(dir).map_err(|e| ServerError::Dir(dir.clone(), e))?;
    }
    if let Some(parent) = socket.parent() {
        private::create_dir_all(parent).map_err(|e| ServerError::Dir(parent.to_path_buf(), e))?;
    }
    let lp = lock_path(&socket);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lp)
        .map_err(|e| ServerError::Lock(lp.clone(), e))?;
    // Held for the daemon's whole life; released by the kernel when it exits. A
    // daemon that was just killed holds it until its exit has torn down its memory
    // (its socket may even accept connections meanwhile), which takes a moment under
    // load: wait for it while nothing answers on the socket.
    let mut f = f;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let _lock = loop {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((back, nix::errno::Errno::EWOULDBLOCK)) => {
                if std::time::Instant::now() >= deadline || answers(&socket) {
                    return Err(ServerError::AlreadyRunning(socket));
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                f = back;
            }
            Err((_, e)) => return Err(ServerError::Lock(lp, e.into())),
        }
    };
    if socket.exists() {
        if StdUnixStream::connect(&socket).is_ok() {
            return Err(ServerError::AlreadyRunning(socket));
        }
        // Stale: left by a daemon that died.
        let _ = std::fs::remove_file(&socket);
    }
    // Before serving: an unreachable store or a refused certificate stops the daemon.
    let cluster = super::cluster::Prepared::new(&opts.cluster).await?;
    tighten_old_state(&paths)?;
    let gid = match &opts.socket_group {
        Some(g) => Some(group_for_socket(&socket, g)?),
        None => None,
    };
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|e| ServerError::Bind(socket.clone(), e))?;
    if let Some(gid) = gid {
        nix::unistd::chown(&socket, None, Some(gid))
            .map_err(|e| ServerError::SocketGroup(socket.clone(), e.into()))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| ServerError::SocketGroup(socket.clone(), e))?;
    }

    let d = Arc::new(Daemon::new(paths, socket.clone()).with_log_caps(opts.logs));
    d.reattach_all().await;
    let c = cluster.start(&d).await?;
    let _ = d.cluster.set(c);
    if let Some(addr) = opts.metrics_addr {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ServerError::Metrics(addr, e))?;
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get(api::metrics))
            .with_state(d.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(l, app).await {
                tracing::error!("metrics listener failed: {e}");
            }
        });
        tracing::info!("metrics on http://{addr}/metrics");
    }
    match &d.cgroups {
        Ok(cg) => tracing::info!("crash memory budgets are enforced with {}", cg.version()),
        Err(e) => tracing::warn!(
            "crash memory budgets are only accounted: {}",
            rebound_errors::Chain(&**e)
        ),
    }
    tracing::info!(
        "reboundd {} (pid {}) serving {}",
        crate::VERSION,
        std::process::id(),
        socket.display()
    );

    let d2 = d.clone();
    let stop = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = d2.shutdown.notified() => {}
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let res = axum::serve(listener, api::router(d.clone()))
        .with_graceful_shutdown(stop)
        .await;
    let _ = std::fs::remove_file(&socket);
    if let Some(c) = d.cluster.get() {
        c.shutdown();
    }
    if let Ok(cg) = &d.cgroups {
        cg.remove_if_empty();
    }
    tracing::info!("reboundd exiting; VMs keep running");
    res.map_err(ServerError::Serve)
}

/// State written by versions that did not keep it private is tightened once, and
/// the daemon's log says so.
fn tighten_old_state(paths: &Paths) -> Result<(), ServerError> {
    let mut n = 0;
    for root in [&paths.home, &paths.run] {
        n += private::tighten_tree(root).map_err(|e| ServerError::Tighten(root.clone(), e))?;
    }
    if n > 0 {
        tracing::warn!(
            "removed group and other permissions from {n} files and directories under {} and {} (left readable by an older version)",
            paths.home.display(),
            paths.run.display()
        );
    }
    Ok(())
}

/// The group id for `--socket-group`, once its members can reach the socket at all.
fn group_for_socket(socket: &Path, group: &str) -> Result<nix::unistd::Gid, ServerError> {
    let g = nix::unistd::Group::from_name(group)
        .ok()
        .flatten()
        .ok_or_else(|| ServerError::NoGroup(group.to_string()))?;
    let dir = socket.parent().unwrap_or(Path::new("/"));
    let meta = std::fs::metadata(dir).map_err(|e| ServerError::Dir(dir.to_path_buf(), e))?;
    use std::os::unix::fs::MetadataExt;
    let searchable =
        meta.mode() & 0o001 != 0 || (meta.gid() == g.gid.as_raw() && meta.mode() & 0o010 != 0);
    if !searchable {
        return Err(ServerError::GroupCannotReach(
            dir.to_path_buf(),
            group.to_string(),
        ));
    }
    Ok(g.gid)
}
