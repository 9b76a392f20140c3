//! The traffic matrix: how many dependency-carrying packets each VM of the
//! cluster sent to each other VM, read from every VM's packet dump.
//!
//! Why: the restore dependency graph (HotRestore §4.1) has an edge i→j when VM
//! i sent VM j a packet it will send again after the restore, so j must be up
//! first. This module turns frames into those counts; [`crate::rdg`] turns the
//! counts into the graph.
//!
//! # What counts as a dependency
//! HotRestore §5.1 warns that counting every packet of a reliable connection
//! makes every pair a ring: data goes one way, acks come back. It counts only
//! the packets that carry something the receiver must be up to take. So do we:
//! - a TCP segment with payload, or with SYN or FIN (they consume a sequence
//!   number and are retransmitted until acknowledged);
//! - a UDP datagram (applications retransmit over UDP themselves, §5.1);
//! - not a pure ACK, an RST (never retransmitted), another IP protocol, a
//!   non-first IP fragment (its first fragment counted the datagram), or a
//!   non-IPv4 frame (ARP, IPv6 neighbour discovery: the stack redoes them).
//!
//! Both ends must be VMs of the cluster: traffic with outside hosts is skipped.
//!
//! # Which way a dependency points
//! A reply does not make the server depend on its client (§5.1: "the dependency
//! from receiver to sender is compelled, therefore it should be removed"). The
//! paper tells them apart by logging only the frames in flight at the cut; we
//! record every frame after the cut (a coordinated pause leaves few in flight), so
//! we tell them apart by ports: on a TCP connection whose one end is on a service
//! port (below Linux's ephemeral range, 32768) and the other on an ephemeral one,
//! the ephemeral end is the client, and every dependency-carrying segment of the
//! connection, request or reply, makes the client depend on the server. Any other
//! frame makes its sender depend on its receiver.
//!
//! # Who is who
//! [`Endpoints`] maps MAC addresses and/or IPv4 addresses to VM names. An
//! endpoint is resolved by IPv4 address first (it survives a router, which
//! rewrites MACs), then by MAC.
//!
//! # Each frame once
//! A filter-dump on a VM's netdev records both what the VM sends and what it
//! receives, so a frame between two VMs is in two dumps. We count it **in the
//! sender's dump only**: a frame whose sender is not the VM that owns the dump
//! is the receiving copy and is skipped. The sender's copy is also the one that
//! exists when the receiver was paused and never took the packet (the
//! on-the-fly packets of §5.1). The cost: a VM whose dump is missing contributes
//! no outgoing edges, which [`TrafficStats::dumps`] makes visible.
//!
//! # Time window
//! [`TrafficBuilder::since`] keeps only frames stamped at or after a time (µs
//! in the dumps' clock, see [`crate::pcap`]), e.g. the snapshot point.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::pcap::{Frame, PcapError, PcapOptions, PcapReader, TcpFlags, IPPROTO_TCP, IPPROTO_UDP};

/// Errors building a traffic matrix.
#[derive(Debug, thiserror::Error)]
pub enum TrafficError {
    #[error("The dump of VM {vm} cannot be read.")]
    Dump {
        vm: String,
        #[source]
        source: PcapError,
    },
    #[error("VM {vm} owns a dump but is not among the cluster's endpoints.")]
    UnknownOwner { vm: String },
    #[error("{what} is mapped to both VM {first} and VM {second}.")]
    Conflict {
        what: String,
        first: String,
        second: String,
    },
}

/// Which VM owns which addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoints {
    vms: BTreeSet<String>,
    macs: HashMap<crate::pcap::MacAddr, String>,
    ips: HashMap<Ipv4Addr, String>,
}

impl Endpoints {
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a VM, even one without a known address (it will be an orphan).
    pub fn add_vm(&mut self, vm: &str) {
        self.vms.insert(vm.to_owned());
    }

    /// Maps a MAC address to a VM; a MAC already mapped to another VM is refused.
    pub fn add_mac(&mut self, mac: crate::pcap::MacAddr, vm: &str) -> Result<(), TrafficError> {
        insert_unique(&mut self.macs, mac, vm, || format!("MAC {mac}"))?;
        self.add_vm(vm);
        Ok(())
    }

