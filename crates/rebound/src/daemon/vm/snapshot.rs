//! `rebound vm snapshot`: the guest is paused, QEMU saves only its device state
//! (guest RAM is a shared file, so `x-ignore-shared` leaves it out), the RAM file
//! and the VM's disks are copied into the snapshot directory, and the guest runs
//! again. Then the guest's first accesses after the snapshot point are recorded
//! in order (the working-set trace) and the directory is renamed complete.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::{SnapshotRequest, SnapshotResult, StockSave, VmState};
use rebound_snapshot::{DiskEntry, FileEntry, Manifest, RamBlock, SnapshotDir, TraceInfo};
use rebound_vmm::qmp::Qmp;

use super::owner::Owner;
use crate::daemon::error::OpError;

/// Chunk of the RAM image's checksums.
const CHUNK_BYTES: u64 = 64 << 20;
/// How often the trace looks at QEMU's page table.
pub(super) const TRACE_POLL: Duration = Duration::from_millis(5);

/// A failure while writing the snapshot, with its causes (e.g. the disk is full).
fn failed(e: impl std::error::Error + 'static) -> OpError {
    OpError::SnapshotFailed(crate::daemon::error::chain(&e))
}

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
                .map_err(|e| OpError::Internal(e.to_string()))?
                .map_err(|e| OpError::BadRequest(crate::daemon::error::chain(&e)))?
        };
        let size = rec.spec.memory_mib << 20;
        let ram = self.vm.run.ram();
        // A coordinated pause (`stop_at_unix_ns`), on this host's monotonic clock.
        let stop_at = req.stop_at_unix_ns.map(|at| {
            let wait = at.saturating_sub(rebound_coord::msg::unix_now_ns()).max(0);
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
        let paused_unix_ns = rebound_coord::msg::unix_now_ns();
        if was_running {
            q.execute("stop", None).await?;
        }
        let saved = self.save_paused(&q, &dir, &ram, size, &rec).await;
        let pause_ms = paused_at.elapsed().as_secs_f64() * 1e3;
        // The bridge NICs' frames from the snapshot point on: filters added while
        // the guest is paused see nothing of before it.
        let dumps = if req.netdump && saved.is_ok() {
            add_netdumps(&q, dir.path(), rec.spec.nics.len()).await?
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
            q.execute("cont", None).await?;
            if req.hold {
                self.apply(super::machine::Trigger::Resumed);
            }
        }
        let (ram_block, device_state, disks) = saved?;
        let seconds = t0.elapsed().as_secs_f64();
        let mut notes: Vec<String> = hold_note.into_iter().collect();
        // The guest's first accesses after the snapshot point, in order.
        let trace = if let Some(h) = tracing {
            match h.await.map_err(|e| e.to_string()).and_then(|r| r) {
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
            (true, true) => Some(stock_saves(&q, dir.path()).await?),
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
                    .map_err(|e| OpError::Internal(e.to_string()))?
                    .map_err(failed)?;
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
            spec: serde_json::to_value(&rec.spec).map_err(|e| OpError::Internal(e.to_string()))?,
            qemu_version: self.qemu_version(&q).await,
            machine: self.machine_type(&q).await,
            accel: rec.accel.as_str().to_string(),
            ram_blocks: vec![ram_block],
            device_state,
            disks,
            trace: trace_info,
            pause_ms,
            notes: notes.clone(),
            pmem: pmem_entries(&rec.spec.pmem)?,
        };
        let layers: Vec<(String, String)> = manifest
            .disks
            .iter()
            .map(|d| (d.file.clone(), d.format.clone()))
            .collect();
        tokio::task::spawn_blocking(move || dir.commit(&manifest))
            .await
            .map_err(|e| OpError::Internal(e.to_string()))?
            .map_err(failed)?;
        let (paths, dir, vm) = (self.paths.clone(), out.clone(), self.vm.name.clone());
        tokio::task::spawn_blocking(move || record_in_catalog(&paths, &dir, &layers, &vm))
            .await
            .map_err(|e| OpError::Internal(e.to_string()))?;
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

    /// With the guest paused: device state, RAM image, disk copies.
    async fn save_paused(
        &self,
        q: &Qmp,
        dir: &SnapshotDir,
        ram: &Path,
        size: u64,
        rec: &rebound_vmm::record::VmRecord,
    ) -> Result<(RamBlock, FileEntry, Vec<DiskEntry>), OpError> {
        let state = dir.path().join("device.state");
        save_device_state(q, &state, true).await?;
        let (ram, image) = (ram.to_path_buf(), dir.path().join("ram-ram.img"));
        let vm = self.vm.clone();
        let disks = self.disk_files(rec);
        let path = dir.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let mut show = |done: u64, total: u64| vm.set_progress(Some((done, total)));
            let mut block =
                rebound_snapshot::copy_ram_image(&ram, &image, size, CHUNK_BYTES, &mut show)
                    .map_err(failed)?;
            vm.set_progress(None);
            block.id = "ram".into();
            block.file = "ram-ram.img".into();
            let device = file_entry(&path, "device.state")?;
            let mut entries = Vec::new();
            for (i, (src, backing)) in disks.iter().enumerate() {
                let file = format!("disk-disk{i}.qcow2");
                let e = rebound_snapshot::copy_file(src, &path.join(&file)).map_err(failed)?;
                entries.push(DiskEntry {
                    id: format!("disk{i}"),
                    file,
                    // A user's raw disk is copied as it is (the name keeps `.qcow2`).
                    format: rebound_vmm::disks::detect_format(src)
                        .map_or("qcow2", |f| f.as_str())
                        .into(),
                    backing: backing.clone(),
                    size: e.size,
                    checksum: e.checksum,
                });
            }
            Ok((block, device, entries))
        })
        .await
        .map_err(|e| OpError::Internal(e.to_string()))?
    }

    /// The VM's disks as files to copy, with the base each qcow2 overlay reads
    /// through (kept by reference: images are read-only).
    fn disk_files(&self, rec: &rebound_vmm::record::VmRecord) -> Vec<(PathBuf, Option<String>)> {
        if !rec.disk_files.is_empty() {
            // What QEMU really has open: for a restored VM, its overlays of the
            // snapshot's disks, not the files its spec names.
            return rec
                .disk_files
                .iter()
                .map(|p| (p.clone(), backing_of(p)))
                .collect();
        }
        let mut out = Vec::new();
        let overlay = self.vm.dir.disk_overlay(0);
        if rec.spec.kernel.is_none() && overlay.exists() {
            out.push((overlay.clone(), backing_of(&overlay)));
        }
        for d in rec.spec.disk_opts().unwrap_or_default() {
            out.push((PathBuf::from(d.path), None));
        }
        out
    }

    /// Whether the guest's RAM is the shared file in the run dir (not a restored
    /// guest's private image mapping).
    pub(super) fn on_shared_ram(&self) -> bool {
        !self.vm.record().ram_private
    }

    pub(super) async fn qemu_version(&self, q: &Qmp) -> String {
        match q.execute("query-version", None).await {
            Ok(v) => {
                let q = &v["qemu"];
                format!("{}.{}.{}", q["major"], q["minor"], q["micro"])
            }
            Err(_) => String::new(),
        }
    }

    /// The concrete machine type (`pc` resolves to e.g. `pc-i440fx-7.2`).
    pub(super) async fn machine_type(&self, q: &Qmp) -> String {
        let Ok(v) = q.execute("query-machines", None).await else {
            return String::new();
        };
        let list = v.as_array().cloned().unwrap_or_default();
        let pc = list.iter().find(|m| m["alias"] == "pc");
        pc.and_then(|m| m["name"].as_str())
            .unwrap_or("pc")
            .to_string()
    }
}

