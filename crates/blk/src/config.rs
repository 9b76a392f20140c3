//! The virtio-blk configuration space the guest reads (virtio 1.2, 5.2.4), and the
//! features this backend offers.

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::ByteValued;

/// Bytes of a sector, the unit of every offset and length in a request.
pub const SECTOR: u64 = 512;
/// The largest data segment and number of segments one request may carry: what the
/// guest's queue limits are set from, and what a request larger than is refused.
pub const SIZE_MAX: u32 = 1 << 20;
pub const SEG_MAX: u32 = 126;
/// Discard and write-zeroes: sectors and segments per request.
pub const MAX_DISCARD_SECTORS: u32 = 1 << 16;
pub const MAX_DISCARD_SEG: u32 = 16;

/// The configuration space up to the write-zeroes fields (60 bytes, little endian on
/// every host this runs on), in the spec's layout.
#[repr(C, packed)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlkConfig {
    pub capacity: u64,
    pub size_max: u32,
    pub seg_max: u32,
    pub cylinders: u16,
    pub heads: u8,
    pub sectors: u8,
    pub blk_size: u32,
    pub physical_block_exp: u8,
    pub alignment_offset: u8,
    pub min_io_size: u16,
    pub opt_io_size: u32,
    pub wce: u8,
    pub unused: u8,
    pub num_queues: u16,
    pub max_discard_sectors: u32,
    pub max_discard_seg: u32,
    pub discard_sector_alignment: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_write_zeroes_seg: u32,
    pub write_zeroes_may_unmap: u8,
    pub unused1: [u8; 3],
}

const _: () = assert!(std::mem::size_of::<BlkConfig>() == 60);
const _: () = assert!(std::mem::offset_of!(BlkConfig, blk_size) == 20);
const _: () = assert!(std::mem::offset_of!(BlkConfig, num_queues) == 34);
const _: () = assert!(std::mem::offset_of!(BlkConfig, write_zeroes_may_unmap) == 56);

// SAFETY: plain integers in a packed repr(C) struct (no padding ; the size and
// offsets are asserted above), so every byte pattern is a valid value.
unsafe impl ByteValued for BlkConfig {}

impl BlkConfig {
    /// A disk of `bytes` (rounded down to whole sectors) served on `queues` queues,
    /// with a volatile write cache the guest must flush (`wce` = 1).
    pub fn new(bytes: u64, queues: u16) -> BlkConfig {
        BlkConfig {
            capacity: bytes / SECTOR,
            size_max: SIZE_MAX,
            seg_max: SEG_MAX,
            blk_size: SECTOR as u32,
            // 4 KiB physical blocks: the guest aligns its I/O to them, so whole cache
            // blocks come and go.
            physical_block_exp: 3,
            min_io_size: 8,
            opt_io_size: 0,
            wce: 1,
            num_queues: queues,
            max_discard_sectors: MAX_DISCARD_SECTORS,
            max_discard_seg: MAX_DISCARD_SEG,
            discard_sector_alignment: 8,
            max_write_zeroes_sectors: MAX_DISCARD_SECTORS,
            max_write_zeroes_seg: MAX_DISCARD_SEG,
            write_zeroes_may_unmap: 1,
            ..BlkConfig::default()
        }
    }
}

/// The virtio features offered (the vhost-user protocol bit is added by the caller).
pub fn features(readonly: bool) -> u64 {
    let mut f = (1u64 << VIRTIO_F_VERSION_1)
        | (1 << VIRTIO_RING_F_EVENT_IDX)
        | (1 << VIRTIO_RING_F_INDIRECT_DESC)
        | (1 << VIRTIO_BLK_F_SIZE_MAX)
        | (1 << VIRTIO_BLK_F_SEG_MAX)
        | (1 << VIRTIO_BLK_F_BLK_SIZE)
        | (1 << VIRTIO_BLK_F_TOPOLOGY)
        | (1 << VIRTIO_BLK_F_FLUSH)
        | (1 << VIRTIO_BLK_F_MQ);
    if readonly {
        f |= 1 << VIRTIO_BLK_F_RO;
    } else {
        f |= (1 << VIRTIO_BLK_F_DISCARD) | (1 << VIRTIO_BLK_F_WRITE_ZEROES);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capacity_is_in_sectors_and_little_endian() {
        let c = BlkConfig::new(64 << 20, 2);
        let b = c.as_slice();
        assert_eq!(&b[0..8], &((64u64 << 20) / 512).to_le_bytes());
        assert_eq!(&b[34..36], &2u16.to_le_bytes());
        assert_eq!(b[32], 1, "wce");
    }

    #[test]
    fn a_readonly_disk_offers_no_discard() {
        let f = features(true);
        assert_ne!(f & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(f & (1 << VIRTIO_BLK_F_DISCARD), 0);
    }
}
