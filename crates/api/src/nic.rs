//! One entry of a VM's `nics`: a virtio NIC plugged into a Linux bridge of the host
//! the VM runs on, `bridge=BR[,mac=MAC][,ip=IP/PREFIX]`.
//!
//! Every VM keeps QEMU's user network as `eth0` (the host reaches its services through
//! forwarded ports); a `nics` entry adds a NIC on a bridge, through a tap device the
//! daemon makes and removes with the VM. VMs on one bridge, or on bridges joined
//! across hosts, share one L2 network: a cluster's network.
//!
//! - `mac`: the NIC's address; every guest on a segment needs its own. The daemon
//!   picks one from the VM's name when none is given and writes it into the spec, so
//!   that a snapshot restored under another name keeps the address its guest knows.
//! - `ip`: the guest's address on that network, given to Rebound's guest init
//!   (`rebound.net=MAC@IP/PREFIX`), which configures the interface with that MAC. A
//!   guest without Rebound's init configures its own network and ignores it.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::parse::SpecError;

/// A parsed `nics` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicOpts {
    pub bridge: String,
    pub mac: Option<Mac>,
    pub ip: Option<(Ipv4Addr, u8)>,
}

/// An Ethernet unicast address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl FromStr for Mac {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let mut b = [0u8; 6];
        if parts.len() != 6 {
            return Err(format!(
                "MAC {s:?} is not six hex bytes like 52:54:00:12:34:56"
            ));
        }
        for (o, p) in b.iter_mut().zip(&parts) {
            if p.len() != 2 {
                return Err(format!(
                    "MAC {s:?} is not six hex bytes like 52:54:00:12:34:56"
                ));
            }
            *o = u8::from_str_radix(p, 16)
                .map_err(|_| format!("MAC {s:?} is not six hex bytes like 52:54:00:12:34:56"))?;
        }
        if b[0] & 1 != 0 {
            return Err(format!(
                "MAC {s:?} is a multicast address: a NIC needs a unicast one"
            ));
        }
        if b == [0; 6] {
            return Err(format!("MAC {s:?} is all zeros"));
        }
        Ok(Mac(b))
    }
}

impl Mac {
    /// QEMU's locally administered prefix 52:54:00 and three bytes from the VM's name
    /// and the NIC's index (FNV-1a): stable across runs, distinct in practice.
    pub fn for_vm(vm: &str, nic: usize) -> Mac {
        let h = fnv(vm, nic);
        Mac([0x52, 0x54, 0x00, (h >> 16) as u8, (h >> 8) as u8, h as u8])
    }
}

fn fnv(vm: &str, nic: usize) -> u32 {
    short_hash(&format!("{vm}/{nic}"))
}

/// FNV-1a of `s`: a short, stable hash for names that must fit an interface name
/// (15 bytes at most), such as taps, bridges and veths.
pub fn short_hash(s: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    h
}

/// The tap device of NIC `nic` of VM `vm`: interface names have at most 15 bytes, VM
/// names up to 63, so the name is a hash (`rbt` and eight hex digits).
pub fn tap_name(vm: &str, nic: usize) -> String {
    format!("rbt{:08x}", fnv(vm, nic))
}

/// Whether `s` can name a network interface (bridge): 1-15 bytes of letters, digits,
/// `_`, `.`, `-`, as the kernel takes them in an `ip` command without quoting issues.
pub fn valid_ifname(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        && s != "."
        && s != ".."
}

impl FromStr for NicOpts {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let bad = |why: String| SpecError::Nic(s.to_string(), why);
        let mut n = NicOpts {
            bridge: String::new(),
            mac: None,
            ip: None,
        };
        let mut seen = Vec::new();
        for p in s.split(',') {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| bad(format!("option {p:?} is not KEY=VALUE")))?;
            if seen.contains(&k) {
                return Err(bad(format!("option {k:?} given twice")));
            }
            seen.push(k);
            match k {
                "bridge" => {
                    if !valid_ifname(v) {
                        return Err(bad(format!(
                            "bridge {v:?} is not an interface name (1-15 letters, digits, '_', '.', '-')"
                        )));
                    }
                    n.bridge = v.to_string();
                }
                "mac" => n.mac = Some(v.parse().map_err(bad)?),
                "ip" => n.ip = Some(parse_cidr(v).map_err(bad)?),
                _ => {
                    return Err(bad(format!(
                        "unknown option {k:?} (expected bridge, mac or ip)"
                    )))
                }
            }
        }
        if n.bridge.is_empty() {
            return Err(bad(
                "no bridge= (the host's bridge the NIC plugs into)".into()
            ));
        }
        Ok(n)
    }
}

