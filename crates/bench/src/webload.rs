//! A host-side load generator for the guest's `web` workload serving a file set made
//! by `rebound image webset`: full passes over the set (first, second, third read) and
//! a steady random load whose completions are recorded with timestamps, so throughput
//! per second can be drawn across a reboot. Plain threads and blocking sockets: the
//! guest, not the client, is the bottleneck, and the timing stays simple.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rebound_image::splitmix64;
use rebound_image::webset::{file_content, file_path};

/// Why the file set could not be made or was not served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the host tools for the file set's image are missing")]
    Tools(#[source] rebound_image::ToolError),
    #[error("cannot make the file set's image {}", .0.display())]
    Make(
        std::path::PathBuf,
        #[source] rebound_image::webset::WebsetError,
    ),
    #[error("cannot remove the file set's scratch files {}", .0.display())]
    Scratch(std::path::PathBuf, #[source] std::io::Error),
    #[error("the guest did not serve {0}")]
    NotServed(String),
}

/// The file set's image in a benchmark's scratch directory.
pub const SET_IMAGE: &str = "webset.img";

/// Makes `files` files of `file_size` bytes (`rebound image webset`'s content) as the
/// ext4 image `dir`/[`SET_IMAGE`]; returns its path.
pub fn make_set(
    dir: &std::path::Path,
    files: u64,
    file_size: u64,
) -> Result<std::path::PathBuf, Error> {
    let tools = rebound_image::Tools::check().map_err(Error::Tools)?;
    let scratch = dir.join("webset-files");
    let img = dir.join(SET_IMAGE);
    let shape = rebound_image::webset::WebsetShape {
        files,
        file_size,
        io_size: 0,
    };
    rebound_image::webset::make(&tools, shape, &scratch, &img, &mut |_| {})
        .map_err(|e| Error::Make(img.clone(), e))?;
    std::fs::remove_dir_all(&scratch).map_err(|e| Error::Scratch(scratch.clone(), e))?;
    Ok(img)
}

/// Seconds a reply may stall before the client gives up on it.
pub const REQUEST_TIMEOUT_S: u64 = 3;

/// One finished request.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    /// Seconds since the load began, at completion.
    pub t: f64,
    pub bytes: u64,
    pub ok: bool,
}

/// The file set the guest serves.
#[derive(Debug, Clone, Copy)]
pub struct Set {
    pub port: u16,
    pub files: u64,
    pub file_size: u64,
}

impl Set {
    /// GETs file `i`; Ok(true) when the body is the file's exact content at its
    /// start and end (a full compare of every reply would load the host instead).
    pub fn get(&self, i: u64) -> std::io::Result<bool> {
        self.fetch(i, false)
    }

    /// GETs file `i`; Ok(true) when the body is the file's content, every byte.
    pub fn get_exact(&self, i: u64) -> std::io::Result<bool> {
        self.fetch(i, true)
    }

    fn fetch(&self, i: u64, every_byte: bool) -> std::io::Result<bool> {
        // Short timeouts: during a reboot the host's port forward accepts and then
        // holds a connection the guest is not there to take; a client gives up and
        // tries again, as a browser or a load balancer would.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(REQUEST_TIMEOUT_S)))?;
        write!(s, "GET /{} HTTP/1.0\r\nHost: guest\r\n\r\n", file_path(i))?;
        let mut resp = Vec::with_capacity(self.file_size as usize + 256);
        s.read_to_end(&mut resp)?;
        let Some(head) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
            return Ok(false);
        };
        let body = &resp[head + 4..];
        if !resp.starts_with(b"HTTP/1.1 200") || body.len() as u64 != self.file_size {
            return Ok(false);
        }
        if every_byte {
            return Ok(body == file_content(i, self.file_size));
        }
        let want = file_content(i, 16.min(self.file_size));
        let tail = self.file_size as usize - 8;
        let last = splitmix64(i << 32 | (tail as u64 / 8)).to_le_bytes();
        Ok(body.starts_with(&want) && (!tail.is_multiple_of(8) || body[tail..] == last))
    }

    /// GETs file `i`, trying again (up to 5 times) when the request times out or
    /// the connection fails; returns whether the content was right and the retries.
    fn get_retrying(&self, i: u64) -> (std::io::Result<bool>, u64) {
        let mut tries = 0;
        loop {
            match self.get(i) {
                Err(_) if tries < 5 => tries += 1,
                r => return (r, tries),
            }
        }
    }

    /// Reads every file once with `conns` connections in parallel; returns seconds
    /// and the requests that had to be sent again, or an error naming the first file
    /// that did not come back right.
    pub fn pass(&self, conns: usize) -> Result<(f64, u64), Error> {
        let retries = AtomicU64::new(0);
        let next = AtomicU64::new(0);
        let bad = Mutex::new(None);
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            for _ in 0..conns.max(1) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= self.files {
                        return;
                    }
                    let (r, again) = self.get_retrying(i);
                    retries.fetch_add(again, Ordering::Relaxed);
                    match r {
                        Ok(true) => {}
                        other => {
                            let mut b = bad.lock().expect("pass lock");
                            b.get_or_insert(format!("{}: {other:?}", file_path(i)));
                            next.store(self.files, Ordering::Relaxed);
                            return;
                        }
                    }
                });
            }
        });
        match bad.into_inner().expect("pass lock") {
            Some(why) => Err(Error::NotServed(why)),
            None => Ok((t0.elapsed().as_secs_f64(), retries.into_inner())),
        }
    }
}

