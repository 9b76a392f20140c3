//! Disks: each VM gets its own writable copy of an image's disk (a qcow2 overlay
//! backed by the read-only image), so VMs never share a writable image.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::qemu::{Disk, DiskFormat};

/// Errors preparing disks.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk {0} not found")]
    Missing(PathBuf),
    #[error("cannot read disk {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("qemu-img not found: install qemu-utils or set REBOUND_QEMU_IMG")]
    NoQemuImg,
    #[error("qemu-img could not create an overlay for {0}: {1}")]
    Overlay(PathBuf, String),
    #[error("disk {0} is qcow2: --disk-backend rebound serves raw images (convert it with `qemu-img convert -O raw`)")]
    NotRaw(PathBuf),
    #[error("cannot copy {0} to {1}: {2}")]
    Copy(PathBuf, PathBuf, String),
    #[error("disk {0} is {1} bytes, not the {2} its size= asks for (Rebound neither cuts nor grows an existing disk)")]
    SizeMismatch(PathBuf, u64, u64),
    #[error("disk {0}: size= is for raw files, and this one is qcow2")]
    SizeOfQcow2(PathBuf),
    #[error("cannot create disk {0}")]
    Create(PathBuf, #[source] std::io::Error),
    #[error("pmem file {0} is {1} bytes: a virtio-pmem device needs a raw file of a non-zero multiple of 2 MiB (`truncate -s` it)")]
    PmemSize(PathBuf, u64),
    #[error("disk layer {0} is refused: {1}")]
    Layer(PathBuf, String),
}

/// How deep a snapshot's chain of qcow2 layers may go (each snapshot of a restored
/// VM adds one).
const MAX_CHAIN: usize = 32;

/// Where a snapshot's disk layers may read through.
#[derive(Debug, Clone)]
pub struct LayerRoots {
    /// The snapshot's directory: layers inside it are checked in turn.
    pub snapshot: PathBuf,
    /// The daemon's read-only images: trusted, a chain ends there.
    pub images: PathBuf,
    /// The files outside both that the daemon recorded, when it wrote this very
    /// snapshot, as bases of its layers (canonical, with the format declared for
    /// them): checked in turn.
    pub bases: Vec<(PathBuf, DiskFormat)>,
    /// Why a file outside that is none of `bases` is not allowed, for the refusal.
    pub unrecorded: String,
}

/// Checks a disk layer that came from outside (a snapshot) before QEMU opens it:
/// a regular file (no link, no device), raw, or qcow2 whose backing files are
/// regular files with a declared format, inside the snapshot or the daemon's
/// images, or one of the bases the daemon recorded for this snapshot, and which
/// keeps no data in an external file. The format is the one the snapshot declares,
/// never probed from the content: a guest can write a qcow2 header into a raw disk.
pub fn check_layer(path: &Path, format: DiskFormat, roots: &LayerRoots) -> Result<(), DiskError> {
    walk_chain(path, format, roots, |p, b, fmt| {
        match roots.bases.iter().find(|(f, _)| f == b) {
            Some((_, recorded)) if *recorded == fmt => Ok(()),
            Some((_, recorded)) => Err(DiskError::Layer(
                p.to_path_buf(),
                format!(
                    "its backing file {} is declared {} but was recorded as {}",
                    b.display(),
                    fmt.as_str(),
                    recorded.as_str()
                ),
            )),
            None => Err(DiskError::Layer(
                p.to_path_buf(),
                format!(
                    "its backing file {} lies outside the snapshot and the daemon's images, {}",
                    b.display(),
                    roots.unrecorded
                ),
            )),
        }
    })
}