    /// Maps an IPv4 address to a VM; an address already mapped elsewhere is refused.
    pub fn add_ipv4(&mut self, ip: Ipv4Addr, vm: &str) -> Result<(), TrafficError> {
        insert_unique(&mut self.ips, ip, vm, || format!("IPv4 address {ip}"))?;
        self.add_vm(vm);
        Ok(())
    }

    pub fn vms(&self) -> impl Iterator<Item = &str> {
        self.vms.iter().map(String::as_str)
    }

    pub fn contains(&self, vm: &str) -> bool {
        self.vms.contains(vm)
    }

    /// The VMs that sent and are to receive the frame (by IPv4, then MAC).
    pub fn resolve(&self, frame: &Frame) -> (Option<&str>, Option<&str>) {
        let by_ip = |ip: Option<Ipv4Addr>| ip.and_then(|ip| self.ips.get(&ip));
        let ip = frame.ipv4.as_ref();
        let src = by_ip(ip.map(|i| i.src)).or_else(|| self.macs.get(&frame.src_mac));
        let dst = by_ip(ip.map(|i| i.dst)).or_else(|| self.macs.get(&frame.dst_mac));
        (src.map(String::as_str), dst.map(String::as_str))
    }
}

fn insert_unique<K: std::hash::Hash + Eq>(
    map: &mut HashMap<K, String>,
    key: K,
    vm: &str,
    what: impl FnOnce() -> String,
) -> Result<(), TrafficError> {
    match map.get(&key) {
        Some(first) if first != vm => Err(TrafficError::Conflict {
            what: what(),
            first: first.clone(),
            second: vm.to_owned(),
        }),
        _ => {
            map.insert(key, vm.to_owned());
            Ok(())
        }
    }
}

/// Whether a frame carries a restore dependency (see the module doc).
pub fn is_dependency(frame: &Frame) -> bool {
    let Some(ip) = frame.ipv4.as_ref() else {
        return false;
    };
    if !ip.first_fragment {
        return false;
    }
    match ip.protocol {
        IPPROTO_UDP => true,
        IPPROTO_TCP => {
            let flags = ip.tcp_flags.unwrap_or(TcpFlags(0));
            ip.payload_len > 0 || flags.has(TcpFlags::SYN) || flags.has(TcpFlags::FIN)
        }
        _ => false,
    }
}

/// The first port of Linux's ephemeral range (`net.ipv4.ip_local_port_range`).
pub const EPHEMERAL_MIN: u16 = 32768;

/// Whether a dependency frame is a server's reply on a TCP connection: then its
/// receiver (the client) depends on its sender, not the other way round.
pub fn is_reply(frame: &Frame) -> bool {
    frame.ipv4.as_ref().is_some_and(|ip| {
        ip.protocol == IPPROTO_TCP
            && ip
                .ports
                .is_some_and(|(s, d)| s < EPHEMERAL_MIN && d >= EPHEMERAL_MIN)
    })
}

/// Packets sent from VM to VM.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficMatrix {
    /// Every VM of the cluster, talking or not.
    pub vms: BTreeSet<String>,
    /// sender → receiver → dependency-carrying packets (pairs that talked).
    pub counts: BTreeMap<String, BTreeMap<String, u64>>,
}

impl TrafficMatrix {
    /// Packets `sender` sent to `receiver`.
    pub fn count(&self, sender: &str, receiver: &str) -> u64 {
        self.counts
            .get(sender)
            .and_then(|to| to.get(receiver))
            .copied()
            .unwrap_or(0)
    }

    /// `(sender, receiver, packets)` for every pair that talked.
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.counts
            .iter()
            .flat_map(|(s, to)| to.iter().map(move |(r, &n)| (s.as_str(), r.as_str(), n)))
    }
}

/// What happened to one dump.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpReport {
    pub vm: String,
    pub frames: u64,
    /// Frames that were not well-formed (skipped).
    pub malformed: u64,
    /// Set when the dump ended in a damaged record: the frames before it counted.
    pub damaged_tail: Option<String>,
}

