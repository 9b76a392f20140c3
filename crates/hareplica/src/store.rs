//! The backup's files: a replica image and a write-ahead log of commits.
//!
//! # `replica.img` (version 1)
//! A 64-byte header, then the heap image, then the digest table.
//!
//! | bytes  | field        |                                                           |
//! |--------|--------------|-----------------------------------------------------------|
//! | 0..8   | magic        | `RBHAIMG\0`                                               |
//! | 8..12  | version      | 1                                                         |
//! | 12..16 | header_len   | 64                                                        |
//! | 16..24 | heap_size    | at most [`MAX_HEAP`]                                      |
//! | 24..32 | last_tx      |                                                           |
//! | 32..40 | epoch        |                                                           |
//! | 40..44 | digest_count | at most [`DIGEST_WINDOW`]; 12 bytes each: tx u64, crc u32 |
//! | 44..48 | crc32        | of the whole file with this field zeroed                  |
//!
//! The directory is made 0700 and every file in it 0600 (the heap's bytes are the
//! application's data); files an older version left readable are made 0600 on open.
//!
//! The file is only ever replaced whole: written to `replica.img.tmp`, fsynced, renamed,
//! and the directory fsynced. A file that is truncated, oversized, of another magic or
//! version, or fails its checksum is refused and left untouched.
//!
//! # `replica.wal` (version 1)
//! A 16-byte header (`RBHAWAL\0`, version u32, zero u32) then records:
//! `type u8` (1 whole commit, 2 epoch, 3 commit part, 4 commit end), three zero bytes,
//! `len u32`, `crc32 u32` (of type, len and payload), payload (the commit frame's wire
//! payload, or the new epoch as u64). A commit's record is written (and fsynced when
//! durable) before it is acknowledged; epoch records are always fsynced. A streamed
//! transaction is its part records (logged as they arrive) closed by its end record, which
//! counts them: on replay, part 0 starts a transaction afresh, and parts that no end
//! closes (a primary that gave up or a link that broke) are dropped by the next whole
//! commit, end, or epoch record. A checkpoint keeps the part records of the transaction
//! in progress (copied to the front of the emptied log), and an end record is written only
//! after all its parts: a log never holds an end whose parts it lost. On start, complete records are replayed over the image through the
//! same rules as live commits (records the image already holds are skipped); an
//! incomplete or corrupt tail, what a crash mid-write leaves, is cut off. A checkpoint
//! writes a new image and then empties the log. While a backup runs, the file also holds
//! zeros after the last record: space reserved for appending through a mapping
//! (`store/wal.rs`); they end the replay like a torn tail but are not reported as one, and are
//! cut off on open and on a clean close.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::replica::{ReplicaState, Verdict, DIGEST_WINDOW};
use crate::wire::{le_u32, le_u64, Commit, CommitKind, FrameType, MAX_COMMIT_PAYLOAD, MAX_HEAP};
use wal::WalFile;

mod wal;

const IMG_MAGIC: [u8; 8] = *b"RBHAIMG\0";
const WAL_MAGIC: [u8; 8] = *b"RBHAWAL\0";
pub const IMG_VERSION: u32 = 1;
pub const WAL_VERSION: u32 = 1;
const IMG_HEADER: usize = 64;
const WAL_HEADER: usize = 16;
const REC_HEADER: usize = 12;
const REC_COMMIT: u8 = 1;
const REC_EPOCH: u8 = 2;
const REC_PART: u8 = 3;
const REC_END: u8 = 4;
const DIGEST_LEN: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{0} is locked by another running backup")]
    Locked(PathBuf),
    #[error("{path}: {why}; refusing to use it (it is left untouched)")]
    BadImage { path: PathBuf, why: String },
    #[error("{path}: {why}; refusing to use it (it is left untouched)")]
    BadWal { path: PathBuf, why: String },
    #[error("tx {tx} ends after {want} parts but the log holds {have} of them")]
    PartsMissing { tx: u64, want: u32, have: u32 },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What opening a replica directory found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub image_found: bool,
    pub records_replayed: u64,
    pub records_skipped: u64,
    /// Bytes of an incomplete or corrupt log tail (cut off when opened for writing).
    pub torn_tail_bytes: u64,
    pub wal_bytes: u64,
}

/// The replica directory, opened for writing by one backup.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    wal: WalFile,
    durable: bool,
    /// The part records of the streamed transaction in progress, as replay would collect
    /// them: where the first starts in the log, and how many there are.
    open_parts: Option<(u64, u32)>,
    _lock: File,
}