/// The sizes of the VM's pmem files, which a restore's files must have.
fn pmem_entries(files: &[String]) -> Result<Vec<rebound_snapshot::PmemEntry>, OpError> {
    files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let md = std::fs::metadata(f)
                .map_err(|e| OpError::Io(format!("cannot read pmem file {f}"), e))?;
            Ok(rebound_snapshot::PmemEntry {
                id: format!("pmem{i}"),
                size: md.len(),
            })
        })
        .collect()
}

/// Lists a snapshot the daemon wrote in its catalog (a cluster peer may have it
/// restored), with the files outside it that its disk layers read through: a
/// restore of it allows those and no others. The record lives in the daemon's home,
/// not in the snapshot, whose files anyone who can copy one into the store controls.
fn record_in_catalog(
    paths: &rebound_vmm::paths::Paths,
    dir: &Path,
    layers: &[(String, String)],
    vm: &str,
) {
    use rebound_vmm::qemu::DiskFormat;
    let images = paths.home.join("images");
    let mut bases: Vec<rebound_snapshot::Base> = Vec::new();
    for (file, format) in layers {
        let Some(fmt) = DiskFormat::parse(format) else {
            continue;
        };
        match rebound_vmm::disks::external_bases(&dir.join(file), fmt, dir, &images) {
            Ok(found) => {
                for (b, f) in found {
                    let Some(b) = b.to_str() else { continue };
                    let base = rebound_snapshot::Base {
                        file: b.to_string(),
                        format: f.as_str().to_string(),
                    };
                    if !bases.contains(&base) {
                        bases.push(base);
                    }
                }
            }
            // Its restore refuses that layer for the same reason.
            Err(e) => tracing::warn!(%vm, "{}", crate::daemon::error::chain(&e)),
        }
    }
    let catalog = rebound_snapshot::Catalog::new(paths.snapshot_catalog());
    if let Err(e) = catalog.record(dir, &bases) {
        tracing::warn!(%vm, "{}", crate::daemon::error::chain(&e));
    }
}

