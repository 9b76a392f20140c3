//! After a daemon restart: the VM's latest crash that the previous daemon was still
//! handling is taken over from its saved report (`rebound_crash::Crash::resume`
//! decides what is done and what is left). An unfinished dump is resumed: its partial
//! file is kept aside and read for the pages already punched out of the RAM file, the
//! rest comes from the RAM file, so the finished dump is whole. Older open crashes,
//! and one that cannot be resumed, are marked failed with where their memory is.

use std::path::{Path, PathBuf};

use rebound_api::{CrashPhase, CrashReport};
use rebound_crash::{check_dump, unfinished_dump, Crash, DumpFile, DumpState, ResumeFacts, Seen};
use rebound_vmm::events::{mono_ns, wall_now};
use rebound_vmm::resolve::VIRTIO_MEM_BLOCK_MIB;

use super::crash_state::{held, Handling};
use super::owner::Owner;

/// Why a crash cannot be taken over.
#[derive(Debug, thiserror::Error)]
enum TakeOverError {
    #[error(transparent)]
    Resume(#[from] rebound_crash::ResumeError),
    #[error("its partial dump {} cannot be kept aside", .0.display())]
    KeepAside(PathBuf, #[source] std::io::Error),
}

impl Owner {
    /// Takes over the VM's latest open crash, if any.
    pub(super) async fn take_over_crash(&mut self) {
        use crate::daemon::crashes;
        let name = self.vm.name.clone();
        let mut open: Vec<CrashReport> = crashes::list(&self.vm.dir.crash_dir(""))
            .into_iter()
            .filter(|r| matches!(r.phase, CrashPhase::Dumping | CrashPhase::Recovering))
            .collect();
        let Some(latest) = open.pop() else { return };
        for r in open {
            crashes::mark_interrupted(&self.paths, &name, r, "a later crash came first");
        }
        match self.resume_crash(latest.clone()) {
            Ok(acts) => self.execute(acts).await,
            Err(e) => {
                let why = rebound_errors::chain(&e);
                crashes::mark_interrupted(&self.paths, &name, latest, &why);
            }
        }
    }

    fn resume_crash(
        &mut self,
        mut report: CrashReport,
    ) -> Result<Vec<rebound_crash::Action>, TakeOverError> {
        let rec = self.vm.record();
        let now_ns = mono_ns();
        let file = unfinished_dump(&report).map_or(DumpFile::Absent, dump_file);
        let dump = check_dump(&mut report, file, now_ns)?;
        let crashed_ram = self.paths.crashed_ram(&self.vm.name, &report.id);
        if let DumpState::Finished(out) = &dump {
            // Finished: what an earlier daemon kept for it is no longer needed.
            let _ = std::fs::remove_file(&crashed_ram);
            let _ = std::fs::remove_file(rebound_dump::write::partial_path(out));
            let mut n = 1;
            while std::fs::remove_file(resume_path(out, n)).is_ok() {
                n += 1;
            }
        }
        let group = report
            .memory_limit
            .as_ref()
            .and_then(|m| m.group.as_ref())
            .and_then(|_| self.cgroups.as_ref().ok()?.vm(&self.vm.name).ok());
        let dir = self.vm.dir.crash_dir(&report.id);
        let seen = Seen {
            now_ns,
            crashed_bytes: held(&crashed_ram),
            charged_bytes: group.as_ref().and_then(|g| g.usage().ok()),
        };
        let facts = ResumeFacts {
            report,
            dump: dump.clone(),
            memory_mib: rec.spec.memory_mib,
            block_mib: VIRTIO_MEM_BLOCK_MIB,
            dir: dir.clone(),
            crashed_ram: crashed_ram.clone(),
            crashed_ram_exists: crashed_ram.exists(),
            has_qemu: rec.state.has_qemu(),
            wall_now: wall_now(),
        };
        let (m, acts) = Crash::resume(facts, seen)?;
        let mut h = Handling::new(m, dir.clone(), crashed_ram);
        h.group = group;
        if let DumpState::Unfinished(out) = &dump {
            let partial = rebound_dump::write::partial_path(out);
            let mut n = 1;
            while resume_path(out, n).exists() {
                n += 1;
            }
            if partial.exists() {
                std::fs::rename(&partial, resume_path(out, n))
                    .map_err(|e| TakeOverError::KeepAside(partial.clone(), e))?;
                n += 1;
            }
            h.earlier = (1..n).rev().map(|i| resume_path(out, i)).collect();
            let cpu = dir.join("cpu-notes.elf");
            h.cpu_notes = cpu.exists().then_some(cpu);
        }
        self.crash = Some(h);
        Ok(acts)
    }
}

/// What is at a dump's path: a dump is only ever renamed there whole and flushed.
fn dump_file(out: &str) -> DumpFile {
    if std::fs::symlink_metadata(out).is_err() {
        return DumpFile::Absent;
    }
    match rebound_dump::inspect(out) {
        Err(e) => DumpFile::NoDump {
            why: rebound_errors::chain(&e),
        },
        Ok(info) if !info.complete => DumpFile::Damaged {
            problems: info.problems,
        },
        Ok(info) => DumpFile::Whole {
            file_bytes: info.file_bytes,
            pages_dumped: info.pages_dumped,
        },
    }
}

/// Where the `n`th partial dump of stopped daemons is kept (`n` = 1 is the oldest).
fn resume_path(out: &Path, n: usize) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".resume.{n}"));
    out.with_file_name(name)
}
