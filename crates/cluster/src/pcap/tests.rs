//! Pcap tests, and builders of QEMU-shaped dumps that other modules' tests use.

use super::*;

/// Builds a pcap file the way QEMU's `net_dump_state_init`/`dump_receive_iov`
/// do: native header, then `(header, bytes)` per record.
pub(crate) struct DumpBuilder {
    pub big_endian: bool,
    pub bytes: Vec<u8>,
}

impl DumpBuilder {
    pub fn new() -> Self {
        Self::with(false, PCAP_MAGIC_US, 2, 4, 65536, LINKTYPE_ETHERNET)
    }

    pub fn with(big: bool, magic: u32, major: u16, minor: u16, snaplen: u32, link: u32) -> Self {
        let mut b = DumpBuilder {
            big_endian: big,
            bytes: Vec::new(),
        };
        b.u32(magic);
        b.u16(major);
        b.u16(minor);
        b.u32(0); // thiszone
        b.u32(0); // sigfigs
        b.u32(snaplen);
        b.u32(link);
        b
    }

    fn u16(&mut self, v: u16) {
        let bytes = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&bytes);
    }

    fn u32(&mut self, v: u32) {
        let bytes = if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.bytes.extend_from_slice(&bytes);
    }

    /// A record with explicit lengths (for malformed ones).
    pub fn raw_record(&mut self, ts_us: u64, incl: u32, orig: u32, data: &[u8]) -> &mut Self {
        self.u32((ts_us / 1_000_000) as u32);
        self.u32((ts_us % 1_000_000) as u32);
        self.u32(incl);
        self.u32(orig);
        self.bytes.extend_from_slice(data);
        self
    }

    pub fn record(&mut self, ts_us: u64, data: &[u8]) -> &mut Self {
        let n = data.len() as u32;
        self.raw_record(ts_us, n, n, data)
    }
}

pub(crate) fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0x00, 0x00, 0x00, last])
}

pub(crate) fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, last)
}

fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let total = (20 + l4.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(l4);
    p
}

fn ethernet(src: MacAddr, dst: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    // Ethernet pads to 60 bytes; the IP total length must win over it.
    while f.len() < 60 {
        f.push(0);
    }
    f
}

/// A TCP segment from host `s` to host `d` (MAC and IP end in that byte).
pub(crate) fn tcp_frame(s: u8, d: u8, flags: u8, payload: usize) -> Vec<u8> {
    tcp_frame_ports(s, d, (40000, 80), flags, payload)
}

/// A TCP segment from host `s` port `ports.0` to host `d` port `ports.1`.
pub(crate) fn tcp_frame_ports(
    s: u8,
    d: u8,
    ports: (u16, u16),
    flags: u8,
    payload: usize,
) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&ports.0.to_be_bytes());
    l4.extend_from_slice(&ports.1.to_be_bytes());
    l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff]);
    l4.extend_from_slice(&[0, 0, 0, 0]);
    l4.extend(std::iter::repeat_n(0xab, payload));
    ethernet(
        mac(s),
        mac(d),
        ETHERTYPE_IPV4,
        &ipv4_packet(ip(s), ip(d), IPPROTO_TCP, &l4),
    )
}

/// A UDP datagram from host `s` to host `d`.
pub(crate) fn udp_frame(s: u8, d: u8, payload: usize) -> Vec<u8> {
    let len = (8 + payload) as u16;
    let mut l4 = vec![0x30, 0x39, 0x00, 0x35];
    l4.extend_from_slice(&len.to_be_bytes());
    l4.extend_from_slice(&[0, 0]);
    l4.extend(std::iter::repeat_n(0xcd, payload));
    ethernet(
        mac(s),
        mac(d),
        ETHERTYPE_IPV4,
        &ipv4_packet(ip(s), ip(d), IPPROTO_UDP, &l4),
    )
}

pub(crate) fn arp_frame(s: u8) -> Vec<u8> {
    ethernet(mac(s), MacAddr([0xff; 6]), ETHERTYPE_ARP, &[0u8; 28])
}

fn read_all(bytes: &[u8], options: PcapOptions) -> Vec<Result<Frame, PcapError>> {
    PcapReader::new(bytes, options)
        .expect("header")
        .frames()
        .collect()
}

