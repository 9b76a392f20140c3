//! Crash reports on disk (`vms/NAME/crashes/ID/report.json`), read back for
//! `GET /v1/vms/{name}/crashes[/{id}]`. They are files we wrote, but a disk can
//! truncate or a user can edit them: each is read with a size cap and checked.

use std::path::Path;

use rebound_api::crash::CRASH_REPORT_VERSION;
use rebound_api::CrashReport;

/// Largest report accepted (a timeline sample per chunk keeps them small).
const MAX_REPORT: u64 = 16 << 20;

/// Errors reading a crash report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("no crash {0:?}")]
    Unknown(String),
    #[error("cannot read crash report {0}")]
    Read(String, #[source] std::io::Error),
    #[error("crash report {0} is larger than {MAX_REPORT} bytes")]
    TooLarge(String),
    #[error("crash report {0} is malformed")]
    Malformed(String, #[source] serde_json::Error),
    #[error("crash report {0} has version {1}; this rebound reads version {CRASH_REPORT_VERSION}")]
    Version(String, u32),
}

/// Reads and checks one report file, and checks its dump as it is now on disk: a dump
/// truncated or damaged after it was written is said so in the report's notes.
pub fn load(path: &Path) -> Result<CrashReport, ReportError> {
    let mut r = load_file(path)?;
    if let (Some(dump), Some(_)) = (&r.dump_path, r.dump_bytes) {
        match rebound_dump::inspect(dump) {
            Ok(i) if i.complete => {}
            Ok(i) => r.notes.push(format!(
                "the dump {dump} is damaged now: {}",
                i.problems.join("; ")
            )),
            Err(e) => r.notes.push(format!(
                "the dump {dump} cannot be read now: {}",
                rebound_errors::chain(&e)
            )),
        }
    }
    Ok(r)
}

fn load_file(path: &Path) -> Result<CrashReport, ReportError> {
    let p = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| ReportError::Read(p.clone(), e))?;
    if meta.len() > MAX_REPORT {
        return Err(ReportError::TooLarge(p));
    }
    let data = std::fs::read(path).map_err(|e| ReportError::Read(p.clone(), e))?;
    let v: serde_json::Value =
        serde_json::from_slice(&data).map_err(|e| ReportError::Malformed(p.clone(), e))?;
    let version = v.get("version").and_then(|x| x.as_u64()).unwrap_or(0) as u32;
    if version != CRASH_REPORT_VERSION {
        return Err(ReportError::Version(p, version));
    }
    serde_json::from_value(v).map_err(|e| ReportError::Malformed(p, e))
}

/// Every crash of a VM, oldest first; unreadable ones are skipped with a warning.
pub fn list(crashes_dir: &Path) -> Vec<CrashReport> {
    let Ok(rd) = std::fs::read_dir(crashes_dir) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    ids.sort();
    ids.iter()
        .filter_map(|id| match load(&crashes_dir.join(id).join("report.json")) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!("{}", rebound_errors::chain(&e));
                None
            }
        })
        .collect()
}

/// Crashes a previous daemon was still handling that the new one cannot take over
/// (see `Owner::take_over_crash`). Each is marked failed with where its memory is:
/// the part not yet dumped is still in the crashed RAM file (punched only once
/// durable), the rest in the partial dump, so nothing is lost, and the operator is
/// told so; `why` says why it was not resumed.
pub fn mark_interrupted(
    paths: &rebound_vmm::paths::Paths,
    vm: &str,
    mut r: rebound_api::CrashReport,
    why: &str,
) {
    use rebound_api::CrashPhase;
    let dir = paths.vm(vm).crash_dir("");
    let ram = paths.crashed_ram(vm, &r.id);
    let mut note = format!("the daemon stopped while this crash was handled, and {why}");
    if r.phase == CrashPhase::Dumping || r.dump_bytes.is_none() && r.dump_path.is_some() {
        if ram.exists() {
            note.push_str(&format!(
                "; the memory not yet dumped is kept in {}",
                ram.display()
            ));
        }
        if let Some(p) = &r.dump_path {
            note.push_str(&format!(
                "; what was dumped is in {}",
                rebound_dump::write::partial_path(std::path::Path::new(p)).display()
            ));
        }
    }
    r.phase = CrashPhase::Failed;
    r.notes.push(note);
    let path = dir.join(&r.id).join("report.json");
    let data = serde_json::to_vec_pretty(&r).expect("reports serialize");
    if let Err(e) = rebound_vmm::private::write_atomic(&path, &data) {
        tracing::error!(vm, "cannot mark crash {} interrupted: {e}", r.id);
    } else {
        tracing::warn!(
            vm,
            "crash {} was being handled when the daemon stopped: marked failed ({why})",
            r.id
        );
    }
}

/// One crash by id, or the latest with `None`.
pub fn get(crashes_dir: &Path, id: Option<&str>) -> Result<CrashReport, ReportError> {
    match id {
        Some(id) => {
            // Ids are timestamps: anything else cannot name a crash (nor escape the dir).
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') {
                return Err(ReportError::Unknown(id.to_string()));
            }
            let p = crashes_dir.join(id).join("report.json");
            if !p.exists() {
                return Err(ReportError::Unknown(id.to_string()));
            }
            load(&p)
        }
        None => list(crashes_dir)
            .pop()
            .ok_or_else(|| ReportError::Unknown("latest".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_reports_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("report.json");
        std::fs::write(&p, b"{\"version\":1,\"id\":").unwrap();
        assert!(matches!(load(&p), Err(ReportError::Malformed(..))));
        std::fs::write(&p, b"{\"version\":7}").unwrap();
        assert!(matches!(load(&p), Err(ReportError::Version(_, 7))));
        std::fs::write(&p, b"{\"version\":1}").unwrap();
        assert!(matches!(load(&p), Err(ReportError::Malformed(..))));
        std::fs::File::create(&p)
            .unwrap()
            .set_len(MAX_REPORT + 1)
            .unwrap();
        assert!(matches!(load(&p), Err(ReportError::TooLarge(_))));
        assert!(matches!(
            get(d.path(), Some("../x")),
            Err(ReportError::Unknown(_))
        ));
        assert!(matches!(get(d.path(), None), Err(ReportError::Unknown(_))));
    }
}
