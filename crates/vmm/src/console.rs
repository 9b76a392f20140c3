//! The guest's serial console, host side. QEMU serves it on `serial.sock`
//! (`server=on,wait=off`, no `logfile`); the daemon is its one client and writes what
//! the guest prints to `serial.log` in the VM's persistent directory, capped and
//! rotated ([`crate::logcap`]), never on the tmpfs that holds guest RAM. A terminal
//! attaches through `console.sock`, which this link serves (QEMU takes one client).
//!
//! While no client is connected (the daemon is down or restarting), QEMU drops what
//! the guest writes: the guest never blocks on its console and nothing grows. While
//! the link is connected and behind, QEMU holds the guest's UART busy, which slows
//! only that guest's console. The link also holds QEMU's own stdout and stderr log
//! within its cap.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

use crate::logcap::{self, RotatingFile};
use crate::ratelimit::RateLimit;

/// Default cap of the serial log and of QEMU's log, each (both generations).
pub const DEFAULT_CAP: u64 = 4 << 20;

/// How long a stopping link keeps reading what the guest printed last (a panic's
/// trace comes just before QEMU reports the panic).
const DRAIN: Duration = Duration::from_millis(300);

/// Where one VM's console goes.
#[derive(Debug, Clone)]
pub struct ConsolePaths {
    /// QEMU's serial socket.
    pub serial: PathBuf,
    /// The socket `rebound vm console` attaches to.
    pub attach: PathBuf,
    /// The serial log and its cap.
    pub log: PathBuf,
    pub log_cap: u64,
    /// QEMU's stdout/stderr file and its cap.
    pub qemu_log: PathBuf,
    pub qemu_log_cap: u64,
}

/// A running console link; dropping it stops the link after a short drain.
pub struct ConsoleLink {
    _stop: oneshot::Sender<()>,
}

impl ConsoleLink {
    /// Starts (and keeps re-)connecting to the serial socket.
    pub fn start(p: ConsolePaths) -> ConsoleLink {
        let (tx, rx) = oneshot::channel();
        tokio::spawn(run(p, rx));
        ConsoleLink { _stop: tx }
    }
}

type Halves = (OwnedReadHalf, OwnedWriteHalf);

async fn read_opt(s: &mut Option<Halves>, buf: &mut [u8]) -> usize {
    match s {
        Some((r, _)) => r.read(buf).await.unwrap_or(0),
        None => std::future::pending().await,
    }
}

