//! Tests of [`super`]: requests on temporary raw files through mock queues.

use super::*;
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor as D, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x20_0000;
const STATUS: u64 = 0x30_0000;
const W: u16 = VRING_DESC_F_WRITE as u16;

struct Rig {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    dev: Device,
    mem: GuestMemoryMmap,
}

fn rig(cache: u64) -> Rig {
    rig_on(cache, false)
}

/// [`rig`], with `O_DIRECT` on the file when `direct` (and the filesystem allows).
fn rig_on(cache: u64, direct: bool) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let mut content = vec![0u8; 1 << 20];
    for (i, b) in content.iter_mut().enumerate() {
        *b = (i / 4096) as u8;
    }
    std::fs::write(&path, &content).unwrap();
    let dev = Device {
        disk: Disk::open(&path, false, direct).unwrap(),
        cache: Cache::new(cache),
        pages: Default::default(),
        mem: Default::default(),
        notices: Default::default(),
        ring: Default::default(),
        timing: Default::default(),
        serial: b"disk0".to_vec(),
    };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x40_0000)]).unwrap();
    Rig {
        _dir: dir,
        path,
        dev,
        mem,
    }
}

impl Rig {
    /// Runs one request; returns (used length, status byte).
    fn run(&self, kind: u32, sector: u64, descs: &[RawDescriptor]) -> (u32, u8) {
        let mut lap = Lap::off();
        let r = self.run_timed(kind, sector, descs, &mut lap);
        self.dev.finish(&mut lap);
        r
    }

    /// [`Rig::run`], its time charged to `lap`.
    fn run_timed(
        &self,
        kind: u32,
        sector: u64,
        descs: &[RawDescriptor],
        lap: &mut Lap,
    ) -> (u32, u8) {
        let h = Header {
            kind,
            ioprio: 0,
            sector,
        };
        self.mem.write_obj(h, GuestAddress(HDR)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let q = MockSplitQueue::new(&self.mem, 16);
        let chain = q.build_desc_chain(descs).unwrap();
        let used = self.dev.execute_timed(chain, lap);
        (used, self.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap())
    }
}

fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(D::new(addr, len, flags, 0))
}

fn hdr() -> RawDescriptor {
    d(HDR, 16, 0)
}

fn status() -> RawDescriptor {
    d(STATUS, 1, W)
}

/// A notice ring (`guest/evict/ring.h`, version 2) at `RING` with 16 page copies.
const RING: u64 = 0x38_0000;
const SLOTS: u64 = 0x39_0000;

fn make_ring(mem: &GuestMemoryMmap) {
    let put = |at: u64, v: &[u8]| mem.write_slice(v, GuestAddress(RING + at)).unwrap();
    put(0, b"RBEVRING");
    put(8, &2u32.to_le_bytes());
    put(12, &16u32.to_le_bytes());
    put(16, &16u64.to_le_bytes());
    put(32, &4096u32.to_le_bytes());
    put(36, &16u32.to_le_bytes());
    put(40, &1u32.to_le_bytes());
    put(44, &4096u32.to_le_bytes());
    put(64, &SLOTS.to_le_bytes());
}

/// The guest's module: notice n for the page at `gpa`, with its copy.
fn guest_evicts(mem: &GuestMemoryMmap, gpa: u64) {
    let n = mem.read_obj::<u64>(GuestAddress(RING + 24)).unwrap() + 1;
    let s = (n - 1) % 16;
    let e = RING + 4096 + s * 16;
    mem.write_obj(0u64, GuestAddress(e)).unwrap();
    let mut page = vec![0u8; 4096];
    mem.read_slice(&mut page, GuestAddress(gpa)).unwrap();
    mem.write_slice(&page, GuestAddress(SLOTS + s * 4096))
        .unwrap();
    mem.write_obj((gpa / PAGE) | (1 << 56), GuestAddress(e + 8))
        .unwrap();
    mem.write_obj(n, GuestAddress(e)).unwrap();
    mem.write_obj(n, GuestAddress(RING + 24)).unwrap();
}

