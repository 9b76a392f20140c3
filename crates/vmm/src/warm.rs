//! Warm reboot metadata: the list of a guest's cached file pages, as its agent reports
//! it before a reboot (`cachelist`) and sends it back after (`prefetch`), kept on the
//! host in between.
//!
//! The list says only *what* to read again; the content always comes from the disk
//! (through the block backend's cache, which admits only blocks equal to the disk). A
//! wrong list therefore costs time, never correctness, but a damaged file is still
//! refused whole and the reboot goes on cold, saying why.
//!
//! File format (text, written once to a temporary name and renamed):
//! ```text
//! rebound-warm-cache 1
//! files F pages P
//! sha256 HEX            (of every byte after this line)
//! START+COUNT,START+COUNT,... PATH      (one line per file, 4 KiB pages, PATH under /data)
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const MAGIC: &str = "rebound-warm-cache";
const VERSION: u32 = 1;
/// Largest list accepted (a 64 MiB text covers millions of ranges).
pub const MAX_BYTES: u64 = 64 << 20;
/// List text per `prefetch` message: under the agent's 64 KiB line once JSON-escaped.
pub const CHUNK_MAX: usize = 30_000;
const PATH_MAX: usize = 1024;

/// Errors reading or writing the list.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("warm-cache list {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("warm-cache list {path} is not one (no `{MAGIC}` header)")]
    Magic { path: PathBuf },
    #[error("warm-cache list {path} has version {found}, this build reads {VERSION}")]
    Version { path: PathBuf, found: String },
    #[error("warm-cache list {path} is {size} bytes, over the {MAX_BYTES}-byte limit")]
    TooBig { path: PathBuf, size: u64 },
    #[error("warm-cache list {path} is truncated or damaged: {what}")]
    Damaged { path: PathBuf, what: String },
}

/// A checked list of cached pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheList {
    /// Lines `START+COUNT,... PATH\n`, each checked.
    pub text: String,
    pub files: u64,
    pub pages: u64,
}

/// Pages named by one line, or `None` when the line is malformed: ranges of
/// `START+COUNT` (COUNT > 0, no overflow), one space, a relative path without `.`/`..`
/// or empty segments.
pub fn line_pages(line: &str) -> Option<u64> {
    let (ranges, path) = line.split_once(' ')?;
    if path.is_empty()
        || path.len() > PATH_MAX
        || path.starts_with('/')
        || path
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        || path.bytes().any(|b| !(0x20..0x7f).contains(&b))
    {
        return None;
    }
    let mut pages = 0u64;
    for r in ranges.split(',') {
        let (s, n) = r.split_once('+')?;
        let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
        if !digits(s) || !digits(n) {
            return None;
        }
        let (s, n): (u64, u64) = (s.parse().ok()?, n.parse().ok()?);
        if n == 0 {
            return None;
        }
        s.checked_add(n)?;
        pages = pages.checked_add(n)?;
    }
    Some(pages)
}

impl CacheList {
    /// Builds a list from the agent's text, keeping only well-formed lines (the guest
    /// is not trusted); returns it and how many lines were dropped.
    pub fn from_guest(text: &str) -> (CacheList, u64) {
        let mut out = CacheList::default();
        let mut dropped = 0;
        let mut paths = std::collections::HashSet::new();
        for line in text.lines().filter(|l| !l.is_empty()) {
            match line_pages(line) {
                Some(p) if out.text.len() + line.len() < MAX_BYTES as usize => {
                    out.text.push_str(line);
                    out.text.push('\n');
                    out.pages += p;
                    if paths.insert(line.split_once(' ').map(|x| x.1).unwrap_or_default()) {
                        out.files += 1;
                    }
                }
                _ => dropped += 1,
            }
        }
        (out, dropped)
    }

    /// Bytes the list covers.
    pub fn bytes(&self) -> u64 {
        self.pages * 4096
    }

    /// The text cut at line boundaries into pieces of at most [`CHUNK_MAX`] bytes.
    pub fn chunks(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut end = 0;
        for (i, _) in self.text.match_indices('\n') {
            if i + 1 - start > CHUNK_MAX && end > start {
                out.push(&self.text[start..end]);
                start = end;
            }
            end = i + 1;
        }
        if end > start {
            out.push(&self.text[start..end]);
        }
        out
    }

