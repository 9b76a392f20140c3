//! Who can read what: everything Rebound creates for a VM is its owner's alone.
//!
//! Guest RAM holds the guest's secrets (keys, passwords, session keys), and so do its
//! disks, consoles, dumps and snapshots. Rebound therefore creates every directory
//! 0700 and every file 0600, at creation (never loosened and tightened afterwards), and
//! runs with umask 077, which QEMU and every other child inherits, so the files QEMU
//! creates (the RAM file, sockets, the serial log) are private too. State left by
//! older versions is tightened once when the daemon starts ([`tighten_tree`]).
//! The rules live here, in one place; everything else calls these functions.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every directory Rebound creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file Rebound creates.
pub const FILE_MODE: u32 = 0o600;
/// The process umask: nothing for group or others.
pub const UMASK: u32 = 0o077;

/// Sets this process's umask to [`UMASK`]; children (QEMU) inherit it.
pub fn restrict_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(UMASK as _));
}

/// Creates `path` and its missing parents with mode 0700. An existing directory is
/// left as it is (see [`tighten_tree`]).
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// Why a directory that must be this user's alone is refused.
#[derive(Debug, thiserror::Error)]
pub enum OwnDirError {
    #[error("cannot create {0}")]
    Create(std::path::PathBuf, #[source] io::Error),
    #[error("{0} is a symbolic link: it must be a directory of this user's, mode 0700")]
    Symlink(std::path::PathBuf),
    #[error("{0} is not a directory")]
    NotDir(std::path::PathBuf),
    #[error("{0} belongs to uid {1}, not to this user (uid {2}): another user made it first; remove it or choose another path")]
    Owner(std::path::PathBuf, u32, u32),
    #[error("cannot make {0} private")]
    Chmod(std::path::PathBuf, #[source] io::Error),
}

/// Makes sure `path` is a directory of this user's that nobody else can enter:
/// created 0700 when missing; refused when it is a symbolic link, not a directory,
/// or another user's (a predictable path in a shared directory such as /dev/shm can
/// be made first by anyone); tightened to 0700 when it is ours but open.
pub fn own_dir(path: &Path) -> Result<(), OwnDirError> {
    use std::os::unix::fs::MetadataExt;
    if let Some(parent) = path.parent() {
        create_dir_all(parent).map_err(|e| OwnDirError::Create(parent.to_path_buf(), e))?;
    }
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(OwnDirError::Create(path.to_path_buf(), e)),
    }
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| OwnDirError::Create(path.to_path_buf(), e))?;
    if meta.file_type().is_symlink() {
        return Err(OwnDirError::Symlink(path.to_path_buf()));
    }
    if !meta.is_dir() {
        return Err(OwnDirError::NotDir(path.to_path_buf()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(OwnDirError::Owner(path.to_path_buf(), meta.uid(), me));
    }
    if is_open(meta.mode()) {
        std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE))
            .map_err(|e| OwnDirError::Chmod(path.to_path_buf(), e))?;
    }
    Ok(())
}

/// Opens `path` for writing with mode 0600 if it is created: `append` or truncate.
pub fn create_file(path: &Path, append: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).mode(FILE_MODE);
    if append {
        o.append(true);
    } else {
        o.truncate(true);
    }
    o.open(path)
}

/// Like [`create_file`], but the file must not exist yet.
pub fn create_new_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Writes `data` to `path` atomically (a private temporary file renamed over it), so a
/// crash never leaves half a file and the file is never readable by others.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut f = create_new_file(&tmp)?;
    f.write_all(data)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Whether a mode lets group or others in.
pub fn is_open(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// Removes group and other permissions from `root` and everything below it (without
/// following symbolic links); returns how many entries were changed. Entries that
/// vanish meanwhile (a VM stopping) are skipped.
pub fn tighten_tree(root: &Path) -> io::Result<usize> {
    let mut changed = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if is_open(mode) {
            match std::fs::set_permissions(&p, Permissions::from_mode(mode & !0o077)) {
                Ok(()) => changed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        if meta.is_dir() {
            match std::fs::read_dir(&p) {
                Ok(rd) => stack.extend(rd.flatten().map(|e| e.path())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(changed)
}

/// Applies the user's `--mode` (octal, e.g. `640`) to a file created private, for
/// outputs a user asked to share; `None` keeps 0600.
pub fn apply_mode(path: &Path, mode: Option<u32>) -> io::Result<()> {
    match mode {
        Some(m) => std::fs::set_permissions(path, Permissions::from_mode(m & 0o777)),
        None => Ok(()),
    }
}

/// Parses an octal mode such as `600` or `0640`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "malformed mode {s:?}: expected octal permissions such as 600 or 640"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o777
    }

    #[test]
    fn own_dir_refuses_links_files_and_other_users_dirs() {
        let t = tempfile::tempdir().unwrap();
        let fresh = t.path().join("a/run");
        own_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, Permissions::from_mode(0o755)).unwrap();
        own_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        assert!(matches!(own_dir(&link), Err(OwnDirError::Symlink(_))));
        let file = t.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(own_dir(&file), Err(OwnDirError::NotDir(_))));
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test gives a directory to another user: run it as root, as make test does"
        );
        let theirs = t.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = own_dir(&theirs).unwrap_err();
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
    }

    #[test]
    fn created_private_whatever_the_umask() {
        // The umask is process-wide: this is the only test in the crate that reads it
        // back, and it restores the old value.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("a/b/c");
        create_dir_all(&sub).unwrap();
        for p in [d.path().join("a"), d.path().join("a/b"), sub.clone()] {
            assert_eq!(mode(&p), 0o700, "{}", p.display());
        }
        let f = sub.join("f");
        create_file(&f, false).unwrap();
        assert_eq!(mode(&f), 0o600);
        let g = sub.join("g");
        write_atomic(&g, b"x").unwrap();
        assert_eq!(mode(&g), 0o600);
        assert_eq!(std::fs::read(&g).unwrap(), b"x");
        nix::sys::stat::umask(old);
    }

    #[test]
    fn tightening_reaches_every_level_and_counts() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("home");
        std::fs::create_dir_all(root.join("vms/a")).unwrap();
        std::fs::write(root.join("vms/a/vm.json"), b"{}").unwrap();
        std::fs::write(root.join("ok"), b"").unwrap();
        for (p, m) in [
            ("", 0o755),
            ("vms", 0o755),
            ("vms/a", 0o750),
            ("vms/a/vm.json", 0o644),
            ("ok", 0o600),
        ] {
            std::fs::set_permissions(root.join(p), Permissions::from_mode(m)).unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", root.join("link")).unwrap();
        let before = mode(Path::new("/etc/passwd"));
        assert_eq!(tighten_tree(&root).unwrap(), 4);
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("vms/a")), 0o700);
        assert_eq!(mode(&root.join("vms/a/vm.json")), 0o600);
        // Links are not followed.
        assert_eq!(mode(Path::new("/etc/passwd")), before);
        assert_eq!(tighten_tree(&root).unwrap(), 0);
        assert_eq!(tighten_tree(&d.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("640"), Ok(0o640));
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert!(parse_mode("9").is_err());
        assert!(parse_mode("1777").is_err());
        assert!(parse_mode("rw").is_err());
    }
}
