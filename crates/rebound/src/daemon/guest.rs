//! Operations on the guest itself: make it panic, have it write a marker into a
//! page and report the page's physical address, read its VMCOREINFO from RAM.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::json;

use super::error::OpError;
use super::state::{Daemon, VmHandle, VmStatus};
use crate::vm::record::VmState;

fn require_running(vm: &VmHandle, what: &'static str) -> Result<(), OpError> {
    let st = vm.record().state;
    if st != VmState::Running {
        return Err(OpError::WrongState(vm.name.clone(), st, what));
    }
    Ok(())
}

/// Panics the guest kernel: through the agent when it is up, else with an NMI.
pub async fn crash(d: &Arc<Daemon>, name: &str) -> Result<VmStatus, OpError> {
    let vm = d.find(name)?;
    require_running(&vm, "only a running guest can be crashed")?;
    let via_agent = match (vm.agent(), vm.record().kernel_release.is_some()) {
        (Some(a), true) => a.crash().is_ok(),
        _ => false,
    };
    if !via_agent {
        let q = vm
            .qmp()
            .ok_or_else(|| OpError::Io("no QMP connection".into()))?;
        q.execute("inject-nmi", None).await?;
    }
    vm.event(
        "crash_requested",
        Some(json!({"via": if via_agent { "agent" } else { "nmi" }})),
    );
    Ok(vm.status())
}

/// Checks the API's pattern for marker bytes: 1 to 4096 bytes as lowercase hex.
pub fn check_marker_hex(v: &str) -> Result<(), OpError> {
    let ok = !v.is_empty()
        && v.len().is_multiple_of(2)
        && v.len() <= 8192
        && v.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(OpError::BadRequest(
            "value_hex must be 1 to 4096 bytes as lowercase hex".into(),
        ))
    }
}

/// Marker written by the guest.
#[derive(Debug, Serialize)]
pub struct MarkerReply {
    pub paddr: u64,
    pub len: u64,
}

pub async fn marker(d: &Arc<Daemon>, name: &str, value_hex: &str) -> Result<MarkerReply, OpError> {
    check_marker_hex(value_hex)?;
    let vm = d.find(name)?;
    require_running(&vm, "the agent runs only in a running guest")?;
    let agent = vm
        .agent()
        .ok_or(crate::vm::agent::AgentError::NotConnected)?;
    let (paddr, len) = agent.marker(value_hex).await?;
    vm.event("marker", Some(json!({"paddr": paddr, "len": len})));
    Ok(MarkerReply { paddr, len })
}

/// The API's VMCOREINFO answer.
#[derive(Debug, Serialize)]
pub struct VmcoreinfoReply {
    pub paddr: u64,
    pub source: &'static str,
    pub osrelease: String,
    pub entries: BTreeMap<String, String>,
}

/// Reads VMCOREINFO from the RAM file: at the agent's address, else by scanning.
pub async fn vmcoreinfo(d: &Arc<Daemon>, name: &str) -> Result<VmcoreinfoReply, OpError> {
    let vm = d.find(name)?;
    let rec = vm.record();
    if rec.state == VmState::Stopped || !rec.ram_file.exists() {
        return Err(OpError::WrongState(
            vm.name.clone(),
            rec.state,
            "guest RAM is gone",
        ));
    }
    let size = rec.spec.memory_mib << 20;
    let ram = rec.ram_file.clone();
    let at = rec.vmcoreinfo;
    tokio::task::spawn_blocking(move || {
        use rebound_guestmem::{find_vmcoreinfo, read_vmcoreinfo, GuestMemory, Layout};
        let layout = Layout::pc(size).map_err(|e| OpError::Vmcoreinfo(e.to_string()))?;
        let mem = GuestMemory::open_ram_file(&ram, layout)
            .map_err(|e| OpError::Vmcoreinfo(e.to_string()))?;
        // The agent's address can be stale (the guest rebooted since): then scan.
        let at_agent = at.and_then(|a| {
            read_vmcoreinfo(&mem, a.paddr, a.size)
                .ok()
                .map(|i| (a.paddr, i))
        });
        let (paddr, source, info) = match at_agent {
            Some((paddr, info)) => (paddr, "agent", info),
            None => {
                let f = find_vmcoreinfo(&mem).map_err(|e| OpError::Vmcoreinfo(e.to_string()))?;
                (f.paddr, "scan", f.info)
            }
        };
        Ok(VmcoreinfoReply {
            paddr,
            source,
            osrelease: info.osrelease,
            entries: info.raw,
        })
    })
    .await
    .map_err(|e| OpError::Io(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_hex() {
        check_marker_hex("00ff").unwrap();
        check_marker_hex(&"ab".repeat(4096)).unwrap();
        for bad in ["", "0", "0G", "ABCD", &"ab".repeat(4097), "00 1"] {
            assert!(check_marker_hex(bad).is_err(), "{bad}");
        }
    }
}