/// A steady load of random requests until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<Done>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub t0: Instant,
}

impl Load {
    /// `conns` clients, each sending one request at a time (uniform over the set;
    /// a failed connection is retried after 20 ms, as a client would).
    pub fn start(set: Set, conns: usize, seed: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let threads = (0..conns.max(1) as u64)
            .map(|c| {
                let (stop, done) = (stop.clone(), done.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let i = splitmix64(seed ^ (c << 48) ^ n) % set.files;
                        let ok = matches!(set.get(i), Ok(true));
                        let d = Done {
                            t: t0.elapsed().as_secs_f64(),
                            bytes: if ok { set.file_size } else { 0 },
                            ok,
                        };
                        done.lock().expect("load lock").push(d);
                        if !ok {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            done,
            threads,
            t0,
        }
    }

    /// Seconds since the load began.
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// When the service came back after going down at or after `t`: the first
    /// success after the first failure after `t` (None while it is still down, or
    /// not down yet).
    pub fn back_after(&self, t: f64) -> Option<f64> {
        let done = self.done.lock().expect("load lock");
        let down = done
            .iter()
            .filter(|d| !d.ok && d.t >= t)
            .map(|d| d.t)
            .reduce(f64::min)?;
        done.iter()
            .filter(|d| d.ok && d.t > down)
            .map(|d| d.t)
            .reduce(f64::min)
    }

    /// Stops the clients and returns every completion.
    pub fn stop(self) -> Vec<Done> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let mut v = std::mem::take(&mut *self.done.lock().expect("load lock"));
        v.sort_by(|a, b| a.t.total_cmp(&b.t));
        v
    }
}

/// When the service last answered before it went down at or after `t`: the last
/// success before the first failure after `t` (failures are seen late: a request
/// times out seconds after the service stopped answering it), never before `t`.
pub fn went_down(done: &[Done], t: f64) -> Option<f64> {
    let down = done
        .iter()
        .filter(|d| !d.ok && d.t >= t)
        .map(|d| d.t)
        .reduce(f64::min)?;
    Some(
        done.iter()
            .filter(|d| d.ok && d.t < down)
            .map(|d| d.t)
            .fold(t, f64::max),
    )
}

/// MB/s served in each whole second [k, k+1) up to `end`.
pub fn per_second(done: &[Done], end: f64) -> Vec<f64> {
    let mut v = vec![0.0; end.max(0.0) as usize];
    for d in done.iter().filter(|d| d.ok) {
        if let Some(s) = v.get_mut(d.t as usize) {
            *s += d.bytes as f64 / 1e6;
        }
    }
    v
}

/// Mean MB/s over [from, to) (whole seconds).
pub fn mean(series: &[f64], from: f64, to: f64) -> f64 {
    let (a, b) = (
        from.max(0.0) as usize,
        (to.max(0.0) as usize).min(series.len()),
    );
    if b <= a {
        return 0.0;
    }
    series[a..b].iter().sum::<f64>() / (b - a) as f64
}

/// Seconds after `back` until a 3-second mean first reaches `frac` of `level`.
pub fn recovery(series: &[f64], back: f64, level: f64, frac: f64) -> Option<f64> {
    let start = back.floor() as usize;
    (start..series.len().saturating_sub(2))
        .find(|&k| series[k..k + 3].iter().sum::<f64>() / 3.0 >= frac * level)
        .map(|k| (k as f64 - back).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_windows() {
        let done: Vec<Done> = (0..100)
            .map(|k| Done {
                t: k as f64 * 0.1,
                bytes: 1_000_000,
                ok: k % 10 != 0,
            })
            .collect();
        let s = per_second(&done, 10.0);
        assert_eq!(s.len(), 10);
        assert!(s.iter().all(|&x| (x - 9.0).abs() < 1e-9), "{s:?}");
        assert!((mean(&s, 2.0, 5.0) - 9.0).abs() < 1e-9);
        let dip = [10.0, 10.0, 0.0, 0.0, 2.0, 5.0, 10.0, 10.0, 10.0, 10.0];
        assert_eq!(recovery(&dip, 4.0, 10.0, 0.95), Some(2.0));
        assert_eq!(recovery(&dip[..7], 4.0, 10.0, 0.95), None);
    }

    #[test]
    fn back_is_the_first_answer_after_the_outage() {
        let load = Load {
            stop: Arc::default(),
            done: Arc::new(Mutex::new(Vec::new())),
            threads: Vec::new(),
            t0: Instant::now(),
        };
        let at = |t: f64, ok: bool| Done { t, bytes: 1, ok };
        load.done
            .lock()
            .unwrap()
            .extend([at(1.0, true), at(5.0, true), at(6.0, false)]);
        assert_eq!(load.back_after(2.0), None, "still down");
        load.done
            .lock()
            .unwrap()
            .extend([at(7.0, false), at(9.5, true), at(10.0, true)]);
        assert_eq!(load.back_after(2.0), Some(9.5));
        assert_eq!(load.back_after(11.0), None, "not down after 11 s");
        let done = load.stop();
        assert_eq!(went_down(&done, 2.0), Some(5.0));
        assert_eq!(went_down(&done, 5.5), Some(5.5), "never before the reboot");
        assert_eq!(went_down(&done, 11.0), None);
    }
}
