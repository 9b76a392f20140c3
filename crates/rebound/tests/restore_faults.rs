//! Snapshots and restores that go wrong, with real guests: a damaged, foreign or
//! newer snapshot is refused with one line naming the problem and leaves no VM; a
//! restore never takes a name in use; an elastic restore of a snapshot without a
//! trace falls back to lazy and records one; a lazily restored guest outlives its
//! deleted snapshot but is stopped, and its restore reported failed, when the image
//! its memory comes from is truncated or rewritten; a snapshot that runs out of
//! space leaves nothing and harms neither the guest nor the previous snapshot.
//! Restored counters are checked tick by tick against the host's own computation:
//! a guest that read damaged memory prints another checksum.

use crate::common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{counter_ticks, eventually, restore_json, Env};
use serde_json::{json, Value};

const IMAGE: &str = "ram-ram.img";
const SIZE: u64 = 256 << 20;

/// Starts a 256 MiB counter guest and waits for its first ticks.
fn start_counter(env: &Env, name: &str) {
    env.ok(&[
        "vm",
        "start",
        name,
        "--workload",
        "counter",
        "--memory",
        "256M",
    ]);
    eventually(Duration::from_secs(60), "counter ticks", || {
        (counter_ticks(env, name).len() > 2).then_some(())
    });
}

/// Starts the counter guest `src` and snapshots it into `dir`, with a post-snapshot
/// trace of `trace_s` seconds.
fn snapshot_counter(env: &Env, dir: &Path, trace_s: &str) {
    start_counter(env, "src");
    let out = dir.to_str().unwrap();
    env.ok(&["vm", "snapshot", "src", "--out", out, "--trace-s", trace_s]);
}

/// Waits for `more` new ticks of a counter VM and checks all it printed: one tick
/// after another, each with the checksum the host computes (its memory is intact).
fn assert_counting_right(env: &Env, name: &str, more: usize) -> Vec<(u64, u64)> {
    let n = counter_ticks(env, name).len();
    let t = eventually(Duration::from_secs(60), "more ticks", || {
        let t = counter_ticks(env, name);
        (t.len() >= n + more).then_some(t)
    });
    for w in t.windows(2) {
        assert_eq!(w[1].0, w[0].0 + 1, "{name} skipped or repeated a tick");
    }
    for &(seq, sum) in &t {
        assert_eq!(
            sum,
            rebound_image::counter_checksum(seq),
            "{name}: tick {seq} has a wrong checksum: its memory is damaged"
        );
    }
    t
}

fn vm_names(env: &Env) -> Vec<String> {
    let vms = env.get_ok("GET", "/v1/vms", None);
    let names = vms.as_array().unwrap().iter();
    names
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

fn copy_snapshot(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success(), "cp {} {}", from.display(), to.display());
}

/// A copy of the snapshot `from` at `to` with its manifest changed by `f`.
fn edited_copy(from: &Path, to: &Path, f: impl FnOnce(&mut Value)) -> String {
    copy_snapshot(from, to);
    edited_copy_in_place(to, f);
    to.to_str().unwrap().to_string()
}

/// Changes the manifest of the snapshot at `dir` by `f`.
fn edited_copy_in_place(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("manifest.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Replaces the first disk layer of the snapshot at `dir` with a qcow2 that reads
/// through `base` (of format `fmt`), its manifest entry following.
fn layer_over(dir: &Path, base: &Path, fmt: &str) {
    let disk = dir.join("disk-disk0.qcow2");
    std::fs::remove_file(&disk).unwrap();
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", fmt, "-b"])
        .arg(base)
        .arg(&disk)
        .status()
        .unwrap();
    assert!(st.success());
    let len = std::fs::metadata(&disk).unwrap().len();
    edited_copy_in_place(dir, |v| v["disks"][0]["size"] = len.into());
}

/// The first non-zero byte of the image at or after `from` (a page with data, not
/// a hole).
fn data_offset(image: &Path, from: u64) -> Option<u64> {
    let f = std::fs::File::open(image).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = from;
    while off < f.metadata().unwrap().len() {
        let n = f.read_at(&mut buf, off).unwrap();
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Some(off + i as u64);
        }
        off += n as u64;
    }
    None
}

/// Flips one byte of the image, the first with data at or after `from`; returns
/// how its chunk is named in errors.
fn flip_a_byte(img: &Path, from: u64) -> String {
    let off = data_offset(img, from)
        .or_else(|| data_offset(img, 0))
        .expect("the image has data");
    let f = OpenOptions::new().read(true).write(true).open(img).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], off).unwrap();
    let chunk = off / (64 << 20);
    format!(
        "chunk {chunk} (bytes {}..{})",
        chunk * (64 << 20),
        ((chunk + 1) * (64 << 20)).min(SIZE)
    )
}

