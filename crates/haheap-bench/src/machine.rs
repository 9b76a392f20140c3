//! The facts printed with every result: kernel, CPUs, page size, what the engines found.

use serde::Serialize;

/// Machine facts (no accelerator is involved in any of these measurements).
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub kernel: String,
    pub cpus: usize,
    pub page_size: usize,
    pub uffd_wp: String,
    pub scan: String,
    pub soft_dirty: bool,
    pub profile: &'static str,
    /// /proc/loadavg when probed: other work on this shared machine skews timings.
    pub loadavg: String,
}

impl Machine {
    pub fn probe() -> Machine {
        let caps = haheap::capabilities();
        let yes = |r: &Result<(), String>| match r {
            Ok(()) => "available".to_string(),
            Err(e) => format!("unavailable: {e}"),
        };
        Machine {
            kernel: caps.kernel.clone(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            // SAFETY: sysconf has no memory-safety preconditions.
            page_size: unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize,
            uffd_wp: yes(&caps.uffd_wp),
            scan: yes(&caps.scan),
            soft_dirty: caps.soft_dirty,
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|e| format!("unreadable: {e}")),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "machine: kernel {}, {} CPUs, page {} B, uffd-wp {}, async-wp+PAGEMAP_SCAN {}, soft-dirty {}, {} build, no accelerator, load average {}",
            self.kernel,
            self.cpus,
            self.page_size,
            self.uffd_wp,
            self.scan,
            if self.soft_dirty { "present" } else { "absent" },
            self.profile,
            self.loadavg
        )
    }
}
