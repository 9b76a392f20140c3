//! Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/`: valid
//! inputs made by the project's own encoders and writers (`ok-*`), and a few
//! malformed ones (`bad-*`). Run it again after a format changes:
//! `cargo run --release -p rebound-fuzz-harness --bin rebound-fuzz-seeds`.
//! Inputs the fuzzer found (crashes, once fixed) are added by hand, unprefixed.

use std::path::Path;

use anyhow::{Context, Result};
use rebound_fuzz_harness::{corpus_dir, snapshot_fixture};

fn put(target: &str, name: &str, data: &[u8]) -> Result<()> {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    std::fs::write(dir.join(name), data).with_context(|| format!("{target}/{name}"))
}

fn agent() -> Result<()> {
    let ok: &[(&str, &str)] = &[
        (
            "ok-ready",
            r#"{"type":"ready","agent_version":1,"kernel_release":"6.1.0-28-amd64","mem_total_kib":200000,"vmcoreinfo":{"paddr":123,"size":4096},"evict_ring":{"gpa":8388608,"bytes":1048576},"workload":"web","service_port":8080,"uptime_ms":1500}"#,
        ),
        ("ok-heartbeat", r#"{"type":"heartbeat","seq":7}"#),
        (
            "ok-marker",
            r#"{"type":"marker","id":3,"paddr":1048576,"len":4096}"#,
        ),
        (
            "ok-cachelist",
            r#"{"type":"cachelist","id":2,"last":1,"files":"/data/a 0 3\n","cached_files":1,"cached_pages":3}"#,
        ),
        (
            "ok-memfill",
            r#"{"type":"memfill","filled_kib":1024,"rounds":1,"errors":0}"#,
        ),
        (
            "ok-error",
            r#"{"type":"error","message":"no such command"}"#,
        ),
        ("ok-rebooting", r#"{"type":"rebooting"}"#),
    ];
    let mut all = Vec::new();
    for (name, line) in ok {
        put("agent_msg", name, format!("{line}\n").as_bytes())?;
        all.extend_from_slice(line.as_bytes());
        all.extend_from_slice(b"\r\n");
    }
    put("agent_msg", "ok-stream", &all)?;
    put("agent_msg", "bad-truncated", b"{\"type\":\"ready\"\n")?;
    put(
        "agent_msg",
        "bad-not-utf8",
        b"{\"type\":\"error\",\"message\":\"\xff\xfe\"}\n",
    )?;
    put(
        "agent_msg",
        "bad-unknown-type",
        b"{\"type\":\"format-disk\"}\n",
    )?;
    put(
        "agent_msg",
        "bad-wrong-field-type",
        b"{\"type\":\"heartbeat\",\"seq\":-1}\n",
    )
}

fn snapshot() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let snap = snapshot_fixture(dir.path()).map_err(anyhow::Error::msg)?;
    let manifest = std::fs::read(snap.join("manifest.json"))?;
    put("snapshot_manifest", "ok-manifest.json", &manifest)?;
    let text = String::from_utf8(manifest.clone())?;
    let swaps = [
        (
            "bad-file-outside",
            "\"device.state\"",
            "\"../device.state\"",
        ),
        ("bad-version", "\"version\": 1", "\"version\": 9"),
        (
            "bad-chunk-size",
            "\"chunk_bytes\": 16384",
            "\"chunk_bytes\": 3",
        ),
        (
            "bad-ram-size",
            "\"size\": 65536",
            "\"size\": 18446744073709551615",
        ),
    ];
    for (name, from, to) in swaps {
        anyhow::ensure!(text.contains(from), "the fixture's manifest has no {from}");
        put(
            "snapshot_manifest",
            name,
            text.replacen(from, to, 1).as_bytes(),
        )?;
    }
    put(
        "snapshot_manifest",
        "bad-not-json",
        &manifest[..manifest.len() / 2],
    )?;

    let trace = std::fs::read(snap.join("trace.fafl"))?;
    put("snapshot_trace", "ok-trace.fafl", &trace)?;
    let t = rebound_snapshot::Trace {
        pages: (0..4)
            .map(|page| rebound_snapshot::TracePage { block: 1, page })
            .chain(
                (0..16)
                    .rev()
                    .map(|page| rebound_snapshot::TracePage { block: 0, page }),
            )
            .collect(),
    };
    let p = dir.path().join("t2");
    t.write(&p)?;
    put("snapshot_trace", "ok-two-blocks.fafl", &std::fs::read(&p)?)?;
    let mut flipped = trace.clone();
    flipped[24] ^= 1;
    put("snapshot_trace", "bad-checksum.fafl", &flipped)?;
    put(
        "snapshot_trace",
        "bad-truncated.fafl",
        &trace[..trace.len() - 3],
    )?;
    let mut huge = trace.clone();
    huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    put("snapshot_trace", "bad-count.fafl", &huge)
}

/// An Ethernet frame from `s` to `d` carrying IPv4 protocol `proto` with `l4`.
fn ipv4_frame(s: u8, d: u8, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![0x52, 0x54, 0, 0, 0, d, 0x52, 0x54, 0, 0, 0, s, 0x08, 0x00];
    let total = (20 + l4.len()) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, s, 10, 0, 0, d]);
    f.extend_from_slice(l4);
    f
}