#[test]
fn the_ring_is_taken_before_each_request_so_a_block_evicted_then_read_back_hits() {
    let r = rig(1 << 20);
    r.dev.reconfigure(1 << 20, true);
    make_ring(&r.mem);
    r.dev.ring.set(RING, 8192, &r.mem).unwrap();
    // Block 2 read into a page; the guest evicts it and at once reuses the page.
    r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 4096, W), status()]);
    guest_evicts(&r.mem, DATA);
    r.mem
        .write_slice(&[0x77; 4096], GuestAddress(DATA))
        .unwrap();
    // A forged notice: a page no I/O mapped, holding what block 3 would.
    let forged = DATA + 0x20000;
    r.mem.write_slice(&[3; 4096], GuestAddress(forged)).unwrap();
    guest_evicts(&r.mem, forged);
    // Its next request reads block 2 back: the ring was taken first, so the block
    // is in the host cache, from the copy, and the read hits it.
    let other = DATA + 0x10000;
    r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(other, 4096, W), status()]);
    let mut got = vec![0u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(other)).unwrap();
    assert!(got.iter().all(|b| *b == 2), "block 2's bytes");
    let (c, s) = (r.dev.ring.counts(), r.dev.cache.stats());
    assert_eq!((c.evicted, c.lost, c.polls), (2, 0, 1));
    assert_eq!((s.hits, s.held_bytes), (1, 0), "the hit moved block 2 back");
    assert_eq!(
        r.dev
            .notices
            .admitted
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(r.dev.notices.refused()[&Refusal::NoMapping], 1);
    // Nothing new: requests do not read the ring again.
    r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(other, 4096, W), status()]);
    assert_eq!(r.dev.ring.counts().polls, 1);
    // A ring whose magic is gone (the module unloaded) is given up, in words.
    r.mem.write_obj(0u64, GuestAddress(RING)).unwrap();
    guest_evicts(&r.mem, other);
    r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(other, 4096, W), status()]);
    let c = r.dev.ring.counts();
    assert!(c.ring.is_none() && c.error.unwrap().contains("magic"));
}

