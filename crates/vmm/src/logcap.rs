//! Logs a guest can fill, held to a size: the serial console log, QEMU's own output
//! and the event log. Each is at most `cap` bytes on disk in all, in two generations:
//! the current file (`NAME`) and the previous one (`NAME.1`), each at most `cap / 2`.
//! Readers take only the tail they need ([`tail`]). A new boot starts a new generation
//! (`RotatingFile::rotate`), so the last boot's lines stay in `NAME.1` until the next.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The smallest cap a log may have: a boot's messages fit.
pub const MIN_CAP: u64 = 64 * 1024;

/// The previous generation of `path`: `path.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// The most one generation of a log capped at `cap` holds.
fn half(cap: u64) -> u64 {
    (cap / 2).max(1)
}

/// An append-only log that starts a new generation before it would pass `cap / 2`.
#[derive(Debug)]
pub struct RotatingFile {
    path: PathBuf,
    cap: u64,
    file: Option<File>,
    size: u64,
}

impl RotatingFile {
    /// Appends to `path` (created 0600), within `cap` bytes for both generations.
    pub fn new(path: &Path, cap: u64) -> RotatingFile {
        RotatingFile {
            path: path.to_path_buf(),
            cap,
            file: None,
            size: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the current file to `NAME.1` (replacing it) and starts an empty one.
    pub fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        match std::fs::rename(&self.path, rotated(&self.path)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Appends `data` in one write. Data longer than a generation keeps its tail.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        let data = &data[data.len().saturating_sub(half(self.cap) as usize)..];
        if self.file.is_none() {
            let f = crate::private::create_file(&self.path, true)?;
            self.size = f.metadata()?.len();
            self.file = Some(f);
        }
        if self.size > 0 && self.size + data.len() as u64 > half(self.cap) {
            self.rotate()?;
            let f = crate::private::create_file(&self.path, false)?;
            self.size = 0;
            self.file = Some(f);
        }
        let f = self.file.as_mut().expect("opened above");
        f.write_all(data)?;
        self.size += data.len() as u64;
        Ok(())
    }
}

/// The last `max` bytes of the current generation of `path` (a new boot starts a
/// new generation: its readers never see the previous boot's lines); empty when
/// there is none.
pub fn tail(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(max)))?;
    let mut out = Vec::with_capacity(len.min(max) as usize);
    f.take(max).read_to_end(&mut out)?;
    Ok(out)
}

/// Holds a file another process appends to (QEMU's stdout and stderr, opened
/// `O_APPEND`) within `cap`: once it passes `cap / 2`, its tail is copied to
/// `NAME.1` and it is truncated, so the writer's next line starts it again. Lines
/// written between the copy and the truncation are lost. True when it was cut.
pub fn cut_in_place(path: &Path, cap: u64) -> io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= half(cap) {
        return Ok(false);
    }
    let keep = tail(path, half(cap))?;
    crate::private::write_atomic(&rotated(path), &keep)?;
    crate::private::create_file(path, true)?.set_len(0)?;
    Ok(true)
}

/// Bytes both generations of `path` take now.
pub fn size_on_disk(path: &Path) -> u64 {
    [path.to_path_buf(), rotated(path)]
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_within_the_cap_and_keeps_the_tail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("serial.log");
        let mut f = RotatingFile::new(&p, 1000);
        for i in 0..1000u32 {
            f.write(format!("{i:09}\n").as_bytes()).unwrap();
            assert!(size_on_disk(&p) <= 1000, "at line {i}");
        }
        let t = tail(&p, 30).unwrap();
        assert_eq!(t, b"000000997\n000000998\n000000999\n");
        // Only the current generation: at most half the cap.
        let all = tail(&p, 1000).unwrap();
        assert!(all.len() <= 500 && all.len() >= 400, "{}", all.len());
        assert!(all.ends_with(b"000000999\n"));
        assert!(std::fs::metadata(rotated(&p)).unwrap().len() <= 500);
        // An oversized write keeps its end.
        f.write(&[b'x'; 5000]).unwrap();
        assert!(size_on_disk(&p) <= 1000);
        assert_eq!(tail(&p, 10).unwrap(), b"xxxxxxxxxx");
        assert_eq!(tail(&d.path().join("none"), 10).unwrap(), b"");
    }

    #[test]
    fn cuts_a_file_another_writer_appends_to() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("qemu.log");
        let mut w = crate::private::create_file(&p, true).unwrap();
        w.write_all(&[b'a'; 400]).unwrap();
        assert!(!cut_in_place(&p, 1000).unwrap());
        w.write_all(&[b'b'; 400]).unwrap();
        assert!(cut_in_place(&p, 1000).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        // The writer's next line starts the file again (O_APPEND), no hole before it.
        w.write_all(b"next\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"next\n");
        assert!(size_on_disk(&p) <= 1000);
        assert!(std::fs::read(rotated(&p)).unwrap().ends_with(b"bbb"));
    }
}
