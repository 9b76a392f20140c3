//! One QEMU command line, built from typed parts.
//!
//! Every QEMU the project starts (the daemon's VMs, restores, recovery VMs, and every
//! test that boots a guest) gets its arguments from [`QemuCommand::args`]: a choice is
//! a value here, never a string pasted elsewhere. Combinations QEMU would accept but
//! that cannot work are refused up front with the reason (e.g. a vhost-user disk needs
//! guest RAM that another process can map).
//!
//! Fixed choices and why:
//! - `-nodefaults -no-user-config -display none`: nothing but what is listed here;
//! - [`Device::Pvpanic`] comes with `-action panic=pause`: QEMU 7.2 would power off
//!   and lose the RAM that is the crash's evidence;
//! - [`Device::Watchdog`] is an i6300esb whose expiry pauses the guest, for the same reason;
//! - devices get stable ids (`disk0`, `balloon0`, `net0`, `vmem0`) for later QMP commands.

use std::path::{Path, PathBuf};

use serde_json::json;

use rebound_api::Accel;

/// Combinations that cannot work, refused before QEMU is started.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QemuCmdError {
    #[error(
        "disk {0} is a vhost-user device: guest RAM must be shared (shared file or shared memfd)"
    )]
    VhostUserNeedsSharedRam(String),
    #[error("{0} needs room for hotplugged memory: set a maximum memory size")]
    NeedsMaxMem(&'static str),
    #[error("maximum memory {max} MiB is below the boot memory {size} MiB")]
    MaxBelowSize { size: u64, max: u64 },
    #[error("two devices have the id {0:?}")]
    DuplicateId(String),
}

/// The machine type. Both lay guest RAM out as `rebound-guestmem`'s `Layout` expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Machine {
    #[default]
    Pc,
    Q35,
}

/// Where guest RAM lives.
#[derive(Debug, Clone, PartialEq)]
pub enum MemoryBackend {
    /// A file (on tmpfs) mapped shared: the host reads guest RAM by physical address,
    /// and it outlives a paused, panicked guest.
    SharedFile(PathBuf),
    /// A RAM image mapped private (MAP_PRIVATE): pages load from the image on first
    /// touch and writes stay in the process (lazy restore).
    PrivateImage(PathBuf),
    /// An anonymous memfd; `share` makes it mappable by a vhost-user backend.
    Memfd { share: bool },
    /// QEMU's plain anonymous memory.
    Anonymous,
}

impl MemoryBackend {
    fn shared(&self) -> bool {
        matches!(
            self,
            MemoryBackend::SharedFile(_) | MemoryBackend::Memfd { share: true }
        )
    }

    fn object(&self, id: &str, size_mib: u64) -> Option<String> {
        let size = format!("size={size_mib}M");
        Some(match self {
            MemoryBackend::SharedFile(p) => format!(
                "memory-backend-file,id={id},{size},mem-path={},share=on",
                opt_path(p)
            ),
            MemoryBackend::PrivateImage(p) => format!(
                "memory-backend-file,id={id},{size},mem-path={},share=off",
                opt_path(p)
            ),
            MemoryBackend::Memfd { share } => format!(
                "memory-backend-memfd,id={id},{size},share={}",
                if *share { "on" } else { "off" }
            ),
            MemoryBackend::Anonymous => return None,
        })
    }
}

/// Guest memory at boot, and the room for hotplugged memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Memory {
    pub size_mib: u64,
    /// `-m ...,maxmem=`: needed by virtio-mem and virtio-pmem.
    pub max_mib: Option<u64>,
    pub backend: MemoryBackend,
}

/// Direct kernel boot.
#[derive(Debug, Clone, PartialEq)]
pub struct Boot {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub append: String,
}

/// Image format of a disk file.
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

    /// `raw` or `qcow2`; anything else is none of ours.
    pub fn parse(s: &str) -> Option<DiskFormat> {
        [DiskFormat::Raw, DiskFormat::Qcow2]
            .into_iter()
            .find(|f| f.as_str() == s)
    }
}

