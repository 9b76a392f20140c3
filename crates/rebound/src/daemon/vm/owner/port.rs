//! The owner as the runtime port: what the capabilities' actions go through, over
//! the owner's QEMU, its QMP session and its memory groups.

use rebound_api::VmSpec;
use rebound_vmm::cgroup::Group;
use rebound_vmm::port::{Runtime, Spawn};
use rebound_vmm::resolve::Resolved;
use serde_json::{json, Value};

use super::Owner;
use crate::daemon::error::OpError;

impl Runtime for Owner {
    type Error = OpError;

    async fn spawn(
        &mut self,
        spec: &VmSpec,
        resolved: Resolved,
        how: Spawn,
    ) -> Result<u32, OpError> {
        self.spawn_resolved(spec, resolved, how.recovering, how.query_state)
            .await?;
        self.vm.record().qemu_pid.ok_or(OpError::NoQmp)
    }

    async fn command(&self, command: &str, args: Option<Value>) -> Result<Value, OpError> {
        let q = self.qmp.clone().ok_or(OpError::NoQmp)?;
        Ok(q.execute(command, args).await?)
    }

    async fn throttle_disk(&self, disk: &str, bytes_per_s: u64) -> Result<(), OpError> {
        let args = json!({
            "id": format!("/machine/peripheral/{disk}/virtio-backend"),
            "bps": bytes_per_s, "bps_rd": 0, "bps_wr": 0,
            "iops": 0, "iops_rd": 0, "iops_wr": 0});
        self.command("block_set_io_throttle", Some(args))
            .await
            .map(|_| ())
    }

    fn put_in_group(&self, pid: u32, group: &Group) -> Result<(), OpError> {
        Ok(group.add(pid)?)
    }

    async fn plug_memory(&self, bytes: u64) -> Result<(), OpError> {
        let args = json!({"path": "/machine/peripheral/vmem0",
            "property": "requested-size", "value": bytes});
        self.command("qom-set", Some(args)).await.map(|_| ())
    }
}
