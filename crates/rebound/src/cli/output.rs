//! Human-readable output of VM status.

use rebound_api::VmStatus;

fn forwards(v: &VmStatus) -> String {
    if v.forwards.is_empty() {
        return "-".into();
    }
    v.forwards
        .iter()
        .map(|f| {
            let base = format!("127.0.0.1:{}->{}", f.host, f.guest);
            match &f.service {
                Some(s) => format!("{s}={base}"),
                None => base,
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn or_dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "-".into())
}

/// One line per VM.
pub fn table(vms: &[VmStatus]) -> String {
    let mut out = format!(
        "{:<20} {:<9} {:<5} {:>8} {:<4} {:>7}  FORWARDS\n",
        "NAME", "STATE", "READY", "PID", "ACCEL", "MEM"
    );
    for v in vms {
        out.push_str(&format!(
            "{:<20} {:<9} {:<5} {:>8} {:<4} {:>6}M  {}\n",
            v.name,
            v.state.as_str(),
            v.ready,
            or_dash(&v.qemu_pid),
            v.accel.as_str(),
            v.memory_mib,
            forwards(v)
        ));
    }
    out
}

/// A VM's status, one field a line.
pub fn status(v: &VmStatus) -> String {
    let rows: [(&str, String); 16] = [
        ("name", v.name.clone()),
        ("state", v.state.to_string()),
        ("job", or_dash(&v.job)),
        ("ready", v.ready.to_string()),
        ("qemu pid", or_dash(&v.qemu_pid)),
        ("accel", v.accel.as_str().to_string()),
        ("accel reason", or_dash(&v.accel_reason)),
        ("memory MiB", v.memory_mib.to_string()),
        ("cpus", v.cpus.to_string()),
        ("RAM file", v.ram_file.clone()),
        ("kernel", or_dash(&v.kernel_release)),
        (
            "vmcoreinfo",
            or_dash(&v.vmcoreinfo_paddr.map(|p| format!("{p:#x}"))),
        ),
        ("workload", or_dash(&v.workload.map(|w| w.as_str()))),
        ("started", or_dash(&v.started_at)),
        ("ready after ms", or_dash(&v.ready_after_ms)),
        ("forwards", forwards(v)),
    ];
    rows.iter()
        .map(|(label, val)| format!("{label:<15} {val}\n"))
        .collect()
}
