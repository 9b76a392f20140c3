//! The server's loop: the stream up to the package, then requests first and the
//! rest behind them, then the end and the destination's confirmation.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use rebound_migstream::rp::{self, Message};
use rebound_migstream::write::{OutPage, Writer};
use rebound_migstream::{Page, SnapshotStream};
use rebound_snapshot::{Trace, TracePage};

use crate::image::{Image, PAGE, RUN_PAGES};
use crate::{order, Job, ServeError, Stats};

/// The largest device state read (QEMU's own streams of a snapshot are ~1 MB).
const MAX_DEVICE_STATE: u64 = 512 << 20;
/// The longest a request may ask for at once.
const MAX_REQUEST: u64 = 2 << 20;
/// The longest gap of pages not wanted that a read takes along to join two runs.
const GAP: u64 = 8;
/// How long the end waits for the destination's confirmation.
const SHUT_WAIT: Duration = Duration::from_secs(60);

/// What reaches the server's loop.
#[derive(Debug)]
pub enum Msg {
    /// The guest starts now (a line on stdin, or stdin closed).
    Go,
    /// A page request: the block's name, bytes `start..start + len`, when it came.
    Req {
        block: String,
        start: u64,
        len: u64,
        at: Instant,
    },
    Shut(u32),
    /// The return path ended (`None`: closed) or carried something malformed.
    RpEnd(Option<String>),
}

/// Reads the return path until it ends, forwarding what it says.
fn read_return_path(mut conn: UnixStream, tx: Sender<Msg>) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let mut block: Option<String> = None;
    loop {
        let n = match conn.read(&mut tmp) {
            Ok(0) => {
                let _ = tx.send(Msg::RpEnd(None));
                return;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => {
                let _ = tx.send(Msg::RpEnd(None));
                return;
            }
        };
        buf.extend_from_slice(&tmp[..n]);
        loop {
            let (m, took) = match rp::next(&buf) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Msg::RpEnd(Some(e.to_string())));
                    return;
                }
            };
            buf.drain(..took);
            let out = match m {
                Message::Shut(v) => Msg::Shut(v),
                Message::Pong(_) => continue,
                Message::ReqPages {
                    block: b,
                    start,
                    len,
                } => {
                    if b.is_some() {
                        block = b;
                    }
                    let Some(name) = block.clone() else {
                        let _ = tx.send(Msg::RpEnd(Some(
                            "a page request naming no block before any did".into(),
                        )));
                        return;
                    };
                    Msg::Req {
                        block: name,
                        start,
                        len: len as u64,
                        at: Instant::now(),
                    }
                }
            };
            if tx.send(out).is_err() {
                return;
            }
        }
    }
}

struct Server<'a> {
    conn: UnixStream,
    w: Writer<'a>,
    stream: &'a SnapshotStream,
    bytes: &'a [u8],
    main: usize,
    img: Image,
    out: Vec<u8>,
    sent: Vec<bool>,
    stats: Stats,
    started: bool,
    service: Vec<f64>,
    requested: Vec<u64>,
    seen: Vec<bool>,
}

