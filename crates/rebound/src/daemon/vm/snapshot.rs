//! `rebound vm snapshot`: the guest is paused, QEMU saves only its device state
//! (guest RAM is a shared file, so `x-ignore-shared` leaves it out), the RAM file
//! and the VM's disks are copied into the snapshot directory, and the guest runs
//! again. Then the guest's first accesses after the snapshot point are recorded
//! in order (the working-set trace) and the directory is renamed complete.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::{SnapshotRequest, SnapshotResult, VmState};
use rebound_snapshot::{Manifest, SnapshotDir, TraceInfo};
use rebound_vmm::migration::{machine_type, qemu_version};
use rebound_vmm::port::Runtime;

use super::owner::Owner;
use super::trace_task::{arm_trace, trace_blocking};
use crate::daemon::error::OpError;

pub(crate) mod error;
pub use error::SaveError;

mod files;

impl Owner {
    pub(super) async fn snapshot_now(
        &mut self,
        req: SnapshotRequest,
    ) -> Result<SnapshotResult, OpError> {
        let t0 = Instant::now();
        let rec = self.vm.record();
        let out = PathBuf::from(&req.out);
        if !out.is_absolute() || out.file_name().is_none() {
            return Err(OpError::BadRequest(format!(
                "snapshot path {:?} must be an absolute directory path",
                req.out
            )));
        }
        if !(0.0..=600.0).contains(&req.trace_s) {
            return Err(OpError::BadRequest(format!(
                "trace_s {} must be between 0 and 600 seconds",
                req.trace_s
            )));
        }
        let q = match (&self.qmp, rec.state) {
            (Some(q), VmState::Running | VmState::Paused) => q.clone(),
            _ => {
                return Err(OpError::WrongState(
                    self.vm.name.clone(),
                    rec.state,
                    "only a running or paused VM can be snapshotted",
                ))
            }
        };
        if self.vm.run.vmem().exists() {
            return Err(OpError::BadRequest(
                "this VM runs with hot-plugged memory (a recovery VM): snapshots of it are not supported yet; restart it first".into(),
            ));
        }
        if !self.on_shared_ram() {
            return Err(OpError::BadRequest(
                "this VM's RAM is still the snapshot image it was restored from: wait until it settles onto shared RAM (rebound vm settle)".into(),
            ));
        }
        let pid = rec.qemu_pid.ok_or(OpError::NoQmp)?;
        let dir = {
            let out = out.clone();
            tokio::task::spawn_blocking(move || SnapshotDir::create(&out))
                .await
                .map_err(|e| OpError::Broken(Box::new(e)))?
                .map_err(|e| OpError::BadInput(Box::new(e)))?
        };
        let size = rec.spec.memory_mib << 20;
        let ram = self.vm.run.ram();
        // A coordinated pause (`stop_at_unix_ns`), on this host's monotonic clock.
        let stop_at = req.stop_at_unix_ns.map(|at| {
            let wait = at.saturating_sub(rebound_coord::run::unix_now_ns()).max(0);
            tokio::time::Instant::now() + Duration::from_nanos(wait as u64)
        });
        // It does not wait for a slow sample: the sample ends at the stop instant with
        // what it saw (arming it on a busy host can take a second).
        let sample_stop = Arc::new(AtomicBool::new(false));
        if let Some(at) = stop_at {
            let stop = sample_stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                stop.store(true, Ordering::Relaxed);
            });
        }
        // The working-set size as the guest runs normally: pages touched in one trace
        // window before the snapshot (the paper's sampled WSS).
        let sample = if req.trace_s > 0.0 {
            let window = Duration::from_secs_f64(req.trace_s);
            match trace_blocking(pid, ram.clone(), size, window, sample_stop, true, None).await {
                Ok(t) => Some(t.pages.len() as u64),
                Err(e) => {
                    tracing::warn!(vm = %self.vm.name, "no working-set sample: {e}");
                    None
                }
            }
        } else {
            None
        };
        if let Some(at) = stop_at {
            tokio::time::sleep_until(at).await;
        }
        let was_running = self.vm.record().state == VmState::Running;
        let paused_at = Instant::now();
        let paused_unix_ns = rebound_coord::run::unix_now_ns();
        if was_running {
            self.command("stop", None).await?;
        }
        let saved = self.save_paused(&q, &dir, &ram, size, &rec).await;
        let pause_ms = paused_at.elapsed().as_secs_f64() * 1e3;
        // The bridge NICs' frames from the snapshot point on: filters added while
        // the guest is paused see nothing of before it.
        let dumps = if req.netdump && saved.is_ok() {
            files::add_netdumps(&q, dir.path(), rec.spec.nics.len()).await?
        } else {
            Vec::new()
        };
        let mut hold_note = None;
        if req.hold && saved.is_ok() {
            let released = self.vm.hold_until_released();
            // Callers watch the state: it says paused while held.
            self.apply(super::machine::Trigger::Stopped);
            self.event(rebound_api::EventData::SnapshotHeld {
                out: out.display().to_string(),
            });
            let max = Duration::from_secs(rebound_api::snapshot::HOLD_MAX_S);
            let held = Instant::now();
            hold_note = Some(match tokio::time::timeout(max, released).await {
                Ok(_) => format!(
                    "held paused {:.0} ms after saving, until resumed",
                    held.elapsed().as_secs_f64() * 1e3
                ),
                Err(_) => {
                    self.vm.release_hold();
                    format!(
                        "held paused after saving and never resumed: went on after {} s",
                        rebound_api::snapshot::HOLD_MAX_S
                    )
                }
            });
        }
        // The post-snapshot trace is armed while the guest is still paused: its
        // first touches after the snapshot point are what the trace is for.
        let tracing = if req.trace_s > 0.0 && was_running && saved.is_ok() {
            let max = Duration::from_secs_f64(req.trace_s);
            let never = Arc::new(AtomicBool::new(false));
            Some(arm_trace(pid, ram.clone(), size, max, never, true, None).await)
        } else {
            None
        };
        if was_running {
            self.command("cont", None).await?;
            if req.hold {
                self.apply(super::machine::Trigger::Resumed);
            }
        }
        let (ram_block, device_state, disks) = saved?;
        let seconds = t0.elapsed().as_secs_f64();
        let mut notes: Vec<String> = hold_note.into_iter().collect();
        // The guest's first accesses after the snapshot point, in order.
        let trace = if let Some(h) = tracing {
            match h.await.map_err(Into::into).and_then(|r| r) {
                Ok(t) => Some(t),
                Err(e) => {
                    notes.push(format!(
                        "no post-snapshot trace ({e}): the first restore records one"
                    ));
                    None
                }
            }
        } else {
            if req.trace_s > 0.0 {
                notes.push(
                    "the guest was paused: no post-snapshot trace; the first restore records one"
                        .into(),
                );
            }
            None
        };
        for id in &dumps {
            if let Err(e) = q
                .execute("object-del", Some(serde_json::json!({ "id": id })))
                .await
            {
                notes.push(format!("the packet dump {id} could not be stopped: {e}"));
            }
        }
        // QEMU's own save for the baseline, after the trace so that it does not
        // disturb it: QEMU 7.2 refuses a second migration from a VM a migration left
        // paused ("postmigrate"), so each stock save gets a pause of its own, and its
        // stream holds the guest as it was then, a few seconds after the snapshot
        // point (the disk layer is the snapshot point's).
        let stock = match (req.stock, was_running) {
            (true, true) => Some(files::stock_saves(&q, dir.path()).await?),
            (true, false) => {
                notes.push("the guest was paused: no stock save (QEMU cannot migrate a paused guest twice); resume it and snapshot again".into());
                None
            }
            (false, _) => None,
        };
        let trace_pages = trace.as_ref().map_or(0, |t| t.pages.len() as u64);
        let trace_info = match trace {
            Some(t) => {
                let path = dir.path().join("trace.fafl");
                let t2 = t.clone();
                tokio::task::spawn_blocking(move || t2.write(&path))
                    .await
                    .map_err(|e| OpError::Broken(Box::new(e)))?
                    .map_err(SaveError::from)?;
                Some(TraceInfo {
                    file: "trace.fafl".into(),
                    pages: t.pages.len() as u64,
                    source: "post-snapshot".into(),
                    wss_sample_pages: sample,
                    wss_snapshot_pages: t.pages.len() as u64,
                })
            }
            None => None,
        };
        let ram_data = ram_block.data_bytes;
        let dev_bytes = device_state.size;
        let disk_bytes = disks.iter().map(|d| d.size).sum();
        let manifest = Manifest {
            format: rebound_snapshot::MANIFEST_FORMAT.into(),
            version: rebound_snapshot::FORMAT_VERSION,
            created: rebound_vmm::events::wall_now(),
            vm: self.vm.name.clone(),
            spec: serde_json::to_value(&rec.spec).map_err(|e| OpError::Broken(Box::new(e)))?,
            qemu_version: qemu_version(&*q).await,
            machine: machine_type(&*q).await,
            accel: rec.accel.as_str().to_string(),
            ram_blocks: vec![ram_block],
            device_state,
            disks,
            trace: trace_info,
            pause_ms,
            notes: notes.clone(),
            pmem: files::pmem_entries(&rec.spec.pmem)?,
        };
        let layers: Vec<(String, String)> = manifest
            .disks
            .iter()
            .map(|d| (d.file.clone(), d.format.clone()))
            .collect();
        tokio::task::spawn_blocking(move || dir.commit(&manifest))
            .await
            .map_err(|e| OpError::Broken(Box::new(e)))?
            .map_err(SaveError::from)?;
        let (paths, dir, vm) = (self.paths.clone(), out.clone(), self.vm.name.clone());
        tokio::task::spawn_blocking(move || files::record_in_catalog(&paths, &dir, &layers, &vm))
            .await
            .map_err(|e| OpError::Broken(Box::new(e)))?;
        Ok(SnapshotResult {
            dir: out.display().to_string(),
            vm: self.vm.name.clone(),
            pause_ms,
            paused_unix_ns,
            seconds,
            ram_data_bytes: ram_data,
            device_state_bytes: dev_bytes,
            disk_bytes,
            trace_pages,
            stock,
            notes,
        })
    }

    /// Whether the guest's RAM is the shared file in the run dir (not a restored
    /// guest's private image mapping).
    pub(super) fn on_shared_ram(&self) -> bool {
        !self.vm.record().ram_private
    }
}
