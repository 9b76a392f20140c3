//! The page-server path of a restore: whether it can run, the server process, the
//! wait for the destination to hold the devices, the start, and the end (the
//! requests saved as the snapshot's trace, the report's figures, or a failure that
//! stops the guest).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_pageserver::{Ahead, Job, Stats};
use rebound_snapshot::restore_plan::{BeforeStart, Event, Restore, ServerEnd};
use rebound_snapshot::{Snapshot, Trace, TracePage};
use rebound_vmm::port::Monitor;

use crate::daemon::error::OpError;
use crate::daemon::vm::VmHandle;

/// How long the destination may take to load the devices once the stream began.
const LOAD_WAIT: Duration = Duration::from_secs(120);

/// Why the page server cannot restore the snapshot whose checked device state is
/// `state` (main block `block` of `size` bytes) on this host, if it cannot.
pub(super) fn why_not(state: &Path, block: &str, size: u64) -> Option<String> {
    // QEMU's postcopy registers guest RAM with userfaultfd: the kernel must have it
    // and let this user (QEMU runs as the daemon's user) open one.
    // SAFETY: the userfaultfd syscall takes flags only; the fd it returns is closed
    // at once.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Some(format!("this host does not let QEMU use userfaultfd ({e})"));
    }
    // SAFETY: `fd` is the descriptor just returned, owned here and not used again.
    unsafe { libc::close(fd as i32) };
    let bytes = match std::fs::read(state) {
        Ok(b) => b,
        Err(e) => return Some(format!("its device state cannot be read ({e})")),
    };
    let s = match rebound_migstream::SnapshotStream::parse(&bytes) {
        Ok(s) => s,
        Err(e) => {
            return Some(format!(
                "its device state is not a stream the page server reads ({e})"
            ))
        }
    };
    if !s
        .blocks
        .iter()
        .any(|b| b.name == block && b.used_length == size)
    {
        return Some(format!(
            "its device state has no RAM block {block:?} of {size} bytes"
        ));
    }
    // Another shared block (a pmem device's file, hot-plugged memory) would be
    // wiped by the destination at postcopy's advise: only the main block may be
    // served from outside the stream.
    for (i, b) in s.blocks.iter().enumerate() {
        if b.name != block && b.used_length > 0 && !s.pages.iter().any(|p| p.block == i) {
            return Some(format!(
                "its VM has a second shared memory block ({:?}), which postcopy would wipe",
                b.name
            ));
        }
    }
    None
}

/// A running page server.
pub(in crate::daemon::vm) struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    pub(super) dir: PathBuf,
    log: PathBuf,
}

