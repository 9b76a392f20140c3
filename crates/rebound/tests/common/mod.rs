//! Test harness: a real guest image, a private REBOUND_HOME/REBOUND_RUN per test,
//! the real `rebound` binary, an API client that checks every call against
//! `api/openapi.yaml`, and cleanup of VMs and the daemon even when a test fails.

#![allow(dead_code)] // each test binary uses part of the harness

pub mod etcd;
pub mod openapi;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Builds (or reuses) the default image once per test binary, in a home shared by
/// all tests; each test links it into its own REBOUND_HOME.
pub fn image_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let root = workspace_root();
        let st = Command::new("make")
            .args(["-s", "-C"])
            .arg(root.join("guest/agent"))
            .status()
            .expect("run make for the guest agent");
        assert!(st.success(), "make -C guest/agent failed");
        let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rebound-vm-tests-home");
        let opts = rebound_image::BuildOptions {
            agent: root.join("guest/agent/rebound-agent"),
            force: false,
        };
        rebound_image::build(&home, "default", &opts, &mut |l: &str| {
            eprintln!("image: {l}")
        })
        .expect("build the default guest image");
        home
    })
}

/// One test's private Rebound installation.
pub struct Env {
    pub home: tempfile::TempDir,
    pub run: tempfile::TempDir,
    pub api: openapi::OpenApi,
    rt: tokio::runtime::Runtime,
    extra_env: Vec<(String, String)>,
}

impl Env {
    /// With the default image available.
    pub fn new() -> Env {
        let img = image_home();
        let env = Env::bare();
        std::os::unix::fs::symlink(img.join("images"), env.home.path().join("images")).unwrap();
        env
    }

