//! The panic CPU's backtrace in `crash` with the guest kernel's debug symbols:
//! the `default` image boots under QEMU/TCG (2 vCPUs), the agent panics it
//! with sysrq-c, QEMU pauses it; then this crate writes an ELF dump and
//! kdump-compressed dumps (zstd, zlib, zstd without free pages) with QEMU's
//! register notes, and QEMU writes its own ELF dump of the same crash as a
//! control. Debian's crash 8.0.2 opens each with the debug vmlinux and must
//! show what a user looks for: `sys` names the panic, `bt` is the task that
//! wrote to /proc/sysrq-trigger with `sysrq_handle_crash` and `panic` on its
//! stack (frame for frame as on QEMU's dump), the kernel log says the same,
//! `bt -a` has one backtrace per CPU, the other CPU stopped in
//! `stop_this_cpu`, and `help -r` shows each CPU's registers from its
//! `NT_PRSTATUS` note.
//!
//! What this showed: crash starts the panic task's backtrace from the
//! `panic` frame it finds on that task's stack (the vCPU itself was paused
//! inside the pvpanic module's notifier, whose symbols are not loaded), so
//! that backtrace does not depend on the notes; the notes are what `help -r`
//! shows and, in kdump-compressed dumps, where crash starts the other CPUs'
//! backtraces (`[exception RIP: stop_this_cpu+107]`). A dump without them
//! fails here at `help -r`.
//!
//! The debug vmlinux (Debian's `linux-image-<release>-dbg`, ~860 MB to
//! download) is not part of `make test`: `make test-debug-kernel` fetches it
//! (scripts/debug-kernel.sh) and runs this test. Run by hand without it, the
//! test fails saying how to get it.

use crate::common;
use crate::crashed;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{tool, MIB};
use crashed::{crashed_guest, image_home, Result};
use rebound_dump::notes::{parse_notes, PrStatus};
use rebound_dump::{Compress, DumpOptions, Dumper, Format, Note};
use rebound_guestmem::{free_pages, KernelPageTables};

/// `NT_GNU_BUILD_ID`.
const NT_GNU_BUILD_ID: u32 = 3;

/// The debug vmlinux for `release`: `$REBOUND_DEBUG_VMLINUX` when set,
/// else Debian's installed `-dbg` package's, else where
/// scripts/debug-kernel.sh puts it. Fails, saying how to get it, when missing.
fn debug_vmlinux(release: &str) -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("REBOUND_DEBUG_VMLINUX") {
        Some(p) => vec![PathBuf::from(p)],
        None => {
            let home = std::env::var_os("REBOUND_HOME")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| Path::new(&h).join(".local/share/rebound"))
                })
                .unwrap_or_default();
            vec![
                Path::new("/usr/lib/debug/boot").join(format!("vmlinux-{release}")),
                home.join("debug").join(format!("vmlinux-{release}")),
            ]
        }
    };
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "no debug vmlinux for {release} (looked at {candidates:?}): \
                 `make test-debug-kernel` fetches it (scripts/debug-kernel.sh, \
                 Debian package linux-image-{release}-dbg) and runs this test"
            )
        })
}

/// The GNU build ID in a vmlinux's PT_NOTE (an executable, which
/// `rebound_dump::notes::read_elf_notes`, for core files, does not take).
fn build_id(elf: &Path) -> Vec<u8> {
    let b = std::fs::read(elf).unwrap_or_else(|e| panic!("{}: {e}", elf.display()));
    let num = |at: usize, len: usize| {
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(&b[at..at + len]);
        u64::from_le_bytes(v) as usize
    };
    assert_eq!(
        &b[..5],
        b"\x7fELF\x02",
        "{}: not a 64-bit ELF",
        elf.display()
    );
    let (phoff, phnum) = (num(32, 8), num(56, 2));
    (0..phnum)
        .map(|i| phoff + i * 56)
        .filter(|&ph| num(ph, 4) == 4) // PT_NOTE
        .flat_map(|ph| parse_notes(&b[num(ph + 8, 8)..][..num(ph + 32, 8)]).unwrap())
        .find(|n| n.name == b"GNU" && n.kind == NT_GNU_BUILD_ID)
        .unwrap_or_else(|| panic!("{} has no build ID", elf.display()))
        .desc
}

/// What crash printed for each command of one session.
struct Session {
    dump: String,
    out: Vec<(&'static str, String)>,
}

impl Session {
    fn get(&self, cmd: &str) -> &str {
        &self.out.iter().find(|(c, _)| *c == cmd).unwrap().1
    }