fn img_path(dir: &Path) -> PathBuf {
    dir.join("replica.img")
}

fn wal_path(dir: &Path) -> PathBuf {
    dir.join("replica.wal")
}

impl Store {
    /// Opens (creating if needed) and locks `dir`, loads the image and replays the log.
    pub fn open(
        dir: &Path,
        durable: bool,
    ) -> Result<(Store, ReplicaState, OpenReport), StoreError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err("create", dir))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err("open", &lock_path))?;
        // SAFETY: flock only reads the descriptor, which `lock` keeps open for this call.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(StoreError::Locked(dir.to_path_buf()));
        }
        let (state, mut report, valid_len) = load(dir)?;
        let wp = wal_path(dir);
        let wal = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&wp)
            .map_err(io_err("open", &wp))?;
        for (f, path) in [(&wal, &wp), (&lock, &lock_path)] {
            f.set_permissions(fs::Permissions::from_mode(0o600))
                .map_err(io_err("chmod", path))?;
        }
        let wal_len = if valid_len < WAL_HEADER as u64 {
            wal.set_len(0).map_err(io_err("truncate", &wp))?;
            wal.write_all_at(&wal_header(), 0)
                .map_err(io_err("write", &wp))?;
            wal.sync_all().map_err(io_err("fsync", &wp))?;
            WAL_HEADER as u64
        } else {
            // Cut a torn tail, and the space a killed backup had reserved.
            let file_len = wal.metadata().map_err(io_err("stat", &wp))?.len();
            if file_len > valid_len {
                wal.set_len(valid_len).map_err(io_err("truncate", &wp))?;
                wal.sync_all().map_err(io_err("fsync", &wp))?;
            }
            valid_len
        };
        report.wal_bytes = wal_len - WAL_HEADER as u64;
        let store = Store {
            dir: dir.to_path_buf(),
            wal: WalFile::new(wal, &wp, wal_len),
            durable,
            // Parts a previous run left open are given up: their primary resends them.
            open_parts: None,
            _lock: lock,
        };
        Ok((store, state, report))
    }

    /// Reads `dir` without locking or changing anything (for status and dump).
    pub fn load_readonly(dir: &Path) -> Result<(ReplicaState, OpenReport), StoreError> {
        let (state, mut report, valid_len) = load(dir)?;
        report.wal_bytes = valid_len.saturating_sub(WAL_HEADER as u64);
        Ok((state, report))
    }

    pub fn durable(&self) -> bool {
        self.durable
    }

    /// Log bytes since the last checkpoint.
    pub fn wal_bytes(&self) -> u64 {
        self.wal.len() - WAL_HEADER as u64
    }

    /// Gets the log ready for the next appends; call when there is nothing else to do.
    pub fn idle(&mut self) {
        self.wal.prepare();
    }

    /// Appends a commit record (whole, part or end, as `c.kind` says); call
    /// [`barrier`](Self::barrier) before acknowledging it.
    pub fn append_commit(&mut self, c: &Commit) -> Result<(), StoreError> {
        let at = self.wal.len();
        // The same rules as `replay`'s for which parts an end closes.
        let (ty, open) = match (c.kind, self.open_parts) {
            (CommitKind::Whole, _) => (REC_COMMIT, None),
            (CommitKind::Part { index: 0 }, _) => (REC_PART, Some((at, 1))),
            (CommitKind::Part { index }, Some((start, n))) if index == n => {
                (REC_PART, Some((start, n + 1)))
            }
            (CommitKind::Part { .. }, _) => (REC_PART, None),
            (CommitKind::End { parts }, open) => {
                let have = open.map_or(0, |(_, n)| n);
                if have != parts {
                    // Replay would refuse this end, and with it the whole replica.
                    return Err(StoreError::PartsMissing {
                        tx: c.tx_id,
                        want: parts,
                        have,
                    });
                }
                (REC_END, None)
            }
        };
        self.append(ty, &c.payload)?;
        self.open_parts = open;
        Ok(())
    }

    /// Records a new epoch, on disk before the caller acts on it.
    pub fn append_epoch(&mut self, epoch: u64) -> Result<(), StoreError> {
        self.append(REC_EPOCH, &epoch.to_le_bytes())?;
        self.open_parts = None;
        self.wal.sync()
    }

    fn append(&mut self, ty: u8, payload: &[u8]) -> Result<(), StoreError> {
        let mut hdr = [0u8; REC_HEADER];
        hdr[0] = ty;
        hdr[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let crc = rec_crc(&hdr, payload);
        hdr[8..12].copy_from_slice(&crc.to_le_bytes());
        self.wal.append(&hdr, payload)
    }

    /// Makes appended commits durable when the backup runs with `--durable`.
    pub fn barrier(&mut self) -> Result<(), StoreError> {
        if self.durable {
            self.wal.sync()?;
        }
        Ok(())
    }

    /// Writes `state` as the new image and empties the log but for the parts of the
    /// transaction in progress, which the image does not hold yet.
    pub fn checkpoint(&mut self, state: &ReplicaState) -> Result<(), StoreError> {
        write_image(&img_path(&self.dir), state)?;
        let keep_from = self.open_parts.map(|(start, _)| start);
        // Until the parts are back in the log, an end must not be logged.
        let open = self.open_parts.take();
        self.wal.truncate_keeping(WAL_HEADER as u64, keep_from)?;
        self.open_parts = open.map(|(_, n)| (WAL_HEADER as u64, n));
        Ok(())
    }

    /// Writes `state` as the new image and empties the log, parts in progress included
    /// (a new heap replaces everything).
    pub fn reset(&mut self, state: &ReplicaState) -> Result<(), StoreError> {
        self.open_parts = None;
        self.checkpoint(state)
    }
}

