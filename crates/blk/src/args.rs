//! The command line of `rebound blk serve`, shared by the test build's binary
//! (`rebound-blk-faulty`), which the daemon runs with the same arguments.

use std::path::PathBuf;

use crate::Options;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The raw disk image.
    #[arg(long)]
    pub disk: PathBuf,
    /// The vhost-user socket QEMU connects to.
    #[arg(long)]
    pub socket: PathBuf,
    /// A control socket for `rebound blk stats|record`.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Host cache size (e.g. 256M; 0: no cache).
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    pub cache: u64,
    /// Make the cache exclusive of the guest's memory: it admits only pages the guest
    /// evicted (notices on the control socket) that provably still equal their block.
    #[arg(long, requires = "control")]
    pub exclusive: bool,
    /// Virtqueues (one thread each).
    #[arg(long, default_value_t = 1)]
    pub queues: u16,
    /// The serial the guest sees.
    #[arg(long, default_value = "")]
    pub serial: String,
    #[arg(long)]
    pub readonly: bool,
    /// Use the host page cache for the backing file instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
}

impl From<ServeArgs> for Options {
    fn from(a: ServeArgs) -> Options {
        Options {
            disk: a.disk,
            socket: a.socket,
            control: a.control,
            readonly: a.readonly,
            direct: !a.buffered,
            cache_bytes: a.cache,
            exclusive: a.exclusive,
            queues: a.queues,
            serial: a.serial,
        }
    }
}

/// A size with an optional K/M/G suffix (powers of two; a bare number is bytes).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    rebound_api::spec::parse_size(s).map_err(|e| e.to_string())
}
