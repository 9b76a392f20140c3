//! Reader for the packet dumps QEMU's `-object filter-dump,id=F,netdev=N,file=P`
//! writes, decoded just far enough (Ethernet → IPv4 → TCP/UDP) to tell who sent
//! a dependency-carrying packet to whom; and [`write_pcap`], a writer of the same
//! format (the frames a restore replays, `crate::replay`).
//!
//! Why: the restore dependency graph (HotRestore §4.1) is built from the packets
//! the VMs exchanged around the snapshot. QEMU already records them; we only
//! have to read the file back, and to survive a file cut short when QEMU was
//! killed in the middle of a write.
//!
//! # The format, as QEMU 7.2's `net/dump.c` writes it
//! - A classic libpcap file header of 24 bytes (`struct pcap_file_hdr`): magic
//!   `0xa1b2c3d4` written in the *host's* byte order (so both byte orders of the
//!   magic must be read: a file from a big-endian host reads `d4 c3 b2 a1`
//!   backwards), version 2.4, `thiszone` 0, `sigfigs` 0, `snaplen` = the
//!   filter's `maxlen` property (default 65536, never 0), link type 1
//!   (Ethernet).
//! - Then one 16-byte record header per packet (`struct pcap_sf_pkthdr`):
//!   seconds, microseconds, captured length (`min(size, maxlen)`), wire length;
//!   then the captured bytes. Timestamps are microseconds: QEMU's virtual clock
//!   in µs plus the host time when the filter was set up. The virtual clock
//!   stops while the VM is paused, so timestamps are comparable within one file
//!   and only roughly across files.
//! - QEMU 7.2 dumps the packet buffer as it travels between the NIC and the
//!   netdev, *including a virtio-net header* when the tap was opened with
//!   `vnet_hdr=on` (stripping it came only in QEMU 8.0). Our taps use
//!   `vnet_hdr=off`, so frames start with the Ethernet header; to stay robust,
//!   [`VnetHdr`] lets the caller state a header length (10 for legacy
//!   virtio-net, 12 with `mrg_rxbuf`/virtio 1.0) or ask for detection. Detection
//!   looks at the first frame that decodes as a known EtherType at offset 0, 12
//!   or 10 (tried in that order, the common case first) and keeps that choice
//!   for the whole file: a header is per netdev, so it cannot change mid-file.
//!
//! Source lines (QEMU 7.x `net/dump.c`, the file the v8.0 patch "net: Strip
//! virtio-net header when dumping" changed): the structs at 43-62, the
//! header's fields at 117-123 (`net_dump_state_init`), the record write at
//! 64-96 (`dump_receive_iov`: `qemu_clock_get_us(QEMU_CLOCK_VIRTUAL)` at 77,
//! `caplen = min(size, pcap_caplen)` at 78, the buffer copied from offset 0 at
//! 87), the filter passing the iov whole at 156, `maxlen = 65536` at 224.
//!
//! # What this reader refuses
//! A file shorter than its header, a magic that is not pcap (pcapng included),
//! a major version other than 2, a link type other than Ethernet, a record that
//! claims more bytes than the limit (the file's snaplen and at most
//! [`MAX_RECORD_LEN`], libpcap's own maximum), and a record that claims more
//! captured bytes than the packet had. A record cut short at the end of the file
//! (QEMU killed mid-write) is reported as [`PcapError::TruncatedRecord`]: the
//! [`PcapReader`] iterator yields every whole record first, then that one error,
//! then ends, so the records before it remain usable.
//!
//! A record that is a well-formed pcap record but not a well-formed frame (a
//! garbage IPv4 header length, say) is a per-record error: [`Frames`] yields it
//! and carries on with the next record.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The magic QEMU writes, read in the file's own byte order (microseconds).
pub const PCAP_MAGIC_US: u32 = 0xa1b2_c3d4;
/// The nanosecond-resolution variant; read too, timestamps are cut to µs.
pub const PCAP_MAGIC_NS: u32 = 0xa1b2_3c4d;
/// Link type 1: Ethernet, the only one QEMU's dump writes.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Bytes in the file header.
pub const FILE_HEADER_LEN: usize = 24;
/// Bytes in a record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// libpcap's `MAXIMUM_SNAPLEN`: no sane record is larger.
pub const MAX_RECORD_LEN: u32 = 262_144;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// Errors reading a packet dump.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error("Could not read the packet dump.")]
    Io(#[source] io::Error),
    #[error(
        "The file ends after {got} bytes, inside the {FILE_HEADER_LEN}-byte pcap file header."
    )]
    TruncatedHeader { got: usize },
    #[error("The file does not start with a classic pcap magic number (found {found:#010x}); pcapng and other formats are not read.")]
    BadMagic { found: u32 },
    #[error("Pcap version {major}.{minor} is not supported: QEMU writes 2.4.")]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("Link type {linktype} is not Ethernet (1), the only one QEMU's filter-dump writes.")]
    UnsupportedLinkType { linktype: u32 },
    #[error("Record {index} at byte {offset} claims {incl_len} captured bytes, more than the limit of {limit}.")]
    RecordTooLarge {
        index: u64,
        offset: u64,
        incl_len: u32,
        limit: u32,
    },
    #[error("Record {index} at byte {offset} claims {incl_len} captured bytes of a packet of only {orig_len}.")]
    LengthMismatch {
        index: u64,
        offset: u64,
        incl_len: u32,
        orig_len: u32,
    },
    #[error("Record {index} at byte {offset} is cut short after {got} of its {need} bytes (the writer was stopped mid-record); the records before it are whole.")]
    TruncatedRecord {
        index: u64,
        offset: u64,
        got: usize,
        need: usize,
    },
    #[error(
        "Record {index} at byte {offset} has a microsecond field of {usec}, not below one second."
    )]
    BadTimestamp { index: u64, offset: u64, usec: u32 },
    #[error("Record {index} does not hold a well-formed frame.")]
    BadFrame {
        index: u64,
        #[source]
        source: Box<PcapError>,
    },
    #[error("The frame has {len} bytes, fewer than the {need} its headers need.")]
    ShortFrame { len: usize, need: usize },
    #[error("The IPv4 header says it is version {version}, not 4.")]
    NotIpv4 { version: u8 },
    #[error("The IPv4 header length of {ihl} words is below the minimum of 5.")]
    BadIpHeaderLength { ihl: u8 },
    #[error("The IPv4 total length of {total} bytes does not cover its {header}-byte header or exceeds the {available} bytes the packet had.")]
    BadIpTotalLength {
        total: u16,
        header: usize,
        available: usize,
    },
    #[error("The TCP data offset of {offset} words is outside 5..=15 or beyond the segment's {segment} bytes.")]
    BadTcpOffset { offset: u8, segment: usize },
    #[error("The UDP length of {len} bytes is below 8 or beyond the datagram's {datagram} bytes.")]
    BadUdpLength { len: u16, datagram: usize },
}

