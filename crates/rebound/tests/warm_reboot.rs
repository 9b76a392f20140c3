//! Warm reboots (`rebound vm reboot --warm`): the guest's file cache comes back after
//! the reboot, from the host's block cache, and never as a page the old guest memory
//! held. The fault-injection test damages cached file pages in guest RAM (through
//! the RAM file, from the host) and pages the guest is writing, reboots warm, and
//! checks every file the guest serves against the disk, round after round
//! (`REBOUND_WARM_ROUNDS`, default 2 in the suite: one agent reboot, one hard reset;
//! docs/benchmarks.md records a 20-round run).

use crate::common;

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{eventually, ext4_file, http_get, Env};
use rebound_image::splitmix64;
use rebound_image::webset::{file_content, file_path};
use serde_json::Value;

const FILES: u64 = 120;
const FILE_SIZE: u64 = 48 << 10;
const IO_SIZE: u64 = 4 << 20;

fn make_webset(env: &Env) -> PathBuf {
    let out = env.home.path().join("ws.img");
    env.ok(&[
        "image",
        "webset",
        out.to_str().unwrap(),
        "--files",
        &FILES.to_string(),
        "--file-size",
        &FILE_SIZE.to_string(),
        "--io-size",
        &IO_SIZE.to_string(),
    ]);
    out
}

/// Where each page of the file set and of io.bin can be recognised in guest RAM: by
/// its first word (splitmix64 outputs do not repeat in practice), checked on the
/// second.
struct Pages {
    web: HashMap<u64, (u64, u64)>,
    io: HashMap<u64, u64>,
}

impl Pages {
    fn new() -> Pages {
        let mut web = HashMap::new();
        for i in 0..FILES {
            for p in 0..FILE_SIZE / 4096 {
                web.insert(splitmix64(i << 32 | (p * 512)), (i, p));
            }
        }
        // io.bin's word k at any version v is splitmix64(k) ^ v: the xor of two words
        // of a page does not depend on v.
        let io = (0..IO_SIZE / 4096)
            .map(|p| (splitmix64(p * 512) ^ splitmix64(p * 512 + 1), p))
            .collect();
        Pages { web, io }
    }

    /// Finds file-set and io.bin pages in the RAM file: (offset, file or None).
    fn scan(&self, ram: &Path) -> (Vec<(u64, u64)>, Vec<u64>) {
        let f = std::fs::File::open(ram).unwrap();
        let len = f.metadata().unwrap().len();
        let mut buf = vec![0u8; 1 << 20];
        let (mut web, mut io) = (Vec::new(), Vec::new());
        let word = |b: &[u8], k: usize| u64::from_le_bytes(b[8 * k..8 * k + 8].try_into().unwrap());
        let mut off = 0;
        while off < len {
            let n = f.read_at(&mut buf, off).unwrap();
            for (k, page) in buf[..n].chunks_exact(4096).enumerate() {
                let at = off + (k as u64) * 4096;
                let (w0, w1) = (word(page, 0), word(page, 1));
                if let Some(&(i, p)) = self.web.get(&w0) {
                    if w1 == splitmix64(i << 32 | (p * 512 + 1)) {
                        web.push((at, i));
                    }
                } else if let Some(&p) = self.io.get(&(w0 ^ w1)) {
                    if word(page, 2) ^ splitmix64(p * 512 + 2) == w0 ^ splitmix64(p * 512) {
                        io.push(at);
                    }
                }
            }
            off += n as u64;
        }
        (web, io)
    }
}

/// Overwrites a page of guest RAM with a marker the guest would never write.
fn damage(ram: &Path, at: u64, round: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(ram).unwrap();
    let junk: Vec<u8> = (0..512u64)
        .flat_map(|k| (0xdead_beef_0000_0000 ^ (round << 16) ^ k).to_le_bytes())
        .collect();
    f.write_at(&junk, at).unwrap();
}

fn fetch(port: u16, i: u64) -> Vec<u8> {
    let (code, body) = http_get(port, &format!("/{}", file_path(i))).unwrap();
    assert_eq!(code, 200, "file {i}");
    body
}

/// The io events that reported a finished randwrite phase (none while it runs).
fn io_done_count(env: &Env, name: &str) -> usize {
    env.events(name)
        .iter()
        .filter(|e| e["kind"] == "io" && e["detail"]["phase"] == "randwrite")
        .count()
}