impl Server<'_> {
    /// Sends the snapshot's own pages (the firmware's blocks) that `which` picks.
    fn firmware(&mut self, which: impl Fn(&rebound_migstream::PageRecord) -> bool) {
        let (stream, bytes) = (self.stream, self.bytes);
        // A page filled with a byte other than zero goes as that page's bytes: one
        // buffer per such byte the records use (QEMU itself writes only zeros).
        let mut fills = std::collections::BTreeMap::new();
        for r in stream.pages.iter().filter(|r| which(r)) {
            if let Page::Fill(b @ 1..) = r.page {
                fills.entry(b).or_insert_with(|| vec![b; PAGE as usize]);
            }
        }
        self.w.part(
            &mut self.out,
            stream.pages.iter().filter(|r| which(r)).map(|r| OutPage {
                block: r.block,
                offset: r.offset,
                data: match &r.page {
                    Page::Data(range) => Some(&bytes[range.clone()]),
                    Page::Fill(0) => None,
                    Page::Fill(b) => Some(&fills[b][..]),
                },
            }),
        );
    }

    fn flush(&mut self) -> Result<(), ServeError> {
        self.conn.write_all(&self.out).map_err(ServeError::Send)?;
        self.out.clear();
        Ok(())
    }

    /// Sends the main block's `pages` not sent yet: runs of data pages read at
    /// once, holes as zero pages.
    fn send_pages(&mut self, pages: &[u64]) -> Result<u64, ServeError> {
        let mut n = 0;
        let mut i = 0;
        while i < pages.len() {
            let p = pages[i];
            if self.sent[p as usize] {
                i += 1;
                continue;
            }
            if !self.img.data[p as usize] {
                self.sent[p as usize] = true;
                self.w.part(
                    &mut self.out,
                    [OutPage {
                        block: self.main,
                        offset: p * PAGE,
                        data: None,
                    }],
                );
                n += 1;
                i += 1;
                continue;
            }
            // A run: the following pages of the list that lie just after it in the
            // image (gaps of up to GAP pages are read along and not sent, as the
            // page-cache loader coalesces its reads), within one read.
            let mut want = vec![p];
            let mut j = i + 1;
            while j < pages.len() {
                let (q, last) = (pages[j], *want.last().expect("one page"));
                if q <= last || q - last > GAP || q - p >= RUN_PAGES as u64 {
                    break;
                }
                if !self.sent[q as usize] {
                    want.push(q);
                }
                j += 1;
            }
            let span = (want.last().expect("one page") - p + 1) as usize;
            let is_data: Vec<bool> = want.iter().map(|&q| self.img.data[q as usize]).collect();
            let before = self.img.bytes_read;
            let data = self.img.read_run(p, span)?;
            let main = self.main;
            self.w.part(
                &mut self.out,
                want.iter().zip(&is_data).map(|(&q, &d)| {
                    let k = (q - p) as usize * PAGE as usize;
                    OutPage {
                        block: main,
                        offset: q * PAGE,
                        // A hole inside the run still goes as a zero page.
                        data: d.then(|| &data[k..k + PAGE as usize]),
                    }
                }),
            );
            if self.started {
                self.stats.bytes_read_after_start += self.img.bytes_read - before;
            }
            for &q in &want {
                self.sent[q as usize] = true;
            }
            n += want.len() as u64;
            i = j;
        }
        Ok(n)
    }

    /// Answers one request.
    fn request(
        &mut self,
        block: &str,
        start: u64,
        len: u64,
        at: Instant,
    ) -> Result<(), ServeError> {
        self.stats.requests += 1;
        if self.started {
            self.stats.requests_after_start += 1;
        }
        let bad = |what: String| Err(ServeError::BadRequest { what });
        let Some(b) = self.stream.blocks.iter().position(|x| x.name == block) else {
            return bad(format!(
                "pages of a RAM block {block:?} the snapshot does not have"
            ));
        };
        let used = self.stream.blocks[b].used_length;
        if !start.is_multiple_of(PAGE) || len == 0 || !len.is_multiple_of(PAGE) || len > MAX_REQUEST
        {
            return bad(format!(
                "{len} bytes at {start:#x} of {block:?}: not whole pages"
            ));
        }
        if start.checked_add(len).is_none_or(|e| e > used) {
            return bad(format!(
                "{len} bytes at {start:#x} of {block:?}, past its end ({used} bytes)"
            ));
        }
        if b != self.main {
            // A firmware page: all of them went ahead; one asked again is resent.
            self.firmware(|r| r.block == b && r.offset >= start && r.offset < start + len);
            self.flush()?;
            return Ok(());
        }
        let pages: Vec<u64> = (start / PAGE..(start + len) / PAGE).collect();
        for &p in &pages {
            if !std::mem::replace(&mut self.seen[p as usize], true) {
                self.requested.push(p);
            }
        }
        if pages.iter().all(|&p| self.sent[p as usize]) {
            self.stats.requests_already_sent += 1;
            return Ok(());
        }
        self.send_pages(&pages)?;
        self.flush()?;
        self.service.push(at.elapsed().as_secs_f64() * 1e6);
        Ok(())
    }
}