fn verify_ok(env: &Env, dir: &str) {
    let v = env.ok(&["snapshot", "verify", dir]);
    assert!(v.contains("every checksum matches"), "{v}");
}

/// Restores in the background through the API (it answers once the guest runs).
/// A lazy restore on the page cache: the image mapped, its inode held by the
/// mapping, and the image guard watching it (the subjects of the tests that use it).
fn restore_lazily(env: &Env, dir: &Path, name: &str, watch_s: f64) -> Value {
    let body =
        json!({"dir": dir, "name": name, "mode": "lazy", "watch_s": watch_s, "path": "page-cache"});
    env.get_ok("POST", "/v1/restore", Some(&body))
}

/// What a test does to a snapshot's RAM image.
type Damage = fn(&std::fs::File);

fn restore_report(env: &Env, name: &str) -> Value {
    env.get_ok("GET", &format!("/v1/vms/{name}/restore"), None)
}

#[test]
fn damaged_foreign_and_newer_snapshots_are_refused_and_leave_no_vm() {
    let env = Env::new();
    let home = env.home.path();
    let snap = home.join("snap");
    let s = snap.to_str().unwrap();
    snapshot_counter(&env, &snap, "0");
    let src_pid = env.status("src")["qemu_pid"].clone();
    // Each refusal is one line naming the problem, and leaves no VM, record or run
    // dir behind: the list is as it was.
    let refused_on = |path: &str, dir: &str, name: &str, mode: &str, want: &[&str]| {
        let e = env.fails(&[
            "vm", "restore", dir, "--name", name, "--mode", mode, "--path", path,
        ]);
        for w in want {
            assert!(e.contains(w), "{name} ({mode}, {path}): {e:?} lacks {w:?}");
        }
        assert!(
            !e.contains("internal error"),
            "{name} ({mode}, {path}): {e}"
        );
        assert_eq!(vm_names(&env), ["src"], "after {name} ({mode}): {e}");
        assert!(!home.join("vms").join(name).exists(), "{name}: record left");
        assert!(!env.run.path().join(name).exists(), "{name}: run dir left");
    };
    let refused = |dir: &str, name: &str, mode: &str, want: &[&str]| {
        refused_on("auto", dir, name, mode, want)
    };

    // A truncated RAM image: refused before anything is read or started.
    let trunc = edited_copy(&snap, &home.join("trunc"), |_| {});
    let img = Path::new(&trunc).join(IMAGE);
    OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(SIZE / 2)
        .unwrap();
    let short = format!("{IMAGE} is {} bytes, the manifest says {SIZE}", SIZE / 2);
    for mode in ["eager", "lazy", "elastic"] {
        refused(&trunc, "trunc", mode, &[short.as_str()]);
    }
    assert!(env.fails(&["snapshot", "verify", &trunc]).contains(&short));

    // One flipped byte in a page with data: on the page cache the eager restore's
    // checksums find it and name the chunk; so does every restore that runs from
    // the image, since a snapshot this daemon did not write is checked in full
    // before the guest runs. On the page server every page is checked as it is
    // sent: the eager restore, which sends them all before the start, is refused
    // naming the page.
    let flip = edited_copy(&snap, &home.join("flip"), |_| {});
    let img = Path::new(&flip).join(IMAGE);
    let bytes = flip_a_byte(&img, 64 << 20);
    for mode in ["eager", "lazy", "elastic", "working-set"] {
        refused_on(
            "page-cache",
            &flip,
            "flip",
            mode,
            &["checksum mismatch", IMAGE, bytes.as_str()],
        );
    }
    refused_on(
        "page-server",
        &flip,
        "flip",
        "eager",
        &["does not match its checksum", IMAGE],
    );
    let e = env.fails(&["snapshot", "verify", &flip]);
    assert!(
        e.contains(&format!("{IMAGE}: checksum mismatch in {bytes}")),
        "{e}"
    );

    // A newer format version, and another format: the CLI's offline commands and the
    // daemon refuse both the same way.
    let newer = edited_copy(&snap, &home.join("newer"), |v| v["version"] = 2.into());
    let other = edited_copy(&snap, &home.join("other"), |v| {
        v["format"] = "qemu-savevm".into()
    });
    for (dir, want) in [
        (
            &newer,
            "snapshot format version 2 is newer than this rebound (supports 1)",
        ),
        (&other, "not a rebound-snapshot"),
    ] {
        refused(dir, "future", "lazy", &[want]);
        for cmd in ["inspect", "verify"] {
            let e = env.fails(&["snapshot", cmd, dir]);
            assert!(e.contains(want), "snapshot {cmd}: {e}");
        }
    }

    // Another machine type: refused once QEMU says what its `pc` is; that QEMU goes.
    let mach = edited_copy(&snap, &home.join("mach"), |v| {
        v["machine"] = "pc-i440fx-9.9".into()
    });
    for mode in ["lazy", "eager"] {
        refused(&mach, "mach", mode, &["machine type pc-i440fx-9.9"]);
    }

    // A RAM block that does not match the spec's memory (either way), or the image
    // it names: refused before QEMU starts, and the image is left as it was.
    for mib in [512u64, 128] {
        let dir = edited_copy(&snap, &home.join(format!("mem{mib}")), |v| {
            v["spec"]["memory_mib"] = mib.into()
        });
        let want = format!("is {SIZE} bytes but its VM spec says {mib} MiB");
        for mode in ["lazy", "eager"] {
            refused(&dir, "mem", mode, &[want.as_str()]);
        }
        verify_ok(&env, &dir);
        let len = std::fs::metadata(Path::new(&dir).join(IMAGE))
            .unwrap()
            .len();
        assert_eq!(len, SIZE);
    }
    let half = edited_copy(&snap, &home.join("half"), |v| {
        let b = &mut v["ram_blocks"][0];
        b["size"] = (SIZE / 2).into();
        b["checksums"] = json!(b["checksums"].as_array().unwrap()[..2]);
        b["data_bytes"] = 0.into();
    });
    let want = format!("{IMAGE} is {SIZE} bytes, the manifest says {}", SIZE / 2);
    refused(&half, "half", "lazy", &[want.as_str()]);

    // The snapshot's host paths are never opened on its word: a pmem file (which
    // would be mapped into the guest) refuses the restore; the file is untouched.
    let victim = home.join("victim.img");
    std::fs::write(&victim, vec![0x11u8; 2 << 20]).unwrap();
    let pmem = edited_copy(&snap, &home.join("pmem"), |v| {
        v["spec"]["pmem"] = json!([victim])
    });
    refused(&pmem, "pmem", "lazy", &["pmem device", "never opened"]);
    assert!(std::fs::read(&victim).unwrap().iter().all(|&b| b == 0x11));
    // A disk layer whose backing file lies outside the snapshot and the images.
    let outside = edited_copy(&snap, &home.join("outside"), |_| {});
    layer_over(Path::new(&outside), &victim, "raw");
    refused(
        &outside,
        "outside",
        "lazy",
        &["disk layer", "outside the snapshot"],
    );
    // A disk layer that reads through another snapshot this daemon wrote (`snap`,
    // listed in its catalog): a snapshot dropped into the store cannot give its
    // guest another snapshot's disk. Refused whether the catalog lists it not at
    // all or from an older Rebound (a plain line, which recorded no bases).
    let borrow = edited_copy(&snap, &home.join("borrow"), |_| {});
    let theirs = snap.join("disk-disk0.qcow2");
    layer_over(Path::new(&borrow), &theirs, "qcow2");
    let lies = format!("{} lies outside", theirs.display());
    refused(
        &borrow,
        "borrow",
        "lazy",
        &["disk layer", &lies, "did not write the snapshot"],
    );
    let catalog = home.join("snapshots.list");
    let mut f = OpenOptions::new().append(true).open(&catalog).unwrap();
    let real = std::fs::canonicalize(&borrow).unwrap();
    writeln!(f, "{}", real.display()).unwrap();
    refused(&borrow, "borrow", "lazy", &[&lies, "older Rebound"]);
    // A restore names only the files the snapshot's VM had: this one booted the
    // image, so a kernel of the user's is refused.
    let k = home.join("vmlinuz");
    std::fs::write(&k, b"not a kernel").unwrap();
    let e = env.fails(&[
        "vm",
        "restore",
        s,
        "--name",
        "kernel",
        "--kernel",
        k.to_str().unwrap(),
    ]);
    assert!(
        e.contains("--kernel") && e.contains("names a file the snapshot's VM did not have"),
        "{e}"
    );
    assert_eq!(vm_names(&env), ["src"], "{e}");
    // A RAM image that is a link (here to the real image elsewhere: same size).
    let linked = edited_copy(&snap, &home.join("linked"), |_| {});
    std::fs::remove_file(Path::new(&linked).join(IMAGE)).unwrap();
    std::os::unix::fs::symlink(snap.join(IMAGE), Path::new(&linked).join(IMAGE)).unwrap();
    for mode in ["lazy", "eager"] {
        refused(&linked, "linked", mode, &[IMAGE, "not a regular file"]);
    }
    // A flipped byte in the device state: QEMU is never given it.
    let dev = edited_copy(&snap, &home.join("dev"), |_| {});
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(&dev).join("device.state"))
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 4096).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], 4096).unwrap();
    for mode in ["lazy", "eager"] {
        refused(&dev, "dev", mode, &["device state is damaged"]);
    }
    // A dump directory of the snapshot's: not used, and the report says so.
    let dumps = edited_copy(&snap, &home.join("dumps"), |v| {
        v["spec"]["crash"]["dump_dir"] = json!(home.join("elsewhere"))
    });
    let r = restore_json(&env, &[&dumps, "--name", "dumps", "--mode", "lazy"]);
    assert!(r["notes"].to_string().contains("dump directory"), "{r}");
    assert_eq!(env.status("dumps")["state"], "running");
    env.ok(&["vm", "kill", "dumps"]);
    env.ok(&["vm", "rm", "dumps"]);

    // A name in use: refused, and the VM of that name runs on untouched.
    let e = env.fails(&["vm", "restore", s, "--name", "src"]);
    assert!(e.contains("VM name \"src\" is already in use"), "{e}");
    assert_eq!(env.status("src")["state"], "running");
    assert_eq!(env.status("src")["qemu_pid"], src_pid);
    assert_counting_right(&env, "src", 5);

    // None of that harmed the snapshot: it verifies, and restores under a name a
    // refused restore had asked for.
    verify_ok(&env, s);
    let r = restore_json(&env, &[s, "--name", "trunc", "--mode", "eager"]);
    assert_eq!(r["phase"], "done", "{r}");
    assert_counting_right(&env, "trunc", 5);
}

