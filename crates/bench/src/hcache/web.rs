//! The `web` pattern of `rebound bench hcache`: the guest's `web` workload serves a
//! file set made by `rebound image webset` (thousands of files of a few hundred KiB,
//! more than the allocation) and a host-side client requests files one at a time in a
//! fixed sequence whose popularity follows Zipf's law with exponent 0.9, as web
//! requests do (Breslau et al., INFOCOM'99: 0.64-0.83 for proxies, near 1 for servers);
//! the popular files are scattered over the set. Every reply is compared with the
//! file's content, every byte. One connection at a time keeps the order, so each
//! setting replays the same request sequence and disk reads compare run to run.

use std::path::Path;
use std::time::Instant;

use rebound_api::{VmSpec, VmStatus, Workload};
use rebound_image::splitmix64;

use super::setup::rebound_uncached;
use crate::webload::Set;

/// Why the web pattern's requests could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: no forward for the web service")]
    NoForward(String),
    #[error("the web client stopped")]
    Client(#[source] tokio::task::JoinError),
}

/// Popularity skew of the request sequence.
pub const SKEW: f64 = 0.9;

/// A VM of `memory_mib` serving `disk` with the web workload, the set's disk alone on
/// Rebound's backend with no cache of its own (as the io runs).
pub fn spec(name: &str, disk: &Path, memory_mib: u64) -> VmSpec {
    let mut s = VmSpec::new(name);
    s.memory_mib = memory_mib;
    s.workload = Some(Workload::Web);
    s.workload_args.insert("data_disk".into(), "vdb".into());
    s.disks = vec![rebound_uncached(disk)];
    s
}

/// Request `n` of the sequence over `files` files: Zipf-distributed ranks, the rank
/// mapped to a file by a fixed scatter.
pub struct Sequence {
    cdf: Vec<f64>,
    file_of_rank: Vec<u64>,
    seed: u64,
}

impl Sequence {
    pub fn new(files: u64, seed: u64) -> Sequence {
        let mut sum = 0.0;
        let cdf = (0..files)
            .map(|r| {
                sum += 1.0 / ((r + 1) as f64).powf(SKEW);
                sum
            })
            .collect();
        let mut file_of_rank: Vec<u64> = (0..files).collect();
        file_of_rank.sort_by_key(|&f| splitmix64(seed ^ 0x7765_6266 ^ f));
        Sequence {
            cdf,
            file_of_rank,
            seed,
        }
    }

    pub fn file(&self, n: u64) -> u64 {
        let total = self.cdf.last().copied().unwrap_or(0.0);
        // 53 random bits: a uniform draw in [0, 1).
        let u = (splitmix64(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 11) as f64
            / (1u64 << 53) as f64;
        let rank = self.cdf.partition_point(|&c| c <= u * total);
        self.file_of_rank[rank.min(self.file_of_rank.len() - 1)]
    }
}

/// What the client saw.
pub struct Served {
    pub requests: u64,
    /// Bytes the requests read (whole files).
    pub bytes_read: u64,
    pub seconds: f64,
    /// Replies that failed or were not the file's content.
    pub errors: u64,
    pub first_error: Option<String>,
}

/// Sends `requests` requests of the sequence to the VM's web service, one at a time.
pub async fn drive(
    st: &VmStatus,
    files: u64,
    file_size: u64,
    requests: u64,
) -> Result<Served, Error> {
    let port = st
        .forwards
        .iter()
        .find(|f| f.guest == 8080)
        .map(|f| f.host)
        .ok_or_else(|| Error::NoForward(st.name.clone()))?;
    let set = Set {
        port,
        files,
        file_size,
    };
    tokio::task::spawn_blocking(move || {
        let seq = Sequence::new(files, 1);
        let t0 = Instant::now();
        let mut served = Served {
            requests,
            bytes_read: requests * file_size,
            seconds: 0.0,
            errors: 0,
            first_error: None,
        };
        for n in 0..requests {
            let i = seq.file(n);
            let bad = match set.get_exact(i) {
                Ok(true) => None,
                Ok(false) => Some(format!("request {n}: file {i} came back wrong")),
                Err(e) => Some(format!("request {n}: file {i}: {e}")),
            };
            if let Some(b) = bad {
                served.errors += 1;
                served.first_error.get_or_insert(b);
            }
        }
        served.seconds = t0.elapsed().as_secs_f64();
        served
    })
    .await
    .map_err(Error::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_fixed_skewed_and_scattered() {
        let (a, b) = (Sequence::new(3000, 1), Sequence::new(3000, 1));
        let draws: Vec<u64> = (0..30_000).map(|n| a.file(n)).collect();
        assert!((0..30_000).all(|n| b.file(n) == draws[n as usize]));
        let mut count = vec![0u32; 3000];
        draws.iter().for_each(|&f| count[f as usize] += 1);
        // The top file takes 1/H of the requests (H = sum of r^-0.9, about 12.9 here).
        let top = a.file_of_rank[0] as usize;
        let want = 30_000.0 / a.cdf.last().unwrap();
        assert!(
            (count[top] as f64 - want).abs() < want * 0.15,
            "{} vs {want}",
            count[top]
        );
        assert!(count.iter().filter(|&&c| c > 0).count() > 1500);
        // The most popular files are not neighbours on the disk.
        let hot: Vec<u64> = a.file_of_rank[..10].to_vec();
        assert!(hot.windows(2).any(|w| w[0].abs_diff(w[1]) > 10), "{hot:?}");
    }
}