/// What serves a disk's blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockBackend {
    /// A file QEMU opens itself. `locking: false` lets a second QEMU open an image a
    /// paused one still holds (a recovery VM on a crashed VM's disk).
    File {
        path: PathBuf,
        format: DiskFormat,
        locking: bool,
    },
    /// A vhost-user-blk server on a unix socket (QEMU reconnects if it restarts).
    VhostUser { socket: PathBuf },
    /// An NBD export on a unix socket.
    Nbd { socket: PathBuf, export: String },
}

/// One virtio disk; it gets the ids `disk<i>` (device and serial) and `drive<i>` (node).
#[derive(Debug, Clone, PartialEq)]
pub struct Disk {
    pub backend: BlockBackend,
    pub readonly: bool,
    /// QEMU opens a file with `O_DIRECT` (its `cache=none`); otherwise through the
    /// host page cache (`cache=writeback`, QEMU's default).
    pub direct: bool,
}

impl Disk {
    /// A writable file disk with locking on.
    pub fn file(path: impl Into<PathBuf>, format: DiskFormat) -> Disk {
        Disk {
            backend: BlockBackend::File {
                path: path.into(),
                format,
                locking: true,
            },
            readonly: false,
            direct: false,
        }
    }
}

/// A TCP port of the host forwarded to the guest (QEMU user networking).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostForward {
    /// Where the host side listens: loopback unless the user asked otherwise.
    pub bind: std::net::Ipv4Addr,
    pub host: u16,
    pub guest: u16,
}

/// What a NIC is plugged into.
#[derive(Debug, Clone, PartialEq)]
pub enum NetBackend {
    /// QEMU's user-mode network with port forwards.
    User { forwards: Vec<HostForward> },
    /// An existing tap device (e.g. on a bridge in a network namespace).
    Tap { ifname: String },
    /// A stream socket to a switch or a peer (`-netdev stream`); `server` listens.
    StreamUnix { path: PathBuf, server: bool },
}

/// A netfilter on a NIC's traffic.
#[derive(Debug, Clone, PartialEq)]
pub enum NetFilter {
    /// Write every frame to a pcap file.
    Dump { file: PathBuf },
    /// Hold packets and release them every `interval_us`.
    Buffer { interval_us: u64 },
}

/// One virtio NIC; it gets the ids `net<i>` (netdev) and `nic<i>` (device).
#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    pub backend: NetBackend,
    /// Every guest on one segment needs its own address.
    pub mac: Option<String>,
    pub filters: Vec<NetFilter>,
}

/// Devices beyond disks and NICs.
#[derive(Debug, Clone, PartialEq)]
pub enum Device {
    /// pvpanic (ISA), with the guest paused on panic.
    Pvpanic,
    /// pvpanic on PCI, with the guest paused on panic.
    PvpanicPci,
    /// `-device vmcoreinfo`: QEMU learns the guest's VMCOREINFO (guest `qemu_fw_cfg`).
    Vmcoreinfo,
    /// i6300esb watchdog whose expiry pauses the guest.
    Watchdog,
    /// virtio-balloon, id `balloon0`.
    Balloon,
    /// virtio-mem with its own backend, id `vmem<i>` (memory grows by QOM `requested-size`).
    VirtioMem {
        backend: MemoryBackend,
        size_mib: u64,
        requested_mib: u64,
        block_mib: u64,
    },
    /// virtio-pmem over a file (DAX in the guest), id `pmem<i>`.
    VirtioPmem { path: PathBuf, size_mib: u64 },
}

/// Where the serial console goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Serial {
    #[default]
    None,
    /// Appended to a file.
    File(PathBuf),
    /// A socket others can attach to; with `log`, QEMU also appends all output to
    /// that file, uncapped (Rebound's VMs log through the host's client instead,
    /// `console`, which caps the log).
    Socket {
        socket: PathBuf,
        log: Option<PathBuf>,
    },
}

/// How QEMU starts: running, or waiting for a migration stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// `-incoming defer`: `migrate-incoming` over QMP gives the source later.
    Defer,
}

