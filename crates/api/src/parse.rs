//! The pieces every part of a VM spec is parsed with: the error that names the bad
//! input, sizes and VM names. A leaf: the spec and its parts (crash policy, disks,
//! NICs) all use it, and it uses none of them.

/// Errors in user-supplied VM settings.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("malformed size {0:?}: expected a number with an optional unit K, M, G or T (e.g. 256M, 1G, 512MiB)")]
    Size(String),
    #[error("size {0:?} is too large")]
    SizeOverflow(String),
    #[error("invalid VM name {0:?}: use 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit")]
    Name(String),
    #[error("memory {0} MiB is below the minimum of 16 MiB")]
    MemoryTooSmall(u64),
    #[error("memory must be a whole number of MiB, got {0} bytes")]
    MemoryNotMib(u64),
    #[error("cpus must be between 1 and 64, got {0}")]
    Cpus(u32),
    #[error("malformed forward {0:?}: expected HOSTPORT:GUESTPORT (host 0 picks a free port)")]
    Forward(String),
    #[error("malformed readiness {0:?}: expected agent, tcp:PORT, http:PORT/PATH or serial:REGEX")]
    Ready(String),
    #[error("invalid serial regex {0:?}: {1}")]
    ReadyRegex(String, String),
    #[error("give either --image or --kernel, not both")]
    ImageAndKernel,
    #[error("--initrd and --append need --kernel")]
    BootWithoutKernel,
    #[error("readiness 'agent' needs an image with the guest agent; a user kernel needs --ready tcp:|http:|serial:")]
    AgentWithoutImage,
    #[error("--workload needs an image with the guest agent")]
    WorkloadWithoutImage,
    #[error("unknown workload {0:?}: expected web, kv, memfill, counter, io, peer, flood or none")]
    Workload(String),
    #[error("unknown workload argument {0:?}: expected memfill, disk_io, counter_hz, port, watchdog_s, io, io_target, io_size, io_bs, io_direct, io_seconds, io_rounds, evict, evict_misbehave or peers, peer_port, peer_hb_ms, peer_dead_ms, peer_req_ms, peer_req_bytes")]
    WorkloadArg(String),
    #[error("{0}")]
    CrashPolicy(String),
    #[error("workload argument {0}={1:?} is malformed")]
    WorkloadArgValue(String, String),
    #[error("unknown disk backend {0:?}: expected qemu or rebound")]
    DiskBackend(String),
    #[error(
        "--disk-cache needs --disk-backend rebound (QEMU's own disks have no host cache of ours)"
    )]
    DiskCacheWithoutBackend,
    #[error("--disk-direct is for QEMU's own disks: the rebound backend opens its files with O_DIRECT already where the filesystem allows it")]
    DiskDirectWithBackend,
    #[error("malformed disk {0:?}: {1}")]
    Disk(String, String),
    #[error("malformed NIC {0:?}: {1}")]
    Nic(String, String),
    #[error("{0}")]
    Nics(String),
}

/// Parses a size such as `256M`, `1G`, `512MiB`, `4096K` or `1048576` (bytes) into bytes.
/// Units are binary (K = 1024).
pub fn parse_size(s: &str) -> Result<u64, SpecError> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits_end == 0 {
        return Err(SpecError::Size(s.to_string()));
    }
    let n: u64 = t[..digits_end]
        .parse()
        .map_err(|_| SpecError::SizeOverflow(s.to_string()))?;
    let shift = match t[digits_end..].to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(SpecError::Size(s.to_string())),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SpecError::SizeOverflow(s.to_string()))
}

/// The most the guest agent's `memfill` workload accepts.
pub const MEMFILL_MAX: u64 = 1 << 40;

/// Parses a `memfill` size with [`parse_size`] and the guest agent's limit of 1 TiB.
/// The guest is handed the result in bytes ([`VmSpec::guest_workload_args`]), so the
/// host's grammar is the only one that matters.
pub fn parse_memfill(s: &str) -> Result<u64, SpecError> {
    let n = parse_size(s)?;
    if n > MEMFILL_MAX {
        return Err(SpecError::SizeOverflow(s.to_string()));
    }
    Ok(n)
}

/// Parses a memory size; a bare number means MiB, as with QEMU's `-m`.
pub fn parse_memory_mib(s: &str) -> Result<u64, SpecError> {
    let t = s.trim();
    let bytes = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        parse_size(&format!("{t}M"))?
    } else {
        parse_size(t)?
    };
    if bytes % (1 << 20) != 0 {
        return Err(SpecError::MemoryNotMib(bytes));
    }
    let mib = bytes >> 20;
    if mib < 16 {
        return Err(SpecError::MemoryTooSmall(mib));
    }
    Ok(mib)
}

/// Checks a VM name against the API's pattern `^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`.
pub fn validate_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("100").unwrap(), 100);
        for bad in ["", "M", "12X", "1.5G", "-1G", "1 G x", "G1"] {
            assert_eq!(parse_size(bad), Err(SpecError::Size(bad.into())), "{bad}");
        }
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SpecError::SizeOverflow(_))
        ));
        assert!(matches!(
            parse_size("100000000T"),
            Err(SpecError::SizeOverflow(_))
        ));
    }

    #[test]
    fn memory() {
        assert_eq!(parse_memory_mib("256").unwrap(), 256);
        assert_eq!(parse_memory_mib("1G").unwrap(), 1024);
        assert_eq!(parse_memory_mib("8M"), Err(SpecError::MemoryTooSmall(8)));
        assert!(matches!(
            parse_memory_mib("1000K"),
            Err(SpecError::MemoryNotMib(_))
        ));
        assert!(parse_memory_mib("lots").is_err());
    }

    #[test]
    fn names() {
        for ok in ["a", "web-1", "A.b_c", &"x".repeat(63)] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "-a", ".a", "a/b", "a b", &"x".repeat(64), "é"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }
}