#[test]
fn warm_reboots_never_bring_back_a_damaged_or_stale_page() {
    let rounds: u64 = std::env::var("REBOUND_WARM_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let env = Env::new();
    let ws = make_webset(&env);
    // web serves the file set; io rewrites io.bin in 4 KiB buffered writes from 20 s
    // after each boot on, so each reboot comes while pages are under write.
    env.ok(&[
        "vm",
        "start",
        "w",
        "--workload",
        "web,io",
        "--memory",
        "256M",
        "--disk",
        ws.to_str().unwrap(),
        "--disk-backend",
        "rebound",
        "--disk-cache",
        "64M",
        "--workload-arg",
        "data_disk=vdb",
        "--workload-arg",
        "io=randwrite",
        "--workload-arg",
        "io_size=4M",
        "--workload-arg",
        "io_direct=0",
        "--workload-arg",
        "io_keep=1",
        "--workload-arg",
        "io_delay_s=20",
        "--workload-arg",
        "io_seconds=300",
        "--workload-arg",
        "io_rounds=1",
    ]);
    let port = env.host_port("w", 8080);
    let ram = env.run.path().join("w").join("ram");
    let pages = Pages::new();
    let want: Vec<Vec<u8>> = (0..FILES).map(|i| file_content(i, FILE_SIZE)).collect();
    // What the guest serves right after a boot, before its writer starts: every file
    // of the set as generated, and io.bin as the disk image holds it.
    let check = |round: u64| {
        let (code, served) = http_get(port, "/io.bin").unwrap();
        assert_eq!(code, 200);
        let on_disk = ext4_file(&ws, "/io.bin").unwrap();
        assert_eq!(served.len(), on_disk.len());
        let differing = served
            .chunks(4096)
            .zip(on_disk.chunks(4096))
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            differing, 0,
            "round {round}: io.bin pages differ from the disk"
        );
        for i in 0..FILES {
            assert!(
                fetch(port, i) == want[i as usize],
                "round {round}: file {i} differs from the disk"
            );
        }
    };
    let mut booted = Instant::now();
    for round in 1..=rounds {
        check(round);
        // The writer starts 20 s after the boot, so the checks above see no write
        // however slow the host; the reboot comes in its writes. This wait is the
        // fault's timing, not a stand-in for a condition the test could see: the
        // writer rewrites the same blocks with the same version every boot, so its
        // writes after the first boot leave no trace in guest RAM to wait for.
        std::thread::sleep(Duration::from_secs(23).saturating_sub(booted.elapsed()));
        // Damage half of the file-set pages found in RAM, and of io.bin's.
        let (web, io) = pages.scan(&ram);
        assert!(
            web.len() as u64 >= FILES,
            "round {round}: only {} file-set pages in RAM",
            web.len()
        );
        assert!(!io.is_empty(), "round {round}: no io.bin page in RAM");
        let mut damaged_files = std::collections::BTreeSet::new();
        for (k, &(at, i)) in web.iter().enumerate() {
            if (k as u64 + round).is_multiple_of(2) {
                damage(&ram, at, round);
                damaged_files.insert(i);
            }
        }
        for (k, &at) in io.iter().enumerate() {
            if (k as u64 + round).is_multiple_of(2) {
                damage(&ram, at, round);
            }
        }
        // The faults are real: the guest now serves damaged pages from its cache.
        let bad = damaged_files
            .iter()
            .filter(|&&i| fetch(port, i) != want[i as usize])
            .count();
        assert!(
            bad > 0,
            "round {round}: no damaged page reached the guest's cache"
        );
        assert!(
            io_done_count(&env, "w") == 0,
            "round {round}: the writer finished before the reboot"
        );

        // Reboot warm: the guest's own sync and reboot, or a reset in the middle of
        // its writes, in turn.
        let hard = round.is_multiple_of(2);
        let mut args = vec!["vm", "reboot", "w", "--warm", "--json"];
        if hard {
            args.push("--hard");
        }
        let r: Value = serde_json::from_str(&env.ok(&args)).unwrap();
        booted = Instant::now();
        assert!(r["cold_reason"].is_null(), "round {round}: {r}");
        assert!(
            r["cached_pages"].as_u64().unwrap() >= FILES,
            "round {round}: {r}"
        );
        assert!(
            r["prefetch"]["pages"].as_u64().unwrap() >= FILES,
            "round {round}: {r}"
        );
        assert_eq!(r["how"], if hard { "reset" } else { "agent" });
    }
    check(rounds + 1);
    env.ok(&["vm", "stop", "w"]);
}