/// Sockets the host talks to QEMU and the guest through.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Control {
    pub qmp: Option<PathBuf>,
    /// A human monitor socket (tests and debugging).
    pub hmp: Option<PathBuf>,
    /// The guest agent's virtio-serial port `org.rebound.agent`.
    pub agent: Option<PathBuf>,
    pub serial: Serial,
    pub pidfile: Option<PathBuf>,
}

/// Everything one QEMU command line says.
#[derive(Debug, Clone, PartialEq)]
pub struct QemuCommand {
    pub machine: Machine,
    pub accel: Accel,
    pub cpus: u32,
    pub memory: Memory,
    pub boot: Option<Boot>,
    pub disks: Vec<Disk>,
    pub nics: Vec<Nic>,
    pub devices: Vec<Device>,
    pub control: Control,
    pub incoming: Option<Incoming>,
    /// `-S`: the vCPUs stay stopped until `cont` (QMP or HMP), so nothing but the
    /// host writes guest RAM until then.
    pub paused: bool,
}

/// Escapes a value for QEMU's `key=value,...` option syntax (commas are doubled).
pub fn opt_escape(s: &str) -> String {
    s.replace(',', ",,")
}

fn opt_path(p: &Path) -> String {
    opt_escape(&p.to_string_lossy())
}

impl QemuCommand {
    /// A machine with `size_mib` of RAM from `backend`, one vCPU and nothing else.
    pub fn new(accel: Accel, size_mib: u64, backend: MemoryBackend) -> QemuCommand {
        QemuCommand {
            machine: Machine::Pc,
            accel,
            cpus: 1,
            memory: Memory {
                size_mib,
                max_mib: None,
                backend,
            },
            boot: None,
            disks: Vec::new(),
            nics: Vec::new(),
            devices: Vec::new(),
            control: Control::default(),
            incoming: None,
            paused: false,
        }
    }

    /// The devices a supervised guest has: panic and watchdog pause it, QEMU learns
    /// VMCOREINFO, and a balloon can take memory back.
    pub fn with_crash_devices(mut self) -> Self {
        self.devices.extend([
            Device::Pvpanic,
            Device::Vmcoreinfo,
            Device::Watchdog,
            Device::Balloon,
        ]);
        self
    }

    fn check(&self) -> Result<(), QemuCmdError> {
        if let Some(max) = self.memory.max_mib {
            if max < self.memory.size_mib {
                return Err(QemuCmdError::MaxBelowSize {
                    size: self.memory.size_mib,
                    max,
                });
            }
        }
        for d in &self.devices {
            let name = match d {
                Device::VirtioMem { .. } => "virtio-mem",
                Device::VirtioPmem { .. } => "virtio-pmem",
                _ => continue,
            };
            if self.memory.max_mib.is_none() {
                return Err(QemuCmdError::NeedsMaxMem(name));
            }
        }
        for (i, d) in self.disks.iter().enumerate() {
            if matches!(d.backend, BlockBackend::VhostUser { .. }) && !self.memory.backend.shared()
            {
                return Err(QemuCmdError::VhostUserNeedsSharedRam(format!("disk{i}")));
            }
        }
        let singles = self
            .devices
            .iter()
            .filter(|d| matches!(d, Device::Balloon | Device::Watchdog));
        let mut seen = Vec::new();
        for d in singles {
            if seen.contains(&d) {
                return Err(QemuCmdError::DuplicateId(format!("{d:?}")));
            }
            seen.push(d);
        }
        Ok(())
    }