#[test]
fn exclusive_an_evicted_page_comes_back_from_the_host_and_nothing_stale_is_served() {
    let r = rig(1 << 20);
    r.dev.reconfigure(1 << 20, true);
    let evict = |r: &Rig, gpa: u64| r.dev.evicted_in(gpa / PAGE, Page::InGuest, &r.mem);
    // Read blocks 2 and 3 into two guest pages: mapped, nothing cached yet.
    r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 8192, W), status()]);
    assert_eq!(r.dev.cache.stats().held_bytes, 0);
    // The guest evicts both: admitted, copied from its memory.
    assert_eq!(evict(&r, DATA), Ok(()));
    assert_eq!(evict(&r, DATA + 4096), Ok(()));
    assert_eq!(r.dev.cache.stats().held_bytes, 8192);
    // A repeated notice finds nothing.
    assert_eq!(evict(&r, DATA), Err(Refusal::NoMapping));
    // The guest reuses the page, then reads block 2 again elsewhere: a host hit.
    r.mem
        .write_slice(&[0x77; 4096], GuestAddress(DATA))
        .unwrap();
    let other = DATA + 0x10000;
    r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(other, 4096, W), status()]);
    let mut got = vec![0u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(other)).unwrap();
    assert!(got.iter().all(|b| *b == 2));
    let s = r.dev.cache.stats();
    assert_eq!(
        (s.hits, s.held_bytes),
        (1, 4096),
        "the hit moved block 2 back to the guest"
    );
    // Block 3 is overwritten from another page: the host copy goes, and the page
    // that read it before can no longer pass for it.
    r.mem
        .write_slice(&[0xcd; 4096], GuestAddress(other))
        .unwrap();
    r.run(VIRTIO_BLK_T_OUT, 24, &[hdr(), d(other, 4096, 0), status()]);
    assert_eq!(r.dev.cache.stats().held_bytes, 0);
    r.run(VIRTIO_BLK_T_IN, 24, &[hdr(), d(DATA, 4096, W), status()]);
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(
        got.iter().all(|b| *b == 0xcd),
        "the write, not the evicted copy"
    );
    // The page that read block 3 is scribbled on before its eviction: refused.
    r.mem
        .write_slice(&[0x01; 4096], GuestAddress(DATA))
        .unwrap();
    assert_eq!(evict(&r, DATA), Err(Refusal::ContentChanged));
    // A discard forgets what the write mapped.
    let seg = Segment {
        sector: 24,
        num_sectors: 8,
        flags: 0,
    };
    r.mem.write_obj(seg, GuestAddress(DATA + 0x20000)).unwrap();
    r.run(
        VIRTIO_BLK_T_DISCARD,
        0,
        &[hdr(), d(DATA + 0x20000, 16, 0), status()],
    );
    assert_eq!(evict(&r, other), Err(Refusal::NoMapping));
    assert_eq!(
        r.dev
            .notices
            .admitted
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    // With the access log on, each eviction of a held block is an `e` line.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.csv");
    r.dev.cache.record_to(Some(&log)).unwrap();
    r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
    assert_eq!(evict(&r, DATA), Ok(()));
    assert_eq!(evict(&r, DATA), Err(Refusal::NoMapping));
    r.dev.cache.record_to(None).unwrap();
    let kinds: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.split(',').skip(1).collect::<Vec<_>>().join(","))
        .collect();
    assert_eq!(kinds, ["0,m", "0,e"]);
}

#[test]
fn a_read_returns_the_disk_and_a_second_read_hits_the_cache() {
    let r = rig(1 << 20);
    for round in 0..2 {
        let (used, st) = r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 8192, W), status()]);
        assert_eq!((used, st), (8193, VIRTIO_BLK_S_OK as u8), "round {round}");
        let mut got = vec![0u8; 8192];
        r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert!(got[..4096].iter().all(|b| *b == 2) && got[4096..].iter().all(|b| *b == 3));
    }
    let s = r.dev.cache.stats();
    assert_eq!((s.misses, s.hits, s.admissions), (2, 2, 2));
}

#[test]
fn a_write_reaches_the_file_and_the_cache_serves_the_new_data() {
    let r = rig(1 << 20);
    r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
    r.mem
        .write_slice(&[0xab; 4096], GuestAddress(DATA))
        .unwrap();
    let (used, st) = r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 4096, 0), status()]);
    assert_eq!((used, st), (1, VIRTIO_BLK_S_OK as u8));
    assert!(std::fs::read(&r.path).unwrap()[..4096]
        .iter()
        .all(|b| *b == 0xab));
    r.mem.write_slice(&[0; 4096], GuestAddress(DATA)).unwrap();
    r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 4096, W), status()]);
    let mut got = vec![0u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got.iter().all(|b| *b == 0xab));
    assert_eq!(r.dev.cache.stats().hits, 1);
}

#[test]
fn discard_zeroes_and_drops_the_cached_block() {
    let r = rig(1 << 20);
    r.run(VIRTIO_BLK_T_IN, 8, &[hdr(), d(DATA, 4096, W), status()]);
    let seg = Segment {
        sector: 8,
        num_sectors: 8,
        flags: 0,
    };
    r.mem.write_obj(seg, GuestAddress(DATA)).unwrap();
    let (_, st) = r.run(VIRTIO_BLK_T_DISCARD, 0, &[hdr(), d(DATA, 16, 0), status()]);
    assert_eq!(st, VIRTIO_BLK_S_OK as u8);
    r.run(VIRTIO_BLK_T_IN, 8, &[hdr(), d(DATA, 4096, W), status()]);
    let mut got = vec![1u8; 4096];
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got.iter().all(|b| *b == 0));
    assert_eq!(r.dev.cache.stats().invalidations, 1);
}

