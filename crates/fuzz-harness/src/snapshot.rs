//! Snapshot directories from elsewhere: the manifest (inside a real snapshot whose
//! files are in place, so the checks against them run), the working-set trace and a
//! RAM image's page sums.

use std::path::{Path, PathBuf};

use rebound_snapshot::{
    copy_file, copy_ram_image, hash_file, FileEntry, Manifest, Snapshot, SnapshotDir, Trace,
    TraceInfo, TracePage, FORMAT_VERSION, MANIFEST_FORMAT,
};

use crate::{err, replace_file, scratch, scratch_file, Verdict};

/// Pages of each RAM block of the guest a fuzzed trace is read for (as a restore
/// passes the manifest's blocks): one as the fixture's, one small.
pub const TRACE_BLOCK_PAGES: &[u64] = &[16, 4];

/// Bytes of the fixture's one RAM block (16 pages) and of its checksum chunks.
const RAM_BYTES: u64 = 64 << 10;
const CHUNK_BYTES: u64 = 16 << 10;

/// A complete snapshot written by the snapshot code into `dir/snap` (a RAM block of
/// 64 KiB with data in two pages, a device state, a raw disk and a trace); returns its
/// path. Its `manifest.json` is the manifest target's valid seed.
pub fn snapshot_fixture(dir: &Path) -> Result<PathBuf, String> {
    let target = dir.join("snap");
    let sd = SnapshotDir::create(&target).map_err(err)?;
    let ram = dir.join("guest-ram");
    let mut bytes = vec![0u8; RAM_BYTES as usize];
    bytes[4096..8192].fill(0x11);
    bytes[40960..45056].fill(0x22);
    std::fs::write(&ram, &bytes).map_err(|e| e.to_string())?;
    let mut block = copy_ram_image(
        &ram,
        &sd.path().join("ram-pc.ram.img"),
        RAM_BYTES,
        CHUNK_BYTES,
        &mut |_, _| {},
    )
    .map_err(err)?;
    block.id = "pc.ram".into();
    block.file = "ram-pc.ram.img".into();
    std::fs::write(
        sd.path().join("device.state"),
        b"QEVM\0\0\0\x03device state",
    )
    .map_err(|e| e.to_string())?;
    let dev = hash_file(&sd.path().join("device.state")).map_err(err)?;
    std::fs::write(dir.join("disk"), vec![7u8; 8192]).map_err(|e| e.to_string())?;
    let disk = copy_file(&dir.join("disk"), &sd.path().join("disk-disk0.raw")).map_err(err)?;
    let trace = Trace {
        pages: vec![
            TracePage { block: 0, page: 10 },
            TracePage { block: 0, page: 1 },
        ],
    };
    trace.write(&sd.path().join("trace.fafl")).map_err(err)?;
    let m = Manifest {
        format: MANIFEST_FORMAT.into(),
        version: FORMAT_VERSION,
        created: "2026-11-27T00:00:00Z".into(),
        vm: "web1".into(),
        spec: serde_json::json!({"name": "web1", "memory_mib": 256, "cpus": 1}),
        qemu_version: "7.2.22".into(),
        machine: "pc-i440fx-7.2".into(),
        accel: "tcg".into(),
        ram_blocks: vec![block],
        device_state: FileEntry {
            file: "device.state".into(),
            size: dev.size,
            checksum: dev.checksum,
        },
        disks: vec![rebound_snapshot::DiskEntry {
            id: "disk0".into(),
            file: "disk-disk0.raw".into(),
            format: "raw".into(),
            backing: None,
            size: disk.size,
            checksum: disk.checksum,
        }],
        trace: Some(TraceInfo {
            file: "trace.fafl".into(),
            pages: 2,
            source: "post-snapshot".into(),
            wss_sample_pages: Some(4),
            wss_snapshot_pages: 2,
        }),
        pause_ms: 9.5,
        notes: vec![],
        pmem: vec![],
    };
    sd.commit(&m).map_err(err)
}

thread_local! {
    static FIXTURE: PathBuf = snapshot_fixture(&scratch()).expect("the snapshot fixture");
}

/// A snapshot's `manifest.json`: written into the fixture snapshot, which is then
/// opened as a restore opens it, its trace read, its files verified against the
/// manifest, and its VM spec read as the daemon reads it.
pub fn snapshot_manifest(data: &[u8]) -> Verdict {
    let dir = FIXTURE.with(PathBuf::clone);
    replace_file(&dir.join("manifest.json"), data);
    let snap = Snapshot::open(&dir).map_err(err)?;
    let spec = serde_json::from_value::<rebound_api::VmSpec>(snap.manifest().spec.clone());
    if let Ok(spec) = spec {
        let _ = (
            spec.validate(),
            spec.disk_opts(),
            spec.nic_opts(),
            spec.service_port(),
        );
    }
    snap.trace().map_err(err)?;
    if let Some(t) = &snap.manifest().trace {
        let _ = t.default_elastic_pages();
    }
    snap.verify(&mut |_, _| {}).map_err(err)?;
    Ok(())
}

/// A `trace.fafl`, read for a guest of [`TRACE_BLOCK_PAGES`] as a snapshot's trace and
/// as a restore's recorded one; then again with its checksum made right, so the
/// entries' checks are reached.
pub fn snapshot_trace(data: &[u8]) -> Verdict {
    let path = scratch_file("trace.fafl", data);
    let total: u64 = TRACE_BLOCK_PAGES.iter().sum();
    let verdict = Trace::read_blocks(&path, TRACE_BLOCK_PAGES)
        .map(|_| ())
        .map_err(err);
    let _ = Trace::read(&path, total);
    if data.len() >= 8 {
        let body = data.len() - 8;
        let mut fixed = data.to_vec();
        let sum = xxhash_rust::xxh3::xxh3_64(&data[..body]);
        fixed[body..].copy_from_slice(&sum.to_le_bytes());
        let path = scratch_file("trace-fixed.fafl", &fixed);
        let _ = Trace::read_blocks(&path, TRACE_BLOCK_PAGES);
        let _ = Trace::read(&path, total);
    }
    verdict
}

/// Bytes of a page-sum file's header (magic, version, page size, page count).
const PAGE_SUMS_HEADER: usize = 24;
/// Pages of the image a fuzzed page-sum file is read for when it is too short to hold
/// its page count.
const PAGE_SUMS_PAGES: u64 = 4;

/// A RAM image's page sums (`ram-<id>.pagesums`), read as the page server reads them:
/// the manifest entry is made right for the input (its size and checksum), so the
/// checks behind it are reached, and the image has the page count the header names
/// (four when the input is too short to name one). Then read again for the pages its
/// length holds, so a count that differs from the image's is reached.
pub fn page_sums(data: &[u8]) -> Verdict {
    use rebound_snapshot::pagesums::read;
    let path = scratch_file("ram.pagesums", data);
    let hash = hash_file(&path).expect("the scratch file's checksum");
    let entry = FileEntry {
        file: "ram.pagesums".into(),
        size: hash.size,
        checksum: hash.checksum,
    };
    let pages = data.get(16..PAGE_SUMS_HEADER).map_or(PAGE_SUMS_PAGES, |n| {
        u64::from_le_bytes(n.try_into().expect("8 bytes"))
    });
    let verdict = read(&path, &entry, pages).map(|_| ()).map_err(err);
    let held = (data.len().saturating_sub(PAGE_SUMS_HEADER) / 8) as u64;
    if held != pages {
        let _ = read(&path, &entry, held);
    }
    verdict
}
