//! One entry of a VM's `disks`: a file and how it is served,
//! `FILE[,backend=qemu|rebound][,cache=host[:SIZE]|page|none][,size=SIZE]`.
//!
//! The options choose per disk what `--disk-backend`, `--disk-cache` and
//! `--disk-direct` choose for all of them: a disk without options follows those.
//! A comma in the file name is written twice (`a,,b` is the file `a,b`), as in QEMU.
//!
//! - `backend`: QEMU's own virtio-blk, or Rebound's vhost-user-blk backend;
//! - `cache=host[:SIZE]`: Rebound's host cache of SIZE (default 256M), which implies
//!   `backend=rebound`; `page`: QEMU through the host page cache (its cache=writeback);
//!   `none`: nothing on the host keeps the disk's blocks (QEMU's cache=none, or the
//!   backend without a cache);
//! - `size`: the disk's size; the file is made (sparse, raw) when it does not exist, and
//!   an existing file of another size is refused rather than cut or grown.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::parse::{parse_size, SpecError};

/// What serves a VM's disks: QEMU's own virtio-blk, or Rebound's vhost-user-blk
/// backend (a process per disk, which sees every request and keeps a host cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DiskBackend {
    #[default]
    Qemu,
    Rebound,
}

impl DiskBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskBackend::Qemu => "qemu",
            DiskBackend::Rebound => "rebound",
        }
    }
}

impl FromStr for DiskBackend {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "qemu" => Ok(DiskBackend::Qemu),
            "rebound" => Ok(DiskBackend::Rebound),
            _ => Err(SpecError::DiskBackend(s.to_string())),
        }
    }
}

/// The host cache `cache=host` gets without a size.
pub const DEFAULT_HOST_CACHE: u64 = 256 << 20;

/// How the host caches one disk's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskCache {
    /// Rebound's backend keeps up to this many bytes (content-checked, per VM).
    Host(u64),
    /// QEMU reads and writes through the host page cache.
    Page,
    /// Nothing on the host keeps the blocks.
    None,
}

/// A parsed `disks` entry (the default: no file, every choice left to the VM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskOpts {
    pub path: String,
    pub backend: Option<DiskBackend>,
    pub cache: Option<DiskCache>,
    pub size: Option<u64>,
}

/// The `disks` entry of a plain file (its commas doubled), following the VM's settings.
pub fn entry(path: &str) -> String {
    path.replace(',', ",,")
}

/// How one disk ends up served, once the VM's defaults fill what the entry leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskServing {
    pub backend: DiskBackend,
    /// Rebound's host cache, bytes (0: none; always 0 for QEMU's disks).
    pub cache_bytes: u64,
    /// QEMU opens the file with O_DIRECT (cache=none); false for Rebound's disks.
    pub direct: bool,
}

impl DiskOpts {
    /// Fills in what the entry leaves to the VM: `backend`, `cache_mib` and `direct`
    /// are its `disk_backend`, `disk_cache_mib` and `disk_direct`.
    pub fn serving(&self, backend: DiskBackend, cache_mib: u64, direct: bool) -> DiskServing {
        let backend = match (self.backend, self.cache) {
            (Some(b), _) => b,
            (None, Some(DiskCache::Host(_))) => DiskBackend::Rebound,
            (None, Some(DiskCache::Page)) => DiskBackend::Qemu,
            (None, _) => backend,
        };
        match backend {
            DiskBackend::Rebound => DiskServing {
                backend,
                cache_bytes: match self.cache {
                    Some(DiskCache::Host(n)) => n,
                    Some(_) => 0,
                    None => cache_mib << 20,
                },
                direct: false,
            },
            DiskBackend::Qemu => DiskServing {
                backend,
                cache_bytes: 0,
                direct: match self.cache {
                    Some(DiskCache::None) => true,
                    Some(_) => false,
                    None => direct,
                },
            },
        }
    }
}

impl FromStr for DiskOpts {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = |why: &str| SpecError::Disk(s.to_string(), why.to_string());
        let mut parts = split_commas(s).into_iter();
        let path = parts.next().unwrap_or_default();
        if path.is_empty() {
            return Err(bad("no file"));
        }
        let mut d = DiskOpts {
            path,
            backend: None,
            cache: None,
            size: None,
        };
        for p in parts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(&format!("option {p:?} is not KEY=VALUE")))?;
            let dup = match k {
                "backend" => d.backend.replace(v.parse()?).is_some(),
                "cache" => d
                    .cache
                    .replace(parse_cache(v).map_err(|w| bad(&w))?)
                    .is_some(),
                "size" => {
                    let n = parse_size(v)?;
                    if n == 0 || n % 512 != 0 {
                        return Err(bad("size must be a non-zero multiple of 512 bytes"));
                    }
                    d.size.replace(n).is_some()
                }
                _ => {
                    return Err(bad(&format!(
                        "unknown option {k:?} (expected backend, cache or size)"
                    )))
                }
            };
            if dup {
                return Err(bad(&format!("option {k:?} given twice")));
            }
        }
        match (d.backend, d.cache) {
            (Some(DiskBackend::Qemu), Some(DiskCache::Host(_))) => Err(bad(
                "cache=host is Rebound's cache: it needs backend=rebound",
            )),
            (Some(DiskBackend::Rebound), Some(DiskCache::Page)) => Err(bad(
                "cache=page is QEMU's: the rebound backend keeps its own cache (cache=host:SIZE)",
            )),
            _ => Ok(d),
        }
    }
}