#[test]
fn a_read_of_part_of_a_block_goes_through_the_cache_too() {
    let r = rig(1 << 20);
    for _ in 0..2 {
        let (_, st) = r.run(VIRTIO_BLK_T_IN, 10, &[hdr(), d(DATA, 1024, W), status()]);
        assert_eq!(st, 0);
        let mut got = vec![0u8; 1024];
        r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        assert!(got.iter().all(|b| *b == 1));
    }
    let s = r.dev.cache.stats();
    assert_eq!((s.misses, s.hits), (1, 1));
}

#[test]
fn get_id_and_flush() {
    let r = rig(0);
    let (used, st) = r.run(VIRTIO_BLK_T_GET_ID, 0, &[hdr(), d(DATA, 20, W), status()]);
    assert_eq!((used, st), (6, VIRTIO_BLK_S_OK as u8));
    let mut id = [0u8; 5];
    r.mem.read_slice(&mut id, GuestAddress(DATA)).unwrap();
    assert_eq!(&id, b"disk0");
    assert_eq!(r.run(VIRTIO_BLK_T_FLUSH, 0, &[hdr(), status()]).1, 0);
}

#[test]
fn malformed_requests_get_an_error_status_and_nothing_moves() {
    let r = rig(1 << 20);
    let before = std::fs::read(&r.path).unwrap();
    let ioerr = VIRTIO_BLK_S_IOERR as u8;
    // Past the end of the 1 MiB disk.
    assert_eq!(
        r.run(VIRTIO_BLK_T_IN, 2047, &[hdr(), d(DATA, 4096, W), status()])
            .1,
        ioerr
    );
    assert_eq!(
        r.run(
            VIRTIO_BLK_T_OUT,
            u64::MAX / 256,
            &[hdr(), d(DATA, 512, 0), status()]
        )
        .1,
        ioerr
    );
    // Not whole sectors.
    assert_eq!(
        r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 100, 0), status()])
            .1,
        ioerr
    );
    // A header of 8 bytes.
    assert_eq!(
        r.run(
            VIRTIO_BLK_T_IN,
            0,
            &[d(HDR, 8, 0), d(DATA, 512, W), status()]
        )
        .1,
        ioerr
    );
    // An unknown type.
    assert_eq!(
        r.run(99, 0, &[hdr(), status()]).1,
        VIRTIO_BLK_S_UNSUPP as u8
    );
    // No writable byte for the status: dropped, nothing written.
    let (used, st) = r.run(VIRTIO_BLK_T_OUT, 0, &[hdr(), d(DATA, 512, 0)]);
    assert_eq!((used, st), (0, 0xff));
    // Data outside guest memory.
    assert_eq!(
        r.run(
            VIRTIO_BLK_T_IN,
            0,
            &[hdr(), d(0x100_0000, 512, W), status()]
        )
        .0,
        0
    );
    // Too many discard segments.
    let (_, st) = r.run(
        VIRTIO_BLK_T_DISCARD,
        0,
        &[hdr(), d(DATA, 16 * 17, 0), status()],
    );
    assert_eq!(st, ioerr);
    assert_eq!(std::fs::read(&r.path).unwrap(), before);
}

