//! The snapshot directory and its manifest (`docs/snapshot-format.md`).
//!
//! A snapshot is written into `<parent>/.<name>.partial-<pid>` and renamed to its
//! name only after every file and the manifest are durable, so a directory with the
//! name is complete; a failed or interrupted snapshot leaves at most a hidden
//! partial directory (removed on drop), never a half snapshot, and never touches an
//! existing one.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub use crate::image::RamBlock;
use crate::image::{hex, ChunkHasher};
use crate::open_nofollow;
use crate::trace::Trace;
use crate::PAGE_SIZE;
use serde::{Deserialize, Serialize};

pub const MANIFEST_FORMAT: &str = "rebound-snapshot";
pub const FORMAT_VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";
/// A manifest is a few KiB; anything near this is not one.
const MANIFEST_MAX: u64 = 16 << 20;

/// Errors of snapshot directories.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{0} already exists: a snapshot never replaces another")]
    Exists(PathBuf),
    #[error("{0} is not a snapshot directory (no manifest.json)")]
    NotSnapshot(PathBuf),
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
    #[error("{0} is larger than {MANIFEST_MAX} bytes: not a manifest")]
    TooLarge(PathBuf),
    #[error("{0} is malformed: {1}")]
    Malformed(PathBuf, String),
    #[error("{0} is a {1:?} file, not a {MANIFEST_FORMAT}")]
    Format(PathBuf, String),
    #[error("snapshot format version {0} is newer than this rebound (supports {FORMAT_VERSION})")]
    Future(u64),
    #[error("snapshot format version {0} is not supported (supports {FORMAT_VERSION})")]
    Version(u64),
    #[error("{0} is inconsistent: {1}")]
    Invalid(PathBuf, String),
    #[error("{0} does not name a directory")]
    NoName(PathBuf),
    #[error("{0} is missing")]
    Missing(PathBuf),
    #[error("{0} is {1} bytes, the manifest says {2}: truncated or replaced")]
    Size(PathBuf, u64, u64),
    #[error("{file}: checksum mismatch in chunk {chunk} (bytes {start}..{end}): the snapshot is damaged")]
    Checksum {
        file: String,
        chunk: usize,
        start: u64,
        end: u64,
    },
    #[error("{0} is not a regular file (a symbolic link, device, FIFO or socket): a snapshot holds only its own regular files")]
    NotRegular(PathBuf),
    #[error("{0}: checksum mismatch: the file is damaged")]
    FileChecksum(String),
    #[error(transparent)]
    Image(#[from] crate::image::ImageError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

/// Everything a restore needs to know about a snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// RFC 3339, UTC.
    pub created: String,
    /// The VM that was snapshotted.
    pub vm: String,
    /// The VM's spec as the daemon keeps it (opaque here).
    pub spec: serde_json::Value,
    pub qemu_version: String,
    /// The concrete machine type (e.g. `pc-i440fx-7.2`): the device state is only
    /// valid for it.
    pub machine: String,
    pub accel: String,
    pub ram_blocks: Vec<RamBlock>,
    pub device_state: FileEntry,
    pub disks: Vec<DiskEntry>,
    pub trace: Option<TraceInfo>,
    /// How long the guest's vCPUs were stopped for the snapshot.
    pub pause_ms: f64,
    #[serde(default)]
    pub notes: Vec<String>,
    /// The VM's pmem devices, in its spec's order: their files are not in the
    /// snapshot (the user names them again to restore), only their sizes, which the
    /// files named must have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<PmemEntry>,
}

/// A pmem device as it was at the snapshot point.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct PmemEntry {
    /// `pmem0`, `pmem1`, ...
    pub id: String,
    /// Bytes of its file.
    pub size: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct FileEntry {
    pub file: String,
    pub size: u64,
    pub checksum: String,
}

/// A disk as it was at the snapshot point.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DiskEntry {
    pub id: String,
    pub file: String,
    pub format: String,
    /// The read-only base a qcow2 copy reads through (kept by reference).
    pub backing: Option<String>,
    pub size: u64,
    pub checksum: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TraceInfo {
    pub file: String,
    pub pages: u64,
    /// `post-snapshot` or `restore`.
    pub source: String,
    /// Pages touched in one window while the guest ran before the snapshot.
    pub wss_sample_pages: Option<u64>,
    /// Pages touched in the window after the snapshot point.
    pub wss_snapshot_pages: u64,
}

