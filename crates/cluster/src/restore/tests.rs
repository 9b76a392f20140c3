use super::*;
use crate::snapshot::tests::two;

/// The snapshot manifest of VM `vm` with NIC MAC `mac`, `ram_mib` of RAM and a trace
/// of `trace_pages` (none if 0).
fn snap(vm: &str, mac: &str, ram_mib: u64, trace_pages: u64) -> rebound_snapshot::Manifest {
    let trace = (trace_pages > 0).then(|| {
        serde_json::json!({
            "file": "trace.fafl", "pages": trace_pages, "source": "post-snapshot",
            "wss_sample_pages": null, "wss_snapshot_pages": trace_pages,
        })
    });
    serde_json::from_value(serde_json::json!({
        "format": "rebound-snapshot", "version": 1, "created": "2026-01-01T00:00:00Z",
        "vm": vm,
        "spec": { "nics": [format!("bridge=br0,mac={mac},ip=10.0.0.1/24")] },
        "qemu_version": "7.2.0", "machine": "pc-i440fx-7.2", "accel": "tcg",
        "ram_blocks": [{ "id": "pc.ram", "size": ram_mib << 20, "file": "ram.img",
                         "chunk_bytes": 1 << 20, "checksums": [], "data_bytes": 0 }],
        "device_state": { "file": "state", "size": 1, "checksum": "0" },
        "disks": [], "trace": trace, "pause_ms": 1.0,
    }))
    .unwrap()
}

/// Every VM's snapshot as it should be: 64 MiB, 1000 traced pages.
fn good(
    m: &Manifest,
) -> impl FnMut(&ClusterVm, &Path) -> Result<rebound_snapshot::Manifest, RestoreError> + '_ {
    move |cv, _| {
        let mv = m.vms.iter().find(|v| v.vm == cv.name).unwrap();
        Ok(snap(&cv.name, &mv.mac, 64, 1000))
    }
}

#[test]
fn figures_come_from_each_vms_own_snapshot() {
    let m = two();
    let from = Path::new("/snap");
    let mut seen = Vec::new();
    let mut open = good(&m);
    let figs = figures(&m.cluster, &m, from, |cv: &ClusterVm, dir: &Path| {
        seen.push(dir.to_path_buf());
        open(cv, dir)
    })
    .unwrap();
    assert_eq!(seen, [from.join("n1"), from.join("n2")]);
    assert_eq!(figs.len(), 2);
    let f = &figs[0];
    assert_eq!((f.vm.as_str(), f.host.as_str()), ("n1", "h1"));
    assert_eq!((f.trace_pages, f.total_pages), (1000, 64 * 256));
    assert!(
        f.elastic_pages >= 1 && f.elastic_pages <= 1000,
        "{}",
        f.elastic_pages
    );
    assert_eq!(f.load_rate, 0.0);
}

#[test]
fn a_snapshot_that_does_not_fit_the_cluster_stops_the_restore_before_anything_runs() {
    let from = Path::new("/snap");
    let err = |m: &Manifest,
               open: &mut dyn FnMut(
        &ClusterVm,
        &Path,
    ) -> Result<rebound_snapshot::Manifest, RestoreError>| {
        figures(&m.cluster, m, from, open).unwrap_err().to_string()
    };
    // A VM the cluster does not have.
    let mut m = two();
    m.vms[1].vm = "n9".into();
    let e = err(&m.clone(), &mut good(&two()));
    assert_eq!(
        e,
        "the cluster snapshot holds VM \"n9\", which cluster c does not have"
    );
    // A VM of the cluster the snapshot lacks.
    let mut m = two();
    m.cluster.vms[1].name = "n2".into();
    m.vms.pop();
    let e = err(&m.clone(), &mut good(&two()));
    assert_eq!(
        e,
        "VM \"n2\" of cluster c is not in the cluster snapshot /snap"
    );
    // Another address.
    let mut m = two();
    m.vms[0].ip = "10.0.0.9".parse().unwrap();
    let e = err(&m.clone(), &mut good(&two()));
    assert_eq!(
        e,
        "VM \"n1\" had address 10.0.0.9 in the cluster snapshot but has 10.0.0.1 in cluster c"
    );
    // Another VM's snapshot, or another NIC.
    let m = two();
    let e = err(&m, &mut |_, _| Ok(snap("n2", "52:54:00:00:00:01", 64, 10)));
    assert!(e.starts_with("/snap/n1 is a snapshot of VM \"n2\""), "{e}");
    let e = err(&m, &mut |cv, _| {
        Ok(snap(&cv.name, "52:54:00:00:00:99", 64, 10))
    });
    assert!(
        e.ends_with("not of VM \"n1\" with MAC 52:54:00:00:00:01"),
        "{e}"
    );
    // No trace.
    let e = err(&m, &mut |cv, _| {
        let mv = two().vms.into_iter().find(|v| v.vm == cv.name).unwrap();
        Ok(snap(&cv.name, &mv.mac, 64, 0))
    });
    assert_eq!(
        e,
        "the snapshot of VM \"n1\" has no working-set trace: it cannot be restored on a line"
    );
}

