//! The backup a benchmark or fault trial replicates to: hareplica's `BackupServer` on a
//! thread of this process, or a separate process (`rebound-ha backup`, or this binary's
//! `backup` mode, which runs the same server code) that can be SIGKILLed and restarted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hareplica::{BackupConfig, BackupHandle, BackupServer, Endpoint, Spin};

/// The backup's side of a benchmark's spin configuration: the same fixed poll or none,
/// or the backup's own adaptive default.
pub fn backup_spin(spin: Spin) -> Spin {
    match spin {
        Spin::Adaptive { .. } => Spin::BACKUP,
        s => s,
    }
}

/// Where the backup runs.
#[derive(Debug, Clone)]
pub enum BackupKind {
    /// `BackupServer` on a thread of this process.
    Thread,
    /// A child process: `BIN backup --listen EP --dir DIR`.
    Process(PathBuf),
}

impl BackupKind {
    pub fn describe(&self) -> String {
        match self {
            BackupKind::Thread => {
                "hareplica BackupServer on a thread of this process, unix socket in a temp dir"
                    .into()
            }
            BackupKind::Process(bin) => format!(
                "separate process `{} backup`, unix socket in a temp dir",
                bin.display()
            ),
        }
    }
}

enum Running {
    Thread(BackupHandle),
    Process(Child),
    Stopped,
}

/// A running (or stopped) backup with its directory and endpoint.
pub struct Backup {
    kind: BackupKind,
    dir: PathBuf,
    endpoint: String,
    /// How the server waits for the next frame.
    spin: Spin,
    running: Running,
}

impl Backup {
    /// Starts a backup whose socket and replica live under `dir`.
    pub fn start(kind: &BackupKind, dir: &Path) -> Result<Backup> {
        Self::start_spinning(kind, dir, Spin::BACKUP)
    }

    /// Starts a backup that waits for each next frame as `spin` says.
    pub fn start_spinning(kind: &BackupKind, dir: &Path, spin: Spin) -> Result<Backup> {
        let endpoint = format!("unix:{}", dir.join("backup.sock").display());
        let mut b = Backup {
            kind: kind.clone(),
            dir: dir.to_path_buf(),
            endpoint,
            spin: backup_spin(spin),
            running: Running::Stopped,
        };
        b.restart()?;
        Ok(b)
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The backup's process id when it runs as a process.
    pub fn pid(&self) -> Option<u32> {
        match &self.running {
            Running::Process(c) => Some(c.id()),
            _ => None,
        }
    }

    /// (Re)starts on the same directory and endpoint: the replica and its log survive.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        let replica = self.dir.join("replica");
        match &self.kind {
            BackupKind::Thread => {
                let ep: Endpoint = self.endpoint.parse().context("backup endpoint")?;
                let cfg = BackupConfig {
                    spin: self.spin,
                    ..BackupConfig::new(ep, &replica)
                };
                let (server, _report) = BackupServer::bind(cfg).context("binding the backup")?;
                self.running = Running::Thread(server.spawn());
            }
            BackupKind::Process(bin) => {
                let sock = self.dir.join("backup.sock");
                let _ = std::fs::remove_file(&sock);
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("backup.log"))
                    .context("backup log file")?;
                let mut cmd = Command::new(bin);
                cmd.arg("backup")
                    .arg("--listen")
                    .arg(&self.endpoint)
                    .arg("--dir")
                    .arg(&replica);
                // Only when asked: the default is the backup's own.
                if let Spin::Off | Spin::Fixed(_) = self.spin {
                    cmd.arg("--spin-us")
                        .arg(self.spin.limit().as_micros().to_string());
                }
                let child = cmd
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .with_context(|| format!("spawning {} backup", bin.display()))?;
                self.running = Running::Process(child);
                let t0 = Instant::now();
                while !sock.exists() {
                    if t0.elapsed() > Duration::from_secs(10) {
                        bail!(
                            "backup did not create {} within 10 s (see {})",
                            sock.display(),
                            self.dir.join("backup.log").display()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        Ok(())
    }

    /// Kills a process backup with SIGKILL (no chance to checkpoint); shuts a thread
    /// backup down.
    pub fn kill(&mut self) -> Result<()> {
        match std::mem::replace(&mut self.running, Running::Stopped) {
            Running::Process(mut c) => {
                c.kill().context("SIGKILL of the backup")?;
                c.wait().context("reaping the backup")?;
            }
            Running::Thread(h) => h.shutdown().context("stopping the backup thread")?,
            Running::Stopped => {}
        }
        Ok(())
    }

    /// Stops cleanly (thread) or kills (process).
    pub fn stop(&mut self) -> Result<()> {
        self.kill()
    }
}

impl Drop for Backup {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