    /// Fails with the whole session when `ok` is false.
    fn check(&self, ok: bool, what: &str) {
        if !ok {
            let all: Vec<String> = self
                .out
                .iter()
                .map(|(c, o)| format!("crash> {c}\n{o}"))
                .collect();
            panic!("{}: {what}\n{}", self.dump, all.join("\n"));
        }
    }
}

const MARK: &str = "=== rebound: next command ===";
/// The kernel log's panic line and the CPU/PID line after it.
const LOG: &str = "log | grep -A1 \"Kernel panic\"";
const COMMANDS: [&str; 5] = ["sys", "bt", "bt -a", LOG, "help -r"];

/// Runs `crash -s VMLINUX DUMP` with [`COMMANDS`] on its standard input and
/// splits what it prints by command.
fn crash_session(vmlinux: &Path, dump: &Path) -> Session {
    let mut script = String::new();
    for c in COMMANDS {
        script.push_str(&format!("!echo '{MARK}'\n{c}\n"));
    }
    script.push_str("quit\n");
    let t = Instant::now();
    let mut child = Command::new(tool("crash"))
        .arg("-s")
        .arg(vmlinux)
        .arg(dump)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run crash");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let name = dump.file_name().unwrap().to_string_lossy().into_owned();
    eprintln!(
        "crash on {name}: {:.1} s, {}\n{stdout}{}",
        t.elapsed().as_secs_f64(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut parts = stdout.split(MARK);
    let head = parts.next().unwrap_or_default().to_string();
    let split: Vec<_> = COMMANDS
        .iter()
        .zip(parts.chain(std::iter::repeat("")))
        .map(|(c, o)| (*c, o.to_string()))
        .collect();
    let s = Session {
        dump: name,
        out: split,
    };
    s.check(
        out.status.success(),
        &format!("crash exited with {}: {head}", out.status),
    );
    s
}

/// Where the guest's console says the panic came from: (CPU, PID, command),
/// from the line after the panic message (`CPU: 1 PID: 118 Comm: rebound-agent ...`).
fn panic_origin(serial: &str) -> (u32, u32, String) {
    let after = serial
        .split_once("Kernel panic - not syncing")
        .unwrap_or_else(|| panic!("no panic on the console:\n{serial}"))
        .1;
    let line = after
        .lines()
        .find(|l| l.contains(" PID: ") && l.contains(" Comm: "))
        .unwrap_or_else(|| panic!("no CPU/PID line after the panic:\n{after}"));
    let field = |key: &str| -> String {
        let rest = &line[line.find(key).unwrap() + key.len()..];
        rest.split_whitespace().next().unwrap().to_string()
    };
    (
        field("CPU: ").parse().unwrap(),
        field("PID: ").parse().unwrap(),
        field("Comm: "),
    )
}

/// What the guest looked like when it panicked, as the test saw it.
struct Expected {
    release: String,
    cpu: u32,
    pid: u32,
    comm: String,
    /// Per CPU, in order, the registers QEMU gave us.
    regs: Vec<PrStatus>,
}

/// Lines of `text` with runs of blanks made one space.
fn squeeze(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Checks one crash session against what a user must see.
fn check_session(s: &Session, want: &Expected) {
    let sys = s.get("sys");
    s.check(
        sys.contains(r#"PANIC: "Kernel panic - not syncing: sysrq triggered crash""#),
        "`sys` lacks the panic message",
    );
    s.check(
        squeeze(sys).iter().any(|l| l.starts_with("CPUS: 2")),
        "`sys` does not count 2 CPUs",
    );
    s.check(
        sys.contains(&format!("RELEASE: {}", want.release)),
        "`sys` shows another release",
    );
    // `bt`: the panic task, on the panic CPU, with the sysrq-c path.
    let bt = squeeze(s.get("bt"));
    let head = format!(r#"PID: {} TASK: "#, want.pid);
    let tail = format!(r#"CPU: {} COMMAND: "{}""#, want.cpu, want.comm);
    s.check(
        bt.iter()
            .any(|l| l.starts_with(&head) && l.ends_with(&tail)),
        &format!("`bt` is not about the panic task ({head}... {tail})"),
    );
    let frame = |f: &str| bt.iter().position(|l| l.contains(&format!("] {f} at ")));
    let path = [
        "panic",
        "sysrq_handle_crash",
        "write_sysrq_trigger",
        "ksys_write",
    ];
    let at: Vec<_> = path.iter().map(|f| frame(f)).collect();
    s.check(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        &format!("`bt` lacks the panic path {path:?} in that order: {at:?}"),
    );
    // `bt -a`: one backtrace per CPU; the other one was stopped by the panic.
    let all = squeeze(s.get("bt -a"));
    for cpu in 0..want.regs.len() {
        s.check(
            all.iter()
                .filter(|l| l.starts_with("PID: ") && l.contains(&format!(" CPU: {cpu} ")))
                .count()
                == 1,
            &format!("`bt -a` has no single backtrace for CPU {cpu}"),
        );
    }
    s.check(
        all.iter().any(|l| l.contains("stop_this_cpu")),
        "`bt -a`: the CPU that did not panic is not in stop_this_cpu",
    );
    s.check(
        s.get(LOG)
            .contains("Kernel panic - not syncing: sysrq triggered crash")
            && s.get(LOG).contains(&format!(
                "CPU: {} PID: {} Comm: {} ",
                want.cpu, want.pid, want.comm
            )),
        "the kernel log lacks the panic or where it came from",
    );
    // `help -r`: each CPU's registers are those of its NT_PRSTATUS note.
    let regs = s.get("help -r");
    let mut sections = regs.split("CPU ").skip(1);
    for (cpu, r) in want.regs.iter().enumerate() {
        let sec = sections.next().unwrap_or_default();
        s.check(
            sec.starts_with(&format!("{cpu}:")) && sec.contains(&format!("RIP: {:016x}", r.rip)),
            &format!("`help -r` does not show CPU {cpu}'s RIP {:#x}", r.rip),
        );
    }
}

#[test]
#[ignore = "needs the guest kernel's debug symbols (~860 MB): run `make test-debug-kernel`"]
fn crash_shows_the_panic_backtrace_with_debug_symbols() -> Result<()> {
    let img = crashed::ensure_image(&image_home());
    let vmlinux = debug_vmlinux(&img.kernel_release);
    assert_eq!(
        build_id(&vmlinux),
        build_id(&img.kernel),
        "{} is not the debug build of the image's kernel {}: rerun scripts/debug-kernel.sh",
        vmlinux.display(),
        img.kernel.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("backtrace-test")
        .tempdir()?;
    let regs = dir.path().join("regs.elf");
    let c = crashed_guest(256, "rebound.workload=none", false, &regs)?;
    let (cpu, pid, comm) = panic_origin(&c.guest.serial());
    let want = Expected {
        release: c.release.clone(),
        cpu,
        pid,
        comm,
        regs: c.notes.iter().filter_map(Note::prstatus).collect(),
    };
    assert_eq!(want.regs.len(), 2, "QEMU's notes: {:?}", c.notes);
    assert!(want.regs.iter().all(PrStatus::in_kernel), "{:?}", want.regs);
    eprintln!(
        "panic on CPU {cpu} in PID {pid} ({}); QEMU's registers: {:x?}",
        want.comm, want.regs
    );

    // The control: QEMU's own ELF dump of the same crash.
    let mut qmp = c.qmp;
    let qemu_elf = dir.path().join("qemu.elf");
    qmp.execute_args(
        "dump-guest-memory",
        serde_json::json!({"paging": false, "protocol": format!("file:{}", qemu_elf.display())}),
        Instant::now() + Duration::from_secs(120),
    )?;
    let control = crash_session(&vmlinux, &qemu_elf);
    check_session(&control, &want);

    let free = free_pages(
        &c.mem,
        &c.info,
        &KernelPageTables::from_vmcoreinfo(&c.info)?,
    )?;
    let zstd = Format::kdump(Compress::Zstd);
    let cases = [
        ("ours.elf", Format::Elf, false),
        ("ours-zstd.kdump", zstd, false),
        ("ours-zlib.kdump", Format::kdump(Compress::Zlib), false),
        ("ours-zstd-nofree.kdump", zstd, true),
    ];
    for (name, format, filtered) in cases {
        let opts = DumpOptions {
            format,
            chunk_bytes: 32 * MIB,
            threads: 2,
            batch_fsync: 2,
        };
        let out = dir.path().join(name);
        let mut d = Dumper::new(&c.mem).vmcoreinfo(&c.info.text).notes(&c.notes);
        if filtered {
            d = d.filter(&free);
        }
        let report = d.write(&out, &opts, &mut ())?;
        assert_eq!(report.cpus, 2, "{name}");
        let s = crash_session(&vmlinux, &out);
        check_session(&s, &want);
        // The panic task's backtrace is the control's, frame for frame.
        s.check(
            s.get("bt") == control.get("bt"),
            &format!("`bt` differs from QEMU's dump's:\n{}", control.get("bt")),
        );
        if format == Format::Elf {
            s.check(
                s.get("bt -a") == control.get("bt -a"),
                &format!(
                    "`bt -a` differs from QEMU's dump's:\n{}",
                    control.get("bt -a")
                ),
            );
        }
    }
    Ok(())
}