fn wal_header() -> [u8; WAL_HEADER] {
    let mut h = [0u8; WAL_HEADER];
    h[0..8].copy_from_slice(&WAL_MAGIC);
    h[8..12].copy_from_slice(&WAL_VERSION.to_le_bytes());
    h
}

fn rec_crc(hdr: &[u8; REC_HEADER], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&hdr[0..8]);
    h.update(payload);
    h.finalize()
}

/// Loads the image and replays the log; returns the valid log length.
fn load(dir: &Path) -> Result<(ReplicaState, OpenReport, u64), StoreError> {
    let mut report = OpenReport::default();
    let ip = img_path(dir);
    let mut state = match File::open(&ip) {
        Ok(f) => {
            report.image_found = true;
            read_image(&ip, f)?
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => ReplicaState::default(),
        Err(e) => return Err(io_err("open", &ip)(e)),
    };
    let wp = wal_path(dir);
    let wal = match fs::read(&wp) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((state, report, 0)),
        Err(e) => return Err(io_err("read", &wp)(e)),
    };
    let valid = replay(&wp, &wal, &mut state, &mut report)?;
    Ok((state, report, valid))
}

fn replay(
    wp: &Path,
    wal: &[u8],
    state: &mut ReplicaState,
    report: &mut OpenReport,
) -> Result<u64, StoreError> {
    let bad = |why: String| StoreError::BadWal {
        path: wp.to_path_buf(),
        why,
    };
    if wal.len() < WAL_HEADER {
        // A crash while creating the log; nothing was logged yet.
        report.torn_tail_bytes = wal.len() as u64;
        return Ok(0);
    }
    if wal[0..8] != WAL_MAGIC {
        return Err(bad("not a rebound-ha write-ahead log (bad magic)".into()));
    }
    let version = le_u32(&wal[8..]);
    if version != WAL_VERSION {
        return Err(bad(format!(
            "log version {version} is not supported (expected {WAL_VERSION})"
        )));
    }
    let mut pos = WAL_HEADER;
    // Parts of the streamed transaction being read, not yet closed by an end record.
    let mut parts: Vec<Commit> = Vec::new();
    while pos < wal.len() {
        let Some(rec) = parse_record(&wal[pos..]) else {
            break;
        };
        let (ty, payload) = rec;
        match ty {
            REC_EPOCH if payload.len() == 8 => {
                state.epoch = state.epoch.max(le_u64(payload));
                parts.clear();
                report.records_replayed += 1;
            }
            REC_PART => {
                let p = Commit::parse_as(FrameType::CommitPart, payload.to_vec())
                    .map_err(|e| bad(format!("record at byte {pos}: {e}")))?;
                if p.kind == (CommitKind::Part { index: 0 }) {
                    parts.clear();
                }
                if p.kind
                    == (CommitKind::Part {
                        index: parts.len() as u32,
                    })
                {
                    parts.push(p);
                } else {
                    // A part that follows no part 0 of its transaction: a broken run.
                    parts.clear();
                    report.records_skipped += 1;
                }
            }
            REC_COMMIT | REC_END => {
                let frame = match ty {
                    REC_COMMIT => FrameType::Commit,
                    _ => FrameType::CommitEnd,
                };
                let c = Commit::parse_as(frame, payload.to_vec())
                    .map_err(|e| bad(format!("record at byte {pos}: {e}")))?;
                let mut taken = std::mem::take(&mut parts);
                if ty == REC_COMMIT {
                    // Parts before a whole commit were given up by their primary.
                    report.records_skipped += taken.len() as u64;
                    taken.clear();
                }
                match state.judge_tx(&taken, &c) {
                    Verdict::Apply => {
                        state.apply_tx(&taken, &c);
                        report.records_replayed += 1 + taken.len() as u64;
                    }
                    // Already in the image (a crash between checkpoint and log truncation).
                    _ if c.epoch < state.epoch || c.tx_id <= state.last_tx => {
                        report.records_skipped += 1
                    }
                    Verdict::Refuse(_, why) => {
                        return Err(bad(format!(
                            "record at byte {pos} does not fit the image: {why}"
                        )))
                    }
                    Verdict::Duplicate => report.records_skipped += 1,
                }
            }
            t => return Err(bad(format!("record at byte {pos} has unknown type {t}"))),
        }
        pos += REC_HEADER + payload.len();
    }
    // Zeros after the last record are space a backup had reserved, not a torn record.
    let tail = &wal[pos..];
    report.torn_tail_bytes = tail.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1) as u64;
    Ok(pos as u64)
}

