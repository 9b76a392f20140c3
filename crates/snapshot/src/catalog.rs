//! The snapshots a daemon wrote, in one file of the daemon's home (0600, appended to
//! only by the daemon), one line per snapshot written. A cluster peer may have a
//! daemon restore a snapshot listed here or one in its snapshot store, and nothing
//! else: a peer cannot point a restore at any directory of the host.
//!
//! Each line also records the files outside the snapshot directory its disk layers
//! read through (their backing files), as the daemon found them when it wrote the
//! snapshot: a snapshot of a restored VM keeps the earlier snapshot's disk copy as
//! its base, by reference. A restore lets a layer back onto a file outside the
//! snapshot and the daemon's images only if it is one recorded here for exactly
//! that snapshot, so a snapshot dropped into the store cannot borrow another's disk.
//!
//! Line formats (a line ends with `\n`; the last entry for a directory wins):
//! - version 1 (older daemons): the canonical directory, bytes as they are. It
//!   records no bases.
//! - version 2: a JSON object `{"v":2,"dir":DIR,"bases":[{"file":FILE,"format":"raw"|"qcow2"}]}`,
//!   every path canonical and absolute.
//!
//! Reading back is bounded (`MAX_BYTES` in all, `MAX_LINE` a line); a line that is
//! not one of these (torn by a crash, too long, another version) lists nothing.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The most bytes of catalog read back (about 40,000 snapshot paths).
const MAX_BYTES: u64 = 16 << 20;
/// The longest line read back: a directory and a few dozen bases.
const MAX_LINE: usize = 64 << 10;
/// The line version this daemon writes.
const VERSION: u32 = 2;

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

/// A file outside a snapshot that one of its disk layers reads through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Base {
    /// Canonical absolute path.
    pub file: String,
    /// `raw` or `qcow2`, as the layer above it declares.
    pub format: String,
}

/// What the catalog says about one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    /// This daemon did not write it.
    NotListed,
    /// Listed by an older daemon, which recorded no bases.
    WithoutBases,
    /// Written by this daemon, its layers reading through these files outside it.
    Bases(Vec<Base>),
}

/// One version-2 line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    v: u32,
    dir: String,
    bases: Vec<Base>,
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

    /// Adds `dir` (canonicalized) with the bases its layers read through, unless it
    /// is listed so already.
    pub fn record(&self, dir: &Path, bases: &[Base]) -> Result<(), CatalogError> {
        let dir = canonical(dir)?;
        let text = self.read()?;
        if listing_in(&text, &dir) == Listing::Bases(bases.to_vec()) {
            return Ok(());
        }
        let mut line = match dir.to_str() {
            Some(d) => serde_json::to_vec(&Line {
                v: VERSION,
                dir: d.to_string(),
                bases: bases.to_vec(),
            })
            .expect("a catalog line serializes"),
            // Not JSON text: listed without bases (a restore then allows none).
            None => dir.as_os_str().as_bytes().to_vec(),
        };
        if line.contains(&b'\n') || line.len() > MAX_LINE {
            // It could not be read back: it is just never found.
            return Ok(());
        }
        line.push(b'\n');
        if text.last().is_some_and(|&b| b != b'\n') {
            // After a line a crash tore: that one stays unread, this one whole.
            line.insert(0, b'\n');
        }
        let werr = |e| CatalogError::Write(self.path.clone(), e);
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(werr)?;
        // One write of a whole line: O_APPEND writes to a file do not interleave.
        f.write_all(&line).map_err(werr)
    }

    /// Every directory listed (canonical when recorded).
    pub fn dirs(&self) -> Result<Vec<PathBuf>, CatalogError> {
        let mut out: Vec<PathBuf> = Vec::new();
        for (dir, _) in parse(&self.read()?) {
            if !out.contains(&dir) {
                out.push(dir);
            }
        }
        Ok(out)
    }

    /// Whether `dir` (canonicalized) is listed.
    pub fn contains(&self, dir: &Path) -> Result<bool, CatalogError> {
        Ok(self.listing(dir)? != Listing::NotListed)
    }

    /// What the catalog recorded for `dir` (canonicalized) when the daemon wrote it.
    pub fn listing(&self, dir: &Path) -> Result<Listing, CatalogError> {
        self.listing_of(&canonical(dir)?)
    }

    fn listing_of(&self, dir: &Path) -> Result<Listing, CatalogError> {
        Ok(listing_in(&self.read()?, dir))
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

/// The catalog's entries in file order: a directory and its bases (`None`: a
/// version-1 line). Lines that are none of the known forms are skipped, and so is
/// a last line without its `\n` (a write torn by a crash).
fn parse(text: &[u8]) -> Vec<(PathBuf, Option<Vec<Base>>)> {
    let whole = match text.iter().rposition(|&b| b == b'\n') {
        Some(end) => &text[..end],
        None => return Vec::new(),
    };
    whole
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty() && l.len() <= MAX_LINE)
        .filter_map(|l| match l[0] {
            b'/' => Some((PathBuf::from(std::ffi::OsStr::from_bytes(l)), None)),
            b'{' => {
                let line: Line = serde_json::from_slice(l).ok()?;
                let absolute = |p: &str| p.starts_with('/');
                let known = |f: &str| f == "raw" || f == "qcow2";
                (line.v == VERSION
                    && absolute(&line.dir)
                    && line
                        .bases
                        .iter()
                        .all(|b| absolute(&b.file) && known(&b.format)))
                .then(|| (PathBuf::from(line.dir), Some(line.bases)))
            }
            _ => None,
        })
        .collect()
}