fn figs() -> Vec<VmFigures> {
    let m = two();
    figures(&m.cluster, &m, Path::new("/snap"), good(&m)).unwrap()
}

#[test]
fn a_hosts_rate_is_the_given_one_else_the_recorded_one_else_probed_once() {
    let mut f = figs();
    // Given: nothing probed.
    let src = Rates::default()
        .assign(&mut f, Some(500.0), |_| -> Result<f64, RestoreError> {
            panic!("probed")
        })
        .unwrap();
    assert_eq!(src["h1"], "--load-rate");
    assert!(f.iter().all(|f| f.load_rate == 500.0));

    // Recorded for h1 by a restore; h2 never measured: probed on its snapshot.
    let mut r = Rates::default();
    r.record(
        &f,
        "c-line-1",
        [("n1", Some(3000), Some(1.5)), ("n2", None, Some(1.0))],
    );
    let r = Rates::parse(Some(&r.to_vec()));
    let mut probed = Vec::new();
    let src = r
        .assign(&mut f, None, |d: &Path| -> Result<f64, RestoreError> {
            probed.push(d.to_path_buf());
            Ok(800.0)
        })
        .unwrap();
    assert_eq!(src["h1"], "measured by restore c-line-1");
    assert_eq!(src["h2"], "probed on the snapshot of n2");
    assert_eq!(probed, [PathBuf::from("/snap/n2")]);
    assert_eq!((f[0].load_rate, f[1].load_rate), (2000.0, 800.0));

    // A rate that is no rate is refused; a file that is not JSON is no rates.
    let e = Rates::default()
        .assign(&mut f, Some(0.0), |_| Ok(1.0))
        .unwrap_err();
    assert!(matches!(e, RestoreError::Rate(_)));
    let e = Rates::default()
        .assign(&mut f, None, |_| Ok(f64::NAN))
        .unwrap_err();
    assert!(matches!(e, RestoreError::Rate(_)));
    assert!(Rates::parse(Some(b"{")).hosts.is_empty());
    assert!(Rates::parse(None).hosts.is_empty());
}

fn edge(s: &str, r: &str) -> RdgEdge {
    RdgEdge {
        sender: s.into(),
        receiver: r.into(),
        packets: 3,
    }
}

#[test]
fn each_variant_loads_and_starts_as_it_says() {
    let mut f = figs();
    for x in &mut f {
        x.load_rate = 1000.0;
    }
    f[1].trace_pages = 4000;
    f[1].elastic_pages = 2000;
    let edges = [edge("n1", "n2")];
    let opts = |variant| PlanOpts {
        variant,
        margin_s: 0.05,
        no_wait: false,
    };
    let (ws, line) = plan(&f, &edges, &opts(Variant::WorkingSet)).unwrap();
    assert!(line.is_none());
    assert_eq!(ws[1].ws_pages, 4000);
    assert!(ws
        .iter()
        .all(|v| v.depends_on.is_empty() && v.start_at_s.is_none()));
    let (el, _) = plan(&f, &edges, &opts(Variant::Elastic)).unwrap();
    assert_eq!(el[1].ws_pages, 2000);
    assert_eq!(
        (Variant::WorkingSet.vm_mode(), Variant::Line.vm_mode()),
        ("working-set", "elastic")
    );

    // n1 sends to n2: n2 starts first, n1 at least the margin later.
    let (on, line) = plan(&f, &edges, &opts(Variant::Line)).unwrap();
    let line = line.unwrap();
    assert_eq!(on[0].depends_on, ["n2"]);
    assert!(on[1].depends_on.is_empty());
    let (s1, s2) = (on[0].start_at_s.unwrap(), on[1].start_at_s.unwrap());
    assert!(s1 >= s2 + 0.05 - 1e-9, "{s1} {s2}");
    assert_eq!(line.vms.len(), 2);
    for v in &on {
        assert!(v.ws_pages >= 1 && v.ws_pages <= 4000, "{v:?}");
    }
    // line-keep: no working set below its elastic one.
    let (keep, _) = plan(&f, &edges, &opts(Variant::LineKeep)).unwrap();
    assert!(keep[1].ws_pages >= 2000, "{:?}", keep[1]);

    // A VM with no trace pages still loads one page, never "the default".
    f[0].trace_pages = 0;
    let (ws, _) = plan(&f, &edges, &opts(Variant::WorkingSet)).unwrap();
    assert_eq!(ws[0].ws_pages, 1);
}

#[test]
fn a_margin_no_restore_can_keep_is_refused() {
    for m in [-0.1, 60.0, f64::NAN] {
        let o = PlanOpts {
            variant: Variant::Line,
            margin_s: m,
            no_wait: false,
        };
        assert!(matches!(o.check(), Err(RestoreError::Margin)), "{m}");
    }
}

#[test]
fn variants_keep_their_json_names() {
    for v in [
        Variant::WorkingSet,
        Variant::Elastic,
        Variant::Line,
        Variant::LineKeep,
    ] {
        assert_eq!(serde_json::to_value(v).unwrap(), v.as_str());
    }
}
