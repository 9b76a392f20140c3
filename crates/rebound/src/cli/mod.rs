//! The `rebound` command line. Parsing only; each command group lives in its own
//! module. Errors bubble up to `main`, which prints one line and picks the exit code.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::client::Client;
use rebound_vmm::paths::Paths;

mod bench_clusters;
mod cluster;
mod common;
mod console;
mod crash;
mod image;
mod memory;
mod output;
mod snapshot;
mod vm;

#[derive(Parser, Debug)]
#[command(
    name = "rebound",
    version,
    about = "Get QEMU VMs back fast after crashes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Build and list guest images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Start, inspect and stop VMs.
    #[command(subcommand)]
    Vm(VmCmd),
    /// Run the daemon in the foreground, or stop it.
    Daemon(DaemonArgs),
    /// Crash reports: what happened when a guest died, and how fast it came back.
    #[command(subcommand)]
    Crash(CrashCmd),
    /// Measurements.
    #[command(subcommand)]
    Bench(rebound_bench::BenchCmd),
    /// Snapshot directories: list, inspect, verify (no daemon needed).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Clusters of VMs on several hosts (simulated ones are network namespaces with a
    /// daemon each): create, start, status, stop, snapshot, rm.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// Memory between VMs, from their miss-ratio curves.
    #[command(subcommand)]
    Memory(memory::MemoryCmd),
    /// The block backend: serve a raw disk image to QEMU over vhost-user (the daemon
    /// starts one per disk; operators can run one by hand).
    #[command(subcommand)]
    Blk(BlkCmd),
    /// Serve one restore's pages to its destination QEMU (the daemon starts one per
    /// restore on the postcopy path).
    #[command(hide = true)]
    PageServer {
        /// The job the daemon wrote.
        #[arg(long)]
        job: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum BlkCmd {
    /// Serve one disk until killed; QEMU may disconnect and reconnect any time.
    Serve(rebound_blk::args::ServeArgs),
    /// Ask a running backend for its statistics (cache hits, misses, bytes).
    Stats {
        /// The backend's control socket.
        control: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Record every block access of a running backend to FILE (`t_ns,block,h|m|w|e`
    /// lines), or stop recording with `--stop`.
    Record {
        /// The backend's control socket.
        control: PathBuf,
        file: Option<PathBuf>,
        #[arg(long, conflicts_with = "file")]
        stop: bool,
    },
}

/// A size with an optional K/M/G suffix (the `blk serve` parser, shared).
pub(crate) use rebound_blk::args::parse_bytes;

/// MiB as `--memory` takes them, or 0.
fn parse_memory_or_zero(s: &str) -> Result<u64, String> {
    match s.trim() {
        "0" => Ok(0),
        _ => parse_memory(s),
    }
}

#[derive(Subcommand, Debug)]
pub enum SnapshotCmd {
    /// List the snapshots in directories (default: the current one).
    List {
        /// Directories holding snapshot directories, or snapshot directories.
        dirs: Vec<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// What a snapshot holds: its VM, QEMU, RAM, disks and working-set trace.
    Inspect {
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Re-read every file of a snapshot and check it against its checksums.
    Verify {
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum CrashCmd {
    /// List crashes (of one VM, or of all).
    List {
        /// The VM's name (default: every VM).
        name: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One crash: downtime, dump, pages, memory timeline.
    Report {
        /// The VM's name.
        name: String,
        /// The crash's id (default: the latest).
        #[arg(long)]
        id: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also draw both VMs' memory and the dump's progress over time to this SVG file.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ImageCmd {
    /// Build an image (default: `default`), reusing the cached one if its inputs are unchanged.
    Build {
        /// The image's name under $REBOUND_HOME/images.
        name: Option<String>,
        /// Rebuild even when the inputs are unchanged.
        #[arg(long)]
        force: bool,
        /// The guest agent binary (default: guest/agent/rebound-agent next to the build, or $REBOUND_AGENT).
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List built images.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make an ext4 disk image holding a deterministic file set for the `web` and `io`
    /// workloads (use it with `vm start --disk FILE --workload-arg data_disk=vdb`).
    Webset {
        /// The image file to create (must not exist).
        out: PathBuf,
        /// How many files (`web/NNN/NNNNNN.bin`).
        #[arg(long, default_value_t = 2000)]
        files: u64,
        /// Size of each file (e.g. 200K).
        #[arg(long, default_value = "200K", value_parser = parse_bytes)]
        file_size: u64,
        /// Also an `io.bin` of this size for the `io` workload (0: none).
        #[arg(long, default_value = "0", value_parser = parse_bytes)]
        io_size: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct StartArgs {
    /// The VM's name.
    pub name: String,
    /// Image under $REBOUND_HOME/images (default: `default`).
    #[arg(long, conflicts_with = "kernel")]
    pub image: Option<String>,
    /// Your own kernel (then --ready is required).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Initramfs for --kernel.
    #[arg(long, requires = "kernel")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line for --kernel.
    #[arg(long, requires = "kernel", allow_hyphen_values = true)]
    pub append: Option<String>,
    /// Extra disk, used as is (repeatable):
    /// FILE[,backend=qemu|rebound][,cache=host[:SIZE]|page|none][,size=SIZE]. The options
    /// override --disk-backend, --disk-cache and --disk-direct for this disk;
    /// cache=host:SIZE serves it with Rebound's backend and a host cache of SIZE; size=
    /// makes a sparse raw file when FILE does not exist. A comma in FILE is written ",,".
    #[arg(long = "disk")]
    pub disks: Vec<String>,
    /// What serves the disks: qemu (its own virtio-blk) or rebound (our vhost-user-blk
    /// backend, a process per disk that sees every request and can cache).
    #[arg(long, default_value = "qemu")]
    pub disk_backend: rebound_api::spec::DiskBackend,
    /// QEMU-served disks bypass the host page cache (O_DIRECT, QEMU's cache=none).
    #[arg(long)]
    pub disk_direct: bool,
    /// A file exposed as a virtio-pmem device (`/dev/pmemN`, repeatable; its size a
    /// multiple of 2 MiB). With `--workload-arg data_disk=pmem0` the guest mounts the
    /// ext4 on it with DAX at /data.
    #[arg(long)]
    pub pmem: Vec<PathBuf>,
    /// A NIC on a bridge of the daemon's network namespace, beside the user network
    /// (repeatable): `bridge=BR[,mac=MAC][,ip=IP/PREFIX]`; `ip` configures the guest's
    /// side in Rebound's images. The daemon makes a tap device for it.
    #[arg(long)]
    pub nic: Vec<String>,
    /// Host cache per disk of the rebound backend, e.g. 256M (0: none).
    #[arg(long, default_value = "0", value_parser = parse_memory_or_zero)]
    pub disk_cache: u64,
    /// Guest memory, e.g. 256M, 1G (a bare number is MiB).
    #[arg(long, default_value = "256M", value_parser = parse_memory)]
    pub memory: u64,
    /// Virtual CPUs.
    #[arg(long, default_value_t = 1)]
    pub cpus: u32,
    /// web, kv, memfill, counter, io, peer, flood or none; a comma list runs several (`web,io`:
    /// the first is the VM's workload, the others its `also` argument).
    #[arg(long)]
    pub workload: Option<String>,
    /// Memory the memfill workload fills, e.g. 64M.
    #[arg(long, value_parser = parse_size_arg)]
    pub memfill: Option<String>,
    /// Bytes the web or kv service reads from its data disk (O_DIRECT) before it is
    /// ready, e.g. 200M: a disk-bound start, as a service that loads its data.
    #[arg(long)]
    pub disk_io: Option<String>,
    /// A workload argument KEY=VALUE (repeatable), e.g. for `--workload io`:
    /// io=seqwrite,randread io_size=64M io_bs=4K io_direct=0|1 io_seconds=5 io_rounds=1.
    #[arg(long = "workload-arg", value_name = "KEY=VALUE")]
    pub workload_args: Vec<String>,
    /// The guest watchdog's timeout in seconds (1-600; needs the agent).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub watchdog: Option<u32>,
    /// auto, kvm or tcg.
    #[arg(long, default_value = "auto")]
    pub accel: rebound_api::spec::AccelChoice,
    /// agent | tcp:PORT | http:PORT/PATH | serial:REGEX
    #[arg(long, value_parser = parse_ready)]
    pub ready: Option<String>,
    /// HOSTPORT:GUESTPORT (host 0 = pick a free port; repeatable).
    #[arg(long = "forward")]
    pub forwards: Vec<rebound_api::spec::Forward>,
    /// What to do when the guest panics or hangs: none, dump, recover,
    /// dump-then-recover or dump-and-recover.
    #[arg(long, default_value = "none", value_parser = parse_on_crash)]
    pub on_crash: rebound_api::OnCrash,
    /// Where dumps go (default: $REBOUND_HOME/vms/NAME/crashes/ID/).
    #[arg(long)]
    pub dump_dir: Option<PathBuf>,
    /// elf or kdump.
    #[arg(long, default_value = "elf", value_parser = parse_dump_format)]
    pub dump_format: rebound_api::DumpFormat,
    /// Page compression of a kdump dump: none, zstd or zlib.
    #[arg(long, default_value = "none", value_parser = parse_compress)]
    pub compress: rebound_api::Compress,
    /// Page classes to leave out of dumps: a comma list of zero, free, cache, user (or none).
    #[arg(long, default_value = "none", value_parser = parse_filter)]
    pub filter: PageClasses,
    /// Dump and hand over memory in chunks of this size.
    #[arg(long, default_value = "128M", value_parser = parse_chunk)]
    pub chunk: u64,
    /// Memory the recovery VM starts with.
    #[arg(long, default_value = "128M", value_parser = parse_memory)]
    pub min_memory: u64,
    /// auto (the dump held while the recovery VM boots: unbounded for a disk-bound
    /// service, else at most 10 s), dump-first, recovery-first, fair, or D:R (MB/s for
    /// the dump and the recovery VM's disks).
    #[arg(long, default_value = "auto", value_parser = parse_io_policy)]
    pub io_policy: rebound_api::IoPolicy,
    /// What the crashed VM and its recovery VM may hold together (default: memory + min-memory).
    #[arg(long, value_parser = parse_memory)]
    pub host_memory_budget: Option<u64>,
    /// Restore the recovery VM from this post-boot snapshot of the guest (elastic)
    /// instead of booting it: it comes back at the snapshot's state, disks included.
    #[arg(long)]
    pub recover_from: Option<PathBuf>,
    /// Start the recovery VM warm: the guest's cached file pages are listed every few
    /// seconds while it runs, and the recovery VM reads the last list back after it
    /// boots (from the host cache with `--disk-backend rebound`).
    #[arg(long)]
    pub warm: bool,
    /// Return once QEMU runs instead of waiting for readiness.
    #[arg(long)]
    pub no_wait: bool,
    /// Seconds to wait for readiness.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_memory(s: &str) -> Result<u64, String> {
    rebound_api::spec::parse_memory_mib(s).map_err(|e| e.to_string())
}

/// Page classes as one clap value.
#[derive(Debug, Clone)]
pub struct PageClasses(pub Vec<rebound_api::PageClass>);

fn parse_filter(s: &str) -> Result<PageClasses, String> {
    rebound_api::crash::parse_filter(s)
        .map(PageClasses)
        .map_err(|e| e.to_string())
}

fn parse_on_crash(s: &str) -> Result<rebound_api::OnCrash, String> {
    s.parse().map_err(|e: rebound_api::SpecError| e.to_string())
}

fn parse_dump_format(s: &str) -> Result<rebound_api::DumpFormat, String> {
    s.parse().map_err(|e: rebound_api::SpecError| e.to_string())
}

fn parse_compress(s: &str) -> Result<rebound_api::Compress, String> {
    s.parse().map_err(|e: rebound_api::SpecError| e.to_string())
}

/// A size in whole MiB, at least 1 MiB (`CrashPolicy::validate` checks the rest).
fn parse_chunk(s: &str) -> Result<u64, String> {
    let b = rebound_api::spec::parse_size(s).map_err(|e| e.to_string())?;
    if b == 0 || b % (1 << 20) != 0 {
        return Err(format!(
            "chunk {s:?} must be a whole number of MiB, at least 1M"
        ));
    }
    Ok(b >> 20)
}

fn parse_engine(s: &str) -> Result<rebound_api::DumpEngine, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("unknown engine {s:?}: expected rebound or qemu"))
}

fn parse_mode(s: &str) -> Result<u32, String> {
    rebound_vmm::private::parse_mode(s)
}

fn parse_io_policy(s: &str) -> Result<rebound_api::IoPolicy, String> {
    s.parse().map_err(|e: rebound_api::SpecError| e.to_string())
}

fn parse_size_arg(s: &str) -> Result<String, String> {
    rebound_api::spec::parse_memfill(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

fn parse_hex(s: &str) -> Result<String, String> {
    crate::daemon::guest::check_marker_hex(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

fn parse_ready(s: &str) -> Result<String, String> {
    s.parse::<rebound_api::spec::ReadySpec>()
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
pub enum VmCmd {
    /// Start a VM and wait until it is ready.
    Start(Box<StartArgs>),
    /// The VM's disks: files, what serves them, and the rebound backend's cache
    /// statistics (hits, misses, bytes).
    Disks {
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Snapshot a running or paused VM into a new directory: device state, RAM
    /// image, disks, and the order the guest first touches its pages afterwards.
    Snapshot {
        /// The VM's name.
        name: String,
        /// The snapshot directory (must not exist; appears only when complete).
        #[arg(long)]
        out: PathBuf,
        /// Seconds to record the guest's first accesses after the snapshot point
        /// (0: none; the first restore records them).
        #[arg(long, default_value_t = rebound_api::snapshot::default_trace_s())]
        trace_s: f64,
        /// Also save QEMU's stock full migration stream, the baseline of
        /// `vm restore --mode stock` (timed with QEMU's default bandwidth cap and
        /// with it raised; the guest stays paused meanwhile).
        #[arg(long)]
        stock: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Restore a snapshot into a new VM.
    Restore(Box<RestoreArgs>),
    /// Run a paused VM (and start a restore held with --paused).
    Resume {
        /// The VM's name.
        name: String,
    },
    /// Stop a running VM's vCPUs (its memory and devices stay; `vm resume` goes on).
    Pause {
        /// The VM's name.
        name: String,
    },
    /// Move a restored VM from its snapshot image onto shared RAM now (it does so
    /// by itself once its background loading ends).
    Settle {
        /// The VM's name.
        name: String,
    },
    /// Reboot a running guest. `--warm` keeps its file cache: the agent lists the
    /// cached pages of the files under /data first and reads them back after the
    /// boot, from the host's block cache (`--disk-backend rebound`), never from the
    /// old guest memory.
    Reboot {
        /// The VM's name.
        name: String,
        /// Bring the guest's file cache back after the reboot.
        #[arg(long)]
        warm: bool,
        /// Reset the machine at once (no sync: writes in flight are lost, as in a
        /// power cut) instead of the guest's own sync and reboot.
        #[arg(long)]
        hard: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List VMs (this host's, or with --all-hosts every host's, from the cluster
    /// store given with --etcd).
    List {
        /// Every host's VMs as the cluster store holds them.
        #[arg(long, requires = "etcd")]
        all_hosts: bool,
        #[command(flatten)]
        store: cluster::StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one VM.
    Status {
        /// The VM's name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Power the guest off, then remove its runtime files.
    Stop {
        /// The VM's name.
        name: String,
    },
    /// Kill QEMU at once and remove the VM's runtime files.
    Kill {
        /// The VM's name.
        name: String,
    },
    /// Forget a stopped VM (record, logs, disk copy).
    Rm {
        /// The VM's name.
        name: String,
    },
    /// Attach to the serial console (Ctrl-] to detach).
    Console {
        /// The VM's name.
        name: String,
    },
    /// Print the serial console log.
    Logs {
        /// The VM's name.
        name: String,
        /// Keep printing as the guest writes.
        #[arg(short, long)]
        follow: bool,
    },
    /// Print the VM's event log (JSON lines), oldest first.
    Events {
        /// The VM's name.
        name: String,
        /// Only events after this sequence number (each event's `seq`).
        #[arg(long)]
        since: Option<u64>,
        /// At most this many events.
        #[arg(long)]
        limit: Option<u64>,
    },
    /// Wait until the VM is ready, panicked, paused or stopped.
    Wait {
        /// The VM's name.
        name: String,
        /// The state to wait for.
        #[arg(value_parser = ["ready", "panicked", "paused", "stopped"])]
        state: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make the guest kernel panic (or, with --hang, make it hang: its watchdog expires).
    Crash {
        /// The VM's name.
        name: String,
        /// Stop feeding the guest's watchdog instead of panicking it (needs the agent;
        /// the watchdog's timeout is --watchdog, 30 s by default).
        #[arg(long)]
        hang: bool,
    },
    /// Move memory from the guest (its balloon) to exclusive host caches of its disks
    /// served by Rebound's backend, keeping the sum; `--host-cache 0` gives it back.
    /// `--size` changes the VM's allocation (guest plus host caches) instead.
    #[command(group(clap::ArgGroup::new("what").required(true).multiple(true).args(["host_cache", "size"])))]
    Memory {
        /// The VM's name.
        name: String,
        /// Host cache to make, taken from the guest (e.g. 64M; 0: all back to the guest).
        #[arg(long, value_parser = parse_bytes)]
        host_cache: Option<u64>,
        /// The VM's allocation, guest plus host caches (e.g. 320M): the guest grows or
        /// shrinks by the difference, up to the memory it booted with.
        #[arg(long, value_parser = parse_bytes)]
        size: Option<u64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The guest's miss-ratio curve: how many of its reads would miss at each memory
    /// size, traced below its memory by the exclusive host cache (`vm memory
    /// --host-cache`) from the reads that reach its disks and the pages it evicts.
    Mrc {
        /// The VM's name.
        name: String,
        /// Start tracing afresh (what was traced so far is dropped).
        #[arg(long)]
        restart: bool,
        /// With --restart: fraction of blocks traced (SHARDS sampling; 1: exact).
        #[arg(long, requires = "restart")]
        rate: Option<f64>,
        /// With --restart: distance between two points of the curve (e.g. 256K).
        #[arg(long, requires = "restart", value_parser = parse_bytes)]
        step: Option<u64>,
        /// Largest guest memory size shown (default: 4 times the VM's allocation).
        #[arg(long, value_parser = parse_bytes)]
        max: Option<u64>,
        /// Draw the curve into FILE (SVG).
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Have the guest write HEX bytes into a page; prints its guest physical address.
    Marker {
        /// The VM's name.
        name: String,
        /// The bytes, in hex (e.g. deadbeef).
        #[arg(value_parser = parse_hex)]
        hex: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Dump the guest's memory now (a running guest is paused for it), with a
    /// progress bar on a terminal.
    Dump {
        /// The VM's name.
        name: String,
        /// The dump file (written beside it and renamed when complete).
        #[arg(long)]
        out: PathBuf,
        /// elf or kdump.
        #[arg(long, default_value = "elf", value_parser = parse_dump_format)]
        format: rebound_api::DumpFormat,
        /// Page compression of a kdump dump: none, zstd or zlib.
        #[arg(long, default_value = "none", value_parser = parse_compress)]
        compress: rebound_api::Compress,
        /// Page classes to leave out: a comma list of zero, free, cache, user (or none).
        #[arg(long, default_value = "none", value_parser = parse_filter)]
        filter: PageClasses,
        /// rebound (our writer) or qemu (QEMU's dump-guest-memory, the stock baseline).
        #[arg(long, default_value = "rebound", value_parser = parse_engine)]
        engine: rebound_api::DumpEngine,
        /// The dump's permissions (octal, e.g. 640); 600 when not given.
        #[arg(long, value_parser = parse_mode)]
        mode: Option<u32>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// VMCOREINFO read from guest RAM.
    Vmcoreinfo {
        /// The VM's name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DaemonArgs {
    #[command(subcommand)]
    pub action: Option<DaemonAction>,
    /// Socket to serve (default: $REBOUND_HOME/reboundd.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Let this group's members use the socket too (mode 0660); the socket's
    /// directory must let the group in, so use it with --socket.
    #[arg(long, requires = "socket")]
    pub socket_group: Option<String>,
    /// Also serve Prometheus metrics over HTTP here, e.g. 127.0.0.1:9464.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Run in this network namespace (`ip netns` name): its VMs' NICs plug into its
    /// bridges, and their forwarded ports listen in it. One daemon per simulated host.
    #[arg(long)]
    pub netns: Option<String>,
    /// The cluster store, and this host's certificate for it. Without --etcd,
    /// cluster restores run on this host alone, with no store to install.
    #[command(flatten)]
    pub store: cluster::StoreArgs,
    /// This host's name in the cluster store (a-z, 0-9 and '-', starting with a
    /// letter or digit; at most 63).
    /// [default: this machine's host name]
    #[arg(long)]
    pub host: Option<String>,
    /// Seconds without renewal after which the other hosts declare this one failed.
    #[arg(long, value_parser = parse_seconds, default_value = "5")]
    pub host_ttl: f64,
    /// Most disk space each VM's serial console log takes (with its previous
    /// generation), e.g. 4M; the oldest output goes first.
    #[arg(long, value_parser = parse_log_cap, default_value = "4M")]
    pub serial_log_max: u64,
    /// Most disk space each VM's QEMU log (QEMU's own stdout and stderr) takes.
    #[arg(long, value_parser = parse_log_cap, default_value = "4M")]
    pub qemu_log_max: u64,
    /// Most disk space each VM's event log takes; the oldest events go first.
    #[arg(long, value_parser = parse_log_cap, default_value = "4M")]
    pub event_log_max: u64,
}

/// A log cap: a size from 64K to 1G.
fn parse_log_cap(s: &str) -> Result<u64, String> {
    let min = rebound_vmm::logcap::MIN_CAP;
    match rebound_api::spec::parse_size(s) {
        Ok(n) if (min..=1 << 30).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a size from 64K to 1G (e.g. 4M)")),
    }
}

/// A positive number of seconds, at most a day.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a number of seconds more than 0 and at most 86400"
        )),
    }
}

#[derive(Subcommand, Debug)]
pub enum DaemonAction {
    /// Ask the running daemon to exit (VMs keep running).
    Stop,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// Name of the new VM.
    #[arg(long)]
    pub name: String,
    /// eager (all read first), lazy (pages on first touch), working-set (the
    /// recorded working set read first), elastic (its first --ws-pages pages
    /// first, the rest in the background) or stock (QEMU's own migration stream).
    #[arg(long, default_value = "elastic")]
    pub mode: rebound_api::RestoreMode,
    /// Working-set pages read before the guest runs (elastic); default: half the
    /// estimated working-set size.
    #[arg(long)]
    pub ws_pages: Option<u64>,
    /// Load and hold the VM without running it; `vm resume` starts it.
    #[arg(long)]
    pub paused: bool,
    /// What the background loader reads after the working set: fafl (the rest of
    /// the trace in first-access order, then the image) or file-order.
    #[arg(long, default_value = "fafl")]
    pub rest_order: rebound_api::RestOrder,
    /// How pages reach the guest: auto (the default: the page server where it can
    /// run, else the page cache; the report says which and why), page-server (Rebound
    /// serves QEMU each missing page through postcopy; the guest runs on shared RAM
    /// from its first instruction) or page-cache (the image mapped private, settled
    /// later).
    #[arg(long, default_value = "auto")]
    pub path: rebound_api::LoadPath,
    /// How a restore that runs from the snapshot's image (lazy, working-set,
    /// elastic) checks its RAM chunks: auto (a snapshot this daemon wrote in the
    /// background, any other in full before the guest runs), full, background (a
    /// damaged chunk stops the guest, which may have read it) or off (unchecked).
    #[arg(long, default_value = "auto")]
    pub ram_check: rebound_api::RamCheck,
    /// Seconds to watch the restored guest for the report.
    #[arg(long, default_value_t = rebound_api::snapshot::default_watch_s())]
    pub watch_s: f64,
    /// HOSTPORT:GUESTPORT for a guest port the snapshot's VM forwarded (repeatable;
    /// default: a free host port each).
    #[arg(long = "forward")]
    pub forwards: Vec<rebound_api::spec::Forward>,
    /// NIC=FILE (with --paused; repeatable): hand the frames of pcap FILE to the guest
    /// on bridge NIC NIC (1 or net1 for the first --nic) before it runs, such as the
    /// frames in flight to it at a cluster snapshot's cut.
    #[arg(long = "replay", value_parser = parse_replay)]
    pub replay: Vec<rebound_api::ReplayNic>,
    /// The kernel of a snapshot whose VM booted your own: a snapshot's host paths
    /// are never opened on its say-so, so name the file again.
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// The initrd of a snapshot whose VM had your own, named again.
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    /// The file of each pmem device of the snapshot's VM, named again (repeatable,
    /// in the order the VM had them).
    #[arg(long)]
    pub pmem: Vec<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `NIC=FILE`: `1=/x.pcap` or `net1=/x.pcap`.
fn parse_replay(s: &str) -> Result<rebound_api::ReplayNic, String> {
    let (nic, file) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NIC=FILE (1=frames.pcap)"))?;
    let n = nic.strip_prefix("net").unwrap_or(nic);
    let nic = n
        .parse::<u32>()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{nic:?} is not a bridge NIC: 1, 2, ... or net1, net2, ..."))?;
    if file.is_empty() {
        return Err(format!("{s:?} names no file"));
    }
    let pcap = common::absolute(std::path::Path::new(file))
        .map_err(|e| e.to_string())?
        .display()
        .to_string();
    Ok(rebound_api::ReplayNic { nic, pcap })
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let paths = Paths::from_env()?;
    match cli.cmd {
        Cmd::Image(c) => image::run(&paths, c),
        Cmd::Vm(c) => vm::run(&paths, c).await,
        Cmd::Daemon(a) => daemon(&paths, a).await,
        Cmd::Crash(c) => crash::run(&paths, c).await,
        Cmd::Bench(c) => {
            let clusters = bench_clusters::CliClusters(paths.clone());
            Ok(rebound_bench::run(&paths, c, &clusters).await?)
        }
        Cmd::Snapshot(c) => snapshot::run_offline(c),
        Cmd::Cluster(c) => cluster::run(&paths, c).await,
        Cmd::Memory(c) => memory::run(&paths, c).await,
        Cmd::Blk(c) => blk(c),
        Cmd::PageServer { job } => {
            rebound_pageserver::run_process(&job)?;
            Ok(())
        }
    }
}

fn blk(c: BlkCmd) -> anyhow::Result<()> {
    match c {
        BlkCmd::Serve(a) => Ok(rebound_blk::serve(a.into())?),
        BlkCmd::Stats { control, json } => {
            let v = rebound_blk::serve::ask(&control, &serde_json::json!({"op": "stats"}))
                .with_context(|| format!("the backend at {}", control.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let s: rebound_blk::Stats = serde_json::from_value(v)?;
            let c = &s.cache;
            let reads = c.hits + c.misses;
            println!(
                "{}: {} MiB, O_DIRECT {}, {} queue(s), {} connection(s) so far",
                s.disk.display(),
                s.size_bytes >> 20,
                s.direct,
                s.queues,
                s.connections
            );
            println!(
                "cache {:.1} of {} MiB: {} hits, {} misses ({:.1}% hits), {} admitted, {} refused, {} evicted, {} invalidated; read {} MiB, written {} MiB",
                c.held_bytes as f64 / (1u64 << 20) as f64,
                c.capacity_bytes >> 20,
                c.hits,
                c.misses,
                if reads == 0 { 0.0 } else { 100.0 * c.hits as f64 / reads as f64 },
                c.admissions,
                c.refused,
                c.evictions,
                c.invalidations,
                c.read_bytes >> 20,
                c.written_bytes >> 20
            );
            for (class, t) in s.timing.classes.iter().filter(|(_, t)| t.requests > 0) {
                println!("{class}: {}", t.line(s.timing.clock_ns));
            }
            Ok(())
        }
        BlkCmd::Record {
            control,
            file,
            stop,
        } => {
            let path = match (file, stop) {
                (Some(f), false) => Some(std::path::absolute(&f)?),
                (None, true) => None,
                _ => anyhow::bail!("give a FILE to record to, or --stop"),
            };
            let v = rebound_blk::serve::ask(
                &control,
                &serde_json::json!({"op": "record", "path": path}),
            )
            .with_context(|| format!("the backend at {}", control.display()))?;
            if let Some(e) = v["error"].as_str() {
                anyhow::bail!("the backend refused: {e}");
            }
            Ok(())
        }
    }
}

/// What must happen before the async runtime starts its threads: a daemon enters its
/// network namespace (a namespace is per thread; threads made later inherit it).
pub fn before_runtime(cli: &Cli) -> anyhow::Result<()> {
    if let Cmd::Daemon(DaemonArgs {
        action: None,
        netns: Some(ns),
        ..
    }) = &cli.cmd
    {
        rebound_vmm::net::enter_netns(ns)
            .with_context(|| format!("cannot enter network namespace {ns:?} (root is needed; `ip netns add {ns}` makes one)"))?;
    }
    Ok(())
}

/// This machine's host name as a cluster store name: lower case, other characters
/// than letters and digits as '-', at most 63; `local` if nothing is left.
fn default_host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .replace("..", "-");
    h.truncate(63);
    if rebound_coord::layout::check_host(&h).is_ok() {
        h
    } else {
        "local".into()
    }
}

async fn daemon(paths: &Paths, a: DaemonArgs) -> anyhow::Result<()> {
    let socket = a.socket.unwrap_or_else(|| paths.socket());
    match a.action {
        None => {
            let etcd = a.store.config()?;
            let host = match a.host {
                Some(h) => h,
                None => default_host_name(),
            };
            let opts = crate::daemon::ServeOptions {
                socket_group: a.socket_group,
                metrics_addr: a.metrics_addr,
                cluster: crate::daemon::ClusterOptions {
                    etcd,
                    host,
                    ttl: std::time::Duration::from_secs_f64(a.host_ttl),
                },
                logs: crate::daemon::LogCaps {
                    serial: a.serial_log_max,
                    qemu: a.qemu_log_max,
                    events: a.event_log_max,
                },
            };
            Ok(crate::daemon::run(paths.clone(), socket, opts).await?)
        }
        Some(DaemonAction::Stop) => {
            let c = Client::new(&socket);
            let Ok(health) = c
                .call::<rebound_api::Health>(hyper::Method::GET, "/v1/health", None)
                .await
            else {
                println!("no daemon is running on {}", socket.display());
                return Ok(());
            };
            c.call::<serde_json::Value>(hyper::Method::POST, "/v1/daemon/shutdown", None)
                .await?;
            let pid = health.pid;
            // Gone means the process has exited (it removes its socket first).
            if rebound_vmm::process::wait_gone(pid, std::time::Duration::from_secs(10)).await {
                println!("daemon stopped");
                return Ok(());
            }
            anyhow::bail!("daemon on {} did not exit within 10 s", socket.display())
        }
    }
}

/// A client for the default socket, starting the daemon if needed.
pub(crate) use rebound_client::connect;
