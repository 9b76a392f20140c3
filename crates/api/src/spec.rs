//! What the user asks for: the VM spec (the API's `VmSpec`), sizes, names, forwards
//! and readiness conditions, each parsed with an error that names the bad input.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use crate::disk::DiskBackend;
pub use crate::parse::{
    parse_memfill, parse_memory_mib, parse_size, validate_name, SpecError, MEMFILL_MAX,
};

/// `IP:PORT,IP:PORT,...` (IPv4, at most 16 peers as the agent takes, no duplicates).
fn valid_peers(v: &str) -> bool {
    let all: Vec<&str> = v.split(',').collect();
    all.len() <= 16
        && all.iter().all(|p| {
            p.parse::<std::net::SocketAddrV4>()
                .is_ok_and(|a| a.port() > 0)
        })
        && all.iter().enumerate().all(|(i, p)| !all[..i].contains(p))
}

/// The agent's `rebound.io_dir`: `/data/NAME[/NAME...]`, names of `[A-Za-z0-9._-]`,
/// none `.` or `..`, under 64 bytes.
fn valid_io_dir(v: &str) -> bool {
    v.len() < 64
        && v.strip_prefix("/data/").is_some_and(|rest| {
            rest.split('/').all(|seg| {
                !seg.is_empty()
                    && seg != "."
                    && seg != ".."
                    && seg
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            })
        })
}

/// A plain decimal in `0..=max` as the agent reads it: digits and at most one point.
fn valid_decimal(v: &str, max: f64) -> bool {
    let digits = v.bytes().filter(u8::is_ascii_digit).count();
    (1..=20).contains(&digits)
        && v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && v.bytes().filter(|&b| b == b'.').count() <= 1
        && v.parse::<f64>().is_ok_and(|x| (0.0..=max).contains(&x))
}

/// Digits only (no sign) and within `lo..=hi`.
fn valid_uint(v: &str, lo: u64, hi: u64) -> bool {
    !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && v.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n))
}

/// Workloads the guest agent can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Web,
    Kv,
    Memfill,
    Counter,
    /// Reads and writes a file on the data disk in phases, reporting throughput and
    /// latency percentiles (`io`, `io_size`, `io_bs`, `io_direct`, `io_seconds`,
    /// `io_rounds`).
    Io,
    /// Exchanges requests and heartbeats with its peers over a cluster network
    /// (`peers`, `peer_port`, `peer_hb_ms`, `peer_dead_ms`, `peer_req_ms`,
    /// `peer_req_bytes`) and answers host clients' `QUERY`.
    Peer,
    /// Behaves as a hostile guest: writes its serial console and the agent channel
    /// as fast as it can (`error` lines, `ready` with a new eviction ring each time),
    /// to show what the host holds to a limit.
    Flood,
    None,
}

impl Workload {
    pub fn as_str(self) -> &'static str {
        match self {
            Workload::Web => "web",
            Workload::Kv => "kv",
            Workload::Memfill => "memfill",
            Workload::Counter => "counter",
            Workload::Io => "io",
            Workload::Peer => "peer",
            Workload::Flood => "flood",
            Workload::None => "none",
        }
    }

    /// The guest TCP port the workload serves on, if it serves at all.
    pub fn default_port(self) -> Option<u16> {
        match self {
            Workload::Web => Some(8080),
            Workload::Kv => Some(7070),
            Workload::Peer => Some(7400),
            _ => None,
        }
    }
}

impl FromStr for Workload {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        Ok(match s {
            "web" => Workload::Web,
            "kv" => Workload::Kv,
            "memfill" => Workload::Memfill,
            "counter" => Workload::Counter,
            "io" => Workload::Io,
            "peer" => Workload::Peer,
            "flood" => Workload::Flood,
            "none" => Workload::None,
            _ => return Err(SpecError::Workload(s.to_string())),
        })
    }
}

/// The accelerator the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AccelChoice {
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AccelChoice::Auto),
            "kvm" => Ok(AccelChoice::Kvm),
            "tcg" => Ok(AccelChoice::Tcg),
            _ => Err(format!(
                "unknown accelerator {s:?}: expected auto, kvm or tcg"
            )),
        }
    }
}

/// A host port forwarded to a guest TCP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    /// 0 = pick a free port at start.
    pub host: u16,
    pub guest: u16,
}