    /// QEMU's arguments (without the binary itself).
    pub fn args(&self) -> Result<Vec<String>, QemuCmdError> {
        self.check()?;
        let mut a = Args::default();
        a.push(&["-nodefaults", "-no-user-config", "-display", "none"]);
        let machine = match self.machine {
            Machine::Pc => "pc",
            Machine::Q35 => "q35",
        };
        let m = &self.memory;
        match m.backend.object("ram", m.size_mib) {
            Some(obj) => {
                a.push(&["-machine", &format!("{machine},memory-backend=ram")]);
                a.push(&["-object", &obj]);
            }
            None => a.push(&["-machine", machine]),
        }
        let mem = match m.max_mib {
            Some(max) => format!("{}M,maxmem={max}M", m.size_mib),
            None => format!("{}M", m.size_mib),
        };
        a.push(&["-m", &mem, "-smp", &self.cpus.to_string()]);
        a.push(&["-accel", self.accel.as_str()]);

        if let Some(b) = &self.boot {
            a.push(&["-kernel", &b.kernel.to_string_lossy()]);
            if let Some(i) = &b.initrd {
                a.push(&["-initrd", &i.to_string_lossy()]);
            }
            a.push(&["-append", &b.append]);
        }

        self.devices_args(&mut a);
        for (i, d) in self.disks.iter().enumerate() {
            disk_args(&mut a, i, d);
        }
        for (i, n) in self.nics.iter().enumerate() {
            nic_args(&mut a, i, n);
        }
        self.control_args(&mut a);
        if let Some(Incoming::Defer) = self.incoming {
            a.push(&["-incoming", "defer"]);
        }
        if self.paused {
            a.push(&["-S"]);
        }
        Ok(a.0)
    }

    fn devices_args(&self, a: &mut Args) {
        let (mut vmem, mut pmem) = (0, 0);
        for d in &self.devices {
            match d {
                Device::Pvpanic => a.push(&["-action", "panic=pause", "-device", "pvpanic"]),
                Device::PvpanicPci => a.push(&["-action", "panic=pause", "-device", "pvpanic-pci"]),
                Device::Vmcoreinfo => a.push(&["-device", "vmcoreinfo"]),
                Device::Watchdog => a.push(&[
                    "-device",
                    "i6300esb,id=watchdog0",
                    "-action",
                    "watchdog=pause",
                ]),
                Device::Balloon => a.push(&["-device", "virtio-balloon-pci,id=balloon0"]),
                Device::VirtioMem {
                    backend,
                    size_mib,
                    requested_mib,
                    block_mib,
                } => {
                    let id = format!("vmem{vmem}");
                    vmem += 1;
                    let mem = format!("{id}-mem");
                    // Anonymous memory has no object: virtio-mem always needs one.
                    let obj = backend
                        .object(&mem, *size_mib)
                        .unwrap_or_else(|| format!("memory-backend-ram,id={mem},size={size_mib}M"));
                    a.push(&["-object", &obj]);
                    a.push(&[
                        "-device",
                        &format!("virtio-mem-pci,id={id},memdev={mem},requested-size={requested_mib}M,block-size={block_mib}M"),
                    ]);
                }
                Device::VirtioPmem { path, size_mib } => {
                    let id = format!("pmem{pmem}");
                    pmem += 1;
                    a.push(&[
                        "-object",
                        &format!(
                            "memory-backend-file,id={id}-mem,share=on,mem-path={},size={size_mib}M",
                            opt_path(path)
                        ),
                        "-device",
                        &format!("virtio-pmem-pci,memdev={id}-mem,id={id}"),
                    ]);
                }
            }
        }
    }

    fn control_args(&self, a: &mut Args) {
        let c = &self.control;
        if let Some(agent) = &c.agent {
            a.push(&["-device", "virtio-serial-pci,id=vser0"]);
            a.push(&[
                "-chardev",
                &format!(
                    "socket,id=agent0,path={},server=on,wait=off",
                    opt_path(agent)
                ),
            ]);
            a.push(&[
                "-device",
                "virtserialport,bus=vser0.0,chardev=agent0,name=org.rebound.agent",
            ]);
        }
        match &c.serial {
            Serial::None => {}
            Serial::File(p) => a.push(&["-serial", &format!("file:{}", p.to_string_lossy())]),
            Serial::Socket { socket, log } => {
                // Without a client QEMU drops the guest's output (wait=off): nothing
                // blocks and nothing grows.
                let mut dev = format!(
                    "socket,id=serial0,path={},server=on,wait=off",
                    opt_path(socket)
                );
                if let Some(log) = log {
                    // Appended: a settle's second QEMU logs into the same file.
                    dev.push_str(&format!(",logfile={},logappend=on", opt_path(log)));
                }
                a.push(&["-chardev", &dev]);
                a.push(&["-serial", "chardev:serial0"]);
            }
        }
        if let Some(q) = &c.qmp {
            a.push(&[
                "-chardev",
                &format!("socket,id=qmp0,path={},server=on,wait=off", opt_path(q)),
            ]);
            a.push(&["-mon", "chardev=qmp0,mode=control"]);
        }
        if let Some(h) = &c.hmp {
            a.push(&[
                "-chardev",
                &format!("socket,id=hmp0,path={},server=on,wait=off", opt_path(h)),
            ]);
            a.push(&["-mon", "chardev=hmp0,mode=readline"]);
        }
        if let Some(p) = &c.pidfile {
            a.push(&["-pidfile", &p.to_string_lossy()]);
        }
    }
}

