//! The data disk: a small ext4 image made with `mke2fs -d` (no mount, no root needed)
//! holding the web workload's files.

use std::path::{Path, PathBuf};

use crate::tools::{run, ToolError, Tools};

/// Errors making the data disk.
#[derive(Debug, thiserror::Error)]
pub enum DataDiskError {
    #[error("cannot write {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Tool(#[from] ToolError),
}

/// Size of the data disk.
pub const DISK_SIZE: &str = "64M";
/// Name of the deterministic test file and its size.
pub const BLOB_NAME: &str = "blob-1m.bin";
pub const BLOB_SIZE: usize = 1 << 20;

/// splitmix64, as the agent uses it: the host can recompute every byte it serves.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `counter` workload's checksum after `seq` ticks, recomputed on the host from
/// the definition in guest/agent/wl_counter.c: a guest whose memory came back
/// damaged prints another.
pub fn counter_checksum(seq: u64) -> u64 {
    const WORDS: u64 = 1 << 17;
    let mut w: Vec<u64> = (0..WORDS).map(splitmix64).collect();
    for n in 1..=seq {
        w[((n * 7919) % WORDS) as usize] ^= splitmix64(n);
    }
    w.iter().enumerate().fold(0u64, |acc, (i, x)| {
        acc.wrapping_add(x.wrapping_mul(2 * i as u64 + 1))
    })
}

/// The 1 MiB test file: little-endian splitmix64(i) for word i.
pub fn blob() -> Vec<u8> {
    (0..(BLOB_SIZE / 8) as u64)
        .flat_map(|i| splitmix64(i).to_le_bytes())
        .collect()
}

/// The index page, naming the image and kernel so a client can tell what it reached.
pub fn index_html(image: &str, release: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>Rebound guest</title></head>\n<body>\n<h1>Rebound guest</h1>\n\
         <p>image <b id=\"image\">{image}</b>, kernel <b id=\"release\">{release}</b></p>\n\
         <p><a href=\"/hello.txt\">hello.txt</a> <a href=\"/{BLOB_NAME}\">{BLOB_NAME}</a></p>\n</body></html>\n"
    )
}

/// Writes the files into `content` and makes `out` from them.
pub fn make(
    tools: &Tools,
    image: &str,
    release: &str,
    content: &Path,
    out: &Path,
) -> Result<(), DataDiskError> {
    let write = |rel: &str, data: &[u8]| {
        let p = content.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|err| DataDiskError::Io {
                path: parent.to_path_buf(),
                err,
            })?;
        }
        std::fs::write(&p, data).map_err(|err| DataDiskError::Io { path: p, err })
    };
    write("index.html", index_html(image, release).as_bytes())?;
    write("hello.txt", b"hello from the rebound data disk\n")?;
    write(BLOB_NAME, &blob())?;
    write("dir/nested.txt", b"nested file\n")?;
    mkfs_from_dir(tools, "rebound-data", content, out, DISK_SIZE)?;
    Ok(())
}

/// An ext4 image `out` of `size` (mke2fs syntax) holding `content`, with 4 KiB blocks
/// (DAX and page-sized caching want them), owned by root, made without mounting.
pub fn mkfs_from_dir(
    tools: &Tools,
    label: &str,
    content: &Path,
    out: &Path,
    size: &str,
) -> Result<(), ToolError> {
    run(tools
        .cmd("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-b", "4096", "-L", label])
        .args(["-E", "root_owner=0:0", "-d"])
        .arg(content)
        .arg(out)
        .arg(size))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_is_deterministic() {
        let b = blob();
        assert_eq!(b.len(), BLOB_SIZE);
        // splitmix64(0) is the published first output for seed 0's increment.
        assert_eq!(&b[..8], &0xe220_a839_7b1d_cdafu64.to_le_bytes());
        assert_eq!(b, blob());
    }
}