#[test]
fn timed_requests_are_classed_and_only_a_miss_spends_time_on_the_disk() {
    let r = rig(1 << 20);
    let read = [hdr(), d(DATA, 4096, W), status()];
    let mut laps = Vec::new();
    for _ in 0..2 {
        let mut lap = Lap::start();
        assert_eq!(r.run_timed(VIRTIO_BLK_T_IN, 8, &read, &mut lap).1, 0);
        assert_eq!(lap.ns(Phase::Map), 0, "the page map waits for the answer");
        r.dev.finish(&mut lap);
        r.dev.timing.add(&lap);
        laps.push(lap);
    }
    assert_eq!(
        (laps[0].class, laps[1].class),
        (Class::ReadMiss, Class::ReadHit)
    );
    assert!(laps[0].ns(Phase::Disk) > 0, "the miss read the file");
    assert_eq!(laps[1].ns(Phase::Disk), 0, "the hit did not");
    for p in [
        Phase::Ring,
        Phase::Parse,
        Phase::Cache,
        Phase::Copy,
        Phase::Map,
    ] {
        assert!(laps[1].ns(p) > 0, "the hit went through {}", p.name());
    }
    let mut lap = Lap::start();
    r.run_timed(
        VIRTIO_BLK_T_OUT,
        8,
        &[hdr(), d(DATA, 4096, 0), status()],
        &mut lap,
    );
    assert_eq!(lap.class, Class::Write);
    assert!(lap.ns(Phase::Disk) > 0);
    let mut lap = Lap::start();
    r.run_timed(VIRTIO_BLK_T_FLUSH, 0, &[hdr(), status()], &mut lap);
    assert_eq!(lap.class, Class::Other);
    let t = r.dev.timing.report();
    assert_eq!(
        (
            t.classes["read_hit"].requests,
            t.classes["read_miss"].requests
        ),
        (1, 1)
    );
}

/// The backend's own cost of a 4 KiB cache hit, natively (no guest, no syscalls of
/// the event loop), with and without the clock reads of its timing, and where it
/// goes: `cargo test --release -p rebound-blk --lib hit_path_cost -- --ignored
/// --nocapture`.
#[test]
#[ignore]
fn hit_path_cost() {
    let r = rig(1 << 20);
    let read = [hdr(), d(DATA, 4096, W), status()];
    r.run(VIRTIO_BLK_T_IN, 8, &read);
    let n = 20_000;
    let round = |on: bool| {
        let (mut busy, mut answered) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        for _ in 0..n {
            let h = Header {
                kind: VIRTIO_BLK_T_IN,
                ioprio: 0,
                sector: 8,
            };
            r.mem.write_obj(h, GuestAddress(HDR)).unwrap();
            let q = MockSplitQueue::new(&r.mem, 16);
            let chain = q.build_desc_chain(&read).unwrap();
            let t0 = std::time::Instant::now();
            let mut lap = if on { Lap::at(t0) } else { Lap::off() };
            r.dev.execute_timed(chain, &mut lap);
            answered += t0.elapsed();
            r.dev.finish(&mut lap);
            if on {
                r.dev.timing.add(&lap);
            }
            busy += t0.elapsed();
        }
        let per = |d: std::time::Duration| d.as_nanos() as f64 / n as f64;
        (per(answered), per(busy))
    };
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        off.push(round(false));
        on.push(round(true));
    }
    off.sort_by(|a, b| a.1.total_cmp(&b.1));
    on.sort_by(|a, b| a.1.total_cmp(&b.1));
    let t = r.dev.timing.report();
    let hit = &t.classes["read_hit"];
    println!(
        "4 KiB hit, median of 5 x {n}, ns to the answer / with the page map after it: untimed {:.0} / {:.0}, timed {:.0} / {:.0} ({:.0} ns of clock reads at {:.1} ns each)",
        off[2].0,
        off[2].1,
        on[2].0,
        on[2].1,
        hit.clock_us(t.clock_ns) * 1000.0,
        t.clock_ns
    );
    println!("timed: {}", hit.line(t.clock_ns));
    assert_eq!(r.dev.cache.stats().misses, 1);
}

