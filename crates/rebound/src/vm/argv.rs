//! A VM spec, resolved, becomes one QEMU command line.
//!
//! Fixed choices and why:
//! - guest RAM is a shared file on tmpfs (`memory-backend-file,share=on`) so the host
//!   can read guest memory by physical address and it survives a paused panic;
//! - `-action panic=pause` (QEMU 7.2 would power off and lose RAM) with `pvpanic`;
//! - `vmcoreinfo` so QEMU also learns the note's address;
//! - an i6300esb watchdog whose expiry pauses the guest instead of resetting it;
//! - devices get stable ids (`disk0`, `balloon0`, `net0`) for later QMP commands.

use std::path::PathBuf;

use serde_json::json;

use super::accel::Accel;
use crate::paths::RunDir;

/// Image format of a disk handed to QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// One disk as QEMU will open it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskArg {
    pub path: PathBuf,
    pub format: DiskFormat,
}

/// Everything the command line depends on, already resolved on the host.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    pub memory_mib: u64,
    pub cpus: u32,
    pub accel: Accel,
    pub run: RunDir,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub append: String,
    pub disks: Vec<DiskArg>,
    /// (host port, guest port); host ports are already picked.
    pub forwards: Vec<(u16, u16)>,
}

/// Escapes a value for QEMU's `key=value,...` option syntax (commas are doubled).
pub fn opt_escape(s: &str) -> String {
    s.replace(',', ",,")
}

fn path_opt(p: &std::path::Path) -> String {
    opt_escape(&p.to_string_lossy())
}