#[test]
fn lazy_restores_survive_a_deleted_snapshot_and_stop_on_a_changed_image() {
    let env = Env::new();
    let home = env.home.path();
    let snap = home.join("snap");
    snapshot_counter(&env, &snap, "1");
    let src_ticks = counter_ticks(&env, "src");

    // Without its trace, an elastic restore is a lazy one that says so, and records
    // a trace; the guest continues from the snapshot point with intact memory.
    let bare = edited_copy(&snap, &home.join("bare"), |v| v["trace"] = Value::Null);
    std::fs::remove_file(Path::new(&bare).join("trace.fafl")).unwrap();
    let r = restore_json(&env, &[&bare, "--name", "bare", "--mode", "elastic"]);
    assert_eq!(r["phase"], "done", "{r}");
    assert!(
        r["notes"]
            .to_string()
            .contains("restored lazily instead of elastic"),
        "{r}"
    );
    assert_eq!(r["trace_recorded"], true, "{r}");
    assert_eq!(r["working_set_pages"], 0, "{r}");
    // The page server's requests: the guest's exact first touches.
    let inspect = env.ok(&["snapshot", "inspect", &bare]);
    assert!(inspect.contains("from requests"), "{inspect}");
    let t = assert_counting_right(&env, "bare", 5);
    assert!(
        src_ticks.iter().any(|&(seq, _)| seq + 1 == t[0].0),
        "bare did not continue from a tick the source printed before the snapshot: {:?} then {:?}",
        src_ticks.last(),
        t[0]
    );

    // The snapshot directory deleted while the guest's memory still comes from its
    // image: harmless. The mapping holds the image's inode, which lives on until
    // QEMU unmaps it, so the guest keeps reading what the snapshot held.
    let gone = home.join("gone");
    copy_snapshot(&snap, &gone);
    let r = restore_lazily(&env, &gone, "gone", 60.0);
    assert_eq!(r["phase"], "watching", "{r}");
    std::fs::remove_dir_all(&gone).unwrap();
    assert_counting_right(&env, "gone", 30);
    assert_eq!(env.status("gone")["state"], "running");
    let rep = restore_report(&env, "gone");
    assert_eq!(rep["phase"], "watching", "{rep}");
    assert!(!env.event_kinds("gone").contains(&"restore_failed".into()));

    // The image truncated, or rewritten in place, under a running guest: the guest
    // must not go on with memory that is not the snapshot's. It is stopped, its
    // restore is reported failed naming the image, and so is its event log; every
    // tick it printed before was right. The report stays failed after the watch
    // window, and the VM's record can be removed.
    let cases: [(&str, Damage, &str); 2] = [
        (
            "cut",
            |f| f.set_len(SIZE / 2).unwrap(),
            "was truncated to 134217728 of its 268435456 bytes",
        ),
        (
            "rewritten",
            |f| f.write_all_at(&vec![0x5a; 1 << 20], 32 << 20).unwrap(),
            "was rewritten",
        ),
    ];
    for (name, damage, what) in cases {
        let dir = home.join(name);
        copy_snapshot(&snap, &dir);
        let t0 = Instant::now();
        let watch_s = 4.0;
        restore_lazily(&env, &dir, name, watch_s);
        eventually(Duration::from_secs(30), "ticks", || {
            (counter_ticks(&env, name).len() >= 3).then_some(())
        });
        let image = dir.join(IMAGE);
        damage(&OpenOptions::new().write(true).open(&image).unwrap());
        let rep = eventually(Duration::from_secs(10), "the restore to fail", || {
            let rep = restore_report(&env, name);
            (rep["phase"] == "failed").then_some(rep)
        });
        assert_eq!(env.status(name)["state"], "stopped");
        let want = format!("{} {what}", image.display());
        let error = rep["error"].as_str().unwrap_or_default();
        assert!(error.contains(&want), "{name}: {rep}");
        let ev = env.events(name);
        let failed = ev.iter().find(|e| e["kind"] == "restore_failed");
        let failed = failed.unwrap_or_else(|| panic!("{name}: no restore_failed: {ev:?}"));
        assert_eq!(failed["detail"]["error"], error, "{name}");
        let t = counter_ticks(&env, name);
        for &(seq, sum) in &t {
            assert_eq!(sum, rebound_image::counter_checksum(seq), "{name}: {seq}");
        }
        std::thread::sleep(Duration::from_secs_f64(watch_s + 2.0).saturating_sub(t0.elapsed()));
        let rep = restore_report(&env, name);
        assert_eq!(
            rep["phase"], "failed",
            "{name}, after the watch window: {rep}"
        );
        assert_eq!(rep["error"].as_str(), Some(error), "{name}");
        env.get_ok("DELETE", &format!("/v1/vms/{name}"), None);
    }
    // The other guests ran on.
    assert_counting_right(&env, "gone", 5);
    assert_counting_right(&env, "src", 5);
}

