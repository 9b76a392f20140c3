//! One entry point per parser of untrusted bytes, each calling the public function
//! production code calls. The cargo-fuzz targets in `fuzz/` are one line each over
//! these, and `tests/corpus.rs` runs every file of `fuzz/corpus/<target>/` through the
//! same function on stable, so a crash the fuzzer found stays fixed.
//!
//! Each entry point returns whether the input was accepted as a whole (`Ok`) or
//! refused (`Err`, the parser's message): the corpus test checks that the seeds named
//! `ok-*` are accepted and those named `bad-*` refused. A panic, an overflow, a huge
//! allocation or a hang is the bug either way.
//!
//! Where a parser takes a path, the bytes go to a file in a per-process scratch
//! directory (under `$TMPDIR`) first. Where a checksum or a MAC guards the parser, an
//! input is also tried with the guard made right, so the checks behind it are reached.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};

mod ring;
mod snapshot;

pub use snapshot::{
    page_sums, snapshot_fixture, snapshot_manifest, snapshot_trace, TRACE_BLOCK_PAGES,
};

/// What a parser said about one input.
pub type Verdict = Result<(), String>;

/// A target's entry point.
pub type Target = fn(&[u8]) -> Verdict;

/// Every target: its name (the cargo-fuzz target and corpus directory) and entry point.
pub const TARGETS: &[(&str, Target)] = &[
    ("agent_msg", agent_msg),
    ("snapshot_manifest", snapshot_manifest),
    ("snapshot_trace", snapshot_trace),
    ("pcap", pcap),
    ("store_record", store_record),
    ("evict_ring", evict_ring),
    ("dump_header", dump_header),
    ("ha_frame", ha_frame),
    ("device_state", device_state),
    ("return_path", return_path),
    ("page_sums", page_sums),
];

pub use ring::evict_ring;

