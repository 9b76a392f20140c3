//! Debian packages for the image: which kernel `linux-image-amd64` points at, the exact
//! versions, cached downloads checked against the archive's SHA256, and extraction.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::tools::{run, ToolError, Tools};

/// Errors resolving, downloading or unpacking packages.
#[derive(Debug, thiserror::Error)]
pub enum AptError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("apt-cache knows no package {0} (is a Debian archive in the apt sources?)")]
    Unknown(String),
    #[error("apt-cache depends {0} names no linux-image-* package")]
    NoKernelDep(String),
    #[error("apt-cache show {pkg}: field {field} missing")]
    Field { pkg: String, field: &'static str },
    #[error("downloaded {path} has SHA256 {got}, the archive says {want}")]
    Checksum {
        path: PathBuf,
        got: String,
        want: String,
    },
    #[error("apt-get download {0} produced no file")]
    NoFile(String),
    #[error("cannot use {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
}

/// One package as the archive describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub sha256: String,
}

impl Package {
    /// The file name `apt-get download` gives it (':' in epochs is written `%3a`).
    pub fn deb_name(&self) -> String {
        format!(
            "{}_{}_{}.deb",
            self.name,
            self.version.replace(':', "%3a"),
            self.arch
        )
    }
}

/// The dependency of a metapackage whose name starts with `prefix`, from `apt-cache depends`.
pub fn parse_depends(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(|d| d.trim().trim_start_matches('<').trim_end_matches('>'))
        .find(|d| d.starts_with(prefix))
        .map(str::to_string)
}

/// The first stanza of `apt-cache show --no-all-versions` output.
pub fn parse_show(name: &str, text: &str) -> Result<Package, AptError> {
    let stanza = text.split("\n\n").next().unwrap_or("");
    let field = |f: &'static str| {
        stanza
            .lines()
            .find_map(|l| l.strip_prefix(f).and_then(|r| r.strip_prefix(':')))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or(AptError::Field {
                pkg: name.to_string(),
                field: f,
            })
    };
    let version = field("Version")?;
    let arch = field("Architecture")?;
    let sha256 = field("SHA256")?;
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(AptError::Field {
            pkg: name.to_string(),
            field: "SHA256",
        });
    }
    Ok(Package {
        name: name.to_string(),
        version,
        arch,
        sha256,
    })
}

/// Package lookups, with one `apt-get update` allowed when the lists lack what we ask.
pub struct Apt<'a> {
    tools: &'a Tools,
    updated: bool,
}

impl<'a> Apt<'a> {
    pub fn new(tools: &'a Tools) -> Self {
        Apt {
            tools,
            updated: false,
        }
    }

    fn update(&mut self, progress: &mut dyn FnMut(&str)) -> Result<bool, AptError> {
        if self.updated {
            return Ok(false);
        }
        self.updated = true;
        progress("package lists lack what we need: running apt-get update");
        run(self.tools.cmd("apt-get").args(["update", "-qq"]))?;
        Ok(true)
    }

    fn query(&mut self, args: &[&str], progress: &mut dyn FnMut(&str)) -> Option<String> {
        loop {
            match run(self.tools.cmd("apt-cache").args(args)) {
                Ok(o) if !o.stdout.is_empty() => {
                    return Some(String::from_utf8_lossy(&o.stdout).into_owned())
                }
                _ => {}
            }
            if !matches!(self.update(progress), Ok(true)) {
                return None;
            }
        }
    }

    /// The concrete kernel package `meta` (e.g. linux-image-amd64) depends on.
    pub fn kernel_package(
        &mut self,
        meta: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String, AptError> {
        let text = self
            .query(&["depends", meta], progress)
            .ok_or_else(|| AptError::Unknown(meta.to_string()))?;
        parse_depends(&text, "linux-image-").ok_or_else(|| AptError::NoKernelDep(meta.to_string()))
    }

    /// Version, architecture and checksum of the candidate version of `name`.
    pub fn show(
        &mut self,
        name: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Package, AptError> {
        let text = self
            .query(&["show", "--no-all-versions", name], progress)
            .ok_or_else(|| AptError::Unknown(name.to_string()))?;
        parse_show(name, &text)
    }

    /// The package's .deb in `cache`, downloaded unless a copy with the right checksum is
    /// already there.
    pub fn fetch(
        &mut self,
        pkg: &Package,
        cache: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<PathBuf, AptError> {
        std::fs::create_dir_all(cache).map_err(|err| AptError::Io {
            path: cache.to_path_buf(),
            err,
        })?;
        let path = cache.join(pkg.deb_name());
        if path.is_file() && sha256_file(&path)? == pkg.sha256 {
            progress(&format!("using cached {}", pkg.deb_name()));
            return Ok(path);
        }
        progress(&format!("downloading {} {}", pkg.name, pkg.version));
        let spec = format!("{}={}", pkg.name, pkg.version);
        run(self
            .tools
            .cmd("apt-get")
            .current_dir(cache)
            .args(["download", "-qq", &spec]))?;
        if !path.is_file() {
            return Err(AptError::NoFile(spec));
        }
        let got = sha256_file(&path)?;
        if got != pkg.sha256 {
            let _ = std::fs::remove_file(&path);
            return Err(AptError::Checksum {
                path,
                got,
                want: pkg.sha256.clone(),
            });
        }
        Ok(path)
    }

    /// Unpacks a .deb's files into `dest` (no maintainer scripts run).
    pub fn extract(&self, deb: &Path, dest: &Path) -> Result<(), AptError> {
        run(self.tools.cmd("dpkg-deb").arg("-x").arg(deb).arg(dest))?;
        Ok(())
    }
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String, AptError> {
    let mut f = std::fs::File::open(path).map_err(|err| AptError::Io {
        path: path.to_path_buf(),
        err,
    })?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|err| AptError::Io {
        path: path.to_path_buf(),
        err,
    })?;
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_picks_the_kernel() {
        let t =
            "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Recommends: firmware\n";
        assert_eq!(
            parse_depends(t, "linux-image-").as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        assert_eq!(parse_depends("linux-image-amd64\n", "linux-image-"), None);
        assert_eq!(
            parse_depends(
                "x\n  Depends: <linux-image-6.1.0-9-amd64>\n",
                "linux-image-"
            )
            .as_deref(),
            Some("linux-image-6.1.0-9-amd64")
        );
    }

    #[test]
    fn show_fields() {
        let sha = "a".repeat(64);
        let t = format!("Package: busybox-static\nVersion: 1:1.35.0-4+b1\nArchitecture: amd64\nSHA256: {sha}\n\nPackage: busybox-static\nVersion: 0\n");
        let p = parse_show("busybox-static", &t).unwrap();
        assert_eq!(p.version, "1:1.35.0-4+b1");
        assert_eq!(p.deb_name(), "busybox-static_1%3a1.35.0-4+b1_amd64.deb");
        let bad = "Package: x\nVersion: 1\nArchitecture: amd64\nSHA256: zz\n";
        assert!(parse_show("x", bad)
            .unwrap_err()
            .to_string()
            .contains("SHA256"));
        assert!(parse_show("x", "Package: x\n")
            .unwrap_err()
            .to_string()
            .contains("Version"));
    }
}
