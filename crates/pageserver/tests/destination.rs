//! The page server against a destination played by the test over a real socket pair
//! (a stand-in for QEMU, named as such: it is the only way to send requests a
//! misbehaving QEMU could send). What a user would notice: the page asked for
//! arrives, with the image's bytes, and is recorded; a request a real QEMU never
//! sends ends the restore with a reason instead of being served.

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rebound_migstream::example::{snapshot_stream, MAIN};
use rebound_pageserver::{serve, Ahead, Check, Job, Msg, ServeError, Stats};

fn page(i: u64) -> Vec<u8> {
    (0..4096).map(|k| (i as u8) ^ (k as u8) ^ 0x5a).collect()
}

/// A sparse main-RAM image with data pages 3, 5 and 6.
fn setup(dir: &std::path::Path) -> Job {
    let img = dir.join("ram.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(MAIN).unwrap();
    for i in [3u64, 5, 6] {
        f.write_all_at(&page(i), i * 4096).unwrap();
    }
    let state = dir.join("device.state");
    std::fs::write(&state, snapshot_stream()).unwrap();
    Job {
        socket: dir.join("unused.sock"),
        device_state: state,
        image: img,
        size: MAIN,
        block: "pc.ram".into(),
        check: None,
        trace: None,
        ahead: Ahead::Nothing,
        fafl: true,
        quiet_s: 30.0,
        out_dir: dir.to_path_buf(),
    }
}

fn request(name: &str, start: u64, len: u32) -> Vec<u8> {
    let mut b = vec![0, 3, 0, (13 + name.len()) as u8];
    b.extend(start.to_be_bytes());
    b.extend(len.to_be_bytes());
    b.push(name.len() as u8);
    b.extend(name.as_bytes());
    b
}

/// Reads from `s` until `want` shows up in what came (or 10 s pass).
fn wait_for(s: &mut UnixStream, got: &mut Vec<u8>, want: &[u8]) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 65536];
    while Instant::now() < end {
        if got.windows(want.len()).any(|w| w == want) {
            return true;
        }
        match s.read(&mut buf) {
            Ok(0) => return got.windows(want.len()).any(|w| w == want),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    false
}

/// What a test holds of a server it started: its thread, the destination's end of the
/// socket, and what the destination has read so far.
type Serving = (
    std::thread::JoinHandle<Result<Stats, ServeError>>,
    UnixStream,
    Vec<u8>,
);

/// Serves `job` on a socket pair (the guest started at once when `go`) and reads until
/// the package's RUN has come.
fn serving(job: Job, go: bool) -> Serving {
    let (mine, mut theirs) = UnixStream::pair().unwrap();
    let (tx, rx) = mpsc::channel();
    if go {
        tx.send(Msg::Go).unwrap();
    }
    let t = std::thread::spawn(move || serve(&job, mine, tx, rx));
    let mut got = Vec::new();
    assert!(wait_for(&mut theirs, &mut got, b"\x08\x00\x05\x00\x00"));
    (t, theirs, got)
}

/// One byte of page 5 of the job's image flips.
fn damage_page_5(job: &Job) {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&job.image)
        .unwrap();
    f.write_all_at(&[0xff], 5 * 4096 + 7).unwrap();
}

#[test]
fn a_requested_page_arrives_with_the_images_bytes_and_is_recorded() {
    let d = tempfile::tempdir().unwrap();
    let (t, mut theirs, mut got) = serving(setup(d.path()), true);
    // The package's RUN comes before any page of main RAM (lazy: nothing ahead).
    assert!(!got.windows(4096).any(|w| w == page(5)));
    theirs
        .write_all(&request("pc.ram", 5 * 4096, 4096))
        .unwrap();
    assert!(
        wait_for(&mut theirs, &mut got, &page(5)),
        "page 5 never came"
    );
    // A request past the block's end: the server stops, saying so.
    theirs.write_all(&request("pc.ram", MAIN, 4096)).unwrap();
    let r = t.join().unwrap();
    match r {
        Err(ServeError::BadRequest { what }) => assert!(what.contains("past its end"), "{what}"),
        other => panic!("expected a refused request, got {other:?}"),
    }
    let trace =
        rebound_snapshot::Trace::read(&d.path().join("requests.trace"), MAIN / 4096).unwrap();
    assert_eq!(
        trace.pages.iter().map(|p| p.page).collect::<Vec<_>>(),
        vec![5]
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("stats.json")).unwrap()).unwrap();
    assert!(
        stats["error"].as_str().unwrap().contains("past its end"),
        "{stats}"
    );
}