#[test]
fn a_page_map_update_left_after_the_answer_is_done_before_the_next_request() {
    let r = rig(1 << 20);
    r.dev.reconfigure(1 << 20, true);
    let read = |sector: u64| [hdr(), d(DATA + sector * 512, 4096, W), status()];
    r.run_timed(VIRTIO_BLK_T_IN, 16, &read(16), &mut Lap::off());
    assert!(
        r.dev.pages.lock().unwrap().is_empty(),
        "answered, not yet mapped"
    );
    // The backend finishes after the signal; a thread that did not, before its next.
    r.run_timed(VIRTIO_BLK_T_FLUSH, 0, &[hdr(), status()], &mut Lap::off());
    assert_eq!(r.dev.pages.lock().unwrap().len(), 1);
    assert_eq!(
        r.dev
            .evicted_in(DATA / PAGE + 16 / 8, Page::InGuest, &r.mem),
        Ok(())
    );
    // Another device on the same thread never applies it to its own page map.
    let other = rig(1 << 20);
    r.run_timed(VIRTIO_BLK_T_IN, 24, &read(24), &mut Lap::off());
    other.dev.finish(&mut Lap::off());
    assert!(other.dev.pages.lock().unwrap().is_empty());
}

#[test]
fn pages_read_before_the_cache_turned_exclusive_are_checked_against_the_disk() {
    // Inclusive, then none, then exclusive: the map is kept in every mode, hashed
    // only in the last.
    for before in [1 << 20, 0] {
        let r = rig(before);
        r.run(VIRTIO_BLK_T_IN, 16, &[hdr(), d(DATA, 12288, W), status()]);
        let m = *r.dev.pages.lock().unwrap().get(DATA / PAGE).unwrap();
        assert_eq!((m.block, m.hash), (2, None), "no hash outside exclusive");
        r.dev.reconfigure(1 << 20, true);
        let evict = |gpa: u64| r.dev.evicted_in(gpa / PAGE, Page::InGuest, &r.mem);
        // As read: equal to the disk, admitted.
        assert_eq!(evict(DATA), Ok(()));
        // Scribbled on since: the disk says otherwise.
        r.mem
            .write_slice(&[0x55; 4096], GuestAddress(DATA + 4096))
            .unwrap();
        assert_eq!(evict(DATA + 4096), Err(Refusal::ContentChanged));
        // The file changed under the mapping (not through this backend): the page no
        // longer equals its block, so it is not admitted as the block.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&r.path)
            .and_then(|f| {
                use std::os::unix::fs::FileExt;
                f.write_all_at(&[0x66; 4096], 4 * 4096)
            })
            .unwrap();
        assert_eq!(evict(DATA + 8192), Err(Refusal::ContentChanged));
        let mut got = vec![0u8; 4096];
        assert!(r.dev.cache.get(2, &mut got));
        assert!(got.iter().all(|b| *b == 2), "block 2 as on the disk");
        // Read now, while exclusive: hashed.
        r.run(VIRTIO_BLK_T_IN, 40, &[hdr(), d(DATA, 4096, W), status()]);
        assert!(r
            .dev
            .pages
            .lock()
            .unwrap()
            .get(DATA / PAGE)
            .unwrap()
            .hash
            .is_some());
    }
}

#[test]
fn a_read_of_cached_and_uncached_blocks_takes_each_from_where_it_is() {
    let r = rig(1 << 20);
    // Blocks 2 and 5 cached; then one request over blocks 0..8.
    for sector in [16, 40] {
        r.run(
            VIRTIO_BLK_T_IN,
            sector,
            &[hdr(), d(DATA, 4096, W), status()],
        );
    }
    let (used, st) = r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 8 * 4096, W), status()]);
    assert_eq!((used, st), (8 * 4096 + 1, VIRTIO_BLK_S_OK as u8));
    let mut got = vec![0u8; 8 * 4096];
    r.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    for (i, block) in got.chunks(4096).enumerate() {
        assert!(block.iter().all(|b| *b == i as u8), "block {i}");
    }
    let s = r.dev.cache.stats();
    assert_eq!((s.hits, s.misses), (2, 2 + 6));
    // Exclusive: a hit leaves the cache; the runs of misses around it still come in.
    r.dev.reconfigure(1 << 20, true);
    r.run(VIRTIO_BLK_T_IN, 0, &[hdr(), d(DATA, 8 * 4096, W), status()]);
    let s = r.dev.cache.stats();
    assert_eq!((s.hits, s.held_bytes), (2 + 8, 0));
}

