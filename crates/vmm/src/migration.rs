//! QEMU's migration used as a save and load path: the device state (and, for QEMU's
//! stock save, all of guest RAM) written through an `exec:` URI, loads and local
//! live migrations waited for, and the facts a snapshot records so that a restore
//! can refuse a QEMU it does not fit. Every call goes through a [`Monitor`].

use std::path::Path;
use std::time::Duration;

use crate::port::Monitor;
use crate::qmp::QmpError;

/// Why a migration did not complete.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("QMP")]
    Qmp(#[from] QmpError),
    #[error("{what} failed: {why}")]
    Failed { what: String, why: String },
}

/// Polls `query-migrate` until the migration (`what`, for the error) completed.
pub async fn wait_migration(q: &impl Monitor, what: &str) -> Result<(), MigrationError> {
    loop {
        let v = q.qmp("query-migrate", None).await?;
        match v["status"].as_str() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => {
                let why = v["error-desc"].as_str().unwrap_or("no reason given");
                return Err(MigrationError::Failed {
                    what: what.to_string(),
                    why: why.to_string(),
                });
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// Sets migration capability `x-ignore-shared` (shared RAM left out of the stream).
/// On, it also turns `postcopy-ram` off, in the same command since QEMU refuses the
/// two together: a QEMU restored by a page server (a postcopy destination) keeps
/// that capability, and its snapshot leaves RAM out.
pub async fn set_ignore_shared(q: &impl Monitor, on: bool) -> Result<(), QmpError> {
    let caps = if on {
        serde_json::json!([
            {"capability": "postcopy-ram", "state": false},
            {"capability": "x-ignore-shared", "state": true}])
    } else {
        serde_json::json!([{"capability": "x-ignore-shared", "state": false}])
    };
    q.qmp(
        "migrate-set-capabilities",
        Some(serde_json::json!({ "capabilities": caps })),
    )
    .await
    .map(|_| ())
}

/// Turns on the `postcopy-ram` capability (a destination fed by a page server).
pub async fn set_postcopy(q: &impl Monitor) -> Result<(), QmpError> {
    q.qmp(
        "migrate-set-capabilities",
        Some(serde_json::json!({"capabilities": [
            {"capability": "postcopy-ram", "state": true}]})),
    )
    .await
    .map(|_| ())
}

/// Has the paused QEMU write its device state (and, without `ignore_shared`, all
/// of guest RAM: QEMU's stock save) to `path`, and waits for it.
pub async fn save_device_state(
    q: &impl Monitor,
    path: &Path,
    ignore_shared: bool,
) -> Result<(), MigrationError> {
    set_ignore_shared(q, ignore_shared).await?;
    let uri = format!("exec:cat > {}", shell_quote(path));
    q.qmp("migrate", Some(serde_json::json!({ "uri": uri })))
        .await?;
    wait_migration(q, "the device state save").await
}

/// A path for `sh -c` (QEMU's `exec:` runs one).
pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// QEMU's version, `major.minor.micro`; empty if it does not say.
pub async fn qemu_version(q: &impl Monitor) -> String {
    match q.qmp("query-version", None).await {
        Ok(v) => {
            let q = &v["qemu"];
            format!("{}.{}.{}", q["major"], q["minor"], q["micro"])
        }
        Err(_) => String::new(),
    }
}

/// The concrete machine type (`pc` resolves to e.g. `pc-i440fx-7.2`); empty if
/// QEMU does not say.
pub async fn machine_type(q: &impl Monitor) -> String {
    let Ok(v) = q.qmp("query-machines", None).await else {
        return String::new();
    };
    let list = v.as_array().cloned().unwrap_or_default();
    let pc = list.iter().find(|m| m["alias"] == "pc");
    pc.and_then(|m| m["name"].as_str())
        .unwrap_or("pc")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::sync::Mutex;

    /// A monitor that answers from a script and records what it was asked.
    struct Script {
        answers: Mutex<Vec<Result<Value, QmpError>>>,
        asked: Mutex<Vec<String>>,
    }

    impl Script {
        fn new(mut answers: Vec<Result<Value, QmpError>>) -> Script {
            answers.reverse();
            Script {
                answers: Mutex::new(answers),
                asked: Mutex::new(Vec::new()),
            }
        }
    }

    impl Monitor for Script {
        async fn qmp(&self, command: &str, _args: Option<Value>) -> Result<Value, QmpError> {
            self.asked.lock().unwrap().push(command.to_string());
            self.answers.lock().unwrap().pop().expect("an answer")
        }
    }

    #[tokio::test]
    async fn a_migration_is_waited_for_until_it_completes_or_says_why_not() {
        let q = Script::new(vec![
            Ok(json!({"status": "active"})),
            Ok(json!({"status": "completed"})),
        ]);
        wait_migration(&q, "x").await.unwrap();
        assert_eq!(q.asked.lock().unwrap().len(), 2);
        let q = Script::new(vec![Ok(
            json!({"status": "failed", "error-desc": "no space"}),
        )]);
        let e = wait_migration(&q, "the device state save")
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "the device state save failed: no space");
    }

    #[tokio::test]
    async fn the_machine_type_is_what_pc_resolves_to() {
        let q = Script::new(vec![Ok(json!([
            {"name": "q35"},
            {"name": "pc-i440fx-7.2", "alias": "pc"}
        ]))]);
        assert_eq!(machine_type(&q).await, "pc-i440fx-7.2");
        let q = Script::new(vec![Err(QmpError::Closed)]);
        assert_eq!(machine_type(&q).await, "");
        let q = Script::new(vec![Ok(
            json!({"qemu": {"major": 7, "minor": 2, "micro": 0}}),
        )]);
        assert_eq!(qemu_version(&q).await, "7.2.0");
    }

    #[test]
    fn quoted_paths_survive_sh() {
        assert_eq!(shell_quote(Path::new("/a b/it's")), r"'/a b/it'\''s'");
    }
}
