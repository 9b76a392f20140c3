//! Publishes this host's VMs (`hosts/<host>/vms/<vm>`) and snapshot catalog
//! (`hosts/<host>/snapshots`) in the cluster store, so `rebound cluster status`
//! and `rebound vm list --all-hosts` read every host from the store. The records
//! are not on the host's lease: a failed host's last known VMs stay visible.
//! Every second the daemon's VMs are compared with what was last written, and only
//! changes are written.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rebound_coord::layout;
use rebound_coord::records::{encode, SnapshotsRecord, VmRecord, FORMAT, MAX_SNAPSHOTS};
use rebound_coord::run::unix_now_ns;
use rebound_store::{Op, Store};

use crate::daemon::state::Daemon;

const PERIOD: Duration = Duration::from_secs(1);

/// What is compared between rounds (without the time of writing).
type Seen = (String, bool, u64);

pub fn spawn(d: &Arc<Daemon>, store: Arc<dyn Store>, host: &str) -> tokio::task::AbortHandle {
    let d = Arc::downgrade(d);
    let host = host.to_string();
    tokio::spawn(async move { run(d, store, host).await }).abort_handle()
}

async fn run(d: Weak<Daemon>, store: Arc<dyn Store>, host: String) {
    let mut last: Option<BTreeMap<String, Seen>> = None;
    let mut last_snaps: Option<Vec<String>> = None;
    loop {
        let Some(daemon) = d.upgrade() else { return };
        let now: BTreeMap<String, Seen> = daemon
            .list()
            .iter()
            .filter(|h| layout::check_vm(&h.name).is_ok())
            .map(|h| {
                let s = h.status();
                let state = serde_json::to_value(s.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                (h.name.clone(), (state, s.ready, s.memory_mib))
            })
            .collect();
        let snaps = rebound_snapshot::Catalog::new(daemon.paths.snapshot_catalog())
            .dirs()
            .map(|d| {
                d.iter()
                    .take(MAX_SNAPSHOTS)
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        drop(daemon);
        let mut ops = Vec::new();
        let old = last.clone().unwrap_or_default();
        for (vm, seen) in &now {
            if last.is_none() || old.get(vm) != Some(seen) {
                let rec = VmRecord {
                    format: FORMAT,
                    vm: vm.clone(),
                    state: seen.0.clone(),
                    ready: seen.1,
                    memory_mib: seen.2,
                    updated_unix_ns: unix_now_ns(),
                };
                ops.push(Op::Put {
                    key: layout::host_vm(&host, vm),
                    value: encode(&rec),
                    lease: None,
                });
            }
        }
        if last.is_none() {
            // First round: also remove the records of VMs gone while no daemon ran.
            if let Ok(r) = store.range(&layout::host_vms(&host)).await {
                for kv in r.kvs {
                    if let layout::Key::HostVm { vm, .. } = layout::parse(&kv.key) {
                        if !now.contains_key(vm) {
                            ops.push(Op::Delete(kv.key.clone()));
                        }
                    }
                }
            }
        } else {
            for vm in old.keys().filter(|vm| !now.contains_key(*vm)) {
                ops.push(Op::Delete(layout::host_vm(&host, vm)));
            }
        }
        if last_snaps.as_ref() != Some(&snaps) {
            let rec = SnapshotsRecord {
                format: FORMAT,
                dirs: snaps.clone(),
                updated_unix_ns: unix_now_ns(),
            };
            ops.push(Op::Put {
                key: layout::host_snapshots(&host),
                value: encode(&rec),
                lease: None,
            });
        }
        let mut ok = true;
        for chunk in ops.chunks(100) {
            if let Err(e) = store.txn(Vec::new(), chunk.to_vec()).await {
                tracing::debug!(
                    "cannot publish this host's VMs: {}",
                    rebound_errors::chain(&e)
                );
                ok = false;
                break;
            }
        }
        if ok {
            last = Some(now);
            last_snaps = Some(snaps);
        }
        tokio::time::sleep(PERIOD).await;
    }
}