thread_local! {
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// This process's scratch directory (made once; removed at thread exit where the
/// process exits normally).
pub(crate) fn scratch() -> PathBuf {
    SCRATCH.with(|s| {
        s.borrow_mut()
            .get_or_insert_with(|| {
                tempfile::Builder::new()
                    .prefix("rebound-fuzz-")
                    .tempdir()
                    .expect("a scratch directory under $TMPDIR")
            })
            .path()
            .to_path_buf()
    })
}

/// Writes `data` to `name` in the scratch directory and returns its path.
pub(crate) fn scratch_file(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    replace_file(&p, data);
    p
}

/// Writes a new file at `p` in place of the old one. Unlinked first: ext4 flushes a
/// file truncated and rewritten when it is closed, which made a run take milliseconds.
pub(crate) fn replace_file(p: &Path, data: &[u8]) {
    let _ = std::fs::remove_file(p);
    let mut f = std::fs::File::create(p).expect("scratch file");
    f.write_all(data).expect("scratch write");
}

/// A verdict's text: the error and its sources, as every edge prints them.
fn err(e: impl std::error::Error) -> String {
    rebound_errors::chain(&e)
}

/// The guest agent's channel: bytes split into lines as the daemon's link splits
/// them (in two reads, cut where the first byte says), each line parsed as a message;
/// a message that is a `ready` has its facts looked at as the daemon does.
pub fn agent_msg(data: &[u8]) -> Verdict {
    use rebound_vmm::agent::{parse_line, AgentMsg, LineSplitter};
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut split = LineSplitter::default();
    let mut lines = split.push(&data[..cut]);
    lines.extend(split.push(&data[cut..]));
    let mut verdict = Ok(());
    for line in lines {
        match line.and_then(|l| parse_line(&l)) {
            Ok(AgentMsg::Ready(info)) => {
                // The daemon reads the ring the guest announces through the ring reader,
                // which checks the placement itself (see `evict_ring`).
                let _ = (info.vmcoreinfo, info.evict_ring);
            }
            Ok(_) => {}
            Err(e) => verdict = verdict.and(Err(e.to_string())),
        }
    }
    verdict
}

/// A packet dump as `filter-dump` writes it: every record, and every frame under each
/// virtio-net header choice the reader offers.
pub fn pcap(data: &[u8]) -> Verdict {
    use rebound_cluster::pcap::{PcapOptions, PcapReader, VnetHdr};
    let mut verdict = Ok(());
    for vnet_hdr in [VnetHdr::Off, VnetHdr::Detect, VnetHdr::Len(10)] {
        let options = PcapOptions {
            vnet_hdr,
            ..PcapOptions::default()
        };
        let frames = match PcapReader::new(data, options) {
            Ok(r) => r.frames(),
            Err(e) => return Err(err(e)),
        };
        for f in frames {
            match f {
                Ok(f) => {
                    let _ = f.payload_len();
                }
                // Off is what Rebound's taps produce; the other choices only exercise.
                Err(e) if vnet_hdr == VnetHdr::Off => verdict = verdict.and(Err(err(e))),
                Err(_) => {}
            }
        }
    }
    verdict
}

/// The record kinds of the cluster store, in the order the first input byte picks
/// them (modulo their number).
pub const STORE_KINDS: &[&str] = &[
    "plan",
    "state",
    "phase",
    "host",
    "vm",
    "snapshots",
    "cluster",
];

/// One record of the cluster store as another host wrote it: the first byte picks
/// its kind ([`STORE_KINDS`]), the rest is its value, decoded under its key as the
/// daemons' view does (checks included), then applied to a view.
pub fn store_record(data: &[u8]) -> Verdict {
    use rebound_coord::layout;
    use rebound_coord::records::{
        decode, ClusterRecord, HostRecord, PhaseRecord, PlanRecord, SnapshotsRecord, StateRecord,
        VmRecord,
    };
    let Some((&k, value)) = data.split_first() else {
        return Err("empty input".into());
    };
    let kind = STORE_KINDS[k as usize % STORE_KINDS.len()];
    let key = match kind {
        "plan" => layout::plan("r1"),
        "state" => layout::state("r1"),
        "phase" => layout::phase("r1", "h1", "vm1"),
        "host" => layout::host_info("h1"),
        "vm" => layout::host_vm("h1", "vm1"),
        "snapshots" => layout::host_snapshots("h1"),
        _ => layout::cluster("c1"),
    };
    let verdict = match kind {
        "plan" => decode::<PlanRecord>(&key, value).map(|_| ()),
        "state" => decode::<StateRecord>(&key, value).map(|_| ()),
        "phase" => decode::<PhaseRecord>(&key, value).map(|_| ()),
        "host" => decode::<HostRecord>(&key, value).map(|_| ()),
        "vm" => decode::<VmRecord>(&key, value).map(|_| ()),
        "snapshots" => decode::<SnapshotsRecord>(&key, value).map(|_| ()),
        _ => decode::<ClusterRecord>(&key, value).map(|_| ()),
    }
    .map_err(err);
    let kv = rebound_store::KeyValue {
        key,
        value: value.to_vec(),
        create_revision: 1,
        mod_revision: 1,
        lease: 0,
    };
    let mut view = rebound_coord::view::ClusterView::default();
    view.apply(&rebound_store::Event::Put(kv));
    let _ = view.live();
    verdict
}

/// A vmcore read back: what `rebound dump inspect` reports, the pages a resumed dump
/// takes from it, and the notes of QEMU's register-only ELF.
pub fn dump_header(data: &[u8]) -> Verdict {
    use rebound_dump::{inspect, notes_from_qemu_elf, DumpPages};
    let path = scratch_file("vmcore", data);
    let verdict = inspect(&path).map(|_| ()).map_err(err);
    if let Ok(pages) = DumpPages::open(&path) {
        let mut buf = vec![0u8; 4096];
        // The first pages of the first extents: where a resumed dump starts reading.
        for r in pages.extents().into_iter().take(4) {
            for pfn in (r.start / 4096..r.end.div_ceil(4096)).take(4) {
                let _ = pages.read_page(pfn, &mut buf);
            }
        }
    }
    let _ = notes_from_qemu_elf(&path);
    let _ = rebound_dump::notes::parse_notes(data);
    verdict
}

/// The frame types of the HA protocol, in their wire order.
const HA_TYPES: [hareplica::wire::FrameType; 12] = {
    use hareplica::wire::FrameType::*;
    [
        Hello,
        Welcome,
        Attach,
        Image,
        Commit,
        Ack,
        Status,
        StatusReply,
        Promote,
        Error,
        CommitPart,
        CommitEnd,
    ]
};

/// A heap size for bounds checks of decoded commits (a backup's is the primary's).
const HA_HEAP: u64 = 1 << 20;

/// Frames between an HA primary and its backup. The input is read as the stream a
/// peer sent, frame after frame, as the backup's reader does (stopping at the first
/// refused one); then, past the checksum, the rest of it is decoded as the payload of
/// the frame type its first byte names.
pub fn ha_frame(data: &[u8]) -> Verdict {
    use hareplica::wire::{decode, FrameReader, Message};
    let look = |m: &Message| match m {
        Message::Commit(c) => {
            let _ = (c.out_of_bounds(HA_HEAP), c.data_bytes(), c.runs().count());
        }
        Message::Compact(c) => {
            if let Ok(c) = c.expand(1, 1) {
                let _ = (c.out_of_bounds(HA_HEAP), c.runs().count());
            }
        }
        _ => {}
    };
    let reader = FrameReader::default();
    let mut input = data;
    let mut verdict = Ok(());
    while !input.is_empty() {
        match reader.read(&mut input) {
            Ok(m) => look(&m),
            Err(e) => {
                verdict = Err(err(e));
                break;
            }
        }
    }
    if let Some((&t, rest)) = data.split_first() {
        let ty = HA_TYPES[usize::from(t) % HA_TYPES.len()];
        if let Ok(m) = decode(ty, rest.to_vec()) {
            look(&m);
        }
    }
    verdict
}

/// A snapshot's device state: QEMU's migration stream, read apart as a restore
/// through postcopy reads it.
pub fn device_state(data: &[u8]) -> Verdict {
    rebound_migstream::SnapshotStream::parse(data)
        .map(|_| ())
        .map_err(err)
}

/// The postcopy return path: what a destination's QEMU sends back to the page server,
/// read message after message as the server's reader reads it, each taking the bytes
/// it took off the front. A message cut short at the end is refused; a message that
/// takes no bytes, or more than are left, is the parser's bug.
pub fn return_path(data: &[u8]) -> Verdict {
    let mut rest = data;
    while !rest.is_empty() {
        let Some((_, took)) = rebound_migstream::rp::next(rest).map_err(err)? else {
            return Err(format!(
                "a truncated message: {} bytes left over",
                rest.len()
            ));
        };
        assert!(
            took > 0 && took <= rest.len(),
            "a message took {took} of the {} bytes left",
            rest.len()
        );
        rest = &rest[took..];
    }
    Ok(())
}

/// The corpus directory of a target in this repository.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}