impl PcapError {
    /// Whether the file cannot be read on past this error (as opposed to one
    /// record holding a malformed frame).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, PcapError::BadFrame { .. })
    }
}

/// A MAC address; shown and parsed as `52:54:00:12:34:56`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A MAC address string that is not six colon-separated hex bytes.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a MAC address of six colon-separated hex bytes.")]
pub struct BadMac(pub String);

impl FromStr for MacAddr {
    type Err = BadMac;
    fn from_str(s: &str) -> Result<Self, BadMac> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(|| BadMac(s.to_owned()))?;
            if part.len() != 2 {
                return Err(BadMac(s.to_owned()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| BadMac(s.to_owned()))?;
        }
        if parts.next().is_some() {
            return Err(BadMac(s.to_owned()));
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// TCP flags byte (the low eight flag bits of the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;

    pub fn has(self, flag: u8) -> bool {
        self.0 & flag != 0
    }
}

/// The file header's facts that matter to a reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcapHeader {
    /// The file was written on a host of the other byte order.
    pub swapped: bool,
    /// Timestamps' fraction field is nanoseconds (converted to µs on read).
    pub nanos: bool,
    pub version_major: u16,
    pub version_minor: u16,
    pub snaplen: u32,
    pub linktype: u32,
}

/// Whether frames carry a virtio-net header before the Ethernet header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VnetHdr {
    /// Frames start with Ethernet (taps with `vnet_hdr=off`, or QEMU ≥ 8.0).
    #[default]
    Off,
    /// Every frame starts with a virtio-net header of this many bytes.
    Len(usize),
    /// Decide from the first decodable frame among 0, 12 and 10 bytes.
    Detect,
}

/// How to read a dump.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PcapOptions {
    pub vnet_hdr: VnetHdr,
    /// Refuse records with more captured bytes than this (and than snaplen).
    pub max_record_len: u32,
}

impl Default for PcapOptions {
    fn default() -> Self {
        PcapOptions {
            vnet_hdr: VnetHdr::Off,
            max_record_len: MAX_RECORD_LEN,
        }
    }
}

/// One pcap record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Index in the file, from 0.
    pub index: u64,
    /// Microseconds since the epoch, in the dump's clock.
    pub timestamp_us: u64,
    /// Length of the packet on the wire (≥ `data.len()`).
    pub orig_len: u32,
    pub data: Vec<u8>,
}