impl Server {
    /// Writes the job into `dir` and starts the server.
    pub(super) fn start(job: &Job) -> Result<Server, OpError> {
        use std::os::unix::process::CommandExt;
        let dir = job.out_dir.clone();
        let io = |what: &str, e| OpError::Io(format!("{what} for the page server"), e);
        let _ = std::fs::remove_dir_all(&dir);
        rebound_vmm::private::create_dir_all(&dir)
            .map_err(|e| io("cannot create its directory", e))?;
        let path = dir.join("job.json");
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(job).expect("job serializes"),
        )
        .map_err(|e| io("cannot write the job", e))?;
        let log = dir.join("server.log");
        let out = std::fs::File::create(&log).map_err(|e| io("cannot create the log", e))?;
        let err = out
            .try_clone()
            .map_err(|e| io("cannot create the log", e))?;
        let exe = std::env::current_exe().map_err(|e| io("cannot find this program", e))?;
        let child = std::process::Command::new(exe)
            .arg("page-server")
            .arg("--job")
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(out)
            .stderr(err)
            // Its own group: a signal to the daemon's group does not end a restore.
            .process_group(0)
            .spawn()
            .map_err(|e| io("cannot start", e))?;
        // A restarted daemon finds the server by it (`follow`).
        rebound_vmm::private::write_atomic(&dir.join(PID), child.id().to_string().as_bytes())
            .map_err(|e| io("cannot record the pid", e))?;
        let mut s = Server {
            child,
            stdin: None,
            dir,
            log,
        };
        s.stdin = s.child.stdin.take();
        Ok(s)
    }

    /// Why the server ended early: its own account, else its log's last line.
    fn failure(&self) -> String {
        if let Some(e) = read_stats(&self.dir).and_then(|s| s.error) {
            return e;
        }
        std::fs::read_to_string(&self.log)
            .ok()
            .and_then(|t| t.lines().last().map(str::to_string))
            .unwrap_or_else(|| "no output".into())
    }

    /// Waits until the destination has the devices loaded (no longer `inmigrate`):
    /// what went ahead, from the server's stats.
    pub(super) async fn wait_loaded(&mut self, q: &impl Monitor) -> Result<Stats, OpError> {
        let end = Instant::now() + LOAD_WAIT;
        loop {
            // A server that sent everything (eager) may end before a poll here
            // sees the devices loaded: its success says they were.
            if let Ok(Some(st)) = self.child.try_wait() {
                if st.success() {
                    break;
                }
                return Err(OpError::PageServer(format!(
                    "the page server ended ({st}) before the devices loaded: {}",
                    self.failure()
                )));
            }
            let v = q.qmp("query-status", None).await?;
            if v["status"].as_str().is_some_and(|s| s != "inmigrate") {
                break;
            }
            if Instant::now() > end {
                return Err(OpError::Internal(format!(
                    "the destination QEMU did not load the devices within {} s",
                    LOAD_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(read_stats(&self.dir).unwrap_or_default())
    }

    /// Waits for the server's end in the background, from the devices' load on (a
    /// held restore's server may die before the start): the requests saved as the
    /// snapshot's trace (replacing it when the restore sent nothing ahead and had a
    /// quiet window, else adding the pages it missed), then the report's figures;
    /// a failure fails the restore and stops the guest. Returns what starts it.
    pub(in crate::daemon::vm) fn watch(
        mut self,
        vm: Arc<VmHandle>,
        machine: Restore,
        snap: Arc<Snapshot>,
        before: BeforeStart,
    ) -> Go {
        let go = Go(self.stdin.take());
        tokio::task::spawn_blocking(move || {
            let st = self.child.wait();
            let at = Instant::now();
            let ok = st.as_ref().is_ok_and(|s| s.success());
            let stats = read_stats(&self.dir);
            if !ok {
                if vm.record().qemu_pid.is_none() {
                    return; // the VM was stopped: its server ended with it
                }
                let how = match &st {
                    Ok(s) => s.to_string(),
                    Err(e) => e.to_string(),
                };
                return stop(vm, &format!(" ({how})"), &self.failure());
            }
            let recorded = record(&snap, &self.dir, before);
            let chunks = snap.manifest().ram_blocks[0].checksums.len() as u64;
            let end = server_end(stats.unwrap_or_default(), chunks, recorded, at);
            vm.update_restore_report(|rep| {
                machine.on(rep, Event::Served(end));
            });
        });
        go
    }
}

/// The server's pid, in its directory.
const PID: &str = "server.pid";

/// Whether the page server that `dir` is the directory of still runs: the pid it
/// recorded, alive and naming its job under `dir` (a reused pid does not).
fn server_alive(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join(PID))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .is_some_and(|pid| rebound_vmm::process::is_ours(pid, dir))
}

/// A page server ended before every page was sent (`how`: its exit status, if
/// known, `why`: its account): the restore fails and the guest is stopped.
fn stop(vm: Arc<VmHandle>, how: &str, why: &str) {
    let why = format!("the page server ended{how} before every page was sent: {why}");
    tracing::warn!(vm = %vm.name, "{why}");
    tokio::runtime::Handle::current().spawn(crate::daemon::vm::ram_check::stop_damaged(vm, why));
}

/// The report's figures of a server that ended well, from its stats; `chunks` is
/// the image's checksum chunks, all good when it checked every page on its own.
fn server_end(stats: Stats, chunks: u64, recorded: Result<bool, String>, at: Instant) -> ServerEnd {
    ServerEnd {
        at,
        pushed_pages: stats.pushed_pages,
        requests_after_start: stats.requests_after_start,
        service_p50_us: stats.service_us_p50,
        service_p99_us: stats.service_us_p99,
        bytes_after_start: stats.bytes_read_after_start,
        chunks_checked: if stats.pages_checked {
            chunks
        } else {
            stats.chunks_checked
        },
        requested_pages: stats.requested_pages,
        recorded,
    }
}

/// A page-server restore whose daemon died before its server ended: the server
/// (its own process group) outlives the daemon and took its closed stdin for the
/// start. The restarted daemon follows it to its end through its stats file and
/// pid, then applies the end as the old daemon would have (`Restore::served`), or,
/// if it ended before every page was sent, stops the guest.
pub(in crate::daemon::vm) fn follow(vm: Arc<VmHandle>, rep: &rebound_api::RestoreReport) {
    let dir = vm.run.path().join("pagesrv");
    let before = match rep.mode {
        rebound_api::RestoreMode::Lazy => BeforeStart::Nothing,
        _ => BeforeStart::WorkingSet(0),
    };
    let (snapshot, chunks) = (PathBuf::from(&rep.snapshot), rep.ram_chunks);
    tokio::task::spawn_blocking(move || {
        let ended = |d: &Path| read_stats(d).filter(|s| s.error.is_some() || s.end_s.is_some());
        let stats = loop {
            if let Some(s) = ended(&dir) {
                break s;
            }
            if !server_alive(&dir) {
                // Its last word may have come just before it went.
                break ended(&dir).unwrap_or_else(|| Stats {
                    error: Some("it was killed or died".into()),
                    ..Default::default()
                });
            }
            if vm.record().qemu_pid.is_none() {
                return; // the VM was stopped: its server ended with it
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        if let Some(e) = stats.error.clone() {
            return stop(vm, "", &e);
        }
        let recorded = Snapshot::open(&snapshot)
            .map_err(|e| rebound_errors::chain(&e))
            .and_then(|snap| record(&snap, &dir, before));
        let end = server_end(stats, chunks, recorded, Instant::now());
        let since = vm.record().started_mono_ns;
        vm.update_restore_report(|rep| {
            // The old daemon's watch ended with it.
            if rep.phase == "watching" {
                rep.phase = "serving".into();
            }
            // From QEMU's spawn for the restore (the request's instant died with the
            // old daemon; the monotonic clock did not).
            let now = rebound_vmm::events::mono_ns();
            let loaded = since.map_or(0.0, |t| now.saturating_sub(t) as f64 / 1e9);
            Restore::served(rep, loaded, end);
        });
    });
}

/// Tells a page server that the guest runs now.
pub(in crate::daemon::vm) struct Go(Option<ChildStdin>);

impl Go {
    pub(in crate::daemon::vm) fn send(mut self) {
        if let Some(mut s) = self.0.take() {
            let _ = s.write_all(b"go\n");
        }
    }
}

fn read_stats(dir: &Path) -> Option<Stats> {
    let b = std::fs::read(dir.join(rebound_pageserver::STATS)).ok()?;
    serde_json::from_slice(&b).ok()
}

/// The requests become the snapshot's trace: as they are after a lazy restore (the
/// guest's exact first touches), added at the end of the trace it had otherwise
/// (the pages its working set missed, as HotRestore grows its working set).
fn record(snap: &Snapshot, dir: &Path, before: BeforeStart) -> Result<bool, String> {
    let size = snap.manifest().ram_blocks[0].size;
    let req = Trace::read(&dir.join(rebound_pageserver::REQUESTS), size / 4096)
        .map_err(|e| rebound_errors::chain(&e))?;
    if req.pages.is_empty() {
        return Ok(false);
    }
    let old = match &snap.manifest().trace {
        Some(t) => Some(
            Trace::read(&snap.path_of(&t.file), size / 4096)
                .map_err(|e| rebound_errors::chain(&e))?,
        ),
        None => None,
    };
    let (pages, source): (Vec<TracePage>, &str) = match (before, old) {
        (BeforeStart::Nothing, _) | (_, None) => (req.pages, "requests"),
        (_, Some(old)) => {
            let have: std::collections::HashSet<TracePage> = old.pages.iter().copied().collect();
            let missed: Vec<TracePage> = req
                .pages
                .into_iter()
                .filter(|p| !have.contains(p))
                .collect();
            if missed.is_empty() {
                return Ok(false);
            }
            let src = snap
                .manifest()
                .trace
                .as_ref()
                .map_or("requests", |t| t.source.as_str());
            let mut all = old.pages;
            all.extend(missed);
            (
                all,
                if src == "requests" {
                    "requests"
                } else {
                    "requests-added"
                },
            )
        }
    };
    super::run::save_trace(snap, &Trace { pages }, source).map(|()| true)
}

/// The job of one restore's server.
#[allow(clippy::too_many_arguments)]
pub(super) fn job(
    run: &Path,
    device_state: PathBuf,
    image: PathBuf,
    size: u64,
    block: &str,
    check: Option<rebound_pageserver::Check>,
    trace: Option<PathBuf>,
    before: BeforeStart,
    fafl: bool,
    watch_s: f64,
) -> Job {
    let (ahead, quiet_s) = match before {
        BeforeStart::Nothing => (Ahead::Nothing, watch_s.max(0.1)),
        BeforeStart::WorkingSet(n) => (Ahead::Trace(n), 0.0),
        BeforeStart::CopyImage => (Ahead::All, 0.0),
    };
    Job {
        socket: run.join("incoming.sock"),
        device_state,
        image,
        size,
        block: block.to_string(),
        check,
        trace,
        ahead,
        fafl,
        quiet_s,
        out_dir: run.join("pagesrv"),
    }
}