impl FromStr for Forward {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let err = || SpecError::Forward(s.to_string());
        let (h, g) = s.split_once(':').ok_or_else(err)?;
        let host: u16 = h.parse().map_err(|_| err())?;
        let guest: u16 = g.parse().map_err(|_| err())?;
        if guest == 0 {
            return Err(err());
        }
        Ok(Forward { host, guest })
    }
}

/// When a guest counts as ready.
#[derive(Debug, Clone)]
pub enum ReadySpec {
    /// The guest agent reported `ready`.
    Agent,
    /// A TCP connect to this guest port (through its forward) succeeds.
    Tcp(u16),
    /// An HTTP GET of this guest port and path answers with a status below 400.
    Http { port: u16, path: String },
    /// The serial log matches this regex.
    Serial(regex::Regex),
}

impl ReadySpec {
    /// The guest port this condition probes, which must be forwarded.
    pub fn guest_port(&self) -> Option<u16> {
        match self {
            ReadySpec::Tcp(p) | ReadySpec::Http { port: p, .. } => Some(*p),
            _ => None,
        }
    }
}

impl FromStr for ReadySpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let err = || SpecError::Ready(s.to_string());
        let port = |p: &str| -> Result<u16, SpecError> {
            match p.parse::<u16>() {
                Ok(0) | Err(_) => Err(err()),
                Ok(p) => Ok(p),
            }
        };
        if s == "agent" {
            return Ok(ReadySpec::Agent);
        }
        let (kind, rest) = s.split_once(':').ok_or_else(err)?;
        match kind {
            "tcp" => Ok(ReadySpec::Tcp(port(rest)?)),
            "http" => {
                let (p, path) = match rest.find('/') {
                    Some(i) => (&rest[..i], rest[i..].to_string()),
                    None => (rest, "/".to_string()),
                };
                Ok(ReadySpec::Http {
                    port: port(p)?,
                    path,
                })
            }
            "serial" if !rest.is_empty() => regex::Regex::new(rest)
                .map(ReadySpec::Serial)
                .map_err(|e| SpecError::ReadyRegex(rest.to_string(), e.to_string())),
            _ => Err(err()),
        }
    }
}

impl fmt::Display for ReadySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadySpec::Agent => write!(f, "agent"),
            ReadySpec::Tcp(p) => write!(f, "tcp:{p}"),
            ReadySpec::Http { port, path } => write!(f, "http:{port}{path}"),
            ReadySpec::Serial(r) => write!(f, "serial:{}", r.as_str()),
        }
    }
}

fn default_memory() -> u64 {
    256
}
fn default_cpus() -> u32 {
    1
}

/// A VM as the user described it; the JSON form is the API's `VmSpec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default)]
    pub initrd: Option<String>,
    #[serde(default)]
    pub append: Option<String>,
    /// Extra disks, each `FILE[,backend=..][,cache=..][,size=..]` ([`crate::disk`]).
    #[serde(default)]
    pub disks: Vec<String>,
    #[serde(default = "default_memory")]
    pub memory_mib: u64,
    #[serde(default = "default_cpus")]
    pub cpus: u32,
    #[serde(default)]
    pub workload: Option<Workload>,
    #[serde(default)]
    pub workload_args: BTreeMap<String, String>,
    #[serde(default)]
    pub accel: AccelChoice,
    #[serde(default)]
    pub ready: Option<String>,
    #[serde(default)]
    pub forwards: Vec<Forward>,
    /// What happens when the guest panics or hangs.
    #[serde(default)]
    pub crash: crate::crash::CrashPolicy,
    #[serde(default, skip_serializing_if = "is_qemu")]
    pub disk_backend: DiskBackend,
    /// Host cache per disk served by Rebound's backend, MiB (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disk_cache_mib: u64,
    /// QEMU-served disks bypass the host page cache (`O_DIRECT`, QEMU's cache=none).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_direct: bool,
    /// Files exposed as virtio-pmem devices (`/dev/pmemN` in the guest): an ext4 on one
    /// is mounted with DAX at /data when `data_disk=pmemN`, so the guest reads the
    /// host's page cache directly and keeps no copy of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<String>,
    /// NICs on host bridges beside the user network, each
    /// `bridge=BR[,mac=MAC][,ip=IP/PREFIX]` ([`crate::nic`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<String>,
}

/// One host path a VM spec names, and the field that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPath {
    pub field: &'static str,
    pub path: String,
}

/// Host files a user names again for a restore (`vm restore --kernel, --initrd,
/// --pmem`): the snapshot's own words for them are never used.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamedFiles {
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub pmem: Vec<String>,
}

