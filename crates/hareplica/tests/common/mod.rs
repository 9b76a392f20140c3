//! Helpers for the process tests: a backup child process, a deterministic workload.
#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use hareplica::{
    diff_pages, ClientOptions, ClusterToken, DiffRun, Endpoint, Mode, ReplicaClient, StatusInfo,
};

pub const PAGE: usize = 4096;
pub const HEAP: usize = 1 << 20;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rebound-ha")
}

/// Runs `rebound-ha ARGS` to completion.
pub fn cli(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run rebound-ha")
}

/// The token file of these tests' TCP backups, made once by `rebound-ha token` (so
/// every TCP test uses what the command writes): mode 0600, 64 hex digits.
pub fn token_file() -> &'static Path {
    static FILE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FILE
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("token");
            let o = cli(&["token", path.to_str().unwrap()]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
                0o600
            );
            // It never overwrites a token: one line says so, the file is unchanged.
            let before = std::fs::read(&path).unwrap();
            let o = cli(&["token", path.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                !o.status.success() && err.trim_end().lines().count() == 1,
                "{err}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), before);
            (dir, path)
        })
        .1
}

pub fn token() -> ClusterToken {
    ClusterToken::from_file(token_file()).unwrap()
}

/// A `rebound-ha backup` child process.
pub struct BackupProc {
    pub child: Child,
    pub ep: Endpoint,
    pub dir: PathBuf,
    listen: String,
    extra: Vec<String>,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl BackupProc {
    /// Starts a backup on `listen` (`tcp:127.0.0.1:0` picks a port) with replica `dir`.
    pub fn start(listen: &str, dir: &Path, extra: &[&str]) -> BackupProc {
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if listen.starts_with("tcp:") {
            extra.push("--token-file".into());
            extra.push(token_file().display().to_string());
        }
        let (child, ep, log) = spawn(listen, dir, &extra);
        BackupProc {
            child,
            ep: ep.clone(),
            dir: dir.to_path_buf(),
            listen: ep.to_string(),
            extra,
            log,
        }
    }

    /// SIGKILL, reaped.
    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL the backup");
        self.child.wait().expect("reap the backup");
    }

    /// Starts again on the same endpoint and directory.
    pub fn restart(&mut self) {
        let (child, ep, log) = spawn(&self.listen, &self.dir, &self.extra);
        assert_eq!(ep, self.ep);
        self.child = child;
        self.log = log;
    }

    /// Client options for this backup: its token when it listens on TCP.
    pub fn options(&self, mode: Mode) -> ClientOptions {
        let mut o = ClientOptions::new(mode);
        if let Endpoint::Tcp(_) = self.ep {
            o.token = Some(token());
        }
        o
    }

    pub fn status(&self) -> StatusInfo {
        let mut o = hareplica::admin_options(Duration::from_secs(5));
        o.token = self.options(Mode::Sync).token;
        hareplica::query_status_with(&self.ep, o).expect("status")
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for BackupProc {
    fn drop(&mut self) {
        // The test may have killed it already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(listen: &str, dir: &Path, extra: &[String]) -> (Child, Endpoint, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(bin())
        .args(["backup", "--listen", listen, "--dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rebound-ha backup");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let ep = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("backup exited early: {:?}", log.lock().unwrap()))
            .unwrap();
        log.lock().unwrap().push(line.clone());
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split(' ').next().unwrap().parse::<Endpoint>().unwrap();
        }
    };
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    (child, ep, log)
}

/// The workload's transactions 3tx..3tx+2 run on `heap` (a dozen pages or so), as
/// runs against `shadow`, which is brought up to date.
pub fn big_tx(heap: &mut [u8], shadow: &mut [u8], tx: u64) -> Vec<DiffRun> {
    let mut pages = Vec::new();
    for k in 0..3 {
        pages.extend(apply_tx(heap, tx * 3 + k));
    }
    pages.sort_unstable();
    pages.dedup();
    let mut runs = Vec::new();
    diff_pages(shadow, heap, &pages, PAGE, &mut runs);
    for r in &runs {
        let (s, e) = (r.offset as usize, r.end() as usize);
        shadow[s..e].copy_from_slice(&heap[s..e]);
    }
    runs
}

/// Transaction `tx` of the deterministic workload: writes into 1..=6 random pages.
/// Returns the written pages, sorted.
pub fn apply_tx(heap: &mut [u8], tx: u64) -> Vec<usize> {
    let mut rng = fastrand::Rng::with_seed(tx.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let npages = heap.len() / PAGE;
    let mut pages: Vec<usize> = (0..rng.usize(1..=6)).map(|_| rng.usize(..npages)).collect();
    pages.sort_unstable();
    pages.dedup();
    for &p in &pages {
        for _ in 0..rng.usize(1..=8) {
            let off = p * PAGE + rng.usize(..PAGE - 16);
            let len = rng.usize(1..=16);
            rng.fill(&mut heap[off..off + len]);
        }
    }
    pages
}

/// The heap after transactions 1..=n.
pub fn model(n: u64) -> Vec<u8> {
    let mut heap = vec![0u8; HEAP];
    for tx in 1..=n {
        apply_tx(&mut heap, tx);
    }
    heap
}

/// A primary running the workload through a [`ReplicaClient`].
pub struct Primary {
    pub client: ReplicaClient,
    pub heap: Vec<u8>,
    pub shadow: Vec<u8>,
    pub next_tx: u64,
    pending: Option<Vec<DiffRun>>,
}

impl Primary {
    pub fn new(client: ReplicaClient, image: Vec<u8>, last_tx: u64) -> Primary {
        Primary {
            client,
            shadow: image.clone(),
            heap: image,
            next_tx: last_tx + 1,
            pending: None,
        }
    }

    /// Runs and commits the next transaction (or retries the last failed one).
    pub fn step(&mut self) -> Result<u64, hareplica::Error> {
        let tx = self.next_tx;
        let runs = match self.pending.take() {
            Some(r) => r,
            None => {
                let pages = apply_tx(&mut self.heap, tx);
                let mut runs = Vec::new();
                diff_pages(&self.shadow, &self.heap, &pages, PAGE, &mut runs);
                for r in &runs {
                    let (s, e) = (r.offset as usize, r.end() as usize);
                    self.shadow[s..e].copy_from_slice(&self.heap[s..e]);
                }
                runs
            }
        };
        match self.client.commit(tx, &runs, &self.heap) {
            Ok(n) => {
                self.next_tx += 1;
                Ok(n)
            }
            Err(e) => {
                self.pending = Some(runs);
                Err(e)
            }
        }
    }
}

/// The replica image in `dir` as `rebound-ha dump` writes it, and its last tx.
pub fn dump(dir: &Path) -> (Vec<u8>, u64) {
    let out = dir.with_extension("dump");
    let o = cli(&[
        "dump",
        "--dir",
        dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        o.status.success(),
        "dump failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o2 = cli(&["status", "--dir", dir.to_str().unwrap(), "--json"]);
    assert!(
        o2.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&o2.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o2.stdout).unwrap();
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    (bytes, v["last_tx"].as_u64().unwrap())
}

/// Polls `cond` up to `limit`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}
