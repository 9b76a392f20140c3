//! Guest images for Rebound: a Debian kernel, a busybox initramfs carrying our init and
//! agent (`guest/`), and an ext4 data disk, all made from Debian packages without
//! installing anything on the host and without root.
//!
//! Layout: `$home/images/NAME/` holds `vmlinux` (the kernel as an ELF booted through its
//! PVH entry: much faster under TCG), `vmlinuz` (Debian's bzImage, kept for tools and
//! other loaders), `initrd.cpio.gz`, `data.ext4` and `manifest.json` (see [`manifest`]).
//! Downloads are cached in `$home/cache/debs`. An image is rebuilt only when its inputs
//! change (package versions, agent, init, builder); a build never touches the existing
//! image until the new one is complete.
//!
//! The data disk is the image's pristine copy: a VM must boot from an overlay or a copy.

mod apt;
mod build;
pub(crate) mod datadisk;
pub mod evictmod;
pub mod fileset;
mod initramfs;
mod kcache;
mod kernel;
pub mod manifest;
pub mod modules;
mod tools;
pub mod webset;

use std::path::{Path, PathBuf};

pub use apt::AptError;
pub use build::build;
pub use datadisk::{
    blob, counter_checksum, mkfs_from_dir, splitmix64, DataDiskError, BLOB_NAME, BLOB_SIZE,
};
pub use evictmod::EvictModuleError;
pub use fileset::{block_signature, write_fileset, FilesetError};
pub use initramfs::{InitramfsError, MODULES};
pub use kcache::KernelCacheError;
pub use kernel::KernelError;
use manifest::{Manifest, ManifestError};
pub use modules::ModulesError;
pub use tools::{run as run_tool, ToolError, Tools};

/// Image names that can be built.
pub const KNOWN_IMAGES: &[&str] = &["default"];

/// Kernel command line our images boot with; workload parameters (`rebound.*`) are
/// appended per VM. Why each one:
/// - `acpi=noirq`: PCI interrupt routing without ACPI (its AML is slow under TCG): QEMU CPU
///   time to `ready` 3.6 → 3.0 s (medians of 3). Not `pci=noacpi`: that saves as much but
///   loses the PCI windows from ACPI, and with `maxmem` (virtio-mem) the virtio devices then
///   fail ("device uses modern interface but does not have VIRTIO_F_VERSION_1");
/// - `cryptomgr.notests`: skips the crypto self-tests;
/// - `panic=0`: a panicked guest stays panicked (QEMU pauses it through pvpanic) for the dump;
/// - `memhp_default_state=online_movable`: virtio-mem memory comes online by itself and can
///   be unplugged again;
/// - `swiotlb=2048` (4 MiB of bounce buffers): with `maxmem` (virtio-mem, the recovery VM)
///   QEMU places device memory above 4 GiB, and Debian's 6.1.192 kernel then sets aside
///   64 MiB of bounce buffers, or 32 MiB when that fails: a 120 MiB recovery VM was left
///   29 MiB and died unpacking its initramfs ("System is deadlocked on memory"). Its
///   devices are virtio and never bounce; 4 MiB serves any that would.
///
/// (Blacklisting the slowest initcalls seen with `initcall_debug`, the CTR-KDF self-test and
/// kprobe-event setup, did not lower QEMU's CPU time to `ready`: 2.9–3.6 s either way.)
pub const DEFAULT_APPEND: &str = "console=ttyS0 quiet panic=0 acpi=noirq mitigations=off \
     cryptomgr.notests no_timer_check memhp_default_state=online_movable swiotlb=2048";

/// Errors of the image builder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown image {0:?}: the images that can be built are: default")]
    UnknownImage(String),
    #[error("image {name:?} is not built (no {}): run `rebound image build {name}`", path.display())]
    NotBuilt { name: String, path: PathBuf },
    #[error("image {name:?} is damaged ({what}): rebuild it with `rebound image build {name}`")]
    Damaged { name: String, what: String },
    #[error("agent binary {}: {what} (build it with `make -C guest/agent`)", path.display())]
    Agent { path: PathBuf, what: String },
    #[error("cannot use {}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Apt(#[from] AptError),
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    #[error(transparent)]
    KernelCache(#[from] KernelCacheError),
    #[error(transparent)]
    DataDisk(#[from] DataDiskError),
    #[error(transparent)]
    EvictModule(#[from] EvictModuleError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

/// A built image, ready to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    pub name: String,
    pub dir: PathBuf,
    /// Kernel for `-kernel` (the PVH ELF when the kernel has one, else the bzImage).
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// Pristine data disk: boot from an overlay or a copy, never from this file.
    pub disk: PathBuf,
    pub kernel_release: String,
    /// Default kernel command line, without `rebound.*` workload parameters.
    pub append: String,
    pub inputs_hash: String,
}

/// One image as `rebound image list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub name: String,
    pub kernel_release: String,
    pub size_bytes: u64,
    pub built_at: String,
    pub dir: PathBuf,
}

/// What a build needs from the caller.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// The static guest agent (`guest/agent/rebound-agent`).
    pub agent: PathBuf,
    /// Rebuild even when the inputs did not change.
    pub force: bool,
}

pub(crate) fn images_dir(home: &Path) -> PathBuf {
    home.join("images")
}

pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    if KNOWN_IMAGES.contains(&name) {
        Ok(())
    } else {
        Err(Error::UnknownImage(name.to_string()))
    }
}

