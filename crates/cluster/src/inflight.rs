//! Frames in flight at a cluster's consistent cut: sent by one VM before its snapshot
//! point and received by another after its own.
//!
//! A coordinated snapshot pauses and saves every VM before any runs on, and starts
//! recording each bridge NIC's received (`rx`) and sent (`tx`) frames at that VM's
//! snapshot point. A frame a VM receives afterwards was either sent after its
//! sender's snapshot point (so it is in the sender's `tx` dump, byte for byte: a
//! bridge forwards Ethernet frames unchanged) or before it: then it was in flight at
//! the cut, and a restore loses it unless it is replayed (HotRestore section 5.1: the
//! receivers' logs of such packets give the restore dependency graph, and replaying
//! them keeps communication deterministic). Frames from outside the cluster (no
//! sender among its VMs) are never counted.
//!
//! [`write_replay`] writes the frames in flight to one VM into a pcap file, which a
//! restore of that VM held paused replays into it before it runs
//! (`RestoreRequest::replay`, [`crate::replay`]).

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::line_plan::DumpFile;
use crate::pcap::{Frame, PcapOptions, PcapReader};
use crate::traffic::{Endpoints, TrafficError};

/// One frame in flight at the cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub receiver: String,
    pub sender: String,
    /// Its position in the receiver's `rx` dump.
    pub index: u64,
    /// When the receiver's dump recorded it (µs, that dump's clock).
    #[serde(default)]
    pub timestamp_us: u64,
    /// The Ethernet frame.
    #[serde(with = "hex_bytes")]
    pub data: Vec<u8>,
}

/// The frames in flight: those in a receiver's `rx` dump, sent by another VM of the
/// cluster, that no VM's `tx` dump holds. A frame sent twice (a retransmission with
/// the same bytes) is matched as many times as it was sent.
pub fn in_flight(
    endpoints: &Endpoints,
    rx: &[DumpFile],
    tx: &[DumpFile],
    options: PcapOptions,
) -> Result<Vec<InFlight>, TrafficError> {
    let mut sent: HashMap<Vec<u8>, u64> = HashMap::new();
    for d in tx {
        for r in records(d, options)? {
            *sent.entry(r.data).or_default() += 1;
        }
    }
    let mut out = Vec::new();
    for d in rx {
        for crate::pcap::Record {
            index,
            timestamp_us,
            data,
            ..
        } in records(d, options)?
        {
            if let Some(n) = sent.get_mut(&data) {
                if *n > 0 {
                    *n -= 1;
                    continue;
                }
            }
            let Ok(frame) = Frame::parse(0, &data, data.len()) else {
                continue;
            };
            let (from, _) = endpoints.resolve(&frame);
            match from {
                Some(s) if s != d.vm => out.push(InFlight {
                    receiver: d.vm.clone(),
                    sender: s.to_string(),
                    index,
                    timestamp_us,
                    data,
                }),
                _ => {}
            }
        }
    }
    Ok(out)
}

/// The frames in flight to `receiver`, in the order its `rx` dump received them.
pub fn frames_to<'a>(in_flight: &'a [InFlight], receiver: &str) -> Vec<&'a InFlight> {
    let mut v: Vec<&InFlight> = in_flight
        .iter()
        .filter(|f| f.receiver == receiver)
        .collect();
    v.sort_by_key(|f| f.index);
    v
}

/// Writes the frames in flight to `receiver`, in their `rx` order with their
/// timestamps, to a pcap file at `path` (Ethernet, as QEMU's `filter-dump` writes):
/// what a restore of that VM replays into it. Returns how many it wrote; a VM that
/// nothing was in flight to gets a file of no records.
pub fn write_replay(in_flight: &[InFlight], receiver: &str, path: &Path) -> std::io::Result<u64> {
    let frames = frames_to(in_flight, receiver);
    let records: Vec<(u64, &[u8])> = frames
        .iter()
        .map(|f| (f.timestamp_us, f.data.as_slice()))
        .collect();
    let mut out = BufWriter::new(std::fs::File::create(path)?);
    crate::pcap::write_pcap(&mut out, &records)?;
    out.into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()?;
    Ok(records.len() as u64)
}

