//! The per-VM event log: JSON lines with a wall-clock (RFC 3339) and a
//! CLOCK_MONOTONIC timestamp, so intervals are exact even if the wall clock jumps.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Errors writing or reading an event log.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("cannot write event log {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error("cannot read event log {0}: {1}")]
    Read(PathBuf, std::io::Error),
}

/// One event, as stored and as served by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub wall: String,
    pub mono_ns: u64,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Value>,
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
    pub fn append(&self, kind: &str, detail: Option<Value>) -> Result<Event, EventError> {
        let ev = Event {
            wall: wall_now(),
            mono_ns: mono_ns(),
            kind: kind.to_string(),
            detail,
        };
        let mut line = serde_json::to_string(&ev).expect("events serialize");
        line.push('\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| EventError::Write(self.path.clone(), e))?;
        // One write per line: concurrent appenders never interleave within a line.
        f.write_all(line.as_bytes())
            .map_err(|e| EventError::Write(self.path.clone(), e))?;
        Ok(ev)
    }

    /// All events; a missing log is empty and unreadable lines (e.g. a torn last
    /// line after a crash) are skipped.
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

    #[test]
    fn append_and_read_back() {
        let d = tempfile::tempdir().unwrap();
        let log = EventLog::new(&d.path().join("e.jsonl"));
        assert!(log.read_all().unwrap().is_empty());
        let a = log
            .append("started", Some(serde_json::json!({"pid": 1})))
            .unwrap();
        let b = log.append("ready", None).unwrap();
        assert!(b.mono_ns >= a.mono_ns);
        chrono::DateTime::parse_from_rfc3339(&a.wall).unwrap();
        let all = log.read_all().unwrap();
        assert_eq!(all, vec![a, b]);
    }

    #[test]
    fn skips_torn_and_garbage_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.jsonl");
        let log = EventLog::new(&p);
        log.append("started", None).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"garbage\n\xff\xff\n{\"wall\":\"x\",\"mono")
            .unwrap();
        let all = log.read_all().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].kind, "started");
    }
}
