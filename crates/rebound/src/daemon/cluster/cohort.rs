//! The daemon's VMs as the cluster restore protocol drives them
//! ([`rebound_coord::CohortVms`]), in-process:
//!
//! - `load`: a restore of the snapshot in `args` (one in this daemon's snapshot store
//!   or one it wrote, [`super::confine`]) into a new VM named after the plan's
//!   VM, held paused (`paused: true`); done once the restore report's phase is
//!   `held`. `args` is `{"dir": absolute snapshot dir, "mode": "elastic" |
//!   "working-set" | "eager" | "lazy" | "stock", "forwards": [{host, guest}] | null,
//!   "rest_order", "path", "watch_s", "replay": [{nic, pcap}] | null}` (only `dir` is
//!   required; unknown keys are refused). The plan's `ws_pages` is the elastic working
//!   set to load first; 0 leaves the daemon's default (half the estimated working
//!   set). `replay` names, per bridge NIC, a pcap file on this host of frames to hand
//!   to the guest before it starts: the frames in flight to it at the snapshot's cut
//!   (`rebound_cluster::inflight::write_replay`).
//! - `start`: `vm resume`; the start instant is the VM's own `resumed` event. A VM
//!   already running (this daemon restarted after it started it) answers with its
//!   start instant and is not resumed again.
//! - `restored`: waits for the restore report's `memory_loaded_s` (every page in
//!   host memory: at the start for eager and stock, at the background loader's end
//!   for elastic and working-set, at the settle onto shared RAM for lazy); fails on
//!   the loader's `background_error`, a failed report or a VM that stopped.
//! - `abort`: kills and removes a VM loaded for that restore and never started
//!   (held paused, also after a restart of this daemon), and logs why.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rebound_api::spec::Forward;
use rebound_api::{
    EventData, LoadPath, ReplayNic, RestOrder, RestoreMode, RestoreRequest, VmState,
};
use rebound_coord::{CohortVms, LoadInfo, StartInfo, VmError};
use serde::Deserialize;

use crate::daemon::error::OpError;
use crate::daemon::state::{Daemon, WaitFor};
use crate::daemon::vm::Job;
use rebound_errors::chain;

/// A `LOAD`'s arguments for one VM.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadArgs {
    /// Absolute path of the snapshot directory on this host.
    pub dir: String,
    #[serde(default)]
    pub mode: RestoreMode,
    #[serde(default)]
    pub rest_order: RestOrder,
    /// How its pages reach the guest (`RestoreRequest::path`).
    #[serde(default)]
    pub path: LoadPath,
    #[serde(default = "rebound_api::snapshot::default_watch_s")]
    pub watch_s: f64,
    #[serde(default)]
    pub forwards: Option<Vec<Forward>>,
    /// Frames to replay into the guest before it starts (`RestoreRequest::replay`).
    #[serde(default)]
    pub replay: Option<Vec<ReplayNic>>,
}