#[test]
fn a_damaged_or_missing_warm_cache_list_makes_the_reboot_cold_and_says_so() {
    let env = Env::new();
    start_web(&env, "c", &[]);
    let port = env.host_port("c", 8080);
    let list = env.home.path().join("vms/c/warm-cache.list");
    for (k, fault) in ["damaged", "missing"].iter().enumerate() {
        let (code, _) = http_get(port, "/blob-1m.bin").unwrap();
        assert_eq!(code, 200);
        let child = env
            .cmd(&["vm", "reboot", "c", "--warm", "--json"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The list is written before the guest reboots; damage it while the guest boots.
        eventually(Duration::from_secs(60), "reboot_requested", || {
            (env.event_kinds("c")
                .iter()
                .filter(|e| *e == "reboot_requested")
                .count()
                > k)
                .then_some(())
        });
        if *fault == "damaged" {
            let mut b = std::fs::read(&list).unwrap();
            let n = b.len();
            b[n / 2] ^= 0x55;
            std::fs::write(&list, b).unwrap();
        } else {
            std::fs::remove_file(&list).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let why = r["cold_reason"].as_str().unwrap_or_default();
        assert!(
            why.contains("warm-cache list") && why.contains("cold"),
            "{fault}: {r}"
        );
        assert!(r["prefetch"].is_null(), "{fault}: {r}");
        // The reboot itself went on: the guest serves again.
        let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
        assert_eq!((code, body.len()), (200, 1 << 20));
    }
    let colds = env
        .events("c")
        .iter()
        .filter(|e| e["kind"] == "warm_cache_cold")
        .count();
    assert_eq!(colds, 2);
    // Each reboot shows the machine's reset, the guest's own, between the request and
    // the new boot (the daemon watches for it to tell a guest hung on its way down
    // from one that is booting; the firmware resets the machine at boot too).
    let kinds: Vec<(String, Value)> = env
        .events("c")
        .into_iter()
        .map(|e| (e["kind"].as_str().unwrap_or_default().to_string(), e))
        .collect();
    let mut reboots = 0;
    for (i, (k, _)) in kinds.iter().enumerate() {
        if k != "reboot_requested" {
            continue;
        }
        reboots += 1;
        let until = kinds[i..].iter().take_while(|(k, _)| k != "rebooted");
        let guest_resets = until
            .filter(|(k, e)| k == "reset" && e["detail"]["guest"] == true)
            .count();
        assert!(guest_resets >= 1, "reboot {reboots}: {kinds:?}");
    }
    assert_eq!(reboots, 2);
    env.ok(&["vm", "stop", "c"]);
}

#[test]
fn a_warm_crash_policy_reads_the_cache_back_in_the_recovery_vm() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    start_web(&env, "k", &["--on-crash", "recover", "--warm"]);
    let port = env.host_port("k", 8080);
    let blob = ext4_file(&img.disk, "/blob-1m.bin").unwrap();
    assert_eq!(http_get(port, "/blob-1m.bin").unwrap(), (200, blob.clone()));
    // The running guest's cache is listed in the background; wait for a list that
    // has the file just read.
    let list = env.home.path().join("vms/k/warm-cache.list");
    eventually(
        Duration::from_secs(60),
        "a cache list naming the blob",
        || {
            std::fs::read_to_string(&list)
                .ok()
                .filter(|t| t.contains("blob-1m.bin"))
                .map(|_| ())
        },
    );
    let hits_before = disk_hits(&env, "k");
    env.ok(&["vm", "crash", "k"]);
    env.wait_event("k", "recovered");
    env.wait_event("k", "prefetched");
    let p = env
        .events("k")
        .into_iter()
        .find(|e| e["kind"] == "prefetched")
        .unwrap();
    assert!(p["detail"]["pages"].as_u64().unwrap() >= 256, "{p}");
    // The read-back came from the backend's host cache, which outlived the crash.
    assert!(disk_hits(&env, "k") >= hits_before + 256);
    assert_eq!(http_get(port, "/blob-1m.bin").unwrap(), (200, blob));
    env.ok(&["vm", "stop", "k"]);
}

/// Host-cache hits of the VM's first disk.
fn disk_hits(env: &Env, name: &str) -> u64 {
    let d = env.get_ok("GET", &format!("/v1/vms/{name}/disks"), None);
    d[0]["stats"]["cache"]["hits"].as_u64().unwrap()
}

/// A small web guest on Rebound's block backend with a 16 MiB host cache.
fn start_web(env: &Env, name: &str, extra: &[&str]) {
    let mut args = vec![
        "vm",
        "start",
        name,
        "--workload",
        "web",
        "--memory",
        "192M",
        "--disk-backend",
        "rebound",
        "--disk-cache",
        "16M",
    ];
    args.extend_from_slice(extra);
    env.ok(&args);
}