/// What one frame says about who talks to whom.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub timestamp_us: u64,
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    /// EtherType after at most one 802.1Q tag.
    pub ethertype: u16,
    pub ipv4: Option<Ipv4Info>,
}

/// The IPv4 part of a frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ipv4Info {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    /// False for the second and later fragments, which carry no transport header.
    pub first_fragment: bool,
    /// Present for a TCP first fragment.
    pub tcp_flags: Option<TcpFlags>,
    /// Transport payload bytes (TCP/UDP first fragments), else IP payload bytes.
    pub payload_len: u32,
    /// Source and destination ports (TCP/UDP first fragments).
    #[serde(default)]
    pub ports: Option<(u16, u16)>,
}

fn rd16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

impl Frame {
    /// Decodes one Ethernet frame; `wire_len` is the packet's length on the
    /// wire (a capture may hold fewer bytes than the IP header claims only if
    /// the packet itself was that long).
    pub fn parse(timestamp_us: u64, data: &[u8], wire_len: usize) -> Result<Frame, PcapError> {
        let short = |need: usize| PcapError::ShortFrame {
            len: data.len(),
            need,
        };
        if data.len() < 14 {
            return Err(short(14));
        }
        let mac = |at: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&data[at..at + 6]);
            MacAddr(m)
        };
        let (dst_mac, src_mac) = (mac(0), mac(6));
        let mut ethertype = rd16(data, 12);
        let mut l3 = 14;
        if ethertype == ETHERTYPE_VLAN {
            if data.len() < 18 {
                return Err(short(18));
            }
            ethertype = rd16(data, 16);
            l3 = 18;
        }
        let mut frame = Frame {
            timestamp_us,
            src_mac,
            dst_mac,
            ethertype,
            ipv4: None,
        };
        if ethertype == ETHERTYPE_IPV4 {
            frame.ipv4 = Some(parse_ipv4(
                &data[l3..],
                wire_len.max(data.len()).saturating_sub(l3),
                l3,
                data.len(),
            )?);
        }
        Ok(frame)
    }

    /// Transport (or IP) payload bytes; 0 for non-IPv4 frames.
    pub fn payload_len(&self) -> u32 {
        self.ipv4.as_ref().map_or(0, |ip| ip.payload_len)
    }
}

/// `ip` is the captured IP packet, `available` its length on the wire.
fn parse_ipv4(
    ip: &[u8],
    available: usize,
    l3: usize,
    frame_len: usize,
) -> Result<Ipv4Info, PcapError> {
    let short = |need: usize| PcapError::ShortFrame {
        len: frame_len,
        need: l3 + need,
    };
    if ip.len() < 20 {
        return Err(short(20));
    }
    let version = ip[0] >> 4;
    if version != 4 {
        return Err(PcapError::NotIpv4 { version });
    }
    let ihl = ip[0] & 0x0f;
    if ihl < 5 {
        return Err(PcapError::BadIpHeaderLength { ihl });
    }
    let header = usize::from(ihl) * 4;
    let total = rd16(ip, 2);
    if usize::from(total) < header || usize::from(total) > available {
        return Err(PcapError::BadIpTotalLength {
            total,
            header,
            available,
        });
    }
    let protocol = ip[9];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let frag_offset = rd16(ip, 6) & 0x1fff;
    let first_fragment = frag_offset == 0;
    let segment = usize::from(total) - header;
    let mut info = Ipv4Info {
        src,
        dst,
        protocol,
        first_fragment,
        tcp_flags: None,
        payload_len: segment as u32,
        ports: None,
    };
    if !first_fragment {
        return Ok(info);
    }
    match protocol {
        IPPROTO_TCP => {
            if ip.len() < header + 14 {
                return Err(short(header + 14));
            }
            let offset = ip[header + 12] >> 4;
            let tcp_header = usize::from(offset) * 4;
            if offset < 5 || tcp_header > segment {
                return Err(PcapError::BadTcpOffset { offset, segment });
            }
            info.tcp_flags = Some(TcpFlags(ip[header + 13]));
            info.payload_len = (segment - tcp_header) as u32;
            info.ports = Some((rd16(ip, header), rd16(ip, header + 2)));
        }
        IPPROTO_UDP => {
            if ip.len() < header + 6 {
                return Err(short(header + 6));
            }
            let len = rd16(ip, header + 4);
            if len < 8 || usize::from(len) > segment {
                return Err(PcapError::BadUdpLength {
                    len,
                    datagram: segment,
                });
            }
            info.payload_len = u32::from(len) - 8;
            info.ports = Some((rd16(ip, header), rd16(ip, header + 2)));
        }
        _ => {}
    }
    Ok(info)
}

