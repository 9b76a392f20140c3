//! Stand-in VMs: a [`CohortVms`] that takes each phase's time and boots nothing.
//! The protocol's tests and `rebound bench cluster-scale` run hundreds of hosts
//! and thousands of "VMs" with them; every call is counted, so a test can see
//! that no VM started twice.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::run::unix_now_ns;
use crate::vms::{CohortVms, LoadInfo, StartInfo, VmError};

/// Per (restore, VM): how many times each call was made, and when it started.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Calls {
    pub loads: u32,
    pub starts: u32,
    pub aborts: u32,
    pub started_unix_ns: Option<i64>,
}

/// See the module doc.
pub struct StandIn {
    pub load: Duration,
    pub start: Duration,
    pub restore: Duration,
    /// VMs whose load fails, with this error.
    pub fail_load: HashMap<String, String>,
    calls: Mutex<HashMap<(String, String), Calls>>,
}

impl StandIn {
    pub fn new(load: Duration, start: Duration, restore: Duration) -> StandIn {
        StandIn {
            load,
            start,
            restore,
            fail_load: HashMap::new(),
            calls: Mutex::new(HashMap::new()),
        }
    }

    pub fn calls(&self, restore: &str, vm: &str) -> Calls {
        self.lock()
            .get(&(restore.to_string(), vm.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Calls>> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with<T>(&self, restore: &str, vm: &str, f: impl FnOnce(&mut Calls) -> T) -> T {
        f(self
            .lock()
            .entry((restore.to_string(), vm.to_string()))
            .or_default())
    }
}

#[async_trait::async_trait]
impl CohortVms for StandIn {
    async fn load(
        &self,
        restore_id: &str,
        vm: &str,
        ws_pages: u64,
        _args: &serde_json::Value,
    ) -> Result<LoadInfo, VmError> {
        self.with(restore_id, vm, |c| c.loads += 1);
        tokio::time::sleep(self.load).await;
        if let Some(e) = self.fail_load.get(vm) {
            return Err(e.clone().into());
        }
        Ok(LoadInfo {
            pages: ws_pages,
            load_s: self.load.as_secs_f64(),
        })
    }

    async fn start(&self, restore_id: &str, vm: &str) -> Result<StartInfo, VmError> {
        // A VM already started answers with its start, as a daemon's running VM does.
        if let Some(t) = self.with(restore_id, vm, |c| c.started_unix_ns) {
            return Ok(StartInfo { started_unix_ns: t });
        }
        let t = unix_now_ns();
        self.with(restore_id, vm, |c| {
            c.starts += 1;
            c.started_unix_ns = Some(t);
        });
        tokio::time::sleep(self.start).await;
        Ok(StartInfo { started_unix_ns: t })
    }

    async fn restored(&self, _restore_id: &str, _vm: &str) -> Result<(), VmError> {
        tokio::time::sleep(self.restore).await;
        Ok(())
    }

    async fn abort(&self, restore_id: &str, vm: &str) {
        self.with(restore_id, vm, |c| c.aborts += 1);
    }
}