/// Bytes a directory's files take on disk.
fn allocated(dir: &Path) -> u64 {
    let files = std::fs::read_dir(dir).unwrap().flatten();
    files.map(|e| e.metadata().unwrap().blocks() * 512).sum()
}

#[test]
fn a_snapshot_that_runs_out_of_space_leaves_the_guest_and_the_previous_snapshot() {
    // Declared before the daemon and its VMs: unmounted after they are gone.
    let tmpfs: common::Tmpfs;
    let env = Env::new();
    let first = env.home.path().join("first");
    snapshot_counter(&env, &first, "0");
    // Room for one snapshot and a half: the first fits, the second cannot.
    let need = allocated(&first);
    tmpfs = common::Tmpfs::mount(((need * 3 / 2) >> 20) + 1);
    let full = tmpfs.0.path();
    let a = full.join("a");
    copy_snapshot(&first, &a);
    let b = full.join("b");
    let e = env.fails(&[
        "vm",
        "snapshot",
        "src",
        "--out",
        b.to_str().unwrap(),
        "--trace-s",
        "0",
    ]);
    assert!(e.contains("the snapshot failed"), "{e}");
    assert!(e.contains("No space left on device"), "{e}");
    // Nothing of it is left, not even hidden.
    let left: Vec<PathBuf> = std::fs::read_dir(full)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        left,
        std::slice::from_ref(&a),
        "left behind after the failed snapshot"
    );
    // The guest was resumed and counts on, right.
    assert_eq!(env.status("src")["state"], "running");
    assert_counting_right(&env, "src", 5);
    // The previous snapshot is whole and restores. (Eagerly: a lazy restore from a
    // full tmpfs would die as soon as the guest touched a hole of the image, which
    // tmpfs fills with a page of its own, and be reported failed.)
    let a = a.to_str().unwrap();
    verify_ok(&env, a);
    let r = restore_json(&env, &[a, "--name", "a", "--mode", "eager"]);
    assert_eq!(r["phase"], "done", "{r}");
    assert_counting_right(&env, "a", 5);
}