/// The files outside `snapshot` and `images` that a layer of the snapshot reads
/// through, down its whole chain, with their declared formats: what the daemon
/// records for a snapshot it writes ([`LayerRoots::bases`]).
pub fn external_bases(
    path: &Path,
    format: DiskFormat,
    snapshot: &Path,
    images: &Path,
) -> Result<Vec<(PathBuf, DiskFormat)>, DiskError> {
    let roots = LayerRoots {
        snapshot: snapshot.to_path_buf(),
        images: images.to_path_buf(),
        bases: Vec::new(),
        unrecorded: String::new(),
    };
    let mut out = Vec::new();
    walk_chain(path, format, &roots, |_, b, fmt| {
        out.push((b.to_path_buf(), fmt));
        Ok(())
    })?;
    Ok(out)
}

/// Follows a layer's backing chain, checking each layer; `outside` decides on
/// each backing file outside the snapshot and the images (which it continues
/// into when it allows it).
fn walk_chain(
    path: &Path,
    format: DiskFormat,
    roots: &LayerRoots,
    mut outside: impl FnMut(&Path, &Path, DiskFormat) -> Result<(), DiskError>,
) -> Result<(), DiskError> {
    let refuse = |p: &Path, why: String| Err(DiskError::Layer(p.to_path_buf(), why));
    let inside =
        |r: &Path, b: &Path| std::fs::canonicalize(r).is_ok_and(|r| b.starts_with(&r) && b != r);
    let mut cur = (path.to_path_buf(), format);
    for _ in 0..MAX_CHAIN {
        let (p, fmt) = cur;
        let md = std::fs::symlink_metadata(&p).map_err(|e| DiskError::Read(p.clone(), e))?;
        if !md.file_type().is_file() {
            return refuse(
                &p,
                "it is not a regular file (a link, device, FIFO or socket)".into(),
            );
        }
        if fmt == DiskFormat::Raw {
            return Ok(());
        }
        let out = Command::new(qemu_img())
            .args(["info", "--output=json", "-U", "-f", "qcow2"])
            .arg(&p)
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => DiskError::NoQemuImg,
                _ => DiskError::Read(p.clone(), e),
            })?;
        if !out.status.success() {
            let msg = String::from_utf8_lossy(&out.stderr);
            return refuse(
                &p,
                format!("it is not a valid qcow2 image ({})", msg.trim()),
            );
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| DiskError::Layer(p.clone(), format!("qemu-img info: {e}")))?;
        if let Some(d) = v.pointer("/format-specific/data/data-file") {
            return refuse(&p, format!("it keeps its data in the external file {d}"));
        }
        let Some(backing) = v["backing-filename"].as_str() else {
            return Ok(());
        };
        // `json:` and protocol names (nbd:, http:, ...) are not files.
        if backing.contains(':') {
            return refuse(
                &p,
                format!("its backing file {backing:?} is not a plain path"),
            );
        }
        let dir = p.parent().unwrap_or(Path::new("/"));
        let b = std::fs::canonicalize(dir.join(backing)).map_err(|e| {
            DiskError::Layer(p.clone(), format!("its backing file {backing:?}: {e}"))
        })?;
        let bfmt = match v["backing-filename-format"].as_str() {
            Some("raw") => DiskFormat::Raw,
            Some("qcow2") => DiskFormat::Qcow2,
            other => {
                return refuse(
                    &p,
                    format!("its backing file's format is {other:?}, not raw or qcow2 declared"),
                )
            }
        };
        if inside(&roots.images, &b) {
            // One of the daemon's own images: read-only and trusted.
            let md = std::fs::symlink_metadata(&b).map_err(|e| DiskError::Read(b.clone(), e))?;
            return if md.file_type().is_file() {
                Ok(())
            } else {
                refuse(
                    &p,
                    format!("its backing file {} is not a regular file", b.display()),
                )
            };
        }
        if !inside(&roots.snapshot, &b) {
            outside(&p, &b, bfmt)?;
        }
        cur = (b, bfmt);
    }
    refuse(
        path,
        format!("its backing chain is deeper than {MAX_CHAIN} layers"),
    )
}

const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";

