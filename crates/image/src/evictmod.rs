//! The guest's eviction-notice module (`guest/evict`, `rebound_evict.ko`), built out of
//! tree against Debian's headers for the image's exact kernel: the packages
//! `linux-headers-<release>` and `linux-headers-<abi>-common` at the kernel package's
//! own version, and `linux-kbuild-<major.minor>` at its candidate version, which the
//! headers require to be at least the kernel's (`Depends: linux-kbuild-6.1 (>= V)`):
//! the security archive moves kbuild on (6.1.192-3 beside a 6.1.192-2 kernel) and
//! keeps no older one, while bookworm's own kbuild can be older than a security
//! kernel, which is refused. The headers'
//! Makefile includes the common tree by an absolute `/usr/src` path: that one line is
//! rewritten to the unpacked tree. Debian builds the kernel with gcc-12, and so do we.
//!
//! Built modules are cached in `$home/cache/evict/<key>/`, the key covering the three
//! packages' checksums and the module's sources, so an image rebuild for another reason
//! does not recompile it.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::apt::{Apt, AptError, Package};
use crate::tools::{ToolError, Tools};

/// The module's sources, compiled in so the image and its inputs hash match this build.
pub const SOURCES: &[(&str, &str)] = &[
    ("evict.c", include_str!("../../../guest/evict/evict.c")),
    ("ring.h", include_str!("../../../guest/evict/ring.h")),
    ("Kbuild", include_str!("../../../guest/evict/Kbuild")),
    ("Makefile", include_str!("../../../guest/evict/Makefile")),
];

/// The module file, as the initramfs holds it (`guest/init` loads it from there).
pub const KO_NAME: &str = "rebound_evict.ko";
pub const KO_PATH: &str = "lib/rebound/rebound_evict.ko";

