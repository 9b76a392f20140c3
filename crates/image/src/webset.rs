//! A file set for the `web` and `io` workloads on their own data disk: thousands of
//! files of a few hundred KiB, generated deterministically so the host can check any
//! byte a guest serves, in an ext4 image made with `mke2fs -d` (no mount, no root).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::datadisk::splitmix64;
use crate::tools::{ToolError, Tools};

/// Errors making a file set.
#[derive(Debug, thiserror::Error)]
pub enum WebsetError {
    #[error("cannot write {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{out} exists: remove it first or pick another name")]
    Exists { out: PathBuf },
    #[error("a file set needs 1 to 1000000 files of 4 KiB to 64 MiB, got {files} of {size} bytes")]
    Shape { files: u64, size: u64 },
    #[error(transparent)]
    Tool(#[from] ToolError),
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct WebsetShape {
    pub files: u64,
    pub file_size: u64,
    /// Size of `io.bin` for the `io` workload (0: none).
    pub io_size: u64,
}

impl WebsetShape {
    /// The ext4 image's size: the data, one block per file of slack, and room for
    /// metadata and the journal.
    pub fn image_bytes(&self) -> u64 {
        let data = self.files * (self.file_size.div_ceil(4096) * 4096 + 4096) + self.io_size;
        // Whole 2 MiB: the image can also be a virtio-pmem device (DAX).
        (data + data / 8 + (32 << 20)).div_ceil(2 << 20) << 21
    }
}

/// The path of file `i` relative to the disk's root: 100 files per directory.
pub fn file_path(i: u64) -> String {
    format!("web/{:03}/{:06}.bin", i / 100, i)
}

/// The content of file `i`: little-endian words, word j = splitmix64(i << 32 | j).
pub fn file_content(i: u64, size: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(size as usize + 8);
    for j in 0..size.div_ceil(8) {
        v.extend_from_slice(&splitmix64(i << 32 | j).to_le_bytes());
    }
    v.truncate(size as usize);
    v
}

/// Page `page` (4 KiB) of file `i`, as [`file_content`] has it (the last page of a
/// file is zero-padded, as it is in memory).
pub fn file_page(i: u64, page: u64, size: u64) -> [u8; 4096] {
    let mut out = [0u8; 4096];
    let start = page * 4096;
    for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
        let at = start + 8 * k as u64;
        if at >= size {
            break;
        }
        let w = splitmix64(i << 32 | (at / 8)).to_le_bytes();
        let n = ((size - at) as usize).min(8);
        chunk[..n].copy_from_slice(&w[..n]);
    }
    out
}

/// `io.bin` as the `io` workload writes it first: word k = splitmix64(k).
fn write_io_bin(path: &Path, size: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for k in 0..size / 8 {
        f.write_all(&splitmix64(k).to_le_bytes())?;
    }
    f.flush()
}

/// Writes the files into `content` (a scratch directory) and makes the image `out`.
pub fn make(
    tools: &Tools,
    shape: WebsetShape,
    content: &Path,
    out: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<(), WebsetError> {
    if shape.files == 0 || shape.files > 1_000_000 || !(4096..=64 << 20).contains(&shape.file_size)
    {
        return Err(WebsetError::Shape {
            files: shape.files,
            size: shape.file_size,
        });
    }
    if out.exists() {
        return Err(WebsetError::Exists {
            out: out.to_path_buf(),
        });
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| WebsetError::Io { path, err }
    };
    let mut index = String::from("<!DOCTYPE html>\n<html><body><h1>Rebound file set</h1>\n");
    for i in 0..shape.files {
        let rel = file_path(i);
        let p = content.join(&rel);
        if i % 100 == 0 {
            let dir = p.parent().expect("file set paths have a directory");
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            progress(i);
        }
        std::fs::write(&p, file_content(i, shape.file_size)).map_err(io(&p))?;
        if i < 1000 {
            index.push_str(&format!("<a href=\"/{rel}\">{rel}</a>\n"));
        }
    }
    index.push_str("</body></html>\n");
    let idx = content.join("index.html");
    std::fs::write(&idx, index).map_err(io(&idx))?;
    if shape.io_size > 0 {
        let p = content.join("io.bin");
        write_io_bin(&p, shape.io_size).map_err(io(&p))?;
    }
    progress(shape.files);
    let size = format!("{}k", shape.image_bytes() >> 10);
    crate::datadisk::mkfs_from_dir(tools, "rebound-web", content, out, &size)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_match_the_file() {
        for size in [4096u64, 5000, 300 << 10] {
            let f = file_content(7, size);
            assert_eq!(f.len() as u64, size);
            for p in 0..size.div_ceil(4096) {
                let page = file_page(7, p, size);
                let s = (p * 4096) as usize;
                let e = (s + 4096).min(f.len());
                assert_eq!(&page[..e - s], &f[s..e], "size {size} page {p}");
                assert!(page[e - s..].iter().all(|&b| b == 0));
            }
        }
        assert_ne!(file_content(1, 4096), file_content(2, 4096));
        assert_eq!(file_path(12345), "web/123/012345.bin");
    }
}
