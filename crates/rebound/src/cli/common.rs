//! What the VM, snapshot and cluster commands share: a VM's name in an API path, its
//! status, a job's progress on a terminal, and the absolute paths the daemon is given
//! (it runs elsewhere than the command's working directory).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use hyper::Method;
use rebound_api::VmStatus;

use crate::client::Client;

/// `p`, relative to the working directory unless absolute.
pub(crate) fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    Ok(if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()?.join(p)
    })
}

/// An existing file's canonical path; `what` names it in the error.
pub(crate) fn abs_file(p: &Path, what: &str) -> anyhow::Result<String> {
    if !p.is_file() {
        bail!("{what} file {} not found", p.display());
    }
    Ok(std::fs::canonicalize(p)
        .with_context(|| format!("{what} file {}", p.display()))?
        .to_string_lossy()
        .into_owned())
}

/// VM names are restricted to URL-safe characters; anything else cannot exist.
pub(crate) use rebound_client::enc;

pub(crate) async fn status(c: &Client, name: &str) -> anyhow::Result<VmStatus> {
    Ok(c.call(Method::GET, &format!("/v1/vms/{}", enc(name)), None)
        .await?)
}

/// Draws the job's progress on a terminal until `call` finishes.
pub(crate) async fn show_progress<T>(
    c: &Client,
    name: &str,
    what: &str,
    mut call: tokio::task::JoinHandle<T>,
) -> anyhow::Result<T> {
    let tty = std::io::stderr().is_terminal();
    loop {
        tokio::select! {
            r = &mut call => {
                if tty {
                    eprint!("\r{:60}\r", "");
                }
                return Ok(r?);
            }
            _ = tokio::time::sleep(Duration::from_millis(200)), if tty => {
                if let Ok(st) = status(c, name).await {
                    if let Some(p) = st.progress.filter(|p| p.total > 0) {
                        let f = p.done as f64 / p.total as f64;
                        let bar = "#".repeat((f * 30.0) as usize);
                        eprint!("\r{name}: {what} [{bar:<30}] {:>3.0}% {} MiB", f * 100.0, p.done >> 20);
                        let _ = std::io::stderr().flush();
                    }
                }
            }
        }
    }
}