/// The base a qcow2 overlay reads through, as `qemu-img info` reports it.
fn backing_of(overlay: &Path) -> Option<String> {
    let out = std::process::Command::new(
        std::env::var("REBOUND_QEMU_IMG").unwrap_or_else(|_| "qemu-img".into()),
    )
    .args(["info", "--output=json", "-U"])
    .arg(overlay)
    .output()
    .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v["full-backing-filename"]
        .as_str()
        .or(v["backing-filename"].as_str())
        .map(str::to_string)
}

fn file_entry(dir: &Path, name: &str) -> Result<FileEntry, OpError> {
    let e = rebound_snapshot::hash_file(&dir.join(name)).map_err(failed)?;
    Ok(FileEntry {
        file: name.into(),
        size: e.size,
        checksum: e.checksum,
    })
}

/// Starts QEMU's `filter-dump` on each bridge NIC (`net1`..: `net0` is the user
/// network), the frames the guest received and sent in files of their own,
/// `net<i>-rx.pcap` and `net<i>-tx.pcap` in `dir`; returns the filters' ids.
///
/// QEMU names a filter's queue from the netdev's side, not the guest's: `rx` holds
/// what the netdev (the tap) receives, which is what the guest sent, and `tx` what
/// the netdev sends, which is what the guest receives (`qapi/net.json`'s
/// `NetFilterDirection`; `qemu_send_packet_async_with_flags` runs the sender's `tx`
/// filters, then the peer's `rx` ones). Checked on QEMU 7.2: the guest's own frames,
/// with its MAC as their source, are in the `rx` queue's dump.
async fn add_netdumps(
    q: &rebound_vmm::qmp::Qmp,
    dir: &std::path::Path,
    nics: usize,
) -> Result<Vec<String>, OpError> {
    let mut ids = Vec::new();
    for i in 1..=nics {
        // (the guest's direction, the netdev's queue)
        for (guest, queue) in [("rx", "tx"), ("tx", "rx")] {
            let id = format!("rbdump-net{i}-{guest}");
            let file = dir.join(format!("net{i}-{guest}.pcap"));
            q.execute(
                "object-add",
                Some(serde_json::json!({
                    "qom-type": "filter-dump",
                    "id": id,
                    "netdev": format!("net{i}"),
                    "queue": queue,
                    "file": file.display().to_string(),
                })),
            )
            .await
            .map_err(|e| OpError::SnapshotFailed(format!("cannot dump net{i}'s frames: {e}")))?;
            ids.push(id);
        }
    }
    Ok(ids)
}

/// Has the paused QEMU write its device state (and, without `ignore_shared`, all
/// of guest RAM: QEMU's stock save) to `path`, and waits for it.
pub(super) async fn save_device_state(
    q: &Qmp,
    path: &Path,
    ignore_shared: bool,
) -> Result<(), OpError> {
    q.execute(
        "migrate-set-capabilities",
        Some(serde_json::json!({"capabilities": [
            {"capability": "x-ignore-shared", "state": ignore_shared}]})),
    )
    .await?;
    let uri = format!("exec:cat > {}", shell_quote(path));
    q.execute("migrate", Some(serde_json::json!({ "uri": uri })))
        .await?;
    wait_migration(q, "the device state save").await
}

/// Polls `query-migrate` until the migration completed.
pub(super) async fn wait_migration(q: &Qmp, what: &str) -> Result<(), OpError> {
    loop {
        let v = q.execute("query-migrate", None).await?;
        match v["status"].as_str() {
            Some("completed") => return Ok(()),
            Some("failed") | Some("cancelled") => {
                let why = v["error-desc"].as_str().unwrap_or("no reason given");
                return Err(OpError::SnapshotFailed(format!("{what} failed: {why}")));
            }
            _ => tokio::time::sleep(Duration::from_millis(2)).await,
        }
    }
}

