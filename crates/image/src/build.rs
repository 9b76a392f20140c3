//! `build`: resolve packages, decide from the inputs hash whether anything changed, then
//! assemble the image in a temporary directory next to its final place and swap it in.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::apt::{parse_depends, Apt, AptError, Package};
use crate::manifest::{FileEntry, Manifest, PackageEntry, FORMAT, VERSION};
use crate::tools::Tools;
use crate::{
    check_name, datadisk, evictmod, images_dir, initramfs, kcache, open, BuildOptions, Error,
    Image, DEFAULT_APPEND,
};

/// Bumped whenever the builder's output changes for the same inputs.
const BUILDER_VERSION: u32 = 2;
/// The init script, compiled in so the image and its hash always match this build.
const INIT: &str = include_str!("../../../guest/init");
const KERNEL_META: &str = "linux-image-amd64";
const BUSYBOX: &str = "busybox-static";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |err| Error::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Refuses anything but a statically linked x86-64 ELF executable: the initramfs has no
/// dynamic loader.
fn check_agent(path: &Path) -> Result<Vec<u8>, Error> {
    let bad = |what: &str| Error::Agent {
        path: path.to_path_buf(),
        what: what.to_string(),
    };
    let data = std::fs::read(path).map_err(|e| bad(&e.to_string()))?;
    if data.len() < 64 || &data[..6] != b"\x7fELF\x02\x01" || data[18] != 0x3e {
        return Err(bad("not an x86-64 ELF executable"));
    }
    let phoff = u64::from_le_bytes(data[32..40].try_into().expect("8 bytes")) as usize;
    let phentsize = usize::from(u16::from_le_bytes([data[54], data[55]]));
    let phnum = usize::from(u16::from_le_bytes([data[56], data[57]]));
    for i in 0..phnum {
        let off = phoff.saturating_add(i.saturating_mul(phentsize));
        let Some(t) = data.get(off..off + 4) else {
            return Err(bad("truncated program headers"));
        };
        if t == 3u32.to_le_bytes() {
            return Err(bad("dynamically linked (has PT_INTERP); it must be static"));
        }
    }
    Ok(data)
}

fn inputs_hash(kernel: &Package, busybox: &Package, agent: &[u8], headers: &[Package]) -> String {
    let mut h = Sha256::new();
    h.update(format!("rebound-image builder {BUILDER_VERSION}\n"));
    for p in [kernel, busybox] {
        h.update(format!(
            "package {} {} {} {}\n",
            p.name, p.version, p.arch, p.sha256
        ));
    }
    h.update(format!("agent {}\n", hex::encode(Sha256::digest(agent))));
    h.update(format!("init {}\n", hex::encode(Sha256::digest(INIT))));
    h.update(format!("modules {}\n", initramfs::MODULES.join(",")));
    h.update(format!("append {DEFAULT_APPEND}\n"));
    h.update(format!("evict module {}\n", evictmod::key(headers)));
    hex::encode(h.finalize())
}