/// Whether this thread's bounce buffer was used since the last call (it is made on
/// first use).
fn bounced() -> bool {
    BUF.with(|b| b.borrow_mut().take().is_some())
}

#[test]
fn a_miss_goes_straight_into_aligned_guest_buffers_and_equals_the_file() {
    let r = rig_on(0, true);
    let mut content = vec![0u8; 1 << 20];
    content.iter_mut().for_each(|b| *b = fastrand::u8(..));
    std::fs::write(&r.path, &content).unwrap();
    assert_eq!(
        r.dev.disk.align(),
        crate::disk::DIRECT_ALIGN,
        "O_DIRECT here"
    );
    // 1 MiB from sector 0 into three page-aligned buffers, out of address order.
    let read = [
        hdr(),
        d(DATA + 0x8_0000, 0x4_0000, W),
        d(DATA, 0x8_0000, W),
        d(DATA + 0xc_0000, 0x4_0000, W),
        status(),
    ];
    bounced();
    assert_eq!(r.run(VIRTIO_BLK_T_IN, 0, &read), ((1 << 20) + 1, 0));
    assert!(!bounced(), "read straight into guest memory");
    let got = |gpa: u64, n: usize| {
        let mut b = vec![0u8; n];
        r.mem.read_slice(&mut b, GuestAddress(gpa)).unwrap();
        b
    };
    assert_eq!(got(DATA + 0x8_0000, 0x4_0000), content[..0x4_0000]);
    assert_eq!(got(DATA, 0x8_0000), content[0x4_0000..0xc_0000]);
    assert_eq!(got(DATA + 0xc_0000, 0x4_0000), content[0xc_0000..]);
    let s = r.dev.cache.stats();
    assert_eq!((s.misses, s.read_bytes), (256, 1 << 20));
    // A buffer off the page: through the backend's buffer, the same bytes.
    let odd = [hdr(), d(DATA + 512, 0x2000, W), status()];
    assert_eq!(r.run(VIRTIO_BLK_T_IN, 16, &odd), (0x2001, 0));
    assert!(bounced(), "O_DIRECT cannot read into it");
    assert_eq!(got(DATA + 512, 0x2000), content[0x2000..0x4000]);
}

#[test]
fn a_cache_that_keeps_misses_reads_them_through_the_buffer_and_hits_go_to_the_guest() {
    let r = rig_on(1 << 20, true);
    let read = [
        hdr(),
        d(DATA, 0x4000, W),
        d(DATA + 0x10000, 0x4000, W),
        status(),
    ];
    bounced();
    r.run(VIRTIO_BLK_T_IN, 0, &read);
    assert!(
        bounced(),
        "the cache's copy is taken from the host's buffer"
    );
    r.mem
        .write_slice(&[0xee; 0x4000], GuestAddress(DATA))
        .unwrap();
    r.run(VIRTIO_BLK_T_IN, 0, &read);
    assert!(!bounced(), "hits are copied from the cache into the guest");
    let mut got = vec![0u8; 0x4000];
    for (gpa, first) in [(DATA, 0u8), (DATA + 0x10000, 4)] {
        r.mem.read_slice(&mut got, GuestAddress(gpa)).unwrap();
        for (i, b) in got.chunks(4096).enumerate() {
            assert!(
                b.iter().all(|x| *x == first + i as u8),
                "block {i} at {gpa:#x}"
            );
        }
    }
    let s = r.dev.cache.stats();
    assert_eq!((s.misses, s.hits, s.admissions), (8, 8, 8));
}
