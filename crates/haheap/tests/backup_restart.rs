//! `BackupFailure::Block` against a real `rebound-ha backup` process that is SIGKILLed and
//! restarted on the same directory: `tend` waits for the backup instead of failing, then
//! the heap carries on, and the backup's replica ends equal to the heap. Every engine.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::cargo_executable;
use haheap::{BackupFailure, EngineKind, Heap, HeapConfig, ReplMode};

const PAGE: usize = 4096;
/// How long the backup stays dead.
const DOWN: Duration = Duration::from_millis(600);

/// The `rebound-ha` binary of this profile, built on first use (it belongs to hareplica,
/// so cargo does not build it for haheap's tests).
fn rebound_ha() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| cargo_executable("hareplica", "bin", "rebound-ha"))
}

/// A `rebound-ha backup` child process on a unix socket.
struct BackupProc {
    child: Child,
    listen: String,
    dir: PathBuf,
}

impl BackupProc {
    fn start(tmp: &Path) -> BackupProc {
        let listen = format!("unix:{}", tmp.join("b.sock").display());
        let dir = tmp.join("replica");
        let child = spawn(&listen, &dir);
        BackupProc { child, listen, dir }
    }

    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the backup");
        self.child.wait().expect("reap the backup");
    }

    /// Starts again on the same socket and replica directory.
    fn restart(&mut self) {
        self.child = spawn(&self.listen, &self.dir);
    }

    fn last_tx(&self) -> u64 {
        let ep = self.listen.parse().unwrap();
        hareplica::query_status(&ep, Duration::from_secs(5))
            .expect("backup status")
            .last_tx
    }

    /// The replica's image, read from its directory by `rebound-ha dump` (log replayed).
    fn dump(&self) -> Vec<u8> {
        let out = self.dir.with_extension("img");
        let o = Command::new(rebound_ha())
            .arg("dump")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "dump: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::read(out).unwrap()
    }
}

impl Drop for BackupProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `rebound-ha backup` and waits until it listens.
fn spawn(listen: &str, dir: &Path) -> Child {
    let mut child = Command::new(rebound_ha())
        .args(["backup", "--listen", listen, "--dir"])
        .arg(dir)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rebound-ha backup");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.contains("listening on ") => break,
            Some(Ok(l)) => seen.push(l),
            _ => panic!("backup exited before listening: {seen:?}"),
        }
    }
    // Keep draining so the backup never blocks on a full pipe.
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    child
}

fn cfg(b: &BackupProc, engine: EngineKind) -> HeapConfig {
    HeapConfig {
        size: 64 * PAGE,
        engine,
        backup: Some(b.listen.clone()),
        mode: ReplMode::Sync,
        on_backup_failure: BackupFailure::Block {
            timeout: Duration::from_secs(60),
        },
        spin: haheap::Spin::PRIMARY,
    }
}

/// A few random writes (page engines: half of them direct stores) into an open transaction.
fn writes(h: &mut Heap, rng: &mut fastrand::Rng) {
    for _ in 0..rng.usize(1..8) {
        let len = rng.usize(1..300);
        let off = rng.usize(0..h.len() - len);
        let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        if h.engine().is_page_level() && rng.bool() {
            // SAFETY: off+len <= h.len(); page engines track direct stores.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), h.as_mut_ptr().add(off), len) };
        } else {
            h.write(off, &data).unwrap();
        }
    }
}

/// One committed transaction; returns when `tend` started and ended.
fn commit(h: &mut Heap, rng: &mut fastrand::Rng) -> (Instant, Instant) {
    h.tstart().unwrap();
    writes(h, rng);
    let t0 = Instant::now();
    let st = h.tend().unwrap_or_else(|e| {
        panic!(
            "{}: tend failed in Block mode: {e}: {:?}",
            h.engine(),
            std::error::Error::source(&e)
        )
    });
    assert_eq!(st.tx_id, h.committed_tx_id());
    (t0, Instant::now())
}

#[test]
fn blocking_primary_waits_out_a_sigkilled_backup_with_every_engine() {
    for (i, engine) in EngineKind::CONCRETE.into_iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = fastrand::Rng::with_seed(300 + i as u64);
        let b = Arc::new(Mutex::new(BackupProc::start(tmp.path())));
        let mut h = Heap::create(cfg(&b.lock().unwrap(), engine)).unwrap();

        // 1. Killed at an arbitrary moment of a stream of commits (often inside a tend,
        //    between the commit frame and its acknowledgement).
        let done = Arc::new(AtomicU64::new(0));
        let killer = {
            let (b, done) = (Arc::clone(&b), Arc::clone(&done));
            std::thread::spawn(move || {
                while done.load(Ordering::SeqCst) < 30 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                b.lock().unwrap().kill9();
                let killed = Instant::now();
                std::thread::sleep(DOWN);
                let restarted = Instant::now();
                b.lock().unwrap().restart();
                (killed, restarted)
            })
        };
        let mut tends = Vec::new();
        while !killer.is_finished() || tends.len() < 80 {
            tends.push(commit(&mut h, &mut rng));
            done.store(h.committed_tx_id(), Ordering::SeqCst);
        }
        let (killed, restarted) = killer.join().unwrap();
        // Sync mode: a tend can end after the kill only with the acknowledgement read
        // just before it; every later one needs the restarted backup.
        let during = tends
            .iter()
            .filter(|&&(_, e)| e > killed && e < restarted)
            .count();
        assert!(
            during <= 1,
            "{engine}: {during} commits completed while the backup was dead"
        );
        let (start, end) = tends
            .iter()
            .copied()
            .find(|&(s, e)| s < restarted && e > restarted)
            .unwrap_or_else(|| panic!("{engine}: no commit waited for the restarted backup"));
        eprintln!(
            "{engine}: a tend started {:?} after the kill and returned {:?} after it (backup back after {:?})",
            start.saturating_duration_since(killed),
            end - killed,
            restarted - killed
        );
        assert_eq!(b.lock().unwrap().last_tx(), h.committed_tx_id());

        // 2. Killed while a transaction is open: its tend blocks for the whole outage.
        h.tstart().unwrap();
        writes(&mut h, &mut rng);
        b.lock().unwrap().kill9();
        let (go, wait) = mpsc::channel();
        let restarter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                wait.recv().unwrap();
                std::thread::sleep(DOWN);
                b.lock().unwrap().restart();
            })
        };
        let t0 = Instant::now();
        go.send(()).unwrap();
        let st = h
            .tend()
            .expect("tend blocks until the backup is back, then succeeds");
        let blocked = t0.elapsed();
        restarter.join().unwrap();
        assert!(
            blocked >= DOWN,
            "{engine}: tend returned after {blocked:?}, before the backup came back ({DOWN:?})"
        );
        assert_eq!(st.tx_id, h.committed_tx_id());

        // 3. Resumes; the replica holds exactly the heap.
        for _ in 0..20 {
            commit(&mut h, &mut rng);
        }
        let mut b = b.lock().unwrap();
        assert_eq!(b.last_tx(), h.committed_tx_id(), "{engine}");
        b.kill9();
        assert!(
            b.dump() == h.as_slice(),
            "{engine}: the replica differs from the heap after {} transactions",
            h.committed_tx_id()
        );
        eprintln!(
            "{engine}: {} txs, blocked {blocked:?} for a {DOWN:?} outage",
            h.committed_tx_id()
        );
    }
}
