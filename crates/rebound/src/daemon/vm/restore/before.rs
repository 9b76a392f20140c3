//! What a restore reads before its guest's first instruction, as its plan says: the
//! image copied (eager) or the working set read (working-set, elastic), and the
//! RAM check that goes before the start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rebound_snapshot::restore_plan::{BeforeStart, Checking};
use rebound_snapshot::{Loader, Trace};

use super::gate::BeforeStartGuard;
use super::InputError;
use crate::daemon::error::OpError;
use crate::daemon::vm::ram_check::{check_before_start, CheckedBefore};
use crate::daemon::vm::VmHandle;

/// What was read and checked before the start.
pub(super) struct LoadedBefore {
    pub(super) loader: Loader,
    /// (pages, bytes, seconds) read, if anything was.
    pub(super) read: Option<(u64, u64, f64)>,
    pub(super) checked: CheckedBefore,
}

/// The reads before the start of one restore, for a blocking thread.
pub(super) struct Job {
    pub(super) vm: Arc<VmHandle>,
    /// The run dir's shared RAM file (an eager copy's destination).
    pub(super) run_ram: PathBuf,
    pub(super) checking: Checking,
    pub(super) before_start: BeforeStart,
    pub(super) trace: Option<Trace>,
    pub(super) image: PathBuf,
    pub(super) size: u64,
    pub(super) chunk: u64,
    pub(super) checksums: Vec<String>,
}

impl Job {
    pub(super) fn run(self) -> Result<LoadedBefore, OpError> {
        let Job {
            vm,
            run_ram,
            checking,
            before_start,
            trace,
            image,
            size,
            chunk,
            checksums,
        } = self;
        let mut loader = Loader::one_image(&image, size, trace).map_err(InputError::from)?;
        let t = Instant::now();
        let _first = BeforeStartGuard::enter();
        let mut checked =
            check_before_start(&mut loader, &image, size, chunk, &checksums, checking, &vm)?;
        let stats = match before_start {
            BeforeStart::CopyImage => {
                let mut show = |d: u64, t: u64| vm.set_progress(Some((d, t)));
                let copied =
                    rebound_snapshot::copy_ram_image(&image, &run_ram, size, chunk, &mut show)
                        .map_err(InputError::from)?;
                vm.set_progress(None);
                if let Some(i) = copied
                    .checksums
                    .iter()
                    .zip(&checksums)
                    .position(|(a, b)| a != b)
                {
                    return Err(InputError::Copy {
                        image,
                        chunk: i,
                        start: i as u64 * chunk,
                        end: ((i as u64 + 1) * chunk).min(size),
                    }
                    .into());
                }
                Some((copied.data_bytes / 4096, copied.data_bytes))
            }
            BeforeStart::WorkingSet(n) => {
                let s = loader.load_first(n).map_err(InputError::from)?;
                Some((s.pages, s.bytes))
            }
            BeforeStart::Nothing => None,
        };
        // The working set's chunks, checked as the loader completed them.
        checked.before = checked.before.max(loader.chunks_checked().0);
        let read = stats.map(|(p, b)| (p, b, t.elapsed().as_secs_f64()));
        Ok(LoadedBefore {
            loader,
            read,
            checked,
        })
    }
}
