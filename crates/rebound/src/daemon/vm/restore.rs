//! `rebound vm restore`: a new VM from a snapshot directory.
//!
//! QEMU starts with `-incoming defer -S`; its RAM is the snapshot's image mapped
//! private (the kernel loads each page from the image's page cache on first
//! touch), or for `eager` a copy of the image in the run dir's shared RAM file,
//! or for `stock` fresh RAM filled by QEMU's own full migration stream. Before
//! the guest runs, the mode decides what is read into the page cache: nothing
//! (lazy), the whole recorded working set, or its first N pages in first-access
//! order, sorted by file offset and read in coalesced runs (elastic). Then the
//! device state is loaded and the vCPUs start, at once or when `vm resume` says
//! (a restore held ready, the hook a cluster restore uses). While the guest runs,
//! a background loader reads the rest, and a watcher records which pages the
//! guest touches, its faults, its reads and when its service first answers.
//!
//! The decisions (mode fallbacks, working set, loader order, RAM check, settle, the
//! report) are `rebound_snapshot::restore_plan`'s; this module and `restore/`
//! carry them out: `run` (the start, the loader, the watch, the settle), `answer`
//! (the first answer), `disks` (the device state and disks QEMU is given).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::RestoreReport;
use rebound_snapshot::restore_plan::{
    self, Action, BeforeStart, Checking, Event, Facts, Memory, Restore, TraceFacts,
};
use rebound_snapshot::{Trace, TracePage};
use rebound_vmm::migration::{
    machine_type, set_ignore_shared, set_postcopy, shell_quote, wait_migration,
};
use rebound_vmm::port::{Runtime, Spawn};
use rebound_vmm::qemu::{Incoming, MemoryBackend};

use super::machine::Trigger;
use super::owner::Owner;
use super::restore_guard::ImageStamp;
use crate::daemon::error::OpError;

pub(super) mod agent_wait;
mod answer;
mod before;
mod disks;
pub(crate) mod error;
pub(super) mod gate;
pub(super) mod resume;
mod run;
pub(super) mod served;
pub(super) mod state;

use before::LoadedBefore;
pub use error::InputError;
pub use state::RestoreJob;
use state::{ArmedTrace, Restoring};

/// How long a restored guest's service gets to answer before the report says it
/// did not.
const RESPONSIVE_WAIT: Duration = Duration::from_secs(60);
/// How long a restored recovery VM's settle waits for it to pass readiness.
const RECOVERY_READY_WAIT: Duration = Duration::from_secs(600);

