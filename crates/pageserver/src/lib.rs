//! A postcopy page server: a snapshot restored into a QEMU that waits with
//! `-incoming defer` and the `postcopy-ram` capability, by Rebound acting as the
//! migration's source (`docs/design/qemu-postcopy-stream.md`).
//!
//! The stream it writes: the snapshot's configuration and RAM block list, postcopy
//! advised, the firmware's pages and the pages the mode sends ahead ([`order`]),
//! one discard, the snapshot's device state packaged between LISTEN and RUN. From
//! then on the destination runs (or waits for `cont`) on its shared RAM file, and
//! each page the guest touches that has not arrived is one request on the return
//! path. Requests are answered first; behind them the rest is pushed in
//! first-access order, then file order. The image is read with `O_DIRECT` and
//! every page's chunk is checked against the manifest before it leaves: a damaged
//! chunk ends the restore before the guest sees any of it.
//!
//! The requests, in order, are the guest's first touches of pages it did not have:
//! with nothing sent ahead and nothing pushed for a quiet window after the start
//! (lazy), they are its exact first-touch trace, page by page.
//!
//! It runs as its own process (`rebound page-server`), so a daemon that restarts
//! does not take a restore's pages with it: the daemon hands it a [`Job`] and says
//! when the guest starts by a line on its stdin (or by closing it).

pub mod image;
pub mod order;
mod serve;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use order::{order, Ahead, Order};
pub use serve::{serve, Msg};

/// Errors of a page server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read the RAM image {0}")]
    Image(PathBuf, #[source] std::io::Error),
    #[error("the RAM image {0} is {1} bytes, expected {2} (whole pages)")]
    ImageSize(PathBuf, u64, u64),
    #[error(transparent)]
    Check(#[from] rebound_snapshot::CheckError),
    #[error(transparent)]
    PageSums(#[from] rebound_snapshot::pagesums::PageSumsError),
    #[error("{0}: page {1} does not match its checksum: the snapshot is damaged")]
    PageMismatch(PathBuf, u64),
    #[error("cannot read the device state {0}")]
    DeviceState(PathBuf, #[source] std::io::Error),
    #[error("the device state {0} is not a stream this QEMU wrote")]
    Stream(PathBuf, #[source] rebound_migstream::StreamError),
    #[error("the device state names no RAM block {0:?} of {1} bytes")]
    NoBlock(String, u64),
    #[error("cannot read the trace {0}")]
    Trace(PathBuf, #[source] rebound_snapshot::TraceError),
    #[error("cannot reach the destination QEMU at {0}")]
    Connect(PathBuf, #[source] std::io::Error),
    #[error("the destination QEMU stopped taking the stream")]
    Send(#[source] std::io::Error),
    #[error("the destination QEMU sent a bad return-path message: {0}")]
    ReturnPath(String),
    #[error("the destination QEMU asked for {what}")]
    BadRequest { what: String },
    #[error("the destination QEMU closed the return path before the restore ended")]
    Closed,
    #[error("the destination QEMU failed to load the stream (it reported {0})")]
    Shut(u32),
    #[error("the destination QEMU did not confirm the end of the stream within {0} s")]
    NoShut(u64),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] std::io::Error),
    #[error("cannot read the page server's job {0}")]
    Job(PathBuf, #[source] std::io::Error),
}

/// What one page server does (written by the daemon, read by the server).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// The destination QEMU's `migrate-incoming` unix socket.
    pub socket: PathBuf,
    /// The snapshot's device state (QEMU's stream, saved with `x-ignore-shared`).
    pub device_state: PathBuf,
    /// The main RAM block's image and its size.
    pub image: PathBuf,
    pub size: u64,
    /// The main RAM block's name in the device state.
    pub block: String,
    /// How the image is checked before its pages leave (none: unchecked).
    pub check: Option<Check>,
    /// The snapshot's trace (first-access order), if it has one.
    pub trace: Option<PathBuf>,
    pub ahead: Ahead,
    /// The rest of the trace goes before the rest of the image.
    pub fafl: bool,
    /// Seconds after the start in which only requests are answered (lazy).
    pub quiet_s: f64,
    /// Where `stats.json` and `requests.trace` go.
    pub out_dir: PathBuf,
}

/// How a page server checks the image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Check {
    /// Each page against its own checksum (`pagesums`, as the manifest lists it).
    Pages {
        file: PathBuf,
        entry: rebound_snapshot::FileEntry,
    },
    /// Each chunk, whole, before any of its pages leaves (snapshots without page
    /// sums): the manifest's chunk size and checksums.
    Chunks { chunk: u64, sums: Vec<String> },
}

/// What one page server did; written to `stats.json` when it ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// The image was read with `O_DIRECT`.
    pub direct: bool,
    /// Pages and bytes sent before the devices loaded, and the seconds from the
    /// connection to the package sent.
    pub ahead_pages: u64,
    pub ahead_bytes: u64,
    pub ahead_s: f64,
    /// Requests, and the distinct main-RAM pages they named.
    pub requests: u64,
    pub requested_pages: u64,
    /// Requests after the start, and those in its quiet window.
    pub requests_after_start: u64,
    /// Requests for pages already on their way (the guest touched them while sent).
    pub requests_already_sent: u64,
    /// Pages pushed after the devices loaded (requests not counted).
    pub pushed_pages: u64,
    /// Bytes read from the image (chunk checks included), before and after the start.
    pub bytes_read: u64,
    pub bytes_read_after_start: u64,
    pub reads: u64,
    pub chunks_checked: u64,
    /// Every page sent was checked against its own checksum (no chunk checks).
    #[serde(default)]
    pub pages_checked: bool,
    /// Seconds from a request's arrival to its pages written, p50 and p99 (µs).
    pub service_us_p50: Option<f64>,
    pub service_us_p99: Option<f64>,
    pub service_us_max: Option<f64>,
    /// Seconds from the connection to the start (`go`), and to the stream's end.
    pub start_s: Option<f64>,
    pub end_s: Option<f64>,
    /// Why it ended early.
    pub error: Option<String>,
}

/// Name of the stats file in the job's `out_dir`.
pub const STATS: &str = "stats.json";
/// Name of the requested pages' trace in the job's `out_dir`.
pub const REQUESTS: &str = "requests.trace";

/// How long the server waits for the destination's socket to appear.
const CONNECT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// A job file is a few KiB.
const MAX_JOB: u64 = 1 << 20;

/// `rebound page-server --job FILE`: reads the job, connects to the destination,
/// takes the start from a line on stdin (or its end) and serves.
pub fn run_process(job: &std::path::Path) -> Result<Stats, ServeError> {
    use std::io::{BufRead, Read};
    let jerr = |e| ServeError::Job(job.to_path_buf(), e);
    let mut text = Vec::new();
    std::fs::File::open(job)
        .map_err(jerr)?
        .take(MAX_JOB)
        .read_to_end(&mut text)
        .map_err(jerr)?;
    let job: Job = serde_json::from_slice(&text).map_err(|e| jerr(std::io::Error::other(e)))?;
    let end = std::time::Instant::now() + CONNECT_WAIT;
    let conn = loop {
        match std::os::unix::net::UnixStream::connect(&job.socket) {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() > end => {
                return Err(ServeError::Connect(job.socket.clone(), e))
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let go = tx.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = go.send(Msg::Go);
    });
    serve(&job, conn, tx, rx)
}
