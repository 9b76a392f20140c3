//! Appending to `replica.wal` without a system call per record.
//!
//! Every frame the backup acknowledges is logged first, so the append sits on the commit's
//! round trip. A `write` to an ext4 file cost 2–3 µs here (a 6.18 kernel under a
//! hypervisor); copying into a shared mapping of space reserved ahead costs a `memcpy`.
//! The space is reserved with `fallocate`, so a full disk fails the reservation with an
//! error instead of killing the backup with SIGBUS on a store into the mapping (on ext4,
//! xfs and tmpfs; see the SAFETY comment in `reserve` for copy-on-write file systems), and
//! it is pre-faulted for writing a little ahead (`MADV_POPULATE_WRITE`) while the backup
//! is idle.
//! What is appended is in the page cache at once, as a `write` would put it: it survives the
//! backup's death; `sync` (fdatasync) makes it survive power loss.
//!
//! The reserved tail reads as zeros, which is never a valid record: replay stops there
//! (`replay` does not count zeros as a torn tail), opening cuts it off, and a clean close
//! trims it. On a filesystem without `fallocate` the log falls back to `write` calls.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use memmap2::{Advice, MmapMut, MmapOptions};

use super::{io_err, StoreError};

/// Space reserved at a time.
const RESERVE_STEP: u64 = 4 << 20;
/// How far ahead of the end pages are pre-faulted, and how much one idle call pre-faults.
const READY_AHEAD: u64 = 256 << 10;
const READY_STEP: u64 = 32 << 10;

#[derive(Debug)]
pub(super) struct WalFile {
    file: File,
    path: PathBuf,
    /// Header plus complete records: where the next record goes.
    len: u64,
    /// File bytes reserved and mapped (the mapping covers `[0, reserved)`).
    reserved: u64,
    map: Option<MmapMut>,
    /// Bytes from the start pre-faulted for writing.
    ready: u64,
    /// `fallocate` is not supported here: no mapping, append with `write`.
    plain: bool,
}

impl WalFile {
    /// Takes over `file`, whose first `len` bytes are the header and valid records and
    /// which holds nothing after them.
    pub(super) fn new(file: File, path: &Path, len: u64) -> WalFile {
        WalFile {
            file,
            path: path.to_path_buf(),
            len,
            reserved: len,
            map: None,
            ready: 0,
            plain: false,
        }
    }