/// Builds QEMU's arguments (without the binary itself).
pub fn build(cfg: &QemuConfig) -> Vec<String> {
    let run = &cfg.run;
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    let mem = format!("{}M", cfg.memory_mib);

    push(&["-nodefaults", "-no-user-config", "-display", "none"]);
    push(&["-machine", "pc,memory-backend=ram"]);
    push(&[
        "-object",
        &format!(
            "memory-backend-file,id=ram,size={mem},mem-path={},share=on",
            path_opt(&run.ram())
        ),
    ]);
    push(&["-m", &mem, "-smp", &cfg.cpus.to_string()]);
    push(&["-accel", cfg.accel.as_str()]);
    push(&["-action", "panic=pause", "-device", "pvpanic"]);
    push(&["-device", "vmcoreinfo"]);
    push(&[
        "-device",
        "i6300esb,id=watchdog0",
        "-action",
        "watchdog=pause",
    ]);

    push(&["-kernel", &cfg.kernel.to_string_lossy()]);
    if let Some(initrd) = &cfg.initrd {
        push(&["-initrd", &initrd.to_string_lossy()]);
    }
    push(&["-append", &cfg.append]);

    for (i, d) in cfg.disks.iter().enumerate() {
        // JSON syntax: file names need no escaping.
        let node = json!({
            "driver": d.format.as_str(),
            "node-name": format!("drive{i}"),
            "file": {"driver": "file", "filename": d.path.to_string_lossy()},
        });
        push(&["-blockdev", &node.to_string()]);
        push(&[
            "-device",
            &format!("virtio-blk-pci,drive=drive{i},id=disk{i},serial=disk{i}"),
        ]);
    }

    push(&["-device", "virtio-balloon-pci,id=balloon0"]);

    let mut netdev = "user,id=net0".to_string();
    for (h, g) in &cfg.forwards {
        netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{h}-:{g}"));
    }
    // romfile= : no iPXE option ROM, we never boot from the network.
    push(&[
        "-netdev",
        &netdev,
        "-device",
        "virtio-net-pci,netdev=net0,id=nic0,romfile=",
    ]);

    push(&["-device", "virtio-serial-pci,id=vser0"]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=agent0,path={},server=on,wait=off",
            path_opt(&run.agent())
        ),
    ]);
    push(&[
        "-device",
        "virtserialport,bus=vser0.0,chardev=agent0,name=org.rebound.agent",
    ]);

    push(&[
        "-chardev",
        &format!(
            "socket,id=serial0,path={},server=on,wait=off,logfile={}",
            path_opt(&run.serial_sock()),
            path_opt(&run.serial_log())
        ),
    ]);
    push(&["-serial", "chardev:serial0"]);

    push(&[
        "-chardev",
        &format!(
            "socket,id=qmp0,path={},server=on,wait=off",
            path_opt(&run.qmp())
        ),
    ]);
    push(&["-mon", "chardev=qmp0,mode=control"]);
    push(&["-pidfile", &run.pidfile().to_string_lossy()]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> QemuConfig {
        QemuConfig {
            memory_mib: 256,
            cpus: 2,
            accel: Accel::Tcg,
            run: RunDir("/run/x,y".into()),
            kernel: "/img/vmlinuz".into(),
            initrd: Some("/img/initrd".into()),
            append: "console=ttyS0 rebound.workload=web".into(),
            disks: vec![DiskArg {
                path: "/vms/a/disk0.qcow2".into(),
                format: DiskFormat::Qcow2,
            }],
            forwards: vec![(40001, 8080), (40002, 22)],
        }
    }

    fn after<'a>(a: &'a [String], flag: &str) -> Vec<&'a str> {
        a.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn memory_is_a_shared_file() {
        let a = build(&cfg());
        assert_eq!(after(&a, "-machine"), ["pc,memory-backend=ram"]);
        assert_eq!(
            after(&a, "-object"),
            ["memory-backend-file,id=ram,size=256M,mem-path=/run/x,,y/ram,share=on"]
        );
        assert_eq!(after(&a, "-m"), ["256M"]);
        assert_eq!(after(&a, "-smp"), ["2"]);
        assert_eq!(after(&a, "-accel"), ["tcg"]);
    }

    #[test]
    fn crash_devices_pause() {
        let a = build(&cfg());
        assert_eq!(after(&a, "-action"), ["panic=pause", "watchdog=pause"]);
        let dev = after(&a, "-device");
        assert!(dev.contains(&"pvpanic"));
        assert!(dev.contains(&"vmcoreinfo"));
        assert!(dev.contains(&"i6300esb,id=watchdog0"));
        assert!(dev.contains(&"virtio-balloon-pci,id=balloon0"));
    }

    #[test]
    fn disks_have_stable_ids() {
        let a = build(&cfg());
        let bd: serde_json::Value = serde_json::from_str(after(&a, "-blockdev")[0]).unwrap();
        assert_eq!(bd["driver"], "qcow2");
        assert_eq!(bd["node-name"], "drive0");
        assert_eq!(bd["file"]["filename"], "/vms/a/disk0.qcow2");
        assert!(after(&a, "-device").contains(&"virtio-blk-pci,drive=drive0,id=disk0,serial=disk0"));
    }

    #[test]
    fn forwards_and_sockets() {
        let a = build(&cfg());
        assert_eq!(
            after(&a, "-netdev"),
            ["user,id=net0,hostfwd=tcp:127.0.0.1:40001-:8080,hostfwd=tcp:127.0.0.1:40002-:22"]
        );
        let ch = after(&a, "-chardev");
        assert_eq!(ch.len(), 3);
        assert!(ch[0].contains("path=/run/x,,y/agent.sock"));
        assert!(ch[1].contains("path=/run/x,,y/serial.sock"));
        assert!(ch[1].contains("logfile=/run/x,,y/serial.log"));
        assert!(ch[2].starts_with("socket,id=qmp0,path=/run/x,,y/qmp.sock,server=on,wait=off"));
        assert_eq!(after(&a, "-mon"), ["chardev=qmp0,mode=control"]);
        assert!(after(&a, "-device")
            .contains(&"virtserialport,bus=vser0.0,chardev=agent0,name=org.rebound.agent"));
        assert_eq!(after(&a, "-pidfile"), ["/run/x,y/qemu.pid"]);
        assert_eq!(after(&a, "-display"), ["none"]);
    }

    #[test]
    fn boot_files() {
        let mut c = cfg();
        let a = build(&c);
        assert_eq!(after(&a, "-kernel"), ["/img/vmlinuz"]);
        assert_eq!(after(&a, "-initrd"), ["/img/initrd"]);
        assert_eq!(after(&a, "-append"), ["console=ttyS0 rebound.workload=web"]);
        c.initrd = None;
        c.disks.clear();
        c.forwards.clear();
        let a = build(&c);
        assert!(after(&a, "-initrd").is_empty());
        assert!(after(&a, "-blockdev").is_empty());
        assert_eq!(after(&a, "-netdev"), ["user,id=net0"]);
    }
}
