//! The daemon's side of a disk backend's control socket (`rebound_blk::serve`): one
//! JSON request, one JSON answer, and the ways that conversation fails. The MRC
//! report, the eviction-ring forwarder and the host-cache move all talk it.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Why a disk backend's control socket gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Connecting, writing, reading or decoding the answer line failed.
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// The backend answered with an error of its own (shown as its JSON value).
    #[error("{}: {answer}", .control.display())]
    Refused { control: PathBuf, answer: Value },
    /// The backend's own words for a refusal, as the MRC report shows them.
    #[error("{0}")]
    Said(String),
    /// Its answer is not what that request answers with.
    #[error("bad answer")]
    Decode(#[source] serde_json::Error),
    /// The worker thread that asked failed.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// Asks the backend at `control` once (blocking); its `{"error": ...}` answer is a
/// refusal.
pub fn ask(control: &Path, req: &Value) -> Result<Value, ControlError> {
    let v = rebound_blk::serve::ask(control, req)
        .map_err(|e| ControlError::Io(control.to_path_buf(), e))?;
    match v.get("error") {
        Some(e) => Err(ControlError::Refused {
            control: control.to_path_buf(),
            answer: e.clone(),
        }),
        None => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_errors::chain;

    #[test]
    fn failures_read_as_they_did_when_they_were_strings() {
        let io = ControlError::Io(
            "/run/b/control.sock".into(),
            std::io::Error::from_raw_os_error(111),
        );
        assert_eq!(
            chain(&io),
            "/run/b/control.sock: Connection refused (os error 111)"
        );
        let refused = ControlError::Refused {
            control: "/run/b/control.sock".into(),
            answer: Value::from("no cache"),
        };
        assert_eq!(chain(&refused), "/run/b/control.sock: \"no cache\"");
        let bad = serde_json::from_str::<u64>("x").unwrap_err();
        let want = format!("bad answer: {bad}");
        assert_eq!(chain(&ControlError::Decode(bad)), want);
    }

    #[test]
    fn a_backend_that_is_not_there_is_an_io_failure_naming_its_socket() {
        let dir = std::env::temp_dir().join(format!("rebound-ctl-{}", std::process::id()));
        let e = ask(&dir.join("none.sock"), &serde_json::json!({"op": "curve"})).unwrap_err();
        assert!(matches!(e, ControlError::Io(..)), "{e:?}");
        assert!(chain(&e).starts_with(&format!("{}: ", dir.join("none.sock").display())));
    }
}
