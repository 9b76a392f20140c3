//! Human-readable output of VM status.

use serde_json::Value;

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("-")
}

fn forwards(v: &Value) -> String {
    let Some(f) = v.get("forwards").and_then(Value::as_array) else {
        return "-".into();
    };
    if f.is_empty() {
        return "-".into();
    }
    f.iter()
        .map(|x| {
            let svc = x.get("service").and_then(Value::as_str);
            let base = format!("127.0.0.1:{}->{}", x["host"], x["guest"]);
            match svc {
                Some(s) => format!("{s}={base}"),
                None => base,
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// One line per VM.
pub fn table(vms: &[Value]) -> String {
    let mut out = format!(
        "{:<20} {:<9} {:<5} {:>8} {:<4} {:>7}  FORWARDS\n",
        "NAME", "STATE", "READY", "PID", "ACCEL", "MEM"
    );
    for v in vms {
        out.push_str(&format!(
            "{:<20} {:<9} {:<5} {:>8} {:<4} {:>6}M  {}\n",
            s(v, "name"),
            s(v, "state"),
            v.get("ready").and_then(Value::as_bool).unwrap_or(false),
            v.get("qemu_pid")
                .and_then(Value::as_u64)
                .map(|p| p.to_string())
                .unwrap_or("-".into()),
            s(v, "accel"),
            v.get("memory_mib").and_then(Value::as_u64).unwrap_or(0),
            forwards(v)
        ));
    }
    out
}

/// A VM's status, one field a line.
pub fn status(v: &Value) -> String {
    let opt = |k: &str| match v.get(k) {
        Some(Value::Null) | None => "-".to_string(),
        Some(Value::Number(n)) if k == "vmcoreinfo_paddr" => {
            format!("{:#x}", n.as_u64().unwrap_or(0))
        }
        Some(Value::String(s)) => s.clone(),
        Some(x) => x.to_string(),
    };
    let mut out = String::new();
    for (label, key) in [
        ("name", "name"),
        ("state", "state"),
        ("ready", "ready"),
        ("qemu pid", "qemu_pid"),
        ("accel", "accel"),
        ("accel reason", "accel_reason"),
        ("memory MiB", "memory_mib"),
        ("cpus", "cpus"),
        ("RAM file", "ram_file"),
        ("kernel", "kernel_release"),
        ("vmcoreinfo", "vmcoreinfo_paddr"),
        ("workload", "workload"),
        ("started", "started_at"),
        ("ready after ms", "ready_after_ms"),
    ] {
        out.push_str(&format!("{label:<15} {}\n", opt(key)));
    }
    out.push_str(&format!("{:<15} {}\n", "forwards", forwards(v)));
    out
}
