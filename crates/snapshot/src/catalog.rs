//! The snapshots a daemon wrote: their canonical directories, one per line, in one
//! file of the daemon's home (0600, appended to only by the daemon). A cluster peer
//! may have a daemon restore a snapshot listed here or one in its snapshot store,
//! and nothing else: a peer cannot point a restore at any directory of the host.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The most bytes of catalog read back (about 40,000 snapshot paths).
const MAX_BYTES: u64 = 16 << 20;

/// Errors reading or extending the catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot resolve snapshot directory {0}")]
    Resolve(PathBuf, #[source] io::Error),
    #[error("cannot read the snapshot catalog {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("cannot add to the snapshot catalog {0}")]
    Write(PathBuf, #[source] io::Error),
    #[error("the snapshot catalog {0} is larger than {MAX_BYTES} bytes")]
    TooLarge(PathBuf),
}

/// One daemon's list of the snapshots it wrote.
#[derive(Debug, Clone)]
pub struct Catalog {
    path: PathBuf,
}

impl Catalog {
    pub fn new(path: PathBuf) -> Catalog {
        Catalog { path }
    }

    /// Adds `dir` (canonicalized) unless it is listed already.
    pub fn record(&self, dir: &Path) -> Result<(), CatalogError> {
        let dir = canonical(dir)?;
        if self.lists(&dir)? {
            return Ok(());
        }
        let mut line = dir.as_os_str().as_encoded_bytes().to_vec();
        if line.contains(&b'\n') {
            // A name with a newline cannot be listed; it is just never found.
            return Ok(());
        }
        line.push(b'\n');
        let werr = |e| CatalogError::Write(self.path.clone(), e);
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(werr)?;
        // One write of a line under PIPE_BUF-sized paths: appends do not interleave.
        f.write_all(&line).map_err(werr)
    }

    /// Every directory listed (canonical when recorded).
    pub fn dirs(&self) -> Result<Vec<PathBuf>, CatalogError> {
        use std::os::unix::ffi::OsStrExt;
        Ok(self
            .read()?
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)))
            .collect())
    }

    /// Whether `dir` (canonicalized) is listed.
    pub fn contains(&self, dir: &Path) -> Result<bool, CatalogError> {
        self.lists(&canonical(dir)?)
    }

    fn lists(&self, dir: &Path) -> Result<bool, CatalogError> {
        let text = self.read()?;
        let want = dir.as_os_str().as_encoded_bytes();
        Ok(text.split(|&b| b == b'\n').any(|l| l == want))
    }

    /// The catalog's bytes (none when it does not exist yet).
    fn read(&self) -> Result<Vec<u8>, CatalogError> {
        let rerr = |e| CatalogError::Read(self.path.clone(), e);
        let f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(rerr(e)),
        };
        let mut text = Vec::new();
        f.take(MAX_BYTES + 1).read_to_end(&mut text).map_err(rerr)?;
        if text.len() as u64 > MAX_BYTES {
            return Err(CatalogError::TooLarge(self.path.clone()));
        }
        Ok(text)
    }
}

fn canonical(dir: &Path) -> Result<PathBuf, CatalogError> {
    std::fs::canonicalize(dir).map_err(|e| CatalogError::Resolve(dir.to_path_buf(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_what_was_recorded_under_any_spelling_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir_all(a.join("x")).unwrap();
        std::fs::create_dir(&b).unwrap();
        let c = Catalog::new(t.path().join("catalog"));
        assert!(!c.contains(&a).unwrap());
        c.record(&a).unwrap();
        c.record(&a.join("x/..")).unwrap();
        assert!(c.contains(&a).unwrap());
        assert!(c.contains(&a.join("x/..")).unwrap());
        assert!(!c.contains(&b).unwrap());
        assert!(!c.contains(&a.join("x")).unwrap());
        // A link to a listed directory is that directory; a prefix is not.
        std::os::unix::fs::symlink(&a, t.path().join("link")).unwrap();
        assert!(c.contains(&t.path().join("link")).unwrap());
        let text = std::fs::read_to_string(t.path().join("catalog")).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert_eq!(c.dirs().unwrap(), [std::fs::canonicalize(&a).unwrap()]);
        assert!(c.contains(&t.path().join("missing")).is_err());
    }
}
