//! `s`: one crashed guest kept paused and dumped several ways over the same memory:
//! QEMU's ELF and ours, ours filtered against `makedumpfile -d 31`, QEMU's kdump-zlib
//! against ours in zlib and zstd.

use std::time::Instant;

use rebound_api::{CrashPolicy, DumpResult, VmStatus};
use serde::Serialize;
use serde_json::{json, Value};

use super::case::{copy_disk, CrashArgs, Setup, MIB};
use super::Error;
use crate::guest::{boot_filled, post, remove};
use rebound_client::Client;

/// The same-memory dump comparison (`s`).
#[derive(Debug, Clone, Serialize, Default)]
pub(super) struct Sizes {
    guest_bytes: u64,
    qemu_elf: Option<DumpResult>,
    ours_elf: Option<DumpResult>,
    ours_zero_free: Option<DumpResult>,
    ours_all_classes: Option<DumpResult>,
    makedumpfile_d31_elf_bytes: Option<u64>,
    makedumpfile_d31_s: Option<f64>,
    qemu_kdump_zlib: Option<DumpResult>,
    ours_kdump_zlib: Option<DumpResult>,
    ours_kdump_zstd: Option<DumpResult>,
    notes: Vec<String>,
}

/// `s`: one crashed guest kept paused, dumped several ways over the same memory.
pub(super) async fn run_sizes(
    c: &Client,
    args: &CrashArgs,
    setup: &Setup,
    name: &str,
) -> Result<(Sizes, VmStatus), Error> {
    let disk = copy_disk(setup, name, false)?;
    let spec = setup.spec(args, name, &disk, CrashPolicy::default(), 0);
    setup.say(&format!("s: booting {name} and filling {} MiB", args.fill));
    let st = boot_filled(c, &spec, args.fill).await?;
    let _: Value = post(c, &format!("/v1/vms/{name}/crash"), None).await?;
    let _: VmStatus = post(
        c,
        &format!("/v1/vms/{name}/wait?for=panicked&timeout_ms=60000"),
        None,
    )
    .await?;
    let mut s = Sizes {
        guest_bytes: args.memory << 20,
        ..Sizes::default()
    };
    let dump = |file: &'static str, body: Value| dump_as(c, setup, name, file, body);
    let n = &mut s.notes;
    s.qemu_elf = keep(dump("qemu.elf", json!({"engine": "qemu"})).await, n);
    s.ours_elf = keep(dump("ours.elf", json!({})).await, n);
    let zf = json!({"filter": ["zero", "free"]});
    s.ours_zero_free = keep(dump("ours-zf.elf", zf).await, n);
    let all = json!({"filter": ["zero", "free", "cache", "user"]});
    s.ours_all_classes = keep(dump("ours-d31.elf", all).await, n);
    let ours = setup.dir.join(format!("{name}.ours.elf"));
    let mdf = setup.dir.join(format!("{name}.makedumpfile-d31.elf"));
    setup.say("s: makedumpfile -E -d 31 on our unfiltered ELF");
    let t = Instant::now();
    let ran = std::process::Command::new("makedumpfile")
        .args(["-E", "-d", "31"])
        .arg(&ours)
        .arg(&mdf)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match ran {
        Ok(st) if st.success() => {
            s.makedumpfile_d31_s = Some(t.elapsed().as_secs_f64());
            s.makedumpfile_d31_elf_bytes = std::fs::metadata(&mdf).ok().map(|m| m.len());
        }
        Ok(st) => s.notes.push(format!("makedumpfile -E -d 31 failed ({st})")),
        Err(e) => s.notes.push(format!("cannot run makedumpfile: {e}")),
    }
    let n = &mut s.notes;
    let zlib = json!({"engine": "qemu", "format": "kdump", "compress": "zlib"});
    s.qemu_kdump_zlib = keep(dump("qemu.kdump", zlib).await, n);
    let zlib = json!({"format": "kdump", "compress": "zlib"});
    s.ours_kdump_zlib = keep(dump("ours.kdump", zlib).await, n);
    let zstd = json!({"format": "kdump", "compress": "zstd"});
    s.ours_kdump_zstd = keep(dump("ours-zstd.kdump", zstd).await, n);
    for f in [
        "qemu.elf",
        "ours.elf",
        "ours-zf.elf",
        "ours-d31.elf",
        "makedumpfile-d31.elf",
        "qemu.kdump",
        "ours.kdump",
        "ours-zstd.kdump",
    ] {
        let _ = std::fs::remove_file(setup.dir.join(format!("{name}.{f}")));
    }
    remove(c, name).await;
    let _ = std::fs::remove_file(&disk);
    Ok((s, st))
}

