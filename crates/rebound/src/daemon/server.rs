//! Running the daemon: one instance per socket (a lock file beside it, plus a
//! connect test for a clear message), stale socket removal, re-attaching to VMs,
//! serving until `/v1/daemon/shutdown` or SIGTERM/SIGINT. VMs outlive the daemon.

use std::collections::HashMap;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::fcntl::{Flock, FlockArg};

use super::api;
use super::lifecycle;
use super::state::Daemon;
use crate::paths::Paths;
use crate::vm::accel::HostFacts;

/// Errors running the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("another rebound daemon is already serving {0}")]
    AlreadyRunning(PathBuf),
    #[error("cannot create {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot lock {0}: {1}")]
    Lock(PathBuf, std::io::Error),
    #[error("cannot listen on {0}: {1}")]
    Bind(PathBuf, std::io::Error),
    #[error("serving the API failed: {0}")]
    Serve(std::io::Error),
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// Runs the daemon in the foreground until shut down.
pub async fn run(paths: Paths, socket: PathBuf) -> Result<(), ServerError> {
    for dir in [&paths.home, &paths.run, &paths.vms_dir()] {
        std::fs::create_dir_all(dir).map_err(|e| ServerError::Dir(dir.clone(), e))?;
    }
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent).map_err(|e| ServerError::Dir(parent.to_path_buf(), e))?;
    }
    let lp = lock_path(&socket);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lp)
        .map_err(|e| ServerError::Lock(lp.clone(), e))?;
    // Held for the daemon's whole life; released by the kernel when it exits.
    let _lock = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            return Err(ServerError::AlreadyRunning(socket))
        }
        Err((_, e)) => return Err(ServerError::Lock(lp, e.into())),
    };
    if socket.exists() {
        if StdUnixStream::connect(&socket).is_ok() {
            return Err(ServerError::AlreadyRunning(socket));
        }
        // Stale: left by a daemon that died.
        let _ = std::fs::remove_file(&socket);
    }
    let listener = tokio::net::UnixListener::bind(&socket)
        .map_err(|e| ServerError::Bind(socket.clone(), e))?;

    let d = Arc::new(Daemon {
        paths,
        socket: socket.clone(),
        host: HostFacts::probe(),
        vms: Mutex::new(HashMap::new()),
        shutdown: tokio::sync::Notify::new(),
    });
    lifecycle::reattach_all(&d).await;
    eprintln!(
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
    eprintln!("reboundd exiting; VMs keep running");
    res.map_err(ServerError::Serve)
}
