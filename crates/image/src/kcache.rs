//! Kernel parts, cached per kernel package: the bzImage, its PVH ELF and the reduced
//! module tree, in `$home/cache/kernels/<key>/`. Unpacking the 70 MB kernel package and
//! indexing its 4000 modules is most of a build; with this cache, a rebuild after an
//! agent or init change only reassembles the initramfs and the data disk. The key covers
//! the archive's SHA-256 of the package, the module list and the builder version.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::apt::{Apt, AptError, Package};
use crate::initramfs::{reduce_modules, InitramfsError, MODULES};
use crate::kernel::{extract_pvh_elf, KernelError};
use crate::manifest::FileEntry;
use crate::tools::Tools;

/// Errors preparing the kernel parts.
#[derive(Debug, thiserror::Error)]
pub enum KernelCacheError {
    #[error("cannot use {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("unpacked kernel package: {0}")]
    Layout(String),
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KernelCacheError + '_ {
    move |err| KernelCacheError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// `info.json` of a cache entry; written last, so an entry without it is incomplete.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Info {
    package: String,
    version: String,
    release: String,
    modules: Vec<String>,
    vmlinuz: FileEntry,
    vmlinux: Option<FileEntry>,
}

/// The kernel parts an image is assembled from.
#[derive(Debug, Clone)]
pub struct KernelParts {
    pub dir: PathBuf,
    pub release: String,
    /// Module files (relative to lib/modules/<release>) in the reduced tree.
    pub modules: Vec<String>,
    /// Has lib/modules/<release>.
    pub modules_root: PathBuf,
    pub vmlinuz: FileEntry,
    /// The PVH ELF, when the kernel has a PVH entry.
    pub vmlinux: Option<FileEntry>,
}

fn key(pkg: &Package, builder_version: u32) -> String {
    let k = Sha256::digest(format!(
        "{} {} {builder_version}",
        pkg.sha256,
        MODULES.join(",")
    ));
    hex::encode(&k[..8])
}

fn load(dir: &Path) -> Option<KernelParts> {
    let info: Info = serde_json::from_slice(&std::fs::read(dir.join("info.json")).ok()?).ok()?;
    // A file changed or lost since: not usable (rebuilt below).
    for f in std::iter::once(&info.vmlinuz).chain(info.vmlinux.as_ref()) {
        if std::fs::metadata(dir.join(&f.path)).ok()?.len() != f.size {
            return None;
        }
    }
    let modules_root = dir.join("modules");
    if !modules_root
        .join("lib/modules")
        .join(&info.release)
        .join("modules.dep")
        .is_file()
    {
        return None;
    }
    Some(KernelParts {
        dir: dir.to_path_buf(),
        release: info.release,
        modules: info.modules,
        modules_root,
        vmlinuz: info.vmlinuz,
        vmlinux: info.vmlinux,
    })
}

/// The single directory under lib/modules of the unpacked kernel package.
fn kernel_release(root: &Path) -> Result<String, KernelCacheError> {
    let dir = root.join("lib/modules");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .map_err(io(&dir))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    match names.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(KernelCacheError::Layout(format!(
            "expected one directory in lib/modules, found {names:?}"
        ))),
    }
}

fn entry(dir: &Path, name: &str) -> Result<FileEntry, KernelCacheError> {
    FileEntry::of(dir, name).map_err(io(&dir.join(name)))
}

/// Returns the cached parts for `pkg`, making them first when needed.
pub fn prepare(
    tools: &Tools,
    apt: &mut Apt,
    pkg: &Package,
    home: &Path,
    builder_version: u32,
    progress: &mut dyn FnMut(&str),
) -> Result<KernelParts, KernelCacheError> {
    let kernels = home.join("cache/kernels");
    let dir = kernels.join(key(pkg, builder_version));
    if let Some(parts) = load(&dir) {
        progress(&format!(
            "using cached kernel parts for {} {}",
            pkg.name, pkg.version
        ));
        return Ok(parts);
    }
    let deb = apt.fetch(pkg, &home.join("cache/debs"), progress)?;
    std::fs::create_dir_all(&kernels).map_err(io(&kernels))?;
    let tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(&kernels)
        .map_err(io(&kernels))?;
    let unpacked = tmp.path().join("unpacked");
    let new = tmp.path().join("entry");
    std::fs::create_dir_all(&new).map_err(io(&new))?;
    progress(&format!("unpacking {}", pkg.name));
    apt.extract(&deb, &unpacked)?;
    let release = kernel_release(&unpacked)?;
    let bzimage = unpacked.join("boot").join(format!("vmlinuz-{release}"));
    if !bzimage.is_file() {
        return Err(KernelCacheError::Layout(format!(
            "no boot/vmlinuz-{release}"
        )));
    }
    progress(&format!("choosing modules (kernel {release})"));
    let modules: Vec<String> = reduce_modules(tools, &unpacked, &release, &new.join("modules"))?
        .into_iter()
        .collect();
    progress("extracting the kernel's PVH ELF");
    std::fs::copy(&bzimage, new.join("vmlinuz")).map_err(io(&bzimage))?;
    let vmlinux = if extract_pvh_elf(tools, &bzimage, &new.join("vmlinux"))? {
        Some(entry(&new, "vmlinux")?)
    } else {
        progress("kernel has no PVH entry: images will boot the bzImage");
        None
    };
    let info = Info {
        package: pkg.name.clone(),
        version: pkg.version.clone(),
        release,
        modules,
        vmlinuz: entry(&new, "vmlinuz")?,
        vmlinux,
    };
    let info_path = new.join("info.json");
    let text = serde_json::to_vec_pretty(&info).map_err(|e| KernelCacheError::Io {
        path: info_path.clone(),
        err: e.into(),
    })?;
    std::fs::write(&info_path, text).map_err(io(&info_path))?;
    // A stale, incomplete entry (no valid info.json) is replaced.
    if dir.exists() {
        let old = tmp.path().join("old");
        std::fs::rename(&dir, &old).map_err(io(&dir))?;
    }
    std::fs::rename(&new, &dir).map_err(io(&dir))?;
    load(&dir).ok_or_else(|| {
        KernelCacheError::Layout(format!(
            "cache entry {} unreadable after writing",
            dir.display()
        ))
    })
}