/// Errors building the module.
#[derive(Debug, thiserror::Error)]
pub enum EvictModuleError {
    #[error("kernel package {0:?} is not named linux-image-<major>.<minor>.<abi>-<flavour>")]
    KernelName(String),
    #[error("cannot use {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("the headers' Makefile {} does not include the common tree", .0.display())]
    HeadersLayout(PathBuf),
    #[error("building the eviction-notice module failed: {0}")]
    Make(String),
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error(transparent)]
    Tool(#[from] ToolError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EvictModuleError + '_ {
    move |err| EvictModuleError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// The header packages for kernel package `linux-image-<release>`:
/// "linux-image-6.1.0-56-amd64" → [linux-headers-6.1.0-56-amd64,
/// linux-headers-6.1.0-56-common, linux-kbuild-6.1].
pub fn header_packages(kernel_pkg: &str) -> Result<[String; 3], EvictModuleError> {
    let bad = || EvictModuleError::KernelName(kernel_pkg.to_string());
    let release = kernel_pkg.strip_prefix("linux-image-").ok_or_else(bad)?;
    let (abi, flavour) = release.rsplit_once('-').ok_or_else(bad)?;
    let mut nums = abi.split(['.', '-']);
    let (major, minor) = (nums.next().ok_or_else(bad)?, nums.next().ok_or_else(bad)?);
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(major) || !numeric(minor) || flavour.is_empty() {
        return Err(bad());
    }
    Ok([
        format!("linux-headers-{release}"),
        format!("linux-headers-{abi}-common"),
        format!("linux-kbuild-{major}.{minor}"),
    ])
}

/// What identifies a built module: the header packages and the sources.
pub fn key(headers: &[Package]) -> String {
    let mut h = Sha256::new();
    for p in headers {
        h.update(format!("package {} {} {}\n", p.name, p.version, p.sha256));
    }
    for (name, text) in SOURCES {
        h.update(format!(
            "source {name} {}\n",
            hex::encode(Sha256::digest(text))
        ));
    }
    hex::encode(h.finalize())
}

/// `rebound_evict.ko` for the kernel whose headers are `headers` (from
/// [`header_packages`], pinned to the kernel's version), from the cache or built now.
pub fn build(
    tools: &Tools,
    apt: &mut Apt,
    headers: &[Package],
    home: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, EvictModuleError> {
    let key = key(headers);
    let cache = home.join("cache/evict");
    let dir = cache.join(&key[..16]);
    let ko = dir.join(KO_NAME);
    if ko.is_file() {
        return Ok(ko);
    }
    std::fs::create_dir_all(&cache).map_err(io(&cache))?;
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(&cache)
        .map_err(io(&cache))?;
    let root = tmp.path().join("root");
    for p in headers {
        let deb = apt.fetch(p, &home.join("cache/debs"), progress)?;
        apt.extract(&deb, &root)?;
    }
    let kdir = root.join("usr/src").join(&headers[0].name);
    fix_headers_makefile(&kdir, &root)?;
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).map_err(io(&src))?;
    for (name, text) in SOURCES {
        std::fs::write(src.join(name), text).map_err(io(&src.join(name)))?;
    }
    progress(&format!("building {KO_NAME} against {}", headers[0].name));
    let out = tools
        .cmd("make")
        .arg("-C")
        .arg(&kdir)
        .arg(format!("M={}", src.display()))
        .arg("modules")
        .output()
        .map_err(|err| ToolError::Spawn {
            tool: "make".into(),
            err,
        })?;
    if !out.status.success() || !src.join(KO_NAME).is_file() {
        // The compiler's message comes before make's summary: quote the tail.
        let text = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = text.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(EvictModuleError::Make(tail.join(" | ")));
    }
    let built = tmp.path().join("out");
    std::fs::create_dir_all(&built).map_err(io(&built))?;
    std::fs::copy(src.join(KO_NAME), built.join(KO_NAME)).map_err(io(&built))?;
    // Another build may have finished first: either copy is the same module.
    if std::fs::rename(&built, &dir).is_err() && !ko.is_file() {
        return Err(EvictModuleError::Io {
            path: dir,
            err: std::io::Error::other("could not move the built module into the cache"),
        });
    }
    Ok(ko)
}

/// The amd64 headers' Makefile is one line, `include /usr/src/linux-headers-…-common/Makefile`:
/// point it at the unpacked tree under `root`.
fn fix_headers_makefile(kdir: &Path, root: &Path) -> Result<(), EvictModuleError> {
    let mf = kdir.join("Makefile");
    let text = std::fs::read_to_string(&mf).map_err(io(&mf))?;
    let fixed =
        rewrite_include(&text, root).ok_or_else(|| EvictModuleError::HeadersLayout(mf.clone()))?;
    std::fs::write(&mf, fixed).map_err(io(&mf))
}

fn rewrite_include(text: &str, root: &Path) -> Option<String> {
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("include /usr/src/") {
            Some(rest) if rest.ends_with("-common/Makefile") => {
                found = true;
                format!("include {}/usr/src/{rest}", root.display())
            }
            _ => l.to_string(),
        })
        .collect();
    found.then(|| lines.join("\n") + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_packages_follow_the_kernel_package() {
        assert_eq!(
            header_packages("linux-image-6.1.0-56-amd64").unwrap(),
            [
                "linux-headers-6.1.0-56-amd64",
                "linux-headers-6.1.0-56-common",
                "linux-kbuild-6.1"
            ]
        );
        assert_eq!(
            header_packages("linux-image-6.12.9-cloud-amd64").unwrap()[2],
            "linux-kbuild-6.12"
        );
        for bad in [
            "linux-image-",
            "linux-headers-6.1.0-56-amd64",
            "linux-image-x.y-amd64",
        ] {
            assert!(header_packages(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_common_include_is_rewritten_and_nothing_else() {
        let t = "include /usr/src/linux-headers-6.1.0-56-common/Makefile\n";
        assert_eq!(
            rewrite_include(t, Path::new("/x/root")).unwrap(),
            "include /x/root/usr/src/linux-headers-6.1.0-56-common/Makefile\n"
        );
        assert!(rewrite_include("obj-m := x.o\n", Path::new("/x")).is_none());
    }
}
