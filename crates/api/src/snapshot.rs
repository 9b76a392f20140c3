//! Snapshots and restores: what `rebound vm snapshot`, `vm restore` and `vm resume`
//! ask for and what they report (`api/openapi.yaml`). The on-disk format is
//! `rebound-snapshot`'s (`docs/snapshot-format.md`).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// `POST /v1/vms/{name}/snapshot`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// Absolute path of the snapshot directory; it must not exist yet.
    pub out: String,
    /// Seconds to record the guest's first accesses after the snapshot point (the
    /// working-set trace); 0: no trace now (the first restore records one).
    #[serde(default = "default_trace_s")]
    pub trace_s: f64,
    /// Also save QEMU's stock full migration stream (`stock.mig`), the baseline a
    /// `--mode stock` restore loads; timed with QEMU's default bandwidth cap and
    /// with the cap raised.
    #[serde(default)]
    pub stock: bool,
    /// A cluster's coordinated snapshot: once saved, the guest stays paused (event
    /// `snapshot_held`) until `POST /v1/vms/{name}/resume`, or `HOLD_MAX_S` passes, so
    /// that no guest of the cluster runs on before every one is saved.
    #[serde(default)]
    pub hold: bool,
    /// Also record the frames each bridge NIC receives and sends from the snapshot
    /// point until the trace ends (`net<i>-rx.pcap`, `net<i>-tx.pcap` in the snapshot
    /// directory, QEMU's `filter-dump`): who talks to whom after the snapshot point,
    /// and the frames in flight at it.
    #[serde(default)]
    pub netdump: bool,
    /// A cluster's coordinated pause: after its working-set sample the guest runs on
    /// until this instant (Unix ns, the host's wall clock) and is stopped then, so that
    /// every VM of the cluster stops at about the same moment and none runs long with
    /// its peers already stopped. An instant already past stops it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_at_unix_ns: Option<i64>,
}

/// The longest a held snapshot keeps its guest paused waiting for `resume`.
pub const HOLD_MAX_S: u64 = 120;

pub fn default_trace_s() -> f64 {
    5.0
}

/// What a snapshot wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotResult {
    pub dir: String,
    pub vm: String,
    /// How long the guest's vCPUs were stopped.
    pub pause_ms: f64,
    /// When they were stopped (Unix ns, the host's wall clock).
    #[serde(default)]
    pub paused_unix_ns: i64,
    /// From the request to the directory being complete and durable (trace excluded).
    pub seconds: f64,
    /// Guest RAM in the image (holes take none).
    pub ram_data_bytes: u64,
    pub device_state_bytes: u64,
    pub disk_bytes: u64,
    /// Pages the post-snapshot trace recorded (0: none recorded).
    pub trace_pages: u64,
    /// QEMU's stock save (`stock: true`): seconds with the default cap and with it
    /// raised, and the stream's size.
    #[serde(default)]
    pub stock: Option<StockSave>,
    #[serde(default)]
    pub notes: Vec<String>,
}

/// QEMU's own save of the same guest state: a full migration stream to a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StockSave {
    /// With QEMU 7.2's default `max-bandwidth` (128 MiB/s).
    pub default_cap_s: f64,
    /// With the cap raised out of the way.
    pub raised_cap_s: f64,
    pub bytes: u64,
}

/// How a restore loads guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestoreMode {
    /// Every page read before the guest runs.
    Eager,
    /// The guest runs at once; pages come from the image on first touch.
    Lazy,
    /// The whole recorded working set read first.
    WorkingSet,
    /// The first N pages of the working set (first-access order) read first; a
    /// background loader reads the rest while the guest runs.
    #[default]
    Elastic,
    /// QEMU's own path: its full migration stream (`stock.mig`) into fresh RAM.
    Stock,
}

impl RestoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Eager => "eager",
            RestoreMode::Lazy => "lazy",
            RestoreMode::WorkingSet => "working-set",
            RestoreMode::Elastic => "elastic",
            RestoreMode::Stock => "stock",
        }
    }
}

/// How a restore that runs from the snapshot's image (lazy, working-set, elastic)
/// checks the image's RAM chunks against the manifest's checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RamCheck {
    /// `background` for a snapshot this daemon wrote into a directory only its user
    /// can change, `full` for any other; a snapshot another user can write is
    /// restored by a checked copy instead.
    #[default]
    Auto,
    /// Every chunk checked before the guest runs.
    Full,
    /// Chunks checked while the guest runs; a damaged one stops the guest.
    Background,
    /// Nothing checked.
    Off,
}

impl RamCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            RamCheck::Auto => "auto",
            RamCheck::Full => "full",
            RamCheck::Background => "background",
            RamCheck::Off => "off",
        }
    }
}