fn pcap() -> Result<()> {
    use rebound_cluster::pcap::write_pcap;
    let mut tcp = vec![
        0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0,
    ];
    tcp.extend_from_slice(b"GET / HTTP/1.0\r\n\r\n");
    let udp = [0x13, 0x88, 0x13, 0x89, 0, 12, 0, 0, 1, 2, 3, 4];
    let mut arp = vec![
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0, 0, 0, 1, 0x08, 0x06,
    ];
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[
        0x52, 0x54, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ]);
    let a = ipv4_frame(1, 2, 6, &tcp);
    let b = ipv4_frame(2, 1, 17, &udp);
    let mut out = Vec::new();
    write_pcap(
        &mut out,
        &[
            (1_700_000_000_000_001, &a),
            (1_700_000_000_000_900, &b),
            (1_700_000_000_001_000, &arp),
        ],
    )?;
    put("pcap", "ok-tcp-udp-arp.pcap", &out)?;
    put("pcap", "cut-mid-record.pcap", &out[..out.len() - 10])?;
    let mut big = out.clone();
    big[24 + 8..24 + 16].copy_from_slice(&[0xff; 8]);
    put("pcap", "bad-incl-len.pcap", &big)?;
    let mut ng = out.clone();
    ng[..4].copy_from_slice(&[0x0a, 0x0d, 0x0d, 0x0a]);
    put("pcap", "bad-pcapng.pcap", &ng)?;
    put("pcap", "bad-short-header.pcap", &out[..20])
}