/// QEMU's own save of the running guest: a full migration stream to `stock.mig`,
/// first at QEMU's default bandwidth cap, then (overwriting it) with the cap raised,
/// each in its own pause.
async fn stock_saves(q: &Qmp, dir: &Path) -> Result<StockSave, OpError> {
    let path = dir.join("stock.mig");
    let default = q
        .execute("query-migrate-parameters", None)
        .await?
        .get("max-bandwidth")
        .cloned()
        .unwrap_or(serde_json::json!(134217728));
    // One paused save: the guest stops, QEMU writes the stream, the guest goes on.
    let paused_save = || async {
        q.execute("stop", None).await?;
        let t = Instant::now();
        let r = save_device_state(q, &path, false).await;
        let secs = t.elapsed().as_secs_f64();
        q.execute("cont", None).await?;
        r.map(|()| secs)
    };
    let default_cap_s = paused_save().await?;
    q.execute(
        "migrate-set-parameters",
        Some(serde_json::json!({"max-bandwidth": i64::MAX / 2})),
    )
    .await?;
    let r = paused_save().await;
    q.execute(
        "migrate-set-parameters",
        Some(serde_json::json!({ "max-bandwidth": default })),
    )
    .await?;
    let raised_cap_s = r?;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    Ok(StockSave {
        default_cap_s,
        raised_cap_s,
        bytes,
    })
}

/// A path for `sh -c` (QEMU's `exec:` runs one).
pub(super) fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// How a trace task says it is armed and, for a restore held ready, waits for the
/// start before its window begins.
struct Arming {
    armed: tokio::sync::oneshot::Sender<()>,
    go: Option<std::sync::mpsc::Receiver<()>>,
}

/// A trace task, returned once the tracer is armed (pages unmapped when asked, the
/// page table's present pages taken as the baseline): start the guest after this,
/// or its first touches are part of the baseline and never recorded. With `go`, the
/// window of `max` begins when `go` receives (a held restore arms at its hold, so
/// its start is a bare `cont`); a dropped sender ends the task with an error.
pub(super) async fn arm_trace(
    pid: u32,
    file: PathBuf,
    size: u64,
    max: Duration,
    stop: Arc<AtomicBool>,
    unmap: bool,
    go: Option<std::sync::mpsc::Receiver<()>>,
) -> tokio::task::JoinHandle<Result<rebound_snapshot::Trace, String>> {
    let (armed, rx) = tokio::sync::oneshot::channel();
    let arming = Some(Arming { armed, go });
    let h = tokio::spawn(trace_blocking(pid, file, size, max, stop, unmap, arming));
    // An error before arming drops the sender: the handle then holds the error.
    let _ = rx.await;
    h
}

/// Records, for `max` or until `stop`, the order in which QEMU's process first touches
/// the pages of its mapping of `file` (`unmap`: first make the running guest's next
/// touches visible by unmapping its pages, which stay in the file).
async fn trace_blocking(
    pid: u32,
    file: PathBuf,
    size: u64,
    max: Duration,
    stop: Arc<AtomicBool>,
    unmap: bool,
    arming: Option<Arming>,
) -> Result<rebound_snapshot::Trace, String> {
    tokio::task::spawn_blocking(move || {
        let target = rebound_guestmem::MapTarget::inode_of(&file).map_err(|e| e.to_string())?;
        let maps = rebound_guestmem::maps::read_maps(pid).map_err(|e| e.to_string())?;
        let m = rebound_guestmem::maps::find_ram_mapping(&maps, pid, &target, size)
            .map_err(|e| e.to_string())?;
        if unmap {
            rebound_snapshot::unmap_for_trace(pid, &[(m.start, size)])
                .map_err(|e| e.to_string())?;
        }
        let mut tracer = rebound_snapshot::PagemapTracer::new(pid, vec![(0, m.start, size)])
            .map_err(|e| e.to_string())?;
        if let Some(a) = arming {
            let _ = a.armed.send(());
            if let Some(go) = a.go {
                go.recv()
                    .map_err(|_| "the held restore ended before its start".to_string())?;
            }
        }
        let end = Instant::now() + max;
        while Instant::now() < end && !stop.load(Ordering::Relaxed) {
            tracer.poll().map_err(|e| e.to_string())?;
            std::thread::sleep(TRACE_POLL);
        }
        tracer.poll().map_err(|e| e.to_string())?;
        Ok(tracer.into_trace())
    })
    .await
    .map_err(|e| e.to_string())?
}