impl TraceInfo {
    /// The elastic working set a restore loads by default: half the paper's
    /// estimate from the sampled and post-snapshot sizes (weights 0.7 and 0.3).
    pub fn default_elastic_pages(&self) -> u64 {
        let wss = crate::trace::estimate_wss(
            self.wss_sample_pages,
            self.wss_snapshot_pages,
            crate::trace::WSS_A,
            crate::trace::WSS_B,
        );
        crate::trace::elastic_pages(wss)
    }
}

/// What [`Snapshot::verify`] checked.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct VerifyReport {
    pub files: usize,
    pub chunks: usize,
    pub bytes: u64,
}

/// A snapshot being written.
pub struct SnapshotDir {
    partial: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl SnapshotDir {
    /// Starts a snapshot that will be named `target`.
    pub fn create(target: &Path) -> Result<SnapshotDir, ManifestError> {
        if target.exists() {
            return Err(ManifestError::Exists(target.to_path_buf()));
        }
        let name = target
            .file_name()
            .ok_or_else(|| ManifestError::NoName(target.to_path_buf()))?;
        let parent = target.parent().unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(ManifestError::Missing(parent.to_path_buf()));
        }
        let partial = parent.join(format!(
            ".{}.partial-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&partial)
            .map_err(|e| ManifestError::Write(partial.clone(), e))?;
        Ok(SnapshotDir {
            partial,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// Where the files go until the commit.
    pub fn path(&self) -> &Path {
        &self.partial
    }

    /// Writes the manifest, makes everything durable and gives the directory its
    /// name.
    pub fn commit(mut self, m: &Manifest) -> Result<PathBuf, ManifestError> {
        let werr = |p: &Path, e| ManifestError::Write(p.to_path_buf(), e);
        write_json(&self.partial.join(MANIFEST), m)?;
        for e in std::fs::read_dir(&self.partial).map_err(|e| werr(&self.partial, e))? {
            let p = e.map_err(|e| werr(&self.partial, e))?.path();
            File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(|e| werr(&p, e))?;
        }
        sync_dir(&self.partial)?;
        if self.target.exists() {
            return Err(ManifestError::Exists(self.target.clone()));
        }
        std::fs::rename(&self.partial, &self.target).map_err(|e| werr(&self.target, e))?;
        sync_dir(self.target.parent().unwrap_or(Path::new(".")))?;
        self.committed = true;
        Ok(self.target.clone())
    }
}

impl Drop for SnapshotDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.partial);
        }
    }
}

fn sync_dir(p: &Path) -> Result<(), ManifestError> {
    File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| ManifestError::Write(p.to_path_buf(), e))
}

/// Writes `v` as pretty JSON to `path` through a temporary file and a rename.
fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ManifestError> {
    let tmp = path.with_extension("json.tmp");
    let data = serde_json::to_vec_pretty(v).expect("manifest serializes");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| ManifestError::Write(tmp.clone(), e))?;
    f.write_all(&data)
        .and_then(|_| f.sync_all())
        .map_err(|e| ManifestError::Write(tmp.clone(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| ManifestError::Write(path.to_path_buf(), e))
}

/// A snapshot directory, opened and checked.
#[derive(Debug)]
pub struct Snapshot {
    dir: PathBuf,
    manifest: Manifest,
}

/// A file name in the manifest: plain, inside the directory.
fn plain(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.contains('/')
        && name != "."
        && name != ".."
        && !name.chars().any(char::is_control);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "file name {} must be a plain name inside the snapshot directory",
            shown(name)
        ))
    }
}