/// The last entry `text` holds for `dir`.
fn listing_in(text: &[u8], dir: &Path) -> Listing {
    match parse(text).into_iter().rfind(|(d, _)| d == dir) {
        None => Listing::NotListed,
        Some((_, None)) => Listing::WithoutBases,
        Some((_, Some(b))) => Listing::Bases(b),
    }
}

fn canonical(dir: &Path) -> Result<PathBuf, CatalogError> {
    std::fs::canonicalize(dir).map_err(|e| CatalogError::Resolve(dir.to_path_buf(), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(file: &str, format: &str) -> Base {
        Base {
            file: file.into(),
            format: format.into(),
        }
    }

    #[test]
    fn lists_what_was_recorded_under_any_spelling_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir_all(a.join("x")).unwrap();
        std::fs::create_dir(&b).unwrap();
        let c = Catalog::new(t.path().join("catalog"));
        assert!(!c.contains(&a).unwrap());
        c.record(&a, &[]).unwrap();
        c.record(&a.join("x/.."), &[]).unwrap();
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

    #[test]
    fn bases_are_recorded_per_snapshot_and_the_last_record_wins() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let c = Catalog::new(t.path().join("catalog"));
        let one = [base("/s/one/disk-disk0.qcow2", "qcow2")];
        c.record(&a, &one).unwrap();
        c.record(&b, &[]).unwrap();
        assert_eq!(c.listing(&a).unwrap(), Listing::Bases(one.to_vec()));
        assert_eq!(c.listing(&b).unwrap(), Listing::Bases(vec![]));
        // The same again adds nothing; a directory written anew replaces its bases.
        c.record(&a, &one).unwrap();
        let text = std::fs::read_to_string(t.path().join("catalog")).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        c.record(&a, &[]).unwrap();
        assert_eq!(c.listing(&a).unwrap(), Listing::Bases(vec![]));
        // A version-1 line (an older daemon's) lists the directory without bases.
        let old = t.path().join("old");
        std::fs::create_dir(&old).unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(t.path().join("catalog"))
            .unwrap();
        writeln!(f, "{}", std::fs::canonicalize(&old).unwrap().display()).unwrap();
        assert_eq!(c.listing(&old).unwrap(), Listing::WithoutBases);
        assert!(c.contains(&old).unwrap());
        assert_eq!(c.dirs().unwrap().len(), 3);
    }

    #[test]
    fn malformed_catalogs_list_nothing_they_do_not_say() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("catalog");
        let c = Catalog::new(path.clone());
        let d = std::fs::canonicalize(t.path()).unwrap();
        let dir = d.to_str().unwrap();
        let good =
            format!(r#"{{"v":2,"dir":"{dir}","bases":[{{"file":"/s/d","format":"qcow2"}}]}}"#);
        let listed = |text: &str| {
            std::fs::write(&path, text).unwrap();
            c.listing(&d).unwrap()
        };
        assert_eq!(
            listed(&format!("{good}\n")),
            Listing::Bases(vec![base("/s/d", "qcow2")])
        );
        // Torn: the last line without its newline, cut anywhere, lists nothing
        // (and an earlier whole line still counts).
        for cut in 1..good.len() {
            assert_eq!(listed(&good[..cut]), Listing::NotListed, "cut at {cut}");
            assert_eq!(
                listed(&format!("{dir}\n{}", &good[..cut])),
                Listing::WithoutBases
            );
        }
        assert_eq!(listed(&good), Listing::NotListed);
        // Lines that are not a known form grant nothing.
        for bad in [
            format!(r#"{{"v":3,"dir":"{dir}","bases":[]}}"#),
            format!(r#"{{"v":2,"dir":"{dir}","bases":[{{"file":"rel/d","format":"qcow2"}}]}}"#),
            format!(r#"{{"v":2,"dir":"{dir}","bases":[{{"file":"/s/d","format":"vmdk"}}]}}"#),
            format!(r#"{{"v":2,"dir":"{dir}","bases":[{{"file":"/s/d"}}]}}"#),
            format!(r#"{{"v":2,"dir":"{dir}","bases":[],"extra":1}}"#),
            r#"{"v":2,"dir":"relative","bases":[]}"#.to_string(),
            format!(r#"{{"v":2,"dir":"{dir}"}}"#),
            format!("{{{dir}"),
            format!(" {dir}"),
            format!("x{dir}"),
            "\0\u{1}\u{ff}".to_string(),
        ] {
            assert_eq!(listed(&format!("{bad}\n")), Listing::NotListed, "{bad}");
            // A bad line among good ones spoils nothing.
            assert_eq!(
                listed(&format!("{dir}\n{bad}\n\n")),
                Listing::WithoutBases,
                "{bad}"
            );
        }
        // A line over the cap is skipped whole; a file over the cap is refused.
        let long = format!(
            r#"{{"v":2,"dir":"{dir}","bases":[{{"file":"/{}","format":"raw"}}]}}"#,
            "x".repeat(MAX_LINE)
        );
        assert_eq!(listed(&format!("{long}\n")), Listing::NotListed);
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(MAX_BYTES + 1).unwrap();
        assert!(matches!(c.listing(&d), Err(CatalogError::TooLarge(_))));
        assert!(matches!(c.dirs(), Err(CatalogError::TooLarge(_))));
        // A record after a torn line is read back whole.
        std::fs::write(&path, &good[..10]).unwrap();
        c.record(&d, &[]).unwrap();
        assert_eq!(c.listing(&d).unwrap(), Listing::Bases(vec![]));
    }
}
