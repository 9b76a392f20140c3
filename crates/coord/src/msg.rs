//! The protocol's messages: JSON objects tagged by `type` with the paper's names
//! (`LOAD`, `LOAD_FIN`, `START`, `START_FIN`, `RESTORE_FIN`, ...), one per frame.
//!
//! Coordinator → cohort: `LOAD`, `START`, `ABORT`, `PING`. Cohort → coordinator:
//! `LOAD_FIN`, `LOAD_FAILED`, `START_FIN`, `START_FAILED`, `RESTORE_FIN`,
//! `RESTORE_FAILED`, `ABORT_ACK`, `PONG`. Every one of these names its restore, and
//! the cohort's handling of each is idempotent (see [`crate::cohort`]), so the
//! coordinator recovers a lost message by sending its command again.
//!
//! The API relay (not part of a restore, see [`crate::relay`]): `API_CALL` from a
//! relay client, `API_REPLY` from the cohort, matched by `call_id`.

use serde::{Deserialize, Serialize};

/// One VM of a `LOAD`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadVm {
    pub vm: String,
    /// The (revised) working set size to load before the VM may start.
    pub ws_pages: u64,
    /// The daemon's own restore arguments for this VM (snapshot path, ...), passed
    /// through untouched.
    #[serde(default)]
    pub args: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Message {
    Load {
        restore_id: String,
        vms: Vec<LoadVm>,
    },
    LoadFin {
        restore_id: String,
        vm: String,
        pages: u64,
        load_s: f64,
    },
    LoadFailed {
        restore_id: String,
        vm: String,
        error: String,
    },
    Start {
        restore_id: String,
        vm: String,
    },
    StartFin {
        restore_id: String,
        vm: String,
        /// The cohort's own wall clock when the VM started running.
        started_unix_ns: i64,
    },
    StartFailed {
        restore_id: String,
        vm: String,
        error: String,
    },
    RestoreFin {
        restore_id: String,
        vm: String,
    },
    RestoreFailed {
        restore_id: String,
        vm: String,
        error: String,
    },
    Abort {
        restore_id: String,
        reason: String,
    },
    AbortAck {
        restore_id: String,
        /// VMs of this restore the cohort aborted (held, or loading and dropped when
        /// their load ends).
        aborted: Vec<String>,
        /// VMs of this restore that had already started and keep running.
        started: Vec<String>,
    },
    Ping {
        restore_id: String,
        /// The coordinator's wall clock when it sent the ping.
        t1_unix_ns: i64,
    },
    Pong {
        restore_id: String,
        t1_unix_ns: i64,
        /// The cohort's wall clock when the ping arrived, and when the pong left.
        t2_unix_ns: i64,
        t3_unix_ns: i64,
    },
    /// One call of the cohort host's API, relayed (see [`crate::relay`]).
    ApiCall {
        call_id: String,
        /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE`.
        method: String,
        /// The API path with its query, e.g. `/v1/vms/a/wait?for=ready`.
        path: String,
        /// The JSON request body, if any.
        #[serde(default)]
        body: Option<serde_json::Value>,
    },
    /// The answer to an `API_CALL`: the API's HTTP status and JSON body.
    ApiReply {
        call_id: String,
        status: u16,
        body: serde_json::Value,
    },
}

impl Message {
    /// The restore the message is about; `None` for the API relay's messages.
    pub fn restore_id(&self) -> Option<&str> {
        Some(match self {
            Message::Load { restore_id, .. }
            | Message::LoadFin { restore_id, .. }
            | Message::LoadFailed { restore_id, .. }
            | Message::Start { restore_id, .. }
            | Message::StartFin { restore_id, .. }
            | Message::StartFailed { restore_id, .. }
            | Message::RestoreFin { restore_id, .. }
            | Message::RestoreFailed { restore_id, .. }
            | Message::Abort { restore_id, .. }
            | Message::AbortAck { restore_id, .. }
            | Message::Ping { restore_id, .. }
            | Message::Pong { restore_id, .. } => restore_id,
            Message::ApiCall { .. } | Message::ApiReply { .. } => return None,
        })
    }

    /// The message's name on the wire, for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Load { .. } => "LOAD",
            Message::LoadFin { .. } => "LOAD_FIN",
            Message::LoadFailed { .. } => "LOAD_FAILED",
            Message::Start { .. } => "START",
            Message::StartFin { .. } => "START_FIN",
            Message::StartFailed { .. } => "START_FAILED",
            Message::RestoreFin { .. } => "RESTORE_FIN",
            Message::RestoreFailed { .. } => "RESTORE_FAILED",
            Message::Abort { .. } => "ABORT",
            Message::AbortAck { .. } => "ABORT_ACK",
            Message::Ping { .. } => "PING",
            Message::Pong { .. } => "PONG",
            Message::ApiCall { .. } => "API_CALL",
            Message::ApiReply { .. } => "API_REPLY",
        }
    }
}

/// The wall clock in nanoseconds since the Unix epoch.
pub fn unix_now_ns() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_on_the_wire_are_the_papers() {
        let m = Message::LoadFin {
            restore_id: "r".into(),
            vm: "a".into(),
            pages: 3,
            load_s: 0.5,
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"type":"LOAD_FIN","restore_id":"r","vm":"a","pages":3,"load_s":0.5}"#
        );
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), m);
        assert_eq!(m.kind(), "LOAD_FIN");
    }
}