/// Tells raw from qcow2 by the file's magic.
pub fn detect_format(path: &Path) -> Result<DiskFormat, DiskError> {
    let mut f = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            DiskError::Missing(path.to_path_buf())
        } else {
            DiskError::Read(path.to_path_buf(), e)
        }
    })?;
    let mut magic = [0u8; 4];
    match f.read_exact(&mut magic) {
        Ok(()) if &magic == QCOW2_MAGIC => Ok(DiskFormat::Qcow2),
        Ok(()) => Ok(DiskFormat::Raw),
        // A file shorter than 4 bytes cannot be qcow2.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(DiskFormat::Raw),
        Err(e) => Err(DiskError::Read(path.to_path_buf(), e)),
    }
}

fn qemu_img() -> String {
    std::env::var("REBOUND_QEMU_IMG").unwrap_or_else(|_| "qemu-img".to_string())
}

/// Creates (replacing any old one) a qcow2 overlay at `overlay` backed by `base`.
pub fn create_overlay(base: &Path, overlay: &Path) -> Result<Disk, DiskError> {
    let base = std::fs::canonicalize(base).map_err(|e| DiskError::Read(base.to_path_buf(), e))?;
    let fmt = detect_format(&base)?;
    create_overlay_as(&base, fmt, overlay)
}

/// Like [`create_overlay`], with the base's format given rather than probed (a
/// snapshot's disk, which [`check_layer`] has checked as that format).
pub fn create_overlay_as(base: &Path, fmt: DiskFormat, overlay: &Path) -> Result<Disk, DiskError> {
    let base = std::fs::canonicalize(base).map_err(|e| DiskError::Read(base.to_path_buf(), e))?;
    let _ = std::fs::remove_file(overlay);
    let out = Command::new(qemu_img())
        .args(["create", "-q", "-f", "qcow2", "-b"])
        .arg(&base)
        .args(["-F", fmt.as_str()])
        .arg(overlay)
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DiskError::NoQemuImg,
            _ => DiskError::Overlay(base.clone(), e.to_string()),
        })?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        let line = msg.lines().last().unwrap_or("failed").to_string();
        return Err(DiskError::Overlay(base, line));
    }
    Ok(Disk::file(overlay, DiskFormat::Qcow2))
}

/// A raw copy of `base` at `dest` (replacing any old one): a reflink where the
/// filesystem has them, else a sparse copy, so only written blocks take space.
pub fn raw_copy(base: &Path, dest: &Path) -> Result<Disk, DiskError> {
    if detect_format(base)? != DiskFormat::Raw {
        return Err(DiskError::NotRaw(base.to_path_buf()));
    }
    let _ = std::fs::remove_file(dest);
    let out = Command::new("cp")
        .args(["--reflink=auto", "--sparse=always"])
        .arg(base)
        .arg(dest)
        .output()
        .map_err(|e| DiskError::Copy(base.into(), dest.into(), e.to_string()))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(DiskError::Copy(base.into(), dest.into(), msg));
    }
    Ok(Disk::file(dest, DiskFormat::Raw))
}

/// The VM's existing overlay, used as it is (a recovery VM sees the crashed VM's data).
pub fn existing_overlay(overlay: &Path) -> Result<Disk, DiskError> {
    match detect_format(overlay)? {
        DiskFormat::Qcow2 => Ok(Disk::file(overlay, DiskFormat::Qcow2)),
        DiskFormat::Raw => Err(DiskError::Overlay(
            overlay.to_path_buf(),
            "the VM's disk copy is not qcow2".into(),
        )),
    }
}

/// A disk the user brought, used as is.
pub fn user_disk(path: &Path) -> Result<Disk, DiskError> {
    let format = detect_format(path)?;
    let path = std::fs::canonicalize(path).map_err(|e| DiskError::Read(path.to_path_buf(), e))?;
    Ok(Disk::file(path, format))
}

