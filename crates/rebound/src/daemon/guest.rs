//! Reading the guest from the host: its VMCOREINFO from RAM (no owner job needed:
//! it only reads the RAM file), and the check of marker bytes.

use std::sync::Arc;

use rebound_api::{VmState, VmcoreinfoReply};

use super::error::OpError;
use super::state::Daemon;

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
        let layout = Layout::pc(size).map_err(|e| OpError::Vmcoreinfo(Box::new(e)))?;
        let mem = GuestMemory::open_ram_file(&ram, layout)
            .map_err(|e| OpError::Vmcoreinfo(Box::new(e)))?;
        // The agent's address can be stale (the guest rebooted since): then scan.
        let at_agent = at.and_then(|a| {
            read_vmcoreinfo(&mem, a.paddr, a.size)
                .ok()
                .map(|i| (a.paddr, i))
        });
        let (paddr, source, info) = match at_agent {
            Some((paddr, info)) => (paddr, "agent", info),
            None => {
                let f = find_vmcoreinfo(&mem).map_err(|e| OpError::Vmcoreinfo(Box::new(e)))?;
                (f.paddr, "scan", f.info)
            }
        };
        Ok(VmcoreinfoReply {
            paddr,
            source: source.to_string(),
            osrelease: info.osrelease,
            entries: info.raw,
        })
    })
    .await
    .map_err(OpError::Task)?
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