impl NamedFiles {
    /// Each file with the flag that names it.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &String)> {
        self.kernel
            .iter()
            .map(|p| ("--kernel", p))
            .chain(self.initrd.iter().map(|p| ("--initrd", p)))
            .chain(self.pmem.iter().map(|p| ("--pmem", p)))
    }
}

impl VmSpec {
    /// Every host file or directory this spec makes the daemon open, create, map or
    /// write: what a spec from someone other than the daemon's user (a cluster peer,
    /// a snapshot's manifest) must not carry. Bridges are host resources but not
    /// paths, and image names resolve inside the daemon's own image store.
    pub fn host_paths(&self) -> Vec<HostPath> {
        let one = |field, p: &Option<String>| p.clone().map(|path| HostPath { field, path });
        let disks = self.disks.iter().map(|d| HostPath {
            field: "disks",
            // The entry's options are not paths: only what comes before them.
            path: d.split(',').next().unwrap_or(d).to_string(),
        });
        let pmem = self.pmem.iter().map(|p| HostPath {
            field: "pmem",
            path: p.clone(),
        });
        one("kernel", &self.kernel)
            .into_iter()
            .chain(one("initrd", &self.initrd))
            .chain(disks)
            .chain(pmem)
            .chain(one("crash.dump_dir", &self.crash.dump_dir))
            .chain(one("crash.recover_from", &self.crash.recover_from))
            .collect()
    }

    /// This spec as a snapshot's manifest recorded it, made safe to restore: no host
    /// path it names is opened on the snapshot's say-so. Its extra disks become the
    /// snapshot's own copies (`disk_copies`, one per extra disk, files inside the
    /// snapshot), keeping their options but `size=`; a dump directory or a
    /// `recover_from` is dropped, with a note saying so; a kernel, initrd or pmem
    /// file (host files QEMU would open or map) must be named again by the user
    /// (`named`), each one the VM had and no other: the restored devices must be
    /// the ones its device state holds.
    pub fn for_restore(
        mut self,
        disk_copies: &[String],
        named: &NamedFiles,
    ) -> Result<(VmSpec, Vec<String>), String> {
        for (flag, p) in named.iter() {
            if !p.starts_with('/') {
                return Err(format!("{flag} {p:?} must be an absolute path"));
            }
        }
        for (what, flag, had, given) in [
            ("kernel", "--kernel", &mut self.kernel, &named.kernel),
            ("initrd", "--initrd", &mut self.initrd, &named.initrd),
        ] {
            match (had.as_ref(), given) {
                (Some(p), None) => {
                    return Err(format!(
                        "the snapshot's VM booted the host file {p:?} as its {what}, and a snapshot's host paths are never opened on its say-so: pass {flag} FILE to name it again"
                    ))
                }
                (None, Some(g)) => {
                    return Err(format!(
                        "{flag} {g:?} names a file the snapshot's VM did not have (it booted no {what} of the user's): a restore's devices must be the snapshot's"
                    ))
                }
                (Some(_), Some(g)) => *had = Some(g.clone()),
                (None, None) => {}
            }
        }
        match (self.pmem.len(), named.pmem.len()) {
            (had, given) if had == given => self.pmem.clone_from(&named.pmem),
            (had, 0) => {
                return Err(format!(
                    "the snapshot's VM mapped the host file {:?} as a pmem device ({had} in all), and a snapshot's host paths are never opened on its say-so: pass --pmem FILE for each, in order",
                    self.pmem[0]
                ))
            }
            (0, given) => {
                return Err(format!(
                    "--pmem names {given} file(s) but the snapshot's VM had no pmem device: a restore's devices must be the snapshot's"
                ))
            }
            (had, given) => {
                return Err(format!(
                    "--pmem names {given} file(s) but the snapshot's VM had {had} pmem devices: name one file for each, in order"
                ))
            }
        }
        if disk_copies.len() != self.disks.len() {
            return Err(format!(
                "the snapshot holds {} copies of extra disks but its VM spec lists {}: the manifest does not fit together",
                disk_copies.len(),
                self.disks.len()
            ));
        }
        for (d, copy) in self.disks.iter_mut().zip(disk_copies) {
            let opts = d
                .split(',')
                .skip(1)
                .filter(|o| !o.starts_with("size="))
                .map(|o| format!(",{o}"))
                .collect::<String>();
            *d = format!("{copy}{opts}");
        }
        let mut notes = Vec::new();
        if let Some(d) = self.crash.dump_dir.take() {
            notes.push(format!(
                "the snapshot's dump directory {d:?} is not used: this VM's dumps go to its own crash directory"
            ));
        }
        if let Some(r) = self.crash.recover_from.take() {
            notes.push(format!(
                "the snapshot's recover_from {r:?} is not used: this VM's recovery VM boots"
            ));
        }
        Ok((self, notes))
    }

