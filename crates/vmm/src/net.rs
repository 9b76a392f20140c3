//! Host networking for VMs on bridges: tap devices, Linux bridges and network
//! namespaces, made with iproute2's `ip` (what operators use and can inspect).
//!
//! - A VM's `nics` entry (`bridge=BR,...`) becomes a persistent tap device plugged
//!   into BR of the daemon's network namespace; QEMU opens it (`-netdev tap`,
//!   `vnet_hdr=off` so that QEMU's `filter-dump` writes plain Ethernet frames).
//!   A tap is attached to one QEMU at a time, and a recovery VM starts while its
//!   crashed VM's QEMU still holds the first one, so each NIC has a short list of
//!   candidate names and a VM takes the first that no process holds (the kernel drops
//!   a tap's carrier when its last file closes).
//! - A simulated host is a network namespace with a bridge, joined to the other
//!   hosts' bridges through a veth pair to a backbone bridge in the namespace the
//!   command runs in: one L2 network across hosts, as a top-of-rack switch would give.

use std::path::Path;
use std::process::Command;

/// How many tap names a NIC may use at once (its VM, a recovery VM, restores).
const TAP_CANDIDATES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("`ip` (iproute2) could not be run")]
    NoIp(#[source] std::io::Error),
    #[error("`ip {0}` failed: {1}")]
    Ip(String, String),
    #[error("there is no bridge {0:?} in this daemon's network namespace (create it, or start the daemon in the namespace that has it: `rebound daemon --netns NS`)")]
    NoBridge(String),
    #[error("{0:?} exists but is not a bridge")]
    NotBridge(String),
    #[error("every tap name for NIC {1} of VM {0:?} is held by a running process")]
    TapsBusy(String, usize),
}