fn parse_cache(v: &str) -> Result<DiskCache, String> {
    match v {
        "page" => Ok(DiskCache::Page),
        "none" => Ok(DiskCache::None),
        "host" => Ok(DiskCache::Host(DEFAULT_HOST_CACHE)),
        _ => match v.strip_prefix("host:").map(parse_size) {
            Some(Ok(n)) if n >= 1 << 20 => Ok(DiskCache::Host(n)),
            Some(Ok(_)) => Err("a host cache below 1 MiB caches nothing useful".into()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err(format!(
                "cache={v:?}: expected host, host:SIZE, page or none"
            )),
        },
    }
}

/// Splits at single commas; `,,` is a comma inside a part.
fn split_commas(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != ',' {
            out.last_mut().expect("never empty").push(c);
        } else if it.peek() == Some(&',') {
            it.next();
            out.last_mut().expect("never empty").push(',');
        } else {
            out.push(String::new());
        }
    }
    out
}

impl fmt::Display for DiskOpts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.replace(',', ",,"))?;
        if let Some(b) = self.backend {
            write!(f, ",backend={}", b.as_str())?;
        }
        match self.cache {
            Some(DiskCache::Host(n)) => write!(f, ",cache=host:{}K", n >> 10)?,
            Some(DiskCache::Page) => write!(f, ",cache=page")?,
            Some(DiskCache::None) => write!(f, ",cache=none")?,
            None => {}
        }
        if let Some(n) = self.size {
            write!(f, ",size={n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<DiskOpts, SpecError> {
        s.parse()
    }

    #[test]
    fn plain_file_follows_the_vm() {
        let d = p("/img/a.raw").unwrap();
        assert_eq!(d.path, "/img/a.raw");
        assert_eq!(
            d.serving(DiskBackend::Rebound, 64, false),
            DiskServing {
                backend: DiskBackend::Rebound,
                cache_bytes: 64 << 20,
                direct: false
            }
        );
        assert!(d.serving(DiskBackend::Qemu, 0, true).direct);
    }

    #[test]
    fn options_choose_per_disk() {
        let d = p("/a,cache=host:128M,size=1G").unwrap();
        assert_eq!(d.size, Some(1 << 30));
        let s = d.serving(DiskBackend::Qemu, 0, true);
        assert_eq!(
            (s.backend, s.cache_bytes, s.direct),
            (DiskBackend::Rebound, 128 << 20, false)
        );
        let s = p("/a,cache=host")
            .unwrap()
            .serving(DiskBackend::Qemu, 0, false);
        assert_eq!(s.cache_bytes, DEFAULT_HOST_CACHE);
        let s = p("/a,cache=none")
            .unwrap()
            .serving(DiskBackend::Rebound, 64, false);
        assert_eq!((s.backend, s.cache_bytes), (DiskBackend::Rebound, 0));
        let s = p("/a,cache=none")
            .unwrap()
            .serving(DiskBackend::Qemu, 0, false);
        assert!(s.direct);
        let s = p("/a,cache=page")
            .unwrap()
            .serving(DiskBackend::Rebound, 64, false);
        assert_eq!((s.backend, s.direct), (DiskBackend::Qemu, false));
        let s = p("/a,backend=qemu")
            .unwrap()
            .serving(DiskBackend::Rebound, 64, false);
        assert_eq!((s.backend, s.cache_bytes), (DiskBackend::Qemu, 0));
    }

    #[test]
    fn doubled_commas_are_part_of_the_name_and_round_trip() {
        let d = p("/x/a,,b.raw,backend=rebound").unwrap();
        assert_eq!(d.path, "/x/a,b.raw");
        for s in [
            "/x/a,,b.raw,backend=rebound",
            "/a,cache=host:64M,size=4096",
            "/a,cache=page",
            "/a,backend=qemu,cache=none",
        ] {
            let d = p(s).unwrap();
            assert_eq!(p(&d.to_string()).unwrap(), d, "{s}");
        }
    }

    #[test]
    fn bad_entries_name_the_problem() {
        for (s, want) in [
            ("", "no file"),
            (",cache=none", "no file"),
            ("/a,cache", "not KEY=VALUE"),
            ("/a,color=red", "unknown option"),
            ("/a,cache=host:1k", "below 1 MiB"),
            ("/a,cache=host:lots", "malformed size"),
            ("/a,cache=disk", "expected host"),
            ("/a,size=1000", "multiple of 512"),
            ("/a,size=0", "multiple of 512"),
            ("/a,size=1G,size=2G", "given twice"),
            ("/a,backend=qemu,cache=host:64M", "needs backend=rebound"),
            ("/a,backend=rebound,cache=page", "keeps its own cache"),
        ] {
            let e = p(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(matches!(
            p("/a,backend=nbd"),
            Err(SpecError::DiskBackend(_))
        ));
        assert!(matches!(
            p("/a,size=99999999999T"),
            Err(SpecError::SizeOverflow(_))
        ));
    }
}