/// What is wrong with a manifest on its own (not looking at the files), if anything.
fn problem(m: &Manifest) -> Result<(), String> {
    if m.ram_blocks.is_empty() {
        return Err("no RAM blocks".into());
    }
    if m.ram_blocks.len() > 1 << 16 {
        return Err(format!("{} RAM blocks, at most 65536", m.ram_blocks.len()));
    }
    let mut ids = std::collections::HashSet::new();
    for b in &m.ram_blocks {
        if b.id.is_empty() || !ids.insert(&b.id) {
            return Err(format!(
                "RAM block id {} is empty or used twice",
                shown(&b.id)
            ));
        }
        plain(&b.file)?;
        let id = shown(&b.id);
        if !b.chunk_bytes.is_power_of_two() || !(PAGE_SIZE..=1 << 30).contains(&b.chunk_bytes) {
            return Err(format!(
                "RAM block {id}: chunk size {} is not a power of two between 4 KiB and 1 GiB",
                b.chunk_bytes
            ));
        }
        if b.size == 0 || !b.size.is_multiple_of(PAGE_SIZE) || b.size > 1 << 46 {
            return Err(format!(
                "RAM block {id}: size {} is not a whole number of pages up to 64 TiB",
                b.size
            ));
        }
        let chunks = b.size.div_ceil(b.chunk_bytes);
        if b.checksums.len() as u64 != chunks {
            return Err(format!(
                "RAM block {id}: {} checksums for {chunks} chunks",
                b.checksums.len()
            ));
        }
        if let Some(c) = b.checksums.iter().find(|c| !is_checksum(c)) {
            return Err(format!(
                "RAM block {id}: checksum {} is not 16 hex digits",
                shown(c)
            ));
        }
        if b.data_bytes > b.size {
            return Err(format!("RAM block {id}: more data bytes than its size"));
        }
    }
    let files = m
        .ram_blocks
        .iter()
        .map(|b| &b.file)
        .chain([&m.device_state.file])
        .chain(m.disks.iter().map(|d| &d.file))
        .chain(m.trace.iter().map(|t| &t.file))
        .chain(
            m.ram_blocks
                .iter()
                .filter_map(|b| b.page_sums.as_ref().map(|p| &p.file)),
        );
    let mut seen = std::collections::HashSet::new();
    for f in files {
        plain(f)?;
        if f == MANIFEST || !seen.insert(f) {
            return Err(format!("file {} is listed twice", shown(f)));
        }
    }
    let sums = std::iter::once(&m.device_state.checksum)
        .chain(m.disks.iter().map(|d| &d.checksum))
        .chain(
            m.ram_blocks
                .iter()
                .filter_map(|b| b.page_sums.as_ref().map(|p| &p.checksum)),
        );
    if let Some(c) = sums.into_iter().find(|c| !is_checksum(c)) {
        return Err(format!("checksum {} is not 16 hex digits", shown(c)));
    }
    Ok(())
}

/// A string from a manifest, quoted for an error message: at most 64 characters of
/// it, so that a huge one cannot flood the message.
fn shown(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes)", &s[..cut], s.len()),
    }
}

