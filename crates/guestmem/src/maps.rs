//! Parser for `/proc/<pid>/maps`, used to find where QEMU mapped guest RAM.
//!
//! Each line is `START-END PERMS OFFSET MAJOR:MINOR INODE [PATH]`, with
//! START, END and OFFSET in hex, MAJOR:MINOR in hex, INODE in decimal and
//! PATH running to the end of the line (it may contain spaces, and ends in
//! ` (deleted)` for unlinked files such as memfds).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Errors reading or searching a maps file.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// The maps file could not be read.
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: io::Error },
    /// A line does not follow the maps format.
    #[error("maps line {line_no} is malformed ({reason}): {line:?}")]
    Malformed {
        line_no: usize,
        reason: &'static str,
        line: String,
    },
    /// No mapping of the RAM file covers the whole RAM block.
    #[error("process {pid} has no mapping of {target} covering {ram_size:#x} bytes from offset 0")]
    NotMapped {
        pid: u32,
        target: String,
        ram_size: u64,
    },
    /// More than one mapping could be guest RAM.
    #[error(
        "process {pid} maps {target} {count} times from offset 0; cannot tell which is guest RAM"
    )]
    Ambiguous {
        pid: u32,
        target: String,
        count: usize,
    },
}

/// One line of `/proc/<pid>/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    /// The four permission characters, e.g. `rw-s`.
    pub perms: String,
    /// File offset of `start`.
    pub offset: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub inode: u64,
    /// Path as shown, including a ` (deleted)` suffix; empty for anonymous memory.
    pub path: String,
}

impl MapEntry {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// `true` for a shared (`s`) mapping, `false` for a private (`p`) one.
    pub fn is_shared(&self) -> bool {
        self.perms.as_bytes().get(3) == Some(&b's')
    }

    /// The path without the ` (deleted)` suffix.
    pub fn file_path(&self) -> &str {
        self.path.strip_suffix(" (deleted)").unwrap_or(&self.path)
    }
}

/// What to look for: the RAM file by path, or by device and inode (robust
/// for memfds, whose shown path is only `/memfd:NAME (deleted)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapTarget {
    Path(PathBuf),
    Inode {
        dev_major: u32,
        dev_minor: u32,
        inode: u64,
    },
}

impl MapTarget {
    /// Identifies the file at `path` (e.g. `/proc/<pid>/fd/N`) by device and inode.
    pub fn inode_of(path: &Path) -> io::Result<MapTarget> {
        use std::os::unix::fs::MetadataExt;
        let md = fs::metadata(path)?;
        let dev = md.dev();
        // Linux's dev_t encoding, as glibc's gnu_dev_major/minor decode it.
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        Ok(MapTarget::Inode {
            dev_major: major as u32,
            dev_minor: minor as u32,
            inode: md.ino(),
        })
    }

    fn matches(&self, e: &MapEntry) -> bool {
        match self {
            MapTarget::Path(p) => Path::new(e.file_path()) == p,
            MapTarget::Inode {
                dev_major,
                dev_minor,
                inode,
            } => e.inode == *inode && e.dev_major == *dev_major && e.dev_minor == *dev_minor,
        }
    }

    fn describe(&self) -> String {
        match self {
            MapTarget::Path(p) => p.display().to_string(),
            MapTarget::Inode {
                dev_major,
                dev_minor,
                inode,
            } => format!("inode {inode} on {dev_major:x}:{dev_minor:x}"),
        }
    }
}

/// Splits off the next space-separated field.
fn field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches(' ');
    if s.is_empty() {
        return None;
    }
    Some(s.split_at(s.find(' ').unwrap_or(s.len())))
}

fn hex(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// Parses one maps line (`line_no` is 1-based, for errors).
pub fn parse_line(line: &str, line_no: usize) -> Result<MapEntry, MapsError> {
    let bad = |reason| MapsError::Malformed {
        line_no,
        reason,
        line: line.chars().take(200).collect(),
    };
    let (range, rest) = field(line).ok_or_else(|| bad("empty line"))?;
    let (start, end) = range
        .split_once('-')
        .ok_or_else(|| bad("no '-' in address range"))?;
    let start = hex(start).ok_or_else(|| bad("bad start address"))?;
    let end = hex(end).ok_or_else(|| bad("bad end address"))?;
    if end < start {
        return Err(bad("end address below start"));
    }
    let (perms, rest) = field(rest).ok_or_else(|| bad("missing permissions"))?;
    let p = perms.as_bytes();
    let perms_ok = p.len() == 4
        && matches!(p[0], b'r' | b'-')
        && matches!(p[1], b'w' | b'-')
        && matches!(p[2], b'x' | b'-')
        && matches!(p[3], b's' | b'p');
    if !perms_ok {
        return Err(bad("bad permissions"));
    }
    let (offset, rest) = field(rest).ok_or_else(|| bad("missing offset"))?;
    let offset = hex(offset).ok_or_else(|| bad("bad offset"))?;
    let (dev, rest) = field(rest).ok_or_else(|| bad("missing device"))?;
    let (major, minor) = dev.split_once(':').ok_or_else(|| bad("bad device"))?;
    let dev_major = hex(major)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| bad("bad device major"))?;
    let dev_minor = hex(minor)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| bad("bad device minor"))?;
    let (inode, rest) = field(rest).ok_or_else(|| bad("missing inode"))?;
    if !inode.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("bad inode"));
    }
    let inode = inode.parse().map_err(|_| bad("bad inode"))?;
    Ok(MapEntry {
        start,
        end,
        perms: perms.to_string(),
        offset,
        dev_major,
        dev_minor,
        inode,
        path: rest.trim_start_matches(' ').to_string(),
    })
}