#[test]
fn reads_qemu_shaped_dump_in_both_byte_orders() {
    for big in [false, true] {
        let mut b = DumpBuilder::with(big, PCAP_MAGIC_US, 2, 4, 65536, LINKTYPE_ETHERNET);
        b.record(
            1_700_000_000_123_456,
            &tcp_frame(1, 2, TcpFlags::PSH | TcpFlags::ACK, 100),
        );
        b.record(1_700_000_001_000_001, &udp_frame(2, 1, 7));
        b.record(1_700_000_002_000_000, &arp_frame(3));
        let reader = PcapReader::new(&b.bytes[..], PcapOptions::default()).unwrap();
        assert_eq!(reader.header().snaplen, 65536);
        assert_eq!(
            reader.header().swapped,
            big == cfg!(target_endian = "little")
        );
        let frames: Vec<Frame> = reader.frames().map(|f| f.unwrap()).collect();
        assert_eq!(frames.len(), 3);

        let t = &frames[0];
        assert_eq!(t.timestamp_us, 1_700_000_000_123_456);
        assert_eq!((t.src_mac, t.dst_mac), (mac(1), mac(2)));
        assert_eq!(t.ethertype, ETHERTYPE_IPV4);
        let ip4 = t.ipv4.as_ref().unwrap();
        assert_eq!(
            (ip4.src, ip4.dst, ip4.protocol),
            (ip(1), ip(2), IPPROTO_TCP)
        );
        assert!(ip4.tcp_flags.unwrap().has(TcpFlags::PSH));
        assert_eq!(ip4.payload_len, 100);

        let u = frames[1].ipv4.as_ref().unwrap();
        assert_eq!(
            (u.protocol, u.payload_len, u.tcp_flags),
            (IPPROTO_UDP, 7, None)
        );
        assert_eq!(frames[2].ethertype, ETHERTYPE_ARP);
        assert!(frames[2].ipv4.is_none());
    }
}

#[test]
fn ethernet_padding_does_not_count_as_payload() {
    let mut b = DumpBuilder::new();
    b.record(5, &tcp_frame(1, 2, TcpFlags::ACK, 0));
    let f = read_all(&b.bytes, PcapOptions::default())
        .remove(0)
        .unwrap();
    assert_eq!(
        f.payload_len(),
        0,
        "a pure ACK padded to 60 bytes has no payload"
    );
}

#[test]
fn nanosecond_magic_is_read_as_microseconds() {
    let mut b = DumpBuilder::with(false, PCAP_MAGIC_NS, 2, 4, 65536, 1);
    b.raw_record(0, 60, 60, &udp_frame(1, 2, 4));
    // Patch the fraction field to 999_999_999 ns.
    b.bytes[FILE_HEADER_LEN + 4..FILE_HEADER_LEN + 8]
        .copy_from_slice(&999_999_999u32.to_le_bytes());
    let f = read_all(&b.bytes, PcapOptions::default())
        .remove(0)
        .unwrap();
    assert_eq!(f.timestamp_us, 999_999);
}