/// A complete record with a good checksum at the start of `b`, or `None` (torn tail).
fn parse_record(b: &[u8]) -> Option<(u8, &[u8])> {
    if b.len() < REC_HEADER {
        return None;
    }
    let hdr: &[u8; REC_HEADER] = b[..REC_HEADER].try_into().ok()?;
    let len = le_u32(&hdr[4..]);
    if len > MAX_COMMIT_PAYLOAD || b.len() - REC_HEADER < len as usize {
        return None;
    }
    let payload = &b[REC_HEADER..REC_HEADER + len as usize];
    (rec_crc(hdr, payload) == le_u32(&hdr[8..])).then_some((hdr[0], payload))
}

fn read_image(path: &Path, mut f: File) -> Result<ReplicaState, StoreError> {
    let bad = |why: String| StoreError::BadImage {
        path: path.to_path_buf(),
        why,
    };
    let file_len = f.metadata().map_err(io_err("stat", path))?.len();
    if file_len < IMG_HEADER as u64 {
        return Err(bad(format!(
            "truncated: {file_len} bytes, the header alone needs {IMG_HEADER}"
        )));
    }
    let mut hdr = [0u8; IMG_HEADER];
    f.read_exact(&mut hdr).map_err(io_err("read", path))?;
    if hdr[0..8] != IMG_MAGIC {
        return Err(bad("not a rebound-ha replica image (bad magic)".into()));
    }
    let version = le_u32(&hdr[8..]);
    if version != IMG_VERSION {
        return Err(bad(format!(
            "image version {version} is not supported (expected {IMG_VERSION})"
        )));
    }
    let header_len = le_u32(&hdr[12..]);
    let heap_size = le_u64(&hdr[16..]);
    let digest_count = le_u32(&hdr[40..]) as u64;
    if header_len as usize != IMG_HEADER || heap_size == 0 || heap_size > MAX_HEAP {
        return Err(bad(format!(
            "header length {header_len} / heap size {heap_size} out of range"
        )));
    }
    if digest_count > DIGEST_WINDOW as u64 {
        return Err(bad(format!(
            "{digest_count} digests exceed the cap of {DIGEST_WINDOW}"
        )));
    }
    let want = IMG_HEADER as u64 + heap_size + digest_count * DIGEST_LEN as u64;
    if file_len != want {
        let what = if file_len < want {
            "truncated"
        } else {
            "oversized"
        };
        return Err(bad(format!(
            "{what}: {file_len} bytes, the header says {want}"
        )));
    }
    let mut image = vec![0u8; heap_size as usize];
    read_progress(&mut f, &mut image, path)?;
    let mut dig = vec![0u8; digest_count as usize * DIGEST_LEN];
    f.read_exact(&mut dig).map_err(io_err("read", path))?;
    let stored = le_u32(&hdr[44..]);
    hdr[44..48].fill(0);
    let mut h = crc32fast::Hasher::new();
    h.update(&hdr);
    h.update(&image);
    h.update(&dig);
    let actual = h.finalize();
    if actual != stored {
        return Err(bad(format!(
            "checksum mismatch (stored {stored:08x}, computed {actual:08x})"
        )));
    }
    let digests = dig
        .chunks_exact(DIGEST_LEN)
        .map(|d| (le_u64(d), le_u32(&d[8..])))
        .collect();
    Ok(ReplicaState {
        heap_size,
        last_tx: le_u64(&hdr[24..]),
        epoch: le_u64(&hdr[32..]),
        image,
        digests,
    })
}