fn store() -> Result<()> {
    let with = |kind: u8, v: &[u8]| [&[kind][..], v].concat();
    let plan = br#"{"format":1,"plan":{"restore_id":"r1","vms":[{"vm":"vm1","host":"h1","ws_pages":100,"depends_on":["vm2"],"start_at_s":0.5},{"vm":"vm2","host":"h2","ws_pages":50}]},"submitted_unix_ns":1,"timeouts":{"load_s":300,"start_s":30,"restore_s":600}}"#;
    put("store_record", "ok-plan", &with(0, plan))?;
    put(
        "store_record",
        "bad-plan-truncated",
        &with(0, &plan[..plan.len() / 2]),
    )?;
    let v2 = String::from_utf8_lossy(plan).replace(r#""format":1"#, r#""format":2"#);
    put("store_record", "bad-plan-format", &with(0, v2.as_bytes()))?;
    let other =
        String::from_utf8_lossy(plan).replace(r#""restore_id":"r1""#, r#""restore_id":"r9""#);
    put(
        "store_record",
        "bad-plan-other-key",
        &with(0, other.as_bytes()),
    )?;
    let cycle =
        String::from_utf8_lossy(plan).replace(r#""depends_on":["vm2"]"#, r#""depends_on":["vm1"]"#);
    put(
        "store_record",
        "bad-plan-self-dependency",
        &with(0, cycle.as_bytes()),
    )?;
    put(
        "store_record",
        "ok-state",
        &with(1, br#"{"format":1,"restore_id":"r1","status":"aborting","began_unix_ns":5,"by":"h1","coordinators":["h1"],"reason":"host h2's lease expired","updated_unix_ns":6}"#),
    )?;
    put(
        "store_record",
        "ok-phase",
        &with(2, br#"{"format":1,"vm":"vm1","host":"h1","phase":"start","start_sent_unix_ns":9,"start_at_unix_ns":10}"#),
    )?;
    put(
        "store_record",
        "bad-phase-missing-instant",
        &with(
            2,
            br#"{"format":1,"vm":"vm1","host":"h1","phase":"starting"}"#,
        ),
    )?;
    put(
        "store_record",
        "ok-host",
        &with(
            3,
            br#"{"format":1,"host":"h1","version":"0.1.0","joined_unix_ns":1,"ttl_s":5.0}"#,
        ),
    )?;
    put(
        "store_record",
        "bad-host-path",
        &with(
            3,
            br#"{"format":1,"host":"../h2","version":"0.1.0","joined_unix_ns":1,"ttl_s":5.0}"#,
        ),
    )?;
    put(
        "store_record",
        "ok-vm",
        &with(4, br#"{"format":1,"vm":"vm1","state":"running","ready":true,"memory_mib":256,"updated_unix_ns":1}"#),
    )?;
    put(
        "store_record",
        "ok-cluster",
        &with(6, br#"{"format":1,"name":"c1","toml":"[network]\nsubnet = \"10.0.0.0/24\"\n","updated_unix_ns":1}"#),
    )?;
    put(
        "store_record",
        "bad-cluster-other-name",
        &with(
            6,
            br#"{"format":1,"name":"c2","toml":"","updated_unix_ns":1}"#,
        ),
    )?;
    put(
        "store_record",
        "ok-snapshots",
        &with(
            5,
            br#"{"format":1,"dirs":["/var/lib/rebound/snapshots/c1/vm1"],"updated_unix_ns":1}"#,
        ),
    )
}

/// A ring of `cap` entries as `guest/evict/ring.h` lays it out, in the evict_ring
/// target's input form (length, header page, entries), with notices 1..=`head`.
fn ring(cap: u64, head: u64, copies: bool, notices: &[(u64, u64)]) -> Vec<u8> {
    use rebound_guestmem::evict_ring::{ENTRIES_OFF, ENTRY, MAGIC, SLOT, VERSION};
    let bytes = (ENTRIES_OFF + cap * ENTRY) as u32;
    let mut h = vec![0u8; 576];
    h[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(ENTRY as u32).to_le_bytes());
    h[16..24].copy_from_slice(&cap.to_le_bytes());
    h[24..32].copy_from_slice(&head.to_le_bytes());
    if copies {
        h[32..36].copy_from_slice(&(SLOT as u32).to_le_bytes());
        h[36..40].copy_from_slice(&(cap as u32).to_le_bytes());
        h[40..44].copy_from_slice(&1u32.to_le_bytes());
        h[64..72].copy_from_slice(&(1u64 << 20).to_le_bytes());
    }
    h[44..48].copy_from_slice(&(ENTRIES_OFF as u32).to_le_bytes());
    let mut e = vec![0u8; (cap * ENTRY) as usize];
    for &(seq, info) in notices {
        let s = ((seq - 1) % cap * ENTRY) as usize;
        e[s..s + 8].copy_from_slice(&seq.to_le_bytes());
        e[s + 8..s + 16].copy_from_slice(&info.to_le_bytes());
    }
    [bytes.to_le_bytes().to_vec(), h, e].concat()
}

fn evict() -> Result<()> {
    let evicted = |pfn: u64| pfn | 1 << 56;
    let released = |pfn: u64| pfn | 2 << 56;
    let n = [
        (1, evicted(0x100)),
        (2, released(0x101)),
        (3, evicted(0x2000)),
        (4, evicted(7)),
    ];
    put("evict_ring", "ok-copies", &ring(8, 4, true, &n))?;
    put("evict_ring", "ok-notices-only", &ring(8, 4, false, &n))?;
    let wrapped: Vec<_> = (9..=13).map(|s| (s, evicted(s))).collect();
    put(
        "evict_ring",
        "ok-wrapped-lost",
        &ring(4, 13, true, &wrapped),
    )?;
    let mut magic = ring(8, 4, true, &n);
    magic[4] ^= 1;
    put("evict_ring", "bad-magic", &magic)?;
    let mut cap = ring(8, 4, true, &n);
    cap[4 + 16..4 + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    put("evict_ring", "bad-capacity", &cap)?;
    let mut chunks = ring(8, 4, true, &n);
    chunks[4 + 40..4 + 44].copy_from_slice(&65u32.to_le_bytes());
    put("evict_ring", "bad-chunks", &chunks)
}

fn dump(dir: &Path) -> Result<()> {
    use rebound_dump::{Compress, DumpOptions, Dumper, Format, Note};
    use rebound_guestmem::{GuestMemory, Layout};
    const RAM: u64 = 32 << 10;
    let ram = dir.join("ram");
    let mut bytes = vec![0u8; RAM as usize];
    for (i, b) in bytes.iter_mut().enumerate().skip(4096).take(8192) {
        *b = (i % 251) as u8;
    }
    std::fs::write(&ram, &bytes)?;
    let mem = GuestMemory::open_ram_file(&ram, Layout::with_below_4g(RAM, RAM)?)?;
    let notes = [Note::vmcoreinfo(
        "OSRELEASE=6.1.0-28-amd64\nPAGESIZE=4096\n",
    )];
    for (name, format) in [
        ("ok-elf", Format::Elf),
        (
            "ok-kdump-zlib",
            Format::Kdump {
                compress: Compress::Zlib,
            },
        ),
        (
            "ok-kdump-zstd",
            Format::Kdump {
                compress: Compress::Zstd,
            },
        ),
    ] {
        let out = dir.join(name);
        let opts = DumpOptions {
            format,
            chunk_bytes: 16 << 10,
            threads: 1,
            batch_fsync: 1,
        };
        struct Quiet;
        impl rebound_dump::Progress for Quiet {}
        Dumper::new(&mem)
            .notes(&notes)
            .write(&out, &opts, &mut Quiet)?;
        let data = std::fs::read(&out)?;
        put("dump_header", name, &data)?;
        if name == "ok-elf" {
            put("dump_header", "cut-elf", &data[..data.len() - 5000])?;
            let mut phnum = data.clone();
            phnum[56..58].copy_from_slice(&5000u16.to_le_bytes());
            put("dump_header", "bad-elf-phnum", &phnum)?;
        } else if name == "ok-kdump-zlib" {
            put("dump_header", "cut-kdump", &data[..data.len() / 2])?;
        }
    }
    put("dump_header", "bad-magic", b"MZ\x90\0not a vmcore")
}

fn ha() -> Result<()> {
    use hareplica::wire::compact::encode_compact_commit;
    use hareplica::wire::{encode, encode_commit, Hello, HelloKind, Message, Mode};
    use hareplica::DiffRun;
    let heap: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let runs = [
        DiffRun { offset: 16, len: 8 },
        DiffRun {
            offset: 4096,
            len: 100,
        },
    ];
    let mut frame = Vec::new();
    let mut hello = Vec::new();
    encode(
        &Message::Hello(Hello {
            kind: HelloKind::Fresh,
            mode: Mode::Async { max_lag: 64 },
            heap_size: 8192,
            epoch: 1,
        }),
        &mut hello,
    );
    let mut stream = hello.clone();
    encode_commit(1, 1, &runs, &heap, &mut frame).context("a commit")?;
    stream.extend_from_slice(&frame);
    let mut compact = Vec::new();
    encode_compact_commit(2, 1, &runs[..1], &heap, &mut compact).context("a compact commit")?;
    stream.extend_from_slice(&compact);
    for m in [Message::Ack { tx_id: 2 }, Message::Status, Message::Promote] {
        encode(&m, &mut frame);
        stream.extend_from_slice(&frame);
    }
    put("ha_frame", "ok-session", &stream)?;
    encode(
        &Message::Image {
            offset: 0,
            total: 8192,
            data: heap[..512].to_vec(),
        },
        &mut frame,
    );
    put("ha_frame", "ok-image", &frame)?;
    encode(
        &Message::Error {
            code: hareplica::wire::ErrorCode::Fenced,
            message: "fenced by a newer primary".into(),
        },
        &mut frame,
    );
    put("ha_frame", "ok-error", &frame)?;
    let mut crc = hello.clone();
    crc[13] ^= 1;
    put("ha_frame", "bad-crc", &crc)?;
    let mut len = hello.clone();
    len[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    put("ha_frame", "bad-oversized", &len)?;
    put(
        "ha_frame",
        "bad-compact-length",
        &[0xC3, 0xff, 0xff, 0xff, 0xff, 0x7f],
    )?;
    put("ha_frame", "bad-truncated", &stream[..stream.len() / 2])
}

fn device_state() -> Result<()> {
    let good = rebound_migstream::example::snapshot_stream();
    put("device_state", "ok-snapshot", &good)?;
    let mut magic = good.clone();
    magic[0] = b'X';
    put("device_state", "bad-magic", &magic)?;
    let mut version = good.clone();
    version[7] = 2;
    put("device_state", "bad-version", &version)?;
    let mut name = good.clone();
    name[9..13].copy_from_slice(&u32::MAX.to_be_bytes());
    put("device_state", "bad-oversized-name", &name)?;
    put("device_state", "bad-truncated", &good[..good.len() - 10])
}

/// A return-path message of type `ty` carrying `payload`, as QEMU frames it.
fn rp_message(ty: u16, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(payload.len()).expect("a short payload");
    [&ty.to_be_bytes()[..], &len.to_be_bytes(), payload].concat()
}

fn return_path() -> Result<()> {
    use rebound_migstream::rp::{msg, MAX_MESSAGE};
    // A page request's payload: the start and length of the bytes wanted.
    let request = |start: u64, len: u32| [&start.to_be_bytes()[..], &len.to_be_bytes()].concat();
    let mut named = request(0x5000, 4096);
    named.push(6);
    named.extend_from_slice(b"pc.ram");
    let session = [
        rp_message(msg::REQ_PAGES_ID, &named),
        rp_message(msg::REQ_PAGES, &request(0x9000, 8192)),
        rp_message(msg::PONG, &3u32.to_be_bytes()),
        rp_message(msg::SHUT, &0u32.to_be_bytes()),
    ]
    .concat();
    put("return_path", "ok-session", &session)?;
    put(
        "return_path",
        "ok-shut",
        &rp_message(msg::SHUT, &1u32.to_be_bytes()),
    )?;
    put(
        "return_path",
        "bad-oversized",
        &rp_message(msg::PONG, &[0; MAX_MESSAGE + 1]),
    )?;
    put(
        "return_path",
        "bad-wrong-length",
        &rp_message(msg::SHUT, &[0; 3]),
    )?;
    put("return_path", "bad-unknown-type", &rp_message(9, &[0; 4]))?;
    put(
        "return_path",
        "bad-truncated",
        &session[..session.len() - 2],
    )
}

fn page_sums(dir: &Path) -> Result<()> {
    use rebound_snapshot::pagesums::{sum, write};
    let mut page = vec![0u8; 4096];
    let mut sums = vec![sum(&page)];
    for b in [0x11, 0x22, 0x33] {
        page.fill(b);
        sums.push(sum(&page));
    }
    let p = dir.join("ram-pc.ram.pagesums");
    write(&p, &sums)?;
    let good = std::fs::read(&p)?;
    put("page_sums", "ok-four-pages", &good)?;
    let with = |at: usize, bytes: &[u8]| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    put("page_sums", "bad-magic", &with(0, b"RBPGSUMX"))?;
    put("page_sums", "bad-version", &with(8, &2u32.to_le_bytes()))?;
    put(
        "page_sums",
        "bad-page-size",
        &with(12, &512u32.to_le_bytes()),
    )?;
    put("page_sums", "bad-count", &with(16, &200u64.to_le_bytes()))?;
    put(
        "page_sums",
        "bad-oversized",
        &with(16, &u64::MAX.to_le_bytes()),
    )?;
    put("page_sums", "bad-truncated", &good[..good.len() - 3])?;
    put("page_sums", "bad-short-header", &good[..20])
}

fn main() -> Result<()> {
    agent()?;
    snapshot()?;
    pcap()?;
    store()?;
    evict()?;
    let dir = tempfile::tempdir()?;
    dump(dir.path())?;
    ha()?;
    device_state()?;
    return_path()?;
    page_sums(dir.path())?;
    for (target, _) in rebound_fuzz_harness::TARGETS {
        let d = corpus_dir(target);
        let n = std::fs::read_dir(&d)?.count();
        println!("{target}: {n} seeds in {}", d.display());
    }
    Ok(())
}