/// Why frames did or did not count, over all dumps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrafficStats {
    pub frames: u64,
    pub counted: u64,
    pub before_window: u64,
    /// Non-IPv4, pure ACKs, RSTs, other protocols, later fragments.
    pub not_dependency: u64,
    /// One end is not a VM of the cluster, or a VM talking to itself.
    pub outside_cluster: u64,
    /// The receiving copy of a frame counted in its sender's dump.
    pub receiver_copy: u64,
    pub dumps: Vec<DumpReport>,
}

/// What [`TrafficBuilder::add_frame`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Counted,
    BeforeWindow,
    NotDependency,
    OutsideCluster,
    ReceiverCopy,
}

/// Accumulates the frames of many dumps into a [`TrafficMatrix`].
#[derive(Clone, Debug)]
pub struct TrafficBuilder {
    endpoints: Endpoints,
    since_us: Option<u64>,
    matrix: TrafficMatrix,
    stats: TrafficStats,
}

impl TrafficBuilder {
    pub fn new(endpoints: Endpoints) -> Self {
        let matrix = TrafficMatrix {
            vms: endpoints.vms.clone(),
            counts: BTreeMap::new(),
        };
        TrafficBuilder {
            endpoints,
            since_us: None,
            matrix,
            stats: TrafficStats::default(),
        }
    }

    /// Counts only frames stamped at or after `since_us`.
    pub fn since(mut self, since_us: u64) -> Self {
        self.since_us = Some(since_us);
        self
    }

    /// Takes one frame from the dump of VM `owner`.
    pub fn add_frame(&mut self, owner: &str, frame: &Frame) -> Verdict {
        self.stats.frames += 1;
        let verdict = self.judge(owner, frame);
        match verdict {
            Verdict::Counted => self.stats.counted += 1,
            Verdict::BeforeWindow => self.stats.before_window += 1,
            Verdict::NotDependency => self.stats.not_dependency += 1,
            Verdict::OutsideCluster => self.stats.outside_cluster += 1,
            Verdict::ReceiverCopy => self.stats.receiver_copy += 1,
        }
        verdict
    }

    fn judge(&mut self, owner: &str, frame: &Frame) -> Verdict {
        if self.since_us.is_some_and(|t| frame.timestamp_us < t) {
            return Verdict::BeforeWindow;
        }
        if !is_dependency(frame) {
            return Verdict::NotDependency;
        }
        let (Some(src), Some(dst)) = self.endpoints.resolve(frame) else {
            return Verdict::OutsideCluster;
        };
        if src == dst {
            return Verdict::OutsideCluster;
        }
        if src != owner {
            return Verdict::ReceiverCopy;
        }
        let (dependent, on) = if is_reply(frame) {
            (dst, src)
        } else {
            (src, dst)
        };
        let to = self.matrix.counts.entry(dependent.to_owned()).or_default();
        *to.entry(on.to_owned()).or_insert(0) += 1;
        Verdict::Counted
    }

    /// Reads a whole dump of VM `owner`. Malformed frames are skipped and
    /// counted; a damaged tail (QEMU killed mid-write) keeps the frames before
    /// it and is noted in the report; a dump that cannot be read at all is an
    /// error.
    pub fn add_dump<R: Read>(
        &mut self,
        owner: &str,
        reader: PcapReader<R>,
    ) -> Result<&DumpReport, TrafficError> {
        if !self.endpoints.contains(owner) {
            return Err(TrafficError::UnknownOwner {
                vm: owner.to_owned(),
            });
        }
        let mut report = DumpReport {
            vm: owner.to_owned(),
            ..DumpReport::default()
        };
        for item in reader.frames() {
            match item {
                Ok(frame) => {
                    report.frames += 1;
                    self.add_frame(owner, &frame);
                }
                Err(e) if !e.is_fatal() => report.malformed += 1,
                Err(PcapError::Io(source)) => {
                    return Err(TrafficError::Dump {
                        vm: owner.to_owned(),
                        source: PcapError::Io(source),
                    })
                }
                Err(e) => report.damaged_tail = Some(e.to_string()),
            }
        }
        self.stats.dumps.push(report);
        Ok(self.stats.dumps.last().expect("just pushed"))
    }