/// Parses a whole maps file's text.
pub fn parse_maps(text: &str) -> Result<Vec<MapEntry>, MapsError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| parse_line(l, i + 1))
        .collect()
}

/// Reads and parses `/proc/<pid>/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<MapEntry>, MapsError> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let text = fs::read_to_string(&path).map_err(|source| MapsError::Read { path, source })?;
    parse_maps(&text)
}

/// The mapping of `target` from file offset 0 that covers `ram_size` bytes:
/// where QEMU placed the RAM block in its address space.
pub fn find_ram_mapping(
    maps: &[MapEntry],
    pid: u32,
    target: &MapTarget,
    ram_size: u64,
) -> Result<MapEntry, MapsError> {
    let found: Vec<&MapEntry> = maps
        .iter()
        .filter(|e| target.matches(e) && e.offset == 0 && e.len() >= ram_size)
        .collect();
    match found.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(MapsError::NotMapped {
            pid,
            target: target.describe(),
            ram_size,
        }),
        many => Err(MapsError::Ambiguous {
            pid,
            target: target.describe(),
            count: many.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c6a00000-55d0c6b2c000 r--p 00000000 fe:01 1835106                    /usr/bin/qemu-system-x86_64
7f3a40000000-7f3a50000000 rw-s 00000000 00:1a 4242                       /dev/shm/rebound/vm one/ram
7f3a50000000-7f3a50001000 ---p 00000000 00:00 0 
7f3a60000000-7f3a70000000 rw-s 00000000 00:01 77                         /memfd:ram (deleted)
7ffd1c5e1000-7ffd1c602000 rw-p 00000000 00:00 0                          [stack]
";

    #[test]
    fn parses_real_looking_lines() {
        let m = parse_maps(SAMPLE).unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[1].start, 0x7f3a_4000_0000);
        assert_eq!(m[1].len(), 256 << 20);
        assert!(m[1].is_shared());
        assert_eq!(m[1].path, "/dev/shm/rebound/vm one/ram");
        assert_eq!(
            (m[1].dev_major, m[1].dev_minor, m[1].inode),
            (0, 0x1a, 4242)
        );
        assert_eq!(m[2].path, "");
        assert_eq!(m[3].file_path(), "/memfd:ram");
        assert_eq!(m[4].path, "[stack]");
        assert!(!m[4].is_shared());
    }

    #[test]
    fn finds_ram_by_path_and_by_inode() {
        let m = parse_maps(SAMPLE).unwrap();
        let by_path = MapTarget::Path("/dev/shm/rebound/vm one/ram".into());
        assert_eq!(
            find_ram_mapping(&m, 1, &by_path, 256 << 20).unwrap().start,
            0x7f3a_4000_0000
        );
        let by_inode = MapTarget::Inode {
            dev_major: 0,
            dev_minor: 1,
            inode: 77,
        };
        assert_eq!(
            find_ram_mapping(&m, 1, &by_inode, 256 << 20).unwrap().start,
            0x7f3a_6000_0000
        );
        // A mapping shorter than the RAM block is not it.
        let err = find_ram_mapping(&m, 1, &by_path, 512 << 20).unwrap_err();
        assert!(err.to_string().contains("no mapping"), "{err}");
        let twice = format!("{SAMPLE}{}", SAMPLE.lines().nth(1).unwrap());
        let m = parse_maps(&twice).unwrap();
        let err = find_ram_mapping(&m, 1, &by_path, 256 << 20).unwrap_err();
        assert!(
            matches!(err, MapsError::Ambiguous { count: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn malformed_lines_are_rejected_with_the_reason() {
        let cases = [
            ("", "empty line"),
            ("   ", "empty line"),
            ("7f3a40000000", "no '-'"),
            ("7f3a4000000g-7f3a50000000 rw-s 0 00:1a 1", "bad start"),
            ("7f3a40000000- rw-s 0 00:1a 1", "bad end"),
            ("7f3a50000000-7f3a40000000 rw-s 0 00:1a 1", "below start"),
            ("1000-2000", "missing permissions"),
            ("1000-2000 rwxq 0 00:1a 1", "bad permissions"),
            ("1000-2000 rw 0 00:1a 1", "bad permissions"),
            ("1000-2000 rw-s", "missing offset"),
            ("1000-2000 rw-s zz 00:1a 1", "bad offset"),
            ("1000-2000 rw-s 0", "missing device"),
            ("1000-2000 rw-s 0 001a 1", "bad device"),
            ("1000-2000 rw-s 0 00:1ffffffffff 1", "bad device minor"),
            ("1000-2000 rw-s 0 00:1a", "missing inode"),
            ("1000-2000 rw-s 0 00:1a -5", "bad inode"),
            (
                "1000-2000 rw-s 0 00:1a 99999999999999999999999",
                "bad inode",
            ),
            ("ffffffffffffffffff-1 rw-s 0 00:1a 1", "bad start"),
        ];
        for (line, reason) in cases {
            let err = parse_line(line, 7).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(reason), "{line:?}: {msg}");
            assert!(msg.contains("line 7"), "{msg}");
        }
        // One bad line spoils the file: a half-parsed maps file is never used.
        let err = parse_maps("1000-2000 rw-s 0 00:1a 1 /a\nnonsense\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn reads_own_maps() {
        let m = read_maps(std::process::id()).unwrap();
        assert!(m.iter().any(|e| e.path == "[stack]"));
    }
}
