//! Guest memory as the vhost-user connection maps it, with the dirty log QEMU's
//! migration reads (a snapshot's device-state save and a settle are migrations: without
//! `LOG_SHMFD` QEMU refuses them). A leaf: the backend maps it, the requests and the
//! eviction notices read it.

use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

pub type Bitmap = vhost_user_backend::bitmap::BitmapMmapRegion;
pub type Mem = GuestMemoryAtomic<GuestMemoryMmap<Bitmap>>;
