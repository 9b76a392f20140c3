//! Frames to replay into a restored guest: a pcap file of whole Ethernet frames
//! (written by [`crate::inflight::write_replay`], or by hand), read back with the
//! limits QEMU's delivery path sets, and each frame framed for QEMU's
//! `filter-redirector`.
//!
//! A restore held paused hands each frame to a `filter-redirector` on the NIC's
//! netdev through a socket chardev; QEMU queues it for the guest, which receives it
//! when its vCPUs start (the daemon's `vm/replay.rs`). What QEMU 7.2 accepts there:
//!
//! - The wire format is `net_fill_rstate`'s (`net/net.c`), which the redirector's
//!   `redirector_chr_read` feeds (`net/filter-mirror.c`): a 4-byte big-endian length,
//!   then a 4-byte big-endian virtio-net header length only when the filter's
//!   `vnet_hdr_support` is on (off by default, and our taps have no virtio-net
//!   header), then the frame.
//! - A frame longer than the reassembly buffer (`NET_BUFSIZE`, 4096 + 65536 bytes)
//!   makes QEMU print "oversized packet received" and stop reading the socket.
//! - The frames wait in the NIC's incoming queue while the guest is paused
//!   (`qemu_can_send_packet` is false unless the VM runs), and that queue drops what
//!   comes beyond 10,000 packets when, as here, no completion callback is given
//!   (`qemu_net_queue_append_iov`, `nq_maxlen`).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use crate::pcap::{PcapError, PcapOptions, PcapReader, VnetHdr};

/// The most frames one NIC's replay may hold: QEMU's network queue keeps 10,000
/// packets for a paused guest and silently drops the rest.
pub const MAX_FRAMES: usize = 10_000;
/// The longest frame QEMU's redirector takes (`NET_BUFSIZE`).
pub const MAX_FRAME_LEN: u32 = 4096 + 65536;
/// An Ethernet header: the shortest frame worth delivering.
pub const MIN_FRAME_LEN: usize = 14;
/// The most bytes one NIC's replay may hold, frames together.
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;

/// Why a replay file cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot open it")]
    Open(#[source] std::io::Error),
    #[error("it is not a whole pcap file of Ethernet frames")]
    Pcap(#[source] PcapError),
    #[error("record {index} holds {len} bytes, fewer than an Ethernet header's {MIN_FRAME_LEN}")]
    ShortFrame { index: u64, len: usize },
    #[error("record {index} was captured cut short ({captured} of the frame's {len} bytes): only whole frames can be replayed")]
    CutShort {
        index: u64,
        captured: usize,
        len: u32,
    },
    #[error("it holds more than {MAX_FRAMES} frames, more than QEMU's network queue keeps for a paused guest")]
    TooManyFrames,
    #[error("its frames hold more than {MAX_TOTAL_BYTES} bytes")]
    TooLarge,
}

/// Reads a replay file: every frame, in file order.
pub fn read_frames(path: &Path) -> Result<Vec<Vec<u8>>, ReplayError> {
    let f = File::open(path).map_err(ReplayError::Open)?;
    frames_from(BufReader::new(f))
}

/// Reads the frames of a replay pcap: whole records only (a file cut short, a
/// record cut short by its snaplen or one QEMU would not take fails it all).
pub fn frames_from<R: Read>(input: R) -> Result<Vec<Vec<u8>>, ReplayError> {
    let options = PcapOptions {
        vnet_hdr: VnetHdr::Off,
        max_record_len: MAX_FRAME_LEN,
    };
    let reader = PcapReader::new(input, options).map_err(ReplayError::Pcap)?;
    let mut out = Vec::new();
    let mut total = 0u64;
    for r in reader {
        let r = r.map_err(ReplayError::Pcap)?;
        if r.data.len() < MIN_FRAME_LEN {
            return Err(ReplayError::ShortFrame {
                index: r.index,
                len: r.data.len(),
            });
        }
        if (r.data.len() as u64) < u64::from(r.orig_len) {
            return Err(ReplayError::CutShort {
                index: r.index,
                captured: r.data.len(),
                len: r.orig_len,
            });
        }
        if out.len() == MAX_FRAMES {
            return Err(ReplayError::TooManyFrames);
        }
        total += r.data.len() as u64;
        if total > MAX_TOTAL_BYTES {
            return Err(ReplayError::TooLarge);
        }
        out.push(r.data);
    }
    Ok(out)
}

/// One frame as `filter-redirector` (with `vnet_hdr_support` off) reads it from its
/// `indev`: its length, 4 bytes big-endian, then the frame.
pub fn redirector_record(frame: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + frame.len());
    b.extend_from_slice(&(frame.len() as u32).to_be_bytes());
    b.extend_from_slice(frame);
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::tests::{udp_frame, DumpBuilder};

    #[test]
    fn reads_whole_frames_in_order() {
        let (a, b) = (udp_frame(1, 2, 10), udp_frame(3, 2, 20));
        let mut d = DumpBuilder::new();
        d.record(5, &a).record(6, &b);
        assert_eq!(frames_from(&d.bytes[..]).unwrap(), vec![a, b]);
        // An empty file (a header only) replays nothing.
        assert!(frames_from(&DumpBuilder::new().bytes[..])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn refuses_what_cannot_be_replayed_whole() {
        let f = udp_frame(1, 2, 10);
        let err = |d: &DumpBuilder| frames_from(&d.bytes[..]).unwrap_err();
        // Cut short at the end of the file.
        let mut d = DumpBuilder::new();
        d.record(0, &f);
        d.bytes.truncate(d.bytes.len() - 3);
        assert!(matches!(
            err(&d),
            ReplayError::Pcap(PcapError::TruncatedRecord { .. })
        ));
        // Not pcap.
        let e = frames_from(&b"\x0a\x0d\x0d\x0a and more bytes of pcapng...."[..]).unwrap_err();
        assert!(matches!(e, ReplayError::Pcap(PcapError::BadMagic { .. })));
        // Captured cut short by the snaplen.
        let mut d = DumpBuilder::new();
        d.raw_record(0, 20, 60, &f[..20]);
        assert!(matches!(err(&d), ReplayError::CutShort { index: 0, .. }));
        // Not even an Ethernet header.
        let mut d = DumpBuilder::new();
        d.record(0, &f).record(1, &f[..10]);
        assert!(matches!(
            err(&d),
            ReplayError::ShortFrame { index: 1, len: 10 }
        ));
        // Longer than QEMU's redirector takes.
        let big = vec![0u8; MAX_FRAME_LEN as usize + 1];
        let mut d = DumpBuilder::with(false, crate::pcap::PCAP_MAGIC_US, 2, 4, 1 << 18, 1);
        d.record(0, &big);
        assert!(matches!(
            err(&d),
            ReplayError::Pcap(PcapError::RecordTooLarge { .. })
        ));
        // More frames than QEMU's queue keeps.
        let mut d = DumpBuilder::new();
        for i in 0..=MAX_FRAMES as u64 {
            d.record(i, &f);
        }
        assert!(matches!(err(&d), ReplayError::TooManyFrames));
    }

    #[test]
    fn redirector_records_are_length_then_frame() {
        let r = redirector_record(&[0xaa; 300]);
        assert_eq!(&r[..4], &[0, 0, 1, 44]);
        assert_eq!(r.len(), 304);
        assert!(r[4..].iter().all(|&b| b == 0xaa));
    }
}