const PROGRESS_STEP: usize = 256 << 20;

fn read_progress(f: &mut File, buf: &mut [u8], path: &Path) -> Result<(), StoreError> {
    let total = buf.len();
    for (i, chunk) in buf.chunks_mut(PROGRESS_STEP).enumerate() {
        f.read_exact(chunk).map_err(io_err("read", path))?;
        if total > PROGRESS_STEP {
            tracing::info!(
                "read {} of {} MiB of {}",
                ((i * PROGRESS_STEP) + chunk.len()) >> 20,
                total >> 20,
                path.display()
            );
        }
    }
    Ok(())
}

/// Serializes `state` as an image file body (header, image, digests), for checkpoints
/// and dumps.
fn image_header(state: &ReplicaState, dig: &[u8]) -> [u8; IMG_HEADER] {
    let mut hdr = [0u8; IMG_HEADER];
    hdr[0..8].copy_from_slice(&IMG_MAGIC);
    hdr[8..12].copy_from_slice(&IMG_VERSION.to_le_bytes());
    hdr[12..16].copy_from_slice(&(IMG_HEADER as u32).to_le_bytes());
    hdr[16..24].copy_from_slice(&state.heap_size.to_le_bytes());
    hdr[24..32].copy_from_slice(&state.last_tx.to_le_bytes());
    hdr[32..40].copy_from_slice(&state.epoch.to_le_bytes());
    hdr[40..44].copy_from_slice(&((dig.len() / DIGEST_LEN) as u32).to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    h.update(&hdr);
    h.update(&state.image);
    h.update(dig);
    hdr[44..48].copy_from_slice(&h.finalize().to_le_bytes());
    hdr
}

/// Atomically replaces `path` with `state`: temp file, fsync, rename, fsync of the directory.
fn write_image(path: &Path, state: &ReplicaState) -> Result<(), StoreError> {
    let mut dig = Vec::with_capacity(state.digests.len() * DIGEST_LEN);
    for (tx, crc) in &state.digests {
        dig.extend_from_slice(&tx.to_le_bytes());
        dig.extend_from_slice(&crc.to_le_bytes());
    }
    let hdr = image_header(state, &dig);
    let tmp = path.with_extension("img.tmp");
    let f = create_private(&tmp)?;
    let total = (IMG_HEADER + state.image.len() + dig.len()) as u64;
    f.set_len(total).map_err(io_err("size", &tmp))?;
    f.write_all_at(&hdr, 0).map_err(io_err("write", &tmp))?;
    write_sparse(&f, &state.image, IMG_HEADER as u64, &tmp)?;
    f.write_all_at(&dig, IMG_HEADER as u64 + state.image.len() as u64)
        .map_err(io_err("write", &tmp))?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

/// Creates (or empties) `path` for writing, mode 0600, whatever mode it had.
fn create_private(path: &Path) -> Result<File, StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    f.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io_err("chmod", path))?;
    Ok(f)
}

/// Writes `data` at `base`, leaving all-zero 64 KiB chunks as holes of the pre-sized file.
fn write_sparse(f: &File, data: &[u8], base: u64, path: &Path) -> Result<(), StoreError> {
    const CHUNK: usize = 64 << 10;
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        if chunk.iter().all(|&b| b == 0) {
            continue;
        }
        f.write_all_at(chunk, base + (i * CHUNK) as u64)
            .map_err(io_err("write", path))?;
        if data.len() > PROGRESS_STEP && (i * CHUNK).is_multiple_of(PROGRESS_STEP) {
            tracing::info!(
                "wrote {} of {} MiB of {}",
                (i * CHUNK) >> 20,
                data.len() >> 20,
                path.display()
            );
        }
    }
    Ok(())
}

/// Writes the raw heap image of `state` to `out` (temp file + rename), for `dump`.
pub fn dump_raw(state: &ReplicaState, out: &Path) -> Result<(), StoreError> {
    let tmp = out.with_extension("tmp-dump");
    let f = create_private(&tmp)?;
    f.set_len(state.image.len() as u64)
        .map_err(io_err("size", &tmp))?;
    write_sparse(&f, &state.image, 0, &tmp)?;
    f.sync_all().map_err(io_err("fsync", &tmp))?;
    fs::rename(&tmp, out).map_err(io_err("rename", &tmp))
}

#[cfg(test)]
mod tests;