    /// The `disks` entries parsed (`validate` has checked them).
    pub fn disk_opts(&self) -> Result<Vec<crate::disk::DiskOpts>, SpecError> {
        self.disks.iter().map(|d| d.parse()).collect()
    }

    /// How a disk is served: its entry's options over this VM's settings (`None`: the
    /// image's disk, which follows the VM's).
    pub fn serving(&self, d: Option<&crate::disk::DiskOpts>) -> crate::disk::DiskServing {
        d.cloned().unwrap_or_default().serving(
            self.disk_backend,
            self.disk_cache_mib,
            self.disk_direct,
        )
    }

    /// The `nics` entries parsed (`validate` has checked them).
    pub fn nic_opts(&self) -> Result<Vec<crate::nic::NicOpts>, SpecError> {
        self.nics.iter().map(|n| n.parse()).collect()
    }

    /// Writes the MAC each NIC gets into its entry (one from the VM's name where none
    /// was given): a snapshot restored under another name keeps its guest's address.
    pub fn fill_macs(&mut self) -> Result<(), SpecError> {
        let mut opts = self.nic_opts()?;
        for (i, n) in opts.iter_mut().enumerate() {
            n.mac
                .get_or_insert_with(|| crate::nic::Mac::for_vm(&self.name, i));
        }
        self.nics = opts.iter().map(|n| n.to_string()).collect();
        Ok(())
    }

    /// Whether any disk, the image's included, is served by Rebound's backend.
    pub fn any_rebound_disk(&self) -> bool {
        self.disk_backend == DiskBackend::Rebound
            || self.disk_opts().is_ok_and(|v| {
                v.iter()
                    .any(|d| self.serving(Some(d)).backend == DiskBackend::Rebound)
            })
    }
}