    /// Appends with `write` from now on, as on a filesystem without `fallocate`.
    #[cfg(test)]
    pub(super) fn force_plain(&mut self) {
        self.plain = true;
        self.map = None;
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Appends one record, `head` then `body`.
    pub(super) fn append(&mut self, head: &[u8], body: &[u8]) -> Result<(), StoreError> {
        let n = (head.len() + body.len()) as u64;
        if !self.plain && self.len + n > self.reserved {
            self.reserve(self.len + n)?;
        }
        match &mut self.map {
            Some(m) => {
                let at = self.len as usize;
                m[at..at + head.len()].copy_from_slice(head);
                m[at + head.len()..at + n as usize].copy_from_slice(body);
            }
            None => {
                // One positional write of the whole record: no file offset to keep.
                if let Err(e) = self.file.write_all_at(&[head, body].concat(), self.len) {
                    // Cut a partial record so later records are not hidden behind it.
                    let _ = self.file.set_len(self.len);
                    return Err(io_err("append to", &self.path)(e));
                }
            }
        }
        self.len += n;
        Ok(())
    }

    /// Makes everything appended durable.
    pub(super) fn sync(&self) -> Result<(), StoreError> {
        self.file.sync_data().map_err(io_err("fsync", &self.path))
    }

    /// Empties the log down to its header, on disk before it returns.
    pub(super) fn truncate_to(&mut self, header: u64) -> Result<(), StoreError> {
        self.map = None;
        self.file
            .set_len(header)
            .map_err(io_err("truncate", &self.path))?;
        self.file.sync_all().map_err(io_err("fsync", &self.path))?;
        (self.len, self.reserved, self.ready) = (header, header, 0);
        Ok(())
    }

    /// Empties the log down to its header, then appends again the records that started
    /// at `keep_from` (when given): appended as any record is (durable at the next `sync`).
    pub(super) fn truncate_keeping(
        &mut self,
        header: u64,
        keep_from: Option<u64>,
    ) -> Result<(), StoreError> {
        let kept = match keep_from {
            Some(from) if from < self.len => self.read(from)?,
            _ => Vec::new(),
        };
        self.truncate_to(header)?;
        if !kept.is_empty() {
            self.append(&kept, &[])?;
        }
        Ok(())
    }

    /// The log's bytes from `from` to its end.
    fn read(&self, from: u64) -> Result<Vec<u8>, StoreError> {
        if let Some(m) = &self.map {
            return Ok(m[from as usize..self.len as usize].to_vec());
        }
        let mut buf = vec![0u8; (self.len - from) as usize];
        self.file
            .read_exact_at(&mut buf, from)
            .map_err(io_err("read", &self.path))?;
        Ok(buf)
    }

    /// Pre-faults the next stretch of reserved space for writing; call when idle. Failure
    /// only means later stores fault on their own (a kernel before 5.14).
    pub(super) fn prepare(&mut self) {
        let Some(m) = &self.map else { return };
        let target = (self.len + READY_AHEAD).min(self.reserved);
        if self.ready >= target {
            return;
        }
        // madvise wants a page-aligned start; memmap2 rounds it down.
        let start = self.ready.max(self.len);
        let end = (start + READY_STEP).min(self.reserved);
        let _ = m.advise_range(
            Advice::PopulateWrite,
            start as usize,
            (end - start) as usize,
        );
        self.ready = end;
    }

    /// Reserves and maps space for at least `need` bytes.
    fn reserve(&mut self, need: u64) -> Result<(), StoreError> {
        let new = need.div_ceil(RESERVE_STEP) * RESERVE_STEP + RESERVE_STEP;
        // SAFETY: fallocate reads the descriptor `self.file` keeps open; mode 0 allocates
        // [reserved, new) and extends the file size, changing no byte we wrote.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                0,
                self.reserved as libc::off_t,
                (new - self.reserved) as libc::off_t,
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                tracing::info!(
                    "{}: no fallocate here, appending with write",
                    self.path.display()
                );
                self.plain = true;
                self.map = None;
                return Ok(());
            }
            return Err(io_err("reserve space in", &self.path)(e));
        }
        self.map = None;
        // SAFETY: the file is ours alone (its directory is 0700 and its lock keeps other
        // backups out) and is only shortened by `truncate_to`, which drops this mapping
        // first, so every mapped byte lies inside the file: no access faults for being past
        // its end. The mapping lives in `self` next to the file, and no reference into it
        // outlives a call. When the file system runs out of space: `fallocate` above
        // fails with ENOSPC before any byte is mapped, the append returns that error, the
        // connection refuses the commit (nothing unlogged is acknowledged) and the log
        // keeps every record before it. On ext4, xfs and tmpfs the blocks fallocate
        // reserved are the ones later stores fill, so a store into the mapping never
        // needs new space. On a copy-on-write file system (btrfs) or a thin-provisioned
        // device, allocated space is no promise for later writes: a store can still fault
        // with SIGBUS, which kills the backup before it acknowledges the record being
        // written (a restart replays the complete records and cuts the torn one), or
        // writeback can fail later, which `sync` reports (a --durable backup then withholds
        // its acknowledgements; a backup without it does not notice).
        let map = unsafe { MmapOptions::new().len(new as usize).map_mut(&self.file) }
            .map_err(io_err("map", &self.path))?;
        self.map = Some(map);
        self.reserved = new;
        Ok(())
    }
}

impl Drop for WalFile {
    fn drop(&mut self) {
        // A cleanly closed log holds its records only.
        self.map = None;
        if self.reserved > self.len {
            let _ = self.file.set_len(self.len);
        }
    }
}
