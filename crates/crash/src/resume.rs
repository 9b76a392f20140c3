//! A daemon restarted while a crash was handled: what its saved report says is done,
//! and what is left (a dump to resume, a recovery VM to start or wait for).

use std::path::PathBuf;

use rebound_api::{CrashReport, OnCrash};

use crate::machine::{Action, Crash, Next, Seen};
use crate::policy::MIB;

/// What is at an unfinished dump's path.
#[derive(Debug, Clone, PartialEq)]
pub enum DumpFile {
    Absent,
    /// A whole dump (renamed there by the daemon that stopped).
    Whole {
        file_bytes: u64,
        pages_dumped: u64,
    },
    /// Something that is not a dump (why it is not).
    NoDump {
        why: String,
    },
    /// A dump with these problems.
    Damaged {
        problems: Vec<String>,
    },
}

/// Where the report's dump stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpState {
    /// The crash has no dump.
    None,
    /// The dump at this path is whole: what was kept for it may go.
    Finished(PathBuf),
    /// The dump into this path is to be resumed.
    Unfinished(PathBuf),
}

/// Why a crash cannot be taken over (the report says so when it is marked failed).
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error("{path} is there but is no dump ({why}); it is kept as it is")]
    NoDump { path: String, why: String },
    #[error("its dump {path} is there but damaged ({}); it is kept as it is", problems.join("; "))]
    Damaged { path: String, problems: Vec<String> },
    #[error("its RAM file {} is gone", .0.display())]
    RamGone(PathBuf),
    #[error("its recovery VM is gone")]
    RecoveryGone,
}

/// The path of a dump the report says is unfinished: the daemon looks at what is
/// there for [`check_dump`].
pub fn unfinished_dump(report: &CrashReport) -> Option<&str> {
    match (&report.dump_path, report.dump_s) {
        (Some(p), None) => Some(p),
        _ => None,
    }
}

/// A dump the report says is unfinished may have been finished by the daemon that
/// stopped (renamed into place, not yet reported): `file` (what is at its path) says
/// so, since a dump is only ever renamed there whole and flushed. A whole one is
/// written into the report; something that is not a whole dump is never replaced.
pub fn check_dump(
    report: &mut CrashReport,
    file: DumpFile,
    now_ns: u64,
) -> Result<DumpState, ResumeError> {
    let Some(out) = report.dump_path.clone() else {
        return Ok(DumpState::None);
    };
    if report.dump_s.is_some() {
        return Ok(DumpState::Finished(out.into()));
    }
    match file {
        DumpFile::Absent => Ok(DumpState::Unfinished(out.into())),
        DumpFile::NoDump { why } => Err(ResumeError::NoDump { path: out, why }),
        DumpFile::Damaged { problems } => Err(ResumeError::Damaged {
            path: out,
            problems,
        }),
        DumpFile::Whole {
            file_bytes,
            pages_dumped,
        } => {
            // dump_s counts from the crash: when it finished is not known, only that
            // it had by now.
            report.dump_s = Some(now_ns.saturating_sub(report.crashed_mono_ns) as f64 / 1e9);
            report.dump_bytes = Some(file_bytes);
            report.pages_written = Some(pages_dumped);
            report.notes.push(
                "the dump was finished before the daemon stopped: recognised from the file".into(),
            );
            Ok(DumpState::Finished(out.into()))
        }
    }
}

/// What the restarted daemon knows of a crash it takes over.
#[derive(Debug, Clone)]
pub struct ResumeFacts {
    pub report: CrashReport,
    /// From [`check_dump`].
    pub dump: DumpState,
    pub memory_mib: u64,
    pub block_mib: u64,
    pub dir: PathBuf,
    pub crashed_ram: PathBuf,
    pub crashed_ram_exists: bool,
    /// The VM has a QEMU (its recovery VM, if one was started).
    pub has_qemu: bool,
    /// Wall-clock time now (RFC 3339).
    pub wall_now: String,
}

impl Crash {
    /// Takes over a crash the previous daemon was handling, from its saved report: an
    /// unfinished dump is resumed (the daemon keeps its partial file aside first, so
    /// the resumed dump reads the pages already punched out of the RAM file from it),
    /// a recovery VM is started if one is due, or waited for if it runs.
    pub fn resume(f: ResumeFacts, seen: Seen) -> Result<(Crash, Vec<Action>), ResumeError> {
        let mut report = f.report;
        let unfinished = matches!(f.dump, DumpState::Unfinished(_));
        if unfinished && !f.crashed_ram_exists {
            return Err(ResumeError::RamGone(f.crashed_ram));
        }
        let started = report
            .timeline
            .iter()
            .find(|s| s.event.as_deref() == Some("recovery started"))
            .cloned();
        if started.is_some() && report.downtime_s.is_none() && !f.has_qemu {
            return Err(ResumeError::RecoveryGone);
        }
        let last = report.timeline.last().cloned();
        report.notes.push(format!(
            "the daemon stopped at some point before {} while this crash was handled; the next daemon took it over{}",
            f.wall_now,
            if unfinished { " and resumed the dump" } else { "" }
        ));
        let policy = report.policy.clone();
        let mut c = Crash {
            memory_mib: f.memory_mib,
            block_mib: f.block_mib,
            dir: f.dir,
            crashed_ram: f.crashed_ram,
            dumping: false,
            dump_started_ns: None,
            recovery_due: policy.on_crash.recovers()
                && (policy.on_crash != OnCrash::DumpThenRecover || !unfinished),
            recovery_spawned_ns: started
                .as_ref()
                .map(|s| report.crashed_mono_ns + (s.t_s * 1e9) as u64),
            recovery_mib: last.as_ref().map_or(0, |s| s.recovery_bytes / MIB),
            boot_mib: started.as_ref().map_or(0, |s| s.recovery_bytes / MIB),
            dumped_bytes: 0,
            skipped_bytes: 0,
            throttled: false,
            io: policy.io_policy,
            report,
        };
        let mut out = Vec::new();
        if unfinished {
            c.start_dump(seen.now_ns, &mut out);
            // dump_s counts from the crash: the time no daemon ran is part of it.
            c.dump_started_ns = Some(c.report.crashed_mono_ns);
        }
        out.push(Action::SetJob(Some("crash")));
        out.extend(c.on(crate::Event::Then(Next::TakeOverStart), seen));
        Ok((c, out))
    }
}
