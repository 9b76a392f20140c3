//! `cluster.toml`: the VMs of a cluster, the host each runs on, and the L2 network
//! joining them.
//!
//! ```toml
//! [network]
//! subnet = "10.77.0.0/24"     # the guests' addresses on the cluster network
//! topology = "all-to-all"     # peers of the `peer` workload: all-to-all, client-server, ring
//!
//! [defaults]                  # for every VM unless it says otherwise
//! memory = "192M"
//! workload = "peer"
//!
//! [[host]]
//! name = "h1"
//! simulated = true            # a network namespace on this machine, with its own daemon
//!
//! [[host]]
//! name = "h2"                 # a real host: its daemon joins the cluster store
//!                             # (rebound daemon --etcd ... --host h2)
//!
//! [[vm]]
//! name = "n1"
//! host = "h1"
//! ip = "10.77.0.11"           # optional: given in order from .11 otherwise
//! peers = ["n2"]              # optional: from the topology otherwise
//! ```
//!
//! A simulated host has an address on the cluster network (the subnet's addresses
//! from .201 on, unless `addr` is given), inside the host's namespace: its member of
//! the cluster's etcd listens there. The machine's own side of the backbone bridge
//! takes .254, so commands run on the machine reach every guest and every member.
//! Hosts reach each other only through the cluster store.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

/// The `peer` workload's port, where host clients also ask their questions.
pub const PEER_PORT: u16 = 7400;
/// The most VMs one cluster file may hold (the guests' peers lists stay short enough
/// for a kernel command line only with a topology that is not all-to-all beyond 16).
pub const MAX_VMS: usize = 250;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("cluster file: {0}")]
    Toml(String),
    #[error("cluster file: {0}")]
    Invalid(String),
}

/// How the `peer` workload's VMs talk, when a VM does not list its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Topology {
    /// Every VM talks to every other one (Elasticsearch-like).
    #[default]
    AllToAll,
    /// The first VM sends work to all others, which talk to nobody (distcc-like).
    ClientServer,
    /// Each VM talks to the next, the last to the first.
    Ring,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    network: NetworkFile,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default, rename = "host")]
    hosts: Vec<HostFile>,
    #[serde(default, rename = "vm")]
    vms: Vec<VmFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    subnet: String,
    #[serde(default)]
    topology: Topology,
    /// The bridge VMs plug into on every host (default br0).
    bridge: Option<String>,
}

/// What every VM gets unless it says otherwise.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    pub image: Option<String>,
    pub memory: Option<String>,
    pub cpus: Option<u32>,
    pub workload: Option<String>,
    #[serde(default)]
    pub workload_args: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    name: String,
    #[serde(default)]
    simulated: bool,
    daemon: Option<String>,
    addr: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmFile {
    name: String,
    host: String,
    ip: Option<String>,
    peers: Option<Vec<String>>,
    image: Option<String>,
    memory: Option<String>,
    cpus: Option<u32>,
    workload: Option<String>,
    #[serde(default)]
    workload_args: BTreeMap<String, String>,
}

/// A checked cluster: every name resolved, every address given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub name: String,
    pub subnet: (Ipv4Addr, u8),
    pub bridge: String,
    pub topology: Topology,
    pub hosts: Vec<HostSpec>,
    pub vms: Vec<VmSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    pub name: String,
    /// A network namespace on this machine with a daemon of its own.
    pub simulated: bool,
    /// A simulated host's address on the cluster network (its etcd member listens
    /// there); `None` for a real host.
    pub addr: Option<Ipv4Addr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmSpec {
    pub name: String,
    pub host: String,
    pub ip: Ipv4Addr,
    /// Names of the VMs it talks to.
    pub peers: Vec<String>,
    pub image: Option<String>,
    pub memory: Option<String>,
    pub cpus: Option<u32>,
    pub workload: Option<String>,
    pub workload_args: BTreeMap<String, String>,
}

fn bad(s: String) -> SpecError {
    SpecError::Invalid(s)
}

fn parse_subnet(s: &str) -> Result<(Ipv4Addr, u8), SpecError> {
    let e = || {
        bad(format!(
            "subnet {s:?} is not an IPv4 network like 10.77.0.0/24"
        ))
    };
    let (a, p) = s.split_once('/').ok_or_else(e)?;
    let a: Ipv4Addr = a.parse().map_err(|_| e())?;
    let p: u8 = p.parse().map_err(|_| e())?;
    if !(8..=24).contains(&p) {
        return Err(bad(format!(
            "subnet {s:?}: the prefix must be 8-24 (room for the VMs, the hosts and .254)"
        )));
    }
    let mask = u32::MAX << (32 - p);
    if u32::from(a) & !mask != 0 {
        return Err(bad(format!(
            "subnet {s:?} has host bits set: write its network address"
        )));
    }
    Ok((a, p))
}

