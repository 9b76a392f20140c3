//! The initramfs: busybox and its applet links, our `/init` and agent, and the kernel
//! modules the init loads with their dependency closure, indexed by `depmod` so busybox
//! `modprobe` finds them. Archived with `cpio -o -H newc` (owner root) and gzip.

use std::collections::BTreeSet;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::modules::{parse_builtin, ModDeps, ModulesError};
use crate::tools::{run, ToolError, Tools};

/// Modules `guest/init` loads. crc32c_generic is ext4's soft dependency (metadata
/// checksums), which modules.dep does not list.
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_net",
    "virtio_console",
    "virtio_balloon",
    "virtio_mem",
    "pvpanic_mmio",
    "pvpanic_pci",
    "qemu_fw_cfg",
    "i6300esb",
    "crc32c_generic",
    "ext4",
    // virtio-pmem (loaded only for a pmem data disk): the nvdimm bus, the virtio
    // driver and the pmem block driver that DAX mounts use.
    "libnvdimm",
    "nd_virtio",
    "virtio_pmem",
    "nd_btt",
    "nd_pmem",
];

/// Errors assembling the initramfs.
#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error("cannot use {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Modules(#[from] ModulesError),
    #[error("busybox --list-full printed no applets")]
    NoApplets,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InitramfsError + '_ {
    move |err| InitramfsError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// What goes into the initramfs.
pub struct Inputs<'a> {
    /// A reduced module tree made by [`reduce_modules`] (has lib/modules/<release>).
    pub modules_root: &'a Path,
    /// The static busybox binary.
    pub busybox: &'a Path,
    pub agent: &'a Path,
    pub init: &'a str,
    /// The eviction-notice module (`guest/evict`), put at [`crate::evictmod::KO_PATH`].
    pub evict_module: Option<&'a Path>,
}

fn copy_exec(from: &Path, to: &Path) -> Result<(), InitramfsError> {
    std::fs::copy(from, to).map_err(io(from))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).map_err(io(to))
}

/// Builds the tree under `root`.
pub fn populate(inp: &Inputs, root: &Path) -> Result<(), InitramfsError> {
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "data", "etc",
    ] {
        let p = root.join(d);
        std::fs::create_dir_all(&p).map_err(io(&p))?;
    }
    copy_exec(inp.busybox, &root.join("bin/busybox"))?;
    let list = run(std::process::Command::new(inp.busybox).arg("--list-full"))?;
    let mut applets = 0;
    for a in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
        if a.is_empty() || a.starts_with('/') || a.split('/').any(|c| c == ".." || c.is_empty()) {
            continue;
        }
        let link = root.join(a);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        symlink("/bin/busybox", &link).map_err(io(&link))?;
        applets += 1;
    }
    if applets == 0 {
        return Err(InitramfsError::NoApplets);
    }
    let init = root.join("init");
    std::fs::write(&init, inp.init).map_err(io(&init))?;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).map_err(io(&init))?;
    copy_exec(inp.agent, &root.join("sbin/rebound-agent"))?;
    if let Some(ko) = inp.evict_module {
        let to = root.join(crate::evictmod::KO_PATH);
        let dir = to.parent().unwrap_or(root);
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        std::fs::copy(ko, &to).map_err(io(ko))?;
    }
    copy_tree(&inp.modules_root.join("lib"), &root.join("lib"))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), InitramfsError> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for e in std::fs::read_dir(from).map_err(io(from))? {
        let e = e.map_err(io(from))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().map_err(io(&src))?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst).map_err(io(&src))?;
        }
    }
    Ok(())
}

/// Makes `dst/lib/modules/<release>` hold the modules in [`MODULES`] and their dependency
/// closure from the unpacked kernel package at `kernel_root`, indexed by depmod. Returns
/// the module files chosen.
pub fn reduce_modules(
    tools: &Tools,
    kernel_root: &Path,
    release: &str,
    dst: &Path,
) -> Result<BTreeSet<String>, InitramfsError> {
    let src = kernel_root.join("lib/modules").join(release);
    // Debian's package leaves modules.dep to its postinst: index the full tree first.
    if !src.join("modules.dep").is_file() {
        run(tools.cmd("depmod").arg("-b").arg(kernel_root).arg(release))?;
    }
    let dep_path = src.join("modules.dep");
    let deps = ModDeps::parse(&std::fs::read_to_string(&dep_path).map_err(io(&dep_path))?)?;
    let builtin = std::fs::read_to_string(src.join("modules.builtin"))
        .map(|t| parse_builtin(&t))
        .unwrap_or_default();
    let chosen = deps.closure(MODULES, &builtin)?;
    let out = dst.join("lib/modules").join(release);
    for m in &chosen {
        let to = out.join(m);
        let parent = to.parent().unwrap_or(&out);
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        std::fs::copy(src.join(m), &to).map_err(io(&src.join(m)))?;
    }
    for f in [
        "modules.order",
        "modules.builtin",
        "modules.builtin.modinfo",
    ] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), out.join(f)).map_err(io(&src.join(f)))?;
        }
    }
    run(tools.cmd("depmod").arg("-b").arg(dst).arg(release))?;
    Ok(chosen)
}

fn walk(base: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<(), InitramfsError> {
    let dir = base.join(rel);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(io(&dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io(&dir))?;
    entries.sort();
    for name in entries {
        let r = rel.join(&name);
        out.push(r.clone());
        let meta = base.join(&r).symlink_metadata().map_err(io(&r))?;
        if meta.is_dir() {
            walk(base, &r, out)?;
        }
    }
    Ok(())
}

/// Archives `root` into a gzip-compressed newc cpio at `out`.
pub fn archive(tools: &Tools, root: &Path, out: &Path) -> Result<(), InitramfsError> {
    let mut files = Vec::new();
    walk(root, Path::new(""), &mut files)?;
    let mut list = Vec::new();
    for f in &files {
        list.extend_from_slice(f.as_os_str().as_encoded_bytes());
        list.push(b'\n');
    }
    let mut child = tools
        .cmd("cpio")
        .args(["-o", "-H", "newc", "-R", "0:0", "--quiet", "--reproducible"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| ToolError::Spawn {
            tool: "cpio".into(),
            err,
        })?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let feeder = std::thread::spawn(move || stdin.write_all(&list));
    let file = std::fs::File::create(out).map_err(io(out))?;
    let mut gz = GzEncoder::new(BufWriter::new(file), Compression::new(6));
    let mut stdout = child.stdout.take().expect("piped stdout");
    std::io::copy(&mut stdout, &mut gz).map_err(io(out))?;
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(|err| ToolError::Spawn {
        tool: "cpio".into(),
        err,
    })?;
    let fed = feeder.join().map(|r| r.is_ok()).unwrap_or(false);
    if !status.success() || !fed {
        return Err(ToolError::Failed {
            tool: "cpio".into(),
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
        }
        .into());
    }
    let w = gz.finish().map_err(io(out))?;
    w.into_inner()
        .map_err(|e| InitramfsError::Io {
            path: out.to_path_buf(),
            err: e.into_error(),
        })?
        .sync_all()
        .map_err(io(out))?;
    Ok(())
}
