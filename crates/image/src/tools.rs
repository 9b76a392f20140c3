//! Host programs the builder runs, found on PATH (and in the sbin directories, where
//! Debian keeps depmod and mke2fs for non-root users).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Errors finding or running a host program.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("host tool `{tool}` not found (install the Debian package {package})")]
    Missing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("cannot run {tool}: {err}")]
    Spawn { tool: String, err: std::io::Error },
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        tool: String,
        status: String,
        stderr: String,
    },
}

/// The programs a build needs and the package each comes from.
pub const REQUIRED: &[(&str, &str)] = &[
    ("apt-get", "apt"),
    ("apt-cache", "apt"),
    ("dpkg-deb", "dpkg"),
    ("depmod", "kmod"),
    ("cpio", "cpio"),
    ("mke2fs", "e2fsprogs"),
    ("xz", "xz-utils"),
    // The eviction-notice module, built with the compiler Debian built the kernel with.
    ("make", "make"),
    ("gcc-12", "gcc-12"),
];

/// Absolute paths of the required tools, or the first one missing.
#[derive(Debug, Clone)]
pub struct Tools {
    paths: Vec<(&'static str, PathBuf)>,
}

fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    for d in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    dirs
}

/// Finds `name` on PATH or in the sbin directories.
pub fn find(name: &str) -> Option<PathBuf> {
    search_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Tools {
    /// Checks every required tool, naming the first one missing.
    pub fn check() -> Result<Tools, ToolError> {
        let mut paths = Vec::new();
        for &(tool, package) in REQUIRED {
            match find(tool) {
                Some(p) => paths.push((tool, p)),
                None => return Err(ToolError::Missing { tool, package }),
            }
        }
        Ok(Tools { paths })
    }

    /// A command for one of the required tools.
    pub fn cmd(&self, tool: &str) -> Command {
        let path = self
            .paths
            .iter()
            .find(|(t, _)| *t == tool)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| PathBuf::from(tool));
        let mut c = Command::new(path);
        // Tool messages are parsed (apt-cache) or quoted in errors: keep them in English.
        c.env("LC_ALL", "C");
        c
    }
}

/// Runs a command to completion; a non-zero exit becomes an error quoting the last line
/// of its stderr.
pub fn run(cmd: &mut Command) -> Result<Output, ToolError> {
    let tool = cmd
        .get_program()
        .to_string_lossy()
        .rsplit('/')
        .next()
        .unwrap_or("?")
        .to_string();
    let out = cmd.output().map_err(|err| ToolError::Spawn {
        tool: tool.clone(),
        err,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        return Err(ToolError::Failed {
            tool,
            status: out.status.to_string(),
            stderr: last.trim().to_string(),
        });
    }
    Ok(out)
}
