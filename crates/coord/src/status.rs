//! The whole cluster as the store holds it, for `rebound cluster status` and
//! `rebound vm list --all-hosts`: every host that ever published (live while its
//! lease is), its VMs as it last published them, and every restore with its
//! status. Built from one read of the layout; refused records are listed with
//! their reasons, never shown as data.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::layout::{self, Key};
use crate::records::{decode, ClusterRecord, HostRecord, SnapshotsRecord, Status, VmRecord};
use crate::view::ClusterView;
use rebound_errors::chain;
use rebound_store::KeyValue;

#[derive(Debug, Clone, Serialize, Default)]
pub struct ClusterStatus {
    /// The cluster definitions in the store, by name.
    pub clusters: Vec<String>,
    pub hosts: Vec<HostStatus>,
    pub restores: Vec<RestoreStatus>,
    /// Records refused, with why.
    pub refused: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct HostStatus {
    pub host: String,
    /// Its lease is alive; `false` means failed (or stopped) since it published.
    pub live: bool,
    pub version: Option<String>,
    pub vms: Vec<VmRecord>,
    pub snapshots: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct RestoreStatus {
    pub restore_id: String,
    /// `submitted` (no state yet), `active`, `aborting`, `restored`, `aborted`, or
    /// `refused`.
    pub status: String,
    pub reason: Option<String>,
    pub coordinators: Vec<String>,
    pub vms: usize,
}

/// See the module doc.
pub fn status(kvs: &[KeyValue]) -> ClusterStatus {
    let mut hosts: BTreeMap<String, HostStatus> = BTreeMap::new();
    let mut refused = Vec::new();
    let mut clusters = Vec::new();
    for kv in kvs {
        let (key, v) = (kv.key.as_str(), kv.value.as_slice());
        match layout::parse(key) {
            Key::HostInfo { host } => match decode::<HostRecord>(key, v) {
                Ok(r) => {
                    let h = host_mut(&mut hosts, host);
                    h.live = true;
                    h.version = Some(r.version);
                }
                Err(e) => refused.push(chain(&e)),
            },
            Key::HostVm { host, .. } => match decode::<VmRecord>(key, v) {
                Ok(r) => host_mut(&mut hosts, host).vms.push(r),
                Err(e) => refused.push(chain(&e)),
            },
            Key::HostSnapshots { host } => match decode::<SnapshotsRecord>(key, v) {
                Ok(r) => host_mut(&mut hosts, host).snapshots = r.dirs.len(),
                Err(e) => refused.push(chain(&e)),
            },
            Key::Cluster { .. } => match decode::<ClusterRecord>(key, v) {
                Ok(r) => clusters.push(r.name),
                Err(e) => refused.push(chain(&e)),
            },
            _ => {}
        }
    }
    let view = ClusterView::from_kvs(kvs, 0);
    let restores = view
        .restores
        .iter()
        .map(|(id, r)| {
            let state = r.state();
            let status = match (r.refused(), state) {
                (Some(_), _) => "refused".to_string(),
                (None, None) => "submitted".to_string(),
                (None, Some((s, _))) => match s.status {
                    Status::Active => "active",
                    Status::Aborting => "aborting",
                    Status::Restored => "restored",
                    Status::Aborted => "aborted",
                }
                .to_string(),
            };
            RestoreStatus {
                restore_id: id.clone(),
                status,
                reason: r
                    .refused()
                    .map(|e| chain(e))
                    .or_else(|| state.and_then(|(s, _)| s.reason.clone())),
                coordinators: state
                    .map(|(s, _)| s.coordinators.clone())
                    .unwrap_or_default(),
                vms: r.plan().map_or(0, |p| p.record.plan.vms.len()),
            }
        })
        .collect();
    ClusterStatus {
        clusters,
        hosts: hosts.into_values().collect(),
        restores,
        refused,
    }
}

fn host_mut<'a>(hosts: &'a mut BTreeMap<String, HostStatus>, h: &str) -> &'a mut HostStatus {
    hosts.entry(h.to_string()).or_insert_with(|| HostStatus {
        host: h.to_string(),
        ..HostStatus::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: String, value: &str) -> KeyValue {
        KeyValue {
            key,
            value: value.as_bytes().to_vec(),
            create_revision: 1,
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn hosts_without_a_lease_are_failed_and_bad_records_are_listed() {
        let kvs = vec![
            kv(
                layout::host_info("h1"),
                r#"{"format":1,"host":"h1","version":"0.1.0","joined_unix_ns":1,"ttl_s":5}"#,
            ),
            kv(
                layout::host_vm("h1", "a"),
                r#"{"format":1,"vm":"a","state":"running","ready":true,"memory_mib":256,"updated_unix_ns":1}"#,
            ),
            kv(
                layout::host_vm("h2", "b"),
                r#"{"format":1,"vm":"b","state":"running","ready":true,"memory_mib":256,"updated_unix_ns":1}"#,
            ),
            kv(layout::host_vm("h2", "c"), "{nonsense"),
            kv(layout::plan("r1"), r#"{"format":3}"#),
        ];
        let s = status(&kvs);
        assert_eq!(s.hosts.len(), 2);
        assert!(s.hosts[0].live && !s.hosts[1].live);
        assert_eq!(s.hosts[1].vms[0].vm, "b");
        assert_eq!(s.refused.len(), 1, "{:?}", s.refused);
        assert!(s.refused[0].contains("/vms/h2/c"));
        assert_eq!(s.restores[0].status, "refused");
        assert!(s.restores[0].reason.as_ref().unwrap().contains("format 3"));
    }
}