/// The subnet's address with host part `n`.
fn nth((net, _): (Ipv4Addr, u8), n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(net) + n)
}

fn in_subnet((net, p): (Ipv4Addr, u8), a: Ipv4Addr) -> bool {
    let mask = u32::MAX << (32 - p);
    u32::from(a) & mask == u32::from(net)
        && u32::from(a) & !mask != 0
        && u32::from(a) & !mask != !mask
}

impl ClusterSpec {
    /// Parses and checks a cluster file; `name` (the command line's) wins over the
    /// file's own.
    pub fn parse(text: &str, name: &str) -> Result<ClusterSpec, SpecError> {
        let f: File = toml::from_str(text).map_err(|e| {
            // toml's Display spans several lines (a caret under the source); one line
            // here: where, then what.
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let what = e.message().lines().next().unwrap_or("").to_string();
            SpecError::Toml(match line {
                Some(l) => format!("line {l}: {what}"),
                None => what,
            })
        })?;
        if let Some(n) = &f.name {
            if n != name {
                return Err(bad(format!(
                    "it names the cluster {n:?} but the command says {name:?}"
                )));
            }
        }
        let subnet = parse_subnet(&f.network.subnet)?;
        let bridge = f.network.bridge.clone().unwrap_or_else(|| "br0".into());
        if !valid_ifname(&bridge) {
            return Err(bad(format!("bridge {bridge:?} is not an interface name")));
        }
        if f.hosts.is_empty() {
            return Err(bad("no [[host]]".into()));
        }
        if f.vms.is_empty() {
            return Err(bad("no [[vm]]".into()));
        }
        if f.vms.len() > MAX_VMS {
            return Err(bad(format!("{} VMs: at most {MAX_VMS}", f.vms.len())));
        }
        let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
        taken.insert(nth(subnet, 254));
        let mut hosts = Vec::new();
        let mut sim_n = 0;
        for h in &f.hosts {
            if !valid_name(&h.name) {
                return Err(bad(format!(
                    "host name {:?}: use 1-15 letters, digits, '_' or '-'",
                    h.name
                )));
            }
            if hosts.iter().any(|x: &HostSpec| x.name == h.name) {
                return Err(bad(format!("host {:?} appears twice", h.name)));
            }
            if h.daemon.is_some() {
                return Err(bad(format!(
                    "host {:?}: daemon= is no longer read: hosts meet in the cluster store (a real host's daemon runs with --etcd ... --host {}; a simulated host may give addr=)",
                    h.name, h.name
                )));
            }
            let addr = match (h.simulated, &h.addr) {
                (true, a) => {
                    sim_n += 1;
                    let ip = match a {
                        Some(a) => a.parse::<Ipv4Addr>().map_err(|_| {
                            bad(format!(
                                "host {:?}: addr {a:?} is not an IPv4 address",
                                h.name
                            ))
                        })?,
                        None => nth(subnet, 200 + sim_n),
                    };
                    if !in_subnet(subnet, ip) {
                        return Err(bad(format!(
                            "host {:?}: addr {ip} is not a host address of the subnet",
                            h.name
                        )));
                    }
                    if !taken.insert(ip) {
                        return Err(bad(format!(
                            "host {:?}: address {ip} is taken twice",
                            h.name
                        )));
                    }
                    Some(ip)
                }
                (false, None) => None,
                (false, Some(_)) => {
                    return Err(bad(format!(
                        "host {:?}: addr= is for simulated hosts",
                        h.name
                    )))
                }
            };
            hosts.push(HostSpec {
                name: h.name.clone(),
                simulated: h.simulated,
                addr,
            });
        }
        let names: Vec<&str> = f.vms.iter().map(|v| v.name.as_str()).collect();
        for (i, v) in f.vms.iter().enumerate() {
            if !valid_vm_name(&v.name) {
                return Err(bad(format!(
                    "VM name {:?}: use 1-40 letters, digits, '_', '.' or '-', starting with a letter or digit",
                    v.name
                )));
            }
            if names[..i].contains(&v.name.as_str()) {
                return Err(bad(format!("VM {:?} appears twice", v.name)));
            }
            if !hosts.iter().any(|h| h.name == v.host) {
                return Err(bad(format!(
                    "VM {:?} runs on host {:?}, which has no [[host]]",
                    v.name, v.host
                )));
            }
        }
        let mut next = 10u32;
        let mut vms: Vec<VmSpec> = Vec::new();
        for v in &f.vms {
            let ip = match &v.ip {
                Some(a) => {
                    let ip: Ipv4Addr = a.parse().map_err(|_| {
                        bad(format!("VM {:?}: ip {a:?} is not an IPv4 address", v.name))
                    })?;
                    if !in_subnet(subnet, ip) {
                        return Err(bad(format!(
                            "VM {:?}: ip {ip} is not a host address of the subnet",
                            v.name
                        )));
                    }
                    ip
                }
                None => loop {
                    next += 1;
                    let ip = nth(subnet, next);
                    if !in_subnet(subnet, ip) {
                        return Err(bad("the subnet has no address left for the VMs".into()));
                    }
                    if !taken.contains(&ip)
                        && !f
                            .vms
                            .iter()
                            .any(|o| o.ip.as_deref() == Some(&ip.to_string()))
                    {
                        break ip;
                    }
                },
            };
            if !taken.insert(ip) {
                return Err(bad(format!("VM {:?}: address {ip} is taken twice", v.name)));
            }
            vms.push(VmSpec {
                name: v.name.clone(),
                host: v.host.clone(),
                ip,
                peers: Vec::new(),
                image: v.image.clone().or_else(|| f.defaults.image.clone()),
                memory: v.memory.clone().or_else(|| f.defaults.memory.clone()),
                cpus: v.cpus.or(f.defaults.cpus),
                workload: v.workload.clone().or_else(|| f.defaults.workload.clone()),
                workload_args: {
                    let mut a = f.defaults.workload_args.clone();
                    a.extend(v.workload_args.clone());
                    a
                },
            });
        }
        let n = vms.len();
        for (i, v) in f.vms.iter().enumerate() {
            let peers: Vec<String> = match &v.peers {
                Some(p) => {
                    for q in p {
                        if !names.contains(&q.as_str()) {
                            return Err(bad(format!(
                                "VM {:?}: peer {q:?} is not a VM of the cluster",
                                v.name
                            )));
                        }
                        if q == &v.name {
                            return Err(bad(format!("VM {:?} lists itself as a peer", v.name)));
                        }
                    }
                    p.clone()
                }
                None => match f.network.topology {
                    Topology::AllToAll => names
                        .iter()
                        .filter(|m| **m != v.name)
                        .map(|m| m.to_string())
                        .collect(),
                    Topology::ClientServer if i == 0 => {
                        names[1..].iter().map(|m| m.to_string()).collect()
                    }
                    Topology::ClientServer => Vec::new(),
                    Topology::Ring if n > 1 => vec![names[(i + 1) % n].to_string()],
                    Topology::Ring => Vec::new(),
                },
            };
            if peers.len() > 16 {
                return Err(bad(format!(
                    "VM {:?} has {} peers: the peer workload takes at most 16 (choose another topology or list peers)",
                    v.name,
                    peers.len()
                )));
            }
            vms[i].peers = peers;
        }
        Ok(ClusterSpec {
            name: name.to_string(),
            subnet,
            bridge,
            topology: f.network.topology,
            hosts,
            vms,
        })
    }