impl Owner {
    pub(super) async fn restore(&mut self, job: RestoreJob) -> Result<RestoreReport, OpError> {
        let RestoreJob {
            spec,
            boot,
            ready,
            req,
            snap,
            recovery,
            hold_rest,
            replay,
            notes,
        } = job;
        let recovering = recovery.is_some();
        let t0 = Instant::now();
        let snap = Arc::new(snap);
        // Disks served by Rebound's backend come back on it: their device state is
        // vhost-user-blk's, and the backend reaches guest RAM only when it is shared,
        // which a restore has only when it copies the image first (eager).
        let on_backend = spec.any_rebound_disk();
        let m = snap.manifest().clone();
        let blocks: Vec<(&str, u64)> = m
            .ram_blocks
            .iter()
            .map(|b| (b.id.as_str(), b.size))
            .collect();
        restore_plan::check_fit(on_backend, recovering, &blocks, spec.memory_mib)
            .map_err(InputError::from)?;
        let block = &m.ram_blocks[0];
        let size = block.size;
        let image = snap.path_of(&block.file);
        let trace = match &m.trace {
            Some(t) => {
                let path = snap.path_of(&t.file);
                let r = tokio::task::spawn_blocking(move || Trace::read(&path, size / 4096))
                    .await
                    .map_err(|e| OpError::Broken(Box::new(e)))?;
                Some(r.map_err(InputError::from)?)
            }
            None => None,
        };
        let trust = super::ram_check::trust(&self.paths, &snap, &image)?;
        // The page server reads the checked copy of the device state the run dir
        // gets anyway; whether it can run is known before the plan.
        self.prepare_run_dir()?;
        let (device_state, no_page_server) = match (req.mode, req.path) {
            (rebound_api::RestoreMode::Stock, _) | (_, rebound_api::LoadPath::PageCache) => {
                (None, None)
            }
            _ => {
                let state = self.checked_device_state(&snap).await?;
                let (st, id) = (state.clone(), block.id.clone());
                let why = tokio::task::spawn_blocking(move || served::why_not(&st, &id, size))
                    .await
                    .map_err(|e| OpError::Broken(Box::new(e)))?;
                (Some(state), why)
            }
        };
        let plan = restore_plan::plan(Facts {
            vm: spec.name.clone(),
            snapshot: snap.path().display().to_string(),
            asked: req.mode,
            rest_order: req.rest_order,
            ws_pages: req.ws_pages,
            ram_check: req.ram_check,
            on_backend,
            trust,
            trace: m
                .trace
                .as_ref()
                .zip(trace.as_ref())
                .map(|(info, t)| TraceFacts {
                    pages: t.pages.len() as u64,
                    default_elastic_pages: info.default_elastic_pages(),
                    source: info.source.clone(),
                }),
            chunks: block.checksums.len() as u64,
            has_stock_stream: snap.path_of("stock.mig").is_file(),
            path: req.path,
            no_page_server,
            notes,
        })
        .map_err(InputError::from)?;
        let machine = Restore::new(&plan, t0, req.paused, trace.is_some());
        let mut report = plan.report.clone();
        let served = plan.memory == Memory::Served;
        let loaded: Vec<TracePage> = match (&trace, plan.before_start) {
            (Some(t), BeforeStart::WorkingSet(n)) => t.pages[..n].to_vec(),
            _ => Vec::new(),
        };
        let shared = plan.memory.shared();
        let ram = if shared {
            self.vm.run.ram()
        } else {
            image.clone()
        };
        // The image as it is now: the guest's memory comes from it until it settles.
        let stamp = match shared {
            true => None,
            false => {
                Some(ImageStamp::take(&image).map_err(|e| InputError::Open(image.clone(), e))?)
            }
        };

        // The page server reads the image itself, after the QEMU it feeds is up.
        let LoadedBefore {
            loader,
            read,
            checked,
        } = {
            let job = before::Job {
                vm: self.vm.clone(),
                run_ram: self.vm.run.ram(),
                checking: if served {
                    Checking::None
                } else {
                    plan.checking
                },
                before_start: if served {
                    BeforeStart::Nothing
                } else {
                    plan.before_start
                },
                trace,
                image: image.clone(),
                size,
                chunk: block.chunk_bytes,
                checksums: block.checksums.clone(),
            };
            tokio::task::spawn_blocking(move || job.run())
                .await
                .map_err(|e| OpError::Broken(Box::new(e)))??
        };
        if !served {
            machine.on(
                &mut report,
                Event::LoadedBeforeStart {
                    loaded: read,
                    chunks_checked: checked.before,
                    full_check_s: checked.full_s,
                },
            );
        }

        // Each disk as it was at the snapshot point, under a copy-on-write layer of
        // this VM's own: two restores of one snapshot never share a writable disk.
        // A fresh VM's resolve makes its image disk's overlay, which this replaces; a
        // recovery VM's resolve takes the overlay that is there, so it comes first.
        let layers = disks::check_disk_layers(&snap, &self.paths)?;
        let snapshot_disks = || -> Result<Vec<_>, OpError> {
            let mut disks = Vec::new();
            for (i, (path, fmt)) in layers.iter().enumerate() {
                let overlay = self.vm.dir.disk_overlay(i);
                disks.push(
                    rebound_vmm::disks::create_overlay_as(path, *fmt, &overlay)
                        .map_err(|e| OpError::Boot(rebound_vmm::resolve::BootError::Disk(e)))?,
                );
            }
            Ok(disks)
        };
        let early = if recovering {
            Some(snapshot_disks()?)
        } else {
            None
        };
        let mut res = self
            .resolve_spec(&spec, boot, ready, recovery.as_ref())
            .await?;
        res.command.memory.backend = if shared {
            MemoryBackend::SharedFile(ram.clone())
        } else {
            MemoryBackend::PrivateImage(ram.clone())
        };
        res.command.incoming = Some(Incoming::Defer);
        res.command.paused = true;
        res.command.disks = match early {
            Some(d) => d,
            None if on_backend => self.backend_disks(&snap, &layers, &mut res)?,
            None => snapshot_disks()?,
        };

        let (qemu, command) = (res.qemu.clone(), res.command.clone());
        // A recovery VM's state moves by the crash's transitions (recovering, then
        // running when ready); RestoreBegins and Restored change nothing there.
        let how = Spawn {
            recovering,
            query_state: false,
        };
        Runtime::spawn(self, &spec, res, how).await?;
        self.apply(Trigger::RestoreBegins);
        self.vm.update(|r| {
            r.ram_file = ram.clone();
            r.ram_private = !shared;
        });
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        let here = machine_type(&*q).await;
        if !m.machine.is_empty() && here != m.machine {
            return Err(InputError::Machine {
                snapshot: m.machine.clone(),
                here,
            }
            .into());
        }
        // The stream QEMU loads: QEMU's own (stock), or the checked copy of the
        // device state, made once (before the plan when the page server may run).
        let stream = match (device_state, plan.stock_stream) {
            (_, true) => snap.path_of("stock.mig"),
            (Some(s), false) => s,
            (None, false) => self.checked_device_state(&snap).await?,
        };
        let mut server = None;
        if served {
            // Rebound is the source of a postcopy migration: QEMU listens, the page
            // server connects and writes the stream.
            set_ignore_shared(&*q, false).await?;
            set_postcopy(&*q).await?;
            let job = served::job(
                self.vm.run.path(),
                stream,
                image.clone(),
                size,
                &block.id,
                (plan.checking == Checking::AsServed).then(|| match &block.page_sums {
                    Some(p) => rebound_pageserver::Check::Pages {
                        file: snap.path_of(&p.file),
                        entry: p.clone(),
                    },
                    None => rebound_pageserver::Check::Chunks {
                        chunk: block.chunk_bytes,
                        sums: block.checksums.clone(),
                    },
                }),
                m.trace.as_ref().map(|t| snap.path_of(&t.file)),
                plan.before_start,
                req.rest_order == rebound_api::RestOrder::Fafl,
                req.watch_s,
            );
            let _ = std::fs::remove_file(&job.socket);
            self.command(
                "migrate-incoming",
                Some(serde_json::json!({"uri": format!("unix:{}", job.socket.display())})),
            )
            .await?;
            let mut s = served::Server::start(&job)?;
            crate::daemon::fault::point("restore:loading");
            let ahead = s.wait_loaded(&*q).await?;
            machine.on(
                &mut report,
                Event::LoadedBeforeStart {
                    loaded: Some((ahead.ahead_pages, ahead.ahead_bytes, ahead.ahead_s)),
                    chunks_checked: ahead.chunks_checked,
                    full_check_s: None,
                },
            );
            server = Some(s.watch(
                self.vm.clone(),
                machine.clone(),
                snap.clone(),
                plan.before_start,
            ));
        } else {
            set_ignore_shared(&*q, plan.ignore_shared).await?;
            self.command(
                "migrate-incoming",
                Some(serde_json::json!({"uri": format!("exec:cat {}", shell_quote(&stream))})),
            )
            .await?;
            crate::daemon::fault::point("restore:loading");
            wait_migration(&*q, "loading the device state").await?;
        }
        if let Some(what) = stamp.as_ref().and_then(ImageStamp::change) {
            return Err(InputError::Changed(what).into());
        }
        // The guest's device state is loaded and it has not run: frames handed to its
        // NICs now are the first it receives when it does.
        let mut replayed = Vec::new();
        for r in &replay {
            let done = super::replay::deliver(&q, self.vm.run.path(), r).await?;
            self.event(rebound_api::EventData::FramesReplayed {
                nic: done.nic,
                frames: done.frames,
                bytes: done.bytes,
            });
            replayed.push(done);
        }
        self.apply(Trigger::Restored);
        self.restore = Some(Restoring {
            machine: machine.clone(),
            watch_s: req.watch_s,
            snap: snap.clone(),
            ram: ram.clone(),
            size,
            loader: plan.loader.is_some().then_some(loader),
            loaded,
            stop: Arc::new(AtomicBool::new(false)),
            hold_rest: Arc::new(AtomicBool::new(hold_rest)),
            qemu,
            command,
            armed: None,
            background: None,
            server,
        });
        let accel = self.vm.record().accel.as_str().to_string();
        let mut lazy = checked.lazy;
        let mut stamp = stamp;
        for a in machine.on(&mut report, Event::DeviceStateLoaded { accel, replayed }) {
            match a {
                Action::ArmTrace { held } => self.arm_restore_trace(held).await,
                // Held: the disk would sit idle until the start (on a cluster's line,
                // until the slowest VM of a ring is loaded), so the background loader
                // begins now and the guest starts with more of its trace in memory. It
                // reads in small pieces: another VM's guest may be running on the same disk.
                Action::StartLoader(order) => {
                    if let Some(r) = self.restore.as_mut() {
                        if let Some(l) = r.loader.take() {
                            r.background = Some(r.spawn_background(l, order, self.vm.clone()));
                        }
                    }
                }
                Action::CheckBesideGuest => {
                    if let Some(c) = lazy.take() {
                        super::ram_check::spawn_lazy_checker(
                            self.vm.clone(),
                            machine.clone(),
                            c,
                            image.clone(),
                        );
                    }
                }
                Action::Publish => self.vm.set_restore_report(Some(report.clone())),
                // From here on a change of the image fails the report and stops the guest.
                Action::GuardImage => {
                    if let Some(stamp) = stamp.take() {
                        super::restore_guard::spawn(self.vm.clone(), stamp);
                    }
                }
                Action::Cont => return self.begin_restored_run().await,
                other => unreachable!("a loaded restore asks for {other:?}"),
            }
        }
        Ok(report)
    }

    /// Arms the trace of the restore under way before its guest's first instruction
    /// (`held`: its window begins at the start).
    async fn arm_restore_trace(&mut self, held: bool) {
        let Some(pid) = self.vm.record().qemu_pid else {
            return;
        };
        let Some((ram, size, watch_s)) = self
            .restore
            .as_ref()
            .map(|r| (r.ram.clone(), r.size, r.watch_s))
        else {
            return;
        };
        let armed = ArmedTrace::arm(pid, ram, size, watch_s, held).await;
        if let Some(r) = self.restore.as_mut() {
            r.armed = Some(armed);
        }
    }
}
