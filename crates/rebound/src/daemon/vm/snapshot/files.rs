//! The files of a snapshot: device state, RAM image and disk copies written while
//! the guest is paused, the catalog entry, the pmem sizes, the bridge NICs' packet
//! dumps and QEMU's own (stock) saves for the baseline.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rebound_api::StockSave;
use rebound_snapshot::{DiskEntry, FileEntry, RamBlock, SnapshotDir};
use rebound_vmm::migration::save_device_state;
use rebound_vmm::qmp::Qmp;

use super::SaveError;
use crate::daemon::error::OpError;
use crate::daemon::vm::owner::Owner;

/// Chunk of the RAM image's checksums.
const CHUNK_BYTES: u64 = 64 << 20;

/// A failure while writing the snapshot, with its causes (e.g. the disk is full).
fn failed(e: impl Into<SaveError>) -> OpError {
    OpError::Save(e.into())
}

impl Owner {
    /// With the guest paused: device state, RAM image, disk copies.
    pub(super) async fn save_paused(
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
            let (mut block, sums) = rebound_snapshot::copy_ram_image_with_pages(
                &ram,
                &image,
                size,
                CHUNK_BYTES,
                &mut show,
            )
            .map_err(failed)?;
            vm.set_progress(None);
            block.id = "ram".into();
            block.file = "ram-ram.img".into();
            // Each page's checksum, for a page server to check each page it sends.
            let sums = rebound_snapshot::pagesums::write(&path.join("ram-ram.pagesums"), &sums)
                .map_err(failed)?;
            block.page_sums = Some(sums);
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
        .map_err(OpError::Task)?
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
}

/// The sizes of the VM's pmem files, which a restore's files must have.
pub(super) fn pmem_entries(files: &[String]) -> Result<Vec<rebound_snapshot::PmemEntry>, OpError> {
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
pub(super) fn record_in_catalog(
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
            Err(e) => tracing::warn!(%vm, "{}", rebound_errors::chain(&e)),
        }
    }
    let catalog = rebound_snapshot::Catalog::new(paths.snapshot_catalog());
    if let Err(e) = catalog.record(dir, &bases) {
        tracing::warn!(%vm, "{}", rebound_errors::chain(&e));
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
pub(super) async fn add_netdumps(
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
            .map_err(|e| failed(SaveError::NetDump(i, e)))?;
            ids.push(id);
        }
    }
    Ok(ids)
}

/// QEMU's own save of the running guest: a full migration stream to `stock.mig`,
/// first at QEMU's default bandwidth cap, then (overwriting it) with the cap raised,
/// each in its own pause.
pub(super) async fn stock_saves(q: &Qmp, dir: &Path) -> Result<StockSave, OpError> {
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