impl FromStr for RamCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [
            RamCheck::Auto,
            RamCheck::Full,
            RamCheck::Background,
            RamCheck::Off,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| format!("unknown RAM check {s:?}: expected auto, full, background or off"))
    }
}

impl FromStr for RestoreMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const ALL: [RestoreMode; 5] = [
            RestoreMode::Eager,
            RestoreMode::Lazy,
            RestoreMode::WorkingSet,
            RestoreMode::Elastic,
            RestoreMode::Stock,
        ];
        ALL.into_iter().find(|m| m.as_str() == s).ok_or_else(|| {
            format!(
                "unknown restore mode {s:?}: expected eager, lazy, working-set, elastic or stock"
            )
        })
    }
}

/// The order the background loader reads what the guest has not touched yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestOrder {
    /// The rest of the working set in first-access order, then the image in file order.
    #[default]
    Fafl,
    /// The image in file order only (as QEMU's newer on-demand snapshot load does).
    FileOrder,
}

impl FromStr for RestOrder {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fafl" => Ok(RestOrder::Fafl),
            "file-order" | "file" => Ok(RestOrder::FileOrder),
            _ => Err(format!(
                "unknown load order {s:?}: expected fafl or file-order"
            )),
        }
    }
}

/// How a restore's pages reach the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LoadPath {
    /// The page server where it can run, else the page cache (the report says why).
    #[default]
    Auto,
    /// Rebound as the source of a QEMU postcopy migration: the guest runs on shared
    /// RAM from its first instruction and each missing page is one request.
    PageServer,
    /// The image mapped private, loaded by the host's page cache, settled onto
    /// shared RAM afterwards: where the page server cannot run (`Auto`'s fallback),
    /// or asked for.
    PageCache,
}

impl LoadPath {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadPath::Auto => "auto",
            LoadPath::PageServer => "page-server",
            LoadPath::PageCache => "page-cache",
        }
    }
}

impl FromStr for LoadPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(LoadPath::Auto),
            "page-server" => Ok(LoadPath::PageServer),
            "page-cache" => Ok(LoadPath::PageCache),
            _ => Err(format!(
                "unknown load path {s:?}: expected auto, page-server or page-cache"
            )),
        }
    }
}

/// `POST /v1/restore`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// Absolute path of the snapshot directory.
    pub dir: String,
    /// Name of the new VM.
    pub name: String,
    #[serde(default)]
    pub mode: RestoreMode,
    /// Working-set pages to read before the guest runs (elastic); default: half the
    /// estimated working-set size.
    #[serde(default)]
    pub ws_pages: Option<u64>,
    /// Load and hold the VM ready without running it; `vm resume` starts it.
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub rest_order: RestOrder,
    /// How pages reach the guest (not for stock).
    #[serde(default)]
    pub path: LoadPath,
    /// How the image's RAM chunks are checked (lazy, working-set, elastic; eager
    /// checks as it copies).
    #[serde(default)]
    pub ram_check: RamCheck,
    /// Seconds to watch the restored guest for the report (first accesses, faults,
    /// first service answer).
    #[serde(default = "default_watch_s")]
    pub watch_s: f64,
    /// Host ports for the restored VM's forwards (each `guest` must be one the
    /// snapshot's VM forwarded); default: a free host port for each, since the
    /// snapshot's VM may still hold its own.
    #[serde(default)]
    pub forwards: Option<Vec<crate::spec::Forward>>,
    /// Frames to deliver to the guest on its bridge NICs before it runs, such as the
    /// frames in flight to it at a cluster snapshot's cut; only with `paused` (they
    /// wait in QEMU's network queue and reach the guest when `vm resume` starts it).
    #[serde(default)]
    pub replay: Option<Vec<ReplayNic>>,
    /// The kernel of a snapshot whose VM booted the user's own (absolute host path):
    /// a snapshot's host paths are never opened on its say-so, so the user names
    /// the file again. Only for such a snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The initrd of a snapshot whose VM had one of the user's, named again (as `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    /// The files of the snapshot's VM's pmem devices, named again (absolute host
    /// paths, one per device, in its spec's order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmem: Vec<String>,
}

impl RestoreRequest {
    /// The host files this request names for the snapshot's VM.
    pub fn named_files(&self) -> crate::spec::NamedFiles {
        crate::spec::NamedFiles {
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            pmem: self.pmem.clone(),
        }
    }
}

/// One bridge NIC's frames to replay into a restored guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayNic {
    /// The bridge NIC: 1 for the VM spec's first `nics` entry (QEMU's netdev `net1`;
    /// `net0` is the user network).
    pub nic: u32,
    /// Absolute path of a pcap file (link type Ethernet, as QEMU's `filter-dump` and
    /// `rebound_cluster::inflight::write_replay` write) of whole frames, delivered in
    /// file order.
    pub pcap: String,
}