/// Reads `buf.len()` bytes unless the input ends first; returns how many.
fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Streams the records of a pcap file: every whole record as `Ok`, then, if
/// the file is damaged, one `Err`, then nothing.
pub struct PcapReader<R> {
    input: R,
    header: PcapHeader,
    options: PcapOptions,
    index: u64,
    offset: u64,
    done: bool,
}

impl PcapReader<BufReader<File>> {
    /// Opens a dump file and reads its header.
    pub fn open(path: &Path, options: PcapOptions) -> Result<Self, PcapError> {
        let file = File::open(path).map_err(PcapError::Io)?;
        PcapReader::new(BufReader::new(file), options)
    }
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R, options: PcapOptions) -> Result<Self, PcapError> {
        let mut h = [0u8; FILE_HEADER_LEN];
        let got = read_full(&mut input, &mut h).map_err(PcapError::Io)?;
        if got < FILE_HEADER_LEN {
            return Err(PcapError::TruncatedHeader { got });
        }
        let le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let (little, nanos) = match (le, le.swap_bytes()) {
            (PCAP_MAGIC_US, _) => (true, false),
            (PCAP_MAGIC_NS, _) => (true, true),
            (_, PCAP_MAGIC_US) => (false, false),
            (_, PCAP_MAGIC_NS) => (false, true),
            _ => return Err(PcapError::BadMagic { found: le }),
        };
        let u16_at = |at: usize| {
            let b = [h[at], h[at + 1]];
            if little {
                u16::from_le_bytes(b)
            } else {
                u16::from_be_bytes(b)
            }
        };
        let u32_at = |at: usize| {
            let b = [h[at], h[at + 1], h[at + 2], h[at + 3]];
            if little {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let header = PcapHeader {
            swapped: little != cfg!(target_endian = "little"),
            nanos,
            version_major: u16_at(4),
            version_minor: u16_at(6),
            snaplen: u32_at(16),
            linktype: u32_at(20),
        };
        if header.version_major != 2 || header.version_minor > 4 {
            return Err(PcapError::UnsupportedVersion {
                major: header.version_major,
                minor: header.version_minor,
            });
        }
        if header.linktype != LINKTYPE_ETHERNET {
            return Err(PcapError::UnsupportedLinkType {
                linktype: header.linktype,
            });
        }
        Ok(PcapReader {
            input,
            header,
            options,
            index: 0,
            offset: FILE_HEADER_LEN as u64,
            done: false,
        })
    }

    pub fn header(&self) -> &PcapHeader {
        &self.header
    }

    /// The decoded frames of this file, under the reader's [`VnetHdr`] choice.
    pub fn frames(self) -> Frames<R> {
        let vnet = self.options.vnet_hdr;
        Frames {
            records: self,
            vnet_hdr: match vnet {
                VnetHdr::Off => Some(0),
                VnetHdr::Len(n) => Some(n),
                VnetHdr::Detect => None,
            },
        }
    }

    fn u32_field(&self, b: &[u8]) -> u32 {
        let b = [b[0], b[1], b[2], b[3]];
        if self.header.swapped == cfg!(target_endian = "little") {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    fn next_record(&mut self) -> Result<Option<Record>, PcapError> {
        let (index, offset) = (self.index, self.offset);
        let mut h = [0u8; RECORD_HEADER_LEN];
        let got = read_full(&mut self.input, &mut h).map_err(PcapError::Io)?;
        if got == 0 {
            return Ok(None);
        }
        if got < RECORD_HEADER_LEN {
            return Err(PcapError::TruncatedRecord {
                index,
                offset,
                got,
                need: RECORD_HEADER_LEN,
            });
        }
        let sec = self.u32_field(&h[0..4]);
        let frac = self.u32_field(&h[4..8]);
        let incl_len = self.u32_field(&h[8..12]);
        let orig_len = self.u32_field(&h[12..16]);
        let limit = self.options.max_record_len.min(self.header.snaplen.max(1));
        if incl_len > limit {
            return Err(PcapError::RecordTooLarge {
                index,
                offset,
                incl_len,
                limit,
            });
        }
        if incl_len > orig_len {
            return Err(PcapError::LengthMismatch {
                index,
                offset,
                incl_len,
                orig_len,
            });
        }
        let usec = if self.header.nanos { frac / 1000 } else { frac };
        if usec >= 1_000_000 {
            return Err(PcapError::BadTimestamp {
                index,
                offset,
                usec: frac,
            });
        }
        let mut data = vec![0u8; incl_len as usize];
        let got_data = read_full(&mut self.input, &mut data).map_err(PcapError::Io)?;
        if got_data < data.len() {
            return Err(PcapError::TruncatedRecord {
                index,
                offset,
                got: RECORD_HEADER_LEN + got_data,
                need: RECORD_HEADER_LEN + data.len(),
            });
        }
        self.index += 1;
        self.offset += (RECORD_HEADER_LEN + data.len()) as u64;
        Ok(Some(Record {
            index,
            timestamp_us: u64::from(sec) * 1_000_000 + u64::from(usec),
            orig_len,
            data,
        }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<Record, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Decoded frames of a dump. Yields `Err(PcapError::BadFrame)` for a record
/// that is not a well-formed frame and goes on; any other `Err` is the last
/// item (see [`PcapError::is_fatal`]).
pub struct Frames<R> {
    records: PcapReader<R>,
    /// `None` while detection has not decided yet.
    vnet_hdr: Option<usize>,
}

impl<R> Frames<R> {
    /// The virtio-net header length in use (`None`: not decided yet).
    pub fn vnet_hdr_len(&self) -> Option<usize> {
        self.vnet_hdr
    }
}

/// Whether `data` plausibly starts with an Ethernet header of a known kind.
fn plausible_ethernet(data: &[u8]) -> bool {
    if data.len() < 14 {
        return false;
    }
    match rd16(data, 12) {
        ETHERTYPE_IPV4 => data.len() > 14 && data[14] >> 4 == 4 && data[14] & 0x0f >= 5,
        ETHERTYPE_IPV6 => data.len() > 14 && data[14] >> 4 == 6,
        ETHERTYPE_ARP | ETHERTYPE_VLAN => true,
        _ => false,
    }
}

impl<R: Read> Iterator for Frames<R> {
    type Item = Result<Frame, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        let record = match self.records.next()? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let skip = match self.vnet_hdr {
            Some(n) => n,
            None => {
                let found = [0usize, 12, 10]
                    .into_iter()
                    .find(|&n| record.data.len() > n && plausible_ethernet(&record.data[n..]));
                self.vnet_hdr = found;
                found.unwrap_or(0)
            }
        };
        let index = record.index;
        let bad = |source| PcapError::BadFrame {
            index,
            source: Box::new(source),
        };
        if record.data.len() < skip {
            return Some(Err(bad(PcapError::ShortFrame {
                len: record.data.len(),
                need: skip,
            })));
        }
        let wire = (record.orig_len as usize).saturating_sub(skip);
        Some(Frame::parse(record.timestamp_us, &record.data[skip..], wire).map_err(bad))
    }
}

/// Writes a pcap file the way QEMU's `filter-dump` does (the header's fields as in
/// `net_dump_state_init`, native byte order, link type Ethernet), one record per
/// `(timestamp in µs, frame)`, every frame whole. The snaplen is QEMU's 65536, or
/// the largest frame if that is larger; a frame the reader would refuse (above
/// [`MAX_RECORD_LEN`]) is refused here too.
pub fn write_pcap<W: Write>(mut out: W, records: &[(u64, &[u8])]) -> io::Result<()> {
    let largest = records.iter().map(|(_, d)| d.len()).max().unwrap_or(0);
    if largest > MAX_RECORD_LEN as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a frame of {largest} bytes is larger than pcap's limit of {MAX_RECORD_LEN}"),
        ));
    }
    let snaplen = (largest as u32).max(65536);
    let mut h = Vec::with_capacity(FILE_HEADER_LEN);
    h.extend_from_slice(&PCAP_MAGIC_US.to_ne_bytes());
    h.extend_from_slice(&2u16.to_ne_bytes());
    h.extend_from_slice(&4u16.to_ne_bytes());
    h.extend_from_slice(&0u32.to_ne_bytes()); // thiszone
    h.extend_from_slice(&0u32.to_ne_bytes()); // sigfigs
    h.extend_from_slice(&snaplen.to_ne_bytes());
    h.extend_from_slice(&LINKTYPE_ETHERNET.to_ne_bytes());
    out.write_all(&h)?;
    for (ts, data) in records {
        let secs = u32::try_from(ts / 1_000_000).unwrap_or(u32::MAX);
        let len = data.len() as u32;
        let mut r = Vec::with_capacity(RECORD_HEADER_LEN + data.len());
        for v in [secs, (ts % 1_000_000) as u32, len, len] {
            r.extend_from_slice(&v.to_ne_bytes());
        }
        r.extend_from_slice(data);
        out.write_all(&r)?;
    }
    out.flush()
}

#[cfg(test)]
pub(crate) mod tests;