/// The page cache's path: the checks of a mapped image are the subject (on the page
/// server every page is checked as it is sent: `a_page_server_...` and the page
/// server's own tests).
const PC: &str = "page-cache";

#[test]
fn restores_that_run_from_the_image_check_its_ram_before_or_while_the_guest_runs() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let home = env.home.path();
    // Two snapshots this daemon wrote: one stays sound, one is damaged afterwards
    // (as bit rot or a careless hand would).
    let own = home.join("own");
    snapshot_counter(&env, &own, "1");
    let bad = home.join("bad");
    let b = bad.to_str().unwrap();
    env.ok(&["vm", "snapshot", "src", "--out", b, "--trace-s", "0"]);
    let bytes = flip_a_byte(&bad.join(IMAGE), 200 << 20);

    // The daemon's own snapshot runs at once, its chunks checked beside the guest:
    // lazily by a checker of its own, in working-set mode as the loader completes
    // them. All of them check.
    for (name, mode) in [("lazy", "lazy"), ("ws", "working-set")] {
        let own = own.to_str().unwrap();
        let r = restore_json(&env, &[own, "--name", name, "--mode", mode, "--path", PC]);
        assert_eq!(r["ram_check"], "background", "{r}");
        assert_eq!(r["ram_chunks"], 4, "{r}");
        let notes = r["notes"].to_string();
        assert!(notes.contains("checked in the background"), "{r}");
        eventually(Duration::from_secs(30), "every chunk checked", || {
            let rep = restore_report(&env, name);
            (rep["ram_chunks_checked"] == 4).then_some(())
        });
        assert_counting_right(&env, name, 5);
    }

    // The damaged one, lazily: the guest is stopped once its chunk is read, the
    // restore is reported failed naming the chunk, and so is the event log.
    let r = env.get_ok(
        "POST",
        "/v1/restore",
        Some(&json!({"dir": bad, "name": "rot", "mode": "lazy", "watch_s": 3.0, "path": PC})),
    );
    assert_eq!(r["ram_check"], "background", "{r}");
    let rep = eventually(Duration::from_secs(30), "the restore to fail", || {
        let rep = restore_report(&env, "rot");
        (rep["phase"] == "failed").then_some(rep)
    });
    let error = rep["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("{IMAGE}: checksum mismatch in {bytes}")),
        "{rep}"
    );
    assert!(error.contains("the guest was stopped"), "{rep}");
    assert!(!error.contains('\n'), "{error}");
    eventually(Duration::from_secs(10), "the guest stopped", || {
        (env.status("rot")["state"] == "stopped").then_some(())
    });
    assert!(env.event_kinds("rot").contains(&"restore_failed".into()));
    // Asked to check in full, the same restore is refused before QEMU runs anything.
    let e = env.fails(&[
        "vm",
        "restore",
        b,
        "--name",
        "full",
        "--mode",
        "lazy",
        "--ram-check",
        "full",
        "--path",
        PC,
    ]);
    assert!(e.contains(&format!("checksum mismatch in {bytes}")), "{e}");
    assert!(!vm_names(&env).contains(&"full".to_string()));
    // Asked not to check, it runs, and says it runs unchecked.
    let r = restore_json(
        &env,
        &[
            b,
            "--name",
            "off",
            "--mode",
            "lazy",
            "--ram-check",
            "off",
            "--path",
            PC,
        ],
    );
    assert_eq!(r["ram_check"], "off", "{r}");
    assert_eq!(r["ram_chunks_checked"], 0, "{r}");
    assert!(r["notes"].to_string().contains("RAM unchecked"), "{r}");
    assert_eq!(env.status("off")["state"], "running");
    let text = env.ok(&[
        "vm",
        "restore",
        b,
        "--name",
        "off2",
        "--mode",
        "lazy",
        "--ram-check",
        "off",
        "--watch-s",
        "0",
        "--path",
        PC,
    ]);
    assert!(text.contains("RAM image:        unchecked"), "{text}");

    // A copy another user could still change: never mapped, restored by a checked
    // copy instead (and a sound one runs).
    let shared = home.join("shared");
    copy_snapshot(&own, &shared);
    std::fs::set_permissions(shared.join(IMAGE), std::fs::Permissions::from_mode(0o666)).unwrap();
    let r = restore_json(
        &env,
        &[
            shared.to_str().unwrap(),
            "--name",
            "shared",
            "--mode",
            "lazy",
            "--path",
            PC,
        ],
    );
    assert_eq!(r["mode"], "eager", "{r}");
    assert!(
        r["notes"]
            .to_string()
            .contains("restored by a checked copy"),
        "{r}"
    );
    assert_eq!(r["ram_chunks_checked_before_start"], 4, "{r}");
    assert_counting_right(&env, "shared", 5);
}