/// Every whole record of a dump; a truncated tail is left out.
fn records(d: &DumpFile, options: PcapOptions) -> Result<Vec<crate::pcap::Record>, TrafficError> {
    let err = |source| TrafficError::Dump {
        vm: d.vm.clone(),
        source,
    };
    let reader = PcapReader::open(&d.path, options).map_err(err)?;
    let mut out = Vec::new();
    for r in reader {
        match r {
            Ok(r) => out.push(r),
            // A dump whose QEMU was killed mid-write ends in a partial record.
            Err(crate::pcap::PcapError::TruncatedRecord { .. }) => break,
            Err(e) => return Err(err(e)),
        }
    }
    Ok(out)
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut h = String::with_capacity(b.len() * 2);
        for x in b {
            h.push_str(&format!("{x:02x}"));
        }
        s.serialize_str(&h)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let h = String::deserialize(d)?;
        if h.len() % 2 != 0 {
            return Err(serde::de::Error::custom("odd number of hex digits"));
        }
        (0..h.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(h.get(i..i + 2).unwrap_or("zz"), 16)
                    .map_err(|_| serde::de::Error::custom("not a hex digit"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::tests::{arp_frame, ip, udp_frame, DumpBuilder};

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "rebound-cluster-inflight-{tag}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn dump(dir: &Path, vm: &str, q: &str, b: &DumpBuilder) -> DumpFile {
        let path = dir.join(format!("{vm}-{q}.pcap"));
        std::fs::write(&path, &b.bytes).unwrap();
        DumpFile {
            vm: vm.into(),
            path,
        }
    }

    /// VMs a (host 1), b (2) and c (3): b received from a a frame a's dump never
    /// sent (in flight), one it did (not), and one from outside (never counted); c
    /// received one from a and one from b, both in flight.
    fn cluster(d: &Path) -> Vec<InFlight> {
        let mut ep = Endpoints::new();
        for (n, vm) in [(1, "a"), (2, "b"), (3, "c")] {
            ep.add_ipv4(ip(n), vm).unwrap();
        }
        let (early, late) = (udp_frame(1, 2, 10), udp_frame(1, 2, 11));
        let (to_c1, to_c2) = (udp_frame(2, 3, 12), udp_frame(1, 3, 13));
        let mut a_tx = DumpBuilder::new();
        a_tx.record(20, &late);
        let mut b_rx = DumpBuilder::new();
        b_rx.record(10, &early)
            .record(11, &arp_frame(9))
            .record(21, &late);
        let mut c_rx = DumpBuilder::new();
        c_rx.record(30, &to_c1).record(31, &to_c2);
        let empty = DumpBuilder::new();
        let rx = [
            dump(d, "a", "rx", &empty),
            dump(d, "b", "rx", &b_rx),
            dump(d, "c", "rx", &c_rx),
        ];
        let tx = [
            dump(d, "a", "tx", &a_tx),
            dump(d, "b", "tx", &empty),
            dump(d, "c", "tx", &empty),
        ];
        in_flight(&ep, &rx, &tx, PcapOptions::default()).unwrap()
    }

    #[test]
    fn frames_in_flight_are_received_but_never_sent_after_the_cut() {
        let d = dir("cut");
        let f = cluster(&d);
        std::fs::remove_dir_all(&d).unwrap();
        let who: Vec<_> = f
            .iter()
            .map(|f| (f.sender.as_str(), f.receiver.as_str(), f.index))
            .collect();
        assert_eq!(who, [("a", "b", 0), ("b", "c", 0), ("a", "c", 1)]);
        assert_eq!(f[0].data, udp_frame(1, 2, 10));
        assert_eq!(f[0].timestamp_us, 10);
    }

    #[test]
    fn one_vms_frames_in_flight_are_written_in_rx_order_and_read_back() {
        let d = dir("write");
        let mut f = cluster(&d);
        // Whatever order they come in, the file follows the receiver's rx dump.
        f.reverse();
        let path = d.join("c-replay.pcap");
        assert_eq!(write_replay(&f, "c", &path).unwrap(), 2);
        let back: Vec<_> = PcapReader::open(&path, PcapOptions::default())
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            back.iter().map(|r| &r.data).collect::<Vec<_>>(),
            [&udp_frame(2, 3, 12), &udp_frame(1, 3, 13)]
        );
        assert_eq!(
            back.iter().map(|r| r.timestamp_us).collect::<Vec<_>>(),
            [30, 31]
        );
        assert!(back.iter().all(|r| r.orig_len as usize == r.data.len()));
        // What a restore reads: the same frames.
        assert_eq!(
            crate::replay::read_frames(&path).unwrap(),
            [udp_frame(2, 3, 12), udp_frame(1, 3, 13)]
        );
        // Nothing in flight to a: a valid file of no records.
        assert_eq!(write_replay(&f, "a", &path).unwrap(), 0);
        assert_eq!(
            PcapReader::open(&path, PcapOptions::default())
                .unwrap()
                .count(),
            0
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