#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn push(&mut self, xs: &[&str]) {
        self.0.extend(xs.iter().map(|s| s.to_string()));
    }
}

fn disk_args(a: &mut Args, i: usize, d: &Disk) {
    let ro = d.readonly;
    match &d.backend {
        BlockBackend::File {
            path,
            format,
            locking,
        } => {
            // JSON syntax: file names need no escaping.
            let node = json!({
                "driver": format.as_str(),
                "node-name": format!("drive{i}"),
                "read-only": ro,
                "file": {
                    "driver": "file",
                    "filename": path.to_string_lossy(),
                    "locking": if *locking { "on" } else { "off" },
                    "read-only": ro,
                    "cache": {"direct": d.direct},
                },
            });
            a.push(&["-blockdev", &node.to_string()]);
            a.push(&[
                "-device",
                &format!("virtio-blk-pci,drive=drive{i},id=disk{i},serial=disk{i}"),
            ]);
        }
        BlockBackend::Nbd { socket, export } => {
            let node = json!({
                "driver": "nbd",
                "node-name": format!("drive{i}"),
                "read-only": ro,
                "server": {"type": "unix", "path": socket.to_string_lossy()},
                "export": export,
            });
            a.push(&["-blockdev", &node.to_string()]);
            a.push(&[
                "-device",
                &format!("virtio-blk-pci,drive=drive{i},id=disk{i},serial=disk{i}"),
            ]);
        }
        BlockBackend::VhostUser { socket } => {
            // reconnect=1: a restarted backend costs the guest only the outage.
            a.push(&[
                "-chardev",
                &format!("socket,id=vhost{i},path={},reconnect=1", opt_path(socket)),
                "-device",
                &format!("vhost-user-blk-pci,chardev=vhost{i},id=disk{i}"),
            ]);
        }
    }
}

fn nic_args(a: &mut Args, i: usize, n: &Nic) {
    let id = format!("net{i}");
    let netdev = match &n.backend {
        NetBackend::User { forwards } => {
            let mut s = format!("user,id={id}");
            for f in forwards {
                s.push_str(&format!(",hostfwd=tcp:{}:{}-:{}", f.bind, f.host, f.guest));
            }
            s
        }
        NetBackend::Tap { ifname } => {
            format!(
                "tap,id={id},ifname={},script=no,downscript=no,vnet_hdr=off",
                opt_escape(ifname)
            )
        }
        NetBackend::StreamUnix { path, server } => format!(
            "stream,id={id},server={},addr.type=unix,addr.path={}",
            if *server { "on" } else { "off" },
            opt_path(path)
        ),
    };
    a.push(&["-netdev", &netdev]);
    let mut dev = format!("virtio-net-pci,netdev={id},id=nic{i}");
    if let Some(mac) = &n.mac {
        dev.push_str(&format!(",mac={mac}"));
    }
    // romfile= : no iPXE option ROM, we never boot from the network.
    dev.push_str(",romfile=");
    a.push(&["-device", &dev]);
    for (j, f) in n.filters.iter().enumerate() {
        let obj = match f {
            NetFilter::Dump { file } => format!(
                "filter-dump,id={id}-f{j},netdev={id},file={}",
                opt_path(file)
            ),
            NetFilter::Buffer { interval_us } => {
                format!("filter-buffer,id={id}-f{j},netdev={id},interval={interval_us}")
            }
        };
        a.push(&["-object", &obj]);
    }
}

#[cfg(test)]
mod tests;
