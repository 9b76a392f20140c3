use super::*;
use crate::pcap::tests::{tcp_frame, DumpBuilder};
use crate::pcap::TcpFlags;

pub(crate) const TWO: &str = r#"
    [network]
    subnet = "10.0.0.0/24"
    [defaults]
    memory = "192M"
    workload = "peer"
    [[host]]
    name = "h1"
    simulated = true
    [[host]]
    name = "h2"
    simulated = true
    [[vm]]
    name = "n1"
    host = "h1"
    ip = "10.0.0.1"
    [[vm]]
    name = "n2"
    host = "h2"
    ip = "10.0.0.2"
"#;

/// A manifest of cluster `TWO` whose VMs paused 20 ms apart.
pub(crate) fn two() -> Manifest {
    let spec = ClusterSpec::parse(TWO, "c").unwrap();
    let vms = spec
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| ManifestVm {
            vm: v.name.clone(),
            host: v.host.clone(),
            ip: v.ip,
            mac: format!("52:54:00:00:00:0{}", i + 1),
            dir: v.name.clone(),
            snapshot: serde_json::json!({ "paused_unix_ns": 1_000_000_000 + i as i64 * 20_000_000 }),
            in_flight: 0,
        })
        .collect();
    Manifest::new(spec, crate::spec::PEER_PORT, 2.5, 7, vms)
}

fn text(m: &Value) -> Vec<u8> {
    serde_json::to_vec(m).unwrap()
}

fn parse(bytes: &[u8]) -> Result<Manifest, SnapshotError> {
    Manifest::parse(Path::new("/snap/cluster.json"), bytes)
}

#[test]
fn a_written_manifest_reads_back_with_its_spread_and_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let m = two();
    assert!(
        (m.pause_spread_s - 0.02).abs() < 1e-9,
        "{}",
        m.pause_spread_s
    );
    m.write(dir.path()).unwrap();
    assert!(!dir.path().join("cluster.json.tmp").exists());
    let back = Manifest::read(dir.path()).unwrap();
    assert_eq!(
        serde_json::to_value(&back).unwrap(),
        serde_json::to_value(&m).unwrap()
    );
    // The keys a user's tools read stay what they were.
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(MANIFEST)).unwrap()).unwrap();
    assert_eq!(v["format"], "rebound-cluster-snapshot");
    assert_eq!(v["version"], 1);
    for k in [
        "cluster",
        "peer_port",
        "all_held_after_s",
        "pause_spread_s",
        "stop_at_unix_ns",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
    for k in ["vm", "host", "ip", "mac", "dir", "snapshot", "in_flight"] {
        assert!(v["vms"][0].get(k).is_some(), "{k}");
    }
}

#[test]
fn a_directory_without_a_manifest_is_no_cluster_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let e = Manifest::read(dir.path()).unwrap_err();
    assert!(matches!(e, SnapshotError::NoManifest(..)), "{e}");
    assert!(
        e.to_string()
            .ends_with("is not a cluster snapshot (no cluster.json)"),
        "{e}"
    );
}

#[test]
fn malformed_manifests_are_refused_with_what_is_wrong() {
    let good = serde_json::to_value(two()).unwrap();
    let full = text(&good);
    assert!(parse(&full).is_ok());

    // Truncated anywhere: not JSON.
    for cut in [0, 1, full.len() / 2, full.len() - 1] {
        let e = parse(&full[..cut]).unwrap_err();
        assert!(matches!(e, SnapshotError::Json(..)), "cut {cut}: {e}");
    }
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        f(&mut v);
        parse(&text(&v)).unwrap_err()
    };
    // Another file's magic, or none.
    let e = with(&|v| v["format"] = "rebound-snapshot".into());
    assert_eq!(
        e.to_string(),
        "/snap/cluster.json is not a cluster snapshot manifest"
    );
    let e = with(&|v| {
        v.as_object_mut().unwrap().remove("format");
    });
    assert!(matches!(e, SnapshotError::Format(_)), "{e}");
    // Another version, or a version that is no number.
    let e = with(&|v| v["version"] = 2.into());
    assert_eq!(
        e.to_string(),
        "/snap/cluster.json has version 2; this build reads version 1"
    );
    assert!(matches!(
        with(&|v| v["version"] = "1".into()),
        SnapshotError::Version { .. }
    ));
    // Fields of the wrong type.
    assert!(matches!(
        with(&|v| v["vms"] = 3.into()),
        SnapshotError::Fields(..)
    ));
    assert!(matches!(
        with(&|v| v["vms"][0]["ip"] = "10.0.0.300".into()),
        SnapshotError::Fields(..)
    ));
    // No VM, a VM twice, a directory outside the snapshot.
    assert!(matches!(
        with(&|v| v["vms"] = serde_json::json!([])),
        SnapshotError::NoVms(_)
    ));
    let e = with(&|v| v["vms"][1]["vm"] = "n1".into());
    assert_eq!(
        e.to_string(),
        "/snap/cluster.json: VM \"n1\" is listed twice"
    );
    for dir in ["", ".", "..", "../n1", "a/b"] {
        let e = with(&|v| v["vms"][0]["dir"] = dir.into());
        assert!(matches!(e, SnapshotError::Outside { .. }), "{dir:?}: {e}");
    }
}

