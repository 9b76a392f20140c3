//! The types of Rebound's daemon API (`api/openapi.yaml`), shared by the daemon, the
//! CLI and the tests, so both ends of every request agree on one definition.
//!
//! - [`spec`]: what the user asks for (`VmSpec`), with the parsers of sizes, names,
//!   forwards and readiness conditions;
//! - [`status`]: what a VM reports (`VmStatus`, [`VmState`]);
//! - [`event`]: the versioned, typed event log (`events.jsonl` and `GET .../events`);
//! - [`reply`]: the other answers (health, marker, VMCOREINFO, errors).

pub mod crash;
pub mod disk;
pub mod event;
pub mod nic;
pub mod parse;
pub mod reboot;
pub mod reply;
pub mod snapshot;
pub mod spec;
pub mod status;

pub use crash::{
    Compress, CrashPhase, CrashPolicy, CrashReport, DumpEngine, DumpFormat, DumpRequest,
    DumpResult, IoPolicy, MemoryLimit, MemorySample, OnCrash, PageClass,
};
pub use event::{Event, EventData, FilesReport, IoReport, PeerEvent, EVENT_LOG_VERSION};
pub use reboot::{PrefetchReport, RebootReport, RebootRequest};
pub use reply::{
    Applied, DiskMrc, ErrorBody, Health, HostCacheReport, MarkerReply, MemoryPlan, MrcPoint,
    MrcReport, PlanRequest, PlannedVm, VmcoreinfoReply,
};
pub use snapshot::{
    LoadPath, RamCheck, ReplayNic, ReplayedFrames, RestOrder, RestoreMode, RestoreReport,
    RestoreRequest, SnapshotRequest, SnapshotResult, StockSave,
};
pub use spec::{AccelChoice, Forward, NamedFiles, ReadySpec, SpecError, VmSpec, Workload};
pub use status::{Accel, EvictRingAddr, PortForward, ReadyInfo, VmState, VmStatus, VmcoreinfoAddr};