/// Serves `job` on `conn` (connected to the destination's incoming socket);
/// `rx` brings [`Msg::Go`] from the caller, and `tx` is its sender, which the
/// return path's reader uses too. Writes `stats.json` and `requests.trace` to the
/// job's `out_dir` whatever the outcome, and returns the stats.
pub fn serve(
    job: &Job,
    conn: UnixStream,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
) -> Result<Stats, ServeError> {
    let t0 = Instant::now();
    let mut stats = Stats::default();
    let mut requested = Vec::new();
    let r = run(job, conn, tx, rx, t0, &mut stats, &mut requested);
    if let Err(e) = &r {
        stats.error = Some(rebound_errors::chain(e));
    }
    let trace = Trace {
        pages: requested
            .iter()
            .map(|&page| TracePage { block: 0, page })
            .collect(),
    };
    let tpath = job.out_dir.join(crate::REQUESTS);
    trace
        .write(&tpath)
        .map_err(|e| ServeError::Write(tpath, std::io::Error::other(e)))?;
    write_stats(&job.out_dir, &stats)?;
    r.map(|_| stats)
}

/// Replaces `stats.json` in `dir` whole.
fn write_stats(dir: &std::path::Path, stats: &Stats) -> Result<(), ServeError> {
    let spath = dir.join(crate::STATS);
    let text = serde_json::to_vec_pretty(stats).expect("stats serialize");
    rebound_vmm::private::write_atomic(&spath, &text).map_err(|e| ServeError::Write(spath, e))
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    Some(sorted[i])
}

#[allow(clippy::too_many_arguments)]
fn run(
    job: &Job,
    conn: UnixStream,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    t0: Instant,
    stats: &mut Stats,
    requested: &mut Vec<u64>,
) -> Result<(), ServeError> {
    let bytes = read_capped(&job.device_state)?;
    let stream = SnapshotStream::parse(&bytes)
        .map_err(|e| ServeError::Stream(job.device_state.clone(), e))?;
    let main = stream
        .blocks
        .iter()
        .position(|b| b.name == job.block && b.used_length == job.size)
        .ok_or_else(|| ServeError::NoBlock(job.block.clone(), job.size))?;
    // A snapshot's own pages of its main block would be older than the image.
    if stream.pages.iter().any(|p| p.block == main) {
        return Err(ServeError::Stream(
            job.device_state.clone(),
            rebound_migstream::StreamError::Bad {
                at: 0,
                why: format!(
                    "the stream carries pages of the shared block {:?}",
                    job.block
                ),
            },
        ));
    }
    let img = Image::open(&job.image, job.size, job.check.as_ref())?;
    let trace: Vec<u64> = match &job.trace {
        Some(t) => Trace::read(t, img.pages())
            .map_err(|e| ServeError::Trace(t.clone(), e))?
            .pages
            .into_iter()
            .filter(|p| p.block == 0)
            .map(|p| p.page)
            .collect(),
        None => Vec::new(),
    };
    let ord = order::order(job.ahead, &trace, &img.data, job.fafl);
    let reader = conn.try_clone().map_err(ServeError::Send)?;
    std::thread::spawn(move || read_return_path(reader, tx));
    let pages = img.pages() as usize;
    let mut s = Server {
        conn,
        w: Writer::new(&stream),
        stream: &stream,
        bytes: &bytes,
        main,
        img,
        out: Vec::with_capacity(1 << 20),
        sent: vec![false; pages],
        stats: std::mem::take(stats),
        started: false,
        service: Vec::new(),
        requested: Vec::new(),
        seen: vec![false; pages],
    };
    s.stats.direct = s.img.direct;
    s.stats.pages_checked = s.img.checks_pages();
    let r = s.go_through(&ord, job, &rx, t0);
    s.stats.chunks_checked = s.img.chunks_checked();
    s.stats.bytes_read = s.img.bytes_read;
    s.stats.reads = s.img.reads;
    s.stats.requested_pages = s.requested.len() as u64;
    let mut sv = std::mem::take(&mut s.service);
    sv.sort_by(f64::total_cmp);
    s.stats.service_us_p50 = percentile(&sv, 0.5);
    s.stats.service_us_p99 = percentile(&sv, 0.99);
    s.stats.service_us_max = sv.last().copied();
    *stats = std::mem::take(&mut s.stats);
    *requested = std::mem::take(&mut s.requested);
    r
}

