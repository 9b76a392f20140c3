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

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::pcap::{Frame, PcapOptions, PcapReader};
use crate::plan::DumpFile;
use crate::traffic::{Endpoints, TrafficError};

/// One frame in flight at the cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub receiver: String,
    pub sender: String,
    /// Its position in the receiver's `rx` dump.
    pub index: u64,
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
            *sent.entry(r.1).or_default() += 1;
        }
    }
    let mut out = Vec::new();
    for d in rx {
        for (index, data) in records(d, options)? {
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
                    data,
                }),
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Every whole record of a dump as (index, bytes); a truncated tail is left out.
fn records(d: &DumpFile, options: PcapOptions) -> Result<Vec<(u64, Vec<u8>)>, TrafficError> {
    let err = |source| TrafficError::Dump {
        vm: d.vm.clone(),
        source,
    };
    let reader = PcapReader::open(&d.path, options).map_err(err)?;
    let mut out = Vec::new();
    for r in reader {
        match r {
            Ok(r) => out.push((r.index, r.data)),
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