#[test]
fn an_oversized_manifest_is_refused_before_it_is_parsed() {
    // Valid JSON, but past the cap: the size alone decides.
    let mut big = b"{\"pad\":\"".to_vec();
    big.resize(MANIFEST_MAX as usize + 1, b'x');
    big.extend_from_slice(b"\"}");
    assert!(matches!(parse(&big), Err(SnapshotError::TooLarge(_))));
    // Read from a file, only one byte past the cap is read.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(MANIFEST), &big).unwrap();
    assert!(matches!(
        Manifest::read(dir.path()),
        Err(SnapshotError::TooLarge(_))
    ));
}

#[test]
fn every_vm_stops_at_one_instant_after_its_sample_and_the_margin() {
    assert_eq!(stop_at(10, 2.0), 10 + 3_500_000_000);
    // A negative sample is none.
    assert_eq!(stop_at(10, -1.0), 10 + 1_500_000_000);
}

/// n1 sent n2 three requests after the cut, but its tx dump holds only the first two:
/// the third, in n2's rx dump alone, was in flight at the cut.
#[test]
fn traffic_gives_the_graph_and_the_frames_in_flight_which_are_kept_per_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = two();
    let psh = TcpFlags::PSH | TcpFlags::ACK;
    let (mut n1_tx, mut n2_rx) = (DumpBuilder::new(), DumpBuilder::new());
    for t in 0..3u64 {
        let f = tcp_frame(1, 2, psh, 100 + t as usize);
        if t < 2 {
            n1_tx.record(t, &f);
        }
        n2_rx.record(t, &f);
    }
    for v in &m.vms {
        std::fs::create_dir_all(dir.path().join(&v.dir)).unwrap();
    }
    let empty = DumpBuilder::new();
    for (vm, q, b) in [
        ("n1", "tx", &n1_tx),
        ("n1", "rx", &empty),
        ("n2", "tx", &empty),
        ("n2", "rx", &n2_rx),
    ] {
        std::fs::write(dir.path().join(vm).join(format!("net1-{q}.pcap")), &b.bytes).unwrap();
    }
    let t = traffic_of(dir.path(), &m, 1).unwrap();
    assert_eq!(t.rdg.edges.len(), 1);
    assert_eq!(
        (
            t.rdg.edges[0].sender.as_str(),
            t.rdg.edges[0].receiver.as_str()
        ),
        ("n1", "n2")
    );
    assert_eq!(t.in_flight.len(), 1);
    m.keep_in_flight(dir.path(), &t.in_flight).unwrap();
    assert_eq!((m.vms[0].in_flight, m.vms[1].in_flight), (0, 1));
    assert!(!dir.path().join("n1").join(INFLIGHT).exists());
    let files = m.replay_files(dir.path());
    assert_eq!(files.keys().collect::<Vec<_>>(), ["n2"]);
    assert!(files["n2"].exists());
    assert_eq!(m.in_flight(), 1);

    // A dump that is not one names its file.
    std::fs::write(dir.path().join("n2").join("net1-rx.pcap"), b"junk").unwrap();
    let e = traffic_of(dir.path(), &m, 1).err().unwrap();
    assert!(
        matches!(e, SnapshotError::Dump(ref p, _) if p.ends_with("n2/net1-rx.pcap")),
        "{e}"
    );
}
