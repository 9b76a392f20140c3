//! A backend process: serves one disk on a vhost-user socket until killed, taking
//! QEMU back each time it reconnects, and answers a control socket (stats, access
//! recording) in JSON lines.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use crate::backend::BlkBackend;
use crate::cache::{Cache, CacheStats};
use crate::disk::{Disk, DiskError};
use crate::request::Device;

/// What to serve and how.
#[derive(Debug, Clone)]
pub struct Options {
    pub disk: PathBuf,
    pub socket: PathBuf,
    /// The control socket (stats, recording); none: no control.
    pub control: Option<PathBuf>,
    pub readonly: bool,
    /// `O_DIRECT` on the backing file where the filesystem allows it.
    pub direct: bool,
    /// Host cache bytes (0: none).
    pub cache_bytes: u64,
    /// The cache is exclusive of the guest's memory: filled only by eviction notices.
    pub exclusive: bool,
    pub queues: u16,
    /// The guest-visible serial (`GET_ID`).
    pub serial: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("--queues must be between 1 and 64, not {0}")]
    Queues(u16),
    #[error("cannot listen on {0}")]
    Listen(PathBuf, #[source] std::io::Error),
    #[error("cannot make the vhost-user backend")]
    Backend(#[source] std::io::Error),
    /// `vhost_user_backend::Error` is not a `std::error::Error`, so its text is kept.
    #[error("cannot start the vhost-user daemon: {0}")]
    Daemon(String),
}

/// A control request.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Control {
    Stats,
    /// Record every access to `path` from now on; `null` stops.
    Record {
        path: Option<PathBuf>,
    },
    /// Resize the host cache and choose its mode, while the guest runs.
    Cache {
        bytes: u64,
        exclusive: bool,
    },
    /// Follow the guest's eviction-notice ring at `gpa` (`bytes` long; the guest's
    /// agent reports it) and take what it holds now; the answer has the ring's counts
    /// and the notices' outcomes. Sent again and again: the same ring is kept.
    Ring {
        gpa: u64,
        bytes: u64,
    },
    /// The miss-ratio curve traced below the guest (exclusive cache only), up to
    /// `max_bytes` of host-side size; `restart` then starts it afresh with `config`.
    Curve {
        #[serde(default)]
        max_bytes: Option<u64>,
        #[serde(default)]
        restart: Option<crate::curve::TraceConfig>,
    },
}

/// What `stats` answers.
#[derive(Debug, Serialize, Deserialize, Clone, PartialEq)]
pub struct Stats {
    pub disk: PathBuf,
    pub size_bytes: u64,
    pub direct: bool,
    pub queues: u16,
    pub connections: u64,
    pub cache: CacheStats,
    pub exclusive: bool,
    /// Eviction notices admitted, and refused by reason; release notices.
    pub notices_admitted: u64,
    pub notices_refused: std::collections::BTreeMap<crate::exclusive::Refusal, u64>,
    pub notices_released: u64,
    /// Where requests' time went inside the backend, by class and phase.
    #[serde(default)]
    pub timing: crate::timing::TimingReport,
}

/// Serves until the process is killed (or the listener fails).
pub fn serve(o: Options) -> Result<(), ServeError> {
    if o.queues == 0 || o.queues > 64 {
        return Err(ServeError::Queues(o.queues));
    }
    let disk = Disk::open(&o.disk, o.readonly, o.direct)?;
    let dev = Arc::new(Device {
        disk,
        cache: match o.exclusive {
            true => Cache::new_exclusive(o.cache_bytes),
            false => Cache::new(o.cache_bytes),
        },
        serial: o.serial.as_bytes().to_vec(),
        pages: Default::default(),
        mem: Default::default(),
        notices: Default::default(),
        ring: Default::default(),
        timing: Default::default(),
    });
    let connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
    if let Some(c) = &o.control {
        let listener = bind(c)?;
        let (dev, o2, conns) = (dev.clone(), o.clone(), connections.clone());
        std::thread::spawn(move || control_loop(listener, &dev, &o2, &conns));
    }
    loop {
        let backend =
            Arc::new(BlkBackend::new(dev.clone(), o.queues).map_err(ServeError::Backend)?);
        let mut daemon = VhostUserDaemon::new(
            "rebound-blk".into(),
            backend,
            GuestMemoryAtomic::new(GuestMemoryMmap::<crate::guest_memory::Bitmap>::new()),
        )
        .map_err(|e| ServeError::Daemon(e.to_string()))?;
        // A connection maps a guest memory of its own: what pages held is void.
        dev.pages.lock().expect("page map lock").clear();
        // One connection: QEMU's, until it goes (quits, or restarts the link).
        let r = daemon.serve(&o.socket);
        *dev.mem.write().expect("mem lock") = None;
        connections.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = dev.cache.flush_log();
        if let Err(e) = r {
            tracing::warn!("the vhost-user connection ended: {e}");
        }
    }
}

