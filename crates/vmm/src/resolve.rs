//! Resolving a checked spec into everything QEMU needs: the binary, the kernel and
//! its command line (from an image or the user's files), the VM's own disks, the
//! accelerator and the forwarded ports. All checks run before anything is created.

use std::path::{Path, PathBuf};

use rebound_api::disk::DiskServing;
use rebound_api::spec::{BootSource, DiskBackend};
use rebound_api::{Forward, PortForward, ReadySpec, VmSpec};
use serde::{Deserialize, Serialize};

use crate::accel::{self, AccelDecision, AccelError, HostFacts};
use crate::disks::{self, DiskError};
use crate::paths::{Paths, RunDir};
use crate::process::{self, ProcessError};
use crate::qemu::{
    BlockBackend, Boot, Control, Disk, DiskFormat, HostForward, MemoryBackend, NetBackend, Nic,
    QemuCommand, Serial,
};

/// Errors resolving a spec.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error(transparent)]
    Qemu(#[from] ProcessError),
    #[error(transparent)]
    Accel(#[from] AccelError),
    #[error("image {0:?} cannot be used ({1}); build it with `rebound image build {0}`")]
    Image(String, String),
    #[error("kernel file {0} not found")]
    NoKernel(PathBuf),
    #[error("initrd file {0} not found")]
    NoInitrd(PathBuf),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("cannot create {0}")]
    Dir(PathBuf, #[source] std::io::Error),
    #[error("memory {0} MiB does not fit in {1} ({2} MiB in all), where guest RAM lives")]
    MemoryTooLarge(u64, PathBuf, u64),
    #[error(transparent)]
    Spec(#[from] rebound_api::SpecError),
    #[error(transparent)]
    Net(#[from] crate::net::NetError),
}

impl BootError {
    /// Whether the user's input is at fault (HTTP 400) rather than the host (500).
    pub fn is_user_error(&self) -> bool {
        !matches!(
            self,
            BootError::Qemu(_)
                | BootError::Dir(..)
                | BootError::Net(crate::net::NetError::NoIp(_) | crate::net::NetError::Ip(..))
        ) && !matches!(
            self,
            BootError::Disk(DiskError::NoQemuImg | DiskError::Overlay(..))
        )
    }
}

/// A spec resolved on this host.
pub struct Resolved {
    pub qemu: PathBuf,
    pub command: QemuCommand,
    pub accel: AccelDecision,
    pub forwards: Vec<PortForward>,
    pub ready: ReadySpec,
    /// Disk backends the VM's vhost-user disks need running before QEMU starts.
    pub backends: Vec<BlkServe>,
}

/// One disk served by Rebound's backend process (`rebound blk serve`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlkServe {
    pub disk: PathBuf,
    pub socket: PathBuf,
    pub control: PathBuf,
    pub log: PathBuf,
    pub cache_bytes: u64,
    /// The cache holds only what the guest evicts (`vm memory --host-cache`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    pub queues: u16,
    pub serial: String,
}

fn open_image(home: &Path, name: &str) -> Result<crate::images::ImageBoot, BootError> {
    crate::images::open(home, name).map_err(|e| BootError::Image(name.to_string(), e.to_string()))
}

fn must_exist(p: &str, err: fn(PathBuf) -> BootError) -> Result<PathBuf, BootError> {
    let path = PathBuf::from(p);
    if path.is_file() {
        Ok(std::fs::canonicalize(&path).unwrap_or(path))
    } else {
        Err(err(path))
    }
}

/// Checks the host files a spec boots from or maps (kernel, initrd, pmem files) as
/// a start does: each a regular file, a pmem file raw and a whole number of 2 MiB.
/// A restore runs it on the files its user named before anything is loaded.
pub fn check_host_files(spec: &VmSpec) -> Result<(), BootError> {
    if let Some(k) = &spec.kernel {
        must_exist(k, BootError::NoKernel)?;
    }
    if let Some(i) = &spec.initrd {
        must_exist(i, BootError::NoInitrd)?;
    }
    for p in &spec.pmem {
        disks::pmem_size_mib(Path::new(p))?;
    }
    Ok(())
}

/// The kernel command line for one of our images: the image's own plus the workload.
pub fn image_append(base: &str, spec: &VmSpec) -> String {
    let mut a = base.trim().to_string();
    // The cluster address for Rebound's init (`validate` allows one NIC with ip=).
    for (i, n) in spec.nic_opts().unwrap_or_default().iter().enumerate() {
        if let Some((ip, prefix)) = n.ip {
            let mac = n
                .mac
                .unwrap_or_else(|| rebound_api::nic::Mac::for_vm(&spec.name, i));
            a.push_str(&format!(" rebound.net={mac}@{ip}/{prefix}"));
        }
    }
    let w = spec.workload.map(|w| w.as_str()).unwrap_or("none");
    match spec.workload_args.get("also") {
        Some(also) => a.push_str(&format!(" rebound.workload={w},{also}")),
        None => a.push_str(&format!(" rebound.workload={w}")),
    }
    for (k, v) in spec.guest_workload_args() {
        a.push_str(&format!(" rebound.{k}={v}"));
    }
    a
}

/// The forwards a VM gets: the user's, plus the workload's service port and the
/// readiness probe's port if not already forwarded. Host port 0 picks a free port.
pub fn plan_forwards(spec: &VmSpec, ready: &ReadySpec) -> Result<Vec<PortForward>, ProcessError> {
    let mut fw: Vec<Forward> = spec.forwards.clone();
    let service = spec.service_port();
    for extra in [service, ready.guest_port()].into_iter().flatten() {
        if !fw.iter().any(|f| f.guest == extra) {
            fw.push(Forward {
                host: 0,
                guest: extra,
            });
        }
    }
    let mut out = Vec::new();
    for f in fw {
        let host = if f.host == 0 {
            process::free_port()?
        } else {
            f.host
        };
        let name = match service {
            Some(p) if p == f.guest => spec.workload.map(|w| w.as_str().to_string()),
            _ => None,
        };
        out.push(PortForward {
            host,
            guest: f.guest,
            service: name,
        });
    }
    Ok(out)
}

/// Guest RAM is a file on the run dir's filesystem (tmpfs): a guest larger than the
/// whole filesystem would die of SIGBUS once it touched enough memory. (Sparse files
/// let several guests share the space; only the impossible is refused.)
fn check_ram_fits(run: &Path, memory_mib: u64) -> Result<(), BootError> {
    crate::private::create_dir_all(run).map_err(|e| BootError::Dir(run.to_path_buf(), e))?;
    let Ok(st) = nix::sys::statvfs::statvfs(run) else {
        return Ok(()); // cannot tell: let QEMU try
    };
    let total_mib = st.blocks().saturating_mul(st.fragment_size()) >> 20;
    if memory_mib > total_mib {
        return Err(BootError::MemoryTooLarge(
            memory_mib,
            run.to_path_buf(),
            total_mib,
        ));
    }
    Ok(())
}

/// A VM's forwards as its QEMU's user network holds them: on loopback.
pub fn host_forwards(forwards: &[PortForward]) -> Vec<HostForward> {
    forwards
        .iter()
        .map(|f| HostForward {
            bind: std::net::Ipv4Addr::LOCALHOST,
            host: f.host,
            guest: f.guest,
        })
        .collect()
}

/// The QEMU a supervised VM runs as: guest RAM a shared file in its run directory,
/// the crash devices, user networking with the forwards on loopback, the agent
/// port, the serial console on a logged socket, QMP and a pid file.
pub fn vm_command(
    run: &RunDir,
    accel: rebound_api::Accel,
    memory_mib: u64,
    boot: Boot,
    forwards: &[PortForward],
) -> QemuCommand {
    let mut q = QemuCommand::new(accel, memory_mib, MemoryBackend::SharedFile(run.ram()))
        .with_crash_devices();
    q.boot = Some(boot);
    q.nics.push(Nic {
        backend: NetBackend::User {
            forwards: host_forwards(forwards),
        },
        mac: None,
        filters: Vec::new(),
    });
    q.control = Control {
        qmp: Some(run.qmp()),
        hmp: None,
        agent: Some(run.agent()),
        serial: Serial::Socket {
            socket: run.serial_sock(),
            // The daemon's console link logs, capped, off the RAM tmpfs.
            log: None,
        },
        pidfile: Some(run.pidfile()),
    };
    q
}

/// Resolves `spec` for this host, creating the VM's writable disk copy last.
/// How a recovery VM (started after a crash, on the crashed VM's disks) differs from
/// a fresh start.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The crashed VM's forwards: the service comes back on the same host ports.
    pub forwards: Vec<PortForward>,
    /// Memory to boot with; the rest of the VM's memory is plugged in later with
    /// virtio-mem, as the crashed VM's memory is given back. `None`: all at once.
    pub boot_memory_mib: Option<u64>,
}

/// Block size of the recovery VM's virtio-mem device, in MiB.
pub const VIRTIO_MEM_BLOCK_MIB: u64 = 2;

pub fn resolve(
    paths: &Paths,
    host: &HostFacts,
    spec: &VmSpec,
    boot: BootSource,
    ready: ReadySpec,
    recovery: Option<&Recovery>,
) -> Result<Resolved, BootError> {
    let qemu = process::find_qemu()?;
    let (kernel, initrd, append, image_disk) = match &boot {
        BootSource::Image(name) => {
            let img = open_image(&paths.home, name)?;
            let append = image_append(&img.append, spec);
            (img.kernel, Some(img.initrd), append, Some(img.disk))
        }
        BootSource::Kernel => {
            let kernel = must_exist(
                spec.kernel.as_deref().unwrap_or_default(),
                BootError::NoKernel,
            )?;
            let initrd = match &spec.initrd {
                Some(i) => Some(must_exist(i, BootError::NoInitrd)?),
                None => None,
            };
            (
                kernel,
                initrd,
                spec.append.clone().unwrap_or_default(),
                None,
            )
        }
    };
    // Each disk with how it is served: the image's follows the VM's settings.
    let mut user_disks = Vec::new();
    for d in spec.disk_opts().map_err(BootError::Spec)? {
        let how = spec.serving(Some(&d));
        let disk = match d.size {
            Some(n) => disks::sized_disk(Path::new(&d.path), n)?,
            None => disks::user_disk(Path::new(&d.path))?,
        };
        user_disks.push((disk, how));
    }
    let accel = accel::choose(spec.accel, host)?;
    check_ram_fits(&paths.run, spec.memory_mib)?;
    let forwards = match recovery {
        Some(r) => r.forwards.clone(),
        None => plan_forwards(spec, &ready)?,
    };

    let dir = paths.vm(&spec.name);
    crate::private::create_dir_all(dir.path())
        .map_err(|e| BootError::Dir(dir.path().to_path_buf(), e))?;
    let mut all_disks: Vec<(Disk, DiskServing)> = Vec::new();
    if let Some(base) = image_disk {
        let overlay = dir.disk_overlay(0);
        let raw = dir.disk_raw(0);
        let how = spec.serving(None);
        let ours = how.backend == DiskBackend::Rebound;
        let disk = match (recovery, ours) {
            // The service must see its data: the crashed VM's own copy, as it left it.
            (Some(_), false) => disks::existing_overlay(&overlay)?,
            (None, false) => disks::create_overlay(&base, &overlay)?,
            (Some(_), true) => disks::user_disk(&raw)?,
            (None, true) => disks::raw_copy(&base, &raw)?,
        };
        all_disks.push((disk, how));
    }
    all_disks.extend(user_disks);
    let mut backends = Vec::new();
    let blk = paths.blk_dir(&spec.name);
    for (i, (d, how)) in all_disks.iter_mut().enumerate() {
        d.direct = how.direct;
        if how.backend != DiskBackend::Rebound {
            continue;
        }
        let BlockBackend::File { path, format, .. } = &d.backend else {
            continue;
        };
        if *format != DiskFormat::Raw {
            return Err(BootError::Disk(disks::DiskError::NotRaw(path.clone())));
        }
        let socket = blk.join(format!("disk{i}.sock"));
        backends.push(BlkServe {
            disk: path.clone(),
            socket: socket.clone(),
            control: blk.join(format!("disk{i}.ctl")),
            log: dir.path().join(format!("blk-disk{i}.log")),
            cache_bytes: how.cache_bytes,
            exclusive: false,
            queues: spec.cpus as u16,
            serial: format!("disk{i}"),
        });
        d.backend = BlockBackend::VhostUser { socket };
    }
    let run = paths.run_dir(&spec.name);
    let boot_memory = recovery
        .and_then(|r| r.boot_memory_mib)
        .filter(|m| *m < spec.memory_mib);
    let append = match boot_memory {
        // Plugged memory must be movable to be unplugged again, and online at once.
        Some(_) => format!("{append} memhp_default_state=online_movable"),
        None => append,
    };

    let mut command = vm_command(
        &run,
        accel.accel,
        boot_memory.unwrap_or(spec.memory_mib),
        Boot {
            kernel,
            initrd,
            append,
        },
        &forwards,
    );
    command.cpus = spec.cpus;
    command.disks = all_disks.into_iter().map(|(d, _)| d).collect();
    for (i, n) in spec.nic_opts()?.iter().enumerate() {
        let ifname = crate::net::plug(&spec.name, i, &n.bridge)?;
        let mac = n
            .mac
            .unwrap_or_else(|| rebound_api::nic::Mac::for_vm(&spec.name, i));
        command.nics.push(Nic {
            backend: NetBackend::Tap { ifname },
            mac: Some(mac.to_string()),
            filters: Vec::new(),
        });
    }
    let mut pmem_mib = 0;
    for p in &spec.pmem {
        let path = PathBuf::from(p);
        let size_mib = disks::pmem_size_mib(&path)?;
        pmem_mib += size_mib;
        command
            .devices
            .push(crate::qemu::Device::VirtioPmem { path, size_mib });
    }
    if pmem_mib > 0 {
        command.memory.max_mib = Some(spec.memory_mib + pmem_mib);
    }
    if let Some(m) = boot_memory {
        command.memory.max_mib = Some(spec.memory_mib + pmem_mib);
        command.devices.push(crate::qemu::Device::VirtioMem {
            backend: MemoryBackend::SharedFile(run.vmem()),
            size_mib: spec.memory_mib - m,
            requested_mib: 0,
            block_mib: VIRTIO_MEM_BLOCK_MIB,
        });
    }
    Ok(Resolved {
        qemu,
        command,
        accel,
        forwards,
        ready,
        backends,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebound_api::Workload;

    #[test]
    fn workload_goes_on_the_cmdline() {
        let mut s = VmSpec::new("a");
        s.workload = Some(Workload::Memfill);
        s.workload_args.insert("memfill".into(), "32M".into());
        assert_eq!(
            image_append("console=ttyS0 quiet ", &s),
            "console=ttyS0 quiet rebound.workload=memfill rebound.memfill=33554432"
        );
        assert_eq!(
            image_append("x", &VmSpec::new("b")),
            "x rebound.workload=none"
        );
    }

    #[test]
    fn forwards_cover_service_and_probe() {
        let mut s = VmSpec::new("a");
        s.workload = Some(Workload::Web);
        s.forwards.push(Forward { host: 0, guest: 22 });
        let f = plan_forwards(&s, &"tcp:9000".parse().unwrap()).unwrap();
        let guests: Vec<u16> = f.iter().map(|f| f.guest).collect();
        assert_eq!(guests, [22, 8080, 9000]);
        assert!(f.iter().all(|f| f.host != 0));
        assert_eq!(f[1].service.as_deref(), Some("web"));
        assert_eq!(f[0].service, None);
        s.forwards = vec![Forward {
            host: 12345,
            guest: 8080,
        }];
        let f = plan_forwards(&s, &ReadySpec::Agent).unwrap();
        assert_eq!(
            f,
            vec![PortForward {
                host: 12345,
                guest: 8080,
                service: Some("web".into())
            }]
        );
    }
}