fn is_qemu(b: &DiskBackend) -> bool {
    *b == DiskBackend::Qemu
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the guest boots once the spec is checked.
#[derive(Debug, Clone, PartialEq)]
pub enum BootSource {
    /// One of our images (has the agent).
    Image(String),
    /// The user's own kernel (no agent).
    Kernel,
}

impl VmSpec {
    /// A spec with defaults for everything but the name.
    pub fn new(name: &str) -> Self {
        VmSpec {
            name: name.to_string(),
            image: None,
            kernel: None,
            initrd: None,
            append: None,
            disks: Vec::new(),
            memory_mib: default_memory(),
            cpus: default_cpus(),
            workload: None,
            workload_args: BTreeMap::new(),
            accel: AccelChoice::Auto,
            ready: None,
            forwards: Vec::new(),
            crash: crate::crash::CrashPolicy::default(),
            disk_backend: DiskBackend::Qemu,
            disk_cache_mib: 0,
            disk_direct: false,
            pmem: Vec::new(),
            nics: Vec::new(),
        }
    }

    /// The guest port the workload serves on (`port` argument or its default).
    pub fn service_port(&self) -> Option<u16> {
        let w = self.workload?;
        w.default_port()?;
        let key = if w == Workload::Peer {
            "peer_port"
        } else {
            "port"
        };
        match self.workload_args.get(key) {
            Some(p) => p.parse().ok(),
            None => w.default_port(),
        }
    }

    /// The workload arguments as the guest agent gets them: sizes in bytes.
    pub fn guest_workload_args(&self) -> Vec<(String, String)> {
        self.workload_args
            .iter()
            // `also` joins the workload list itself (image_append).
            .filter(|(k, _)| k.as_str() != "also")
            .map(|(k, v)| match (k.as_str(), parse_memfill(v)) {
                ("memfill" | "disk_io" | "io_size" | "io_bs" | "io_file_size", Ok(n)) => {
                    (k.clone(), n.to_string())
                }
                _ => (k.clone(), v.clone()),
            })
            .collect()
    }

    /// Checks everything that can be checked without touching the host; returns the
    /// boot source and the readiness condition.
    pub fn validate(&self) -> Result<(BootSource, ReadySpec), SpecError> {
        validate_name(&self.name)?;
        if self.memory_mib < 16 {
            return Err(SpecError::MemoryTooSmall(self.memory_mib));
        }
        if !(1..=64).contains(&self.cpus) {
            return Err(SpecError::Cpus(self.cpus));
        }
        let boot = match (&self.image, &self.kernel) {
            (Some(_), Some(_)) => return Err(SpecError::ImageAndKernel),
            (None, Some(_)) => BootSource::Kernel,
            (Some(i), None) => BootSource::Image(i.clone()),
            (None, None) => {
                if self.initrd.is_some() || self.append.is_some() {
                    return Err(SpecError::BootWithoutKernel);
                }
                BootSource::Image("default".to_string())
            }
        };
        if let BootSource::Image(_) = boot {
            if self.initrd.is_some() || self.append.is_some() {
                return Err(SpecError::BootWithoutKernel);
            }
        }
        for f in &self.forwards {
            if f.guest == 0 {
                return Err(SpecError::Forward(format!("{}:{}", f.host, f.guest)));
            }
        }
        let ready = match &self.ready {
            Some(r) => r.parse()?,
            None if boot == BootSource::Kernel => {
                return Err(SpecError::AgentWithoutImage);
            }
            None => ReadySpec::Agent,
        };
        if boot == BootSource::Kernel {
            if matches!(ready, ReadySpec::Agent) {
                return Err(SpecError::AgentWithoutImage);
            }
            if self.workload.is_some() {
                return Err(SpecError::WorkloadWithoutImage);
            }
        }
        self.crash.validate(self.memory_mib)?;
        if self.disk_cache_mib > 0 && self.disk_backend != DiskBackend::Rebound {
            return Err(SpecError::DiskCacheWithoutBackend);
        }
        if self.disk_direct && self.disk_backend == DiskBackend::Rebound {
            return Err(SpecError::DiskDirectWithBackend);
        }
        for d in &self.disks {
            d.parse::<crate::disk::DiskOpts>()?;
        }
        let nics = self.nic_opts()?;
        if nics.iter().filter(|n| n.ip.is_some()).count() > 1 {
            return Err(SpecError::Nics(
                "only one NIC can carry ip=: the guest init configures one cluster address".into(),
            ));
        }
        if nics.len() > 8 {
            return Err(SpecError::Nics(format!(
                "{} NICs: at most 8 beside the user network",
                nics.len()
            )));
        }
        for (i, a) in nics.iter().enumerate() {
            if let Some(m) = a.mac {
                if nics[..i].iter().any(|b| b.mac == Some(m)) {
                    return Err(SpecError::Nics(format!("two NICs have the MAC {m}")));
                }
            }
        }
        for (k, v) in &self.workload_args {
            let ok = match k.as_str() {
                "memfill" | "disk_io" => parse_memfill(v).is_ok(),
                "counter_hz" => v.parse::<u32>().is_ok_and(|n| n > 0),
                "port" => v.parse::<u16>().is_ok_and(|n| n > 0),
                "watchdog_s" => v.parse::<u32>().is_ok_and(|n| (1..=600).contains(&n)),
                "io" => {
                    v.split(',')
                        .all(|p| ["seqread", "seqwrite", "randread", "randwrite"].contains(&p))
                        && v.split(',').count() <= 8
                }
                "io_size" => parse_memfill(v).is_ok_and(|n| n >= 4096 && n % 4096 == 0),
                "io_bs" => {
                    parse_memfill(v).is_ok_and(|n| (512..=4 << 20).contains(&n) && n % 512 == 0)
                }
                // evict=0: the image's init leaves the eviction-notice module out.
                "io_direct" | "io_keep" | "evict" => v == "0" || v == "1",
                // Tests only: the module forges, repeats and drops notices around every
                // Nth eviction (guest/evict/evict.c).
                "evict_misbehave" => valid_uint(v, 0, 1_000_000),
                "data_disk" => {
                    (v.len() == 3 && v.starts_with("vd") && v.as_bytes()[2].is_ascii_lowercase())
                        || (v.len() == 5
                            && v.starts_with("pmem")
                            && v.as_bytes()[4].is_ascii_digit())
                }
                // It goes on the guest's kernel command line: no space or control
                // character may start another parameter there.
                "io_target" => {
                    (v.starts_with("/data/") || v.starts_with("/dev/vd"))
                        && !v.contains("..")
                        && v.len() < 64
                        && v.bytes().all(|b| b.is_ascii_graphic())
                }
                "io_seconds" => v.parse::<u32>().is_ok_and(|n| (1..=3600).contains(&n)),
                "io_delay_s" => v.parse::<u32>().is_ok_and(|n| n <= 3600),
                // More workloads beside `workload` (the agent runs up to 4).
                "also" => {
                    let all: Vec<&str> = v.split(',').collect();
                    all.len() <= 3
                        && all.iter().all(|w| {
                            w.parse::<Workload>().is_ok_and(|w| w != Workload::None)
                                && Some(*w) != self.workload.map(|x| x.as_str())
                        })
                        && all.iter().enumerate().all(|(i, w)| !all[..i].contains(w))
                }
                "io_rounds" => v.parse::<u32>().is_ok_and(|n| n <= 1_000_000),
                // The io workload's file-set mode (guest/agent/wl_files.c).
                "io_files" => valid_uint(v, 0, 100_000),
                "io_file_size" => {
                    parse_memfill(v).is_ok_and(|n| (4096..=1 << 30).contains(&n) && n % 4096 == 0)
                }
                "io_dir" => valid_io_dir(v),
                "io_pattern" => ["seq", "random", "zipf", "class"].contains(&v.as_str()),
                "io_zipf" => valid_decimal(v, 10.0),
                "io_write_ratio" | "io_churn" => valid_decimal(v, 1.0),
                "io_class" => v
                    .split_once(':')
                    .is_some_and(|(p, q)| valid_uint(p, 1, 99) && valid_uint(q, 1, 99)),
                "io_seed" => valid_uint(v, 0, u64::MAX),
                "io_requests" => valid_uint(v, 1, 100_000_000),
                "peers" => valid_peers(v),
                "peer_port" => v.parse::<u16>().is_ok_and(|n| n > 0),
                "peer_hb_ms" => v.parse::<u32>().is_ok_and(|n| (10..=60_000).contains(&n)),
                "peer_dead_ms" => v.parse::<u32>().is_ok_and(|n| (50..=600_000).contains(&n)),
                "peer_req_ms" => v
                    .parse::<u32>()
                    .is_ok_and(|n| n == 0 || (10..=60_000).contains(&n)),
                "peer_req_bytes" => v.parse::<u32>().is_ok_and(|n| n <= 65536),
                _ => return Err(SpecError::WorkloadArg(k.clone())),
            };
            if !ok {
                return Err(SpecError::WorkloadArgValue(k.clone(), v.clone()));
            }
        }
        Ok((boot, ready))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> VmSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_snapshots_spec_opens_no_host_path() {
        let none = NamedFiles::default();
        let s = spec(serde_json::json!({"name": "a",
            "disks": ["/home/u/data.img,backend=rebound,cache=host:64M,size=1G"],
            "crash": {"dump_dir": "/root/.ssh", "recover_from": "/s"}}));
        let (r, notes) = s
            .for_restore(&["/snap/disk-disk1.qcow2".into()], &none)
            .unwrap();
        assert_eq!(
            r.disks,
            ["/snap/disk-disk1.qcow2,backend=rebound,cache=host:64M"]
        );
        assert_eq!((&r.crash.dump_dir, &r.crash.recover_from), (&None, &None));
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(r.host_paths().iter().all(|h| h.path.starts_with("/snap/")));
        // A kernel, initrd or pmem file of the snapshot's is never taken: the
        // refusal names the flag that names it again.
        for (field, flag, v) in [
            (
                "kernel",
                "pass --kernel FILE",
                serde_json::json!({"name": "a", "kernel": "/boot/x"}),
            ),
            (
                "initrd",
                "pass --initrd FILE",
                serde_json::json!({"name": "a", "initrd": "/boot/i"}),
            ),
            (
                "pmem device",
                "pass --pmem FILE for each",
                serde_json::json!({"name": "a", "pmem": ["/var/lib/other.img"]}),
            ),
        ] {
            let e = spec(v).for_restore(&[], &none).unwrap_err();
            assert!(
                e.contains(field) && e.contains("never opened") && e.contains(flag),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        let e = spec(serde_json::json!({"name": "a", "disks": ["/x"]}))
            .for_restore(&[], &none)
            .unwrap_err();
        assert!(e.contains("does not fit together"), "{e}");
    }

    #[test]
    fn a_restore_takes_the_files_the_user_names_again_and_only_those() {
        let named = |k: Option<&str>, i: Option<&str>, p: &[&str]| NamedFiles {
            kernel: k.map(Into::into),
            initrd: i.map(Into::into),
            pmem: p.iter().map(|s| s.to_string()).collect(),
        };
        let byo = || {
            spec(
                serde_json::json!({"name": "a", "kernel": "/old/k", "initrd": "/old/i",
                "append": "console=ttyS0", "ready": "tcp:22",
                "pmem": ["/old/p0", "/old/p1"]}),
            )
        };
        // Each file named again: the restored spec names the user's, never the snapshot's.
        let (r, notes) = byo()
            .for_restore(
                &[],
                &named(Some("/new/k"), Some("/new/i"), &["/new/p0", "/new/p1"]),
            )
            .unwrap();
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(
            (r.kernel.as_deref(), r.initrd.as_deref()),
            (Some("/new/k"), Some("/new/i"))
        );
        assert_eq!(r.pmem, ["/new/p0", "/new/p1"]);
        assert_eq!(r.append.as_deref(), Some("console=ttyS0"));
        assert!(r.host_paths().iter().all(|h| h.path.starts_with("/new/")));
        // One missing: refused, naming the flag.
        for (n, want) in [
            (
                named(None, Some("/n/i"), &["/a", "/b"]),
                "pass --kernel FILE",
            ),
            (
                named(Some("/n/k"), None, &["/a", "/b"]),
                "pass --initrd FILE",
            ),
            (named(Some("/n/k"), Some("/n/i"), &[]), "pass --pmem FILE"),
            (
                named(Some("/n/k"), Some("/n/i"), &["/a"]),
                "--pmem names 1 file(s) but the snapshot's VM had 2 pmem devices",
            ),
            (
                named(Some("/n/k"), Some("/n/i"), &["/a", "/b", "/c"]),
                "--pmem names 3 file(s) but the snapshot's VM had 2",
            ),
            (
                named(Some("k"), Some("/n/i"), &["/a", "/b"]),
                "--kernel \"k\" must be an absolute path",
            ),
            (
                named(Some("/n/k"), Some("/n/i"), &["/a", "p1"]),
                "--pmem \"p1\" must be an absolute path",
            ),
        ] {
            let e = byo().for_restore(&[], &n).unwrap_err();
            assert!(e.contains(want), "{n:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        // A file the snapshot's VM did not have: refused (its devices would not
        // match its device state).
        let plain = || spec(serde_json::json!({"name": "a"}));
        for (n, want) in [
            (named(Some("/k"), None, &[]), "--kernel \"/k\" names a file"),
            (named(None, Some("/i"), &[]), "--initrd \"/i\" names a file"),
            (
                named(None, None, &["/p"]),
                "--pmem names 1 file(s) but the snapshot's VM had no pmem device",
            ),
        ] {
            let e = plain().for_restore(&[], &n).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        // A kernel without an initrd, named alone, restores.
        let k = spec(serde_json::json!({"name": "a", "kernel": "/old/k", "ready": "tcp:22"}));
        let (r, _) = k
            .for_restore(&[], &named(Some("/new/k"), None, &[]))
            .unwrap();
        assert_eq!((r.kernel.as_deref(), r.initrd), (Some("/new/k"), None));
        assert!(r.pmem.is_empty());
    }

    #[test]
    fn forwards() {
        assert_eq!(
            "0:8080".parse::<Forward>().unwrap(),
            Forward {
                host: 0,
                guest: 8080
            }
        );
        for bad in ["8080", "a:b", "1:0", "70000:1", ":1", "1:"] {
            assert!(bad.parse::<Forward>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ready_specs() {
        assert!(matches!("agent".parse(), Ok(ReadySpec::Agent)));
        assert!(matches!("tcp:22".parse(), Ok(ReadySpec::Tcp(22))));
        match "http:80/health".parse::<ReadySpec>().unwrap() {
            ReadySpec::Http { port, path } => assert_eq!((port, path.as_str()), (80, "/health")),
            other => panic!("{other:?}"),
        }
        match "http:80".parse::<ReadySpec>().unwrap() {
            ReadySpec::Http { path, .. } => assert_eq!(path, "/"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            "serial:login: $".parse(),
            Ok(ReadySpec::Serial(_))
        ));
        for bad in ["", "tcp", "tcp:0", "tcp:x", "udp:1", "serial:", "http:/x"] {
            assert!(bad.parse::<ReadySpec>().is_err(), "{bad}");
        }
        assert!(matches!(
            "serial:(".parse::<ReadySpec>(),
            Err(SpecError::ReadyRegex(..))
        ));
    }

    #[test]
    fn spec_validation() {
        let s = VmSpec::new("a");
        let (boot, ready) = s.validate().unwrap();
        assert_eq!(boot, BootSource::Image("default".into()));
        assert!(matches!(ready, ReadySpec::Agent));

        let mut k = VmSpec::new("a");
        k.kernel = Some("/k".into());
        assert_eq!(k.validate().unwrap_err(), SpecError::AgentWithoutImage);
        k.ready = Some("serial:login".into());
        assert_eq!(k.validate().unwrap().0, BootSource::Kernel);
        k.image = Some("default".into());
        assert_eq!(k.validate().unwrap_err(), SpecError::ImageAndKernel);

        let mut i = VmSpec::new("a");
        i.append = Some("x".into());
        assert_eq!(i.validate().unwrap_err(), SpecError::BootWithoutKernel);

        let mut w = VmSpec::new("a");
        w.workload_args.insert("memfill".into(), "64Q".into());
        assert!(matches!(w.validate(), Err(SpecError::WorkloadArgValue(..))));
        // The guest's limit is the host's: 2T is refused here, 1T passes as bytes.
        w.workload_args.insert("memfill".into(), "2T".into());
        assert!(matches!(w.validate(), Err(SpecError::WorkloadArgValue(..))));
        w.workload_args.insert("memfill".into(), "1T".into());
        w.validate().unwrap();
        assert_eq!(
            w.guest_workload_args(),
            vec![("memfill".to_string(), (1u64 << 40).to_string())]
        );
        w.workload_args.clear();
        // More workloads beside the first: known, not repeated, not the first again.
        let mut a = VmSpec::new("a");
        a.workload = Some(Workload::Web);
        for (also, ok) in [
            ("io", true),
            ("io,kv", true),
            ("web", false),
            ("io,io", false),
            ("none", false),
            ("disco", false),
            ("io,kv,counter,memfill", false),
        ] {
            a.workload_args.insert("also".into(), also.into());
            assert_eq!(a.validate().is_ok(), ok, "{also}");
        }
        a.workload_args.insert("also".into(), "io".into());
        assert!(a.guest_workload_args().is_empty());
        // The io workload's file-set keys, as the agent takes them.
        for (k, v, ok) in [
            ("io_files", "96", true),
            ("io_files", "100001", false),
            ("io_files", "+5", false),
            ("io_file_size", "1M", true),
            ("io_file_size", "6K", false),
            ("io_dir", "/data/set/a_1", true),
            ("io_dir", "/data/../etc", false),
            ("io_dir", "/data/", false),
            ("io_dir", "/data/a b", false),
            ("io_target", "/data/io.bin", true),
            ("io_target", "/data/x rebound.workload=flood", false),
            ("io_target", "/data/x\tinit=/bin/sh", false),
            ("io_pattern", "class", true),
            ("io_pattern", "zipfian", false),
            ("io_zipf", "0.8", true),
            ("io_zipf", "1e3", false),
            ("io_zipf", "inf", false),
            ("io_write_ratio", "0.1", true),
            ("io_write_ratio", "1.5", false),
            ("io_churn", "0.5", true),
            ("io_churn", "2", false),
            ("io_class", "20:80", true),
            ("io_class", "0:90", false),
            ("io_class", "10", false),
            ("io_seed", "18446744073709551615", true),
            ("io_seed", "18446744073709551616", false),
            ("io_requests", "300", true),
            ("io_requests", "0", false),
        ] {
            let mut f = VmSpec::new("a");
            f.workload_args.insert(k.into(), v.into());
            assert_eq!(f.validate().is_ok(), ok, "{k}={v}");
        }
        let mut f = VmSpec::new("a");
        f.workload_args.insert("io_file_size".into(), "1M".into());
        assert_eq!(
            f.guest_workload_args(),
            vec![("io_file_size".to_string(), (1u64 << 20).to_string())]
        );
        w.workload_args.insert("evil".into(), "1".into());
        assert!(matches!(w.validate(), Err(SpecError::WorkloadArg(_))));

        let mut c = VmSpec::new("a");
        c.cpus = 0;
        assert_eq!(c.validate().unwrap_err(), SpecError::Cpus(0));
    }

    #[test]
    fn spec_json_rejects_unknown_fields() {
        let ok: VmSpec = serde_json::from_str(r#"{"name":"a","workload":"kv"}"#).unwrap();
        assert_eq!(ok.workload, Some(Workload::Kv));
        assert_eq!(ok.memory_mib, 256);
        assert!(serde_json::from_str::<VmSpec>(r#"{"name":"a","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<VmSpec>(r#"{"name":"a","workload":"x"}"#).is_err());
    }
}
