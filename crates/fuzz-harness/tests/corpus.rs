//! Every fuzz target's corpus (`fuzz/corpus/<target>/`), run on stable through the
//! same entry point the fuzzer calls: no input may panic; seeds named `ok-*` must be
//! accepted (and, where the format has an encoder, encode back to the same bytes),
//! seeds named `bad-*` refused. Unprefixed inputs (crashes the fuzzer found, dumps
//! cut short) must only not panic.

use std::path::PathBuf;

use rebound_fuzz_harness::{corpus_dir, TARGETS, TRACE_BLOCK_PAGES};

fn seeds(target: &str) -> Vec<(String, PathBuf)> {
    let dir = corpus_dir(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), e.path())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_corpus_input_is_parsed_without_a_panic_and_seeds_get_their_verdict() {
    let mut total = 0u64;
    for (target, run) in TARGETS {
        let seeds = seeds(target);
        assert!(
            seeds.iter().any(|(n, _)| n.starts_with("ok-")),
            "{target}: no valid seed"
        );
        for (name, path) in seeds {
            let data = std::fs::read(&path).unwrap();
            total += data.len() as u64;
            let verdict = run(&data);
            if name.starts_with("ok-") {
                assert!(verdict.is_ok(), "{target}/{name} refused: {verdict:?}");
            } else if name.starts_with("bad-") {
                assert!(verdict.is_err(), "{target}/{name} accepted");
            }
        }
    }
    assert!(
        total < 1 << 20,
        "the corpus is {total} bytes, keep it under 1 MiB"
    );
}

fn ok_seeds(target: &str) -> impl Iterator<Item = (String, Vec<u8>)> {
    seeds(target)
        .into_iter()
        .filter(|(n, _)| n.starts_with("ok-"))
        .map(|(n, p)| (n, std::fs::read(p).unwrap()))
}

/// `data` as a file `name` in a new temporary directory: the directory (removed when
/// dropped) and the file's path.
fn in_file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(name);
    std::fs::write(&p, data).unwrap();
    (dir, p)
}

#[test]
fn valid_traces_write_back_the_same_bytes() {
    for (name, data) in ok_seeds("snapshot_trace") {
        let (dir, p) = in_file("t", &data);
        let t = rebound_snapshot::Trace::read_blocks(&p, TRACE_BLOCK_PAGES).unwrap();
        let q = dir.path().join("again");
        t.write(&q).unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), data, "{name}");
    }
}

#[test]
fn valid_page_sums_write_back_the_same_bytes() {
    use rebound_snapshot::pagesums::{read, write};
    for (name, data) in ok_seeds("page_sums") {
        let (dir, p) = in_file("s", &data);
        let hash = rebound_snapshot::hash_file(&p).unwrap();
        let entry = rebound_snapshot::FileEntry {
            file: "s".into(),
            size: hash.size,
            checksum: hash.checksum,
        };
        let sums = read(&p, &entry, (data.len() as u64 - 24) / 8).unwrap();
        let q = dir.path().join("again");
        let again = write(&q, &sums).unwrap();
        assert_eq!(std::fs::read(&q).unwrap(), data, "{name}");
        assert_eq!(again.checksum, entry.checksum, "{name}");
    }
}

#[test]
fn valid_manifests_serialize_back_the_same_bytes() {
    for (name, data) in ok_seeds("snapshot_manifest") {
        let m: rebound_snapshot::Manifest = serde_json::from_slice(&data).unwrap();
        assert_eq!(serde_json::to_vec_pretty(&m).unwrap(), data, "{name}");
    }
}

#[test]
fn valid_pcaps_write_back_the_same_bytes() {
    use rebound_cluster::pcap::{write_pcap, PcapOptions, PcapReader};
    for (name, data) in ok_seeds("pcap") {
        let records: Vec<_> = PcapReader::new(&data[..], PcapOptions::default())
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let pairs: Vec<(u64, &[u8])> = records
            .iter()
            .map(|r| (r.timestamp_us, &r.data[..]))
            .collect();
        let mut out = Vec::new();
        write_pcap(&mut out, &pairs).unwrap();
        assert_eq!(out, data, "{name}");
    }
}

#[test]
fn valid_ha_frames_encode_back_the_same_bytes() {
    use hareplica::wire::{encode, FrameReader};
    for (name, data) in ok_seeds("ha_frame") {
        let reader = FrameReader::default();
        let mut input = &data[..];
        let mut out = Vec::new();
        let mut frame = Vec::new();
        while !input.is_empty() {
            encode(&reader.read(&mut input).unwrap(), &mut frame);
            out.extend_from_slice(&frame);
        }
        assert_eq!(out, data, "{name}");
    }
}

#[test]
fn valid_dumps_inspect_as_complete() {
    for (name, data) in ok_seeds("dump_header") {
        let (_dir, p) = in_file("vmcore", &data);
        let info = rebound_dump::inspect(&p).unwrap();
        assert!(info.complete && info.missing.is_empty(), "{name}: {info:?}");
    }
}

#[test]
fn every_fuzz_target_has_an_entry_point_and_a_corpus() {
    let dir = corpus_dir("").join("../fuzz_targets");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().replace(".rs", ""))
        .collect();
    files.sort();
    let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(files, names);
    for n in names {
        let src = std::fs::read_to_string(dir.join(format!("{n}.rs"))).unwrap();
        assert!(
            src.contains(&format!("rebound_fuzz_harness::{n}(")),
            "{n}.rs calls another entry point"
        );
    }
}
