//! The per-VM event log file (`events.jsonl`): typed [`Event`]s, one JSON line each,
//! format version [`rebound_api::EVENT_LOG_VERSION`] (documented in `rebound_api::event`).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

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

/// Appends to and reads one VM's `events.jsonl`.
#[derive(Debug, Clone)]
pub struct EventLog {
    path: PathBuf,
}

impl EventLog {
    pub fn new(path: &Path) -> Self {
        EventLog {
            path: path.to_path_buf(),
        }
    }

    /// Appends an event stamped now; returns it.
    pub fn append(&self, data: EventData) -> Result<Event, EventError> {
        let ev = Event {
            v: EVENT_LOG_VERSION,
            wall: wall_now(),
            mono_ns: mono_ns(),
            data,
        };
        let mut line = serde_json::to_string(&ev).expect("events serialize");
        line.push('\n');
        let mut f = crate::private::create_file(&self.path, true)
            .map_err(|e| EventError::Write(self.path.clone(), e))?;
        // One write per line: concurrent appenders never interleave within a line.
        f.write_all(line.as_bytes())
            .map_err(|e| EventError::Write(self.path.clone(), e))?;
        Ok(ev)
    }

    /// All events; a missing log is empty, and lines that do not parse (a torn last
    /// line after a crash, a kind from a newer version) are skipped.
    pub fn read_all(&self) -> Result<Vec<Event>, EventError> {
        let f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(EventError::Read(self.path.clone(), e)),
        };
        let mut out = Vec::new();
        for line in std::io::BufReader::new(f).split(b'\n') {
            let line = line.map_err(|e| EventError::Read(self.path.clone(), e))?;
            if let Ok(ev) = serde_json::from_slice::<Event>(&line) {
                out.push(ev);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
}