#[test]
fn truncated_header_is_refused() {
    let b = DumpBuilder::new();
    for cut in [0, 4, 23] {
        match PcapReader::new(&b.bytes[..cut], PcapOptions::default()) {
            Err(PcapError::TruncatedHeader { got }) => assert_eq!(got, cut),
            other => panic!("cut {cut}: {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn wrong_magic_is_refused_pcapng_included() {
    let mut b = DumpBuilder::new();
    b.bytes[0..4].copy_from_slice(&[0x0a, 0x0d, 0x0d, 0x0a]);
    let err = PcapReader::new(&b.bytes[..], PcapOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(err, PcapError::BadMagic { found: 0x0a0d_0d0a }),
        "{err}"
    );
    assert!(err.to_string().contains("0x0a0d0d0a"));
}

#[test]
fn wrong_version_is_refused() {
    for (major, minor) in [(1, 0), (3, 0), (2, 5)] {
        let b = DumpBuilder::with(false, PCAP_MAGIC_US, major, minor, 65536, 1);
        let err = PcapReader::new(&b.bytes[..], PcapOptions::default())
            .err()
            .unwrap();
        assert!(matches!(err, PcapError::UnsupportedVersion { .. }), "{err}");
    }
}

#[test]
fn wrong_link_type_is_refused() {
    // 113 is Linux cooked capture, what tcpdump -i any writes.
    let b = DumpBuilder::with(true, PCAP_MAGIC_US, 2, 4, 65536, 113);
    let err = PcapReader::new(&b.bytes[..], PcapOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(err, PcapError::UnsupportedLinkType { linktype: 113 }),
        "{err}"
    );
}

#[test]
fn oversized_incl_len_is_refused_without_allocating_it() {
    let mut b = DumpBuilder::new();
    b.record(1, &udp_frame(1, 2, 1));
    b.raw_record(2, u32::MAX, u32::MAX, &[]);
    let items: Vec<_> = PcapReader::new(&b.bytes[..], PcapOptions::default())
        .unwrap()
        .collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_ok());
    match &items[1] {
        Err(PcapError::RecordTooLarge {
            index: 1,
            incl_len,
            limit,
            ..
        }) => {
            assert_eq!((*incl_len, *limit), (u32::MAX, 65536));
        }
        other => panic!("{other:?}"),
    }

    // The snaplen binds too: a record larger than the file's snaplen is corrupt.
    let mut small = DumpBuilder::with(false, PCAP_MAGIC_US, 2, 4, 100, 1);
    small.raw_record(1, 101, 101, &[0; 101]);
    let err = PcapReader::new(&small.bytes[..], PcapOptions::default())
        .unwrap()
        .next()
        .unwrap();
    assert!(matches!(
        err,
        Err(PcapError::RecordTooLarge { limit: 100, .. })
    ));
}

#[test]
fn incl_len_above_orig_len_is_refused() {
    let mut b = DumpBuilder::new();
    b.raw_record(1, 60, 59, &[0; 60]);
    let err = PcapReader::new(&b.bytes[..], PcapOptions::default())
        .unwrap()
        .next()
        .unwrap();
    assert!(matches!(err, Err(PcapError::LengthMismatch { .. })));
}

#[test]
fn truncated_last_record_keeps_the_records_before_it() {
    let mut b = DumpBuilder::new();
    b.record(1, &tcp_frame(1, 2, TcpFlags::SYN, 0));
    b.record(2, &udp_frame(1, 2, 10));
    let whole = b.bytes.len();
    b.record(3, &udp_frame(1, 2, 500));
    // Cut inside the data of the third record, then inside its header.
    for cut in [b.bytes.len() - 10, whole + 7] {
        let items = read_all(&b.bytes[..cut], PcapOptions::default());
        assert_eq!(items.len(), 3, "two whole records, then one error");
        assert!(items[0].is_ok() && items[1].is_ok());
        let err = items[2].as_ref().unwrap_err();
        assert!(err.is_fatal());
        match err {
            PcapError::TruncatedRecord {
                index: 2,
                offset,
                got,
                need,
            } => {
                assert_eq!(*offset as usize, whole);
                assert_eq!(*got, cut - whole);
                assert!(got < need);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn garbage_ip_header_lengths_are_per_frame_errors() {
    let good = udp_frame(1, 2, 3);
    let mut ihl_small = good.clone();
    ihl_small[14] = 0x43; // IHL 3 words
    let mut total_small = good.clone();
    total_small[16..18].copy_from_slice(&10u16.to_be_bytes()); // below the 20-byte header
    let mut total_big = good.clone();
    total_big[16..18].copy_from_slice(&60_000u16.to_be_bytes());
    let mut ihl_big = good.clone();
    ihl_big[14] = 0x4f; // 60-byte header, beyond the 31-byte packet
    let mut tcp_off = tcp_frame(1, 2, TcpFlags::ACK, 0);
    tcp_off[14 + 20 + 12] = 0x20; // data offset 2 words
    let mut udp_len = good.clone();
    udp_len[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&4u16.to_be_bytes());

    let mut b = DumpBuilder::new();
    for f in [
        &ihl_small,
        &total_small,
        &total_big,
        &ihl_big,
        &tcp_off,
        &udp_len,
        &good,
    ] {
        b.record(1, f);
    }
    let items = read_all(&b.bytes, PcapOptions::default());
    assert_eq!(items.len(), 7, "bad frames do not end the file");
    let inner = |i: usize| match &items[i] {
        Err(PcapError::BadFrame { index, source }) => {
            assert_eq!(*index, i as u64);
            assert!(!items[i].as_ref().unwrap_err().is_fatal());
            source.as_ref()
        }
        other => panic!("frame {i}: {other:?}"),
    };
    assert!(matches!(inner(0), PcapError::BadIpHeaderLength { ihl: 3 }));
    assert!(matches!(
        inner(1),
        PcapError::BadIpTotalLength { total: 10, .. }
    ));
    assert!(matches!(
        inner(2),
        PcapError::BadIpTotalLength { total: 60_000, .. }
    ));
    assert!(matches!(
        inner(3),
        PcapError::BadIpTotalLength { header: 60, .. }
    ));
    assert!(matches!(
        inner(4),
        PcapError::BadTcpOffset { offset: 2, .. }
    ));
    assert!(matches!(inner(5), PcapError::BadUdpLength { len: 4, .. }));
    assert!(items[6].is_ok());
}

#[test]
fn runt_frames_are_per_frame_errors() {
    let mut b = DumpBuilder::new();
    b.record(1, &[0u8; 13]);
    let mut cut_ip = udp_frame(1, 2, 0);
    cut_ip.truncate(30);
    b.raw_record(2, 30, 60, &cut_ip);
    let items = read_all(&b.bytes, PcapOptions::default());
    for item in &items {
        match item {
            Err(PcapError::BadFrame { source, .. }) => {
                assert!(matches!(**source, PcapError::ShortFrame { .. }))
            }
            other => panic!("{other:?}"),
        }
    }
}

fn with_vnet_header(frame: &[u8], len: usize) -> Vec<u8> {
    // A non-GSO virtio_net_hdr: flags 0, gso_type NONE, the rest zero.
    let mut v = vec![0u8; len];
    v.extend_from_slice(frame);
    v
}

#[test]
fn virtio_net_header_given_or_detected() {
    for hdr in [10, 12] {
        let mut b = DumpBuilder::new();
        b.record(
            1,
            &with_vnet_header(&tcp_frame(1, 2, TcpFlags::SYN, 0), hdr),
        );
        b.record(2, &with_vnet_header(&udp_frame(2, 1, 9), hdr));

        // Read as plain Ethernet, the header is garbage: the MACs come out wrong.
        let off = read_all(&b.bytes, PcapOptions::default());
        assert!(off
            .iter()
            .all(|f| f.as_ref().map_or(true, |f| f.src_mac != mac(1))));

        let given = PcapOptions {
            vnet_hdr: VnetHdr::Len(hdr),
            ..Default::default()
        };
        let detect = PcapOptions {
            vnet_hdr: VnetHdr::Detect,
            ..Default::default()
        };
        for options in [given, detect] {
            let mut frames = PcapReader::new(&b.bytes[..], options).unwrap().frames();
            let f0 = frames.next().unwrap().unwrap();
            assert_eq!(frames.vnet_hdr_len(), Some(hdr));
            let f1 = frames.next().unwrap().unwrap();
            assert_eq!((f0.src_mac, f0.dst_mac), (mac(1), mac(2)));
            assert_eq!(f1.ipv4.unwrap().payload_len, 9);
        }
    }

    // Detection on a plain dump picks no header.
    let mut b = DumpBuilder::new();
    b.record(1, &arp_frame(1));
    let detect = PcapOptions {
        vnet_hdr: VnetHdr::Detect,
        ..Default::default()
    };
    let mut frames = PcapReader::new(&b.bytes[..], detect).unwrap().frames();
    assert_eq!(frames.next().unwrap().unwrap().src_mac, mac(1));
    assert_eq!(frames.vnet_hdr_len(), Some(0));
}

#[test]
fn mac_addresses_round_trip_as_text() {
    let m: MacAddr = "52:54:00:ab:CD:01".parse().unwrap();
    assert_eq!(m.0, [0x52, 0x54, 0x00, 0xab, 0xcd, 0x01]);
    assert_eq!(m.to_string(), "52:54:00:ab:cd:01");
    for bad in [
        "52:54:00:ab:cd",
        "52:54:00:ab:cd:01:02",
        "5254.00ab.cd01",
        "52:54:00:ab:cd:zz",
    ] {
        assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
    }
}

#[test]
fn reads_a_dump_file_from_disk() {
    let mut b = DumpBuilder::new();
    b.record(42, &udp_frame(1, 2, 1));
    let path =
        std::env::temp_dir().join(format!("rebound-cluster-pcap-{}.pcap", std::process::id()));
    std::fs::write(&path, &b.bytes).unwrap();
    let frames: Vec<_> = PcapReader::open(&path, PcapOptions::default())
        .unwrap()
        .frames()
        .collect();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].as_ref().unwrap().timestamp_us, 42);
    let missing = PcapReader::open(&path, PcapOptions::default())
        .err()
        .unwrap();
    assert!(matches!(missing, PcapError::Io(_)));
}