#[test]
fn requests_a_qemu_never_sends_are_refused() {
    for (req, why) in [
        (request("pc.ram", 4097, 4096), "not whole pages"),
        (request("pc.ram", 0, 0), "not whole pages"),
        (request("pc.ram", 0, 64 << 20), "not whole pages"),
        (request("nvram", 0, 4096), "does not have"),
        (request("pc.bios", 1 << 30, 4096), "past its end"),
    ] {
        let d = tempfile::tempdir().unwrap();
        let (t, mut theirs, _) = serving(setup(d.path()), false);
        theirs.write_all(&req).unwrap();
        match t.join().unwrap() {
            Err(ServeError::BadRequest { what }) => assert!(what.contains(why), "{what}"),
            other => panic!("expected {why:?}, got {other:?}"),
        }
    }
}

#[test]
fn a_damaged_chunk_is_never_sent() {
    let d = tempfile::tempdir().unwrap();
    let mut job = setup(d.path());
    // Checksums of 64 KiB chunks as the image was; then one byte of page 5 flips.
    let chunk = 64u64 << 10;
    let sums: Vec<String> = (0..MAIN / chunk)
        .map(|i| {
            let mut b = vec![0u8; chunk as usize];
            std::fs::File::open(&job.image)
                .unwrap()
                .read_exact_at(&mut b, i * chunk)
                .unwrap();
            format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&b))
        })
        .collect();
    job.check = Some(Check::Chunks { chunk, sums });
    damage_page_5(&job);
    let (t, mut theirs, mut got) = serving(job, true);
    theirs
        .write_all(&request("pc.ram", 5 * 4096, 4096))
        .unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert!(
        rebound_errors::chain(&e).contains("checksum mismatch in chunk 0"),
        "{e}"
    );
    // Neither the damaged page nor the good one of its chunk left.
    wait_for(&mut theirs, &mut got, b"never");
    let mut bad = page(5);
    bad[7] = 0xff;
    assert!(!got.windows(4096).any(|w| w == bad || w == page(6)));
}

#[test]
fn with_page_sums_only_the_damaged_page_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut job = setup(d.path());
    let sums: Vec<u64> = (0..MAIN / 4096)
        .map(|i| match i {
            3 | 5 | 6 => xxhash_rust::xxh3::xxh3_64(&page(i)),
            _ => xxhash_rust::xxh3::xxh3_64(&[0u8; 4096]),
        })
        .collect();
    let file = d.path().join("ram.pagesums");
    let entry = rebound_snapshot::pagesums::write(&file, &sums).unwrap();
    job.check = Some(Check::Pages { file, entry });
    damage_page_5(&job);
    let (t, mut theirs, mut got) = serving(job, true);
    // Its neighbour in the same chunk is good and goes.
    theirs
        .write_all(&request("pc.ram", 6 * 4096, 4096))
        .unwrap();
    assert!(
        wait_for(&mut theirs, &mut got, &page(6)),
        "page 6 never came"
    );
    theirs
        .write_all(&request("pc.ram", 5 * 4096, 4096))
        .unwrap();
    match t.join().unwrap() {
        Err(ServeError::PageMismatch(_, 5)) => {}
        other => panic!("expected page 5 refused, got {other:?}"),
    }
    let mut bad = page(5);
    bad[7] = 0xff;
    wait_for(&mut theirs, &mut got, b"never");
    assert!(!got.windows(4096).any(|w| w == bad));
}
