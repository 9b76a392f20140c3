//! Resolving a checked spec into everything QEMU needs: the binary, the kernel and
//! its command line (from an image or the user's files), the VM's own disks, the
//! accelerator and the forwarded ports. All checks run before anything is created.

use std::path::{Path, PathBuf};

use crate::paths::Paths;
use crate::spec::{BootSource, Forward, ReadySpec, VmSpec};
use crate::vm::accel::{self, AccelDecision, AccelError, HostFacts};
use crate::vm::argv::{DiskArg, QemuConfig};
use crate::vm::disks::{self, DiskError};
use crate::vm::process::{self, ProcessError};
use crate::vm::record::PortForward;

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
    #[error("cannot create {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("memory {0} MiB does not fit in {1} ({2} MiB in all), where guest RAM lives")]
    MemoryTooLarge(u64, PathBuf, u64),
}

impl BootError {
    /// Whether the user's input is at fault (HTTP 400) rather than the host (500).
    pub fn is_user_error(&self) -> bool {
        !matches!(self, BootError::Qemu(_) | BootError::Dir(..))
            && !matches!(
                self,
                BootError::Disk(DiskError::NoQemuImg | DiskError::Overlay(..))
            )
    }
}

/// A spec resolved on this host.
pub struct Resolved {
    pub qemu: PathBuf,
    pub config: QemuConfig,
    pub accel: AccelDecision,
    pub forwards: Vec<PortForward>,
    pub ready: ReadySpec,
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

/// The kernel command line for one of our images: the image's own plus the workload.
pub fn image_append(base: &str, spec: &VmSpec) -> String {
    let mut a = base.trim().to_string();
    let w = spec.workload.map(|w| w.as_str()).unwrap_or("none");
    a.push_str(&format!(" rebound.workload={w}"));
    for (k, v) in &spec.workload_args {
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
    std::fs::create_dir_all(run).map_err(|e| BootError::Dir(run.to_path_buf(), e))?;
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

/// Resolves `spec` for this host, creating the VM's writable disk copy last.
pub fn resolve(
    paths: &Paths,
    host: &HostFacts,
    spec: &VmSpec,
    boot: BootSource,
    ready: ReadySpec,
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
    let mut user_disks = Vec::new();
    for d in &spec.disks {
        user_disks.push(disks::user_disk(Path::new(d))?);
    }
    let accel = accel::choose(spec.accel, host)?;
    check_ram_fits(&paths.run, spec.memory_mib)?;
    let forwards = plan_forwards(spec, &ready)?;

    let dir = paths.vm(&spec.name);
    std::fs::create_dir_all(dir.path()).map_err(|e| BootError::Dir(dir.path().to_path_buf(), e))?;
    let mut all_disks: Vec<DiskArg> = Vec::new();
    if let Some(base) = image_disk {
        all_disks.push(disks::create_overlay(&base, &dir.disk_overlay(0))?);
    }
    all_disks.extend(user_disks);

    let config = QemuConfig {
        memory_mib: spec.memory_mib,
        cpus: spec.cpus,
        accel: accel.accel,
        run: paths.run_dir(&spec.name),
        kernel,
        initrd,
        append,
        disks: all_disks,
        forwards: forwards.iter().map(|f| (f.host, f.guest)).collect(),
    };
    Ok(Resolved {
        qemu,
        config,
        accel,
        forwards,
        ready,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Workload;

    #[test]
    fn workload_goes_on_the_cmdline() {
        let mut s = VmSpec::new("a");
        s.workload = Some(Workload::Memfill);
        s.workload_args.insert("memfill".into(), "32M".into());
        assert_eq!(
            image_append("console=ttyS0 quiet ", &s),
            "console=ttyS0 quiet rebound.workload=memfill rebound.memfill=32M"
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