    /// Without any image.
    pub fn bare() -> Env {
        Env {
            home: tempfile::Builder::new()
                .prefix("rb-home")
                .tempdir()
                .unwrap(),
            // tmpfs, like the default /dev/shm/rebound-<uid>
            run: tempfile::Builder::new()
                .prefix("rb-run")
                .tempdir_in("/dev/shm")
                .unwrap(),
            api: openapi::OpenApi::load().expect("load api/openapi.yaml"),
            rt: tokio::runtime::Runtime::new().unwrap(),
            extra_env: Vec::new(),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.home.path().join("reboundd.sock")
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rebound"));
        c.args(args)
            .env("REBOUND_HOME", self.home.path())
            .env("REBOUND_RUN", self.run.path())
            .env_remove("REBOUND_QEMU");
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        c
    }

    /// Starts `rebound ARGS` beside the test, its output discarded (a command the
    /// test does not wait on before acting, such as a restore it interrupts).
    pub fn spawn_quiet(&self, args: &[&str]) -> std::process::Child {
        self.cmd(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run rebound")
    }

    /// Runs `rebound ARGS`.
    pub fn rebound(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run rebound")
    }

    /// Runs `rebound ARGS`, which must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.rebound(args);
        assert!(
            o.status.success(),
            "rebound {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Runs `rebound ARGS`, which must fail with exactly one line on stderr starting
    /// with `error:`; returns that line.
    pub fn fails(&self, args: &[&str]) -> String {
        let o = self.rebound(args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(
            !o.status.success(),
            "rebound {args:?} succeeded: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert_eq!(
            err.lines().count(),
            1,
            "rebound {args:?}: not one line: {err:?}"
        );
        assert!(err.starts_with("error: "), "rebound {args:?}: {err:?}");
        err.trim_end().to_string()
    }

    /// Calls the daemon API, checking the request and the response against the spec.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        self.api.check_request(method, path, body)?;
        let client = rebound::client::Client::new(&self.socket());
        let m: hyper::Method = method.parse()?;
        let ans = self.rt.block_on(client.exchange(m, path, body))?;
        let (status, bytes, ct) = (ans.status, ans.body, ans.content_type.as_str());
        self.api
            .check_response(method, path, status.as_u16(), ct, &bytes)?;
        let v = if ct.starts_with("application/json") {
            serde_json::from_slice(&bytes)?
        } else {
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        Ok((status.as_u16(), v))
    }

    /// Calls the API and insists on a 2xx answer.
    /// Calls the daemon API, which must refuse with 400 and an error containing `why`.
    pub fn refused(&self, method: &str, path: &str, body: Option<&Value>, why: &str) {
        let (code, e) = self.call(method, path, body).unwrap();
        assert_eq!(code, 400, "{method} {path}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains(why),
            "{method} {path}: {e}"
        );
    }

    pub fn get_ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (s, v) = self
            .call(method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e:#}"));
        assert!((200..300).contains(&s), "{method} {path}: {s} {v}");
        v
    }

    pub fn status(&self, name: &str) -> Value {
        self.get_ok("GET", &format!("/v1/vms/{name}"), None)
    }

    /// The stats of VM `name`'s disk on Rebound's backend (the first one).
    pub fn blk_stats(&self, name: &str) -> Value {
        let d = self.get_ok("GET", &format!("/v1/vms/{name}/disks"), None);
        d.as_array()
            .unwrap()
            .iter()
            .find(|d| d["backend"] == "rebound")
            .map(|d| d["stats"].clone())
            .unwrap_or_else(|| panic!("no disk on Rebound's backend: {d}"))
    }

    /// Every event the VM's log keeps, page by page.
    pub fn events(&self, name: &str) -> Vec<Value> {
        const PAGE: usize = 10_000;
        let mut all: Vec<Value> = Vec::new();
        loop {
            let since = all.last().map_or(0, |e| e["seq"].as_u64().unwrap());
            let path = format!("/v1/vms/{name}/events?since={since}&limit={PAGE}");
            let page = self.get_ok("GET", &path, None).as_array().unwrap().clone();
            let n = page.len();
            all.extend(page);
            if n < PAGE {
                return all;
            }
        }
    }

    pub fn event_kinds(&self, name: &str) -> Vec<String> {
        self.events(name)
            .iter()
            .map(|e| e["kind"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits (up to 3 minutes) until the VM's event log has `kind`.
    pub fn wait_event(&self, name: &str, kind: &str) {
        eventually(Duration::from_secs(180), kind, || {
            self.event_kinds(name)
                .iter()
                .any(|k| k == kind)
                .then_some(())
        });
    }

    /// Host port forwarded to a guest port.
    pub fn host_port(&self, name: &str, guest: u16) -> u16 {
        let st = self.status(name);
        st["forwards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["guest"] == guest)
            .and_then(|f| f["host"].as_u64())
            .unwrap_or_else(|| panic!("no forward for guest port {guest}: {st}")) as u16
    }

    pub fn set_env(&mut self, k: &str, v: &str) {
        self.extra_env.push((k.to_string(), v.to_string()));
    }

    pub fn unset_env(&mut self, k: &str) {
        self.extra_env.retain(|(key, _)| key != k);
    }

    /// Starts `rebound daemon ARGS` in the foreground (output to `daemon-fg.log` in
    /// the home) and waits until it answers.
    pub fn spawn_daemon(&self, args: &[&str]) -> std::process::Child {
        let log = std::fs::File::create(self.home.path().join("daemon-fg.log")).unwrap();
        let mut a = vec!["daemon"];
        a.extend_from_slice(args);
        let child = self
            .cmd(&a)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        eventually(Duration::from_secs(20), "the daemon to answer", || {
            self.call("GET", "/v1/health", None).ok().map(|_| ())
        });
        child
    }

    /// Waits for the latest crash of `name` to be handled to its end (done or
    /// failed) and returns its report.
    pub fn settled_crash_report(&self, name: &str) -> Value {
        eventually(Duration::from_secs(180), "the crash to be handled", || {
            let (code, r) = self
                .call("GET", &format!("/v1/vms/{name}/crashes/latest"), None)
                .ok()?;
            (code == 200 && (r["phase"] == "done" || r["phase"] == "failed")).then_some(r)
        })
    }

    /// Nothing of a handled crash is left behind: no crashed RAM on the run dir's
    /// tmpfs, no partial or kept-aside dump beside `dump`.
    pub fn no_crash_leftovers(&self, dump: &str, what: &str) {
        let names = |dir: &Path| -> Vec<String> {
            std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        };
        let left: Vec<_> = names(self.run.path())
            .into_iter()
            .filter(|n| n.contains("@crash-"))
            .collect();
        assert!(left.is_empty(), "{what}: crashed RAM left: {left:?}");
        let extra: Vec<_> = names(Path::new(dump).parent().unwrap())
            .into_iter()
            .filter(|n| n.contains(".partial") || n.contains(".resume"))
            .collect();
        assert!(extra.is_empty(), "{what}: beside the dump: {extra:?}");
    }

    /// The daemon's pid from /v1/health.
    pub fn daemon_pid(&self) -> u32 {
        self.get_ok("GET", "/v1/health", None)["pid"]
            .as_u64()
            .unwrap() as u32
    }

    /// Kills the daemon outright (its VMs and backends run on); the next command
    /// starts a new one, which adopts them.
    pub fn kill_daemon(&self) {
        sigkill_and_wait(self.daemon_pid());
    }
}

/// Where `make test` collects the counters each test's daemon moved
/// (`scripts/check-metrics-moved.sh` then fails on a counter no test moved).
const METRICS_MOVED: &str = "REBOUND_METRICS_MOVED";

impl Env {
    /// Appends this daemon's counters (`name value`, zeros too, so the list of names is
    /// whole) to the collection `make test` checks; nothing when not collecting.
    fn record_metrics(&self) {
        let Some(dir) = std::env::var_os(METRICS_MOVED) else {
            return;
        };
        let Ok((200, Value::String(text))) = self.call("GET", "/metrics", None) else {
            return;
        };
        let lines: String = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once(' '))
            .filter(|(name, _)| name.ends_with("_total"))
            .map(|(name, v)| format!("{name} {v}\n"))
            .collect();
        let dir = Path::new(&dir);
        let _ = std::fs::create_dir_all(dir);
        let file = dir.join(format!("{}.txt", std::process::id()));
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)
        {
            let _ = f.write_all(lines.as_bytes());
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Before the teardown below moves counters of its own (kills, stops).
        self.record_metrics();
        if std::thread::panicking() {
            self.print_evidence();
        }
        // Kill every VM this test started, through the daemon if it answers ...
        // (removed, so their memory groups go too).
        if let Ok((_, Value::Array(vms))) = self.call("GET", "/v1/vms", None) {
            for v in vms {
                let name = v["name"].as_str().unwrap();
                if v["state"] != "stopped" {
                    let _ = self.call("POST", &format!("/v1/vms/{name}/kill"), None);
                }
                let _ = self.call(
                    "POST",
                    &format!("/v1/vms/{name}/wait?for=stopped&timeout_ms=10000"),
                    None,
                );
                let _ = self.call("DELETE", &format!("/v1/vms/{name}"), None);
            }
        }
        let _ = self.cmd(&["daemon", "stop"]).output();
        // ... and directly, in case the daemon was gone.
        if let Ok(dirs) = std::fs::read_dir(self.run.path()) {
            for d in dirs.flatten() {
                if let Ok(pid) = std::fs::read_to_string(d.path().join("qemu.pid")) {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
    }
}

impl Env {
    /// What a failed test leaves to diagnose it by: the tail of the daemon's log and
    /// of each VM's event log and QEMU log (a flake in CI is otherwise gone with
    /// its temporary home).
    fn print_evidence(&self) {
        fn tail(p: &Path, lines: usize) -> String {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        let home = self.home.path();
        eprintln!(
            "--- daemon log (tail) ---\n{}",
            tail(&home.join("reboundd.log"), 40)
        );
        let Ok(vms) = std::fs::read_dir(home.join("vms")) else {
            return;
        };
        for d in vms.flatten() {
            let name = d.file_name().to_string_lossy().to_string();
            for f in ["events.jsonl", "qemu.log"] {
                eprintln!("--- {name}/{f} (tail) ---\n{}", tail(&d.path().join(f), 15));
            }
        }
    }
}

/// The `counter` workload's ticks in a VM's serial log, in order: (seq, checksum).
pub fn counter_ticks(env: &Env, name: &str) -> Vec<(u64, u64)> {
    let Ok((_, logs)) = env.call("GET", &format!("/v1/vms/{name}/logs"), None) else {
        return Vec::new();
    };
    let text = logs.as_str().unwrap_or_default();
    // Only whole lines: the log can be read while the guest is still writing its last
    // one, and a checksum cut short reads as damaged memory.
    let whole = text.rfind('\n').map_or("", |i| &text[..i]);
    whole
        .lines()
        .filter_map(|l| l.split("counter seq=").nth(1))
        .filter_map(|r| {
            let (seq, sum) = r.split_once(" checksum=")?;
            let sum = u64::from_str_radix(sum.split_whitespace().next()?, 16).ok()?;
            Some((seq.parse().ok()?, sum))
        })
        .collect()
}

/// `rebound vm restore ARGS --watch-s 3 --json`, which must succeed: its report.
pub fn restore_json(env: &Env, args: &[&str]) -> Value {
    let mut a = vec!["vm", "restore"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--watch-s", "3", "--json"]);
    serde_json::from_str(&env.ok(&a)).unwrap()
}

/// A plain HTTP/1.0 GET; returns (status, body).
pub fn http_get(port: u16, path: &str) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no header end")?;
    let head = String::from_utf8_lossy(&resp[..split]).to_string();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .context("no status")?
        .parse()?;
    Ok((status, resp[split + 4..].to_vec()))
}

/// One request line to the kv service; returns the answer line.
pub fn kv(port: u16, line: &str) -> Result<String> {
    kv_on(TcpStream::connect(("127.0.0.1", port))?, line)
}

/// One request line on an open connection to the kv service; the answer line.
pub fn kv_on(mut s: TcpStream, line: &str) -> Result<String> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b)? == 1 && b[0] != b'\n' {
        out.push(b[0]);
    }
    Ok(String::from_utf8(out)?.trim_end().to_string())
}

/// A TCP port on 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Reads a file from an ext4 image without mounting it.
pub fn ext4_file(image: &Path, path: &str) -> Result<Vec<u8>> {
    let o = Command::new("debugfs")
        .args(["-R", &format!("cat {path}")])
        .arg(image)
        .output()?;
    if !o.status.success() || o.stdout.is_empty() {
        bail!("debugfs cat {path}: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(o.stdout)
}

/// SIGKILLs a process we did not start as a child and waits until it is gone.
pub fn sigkill_and_wait(pid: u32) {
    let p = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGKILL).unwrap();
    eventually(Duration::from_secs(10), "the process to die", || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie nobody has reaped yet.
        (stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z'))
        .then_some(())
    });
}

/// Polls `f` until it returns Some, or fails after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A small tmpfs, unmounted when dropped.
pub struct Tmpfs(pub tempfile::TempDir);

impl Tmpfs {
    pub fn mount(mib: u64) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("rb-full")
            .tempdir()
            .unwrap();
        let st = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}M,mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount a {mib} MiB tmpfs (needs root)");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}