/// Opens a built image, checking that its files are there with the sizes recorded.
pub fn open(home: &Path, name: &str) -> Result<Image, Error> {
    check_name(name)?;
    let dir = images_dir(home).join(name);
    let mpath = dir.join("manifest.json");
    if !mpath.is_file() {
        return Err(Error::NotBuilt {
            name: name.to_string(),
            path: mpath,
        });
    }
    let m = Manifest::read(&mpath).map_err(|e| Error::Damaged {
        name: name.to_string(),
        what: e.to_string(),
    })?;
    from_manifest(name, &dir, &m)
}

fn from_manifest(name: &str, dir: &Path, m: &Manifest) -> Result<Image, Error> {
    if m.name != name {
        return Err(Error::Damaged {
            name: name.to_string(),
            what: format!("manifest names image {:?}", m.name),
        });
    }
    let path_of = |role: &str| -> Result<PathBuf, Error> {
        // parse() guarantees the roles kernel/initrd/disk exist.
        let f = &m.files[role];
        let p = dir.join(&f.path);
        match std::fs::metadata(&p) {
            Ok(md) if md.len() == f.size => Ok(p),
            Ok(md) => Err(Error::Damaged {
                name: name.to_string(),
                what: format!(
                    "{} is {} bytes, the manifest says {}",
                    f.path,
                    md.len(),
                    f.size
                ),
            }),
            Err(e) => Err(Error::Damaged {
                name: name.to_string(),
                what: format!("{}: {e}", f.path),
            }),
        }
    };
    Ok(Image {
        name: name.to_string(),
        dir: dir.to_path_buf(),
        kernel: path_of("kernel")?,
        initrd: path_of("initrd")?,
        disk: path_of("disk")?,
        kernel_release: m.kernel_release.clone(),
        append: m.append.clone(),
        inputs_hash: m.inputs_hash.clone(),
    })
}

/// The built images, by name. Directories that do not hold a readable manifest (a build
/// in progress, a damaged image) are left out; `open` names what is wrong with them.
pub fn list(home: &Path) -> Result<Vec<ImageInfo>, Error> {
    let dir = images_dir(home);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(Error::Io { path: dir, err }),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|err| Error::Io {
            path: dir.clone(),
            err,
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.path().is_dir() {
            continue;
        }
        let Ok(m) = Manifest::read(&e.path().join("manifest.json")) else {
            continue;
        };
        let size_bytes = m.files.values().map(|f| f.size).sum::<u64>();
        out.push(ImageInfo {
            name,
            kernel_release: m.kernel_release,
            size_bytes,
            built_at: m.built_at,
            dir: e.path(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::FileEntry;

    /// A small image directory written by hand (no packages needed).
    fn fake_image(home: &Path) -> PathBuf {
        let dir = images_dir(home).join("default");
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = std::collections::BTreeMap::new();
        for (role, name, data) in [
            ("kernel", "vmlinux", &b"kernel"[..]),
            ("initrd", "initrd.cpio.gz", b"initrd"),
            ("disk", "data.ext4", b"disk"),
        ] {
            std::fs::write(dir.join(name), data).unwrap();
            let entry = FileEntry {
                path: name.into(),
                size: data.len() as u64,
                sha256: "00".repeat(32),
            };
            files.insert(role.to_string(), entry);
        }
        let m = Manifest {
            format: manifest::FORMAT.into(),
            version: manifest::VERSION,
            name: "default".into(),
            kernel_release: "6.1.0-test".into(),
            append: DEFAULT_APPEND.into(),
            inputs_hash: "ab".repeat(32),
            built_at: "2026-11-22T00:00:00Z".into(),
            builder_version: 1,
            packages: vec![],
            modules: vec![],
            files,
        };
        m.write(&dir.join("manifest.json")).unwrap();
        dir
    }

    #[test]
    fn open_and_list_a_good_image() {
        let home = tempfile::tempdir().unwrap();
        let dir = fake_image(home.path());
        let img = open(home.path(), "default").unwrap();
        assert_eq!(img.kernel, dir.join("vmlinux"));
        assert_eq!(img.kernel_release, "6.1.0-test");
        assert_eq!(img.append, DEFAULT_APPEND);
        // A build in progress is not listed.
        std::fs::create_dir_all(images_dir(home.path()).join(".build-default-x")).unwrap();
        let l = list(home.path()).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].name.as_str(), l[0].size_bytes), ("default", 16));
    }

    #[test]
    fn damaged_images_are_named() {
        let home = tempfile::tempdir().unwrap();
        let dir = fake_image(home.path());
        std::fs::write(dir.join("initrd.cpio.gz"), b"init").unwrap();
        let e = open(home.path(), "default").unwrap_err().to_string();
        assert!(
            e.contains("damaged") && e.contains("initrd.cpio.gz is 4 bytes, the manifest says 6"),
            "{e}"
        );
        std::fs::remove_file(dir.join("data.ext4")).unwrap();
        std::fs::write(dir.join("initrd.cpio.gz"), b"initrd").unwrap();
        let e = open(home.path(), "default").unwrap_err().to_string();
        assert!(e.contains("data.ext4"), "{e}");
        std::fs::write(
            dir.join("manifest.json"),
            b"{\"format\":\"rebound-image\",\"vers",
        )
        .unwrap();
        let e = open(home.path(), "default").unwrap_err().to_string();
        assert!(
            e.contains("damaged") && e.contains("not a valid manifest"),
            "{e}"
        );
        assert!(list(home.path()).unwrap().is_empty());
    }

    #[test]
    fn missing_tools_are_named() {
        assert!(tools::find("rebound-no-such-tool").is_none());
        let e = ToolError::Missing {
            tool: "mke2fs",
            package: "e2fsprogs",
        };
        assert_eq!(
            e.to_string(),
            "host tool `mke2fs` not found (install the Debian package e2fsprogs)"
        );
    }
}
