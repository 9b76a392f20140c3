//! `rebound vm console`: the serial console socket wired to the terminal.
//! Ctrl-] detaches (the terminal is in raw mode, so Ctrl-C goes to the guest).

use std::os::fd::AsFd;
use std::path::Path;

use anyhow::Context;
use nix::sys::termios::{self, SetArg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DETACH: u8 = 0x1d; // Ctrl-]

/// Restores the terminal mode when dropped, however we leave.
struct RawMode(Option<termios::Termios>);

impl RawMode {
    fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(orig) = termios::tcgetattr(stdin.as_fd()) else {
            return RawMode(None); // not a terminal: pass bytes through
        };
        let mut raw = orig.clone();
        termios::cfmakeraw(&mut raw);
        let _ = termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw);
        RawMode(Some(orig))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(orig) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, orig);
        }
    }
}

pub async fn attach(sock: &Path) -> anyhow::Result<()> {
    let stream = tokio::net::UnixStream::connect(sock)
        .await
        .with_context(|| format!("cannot attach to the serial console {}", sock.display()))?;
    eprintln!("attached to {} (Ctrl-] to detach)", sock.display());
    let (mut r, mut w) = stream.into_split();
    let _raw = RawMode::enter();
    let to_guest = async {
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 1024];
        loop {
            let n = stdin.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if let Some(i) = buf[..n].iter().position(|&b| b == DETACH) {
                w.write_all(&buf[..i]).await?;
                return Ok(());
            }
            w.write_all(&buf[..n]).await?;
        }
    };
    let from_guest = async {
        let mut stdout = tokio::io::stdout();
        let mut buf = [0u8; 4096];
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            stdout.write_all(&buf[..n]).await?;
            stdout.flush().await?;
        }
    };
    tokio::select! {
        r = to_guest => r?,
        r = from_guest => r?,
    }
    drop(_raw);
    eprintln!("\r\ndetached");
    Ok(())
}