/// The pid of the page server of VM `name` (its job file names the VM's run dir).
fn page_server_pid(name: &str) -> Option<u32> {
    let want = format!("/{name}/pagesrv/job.json");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        (cmd.contains(" page-server ") && cmd.contains(&want)).then_some(pid)
    })
}

#[test]
fn a_page_server_killed_mid_restore_fails_it_and_stops_the_guest_never_running_it_on_missing_pages()
{
    let env = Env::new();
    let dir = env.home.path().join("snap");
    snapshot_counter(&env, &dir, "1");
    let d = dir.to_str().unwrap();
    // Killed while the VM is held (nothing sent but the firmware and the devices),
    // and while the guest runs lazily in its quiet window (only its requests sent).
    for (name, held) in [("held", true), ("running", false)] {
        let mut args = vec!["vm", "restore", d, "--name", name, "--mode", "lazy"];
        args.extend(["--path", "page-server", "--watch-s", "30", "--json"]);
        if held {
            args.push("--paused");
        }
        let mut restore = env.spawn_quiet(&args);
        let pid = eventually(Duration::from_secs(60), "the page server", || {
            page_server_pid(name)
        });
        if held {
            // The restore is held: loaded, waiting for `vm resume`.
            assert!(
                restore.wait().unwrap().success(),
                "{name}: the held restore failed"
            );
        } else {
            // The guest ticks on its requests alone.
            eventually(Duration::from_secs(60), "ticks after the restore", || {
                (counter_ticks(&env, name).len() > 2).then_some(())
            });
        }
        let killed = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let _ = restore.wait();
        let rep = eventually(Duration::from_secs(60), "the restore failed", || {
            let r = env.get_ok("GET", &format!("/v1/vms/{name}/restore"), None);
            (r["phase"] == "failed").then_some(r)
        });
        let err = rep["error"].as_str().unwrap_or_default();
        assert!(
            err.contains("page server ended (signal: 9"),
            "{name}: {rep}"
        );
        assert!(err.contains("the guest was stopped"), "{name}: {rep}");
        // Stopped: no QEMU runs the guest any more, and it ticked no further.
        let ticks = counter_ticks(&env, name).len();
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(counter_ticks(&env, name).len(), ticks, "{name} ran on");
        let st = env.get_ok("GET", &format!("/v1/vms/{name}"), None);
        assert_ne!(st["state"], "running", "{name}: {st}");
        let _ = env.rebound(&["vm", "rm", name]);
    }
}