fn is_checksum(c: &str) -> bool {
    c.len() == 16
        && c.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Snapshot {
    /// Reads and checks the manifest and that every file it lists is there with its
    /// recorded size (no checksums: that is [`Snapshot::verify`]).
    pub fn open(dir: &Path) -> Result<Snapshot, ManifestError> {
        let path = dir.join(MANIFEST);
        let f = open_nofollow(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ManifestError::NotSnapshot(dir.to_path_buf()),
            _ if e.raw_os_error() == Some(libc::ELOOP) => ManifestError::NotRegular(path.clone()),
            _ => ManifestError::Read(path.clone(), e),
        })?;
        if !f
            .metadata()
            .map_err(|e| ManifestError::Read(path.clone(), e))?
            .is_file()
        {
            return Err(ManifestError::NotRegular(path));
        }
        let len = f
            .metadata()
            .map_err(|e| ManifestError::Read(path.clone(), e))?
            .len();
        if len > MANIFEST_MAX {
            return Err(ManifestError::TooLarge(path));
        }
        let mut text = Vec::new();
        f.take(MANIFEST_MAX)
            .read_to_end(&mut text)
            .map_err(|e| ManifestError::Read(path.clone(), e))?;
        let v: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| ManifestError::Malformed(path.clone(), e.to_string()))?;
        let format = v.get("format").and_then(|x| x.as_str()).unwrap_or("");
        if format != MANIFEST_FORMAT {
            return Err(ManifestError::Format(path, shown(format)));
        }
        match v.get("version").and_then(|x| x.as_u64()) {
            Some(n) if n == FORMAT_VERSION as u64 => {}
            Some(n) if n > FORMAT_VERSION as u64 => return Err(ManifestError::Future(n)),
            Some(n) => return Err(ManifestError::Version(n)),
            None => return Err(ManifestError::Malformed(path, "no version".into())),
        }
        let manifest: Manifest = serde_json::from_value(v)
            .map_err(|e| ManifestError::Malformed(path.clone(), e.to_string()))?;
        let s = Snapshot {
            dir: dir.to_path_buf(),
            manifest,
        };
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), ManifestError> {
        let m = &self.manifest;
        problem(m).map_err(|e| ManifestError::Invalid(self.dir.join(MANIFEST), e))?;
        for b in &m.ram_blocks {
            self.check_size(&b.file, b.size)?;
            if let Some(p) = &b.page_sums {
                self.check_size(&p.file, p.size)?;
            }
        }
        self.check_size(&m.device_state.file, m.device_state.size)?;
        for d in &m.disks {
            self.check_size(&d.file, d.size)?;
        }
        if let Some(t) = &m.trace {
            self.regular(&t.file)?;
        }
        Ok(())
    }

    /// A file of the snapshot, which must be a regular file in its directory: a
    /// symbolic link (which could lead anywhere on the host) or a device, FIFO or
    /// socket (which could block or feed endless bytes) is refused.
    fn regular(&self, file: &str) -> Result<std::fs::Metadata, ManifestError> {
        let p = self.dir.join(file);
        let md = std::fs::symlink_metadata(&p).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ManifestError::Missing(p.clone()),
            _ => ManifestError::Read(p.clone(), e),
        })?;
        if !md.file_type().is_file() {
            return Err(ManifestError::NotRegular(p));
        }
        Ok(md)
    }

    fn check_size(&self, file: &str, want: u64) -> Result<(), ManifestError> {
        let p = self.dir.join(file);
        let md = self.regular(file)?;
        if md.len() != want {
            return Err(ManifestError::Size(p, md.len(), want));
        }
        Ok(())
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The path of a file of the snapshot.
    pub fn path_of(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The trace, if the snapshot has one.
    pub fn trace(&self) -> Result<Option<Trace>, ManifestError> {
        let Some(t) = &self.manifest.trace else {
            return Ok(None);
        };
        let pages: Vec<u64> = self
            .manifest
            .ram_blocks
            .iter()
            .map(|b| b.size / PAGE_SIZE)
            .collect();
        Ok(Some(Trace::read_blocks(&self.path_of(&t.file), &pages)?))
    }

    /// Re-reads every file and checks it against the manifest's checksums; the
    /// first mismatch names its file and, in a RAM image, its chunk and bytes.
    /// `progress(done, total)` in bytes of RAM images.
    pub fn verify(
        &self,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<VerifyReport, ManifestError> {
        let m = &self.manifest;
        let total: u64 = m.ram_blocks.iter().map(|b| b.size).sum();
        let mut done = 0;
        let mut chunks = 0;
        let mut buf = vec![0u8; 8 << 20];
        for b in &m.ram_blocks {
            let p = self.path_of(&b.file);
            let rerr = |e| ManifestError::Read(p.clone(), e);
            let f = open_nofollow(&p).map_err(rerr)?;
            let mut h = ChunkHasher::new(b.size, b.chunk_bytes);
            for r in crate::image::read_ranges(&f, b.size).map_err(rerr)? {
                let mut at = r.start;
                while at < r.end {
                    let n = ((r.end - at) as usize).min(buf.len());
                    f.read_exact_at(&mut buf[..n], at).map_err(rerr)?;
                    h.data(at, &buf[..n]);
                    at += n as u64;
                    progress(done + at, total);
                }
            }
            let sums = h.finish();
            if let Some(i) = (0..sums.len()).find(|&i| hex(sums[i]) != b.checksums[i]) {
                let start = i as u64 * b.chunk_bytes;
                return Err(ManifestError::Checksum {
                    file: b.file.clone(),
                    chunk: i,
                    start,
                    end: (start + b.chunk_bytes).min(b.size),
                });
            }
            chunks += sums.len();
            done += b.size;
            progress(done, total);
        }
        let mut files = m.ram_blocks.len();
        let entries = std::iter::once((&m.device_state.file, &m.device_state.checksum))
            .chain(m.disks.iter().map(|d| (&d.file, &d.checksum)))
            .chain(
                m.ram_blocks
                    .iter()
                    .filter_map(|b| b.page_sums.as_ref().map(|p| (&p.file, &p.checksum))),
            );
        for (file, sum) in entries {
            let h = crate::image::hash_file(&self.path_of(file))?;
            if h.checksum != *sum {
                return Err(ManifestError::FileChecksum(file.clone()));
            }
            files += 1;
        }
        if self.manifest.trace.is_some() {
            self.trace()?;
            files += 1;
        }
        Ok(VerifyReport {
            files,
            chunks,
            bytes: total,
        })
    }

    /// Adds or replaces the snapshot's trace: the trace file, then the manifest,
    /// each written aside and renamed into place, so a reader sees a whole trace
    /// file and a whole manifest (between the two renames, the new trace under the
    /// old manifest's counts). This value keeps the manifest it was opened with;
    /// open the snapshot again to see the new one.
    pub fn replace_trace(&self, trace: &Trace, info: TraceInfo) -> Result<(), ManifestError> {
        let mut m = self.manifest.clone();
        let old = m.trace.replace(info).map(|t| t.file);
        problem(&m).map_err(|e| ManifestError::Invalid(self.dir.join(MANIFEST), e))?;
        let file = &m.trace.as_ref().expect("just set").file;
        let tmp = self.dir.join(format!("{file}.tmp"));
        trace.write(&tmp)?;
        std::fs::rename(&tmp, self.path_of(file))
            .map_err(|e| ManifestError::Write(self.path_of(file), e))?;
        write_json(&self.dir.join(MANIFEST), &m)?;
        if let Some(old) = old.filter(|o| o != file) {
            let _ = std::fs::remove_file(self.path_of(&old));
        }
        sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small complete snapshot: 2 MiB of RAM with some data, a device state file,
    /// one disk, a trace.
    fn make(dir: &Path) -> PathBuf {
        let target = dir.join("snap");
        let sd = SnapshotDir::create(&target).unwrap();
        let ram = dir.join("ram");
        let f = File::create(&ram).unwrap();
        f.set_len(2 << 20).unwrap();
        f.write_all_at(&[5u8; 8192], 1 << 20).unwrap();
        let mut block = crate::image::copy_ram_image(
            &ram,
            &sd.path().join("ram-ram.img"),
            2 << 20,
            1 << 20,
            &mut |_, _| {},
        )
        .unwrap();
        block.id = "ram".into();
        block.file = "ram-ram.img".into();
        std::fs::write(sd.path().join("device.state"), b"QEVM device state").unwrap();
        let dev = crate::image::hash_file(&sd.path().join("device.state")).unwrap();
        std::fs::write(dir.join("disk"), vec![3u8; 65536]).unwrap();
        let disk = crate::image::copy_file(&dir.join("disk"), &sd.path().join("disk-disk0.qcow2"))
            .unwrap();
        let trace = Trace {
            pages: vec![
                crate::TracePage {
                    block: 0,
                    page: 256,
                },
                crate::TracePage { block: 0, page: 3 },
            ],
        };
        trace.write(&sd.path().join("trace.fafl")).unwrap();
        let m = Manifest {
            format: MANIFEST_FORMAT.into(),
            version: FORMAT_VERSION,
            created: "2026-11-24T00:00:00Z".into(),
            vm: "v".into(),
            spec: serde_json::json!({"name": "v"}),
            qemu_version: "7.2.22".into(),
            machine: "pc-i440fx-7.2".into(),
            accel: "tcg".into(),
            ram_blocks: vec![block],
            device_state: FileEntry {
                file: "device.state".into(),
                size: dev.size,
                checksum: dev.checksum,
            },
            disks: vec![DiskEntry {
                id: "disk0".into(),
                file: "disk-disk0.qcow2".into(),
                format: "raw".into(),
                backing: None,
                size: disk.size,
                checksum: disk.checksum,
            }],
            trace: Some(TraceInfo {
                file: "trace.fafl".into(),
                pages: 2,
                source: "post-snapshot".into(),
                wss_sample_pages: Some(4),
                wss_snapshot_pages: 2,
            }),
            pause_ms: 12.0,
            notes: vec![],
            pmem: vec![],
        };
        let partial = sd.path().to_path_buf();
        assert_eq!(sd.commit(&m).unwrap(), target);
        assert!(!partial.exists());
        target
    }

    fn edit(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
        let p = dir.join(MANIFEST);
        let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    }

    fn err(dir: &Path) -> String {
        Snapshot::open(dir).unwrap_err().to_string()
    }

    #[test]
    fn a_complete_snapshot_opens_verifies_and_takes_a_new_trace() {
        let d = tempfile::tempdir().unwrap();
        let s = make(d.path());
        let snap = Snapshot::open(&s).unwrap();
        assert_eq!(snap.manifest().ram_blocks[0].data_bytes, 8192);
        let r = snap.verify(&mut |_, _| {}).unwrap();
        assert_eq!((r.files, r.chunks), (4, 2));
        assert_eq!(snap.trace().unwrap().unwrap().pages.len(), 2);
        let t = Trace {
            pages: vec![crate::TracePage { block: 0, page: 7 }],
        };
        let info = TraceInfo {
            file: "trace.fafl".into(),
            pages: 1,
            source: "restore".into(),
            wss_sample_pages: None,
            wss_snapshot_pages: 1,
        };
        snap.replace_trace(&t, info).unwrap();
        let again = Snapshot::open(&s).unwrap();
        assert_eq!(again.manifest().trace.as_ref().unwrap().source, "restore");
        assert_eq!(again.trace().unwrap().unwrap(), t);
        // Under another name: the old trace file goes.
        let info = TraceInfo {
            file: "trace-restore.fafl".into(),
            pages: 1,
            source: "restore".into(),
            wss_sample_pages: None,
            wss_snapshot_pages: 1,
        };
        again.replace_trace(&t, info).unwrap();
        assert!(!s.join("trace.fafl").exists());
        assert_eq!(Snapshot::open(&s).unwrap().trace().unwrap().unwrap(), t);
        // A trace file name that escapes the directory is refused before anything is written.
        let bad = TraceInfo {
            file: "../t".into(),
            pages: 1,
            source: "restore".into(),
            wss_sample_pages: None,
            wss_snapshot_pages: 1,
        };
        assert!(again
            .replace_trace(&t, bad)
            .unwrap_err()
            .to_string()
            .contains("plain name"));
        assert!(!d.path().join("t.tmp").exists());
        // A snapshot never replaces another.
        assert!(matches!(
            SnapshotDir::create(&s),
            Err(ManifestError::Exists(_))
        ));
    }

    #[test]
    fn an_unfinished_snapshot_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("s");
        let sd = SnapshotDir::create(&target).unwrap();
        std::fs::write(sd.path().join("ram-ram.img"), b"x").unwrap();
        let partial = sd.path().to_path_buf();
        drop(sd);
        assert!(!partial.exists() && !target.exists());
        assert!(matches!(
            Snapshot::open(&target),
            Err(ManifestError::NotSnapshot(_))
        ));
    }

    #[test]
    fn malformed_manifests_are_refused_naming_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let s = make(d.path());
        let orig = std::fs::read(s.join(MANIFEST)).unwrap();
        let reset = || std::fs::write(s.join(MANIFEST), &orig).unwrap();

        std::fs::write(s.join(MANIFEST), &orig[..orig.len() / 2]).unwrap();
        assert!(err(&s).contains("malformed"), "{}", err(&s));
        reset();
        edit(&s, |v| v["format"] = "qemu".into());
        assert!(err(&s).contains("not a rebound-snapshot"), "{}", err(&s));
        reset();
        edit(&s, |v| v["version"] = 2.into());
        assert_eq!(
            err(&s),
            "snapshot format version 2 is newer than this rebound (supports 1)"
        );
        reset();
        edit(&s, |v| v["version"] = 0.into());
        assert!(
            err(&s).contains("version 0 is not supported"),
            "{}",
            err(&s)
        );
        reset();
        edit(&s, |v| {
            v["ram_blocks"][0]["checksums"] = serde_json::json!(["00"])
        });
        assert!(err(&s).contains("1 checksums for 2 chunks"), "{}", err(&s));
        reset();
        edit(&s, |v| {
            v["ram_blocks"][0]["file"] = "../../etc/passwd".into()
        });
        assert!(err(&s).contains("plain name"), "{}", err(&s));
        reset();
        edit(&s, |v| v["ram_blocks"][0]["chunk_bytes"] = 3000.into());
        assert!(err(&s).contains("power of two"), "{}", err(&s));
        reset();
        edit(&s, |v| v["ram_blocks"][0]["size"] = (1u64 << 50).into());
        assert!(err(&s).contains("whole number of pages"), "{}", err(&s));
        reset();
        edit(&s, |v| v["ram_blocks"] = serde_json::json!([]));
        assert!(err(&s).contains("no RAM blocks"), "{}", err(&s));
        reset();
        edit(&s, |v| {
            v["ram_blocks"][0]["checksums"][1] = "not hex at all!!".into()
        });
        assert!(err(&s).contains("is not 16 hex digits"), "{}", err(&s));
        reset();
        edit(&s, |v| v["device_state"]["file"] = "ram-ram.img".into());
        assert!(
            err(&s).contains("\"ram-ram.img\" is listed twice"),
            "{}",
            err(&s)
        );
        reset();
        edit(&s, |v| v["trace"]["file"] = "..".into());
        assert!(err(&s).contains("plain name"), "{}", err(&s));
        reset();
        edit(&s, |v| v["pause_ms"] = "soon".into());
        assert!(err(&s).contains("malformed"), "{}", err(&s));
        reset();
        // Oversized: refused before it is read.
        let f = File::create(s.join(MANIFEST)).unwrap();
        f.set_len(MANIFEST_MAX + 1).unwrap();
        assert!(err(&s).contains("larger than"), "{}", err(&s));
        reset();
        // Every field present and fuzzed values of the wrong type are errors, never panics.
        let v: serde_json::Value = serde_json::from_slice(&orig).unwrap();
        for key in v.as_object().unwrap().keys() {
            for junk in [
                serde_json::json!(null),
                serde_json::json!(-1),
                serde_json::json!({"x": []}),
            ] {
                edit(&s, |m| m[key] = junk.clone());
                let _ = Snapshot::open(&s).map(|_| ());
                reset();
            }
        }
        Snapshot::open(&s).unwrap();
    }

    /// A small xorshift generator: the same mutations on every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n.max(1) as u64) as usize
        }
    }

    /// `m` with one random change: flipped bytes, a cut, a number made huge or
    /// negative or fractional, a string made huge or odd, deep nesting.
    fn mutate(m: &[u8], rng: &mut Rng) -> Vec<u8> {
        let mut m = m.to_vec();
        let at = rng.below(m.len());
        match rng.below(6) {
            0 => {
                for _ in 0..=rng.below(4) {
                    let i = rng.below(m.len());
                    m[i] ^= 1 << rng.below(8);
                }
            }
            1 => m.truncate(at),
            2 => {
                let digits = m.iter().enumerate().filter(|(_, b)| b.is_ascii_digit());
                let starts: Vec<usize> = digits.map(|(i, _)| i).collect();
                let i = starts[rng.below(starts.len())];
                let end = i + m[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                let huge = [
                    "18446744073709551616",
                    "99999999999999999999999999999999",
                    "-1",
                    "1e400",
                    "0.5",
                    "4294967296",
                    "18446744073709551615",
                ];
                m.splice(i..end, huge[rng.below(huge.len())].bytes());
            }
            3 => {
                let quotes: Vec<usize> = (0..m.len()).filter(|&i| m[i] == b'"').collect();
                let i = quotes[rng.below(quotes.len())] + 1;
                let end = i + m[i..].iter().take_while(|&&b| b != b'"').count();
                let odd = [
                    "x".repeat(1 << 18),
                    "../".repeat(1000),
                    "\\u0000".into(),
                    "\\ud800".into(),
                    "line\\nbreak".into(),
                    String::new(),
                ];
                m.splice(i..end, odd[rng.below(odd.len())].bytes());
            }
            4 => {
                let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
                m.splice(at..at, deep.bytes());
            }
            _ => {
                let end = (at + rng.below(64)).min(m.len());
                let dup = m[at..end].to_vec();
                m.splice(at..at, dup);
            }
        }
        m
    }

    #[test]
    fn fuzzed_manifests_never_panic_and_fail_in_one_short_line() {
        let d = tempfile::tempdir().unwrap();
        let s = make(d.path());
        let orig = std::fs::read(s.join(MANIFEST)).unwrap();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut refused = 0;
        for i in 0..2000 {
            let m = mutate(&orig, &mut rng);
            std::fs::write(s.join(MANIFEST), &m).unwrap();
            let shown = || String::from_utf8_lossy(&m[..m.len().min(2000)]).to_string();
            let r = std::panic::catch_unwind(|| {
                let snap = Snapshot::open(&s)?;
                snap.trace()?;
                snap.verify(&mut |_, _| {})
            });
            let r = r.unwrap_or_else(|_| panic!("mutation {i} panicked: {}", shown()));
            if let Err(e) = r {
                refused += 1;
                let line = rebound_errors::chain(&e);
                assert!(
                    !line.contains('\n') && !line.is_empty() && line.len() < 1000,
                    "mutation {i}: not one short line: {line:.2000}"
                );
            }
        }
        // Most mutations break the manifest; the original still opens.
        assert!(refused > 1500, "{refused}");
        std::fs::write(s.join(MANIFEST), &orig).unwrap();
        Snapshot::open(&s).unwrap().verify(&mut |_, _| {}).unwrap();
    }

    #[test]
    fn damaged_files_are_found() {
        let d = tempfile::tempdir().unwrap();
        let s = make(d.path());
        let img = s.join("ram-ram.img");
        // A flipped byte: found by verify, with the chunk and its bytes.
        let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
        f.write_all_at(&[6u8], (1 << 20) + 10).unwrap();
        let e = Snapshot::open(&s)
            .unwrap()
            .verify(&mut |_, _| {})
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "ram-ram.img: checksum mismatch in chunk 1 (bytes 1048576..2097152): the snapshot is damaged"
        );
        f.write_all_at(&[5u8], (1 << 20) + 10).unwrap();
        std::fs::write(s.join("device.state"), b"QEVM device statf").unwrap();
        let e = Snapshot::open(&s)
            .unwrap()
            .verify(&mut |_, _| {})
            .unwrap_err();
        assert!(
            e.to_string().contains("device.state: checksum mismatch"),
            "{e}"
        );
        // Truncated image: refused at open, naming both sizes.
        f.set_len(1 << 20).unwrap();
        assert!(
            err(&s).contains("is 1048576 bytes, the manifest says 2097152"),
            "{}",
            err(&s)
        );
        std::fs::remove_file(&img).unwrap();
        assert!(err(&s).contains("ram-ram.img is missing"), "{}", err(&s));
    }

    #[test]
    fn links_and_special_files_in_a_snapshot_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = make(d.path());
        let outside = d.path().join("outside.img");
        // The image replaced by a link to a file of the same size elsewhere.
        let img = s.join("ram-ram.img");
        std::fs::rename(&img, &outside).unwrap();
        std::os::unix::fs::symlink(&outside, &img).unwrap();
        assert!(
            err(&s).contains("ram-ram.img is not a regular file"),
            "{}",
            err(&s)
        );
        std::fs::remove_file(&img).unwrap();
        std::fs::rename(&outside, &img).unwrap();
        Snapshot::open(&s).unwrap();
        // The device state as a FIFO: refused before anything reads it.
        let dev = s.join("device.state");
        std::fs::remove_file(&dev).unwrap();
        nix_mkfifo(&dev);
        assert!(
            err(&s).contains("device.state is not a regular file"),
            "{}",
            err(&s)
        );
        // The manifest itself as a link to a valid manifest elsewhere.
        let m = s.join(MANIFEST);
        let moved = d.path().join("m.json");
        std::fs::rename(&m, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &m).unwrap();
        assert!(
            err(&s).contains("manifest.json is not a regular file"),
            "{}",
            err(&s)
        );
    }

    fn nix_mkfifo(p: &Path) {
        let st = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    }
}