fn ip(args: &[&str]) -> Result<String, NetError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(NetError::NoIp)?;
    if !out.status.success() {
        return Err(NetError::Ip(
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -o -d link show dev X`: one line, or None when there is no such device. Not
/// /sys/class/net: sysfs shows the namespace that mounted it, not the caller's.
fn link(ifname: &str) -> Option<String> {
    ip(&["-o", "-d", "link", "show", "dev", ifname]).ok()
}

/// The flags of an `ip -o link` line (`<BROADCAST,MULTICAST,UP,LOWER_UP>`).
fn flags(line: &str) -> Vec<&str> {
    line.split_once('<')
        .and_then(|(_, r)| r.split_once('>'))
        .map(|(f, _)| f.split(',').collect())
        .unwrap_or_default()
}

fn exists(ifname: &str) -> bool {
    link(ifname).is_some()
}

/// Whether a tap exists and a process holds it open: the kernel turns a tap's
/// carrier off when its last file closes, and an up device without one says
/// NO-CARRIER.
fn held(ifname: &str) -> bool {
    link(ifname).is_some_and(|l| {
        let f = flags(&l);
        f.contains(&"UP") && !f.contains(&"NO-CARRIER")
    })
}

/// The tap names NIC `nic` of VM `vm` may use, in order of preference.
pub fn tap_candidates(vm: &str, nic: usize) -> Vec<String> {
    (0..TAP_CANDIDATES)
        .map(|g| match g {
            0 => rebound_api::nic::tap_name(vm, nic),
            g => rebound_api::nic::tap_name(&format!("{vm}#{g}"), nic),
        })
        .collect()
}

/// Makes (or reuses) a tap for NIC `nic` of `vm` on `bridge` and returns its name.
pub fn plug(vm: &str, nic: usize, bridge: &str) -> Result<String, NetError> {
    let Some(br) = link(bridge) else {
        return Err(NetError::NoBridge(bridge.into()));
    };
    // `-d` details name the kind after the flags and addresses: "... bridge forward_delay".
    if !br.split_whitespace().any(|w| w == "bridge") {
        return Err(NetError::NotBridge(bridge.into()));
    }
    let tap = tap_candidates(vm, nic)
        .into_iter()
        .find(|t| !held(t))
        .ok_or_else(|| NetError::TapsBusy(vm.into(), nic))?;
    if !exists(&tap) {
        ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
    }
    ip(&["link", "set", &tap, "master", bridge, "up"])?;
    Ok(tap)
}

/// Removes the VM's taps that no process holds (the VM stopped for good).
pub fn unplug_all(vm: &str, nics: usize) {
    for i in 0..nics {
        for t in tap_candidates(vm, i) {
            if exists(&t) && !held(&t) {
                if let Err(e) = ip(&["link", "del", &t]) {
                    tracing::warn!("cannot remove tap {t}: {e}");
                }
            }
        }
    }
}

/// A simulated host: a network namespace whose bridge joins a backbone bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimHost {
    /// The namespace (`ip netns` name).
    pub netns: String,
    /// The bridge inside it that VMs plug into.
    pub bridge: String,
    /// The host's own address on the shared network (its daemon listens there).
    pub addr: Option<(std::net::Ipv4Addr, u8)>,
}

/// A fixed, locally administered MAC for a bridge. Why: a bridge without one takes the
/// lowest MAC of its ports, so plugging or removing a tap (each VM's restore does)
/// can change it, and the address on the bridge (a host's daemon) becomes unreachable
/// until its neighbours' ARP entries expire. A MAC set by hand never changes.
fn bridge_mac(seed: &str) -> String {
    let h = rebound_api::nic::short_hash(seed).to_be_bytes();
    format!("02:52:{:02x}:{:02x}:{:02x}:{:02x}", h[0], h[1], h[2], h[3])
}

/// Creates the backbone bridge (in the caller's namespace) if missing, with the
/// address the host side uses to reach the network (optional).
pub fn backbone_up(name: &str, addr: Option<(std::net::Ipv4Addr, u8)>) -> Result<(), NetError> {
    if !exists(name) {
        ip(&["link", "add", name, "type", "bridge"])?;
    }
    ip(&["link", "set", "dev", name, "address", &bridge_mac(name)])?;
    if let Some((a, p)) = addr {
        let cidr = format!("{a}/{p}");
        if !ip(&["-o", "addr", "show", "dev", name])?.contains(&format!(" {cidr} ")) {
            ip(&["addr", "add", &cidr, "dev", name])?;
        }
    }
    ip(&["link", "set", name, "up"])?;
    Ok(())
}

/// Creates `h`'s namespace, its bridge and address, and the veth pair joining it to
/// `backbone`. Idempotent: what exists is kept.
pub fn host_up(h: &SimHost, backbone: &str, link: &str) -> Result<(), NetError> {
    let has_ns = ip(&["netns", "list"])?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(h.netns.as_str()));
    if !has_ns {
        ip(&["netns", "add", &h.netns])?;
    }
    let n = h.netns.as_str();
    ip(&["-n", n, "link", "set", "lo", "up"])?;
    if ip(&["-n", n, "link", "show", &h.bridge]).is_err() {
        ip(&["-n", n, "link", "add", &h.bridge, "type", "bridge"])?;
    }
    let mac = bridge_mac(&format!("{n}/{}", h.bridge));
    ip(&["-n", n, "link", "set", "dev", &h.bridge, "address", &mac])?;
    ip(&["-n", n, "link", "set", &h.bridge, "up"])?;
    if let Some((a, p)) = h.addr {
        let cidr = format!("{a}/{p}");
        if !ip(&["-n", n, "-o", "addr", "show", "dev", &h.bridge])?.contains(&format!(" {cidr} ")) {
            ip(&["-n", n, "addr", "add", &cidr, "dev", &h.bridge])?;
        }
    }
    // The veth: `link` on the backbone side, `link`-in inside the host's namespace.
    let inner = format!("{}i", &link[..link.len().min(14)]);
    if !exists(link) {
        ip(&["link", "add", link, "type", "veth", "peer", "name", &inner])?;
        ip(&["link", "set", &inner, "netns", n])?;
    }
    ip(&["link", "set", link, "master", backbone, "up"])?;
    ip(&["-n", n, "link", "set", &inner, "master", &h.bridge, "up"])?;
    Ok(())
}

/// Removes a simulated host's namespace (its veth pair and bridge go with it).
pub fn host_down(netns: &str) -> Result<(), NetError> {
    let has_ns = ip(&["netns", "list"])?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(netns));
    if has_ns {
        ip(&["netns", "del", netns])?;
    }
    Ok(())
}

/// Removes the backbone bridge.
pub fn backbone_down(name: &str) -> Result<(), NetError> {
    if exists(name) {
        ip(&["link", "del", name])?;
    }
    Ok(())
}

/// Moves the calling process into network namespace `netns` (`/run/netns/NAME`, as
/// `ip netns` makes them). Call before any thread starts: threads made later
/// inherit it, earlier ones stay where they were.
pub fn enter_netns(netns: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(Path::new("/run/netns").join(netns))?;
    // SAFETY: setns on an fd we own and keep open for the call; it changes only this
    // thread's network namespace, which is what the caller asks for.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