/// The kernel package and the module's header packages: the headers at exactly the
/// kernel's version, kbuild at its candidate if that is at least the kernel's (see
/// [`evictmod`]). The meta package's `Depends: linux-image-X (= V)` gives V, so one
/// apt-cache run usually answers all; a second one pins the headers when it did not.
fn resolve_kernel(
    apt: &mut Apt,
    kname: &str,
    depends: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(Package, Vec<Package>), Error> {
    let heads = evictmod::header_packages(kname)?;
    let kbuild = |h: &str| h.starts_with("linux-kbuild-");
    let pins = |v: &str| {
        heads
            .iter()
            .map(|h| {
                if kbuild(h) {
                    h.clone()
                } else {
                    format!("{h}={v}")
                }
            })
            .collect::<Vec<_>>()
    };
    let mut names = vec![kname.to_string()];
    if let Some(v) = parse_depends_version(depends, kname) {
        names.extend(pins(&v));
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut pkgs = apt.show(&names, progress)?;
    let mut headers = pkgs.split_off(1);
    let kpkg = pkgs.pop().expect("one package per name");
    if headers.is_empty()
        || headers
            .iter()
            .any(|h| !kbuild(&h.name) && h.version != kpkg.version)
    {
        let p = pins(&kpkg.version);
        headers = apt.show(&p.iter().map(String::as_str).collect::<Vec<_>>(), progress)?;
    }
    for h in headers.iter().filter(|h| kbuild(&h.name)) {
        if !crate::apt::version_at_least(&h.version, &kpkg.version)? {
            return Err(crate::apt::AptError::Unknown(format!(
                "{} >= {} (the kernel's headers need it; the archive has {})",
                h.name, kpkg.version, h.version
            ))
            .into());
        }
    }
    Ok((kpkg, headers))
}

/// V of `name (= V)` in a `Depends:` field.
fn parse_depends_version(depends: &str, name: &str) -> Option<String> {
    depends.split([',', '|']).find_map(|d| {
        let d = d.trim();
        let rest = d.strip_prefix(name)?.trim_start();
        let v = rest.strip_prefix("(=")?.strip_suffix(')')?.trim();
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// An exclusive lock on `images/.NAME.lock` for the duration of a build; closing the file
/// (on drop) releases it.
struct BuildLock(#[allow(dead_code)] std::fs::File);

fn lock(images: &Path, name: &str) -> Result<BuildLock, Error> {
    let p = images.join(format!(".{name}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&p)
        .map_err(io(&p))?;
    // SAFETY: flock only reads the descriptor number; `f` is open for the whole call and
    // the lock lives as long as the returned BuildLock owns the file.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    if rc != 0 {
        return Err(Error::Io {
            path: p,
            err: std::io::Error::last_os_error(),
        });
    }
    Ok(BuildLock(f))
}

fn file_entry(dir: &Path, name: &str) -> Result<FileEntry, Error> {
    FileEntry::of(dir, name).map_err(io(&dir.join(name)))
}

/// Builds image `name` under `home` (or returns the existing one when nothing changed).
pub fn build(
    home: &Path,
    name: &str,
    opts: &BuildOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Image, Error> {
    check_name(name)?;
    let tools = Tools::check()?;
    let agent = check_agent(&opts.agent)?;
    let images = images_dir(home);
    std::fs::create_dir_all(&images).map_err(io(&images))?;
    let _lock = lock(&images, name)?;
    remove_leftovers(&images, &format!(".build-{name}-"));
    remove_leftovers(&home.join("cache/kernels"), ".tmp-");

    progress(&format!("resolving {KERNEL_META} and {BUSYBOX}"));
    let mut apt = Apt::new(&tools, &home.join("cache/apt"));
    let [meta, bpkg]: [Package; 2] = apt
        .show(&[KERNEL_META, BUSYBOX], progress)?
        .try_into()
        .expect("one package per name");
    let kname = parse_depends(&meta.depends, "linux-image-")
        .ok_or(AptError::NoKernelDep(KERNEL_META.to_string()))?;
    let (kpkg, headers) = resolve_kernel(&mut apt, &kname, &meta.depends, progress)?;
    let hash = inputs_hash(&kpkg, &bpkg, &agent, &headers);

    if !opts.force {
        match open(home, name) {
            Ok(img) if img.inputs_hash == hash => {
                progress(&format!(
                    "image {name} is up to date ({}, inputs {})",
                    img.kernel_release,
                    &hash[..12]
                ));
                return Ok(img);
            }
            Ok(_) => progress(&format!("image {name}: inputs changed, rebuilding")),
            Err(Error::NotBuilt { .. }) => {}
            Err(e) => progress(&format!("rebuilding: {e}")),
        }
    }

    let kparts = kcache::prepare(&tools, &mut apt, &kpkg, home, BUILDER_VERSION, progress)?;
    let release = kparts.release.clone();
    let bdeb = apt.fetch(&bpkg, &home.join("cache/debs"), progress)?;
    let ko = evictmod::build(&tools, &mut apt, &headers, home, progress)?;

    let tmp = tempfile::Builder::new()
        .prefix(&format!(".build-{name}-"))
        .tempdir_in(&images)
        .map_err(io(&images))?;
    let work = tmp.path().join("work");
    let out = tmp.path().join("out");
    for d in [&work, &out] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let broot = work.join("busybox");
    apt.extract(&bdeb, &broot)?;

    progress(&format!(
        "assembling initramfs (kernel {release}, {} modules)",
        kparts.modules.len()
    ));
    let agent_path = work.join("rebound-agent");
    std::fs::write(&agent_path, &agent).map_err(io(&agent_path))?;
    let root = work.join("initramfs");
    let inputs = initramfs::Inputs {
        modules_root: &kparts.modules_root,
        busybox: &broot.join("bin/busybox"),
        agent: &agent_path,
        init: INIT,
        evict_module: Some(&ko),
    };
    initramfs::populate(&inputs, &root)?;
    initramfs::archive(&tools, &root, &out.join("initrd.cpio.gz"))?;

    // Kernel files: copied with the checksums the cache computed once.
    let mut files = BTreeMap::new();
    for (role, f) in [
        ("kernel_bzimage", Some(&kparts.vmlinuz)),
        ("kernel", kparts.vmlinux.as_ref()),
    ] {
        if let Some(f) = f {
            let from = kparts.dir.join(&f.path);
            std::fs::copy(&from, out.join(&f.path)).map_err(io(&from))?;
            files.insert(role.to_string(), f.clone());
        }
    }
    if kparts.vmlinux.is_none() {
        files.insert("kernel".to_string(), kparts.vmlinuz.clone());
    }

    progress(&format!("making data disk ({})", datadisk::DISK_SIZE));
    datadisk::make(
        &tools,
        name,
        &release,
        &work.join("data"),
        &out.join("data.ext4"),
    )?;
    files.insert("initrd".to_string(), file_entry(&out, "initrd.cpio.gz")?);
    files.insert("disk".to_string(), file_entry(&out, "data.ext4")?);

    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: VERSION,
        name: name.to_string(),
        kernel_release: release.clone(),
        append: DEFAULT_APPEND.to_string(),
        inputs_hash: hash,
        built_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        builder_version: BUILDER_VERSION,
        packages: [&kpkg, &bpkg]
            .into_iter()
            .chain(&headers)
            .map(|p| PackageEntry {
                name: p.name.clone(),
                version: p.version.clone(),
                sha256: p.sha256.clone(),
            })
            .collect(),
        modules: kparts.modules.clone(),
        files,
    };
    manifest.write(&out.join("manifest.json"))?;

    swap_in(&images, name, &out, tmp.path())?;
    progress(&format!(
        "image {name} built in {}",
        images.join(name).display()
    ));
    open(home, name)
}

/// Removes temporary directories a killed build left behind. Called with the build lock
/// held, so none of them belongs to a running build (only `default` can be built, and its
/// builds are serialized by that lock).
fn remove_leftovers(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Replaces `images/NAME` with `new`: the old image is moved into the build's temporary
/// directory (deleted with it), so `images/NAME` is either the old or the new image
/// except for the instant between the two renames.
fn swap_in(images: &Path, name: &str, new: &Path, tmp: &Path) -> Result<(), Error> {
    let target = images.join(name);
    let old: PathBuf = tmp.join("old");
    if target.exists() {
        std::fs::rename(&target, &old).map_err(io(&target))?;
    }
    if let Err(err) = std::fs::rename(new, &target) {
        if old.exists() {
            let _ = std::fs::rename(&old, &target);
        }
        return Err(Error::Io { path: target, err });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_must_be_static_x86_64() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, b"#!/bin/sh\n").unwrap();
        assert!(check_agent(&p)
            .unwrap_err()
            .to_string()
            .contains("not an x86-64 ELF"));
        // A dynamic binary of the host has PT_INTERP.
        let e = check_agent(Path::new("/bin/sh")).unwrap_err().to_string();
        assert!(e.contains("dynamically linked"), "{e}");
        let e = check_agent(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("make -C guest/agent"), "{e}");
    }

    #[test]
    fn the_kernel_version_comes_from_the_meta_package() {
        let d = "linux-image-6.1.0-56-amd64 (= 6.1.192-2), foo";
        assert_eq!(
            parse_depends_version(d, "linux-image-6.1.0-56-amd64").as_deref(),
            Some("6.1.192-2")
        );
        assert_eq!(
            parse_depends_version("linux-image-x", "linux-image-x"),
            None
        );
        assert_eq!(parse_depends_version(d, "foo"), None);
    }

    #[test]
    fn leftovers_of_killed_builds_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for d in [".build-default-abc/work", ".build-other-x", "default"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        remove_leftovers(dir.path(), ".build-default-");
        assert!(!dir.path().join(".build-default-abc").exists());
        assert!(dir.path().join(".build-other-x").exists());
        assert!(dir.path().join("default").exists());
    }

    #[test]
    fn unknown_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let opts = BuildOptions {
            agent: "/nonexistent".into(),
            force: false,
        };
        let e = build(dir.path(), "fancy", &opts, &mut |_| {})
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "unknown image \"fancy\": the images that can be built are: default"
        );
        let e = open(dir.path(), "default").unwrap_err().to_string();
        assert!(
            e.contains("is not built") && e.contains("rebound image build default"),
            "{e}"
        );
        assert!(crate::list(dir.path()).unwrap().is_empty());
    }
}
