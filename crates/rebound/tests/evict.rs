//! Eviction notices end to end: the guest's module `rebound_evict` reports every
//! page-cache page it lets go of, with a copy of each evicted one, in a ring in guest
//! memory; the disk's backend reads the ring before every request it serves and, in
//! exclusive mode, admits the copies that are still their blocks' bytes; the guest's next reads of those blocks
//! hit the host cache, and every byte the guest serves equals the file's.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{eventually, http_get, Env};
use serde_json::Value;

/// Files of the data set: more than a 256 MiB guest has free.
const FILES: u64 = 48;
const FILE_BYTES: u64 = 4 << 20;

/// Byte content of file `i`: splitmix64 words, never a zero block (`mke2fs -d` would
/// leave zero blocks sparse, and the guest would read no I/O for them).
fn file_data(i: u64) -> Vec<u8> {
    (0..FILE_BYTES / 8)
        .flat_map(|w| (rebound_image::splitmix64(i << 32 | w) | 1).to_le_bytes())
        .collect()
}

/// An ext4 image (4 KiB blocks) holding `f00.bin`.. with [`file_data`].
fn make_disk(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("set");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..FILES {
        std::fs::write(src.join(format!("f{i:02}.bin")), file_data(i)).unwrap();
    }
    let img = dir.join("set.ext4");
    let tools = rebound_image::Tools::check().unwrap();
    rebound_image::mkfs_from_dir(&tools, "evict-set", &src, &img, "320M").unwrap();
    std::fs::remove_dir_all(&src).unwrap();
    img
}

fn evict(env: &Env, name: &str) -> Value {
    env.get_ok("GET", &format!("/v1/vms/{name}/evict"), None)
}

/// Reads every file through the guest's web service and checks each byte.
fn read_all(port: u16) {
    for i in 0..FILES {
        let (code, body) = http_get(port, &format!("/f{i:02}.bin")).unwrap();
        assert_eq!(code, 200, "f{i:02}.bin");
        assert!(
            body == file_data(i),
            "f{i:02}.bin differs from the file written"
        );
    }
}

fn start(env: &Env, name: &str, disk: &Path, extra: &[&str]) {
    let entry = format!(
        "{},cache=host:256M",
        disk.to_str().unwrap().replace(',', ",,")
    );
    let mut args = vec![
        "vm",
        "start",
        name,
        "--workload",
        "web",
        "--memory",
        "384M",
        "--disk",
        &entry,
        "--workload-arg",
        "data_disk=vdb",
    ];
    args.extend_from_slice(extra);
    env.ok(&args);
}