    pub fn host(&self, name: &str) -> Option<&HostSpec> {
        self.hosts.iter().find(|h| h.name == name)
    }

    pub fn vm(&self, name: &str) -> Option<&VmSpec> {
        self.vms.iter().find(|v| v.name == name)
    }

    /// The address the machine's own side of the backbone takes (simulated hosts).
    pub fn backbone_addr(&self) -> (Ipv4Addr, u8) {
        (nth(self.subnet, 254), self.subnet.1)
    }

    /// `IP:PORT` of each of `vm`'s peers, for the `peer` workload's `peers`.
    pub fn peer_addrs(&self, vm: &VmSpec) -> Vec<SocketAddrV4> {
        vm.peers
            .iter()
            .filter_map(|p| self.vm(p))
            .map(|p| SocketAddrV4::new(p.ip, PEER_PORT))
            .collect()
    }
}

fn valid_name(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn valid_vm_name(s: &str) -> bool {
    (1..=40).contains(&s.len())
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

fn valid_ifname(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
        [network]
        subnet = "10.77.0.0/24"
        [defaults]
        memory = "192M"
        workload = "peer"
        [[host]]
        name = "h1"
        simulated = true
        [[host]]
        name = "h2"
        simulated = true
        [[vm]]
        name = "n1"
        host = "h1"
        [[vm]]
        name = "n2"
        host = "h2"
        ip = "10.77.0.11"
        [[vm]]
        name = "n3"
        host = "h2"
        memory = "256M"
    "#;

    #[test]
    fn a_cluster_file_gets_addresses_peers_and_defaults() {
        let c = ClusterSpec::parse(TWO, "c").unwrap();
        assert_eq!(c.hosts[0].addr, Some("10.77.0.201".parse().unwrap()));
        assert_eq!(c.hosts[1].addr, Some("10.77.0.202".parse().unwrap()));
        // n2 asked for .11, so n1 and n3 get the next free ones.
        let ips: Vec<String> = c.vms.iter().map(|v| v.ip.to_string()).collect();
        assert_eq!(ips, ["10.77.0.12", "10.77.0.11", "10.77.0.13"]);
        assert_eq!(c.vms[0].peers, ["n2", "n3"]);
        assert_eq!(c.vms[2].memory.as_deref(), Some("256M"));
        assert_eq!(c.vms[1].memory.as_deref(), Some("192M"));
        assert_eq!(c.backbone_addr(), ("10.77.0.254".parse().unwrap(), 24));
        let p: Vec<String> = c
            .peer_addrs(&c.vms[1])
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(p, ["10.77.0.12:7400", "10.77.0.13:7400"]);
    }

    #[test]
    fn topologies_give_the_peers_they_name() {
        let ring = TWO.replace(
            "subnet = \"10.77.0.0/24\"",
            "subnet = \"10.77.0.0/24\"\ntopology = \"ring\"",
        );
        let c = ClusterSpec::parse(&ring, "c").unwrap();
        let peers: Vec<Vec<String>> = c.vms.iter().map(|v| v.peers.clone()).collect();
        assert_eq!(peers, [vec!["n2"], vec!["n3"], vec!["n1"]]);
        let cs = TWO.replace(
            "subnet = \"10.77.0.0/24\"",
            "subnet = \"10.77.0.0/24\"\ntopology = \"client-server\"",
        );
        let c = ClusterSpec::parse(&cs, "c").unwrap();
        let peers: Vec<usize> = c.vms.iter().map(|v| v.peers.len()).collect();
        assert_eq!(peers, [2, 0, 0]);
    }

    #[test]
    fn bad_cluster_files_say_what_is_wrong() {
        for (from, to, why) in [
            (
                "subnet = \"10.77.0.0/24\"",
                "subnet = \"10.77.0.1/24\"",
                "host bits",
            ),
            (
                "subnet = \"10.77.0.0/24\"",
                "subnet = \"10.77.0.0/28\"",
                "prefix must be",
            ),
            (
                "subnet = \"10.77.0.0/24\"",
                "subnet = \"x\"",
                "not an IPv4 network",
            ),
            (
                "host = \"h2\"\n        ip",
                "host = \"h9\"\n        ip",
                "no [[host]]",
            ),
            (
                "ip = \"10.77.0.11\"",
                "ip = \"10.78.0.11\"",
                "not a host address",
            ),
            ("ip = \"10.77.0.11\"", "ip = \"10.77.0.201\"", "taken twice"),
            ("name = \"n3\"", "name = \"n1\"", "appears twice"),
            ("name = \"n3\"", "name = \"-x\"", "VM name"),
            (
                "ip = \"10.77.0.11\"",
                "peers = [\"n7\"]",
                "not a VM of the cluster",
            ),
            ("ip = \"10.77.0.11\"", "peers = [\"n2\"]", "itself"),
            (
                "simulated = true\n        [[vm]]",
                "daemon = \"10.0.0.5:7300\"\n        [[vm]]",
                "daemon= is no longer read",
            ),
            (
                "simulated = true\n        [[vm]]",
                "addr = \"10.77.0.9\"\n        [[vm]]",
                "addr= is for simulated hosts",
            ),
            (
                "memory = \"256M\"",
                "memory = \"256M\"\n        colour = 1",
                "unknown field",
            ),
            ("[network]", "[netwerk]", "unknown field"),
        ] {
            assert!(TWO.contains(from), "{from}");
            let text = TWO.replacen(from, to, 1);
            let e = ClusterSpec::parse(&text, "c").unwrap_err().to_string();
            assert!(e.contains(why), "{from} -> {to}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = ClusterSpec::parse("name = \"a\"\n", "b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing field"), "{e}");
        let e = ClusterSpec::parse(&format!("name = \"a\"\n{TWO}"), "b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("names the cluster \"a\""), "{e}");
    }

    #[test]
    fn all_to_all_beyond_seventeen_vms_is_refused_with_the_reason() {
        let mut t = String::from(
            "[network]\nsubnet = \"10.77.0.0/24\"\n[[host]]\nname = \"h\"\nsimulated = true\n",
        );
        for i in 0..18 {
            t.push_str(&format!("[[vm]]\nname = \"v{i}\"\nhost = \"h\"\n"));
        }
        let e = ClusterSpec::parse(&t, "c").unwrap_err().to_string();
        assert!(e.contains("at most 16"), "{e}");
    }
}