/// One on-demand dump of the kept guest into the scratch directory.
async fn dump_as(
    c: &Client,
    setup: &Setup,
    name: &str,
    file: &str,
    mut body: Value,
) -> Result<DumpResult, Error> {
    body["out"] = json!(setup.dir.join(format!("{name}.{file}")));
    setup.say(&format!("s: dump {file}"));
    post(c, &format!("/v1/vms/{name}/dump"), Some(&body))
        .await
        .map_err(|e| Error::Dump(file.to_string(), e))
}

/// A dump's result, or `None` with why in `notes`: one failed dump of `s` does not
/// lose the run.
fn keep(r: Result<DumpResult, Error>, notes: &mut Vec<String>) -> Option<DumpResult> {
    r.map_err(|e| notes.push(format!("{} (not counted)", rebound_errors::chain(&e))))
        .ok()
}

pub(super) fn print_sizes(s: &Sizes) {
    let g = s.guest_bytes as f64;
    println!("same memory, guest kept paused (s), real disk, every file durable:");
    let row = |label: &str, d: &Option<DumpResult>| {
        if let Some(d) = d {
            println!(
                "  {label:<34} {:>8.2} s {:>8.0} MiB/s covered {:>9.1} MiB file {:>9.1} MiB written",
                d.seconds,
                g / d.seconds / MIB,
                d.bytes as f64 / MIB,
                d.io_bytes as f64 / MIB
            );
        }
    };
    row("QEMU dump-guest-memory ELF", &s.qemu_elf);
    row("ours ELF", &s.ours_elf);
    row("ours ELF, filter zero,free", &s.ours_zero_free);
    row("ours ELF, filter zero,free,cache,user", &s.ours_all_classes);
    row("QEMU kdump-zlib", &s.qemu_kdump_zlib);
    row("ours kdump zlib", &s.ours_kdump_zlib);
    row("ours kdump zstd", &s.ours_kdump_zstd);
    let speed = |x: &Option<DumpResult>, y: &Option<DumpResult>| match (x, y) {
        (Some(x), Some(y)) => format!("{:.2}x", x.seconds / y.seconds),
        _ => "-".into(),
    };
    println!(
        "  throughput ours/QEMU: ELF {}, kdump-zlib {}, our kdump-zstd against QEMU's kdump-zlib {}",
        speed(&s.qemu_elf, &s.ours_elf),
        speed(&s.qemu_kdump_zlib, &s.ours_kdump_zlib),
        speed(&s.qemu_kdump_zlib, &s.ours_kdump_zstd)
    );
    if let (Some(m), Some(t)) = (s.makedumpfile_d31_elf_bytes, s.makedumpfile_d31_s) {
        let ours = s.ours_all_classes.as_ref().map(|d| d.bytes).unwrap_or(0);
        let zf = s.ours_zero_free.as_ref().map(|d| d.bytes).unwrap_or(0);
        println!(
            "  makedumpfile -E -d 31 of our unfiltered ELF: {:.1} MiB in {t:.2} s; ours with all four classes {:.1} MiB ({:.3}x), with zero,free {:.1} MiB",
            m as f64 / MIB,
            ours as f64 / MIB,
            ours as f64 / m as f64,
            zf as f64 / MIB
        );
    }
    for n in &s.notes {
        println!("  note: {n}");
    }
}