/// `IP/PREFIX`, a host address (not the network's or the broadcast address).
fn parse_cidr(v: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, p) = v
        .split_once('/')
        .ok_or_else(|| format!("ip {v:?} is not IP/PREFIX like 10.77.0.11/24"))?;
    let ip: Ipv4Addr = a
        .parse()
        .map_err(|_| format!("ip {v:?} is not IP/PREFIX like 10.77.0.11/24"))?;
    let prefix: u8 = p
        .parse()
        .ok()
        .filter(|p| (1..=30).contains(p))
        .ok_or_else(|| format!("ip {v:?}: the prefix must be 1-30"))?;
    let host = u32::from(ip) & (u32::MAX >> prefix);
    if host == 0 || host == u32::MAX >> prefix {
        return Err(format!(
            "ip {v:?} is the network's or its broadcast address, not a host's"
        ));
    }
    Ok((ip, prefix))
}

impl fmt::Display for NicOpts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bridge={}", self.bridge)?;
        if let Some(m) = self.mac {
            write!(f, ",mac={m}")?;
        }
        if let Some((ip, p)) = self.ip {
            write!(f, ",ip={ip}/{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_print_back() {
        let n: NicOpts = "bridge=br0,mac=52:54:00:aa:bb:0c,ip=10.77.0.11/24"
            .parse()
            .unwrap();
        assert_eq!(n.bridge, "br0");
        assert_eq!(n.mac, Some(Mac([0x52, 0x54, 0, 0xaa, 0xbb, 0x0c])));
        assert_eq!(n.ip, Some((Ipv4Addr::new(10, 77, 0, 11), 24)));
        assert_eq!(
            n.to_string(),
            "bridge=br0,mac=52:54:00:aa:bb:0c,ip=10.77.0.11/24"
        );
        let n: NicOpts = "bridge=br-x.1".parse().unwrap();
        assert_eq!((n.mac, n.ip), (None, None));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (s, why) in [
            ("", "not KEY=VALUE"),
            ("mac=52:54:00:00:00:01", "no bridge="),
            ("bridge=br0,bridge=br1", "given twice"),
            ("bridge=a-very-long-bridge-name", "not an interface name"),
            ("bridge=br0 x", "not an interface name"),
            ("bridge=br0,mac=52:54:00:00:01", "six hex bytes"),
            ("bridge=br0,mac=01:00:5e:00:00:01", "multicast"),
            ("bridge=br0,mac=00:00:00:00:00:00", "all zeros"),
            ("bridge=br0,mac=52:54:00:00:00:zz", "six hex bytes"),
            ("bridge=br0,ip=10.77.0.11", "IP/PREFIX"),
            ("bridge=br0,ip=10.77.0.300/24", "IP/PREFIX"),
            ("bridge=br0,ip=10.77.0.11/31", "prefix"),
            ("bridge=br0,ip=10.77.0.0/24", "network's or its broadcast"),
            ("bridge=br0,ip=10.77.0.255/24", "network's or its broadcast"),
            ("bridge=br0,vlan=3", "unknown option"),
        ] {
            let e = s.parse::<NicOpts>().unwrap_err().to_string();
            assert!(e.contains(why), "{s:?}: {e}");
        }
    }

    #[test]
    fn generated_names_fit_the_kernel_and_differ() {
        let long = "a".repeat(63);
        for (vm, i) in [("n1", 0), ("n1", 1), ("n2", 0), (long.as_str(), 0)] {
            let t = tap_name(vm, i);
            assert!(valid_ifname(&t) && t.len() <= 15, "{t}");
            let m = Mac::for_vm(vm, i);
            assert_eq!(m.to_string().parse::<Mac>(), Ok(m));
        }
        assert_ne!(tap_name("n1", 0), tap_name("n2", 0));
        assert_ne!(tap_name("n1", 0), tap_name("n1", 1));
        assert_ne!(Mac::for_vm("n1", 0), Mac::for_vm("n2", 0));
    }
}