/// A disk of `size` bytes: made as a sparse raw file when missing (never replacing one
/// made meanwhile), used as is when it exists with that size.
pub fn sized_disk(path: &Path, size: u64) -> Result<Disk, DiskError> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(f) => {
            if let Err(e) = f.set_len(size) {
                let _ = std::fs::remove_file(path);
                return Err(DiskError::Create(path.to_path_buf(), e));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if detect_format(path)? != DiskFormat::Raw {
                return Err(DiskError::SizeOfQcow2(path.to_path_buf()));
            }
            let have = std::fs::metadata(path)
                .map_err(|e| DiskError::Read(path.to_path_buf(), e))?
                .len();
            if have != size {
                return Err(DiskError::SizeMismatch(path.to_path_buf(), have, size));
            }
        }
        Err(e) => return Err(DiskError::Create(path.to_path_buf(), e)),
    }
    user_disk(path)
}

/// The size of a file for a virtio-pmem device, MiB: raw, a multiple of 2 MiB (the
/// device maps it in huge-page-sized pieces).
pub fn pmem_size_mib(path: &Path) -> Result<u64, DiskError> {
    if detect_format(path)? != DiskFormat::Raw {
        return Err(DiskError::NotRaw(path.to_path_buf()));
    }
    let len = std::fs::metadata(path)
        .map_err(|e| DiskError::Read(path.to_path_buf(), e))?
        .len();
    if len == 0 || len % (2 << 20) != 0 {
        return Err(DiskError::PmemSize(path.to_path_buf(), len));
    }
    Ok(len >> 20)
}

#[cfg(test)]
mod layer_tests {
    use super::*;