/// The page server SIGKILLed at points spread over an elastic restore (while it
/// sends the working set, around the start, while it pushes the rest, after its end):
/// whatever the point, the guest never runs on a page that did not arrive. Either the
/// restore fails and no QEMU runs the guest, or every page arrived before the kill
/// (the report has its memory in place) and the guest counts on, every tick right.
#[test]
fn a_page_server_killed_at_any_point_never_leaves_a_guest_running_on_missing_pages() {
    let env = Env::new();
    let dir = env.home.path().join("snap");
    snapshot_counter(&env, &dir, "1");
    let d = dir.to_str().unwrap();
    env.ok(&["vm", "kill", "src"]);
    // Fixed, spread delays from the server's appearance: the test is the same on
    // every run, and the points still fall in different phases on a slow or fast host.
    for (i, delay_ms) in [0u64, 50, 100, 150, 200, 250, 300, 400, 2000]
        .into_iter()
        .enumerate()
    {
        let name = format!("k{i}");
        let mut restore = env.spawn_quiet(&[
            "vm",
            "restore",
            d,
            "--name",
            &name,
            "--mode",
            "elastic",
            "--path",
            "page-server",
            "--watch-s",
            "2",
        ]);
        let pid = eventually(Duration::from_secs(60), "the page server", || {
            page_server_pid(&name)
        });
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        let _ = restore.wait();
        // Refused before the start (the VM removed), failed, or whole.
        let rep = eventually(Duration::from_secs(60), "the restore's outcome", || {
            let (code, _) = env.call("GET", &format!("/v1/vms/{name}"), None).ok()?;
            if code == 404 {
                return Some(Value::Null);
            }
            let (_, r) = env
                .call("GET", &format!("/v1/vms/{name}/restore"), None)
                .ok()?;
            (r["phase"] == "failed" || r["memory_loaded_s"].is_number()).then_some(r)
        });
        if rep.is_null() {
            eprintln!("{name}: killed {delay_ms} ms in: refused before the start");
            continue;
        }
        eprintln!(
            "{name}: killed {delay_ms} ms in: phase {}, memory in place {}",
            rep["phase"], rep["memory_loaded_s"]
        );
        let running = env
            .call("GET", &format!("/v1/vms/{name}"), None)
            .ok()
            .is_some_and(|(_, st)| st["state"] == "running");
        if rep["phase"] == "failed" {
            let ticks = counter_ticks(&env, &name).len();
            std::thread::sleep(Duration::from_secs(2));
            assert_eq!(
                counter_ticks(&env, &name).len(),
                ticks,
                "{name} ran on: {rep}"
            );
            assert!(!running, "{name} runs after a failed restore: {rep}");
        } else {
            assert!(running, "{name}: {rep}");
            assert_counting_right(&env, &name, 3);
        }
        let _ = env.rebound(&["vm", "kill", &name]);
        let _ = env.rebound(&["vm", "rm", &name]);
    }
}