fn read_capped(path: &std::path::Path) -> Result<Vec<u8>, ServeError> {
    let err = |e| ServeError::DeviceState(path.to_path_buf(), e);
    let f = rebound_snapshot::open_nofollow(path).map_err(err)?;
    let mut bytes = Vec::new();
    f.take(MAX_DEVICE_STATE + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_DEVICE_STATE {
        return Err(err(std::io::Error::other(format!(
            "larger than {MAX_DEVICE_STATE} bytes"
        ))));
    }
    Ok(bytes)
}

impl Server<'_> {
    fn go_through(
        &mut self,
        ord: &order::Order,
        job: &Job,
        rx: &Receiver<Msg>,
        t0: Instant,
    ) -> Result<(), ServeError> {
        self.w.start(&mut self.out);
        // The firmware's blocks: small, and read while the devices load.
        self.firmware(|_| true);
        self.flush()?;
        for piece in ord.ahead.chunks(RUN_PAGES * 4) {
            self.stats.ahead_pages += self.send_pages(piece)?;
            self.flush()?;
        }
        self.stats.ahead_bytes = self.img.bytes_read;
        self.w
            .discard(&mut self.out, self.main, ord.discard * PAGE, PAGE);
        let (stream, bytes) = (self.stream, self.bytes);
        self.w
            .package(&mut self.out, &bytes[stream.devices.clone()]);
        self.flush()?;
        self.stats.ahead_s = t0.elapsed().as_secs_f64();
        self.stats.direct = self.img.direct;
        self.stats.bytes_read = self.img.bytes_read;
        self.stats.chunks_checked = self.img.chunks_checked();
        // What went ahead, for the daemon's report while the rest is served.
        write_stats(&job.out_dir, &self.stats)?;

        let quiet = Duration::from_secs_f64(job.quiet_s.max(0.0));
        let mut go_at: Option<Instant> = None;
        let mut next = 0;
        while next < ord.rest.len() {
            // Lazy: nothing is pushed before the start, nor in its quiet window.
            let hold = !quiet.is_zero() && go_at.is_none_or(|g| g.elapsed() < quiet);
            let msg = if hold {
                let wait = match go_at {
                    Some(g) => quiet.saturating_sub(g.elapsed()),
                    None => Duration::from_millis(100),
                };
                match rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Err(ServeError::Closed),
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return Err(ServeError::Closed),
                }
            };
            match msg {
                Some(m) => {
                    self.on(m, &mut go_at, t0)?;
                    continue;
                }
                None if hold => continue,
                None => {}
            }
            // One piece of the rest, then the requests again.
            let end = (next + RUN_PAGES).min(ord.rest.len());
            let piece = &ord.rest[next..end];
            next = end;
            self.stats.pushed_pages += self.send_pages(piece)?;
            self.flush()?;
        }
        // Every page has left: the end, then the destination's confirmation.
        while let Ok(m) = rx.try_recv() {
            self.on(m, &mut go_at, t0)?;
        }
        self.w.end(&mut self.out, []);
        self.flush()?;
        self.stats.end_s = Some(t0.elapsed().as_secs_f64());
        let until = Instant::now() + SHUT_WAIT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Msg::Shut(0)) => return Ok(()),
                Ok(Msg::Shut(v)) => return Err(ServeError::Shut(v)),
                // Every page was sent: a request now was for a page on its way.
                Ok(Msg::Req { .. }) | Ok(Msg::Go) => {}
                Ok(Msg::RpEnd(None)) => return Err(ServeError::Closed),
                Ok(Msg::RpEnd(Some(e))) => return Err(ServeError::ReturnPath(e)),
                Err(_) => return Err(ServeError::NoShut(SHUT_WAIT.as_secs())),
            }
        }
    }

    fn on(&mut self, m: Msg, go_at: &mut Option<Instant>, t0: Instant) -> Result<(), ServeError> {
        match m {
            Msg::Go => {
                if go_at.is_none() {
                    *go_at = Some(Instant::now());
                    self.started = true;
                    self.stats.start_s = Some(t0.elapsed().as_secs_f64());
                }
                Ok(())
            }
            Msg::Req {
                block,
                start,
                len,
                at,
            } => self.request(&block, start, len, at),
            Msg::Shut(v) => Err(ServeError::Shut(v)),
            Msg::RpEnd(None) => Err(ServeError::Closed),
            Msg::RpEnd(Some(e)) => Err(ServeError::ReturnPath(e)),
        }
    }
}