    fn qemu_img_create(args: &[&str]) {
        let out = Command::new("qemu-img")
            .args(["create", "-q"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn snapshot_layers_reach_only_the_snapshot_and_the_images() {
        let t = tempfile::tempdir().unwrap();
        let (snap, images, elsewhere) = (
            t.path().join("snap"),
            t.path().join("images"),
            t.path().join("else"),
        );
        for d in [&snap, &images, &elsewhere] {
            std::fs::create_dir(d).unwrap();
        }
        let roots = LayerRoots {
            snapshot: snap.clone(),
            images: images.clone(),
            bases: Vec::new(),
            unrecorded: "and this daemon did not write the snapshot".into(),
        };
        let s = |n: &str| snap.join(n).to_str().unwrap().to_string();
        std::fs::write(images.join("base.img"), vec![1u8; 1 << 20]).unwrap();
        std::fs::write(elsewhere.join("secret"), vec![2u8; 1 << 20]).unwrap();
        // Good: raw; qcow2 over the image store; qcow2 over a qcow2 of the snapshot.
        std::fs::write(snap.join("raw.img"), b"QFI\xfbnot really qcow2").unwrap();
        check_layer(&snap.join("raw.img"), DiskFormat::Raw, &roots).unwrap();
        let base = images.join("base.img");
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-b",
            base.to_str().unwrap(),
            "-F",
            "raw",
            &s("over-image.qcow2"),
        ]);
        check_layer(&snap.join("over-image.qcow2"), DiskFormat::Qcow2, &roots).unwrap();
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-b",
            "over-image.qcow2",
            "-F",
            "qcow2",
            &s("chain.qcow2"),
        ]);
        check_layer(&snap.join("chain.qcow2"), DiskFormat::Qcow2, &roots).unwrap();
        // Refused: a backing file elsewhere (directly or down the chain), a protocol,
        // an external data file, a link, a raw file declared qcow2.
        let secret = elsewhere.join("secret");
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-b",
            secret.to_str().unwrap(),
            "-F",
            "raw",
            &s("out.qcow2"),
        ]);
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-b",
            "out.qcow2",
            "-F",
            "qcow2",
            &s("deep.qcow2"),
        ]);
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-u",
            "-b",
            "nbd:localhost:10809",
            "-F",
            "raw",
            &s("nbd.qcow2"),
            "1M",
        ]);
        let data = elsewhere.join("data.raw");
        qemu_img_create(&[
            "-f",
            "qcow2",
            "-o",
            &format!("data_file={}", data.display()),
            &s("ext.qcow2"),
            "1M",
        ]);
        std::os::unix::fs::symlink(&secret, snap.join("link.img")).unwrap();
        for (file, fmt, why) in [
            ("out.qcow2", DiskFormat::Qcow2, "did not write the snapshot"),
            ("deep.qcow2", DiskFormat::Qcow2, "outside the snapshot"),
            ("nbd.qcow2", DiskFormat::Qcow2, "not a plain path"),
            ("ext.qcow2", DiskFormat::Qcow2, "external file"),
            ("link.img", DiskFormat::Raw, "not a regular file"),
            ("raw.img", DiskFormat::Qcow2, "not a valid qcow2"),
        ] {
            let e = check_layer(&snap.join(file), fmt, &roots)
                .unwrap_err()
                .to_string();
            assert!(e.contains(why), "{file}: {e}");
        }
    }

    #[test]
    fn a_layer_reads_through_another_snapshot_only_where_its_own_record_says() {
        let t = tempfile::tempdir().unwrap();
        let d = |n: &str| {
            let p = t.path().join(n);
            std::fs::create_dir(&p).unwrap();
            std::fs::canonicalize(p).unwrap()
        };
        let (images, s1, s2, s3) = (d("images"), d("s1"), d("s2"), d("s3"));
        std::fs::write(images.join("base.img"), vec![1u8; 1 << 20]).unwrap();
        // A chain as snapshots of restored VMs leave it: s3 over s2 over s1 over
        // the image.
        let layer = |dir: &Path, base: &Path, fmt: &str| {
            let f = dir.join("disk-disk0.qcow2");
            let (f_s, b_s) = (f.to_str().unwrap(), base.to_str().unwrap());
            qemu_img_create(&["-f", "qcow2", "-b", b_s, "-F", fmt, f_s]);
            f
        };
        let l1 = layer(&s1, &images.join("base.img"), "raw");
        let l2 = layer(&s2, &l1, "qcow2");
        let l3 = layer(&s3, &l2, "qcow2");
        let q = DiskFormat::Qcow2;
        // What the daemon records when it writes each: every file outside down the
        // chain, the images excluded.
        assert_eq!(external_bases(&l1, q, &s1, &images).unwrap(), []);
        assert_eq!(
            external_bases(&l3, q, &s3, &images).unwrap(),
            [(l2.clone(), q), (l1.clone(), q)]
        );
        let roots = |snapshot: &Path, bases: Vec<(PathBuf, DiskFormat)>| LayerRoots {
            snapshot: snapshot.to_path_buf(),
            images: images.clone(),
            bases,
            unrecorded: "UNRECORDED".into(),
        };
        check_layer(&l3, q, &roots(&s3, vec![(l2.clone(), q), (l1.clone(), q)])).unwrap();
        // A record that lacks a step down the chain, names another format, or
        // belongs to another snapshot: refused.
        for (r, why) in [
            (roots(&s3, vec![(l2.clone(), q)]), "UNRECORDED"),
            (roots(&s3, vec![]), "UNRECORDED"),
            (
                roots(&s3, vec![(l2.clone(), DiskFormat::Raw), (l1.clone(), q)]),
                "was recorded as raw",
            ),
        ] {
            let e = check_layer(&l3, q, &r).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        // A crafted snapshot borrowing s1's disk, with s2's record: refused.
        let s4 = d("s4");
        let l4 = layer(&s4, &l1, "qcow2");
        let e = check_layer(&l4, q, &roots(&s4, vec![]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(&format!("{} lies outside", l1.display())), "{e}");
        // A recorded base whose own file was changed to lead elsewhere: refused
        // where it leads, though the first step was recorded.
        let other = d("other");
        std::fs::write(other.join("secret"), vec![2u8; 1 << 20]).unwrap();
        std::fs::remove_file(&l1).unwrap();
        layer(&s1, &other.join("secret"), "raw");
        let e = check_layer(&l2, q, &roots(&s2, vec![(l1.clone(), q)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("secret lies outside"), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pmem_files_are_whole_2mib_raw() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p");
        std::fs::File::create(&p).unwrap().set_len(4 << 20).unwrap();
        assert_eq!(pmem_size_mib(&p).unwrap(), 4);
        for bad in [0, 3 << 20, (4 << 20) + 512] {
            std::fs::File::create(&p).unwrap().set_len(bad).unwrap();
            let e = pmem_size_mib(&p).unwrap_err();
            assert!(matches!(e, DiskError::PmemSize(_, n) if n == bad), "{e}");
        }
        std::fs::write(&p, b"QFI\xfb\0\0\0\x03").unwrap();
        assert!(matches!(pmem_size_mib(&p), Err(DiskError::NotRaw(_))));
    }

    #[test]
    fn formats() {
        let d = tempfile::tempdir().unwrap();
        let raw = d.path().join("raw");
        std::fs::write(&raw, vec![0u8; 4096]).unwrap();
        assert_eq!(detect_format(&raw).unwrap(), DiskFormat::Raw);
        let short = d.path().join("short");
        std::fs::write(&short, b"QF").unwrap();
        assert_eq!(detect_format(&short).unwrap(), DiskFormat::Raw);
        let q = d.path().join("q");
        std::fs::write(&q, b"QFI\xfb\0\0\0\x03").unwrap();
        assert_eq!(detect_format(&q).unwrap(), DiskFormat::Qcow2);
        assert!(matches!(
            detect_format(&d.path().join("none")),
            Err(DiskError::Missing(_))
        ));
    }

    /// Runs a qemu-utils tool; `make test` installs them, so a missing one fails.
    fn tool(name: &str, args: &[&str]) -> Vec<u8> {
        let out = Command::new(name)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{name} must be installed (qemu-utils): {e}"));
        assert!(
            out.status.success(),
            "{name} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[test]
    fn overlay_reads_base_and_keeps_it_clean() {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().join("base.raw");
        std::fs::write(&base, vec![7u8; 1 << 20]).unwrap();
        let ov = d.path().join("ov.qcow2");
        let disk = create_overlay(&base, &ov).unwrap();
        assert_eq!(disk, Disk::file(&ov, DiskFormat::Qcow2));
        assert_eq!(detect_format(&ov).unwrap(), DiskFormat::Qcow2);
        let ovs = ov.to_str().unwrap();
        // Write through the overlay, then read the whole disk back through it.
        tool(
            "qemu-io",
            &["-f", "qcow2", "-c", "write -P 0x55 4096 4096", ovs],
        );
        let flat = d.path().join("flat.raw");
        // The whole disk as a guest reads it through the overlay.
        let read_through = || {
            tool(
                "qemu-img",
                &[
                    "convert",
                    "-f",
                    "qcow2",
                    "-O",
                    "raw",
                    ovs,
                    flat.to_str().unwrap(),
                ],
            );
            std::fs::read(&flat).unwrap()
        };
        let got = read_through();
        assert_eq!(got.len(), 1 << 20);
        assert!(
            got[..4096].iter().all(|&b| b == 7),
            "base bytes read through"
        );
        assert!(
            got[4096..8192].iter().all(|&b| b == 0x55),
            "the write landed"
        );
        assert!(got[8192..].iter().all(|&b| b == 7));
        // The base is untouched.
        assert!(std::fs::read(&base).unwrap().iter().all(|&b| b == 7));
        // Recreating replaces the overlay (the write is gone) instead of failing.
        create_overlay(&base, &ov).unwrap();
        assert!(read_through().iter().all(|&b| b == 7));
        assert!(matches!(
            create_overlay(&d.path().join("nope"), &ov),
            Err(DiskError::Read(..))
        ));
    }
}
