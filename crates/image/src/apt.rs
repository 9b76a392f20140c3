//! Debian packages for the image: which kernel `linux-image-amd64` points at, the exact
//! versions, cached downloads checked against the archive's SHA256, and extraction.

use std::path::{Path, PathBuf};

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

/// Whether Debian version `a` is at least `b` (`dpkg --compare-versions`).
pub fn version_at_least(a: &str, b: &str) -> Result<bool, AptError> {
    let st = std::process::Command::new("dpkg")
        .args(["--compare-versions", a, "ge", b])
        .status()
        .map_err(|err| AptError::Io {
            path: PathBuf::from("dpkg"),
            err,
        })?;
    Ok(st.success())
}

/// One package as the archive describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub arch: String,
    pub sha256: String,
    /// The raw `Depends:` field ("" when absent).
    pub depends: String,
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

/// The first dependency named `prefix*` in a `Depends:` field
/// ("linux-image-6.1.0-56-amd64 (= 6.1.192-2), foo | bar" → "linux-image-6.1.0-56-amd64").
pub fn parse_depends(depends: &str, prefix: &str) -> Option<String> {
    depends
        .split([',', '|'])
        .map(|d| d.split_whitespace().next().unwrap_or(""))
        .find(|d| d.starts_with(prefix) && d.len() > prefix.len())
        .map(str::to_string)
}

fn stanza_field<'t>(stanza: &'t str, f: &str) -> Option<&'t str> {
    stanza
        .lines()
        .find_map(|l| l.strip_prefix(f).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

/// The stanza for `name` in `apt-cache show --no-all-versions` output.
pub fn parse_show(name: &str, text: &str) -> Result<Package, AptError> {
    let stanza = text
        .split("\n\n")
        .find(|s| stanza_field(s, "Package") == Some(name))
        .ok_or_else(|| AptError::Unknown(name.to_string()))?;
    let field = |f: &'static str| {
        stanza_field(stanza, f)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
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
    let depends = stanza_field(stanza, "Depends").unwrap_or("").to_string();
    Ok(Package {
        name: name.to_string(),
        version,
        arch,
        sha256,
        depends,
    })
}

/// Package lookups, with one `apt-get update` allowed when the lists lack what we ask.
pub struct Apt<'a> {
    tools: &'a Tools,
    updated: bool,
    /// Where apt keeps its binary package cache for us (see [`Apt::cmd`]).
    cache_dir: PathBuf,
}

impl<'a> Apt<'a> {
    pub fn new(tools: &'a Tools, cache_dir: &Path) -> Self {
        Apt {
            tools,
            updated: false,
            cache_dir: cache_dir.to_path_buf(),
        }
    }

    /// An apt command. Debian's docker-style configs disable apt's binary cache, so every
    /// run re-parses all package lists; a cache of our own in $home makes a lookup several
    /// times faster (measured 4.0 s → 0.8 s).
    fn cmd(&self, tool: &str) -> std::process::Command {
        let mut c = self.tools.cmd(tool);
        if std::fs::create_dir_all(&self.cache_dir).is_ok() {
            let opt = |name: &str, file: &str| {
                format!("Dir::Cache::{name}={}", self.cache_dir.join(file).display())
            };
            c.arg("-o").arg(opt("pkgcache", "pkgcache.bin"));
            c.arg("-o").arg(opt("srcpkgcache", "srcpkgcache.bin"));
        }
        c
    }

    fn update(&mut self, progress: &mut dyn FnMut(&str)) -> Result<bool, AptError> {
        if self.updated {
            return Ok(false);
        }
        self.updated = true;
        progress("package lists lack what we need: running apt-get update");
        run(self.cmd("apt-get").args(["update", "-qq"]))?;
        Ok(true)
    }

    fn query(&mut self, args: &[&str], progress: &mut dyn FnMut(&str)) -> Option<String> {
        loop {
            match run(self.cmd("apt-cache").args(args)) {
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

    /// Version, architecture, checksum and dependencies of the candidate versions of
    /// `names` (or of the version `name=version` pins), in one apt-cache run (each run
    /// parses all package lists: ~1 s).
    pub fn show(
        &mut self,
        names: &[&str],
        progress: &mut dyn FnMut(&str),
    ) -> Result<Vec<Package>, AptError> {
        let mut args = vec!["show", "--no-all-versions"];
        args.extend_from_slice(names);
        let text = self
            .query(&args, progress)
            .ok_or_else(|| AptError::Unknown(names.join(" ")))?;
        names
            .iter()
            .map(|n| {
                let p = parse_show(n.split('=').next().unwrap_or(n), &text)?;
                match n.split_once('=') {
                    Some((_, v)) if v != p.version => Err(AptError::Unknown(n.to_string())),
                    _ => Ok(p),
                }
            })
            .collect()
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
    crate::manifest::sha256_of(path).map_err(|err| AptError::Io {
        path: path.to_path_buf(),
        err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_picks_the_kernel() {
        let d = "linux-image-6.1.0-56-amd64 (= 6.1.192-2), firmware | other";
        assert_eq!(
            parse_depends(d, "linux-image-").as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        assert_eq!(parse_depends("", "linux-image-"), None);
        assert_eq!(parse_depends("linux-image-", "linux-image-"), None);
        assert_eq!(
            parse_depends("a | linux-image-6.1.0-9-amd64", "linux-image-").as_deref(),
            Some("linux-image-6.1.0-9-amd64")
        );
    }

    #[test]
    fn show_fields() {
        let sha = "a".repeat(64);
        let t = format!(
            "Package: linux-image-amd64\nVersion: 6.1\nArchitecture: amd64\nDepends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\nSHA256: {sha}\n\n\
             Package: busybox-static\nVersion: 1:1.35.0-4+b1\nArchitecture: amd64\nSHA256: {sha}\n"
        );
        let p = parse_show("busybox-static", &t).unwrap();
        assert_eq!(p.version, "1:1.35.0-4+b1");
        assert_eq!(p.depends, "");
        let m = parse_show("linux-image-amd64", &t).unwrap();
        assert_eq!(
            parse_depends(&m.depends, "linux-image-").as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        assert!(matches!(
            parse_show("nosuch", &t),
            Err(AptError::Unknown(_))
        ));
        assert_eq!(p.deb_name(), "busybox-static_1%3a1.35.0-4+b1_amd64.deb");
        let bad = "Package: x\nVersion: 1\nArchitecture: amd64\nSHA256: zz\n";
        assert!(
            parse_show("x", "Package: x\nVersion: 1\nArchitecture: amd64\n")
                .unwrap_err()
                .to_string()
                .contains("SHA256")
        );
        assert!(parse_show("x", bad)
            .unwrap_err()
            .to_string()
            .contains("SHA256"));
        assert!(parse_show("x", "Package: x\n")
            .unwrap_err()
            .to_string()
            .contains("Version"));
    }

    #[test]
    fn kbuild_newer_than_the_kernel_is_taken_an_older_one_is_not() {
        assert!(version_at_least("6.1.192-3", "6.1.192-2").unwrap());
        assert!(version_at_least("6.1.192-2", "6.1.192-2").unwrap());
        assert!(!version_at_least("6.1.176-1", "6.1.192-2").unwrap());
        assert!(version_at_least("6.1.192-2+deb12u1", "6.1.192-2").unwrap());
    }
}