/// Why the daemon could not do what the cohort asked of one of its VMs.
#[derive(Debug, thiserror::Error)]
pub enum CohortVmError {
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("the LOAD arguments of VM {vm} are invalid")]
    Args {
        vm: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Confine(#[from] super::confine::ConfineError),
    #[error(transparent)]
    Op(#[from] OpError),
    #[error("the restore of VM {vm} ended in phase {phase} instead of held")]
    NotHeld { vm: String, phase: String },
    #[error("VM {vm} is not held for cluster restore {restore_id} on this host")]
    NotHeldHere { vm: String, restore_id: String },
    /// The restore report's `background_error`.
    #[error("the background loader failed: {0}")]
    Background(String),
    /// The restore report's `error` of a failed restore.
    #[error("{0}")]
    Failed(String),
    #[error("VM {0} stopped before its memory was loaded")]
    Stopped(String),
    #[error("VM {0} is gone")]
    Gone(String),
}

/// The daemon's VMs, for the cohort.
pub struct DaemonVms {
    d: Weak<Daemon>,
    /// (restore id, VM) loaded by this cohort and not started yet.
    held: Mutex<HashSet<(String, String)>>,
}

impl DaemonVms {
    pub fn new(d: &Arc<Daemon>) -> Self {
        Self {
            d: Arc::downgrade(d),
            held: Mutex::new(HashSet::new()),
        }
    }

    fn daemon(&self) -> Result<Arc<Daemon>, CohortVmError> {
        self.d.upgrade().ok_or(CohortVmError::ShuttingDown)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A VM restored paused and never resumed: what a restore holds.
fn is_held(h: &crate::daemon::vm::VmHandle) -> bool {
    h.status().state == VmState::Paused && h.restore_report().is_some_and(|r| r.phase == "held")
}

fn key(restore_id: &str, vm: &str) -> (String, String) {
    (restore_id.to_owned(), vm.to_owned())
}

#[async_trait::async_trait]
impl CohortVms for DaemonVms {
    async fn load(
        &self,
        restore_id: &str,
        vm: &str,
        ws_pages: u64,
        args: &serde_json::Value,
    ) -> Result<LoadInfo, VmError> {
        let d = self.daemon()?;
        let a = LoadArgs::deserialize(args).map_err(|source| CohortVmError::Args {
            vm: vm.to_owned(),
            source,
        })?;
        // The coordinator is a peer: it names only snapshots this daemon may restore.
        let dir = super::confine::snapshot_dir(&d.paths, &a.dir)?;
        let replay = match a.replay {
            Some(nics) => Some(
                nics.into_iter()
                    .map(|n| {
                        let pcap = super::confine::replay_file(&dir, &n.pcap)?;
                        Ok(ReplayNic {
                            nic: n.nic,
                            pcap: pcap.display().to_string(),
                        })
                    })
                    .collect::<Result<Vec<_>, super::confine::ConfineError>>()?,
            ),
            None => None,
        };
        let req = RestoreRequest {
            dir: dir.display().to_string(),
            name: vm.to_owned(),
            mode: a.mode,
            ws_pages: (ws_pages > 0).then_some(ws_pages),
            paused: true,
            rest_order: a.rest_order,
            path: a.path,
            ram_check: rebound_api::RamCheck::Auto,
            watch_s: a.watch_s,
            forwards: a.forwards,
            replay,
            // A peer names no host file: a snapshot whose VM had a kernel, initrd or
            // pmem file of the user's is refused here (`VmSpec::for_restore`).
            kernel: None,
            initrd: None,
            pmem: Vec::new(),
        };
        // A LOAD asked again (this host joined the store again after its lease was
        // lost, or its daemon restarted, after loading): the VM held for it answers
        // with its load instead of failing on its name.
        if let Ok(h) = d.find(vm) {
            if let Some(rep) = h.restore_report().filter(|_| is_held(&h)) {
                if self.held().contains(&key(restore_id, vm)) || rep.snapshot == req.dir {
                    tracing::info!(%restore_id, %vm, "cluster restore: already loaded and held");
                    self.held().insert(key(restore_id, vm));
                    return Ok(LoadInfo {
                        pages: rep.pages_loaded_before_start,
                        load_s: rep.load_before_start_s,
                    });
                }
            }
        }
        let t = Instant::now();
        tracing::info!(%restore_id, %vm, dir = %req.dir, "cluster restore: loading");
        let report = d.restore(req).await.map_err(CohortVmError::from)?;
        if report.phase != "held" {
            return Err(CohortVmError::NotHeld {
                vm: vm.to_owned(),
                phase: report.phase,
            }
            .into());
        }
        self.held().insert(key(restore_id, vm));
        crate::daemon::fault::point("cohort:held");
        Ok(LoadInfo {
            pages: report.pages_loaded_before_start,
            load_s: t.elapsed().as_secs_f64(),
        })
    }

    async fn start(&self, restore_id: &str, vm: &str) -> Result<StartInfo, VmError> {
        let d = self.daemon()?;
        let h = d.find(vm).map_err(CohortVmError::from)?;
        let running = h.status().state == VmState::Running;
        let held = self.held().contains(&key(restore_id, vm)) || is_held(&h);
        if !running && !held {
            return Err(CohortVmError::NotHeldHere {
                vm: vm.to_owned(),
                restore_id: restore_id.to_owned(),
            }
            .into());
        }
        if !running {
            if let Err(e) = h.run_for_status(Job::Resume).await {
                // Another start of it (this host's participant joined the store
                // again and carried on while the first was under way) got there
                // first: it runs, which is what was asked.
                if h.status().state != VmState::Running {
                    return Err(CohortVmError::from(e).into());
                }
            }
        }
        self.held().remove(&key(restore_id, vm));
        // QEMU's own stamp of the start; else the VM's `resumed` event, written right
        // after QEMU's `cont` returned, moved from the monotonic clock onto the wall clock.
        if let Some(t) = h.restore_report().and_then(|r| r.started_unix_ns) {
            tracing::info!(%restore_id, %vm, "cluster restore: started");
            return Ok(StartInfo { started_unix_ns: t });
        }
        let (now_wall, now_mono) = (
            rebound_coord::run::unix_now_ns(),
            rebound_vmm::events::mono_ns(),
        );
        let resumed = h.events.read_all().ok().and_then(|evs| {
            evs.iter()
                .rev()
                .find(|e| matches!(e.data, EventData::Resumed))
                .map(|e| e.mono_ns)
        });
        let started_unix_ns = match resumed {
            Some(m) if m <= now_mono => now_wall - (now_mono - m) as i64,
            _ => now_wall,
        };
        tracing::info!(%restore_id, %vm, "cluster restore: started");
        Ok(StartInfo { started_unix_ns })
    }

    async fn restored(&self, restore_id: &str, vm: &str) -> Result<(), VmError> {
        let d = self.daemon()?;
        let h = d.find(vm).map_err(CohortVmError::from)?;
        let mut changes = h.subscribe();
        loop {
            let rep = h.restore_report().unwrap_or_default();
            if rep.memory_loaded_s.is_some() {
                tracing::info!(%restore_id, %vm, "cluster restore: memory loaded");
                return Ok(());
            }
            if let Some(e) = rep.background_error {
                return Err(CohortVmError::Background(e).into());
            }
            if rep.phase == "failed" {
                let e = rep
                    .error
                    .unwrap_or_else(|| "the restore failed".to_string());
                return Err(CohortVmError::Failed(e).into());
            }
            let st = h.status().state;
            if st == VmState::Stopped {
                return Err(CohortVmError::Stopped(vm.to_owned()).into());
            }
            if changes.changed().await.is_err() {
                return Err(CohortVmError::Gone(vm.to_owned()).into());
            }
        }
    }

    async fn abort(&self, restore_id: &str, vm: &str) {
        self.held().remove(&key(restore_id, vm));
        let Ok(d) = self.daemon() else { return };
        let Some(h) = d.get(vm) else { return };
        if !is_held(&h) {
            tracing::warn!(%restore_id, %vm, "cluster restore aborted, but the VM is no longer held: left as it is");
            return;
        }
        let why = "its cluster restore was aborted before it started";
        let r = async {
            h.run_for_status(Job::Kill).await?;
            d.wait(vm, WaitFor::Stopped, Duration::from_secs(10))
                .await?;
            d.remove(vm)
        };
        match r.await {
            Ok(_) => tracing::warn!(%restore_id, %vm, "held VM killed and removed: {why}"),
            Err(e) => {
                tracing::error!(%restore_id, %vm, "cannot remove the held VM ({why}): {}", chain(&e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_coordinator_is_told_reads_as_before() {
        let bad = LoadArgs::deserialize(serde_json::json!({"dir": 3})).unwrap_err();
        let want = format!("the LOAD arguments of VM web1 are invalid: {bad}");
        let e: VmError = Box::new(CohortVmError::Args {
            vm: "web1".into(),
            source: bad,
        });
        assert_eq!(chain(&*e), want);
        let e: VmError = Box::new(CohortVmError::from(OpError::UnknownVm("web1".into())));
        assert_eq!(chain(&*e), "unknown VM \"web1\"");
        let e: VmError = Box::new(CohortVmError::NotHeldHere {
            vm: "web1".into(),
            restore_id: "r1".into(),
        });
        assert_eq!(
            chain(&*e),
            "VM web1 is not held for cluster restore r1 on this host"
        );
    }

    #[test]
    fn load_args_carry_the_frames_to_replay_and_refuse_unknown_keys() {
        let a = LoadArgs::deserialize(serde_json::json!({
            "dir": "/snaps/c1/s1",
            "replay": [{"nic": 1, "pcap": "/snaps/c1/s1/net1-replay.pcap"}],
        }))
        .unwrap();
        assert_eq!(
            a.replay,
            Some(vec![ReplayNic {
                nic: 1,
                pcap: "/snaps/c1/s1/net1-replay.pcap".into()
            }])
        );
        let plain = LoadArgs::deserialize(serde_json::json!({"dir": "/s"})).unwrap();
        assert_eq!(plain.replay, None);
        assert_eq!(plain.path, LoadPath::default());
        let served =
            LoadArgs::deserialize(serde_json::json!({"dir": "/s", "path": "page-server"})).unwrap();
        assert_eq!(served.path, LoadPath::PageServer);
        for bad in [
            serde_json::json!({"dir": "/s", "replay_pcap": "/x"}),
            serde_json::json!({"dir": "/s", "replay": [{"nic": 1, "pcap": "/x", "queue": "tx"}]}),
            serde_json::json!({"dir": "/s", "replay": [{"nic": 1}]}),
            serde_json::json!({"dir": "/s", "path": "userfault"}),
            // A peer names no host file for the restored VM to boot from or map.
            serde_json::json!({"dir": "/s", "kernel": "/boot/vmlinuz"}),
            serde_json::json!({"dir": "/s", "initrd": "/boot/initrd"}),
            serde_json::json!({"dir": "/s", "pmem": ["/var/lib/other-vm.img"]}),
        ] {
            assert!(LoadArgs::deserialize(&bad).is_err(), "{bad}");
        }
    }
}