    /// Writes the list to `path` (temporary name, fsync, rename: whole or absent).
    pub fn save(&self, path: &Path) -> Result<(), WarmError> {
        let io = |err| WarmError::Io {
            path: path.to_path_buf(),
            err,
        };
        let tmp = path.with_extension("tmp");
        let digest = Sha256::digest(self.text.as_bytes());
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        write!(
            f,
            "{MAGIC} {VERSION}\nfiles {} pages {}\nsha256 {}\n{}",
            self.files,
            self.pages,
            hex(&digest),
            self.text
        )
        .and_then(|_| f.sync_all())
        .map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads and checks a list written by [`CacheList::save`].
    pub fn load(path: &Path) -> Result<CacheList, WarmError> {
        let p = path.to_path_buf();
        let damaged = |what: &str| WarmError::Damaged {
            path: p.clone(),
            what: what.to_string(),
        };
        let size = std::fs::metadata(path)
            .map_err(|err| WarmError::Io {
                path: p.clone(),
                err,
            })?
            .len();
        if size > MAX_BYTES + 4096 {
            return Err(WarmError::TooBig { path: p, size });
        }
        let data = std::fs::read(path).map_err(|err| WarmError::Io {
            path: p.clone(),
            err,
        })?;
        let text = std::str::from_utf8(&data).map_err(|_| damaged("not UTF-8"))?;
        let mut head = text.splitn(4, '\n');
        let first = head.next().unwrap_or_default();
        let Some(version) = first.strip_prefix(MAGIC).and_then(|r| r.strip_prefix(' ')) else {
            return Err(WarmError::Magic { path: p });
        };
        if version != VERSION.to_string() {
            return Err(WarmError::Version {
                path: p,
                found: version.chars().take(20).collect(),
            });
        }
        let counts = head.next().ok_or_else(|| damaged("no counts line"))?;
        let sum = head
            .next()
            .and_then(|l| l.strip_prefix("sha256 "))
            .ok_or_else(|| damaged("no checksum line"))?;
        let body = head.next().unwrap_or_default();
        if hex(&Sha256::digest(body.as_bytes())) != sum {
            return Err(damaged("checksum mismatch"));
        }
        let (list, dropped) = CacheList::from_guest(body);
        if dropped > 0 || (!body.is_empty() && !body.ends_with('\n')) {
            return Err(damaged("a malformed line"));
        }
        let want = format!("files {} pages {}", list.files, list.pages);
        if counts != want {
            return Err(damaged("counts do not match the lines"));
        }
        Ok(list)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CacheList {
        CacheList::from_guest("0+3,10+1 web/000/000001.bin\n0+50 a b.txt\n").0
    }

    #[test]
    fn guest_lines_are_checked() {
        let (l, dropped) = CacheList::from_guest(
            "0+3,10+1 web/a\n\
             0+0 zero\n\
             1+1 /etc/passwd\n\
             1+1 a/../../x\n\
             1+1\n\
             18446744073709551615+2 over\n\
             x+1 junk\n\
             5+2 web/a\n",
        );
        assert_eq!(dropped, 6);
        assert_eq!((l.files, l.pages), (1, 6));
        assert_eq!(l.text, "0+3,10+1 web/a\n5+2 web/a\n");
    }

    #[test]
    fn round_trip_and_chunks() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("warm");
        let l = sample();
        l.save(&p).unwrap();
        assert_eq!(CacheList::load(&p).unwrap(), l);
        let mut big = String::new();
        for i in 0..5000 {
            big.push_str(&format!("0+{} web/{i:06}.bin\n", i + 1));
        }
        let (b, _) = CacheList::from_guest(&big);
        let chunks = b.chunks();
        assert!(chunks.len() > 1);
        assert!(chunks
            .iter()
            .all(|c| c.len() <= CHUNK_MAX && c.ends_with('\n')));
        assert_eq!(chunks.concat(), b.text);
    }

    #[test]
    fn damaged_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("warm");
        sample().save(&p).unwrap();
        let good = std::fs::read(&p).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 5].to_vec()),
            ("empty", Vec::new()),
            ("magic", [b"x".as_slice(), &good].concat()),
            (
                "version",
                String::from_utf8(good.clone())
                    .unwrap()
                    .replacen(" 1\n", " 9\n", 1)
                    .into_bytes(),
            ),
            ("flipped", {
                let mut g = good.clone();
                let n = g.len();
                g[n - 3] ^= 1;
                g
            }),
            (
                "counts",
                String::from_utf8(good.clone())
                    .unwrap()
                    .replacen("pages 54", "pages 55", 1)
                    .into_bytes(),
            ),
            ("binary", vec![0xff; 100]),
        ];
        for (what, bytes) in cases {
            std::fs::write(&p, &bytes).unwrap();
            let e = CacheList::load(&p).expect_err(what);
            assert!(!e.to_string().contains('\n'), "{what}: {e}");
        }
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(MAX_BYTES + 8192).unwrap();
        assert!(matches!(CacheList::load(&p), Err(WarmError::TooBig { .. })));
    }
}