    /// Opens and reads the dump file of VM `owner`.
    pub fn add_dump_file(
        &mut self,
        owner: &str,
        path: &Path,
        options: PcapOptions,
    ) -> Result<&DumpReport, TrafficError> {
        let reader = PcapReader::open(path, options).map_err(|source| TrafficError::Dump {
            vm: owner.to_owned(),
            source,
        })?;
        self.add_dump(owner, reader)
    }

    pub fn finish(self) -> (TrafficMatrix, TrafficStats) {
        (self.matrix, self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::tests::{
        arp_frame, ip, mac, tcp_frame, tcp_frame_ports, udp_frame, DumpBuilder,
    };

    const SYN: u8 = TcpFlags::SYN;
    const ACK: u8 = TcpFlags::ACK;
    const PSH: u8 = TcpFlags::PSH;

    fn endpoints() -> Endpoints {
        let mut e = Endpoints::new();
        e.add_mac(mac(1), "web").unwrap();
        e.add_mac(mac(2), "db").unwrap();
        e.add_ipv4(ip(3), "cache").unwrap();
        e.add_vm("batch");
        e
    }

    fn reader(b: &DumpBuilder) -> PcapReader<&[u8]> {
        PcapReader::new(&b.bytes[..], PcapOptions::default()).unwrap()
    }

    /// web (1) connects from an ephemeral port to db's (2) service port: its
    /// requests and db's replies all make web depend on db, never db on web. A
    /// connection between two service ports, or UDP, keeps the frame's direction.
    #[test]
    fn replies_on_a_connection_make_the_client_depend_on_the_server() {
        let (client, server) = (45000, 7400);
        let mut dump = DumpBuilder::new();
        for t in 0..4u64 {
            dump.record(
                t * 10,
                &tcp_frame_ports(1, 2, (client, server), PSH | ACK, 40),
            );
            dump.record(
                t * 10 + 1,
                &tcp_frame_ports(2, 1, (server, client), PSH | ACK, 40),
            );
            dump.record(t * 10 + 2, &tcp_frame_ports(1, 2, (client, server), ACK, 0));
        }
        dump.record(50, &tcp_frame_ports(2, 1, (server, 22), PSH | ACK, 10));
        dump.record(51, &udp_frame(2, 1, 10));
        let mut b = TrafficBuilder::new(endpoints());
        b.add_dump("web", reader(&dump)).unwrap();
        b.add_dump("db", reader(&dump)).unwrap();
        let (m, _) = b.finish();
        assert_eq!(m.count("web", "db"), 8, "4 requests and 4 replies");
        assert_eq!(
            m.count("db", "web"),
            2,
            "service port to service port, and UDP"
        );
    }

    #[test]
    fn a_conversation_counts_once_and_only_its_dependencies() {
        // web (1) asks db (2): SYN, SYN/ACK, ACK, request, ACK, response, ACK,
        // FIN both ways. Each dump holds every frame of the conversation.
        let conversation: Vec<(u8, u8, u8, usize)> = vec![
            (1, 2, SYN, 0),
            (2, 1, SYN | ACK, 0),
            (1, 2, ACK, 0),
            (1, 2, PSH | ACK, 200),
            (2, 1, ACK, 0),
            (2, 1, PSH | ACK, 900),
            (1, 2, ACK, 0),
            (1, 2, TcpFlags::FIN | ACK, 0),
            (2, 1, TcpFlags::FIN | ACK, 0),
            (1, 2, ACK, 0),
        ];
        let mut dump = DumpBuilder::new();
        for (t, &(s, d, flags, len)) in conversation.iter().enumerate() {
            dump.record(t as u64, &tcp_frame(s, d, flags, len));
        }
        dump.record(99, &arp_frame(1));
        let mut b = TrafficBuilder::new(endpoints());
        b.add_dump("web", reader(&dump)).unwrap();
        b.add_dump("db", reader(&dump)).unwrap();
        let (m, stats) = b.finish();
        // web → db: SYN, request, FIN. db → web: SYN/ACK, response, FIN.
        assert_eq!(m.count("web", "db"), 3);
        assert_eq!(m.count("db", "web"), 3);
        assert_eq!(stats.counted, 6);
        assert_eq!(
            stats.receiver_copy, 6,
            "each counted frame's other copy is skipped"
        );
        assert_eq!(
            stats.not_dependency,
            2 * 5,
            "pure ACKs and ARP, in both dumps"
        );
        assert!(m.vms.contains("batch"), "a silent VM stays in the matrix");
    }

    #[test]
    fn udp_and_ipv4_mapping_and_outsiders() {
        let mut dump = DumpBuilder::new();
        dump.record(1, &udp_frame(1, 3, 10)); // web → cache (cache known by IPv4 only)
        dump.record(2, &udp_frame(1, 3, 0)); // an empty datagram still counts
        dump.record(3, &udp_frame(1, 77, 10)); // web → outside host
        dump.record(4, &tcp_frame(1, 1, PSH, 5)); // web to itself
        let mut b = TrafficBuilder::new(endpoints());
        b.add_dump("web", reader(&dump)).unwrap();
        let (m, stats) = b.finish();
        assert_eq!(m.count("web", "cache"), 2);
        assert_eq!(stats.outside_cluster, 2);
        assert_eq!(m.pairs().count(), 1);
    }

    #[test]
    fn ipv4_mapping_wins_over_a_routers_mac() {
        let mut e = Endpoints::new();
        e.add_ipv4(ip(1), "a").unwrap();
        e.add_ipv4(ip(2), "b").unwrap();
        e.add_mac(mac(2), "router-side-vm").unwrap();
        let frame = Frame::parse(0, &udp_frame(1, 2, 1), 60).unwrap();
        assert_eq!(e.resolve(&frame), (Some("a"), Some("b")));
    }

    #[test]
    fn time_window_drops_earlier_frames() {
        let mut dump = DumpBuilder::new();
        for t in [100, 200, 300, 400] {
            dump.record(t, &udp_frame(1, 2, 1));
        }
        let mut b = TrafficBuilder::new(endpoints()).since(300);
        b.add_dump("web", reader(&dump)).unwrap();
        let (m, stats) = b.finish();
        assert_eq!(m.count("web", "db"), 2);
        assert_eq!(stats.before_window, 2);
    }

    #[test]
    fn damaged_tail_keeps_earlier_counts_and_is_reported() {
        let mut dump = DumpBuilder::new();
        dump.record(1, &udp_frame(1, 2, 1));
        dump.record(2, &udp_frame(1, 2, 1));
        dump.record(3, &udp_frame(1, 2, 1));
        let cut = dump.bytes.len() - 5;
        let mut b = TrafficBuilder::new(endpoints());
        let damaged = PcapReader::new(&dump.bytes[..cut], PcapOptions::default()).unwrap();
        let report = b.add_dump("web", damaged).unwrap();
        assert_eq!(report.frames, 2);
        assert!(report
            .damaged_tail
            .as_deref()
            .unwrap()
            .contains("cut short"));
        assert_eq!(b.finish().0.count("web", "db"), 2);
    }

    #[test]
    fn unreadable_or_foreign_dumps_are_errors() {
        let mut b = TrafficBuilder::new(endpoints());
        let dump = DumpBuilder::new();
        let err = b.add_dump("stranger", reader(&dump)).unwrap_err();
        assert!(err.to_string().contains("stranger"));
        let missing = Path::new("/nonexistent/rebound-cluster/x.pcap");
        let err = b
            .add_dump_file("web", missing, PcapOptions::default())
            .unwrap_err();
        assert!(matches!(err, TrafficError::Dump { .. }));
    }

    #[test]
    fn one_address_for_two_vms_is_refused() {
        let mut e = Endpoints::new();
        e.add_mac(mac(1), "a").unwrap();
        e.add_mac(mac(1), "a").unwrap();
        let err = e.add_mac(mac(1), "b").unwrap_err();
        assert!(err.to_string().contains("52:54:00:00:00:01"), "{err}");
    }

    #[test]
    fn matrix_round_trips_through_json() {
        let mut dump = DumpBuilder::new();
        dump.record(1, &udp_frame(1, 2, 1));
        let mut b = TrafficBuilder::new(endpoints());
        b.add_dump("web", reader(&dump)).unwrap();
        let (m, _) = b.finish();
        let back: TrafficMatrix =
            serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