#[test]
fn evicted_pages_enter_the_exclusive_host_cache_and_reads_hit_it_unchanged() {
    let env = Env::new();
    let disk = make_disk(env.home.path());
    start(&env, "ev1", &disk, &[]);
    // 128 MiB of the guest's 384 become the exclusive host cache of its disk on
    // Rebound's backend: the guest keeps 256 MiB, less than the files, and the two
    // together hold them all (a loop over more than both would never hit, in LRU).
    env.ok(&["vm", "memory", "ev1", "--host-cache", "128M"]);
    let s0 = env.blk_stats("ev1");
    let port = env.host_port("ev1", 8080);
    let e = evict(&env, "ev1");
    assert_eq!(e["state"], "forwarding", "{e}");
    assert!(
        e["ring"]["gpa"].as_u64().unwrap().is_multiple_of(4096),
        "{e}"
    );

    // The first pass reads 192 MiB through a guest with less free: it evicts the
    // earlier files' pages while it reads the later ones.
    let t0 = std::time::Instant::now();
    read_all(port);
    let pass1 = t0.elapsed();
    let e = eventually(Duration::from_secs(30), "admitted notices", || {
        let e = evict(&env, "ev1");
        (e["admitted"].as_u64().unwrap() > 0).then_some(e)
    });
    let s = env.blk_stats("ev1");
    eprintln!("after pass 1 ({pass1:?}): evict {e}\nbackend {s}");
    assert_eq!(e["state"], "forwarding", "{e}");
    assert!(e["evicted"].as_u64().unwrap() > 1000, "{e}");
    assert_eq!(e["backend_errors"], 0, "{e}");
    assert!(s["exclusive"] == true, "{s}");
    assert!(s["notices_admitted"].as_u64().unwrap() > 0, "{s}");
    assert!(s["cache"]["held_bytes"].as_u64().unwrap() > 0, "{s}");
    let hits0 = s["cache"]["hits"].as_u64().unwrap();

    // The second pass finds the first files evicted from the guest and in the host
    // cache: hits, with the same bytes.
    let t1 = std::time::Instant::now();
    read_all(port);
    let pass2 = t1.elapsed();
    let s2 = env.blk_stats("ev1");
    let e2 = evict(&env, "ev1");
    eprintln!("after pass 2 ({pass2:?}): evict {e2}\nbackend {s2}");
    assert!(
        s2["cache"]["hits"].as_u64().unwrap() > hits0 + 1000,
        "the second pass did not hit the host cache: {s} -> {s2}"
    );
    let serial = std::fs::read_to_string(env.home.path().join("vms/ev1/serial.log")).unwrap();
    for bad in ["I/O error", "EXT4-fs error", "Buffer I/O", "BUG", "Oops"] {
        assert!(!serial.contains(bad), "the guest saw {bad:?}:\n{serial}");
    }
    check_curve(&env, &s0, &s2);

    // The daemon dies; a new one adopts the VM and its backend, learns the ring again
    // from the agent and forwards it; the cache stays exclusive and keeps serving.
    env.kill_daemon();
    env.ok(&["vm", "list"]);
    let e = eventually(Duration::from_secs(60), "the ring forwarded again", || {
        let e = evict(&env, "ev1");
        (e["state"] == "forwarding" && e["polls"].as_u64().unwrap() > 0).then_some(e)
    });
    assert_eq!(e["ring"], e2["ring"], "{e}");
    read_all(port);
    let s3 = env.blk_stats("ev1");
    let e3 = evict(&env, "ev1");
    eprintln!("after a daemon restart and pass 3: evict {e3}\nbackend {s3}");
    assert!(s3["exclusive"] == true, "{s3}");
    assert!(
        s3["cache"]["hits"].as_u64().unwrap() > s2["cache"]["hits"].as_u64().unwrap() + 1000,
        "{s2} -> {s3}"
    );
    assert!(
        s3["notices_admitted"].as_u64().unwrap() > s2["notices_admitted"].as_u64().unwrap(),
        "{s2} -> {s3}"
    );
    assert_eq!(e3["backend_errors"], 0, "{e3}");
    assert!(
        e3["polls"].as_u64().unwrap() > e["polls"].as_u64().unwrap(),
        "{e3}"
    );
    // The memory moved before the restart comes back to the guest.
    let r: Value =
        serde_json::from_str(&env.ok(&["vm", "memory", "ev1", "--host-cache", "0", "--json"]))
            .unwrap();
    assert_eq!(
        (&r["guest_mib"], &r["exclusive"]),
        (&Value::from(384), &Value::Bool(false)),
        "{r}"
    );
    env.ok(&["vm", "stop", "ev1"]);
    assert_eq!(evict(&env, "ev1")["state"], "stopped");
}