async fn accept_opt(l: &Option<UnixListener>) -> Option<UnixStream> {
    match l {
        Some(l) => l.accept().await.ok().map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Writes what the guest printed to the log and to an attached terminal (which gets
/// only what it keeps up with: a slow terminal never holds the log back).
struct Sink {
    log: RotatingFile,
    warn: RateLimit,
}

impl Sink {
    fn put(&mut self, data: &[u8], attached: &mut Option<Halves>) {
        if let Err(e) = self.log.write(data) {
            if let Some(n) = self.warn.admit(std::time::Instant::now()) {
                tracing::warn!(
                    dropped_since_last = n,
                    "cannot write {}: {e}",
                    self.log.path().display()
                );
            }
        }
        if let Some((_, w)) = attached {
            match w.try_write(data) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *attached = None,
            }
        }
    }
}

async fn run(p: ConsolePaths, mut stop: oneshot::Receiver<()>) {
    let mut sink = Sink {
        log: RotatingFile::new(&p.log, p.log_cap),
        warn: RateLimit::new(3, Duration::from_secs(60)),
    };
    let _ = std::fs::remove_file(&p.attach);
    let listener = UnixListener::bind(&p.attach)
        .map_err(|e| tracing::warn!("no console socket {}: {e}", p.attach.display()))
        .ok();
    let mut qemu: Option<Halves> = None;
    let mut attached: Option<Halves> = None;
    let mut retry = tokio::time::interval(Duration::from_millis(100));
    let mut cap = tokio::time::interval(Duration::from_secs(1));
    let (mut qbuf, mut abuf) = (vec![0u8; 16384], vec![0u8; 1024]);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = retry.tick(), if qemu.is_none() => {
                if let Ok(s) = UnixStream::connect(&p.serial).await {
                    qemu = Some(s.into_split());
                }
            }
            n = read_opt(&mut qemu, &mut qbuf) => {
                if n == 0 {
                    qemu = None; // QEMU quit, or a settle replaced it: connect again
                } else {
                    sink.put(&qbuf[..n], &mut attached);
                }
            }
            n = read_opt(&mut attached, &mut abuf) => {
                if n == 0 {
                    attached = None;
                } else if let Some((_, w)) = &qemu {
                    // Keystrokes the guest cannot take now are dropped, never queued.
                    let _ = w.try_write(&abuf[..n]);
                }
            }
            s = accept_opt(&listener) => {
                // The newest terminal takes the console over.
                attached = s.map(UnixStream::into_split);
            }
            _ = cap.tick() => {
                if let Err(e) = logcap::cut_in_place(&p.qemu_log, p.qemu_log_cap) {
                    if let Some(n) = sink.warn.admit(std::time::Instant::now()) {
                        tracing::warn!(dropped_since_last = n, "cannot cap {}: {e}", p.qemu_log.display());
                    }
                }
            }
        }
    }
    // Stopping: take what the guest printed last, then let go.
    let end = tokio::time::Instant::now() + DRAIN;
    while qemu.is_some() {
        match tokio::time::timeout_at(end, read_opt(&mut qemu, &mut qbuf)).await {
            Ok(n) if n > 0 => sink.put(&qbuf[..n], &mut attached),
            _ => break,
        }
    }
    let _ = std::fs::remove_file(&p.attach);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn logs_within_the_cap_serves_a_terminal_and_reconnects() {
        let d = tempfile::tempdir().unwrap();
        let p = ConsolePaths {
            serial: d.path().join("serial.sock"),
            attach: d.path().join("console.sock"),
            log: d.path().join("serial.log"),
            log_cap: 64 * 1024,
            qemu_log: d.path().join("qemu.log"),
            qemu_log_cap: 64 * 1024,
        };
        let qemu = UnixListener::bind(&p.serial).unwrap();
        let link = ConsoleLink::start(p.clone());
        let (mut guest, _) = qemu.accept().await.unwrap();
        let line = [b'x'; 1023];
        for _ in 0..1000 {
            guest.write_all(&line).await.unwrap();
            guest.write_all(b"\n").await.unwrap();
        }
        guest.write_all(b"last line\n").await.unwrap();
        let mut tries = 0;
        while !logcap::tail(&p.log, 10).unwrap().ends_with(b"last line\n") {
            tries += 1;
            assert!(tries < 200, "the log never got the last line");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(logcap::size_on_disk(&p.log) <= 64 * 1024);

        // A terminal sees the guest's output and types into it.
        let mut term = UnixStream::connect(&p.attach).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        guest.write_all(b"login: ").await.unwrap();
        let mut got = [0u8; 7];
        term.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"login: ");
        term.write_all(b"root\n").await.unwrap();
        let mut typed = [0u8; 5];
        guest.read_exact(&mut typed).await.unwrap();
        assert_eq!(&typed, b"root\n");

        // QEMU goes away and a new one serves the socket (a settle): the link follows.
        drop(guest);
        drop(qemu);
        std::fs::remove_file(&p.serial).unwrap();
        let qemu = UnixListener::bind(&p.serial).unwrap();
        let (mut guest, _) = qemu.accept().await.unwrap();
        guest.write_all(b"second qemu\n").await.unwrap();
        // What the guest prints just before the link stops is still logged.
        drop(link);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(logcap::tail(&p.log, 12)
            .unwrap()
            .ends_with(b"second qemu\n"));
        assert!(!p.attach.exists());
    }
}