/// A unix listener at `path`, replacing a stale socket file.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|e| ServeError::Listen(path.into(), e))
}

fn control_loop(l: UnixListener, dev: &Device, o: &Options, conns: &std::sync::atomic::AtomicU64) {
    for s in l.incoming().flatten() {
        let mut w = match s.try_clone() {
            Ok(w) => w,
            Err(_) => continue,
        };
        for line in BufReader::new(s).lines().map_while(Result::ok) {
            let answer = match serde_json::from_str::<Control>(&line) {
                Ok(Control::Stats) => serde_json::to_value(Stats {
                    disk: o.disk.clone(),
                    size_bytes: dev.disk.size(),
                    direct: dev.disk.direct(),
                    queues: o.queues,
                    connections: conns.load(std::sync::atomic::Ordering::Relaxed),
                    cache: dev.cache.stats(),
                    exclusive: dev.cache.is_exclusive(),
                    notices_admitted: dev.notices.admitted.load(Relaxed),
                    notices_refused: dev.notices.refused(),
                    notices_released: dev.notices.released.load(Relaxed),
                    timing: dev.timing.report(),
                })
                .unwrap_or_default(),
                Ok(Control::Ring { gpa, bytes }) => match dev.follow_ring(gpa, bytes) {
                    Ok(counts) => serde_json::json!({
                        "ring": counts,
                        "admitted": dev.notices.admitted.load(Relaxed),
                        "refused": dev.notices.refused(),
                        "released": dev.notices.released.load(Relaxed),
                    }),
                    Err(e) => serde_json::json!({"error": e}),
                },
                Ok(Control::Cache { bytes, exclusive }) => {
                    dev.reconfigure(bytes, exclusive);
                    serde_json::json!({"ok": true, "cache": dev.cache.stats()})
                }
                Ok(Control::Curve { max_bytes, restart }) => curve(dev, max_bytes, restart),
                Ok(Control::Record { path }) => match dev.cache.record_to(path.as_deref()) {
                    Ok(()) => serde_json::json!({"ok": true}),
                    Err(e) => serde_json::json!({"error": e.to_string()}),
                },
                Err(e) => serde_json::json!({"error": format!("bad request: {e}")}),
            };
            if w.write_all(&line_of(&answer)).is_err() {
                break;
            }
        }
    }
}

fn curve(
    dev: &Device,
    max_bytes: Option<u64>,
    restart: Option<crate::curve::TraceConfig>,
) -> serde_json::Value {
    let t = &dev.cache.tracer;
    let Some(report) = t.report(max_bytes) else {
        return serde_json::json!({"error": "this disk's cache is not exclusive: no curve is traced"});
    };
    if let Some(c) = restart {
        if let Err(e) = t.start(c) {
            return serde_json::json!({"error": e.to_string()});
        }
    }
    serde_json::to_value(report).unwrap_or_default()
}

/// `v` as one line, to be written with one call: `writeln!` on a socket writes each
/// JSON token on its own (thousands of tiny messages for a batch of notices).
fn line_of(v: &serde_json::Value) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    b
}

/// One control request from another process: the answer, as JSON.
pub fn ask(control: &Path, req: &serde_json::Value) -> std::io::Result<serde_json::Value> {
    let mut s = std::os::unix::net::UnixStream::connect(control)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    s.write_all(&line_of(req))?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(std::io::Error::other)
}