/// `vm mrc`: the curve the backend traced since the cache became exclusive starts at
/// the guest's 256 MiB with every read that reached the disk, and at the VM's 384 MiB
/// predicts the reads the host cache did not serve (an LRU of the evicted pages, which
/// is what the exclusive cache is, but for pages it refused).
fn check_curve(env: &Env, s0: &Value, s2: &Value) {
    let reads = |s: &Value| {
        let c = &s["cache"];
        (c["hits"].as_u64().unwrap(), c["misses"].as_u64().unwrap())
    };
    let ((h0, m0), (h2, m2)) = (reads(s0), reads(s2));
    let r: Value = serde_json::from_str(&env.ok(&["vm", "mrc", "ev1", "--json"])).unwrap();
    assert_eq!(r["guest_bytes"], 256 << 20, "{r}");
    assert_eq!(r["allocation_bytes"], 384 << 20, "{r}");
    let d = &r["disks"][0];
    let traced = d["misses"].as_u64().unwrap();
    assert!(
        traced >= (h2 + m2) - (h0 + m0) && traced <= h2 + m2,
        "traced {traced} misses; the backend served {} reads since the cache became exclusive, {} in all",
        (h2 + m2) - (h0 + m0),
        h2 + m2
    );
    let points = d["points"].as_array().unwrap();
    // A size's misses are those of the last point at or below it (the curve is a
    // step function; it ends in a plateau at 4 times the allocation).
    let at = |bytes: u64| {
        points
            .iter()
            .rfind(|p| p["bytes"].as_u64().unwrap() <= bytes)
            .unwrap_or_else(|| panic!("no point at or below {bytes}: {d}"))["misses"]
            .as_f64()
            .unwrap()
    };
    assert_eq!(points.last().unwrap()["bytes"], 4 * (384 << 20), "{d}");
    assert_eq!(at(256 << 20), traced as f64, "{d}");
    let predicted = at(384 << 20);
    let actual = (m2 - m0) as f64;
    eprintln!("at 384 MiB: predicted {predicted} disk reads, actual {actual}");
    assert!(
        (predicted - actual).abs() <= 0.1 * traced as f64,
        "predicted {predicted} reads from the disk with the 128 MiB host cache, {actual} were"
    );
    assert!(
        points
            .windows(2)
            .all(|w| w[1]["misses"].as_f64() <= w[0]["misses"].as_f64()),
        "{d}"
    );
    let svg = env.home.path().join("ev1-mrc.svg");
    env.ok(&["vm", "mrc", "ev1", "--svg", svg.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn a_guest_without_the_module_gets_an_inclusive_host_cache_and_is_told_so() {
    let env = Env::new();
    let disk = make_disk(env.home.path());
    // The image's init leaves the module out with rebound.evict=0, as a kernel without
    // it would.
    start(&env, "ev0", &disk, &["--workload-arg", "evict=0"]);
    // The memory still moves, to an inclusive cache, and the answer says why.
    let r = env.get_ok(
        "POST",
        "/v1/vms/ev0/memory",
        Some(&serde_json::json!({"host_cache_bytes": 64u64 << 20})),
    );
    assert_eq!(
        (r["exclusive"].as_bool(), r["host_cache_bytes"].as_u64()),
        (Some(false), Some(64 << 20)),
        "{r}"
    );
    assert!(
        r["notes"][0]
            .as_str()
            .unwrap()
            .contains("no eviction-notice module"),
        "{r}"
    );
    let e = evict(&env, "ev0");
    assert_eq!(e["state"], "absent", "{e}");
    assert!(
        e["detail"]
            .as_str()
            .unwrap()
            .contains("no eviction-notice module"),
        "{e}"
    );
    assert!(e["ring"].is_null(), "{e}");
    let port = env.host_port("ev0", 8080);
    let (code, body) = http_get(port, "/f00.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == file_data(0));
    let s = env.blk_stats("ev0");
    assert_eq!(s["notices_admitted"], 0, "{s}");
    assert_eq!(s["exclusive"], false, "{s}");
    assert!(
        s["cache"]["admissions"].as_u64().unwrap() > 0,
        "the reads filled it: {s}"
    );
    env.ok(&["vm", "stop", "ev0"]);
}

/// `/init` of a guest that deletes one file, truncates another and drops the clean
/// cache, then powers off (the RAM file keeps the ring).
const RELEASE_INIT: &str = r#"#!/bin/sh
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in virtio_pci virtio_blk crc32c_generic ext4; do modprobe $m; done
insmod /lib/rebound/rebound_evict.ko slots=4096
mkdir -p /data; mount -t ext4 /dev/vda /data
echo "RING $(cat /sys/module/rebound_evict/parameters/ring_gpa) $(cat /sys/module/rebound_evict/parameters/ring_bytes)"
cat /data/f00.bin /data/f01.bin /data/f02.bin > /dev/null
sync
rm /data/f00.bin
truncate -s 1M /data/f01.bin
sync
echo 1 > /proc/sys/vm/drop_caches
echo "EVICT-TEST-DONE"
poweroff -f
"#;

fn sh(cmd: &str, dir: &Path) {
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image kernel with the module tells releases from evictions: a deleted file's
/// pages and a truncated file's pages past the new end come as `released`, pages
/// dropped from a file still there as `evicted`, each exactly once, read by the host's
/// ring reader from the RAM file.
#[test]
fn deleted_and_truncated_pages_come_released_and_dropped_ones_evicted() {
    let img = rebound_image::open(common::image_home(), "default").unwrap();
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    sh(
        &format!("zcat {} | cpio -id --quiet", img.initrd.display()),
        &root,
    );
    std::fs::write(root.join("init"), RELEASE_INIT).unwrap();
    sh(
        "find . | cpio -o -H newc -R 0:0 --quiet | gzip -1 > ../initrd.gz",
        &root,
    );
    let set = dir.path().join("set");
    std::fs::create_dir_all(&set).unwrap();
    for i in 0..3 {
        std::fs::write(set.join(format!("f{i:02}.bin")), file_data(i)).unwrap();
    }
    sh("mke2fs -q -t ext4 -b 4096 -d set disk.ext4 64M", dir.path());
    let ram = dir.path().join("ram");
    let serial_log = dir.path().join("serial.log");
    use rebound_vmm::qemu::{Boot, Disk, DiskFormat, MemoryBackend, QemuCommand, Serial};
    let mut cmd = QemuCommand::new(
        rebound_vmm::api::Accel::Tcg,
        256,
        MemoryBackend::SharedFile(ram.clone()),
    );
    cmd.boot = Some(Boot {
        kernel: img.kernel.clone(),
        initrd: Some(dir.path().join("initrd.gz")),
        append: img.append.clone(),
    });
    cmd.disks
        .push(Disk::file(dir.path().join("disk.ext4"), DiskFormat::Raw));
    cmd.control.serial = Serial::File(serial_log.clone());
    // The guest powers itself off when done; the timeout bounds a guest that hangs.
    let out = std::process::Command::new("timeout")
        .arg("300")
        .arg("qemu-system-x86_64")
        .args(cmd.args().unwrap())
        .arg("-no-reboot")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "qemu: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let serial = std::fs::read_to_string(&serial_log).unwrap_or_default();
    assert!(serial.contains("EVICT-TEST-DONE"), "{serial}");
    let ring: Vec<u64> = serial
        .lines()
        .find_map(|l| l.trim().strip_prefix("RING "))
        .unwrap_or_else(|| panic!("no ring announced: {serial}"))
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    use rebound_guestmem::{evict_ring::RingReader, GuestMemory, Layout};
    let mem = GuestMemory::open_ram_file(&ram, Layout::pc(256 << 20).unwrap()).unwrap();
    let b = RingReader::open(&mem, ring[0], ring[1])
        .unwrap()
        .from_start()
        .poll(&mem)
        .unwrap();
    eprintln!(
        "evicted {} released {} lost {}",
        b.evicted.len(),
        b.released.len(),
        b.lost
    );
    assert_eq!((b.lost, b.invalid), (0, 0));
    // 1024 pages deleted + 768 truncated away; a few metadata pages may join them.
    assert!((1792..1800).contains(&b.released.len()), "{b:?}");
    // The truncated file's first 256 pages and the third file's 1024, each with the
    // guest's copy of the page as it left the cache: the file's bytes.
    assert!(b.evicted.len() >= 1280, "{}", b.evicted.len());
    assert_eq!(b.copies.len(), b.evicted.len(), "one copy per eviction");
    let pages: std::collections::HashSet<Vec<u8>> = (0..3)
        .flat_map(|i| {
            file_data(i)
                .chunks(4096)
                .map(<[u8]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect();
    let copies_of_files = b
        .copies
        .iter()
        .filter(|c| {
            let mut page = vec![0u8; 4096];
            mem.read(c.data_gpa, &mut page).unwrap();
            pages.contains(&page)
        })
        .count();
    assert!(
        copies_of_files >= 1280,
        "{copies_of_files} copies hold file data"
    );
    let unique: std::collections::BTreeSet<_> = b.released.iter().collect();
    assert_eq!(unique.len(), b.released.len(), "a page released twice");
}
