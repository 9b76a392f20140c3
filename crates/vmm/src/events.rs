//! The per-VM event log file (`events.jsonl`): typed [`Event`]s, one JSON line each,
//! format version [`rebound_api::EVENT_LOG_VERSION`] (documented in `rebound_api::event`),
//! capped and rotated ([`crate::logcap`]), read in pages by sequence number.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::logcap::{self, RotatingFile};

use rebound_api::{Event, EventData, EVENT_LOG_VERSION};

/// Errors writing or reading an event log.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("cannot write event log {0}")]
    Write(PathBuf, #[source] std::io::Error),
    #[error("cannot read event log {0}")]
    Read(PathBuf, #[source] std::io::Error),
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// Wall-clock now in RFC 3339 with milliseconds.
pub fn wall_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Default cap of one VM's event log (both generations, `logcap`).
pub const DEFAULT_CAP: u64 = 4 << 20;

/// Most events one page holds.
pub const MAX_PAGE: usize = 10_000;

/// Appends to and reads one VM's `events.jsonl`, held within its cap: past half of
/// it, the log moves to `events.jsonl.1` and starts again (`logcap`).
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
    /// The writer: one appender at a time, so sequence numbers are in file order.
    out: Arc<Mutex<Writer>>,
}

#[derive(Debug)]
struct Writer {
    file: RotatingFile,
    /// The last sequence number written; found in the log on the first append.
    last_seq: Option<u64>,
}

impl EventLog {
    pub fn new(path: &Path) -> Self {
        Self::with_cap(path, DEFAULT_CAP)
    }

    pub fn with_cap(path: &Path, cap: u64) -> Self {
        EventLog {
            path: path.to_path_buf(),
            out: Arc::new(Mutex::new(Writer {
                file: RotatingFile::new(path, cap),
                last_seq: None,
            })),
        }
    }

    /// Appends an event stamped now; returns it.
    pub fn append(&self, data: EventData) -> Result<Event, EventError> {
        let mut w = self.out.lock().expect("event log lock");
        let last = match w.last_seq {
            Some(s) => s,
            None => self.last_seq_on_disk(),
        };
        let ev = Event {
            v: EVENT_LOG_VERSION,
            seq: last + 1,
            wall: wall_now(),
            mono_ns: mono_ns(),
            data,
        };
        let mut line = serde_json::to_string(&ev).expect("events serialize");
        line.push('\n');
        // One write per line: a reader never sees half of one but at the torn end.
        w.file
            .write(line.as_bytes())
            .map_err(|e| EventError::Write(self.path.clone(), e))?;
        w.last_seq = Some(ev.seq);
        Ok(ev)
    }

    /// The highest sequence number in the log's last lines (0 for none).
    fn last_seq_on_disk(&self) -> u64 {
        let tail = logcap::tail(&self.path, 256 * 1024).unwrap_or_default();
        tail.split(|&b| b == b'\n')
            .filter_map(|l| serde_json::from_slice::<Event>(l).ok())
            .map(|e| e.seq)
            .max()
            .unwrap_or(0)
    }

    /// All events kept (both generations, at most the cap); a missing log is
    /// empty, and lines that do not parse (a torn last line after a crash, a kind
    /// from a newer version) are skipped.
    pub fn read_all(&self) -> Result<Vec<Event>, EventError> {
        self.page(None, usize::MAX)
    }

    /// Up to `limit` events: those after `since` (by sequence number), oldest first;
    /// without `since`, the newest `limit`.
    pub fn page(&self, since: Option<u64>, limit: usize) -> Result<Vec<Event>, EventError> {
        let mut out = std::collections::VecDeque::new();
        for p in [logcap::rotated(&self.path), self.path.clone()] {
            let f = match std::fs::File::open(&p) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(EventError::Read(p, e)),
            };
            for line in std::io::BufReader::new(f).split(b'\n') {
                let line = line.map_err(|e| EventError::Read(p.clone(), e))?;
                let Ok(ev) = serde_json::from_slice::<Event>(&line) else {
                    continue;
                };
                match since {
                    Some(s) if ev.seq <= s => {}
                    Some(_) if out.len() >= limit => return Ok(out.into()),
                    _ => {
                        if out.len() == limit {
                            out.pop_front();
                        }
                        if limit > 0 {
                            out.push_back(ev);
                        }
                    }
                }
            }
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn append_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.jsonl");
        let log = EventLog::new(&p);
        assert!(log.read_all().unwrap().is_empty());
        let a = log.append(EventData::Killed { pid: 1 }).unwrap();
        let b = log.append(EventData::Paused).unwrap();
        assert!(b.mono_ns >= a.mono_ns);
        assert_eq!(a.v, EVENT_LOG_VERSION);
        chrono::DateTime::parse_from_rfc3339(&a.wall).unwrap();
        assert_eq!(log.read_all().unwrap(), vec![a, b]);
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn skips_torn_garbage_and_unknown_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.jsonl");
        let log = EventLog::new(&p);
        log.append(EventData::Resumed).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"garbage\n\xff\xff\n{\"v\":9,\"wall\":\"x\",\"mono_ns\":1,\"kind\":\"future\"}\n{\"wall\":\"x\",\"mono")
            .unwrap();
        let all = log.read_all().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].kind(), "resumed");
    }

    #[test]
    fn capped_numbered_and_paged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.jsonl");
        let log = EventLog::with_cap(&p, 64 * 1024);
        let msg = "m".repeat(500);
        for _ in 0..1000 {
            log.append(EventData::AgentError {
                message: msg.clone(),
            })
            .unwrap();
        }
        assert!(logcap::size_on_disk(&p) <= 64 * 1024);
        let all = log.read_all().unwrap();
        assert!(all.len() > 50, "{}", all.len());
        assert_eq!(all.last().unwrap().seq, 1000);
        assert!(all.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        // The newest page, then pages forward from a sequence number.
        let newest = log.page(None, 3).unwrap();
        assert_eq!(
            newest.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [998, 999, 1000]
        );
        let first = all[0].seq;
        let p1 = log.page(Some(first), 5).unwrap();
        assert_eq!(
            p1.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (first + 1..first + 6).collect::<Vec<_>>()
        );
        assert!(log.page(Some(1000), 5).unwrap().is_empty());
        // A new writer (a restarted daemon) numbers on.
        let again = EventLog::with_cap(&p, 64 * 1024);
        assert_eq!(again.append(EventData::Paused).unwrap().seq, 1001);
    }
}