/// The frames a restore delivered on one bridge NIC before the guest ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayedFrames {
    pub nic: u32,
    pub frames: u64,
    pub bytes: u64,
}

pub fn default_watch_s() -> f64 {
    5.0
}

/// The metrics of one restore (`GET /v1/vms/{name}/restore`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RestoreReport {
    pub vm: String,
    pub snapshot: String,
    pub mode: RestoreMode,
    pub rest_order: RestOrder,
    /// The path that ran: `page-server` or `page-cache` (none for stock); why the
    /// page cache ran instead of the page server is in `notes`.
    #[serde(default)]
    pub path: Option<LoadPath>,
    /// `loading`, `held` (loaded, waiting for `vm resume`), `watching` (running, still
    /// being measured), `serving` (on the page server: measured, the server still
    /// sending the rest), `done` or `failed`.
    pub phase: String,
    /// From the request to the guest's vCPUs running.
    pub time_to_running_s: Option<f64>,
    /// When QEMU started the vCPUs (its `RESUME` stamp), Unix ns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ns: Option<i64>,
    /// From the request to the guest's service answering (the workload's port, or
    /// the VM's readiness probe).
    pub time_to_responsive_s: Option<f64>,
    /// From `vm resume` (or the start) to the service answering: for a held restore
    /// the time a caller waits after choosing to start it.
    pub responsive_after_start_s: Option<f64>,
    pub pages_loaded_before_start: u64,
    pub bytes_loaded_before_start: u64,
    /// Seconds spent loading before the guest ran.
    pub load_before_start_s: f64,
    /// Data bytes the background loader read while a held restore waited for its
    /// start (beyond the working set).
    #[serde(default)]
    pub bytes_loaded_while_held: u64,
    /// Major page faults of the QEMU process in the first `watch_s` after start.
    pub major_faults_after_start: Option<u64>,
    /// Bytes read from storage after the start in the first `watch_s` (QEMU's own
    /// faults plus the background loader).
    pub bytes_read_after_start: Option<u64>,
    /// The working-set pages loaded first, and the paper's hit rate and accuracy of
    /// them against the pages the guest touched after the start (section 6.1.1).
    pub working_set_pages: u64,
    pub hit_rate: Option<f64>,
    pub accuracy: Option<f64>,
    /// The page server: requests after the start (each one guest fault on a page
    /// that had not arrived), and the time from a request's arrival to its pages
    /// sent (µs, p50 and p99 over the whole restore).
    #[serde(default)]
    pub page_requests_after_start: Option<u64>,
    #[serde(default)]
    pub request_service_p50_us: Option<f64>,
    #[serde(default)]
    pub request_service_p99_us: Option<f64>,
    /// Distinct pages the guest touched in the watch window.
    pub pages_touched_after_start: u64,
    /// The background loader: pages and seconds, once done.
    pub background_pages: u64,
    pub background_s: Option<f64>,
    /// From the request to every page of guest memory being in host memory: the
    /// start for eager and stock, the background loader's end for elastic and
    /// working-set, the move onto shared RAM (settle) for lazy; `None` until then.
    /// A cluster restore's RESTORE_FIN waits for it.
    #[serde(default)]
    pub memory_loaded_s: Option<f64>,
    /// How the RAM image was checked: `full` (before the guest ran; eager checks as
    /// it copies), `background` (while it runs) or `off`; none for stock.
    #[serde(default)]
    pub ram_check: Option<RamCheck>,
    /// The image's checksum chunks, those checked so far, and those checked before
    /// the guest ran.
    #[serde(default)]
    pub ram_chunks: u64,
    #[serde(default)]
    pub ram_chunks_checked: u64,
    #[serde(default)]
    pub ram_chunks_checked_before_start: u64,
    /// Seconds the check before the start took (`full`).
    #[serde(default)]
    pub ram_check_s: Option<f64>,
    /// Why the background loader stopped early (memory then never fully loads).
    #[serde(default)]
    pub background_error: Option<String>,
    /// The frames `replay` delivered, per bridge NIC, before the guest ran.
    #[serde(default)]
    pub replayed_frames: Vec<ReplayedFrames>,
    /// Where the working set came from (`post-snapshot`, `restore`), or none.
    pub trace_source: Option<String>,
    /// This restore recorded the snapshot's trace (it had none).
    pub trace_recorded: bool,
    pub accel: Option<String>,
    #[serde(default)]
    pub notes: Vec<String>,
    pub error: Option<String>,
}
