//! Memory control groups: each QEMU of a VM runs in its own group under the VM's
//! group, so one limit on the VM's group holds whatever its QEMUs hold together (a
//! crashed VM's RAM file, charged to the group of the QEMU that touched it, and the
//! recovery VM that grows as that RAM is punched out).
//!
//! Both layouts are handled: cgroup v1 (a `memory` hierarchy of its own, as on our
//! build machines) and v2 (one unified hierarchy). Groups are made under the
//! daemon's own memory group, so whatever limit its supervisor set still binds; on
//! v2 a group that holds processes cannot enable controllers for children, so there
//! the groups go under the hierarchy's root when the daemon's own group is busy.
//!
//! Layout: `<base>/rebound/<state>/<vm>/<instance>`, where `<state>` names the
//! daemon's state directory (two daemons on one host may both have a VM `web`); the
//! limit is set on `<vm>`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Errors managing memory groups.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No memory controller is mounted.
    #[error("no memory cgroup controller is mounted (neither a v1 \"memory\" hierarchy nor a v2 one with \"memory\" available)")]
    NoController,
    /// A cgroup file cannot be read or written.
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A cgroup file holds something unexpected.
    #[error("{path} holds {text:?}, not a byte count")]
    Parse { path: PathBuf, text: String },
}

/// Which cgroup interface the memory controller speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "cgroup v1",
            Version::V2 => "cgroup v2",
        })
    }
}

/// Where Rebound's memory groups live on this host.
#[derive(Debug, Clone)]
pub struct MemoryCgroups {
    version: Version,
    /// `<base>/rebound`.
    top: PathBuf,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), CgroupError> {
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io("cannot write", path))
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let text = fs::read_to_string(path).map_err(io("cannot read", path))?;
    let t = text.trim();
    if t == "max" {
        return Ok(u64::MAX);
    }
    t.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        text: t.to_string(),
    })
}

/// Mount points of the memory controller, from `/proc/self/mountinfo`: a v1
/// hierarchy with `memory` among its options, else the v2 mount.
fn mounts(mountinfo: &str) -> (Option<PathBuf>, Option<PathBuf>) {
    let (mut v1, mut v2) = (None, None);
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let point = pre.split(' ').nth(4).map(PathBuf::from);
        let mut post = post.split(' ');
        let (fstype, opts) = (post.next(), post.nth(1).unwrap_or(""));
        match fstype {
            Some("cgroup") if opts.split(',').any(|o| o == "memory") => v1 = point,
            Some("cgroup2") => v2 = point,
            _ => {}
        }
    }
    (v1, v2)
}

/// The memory controller's interface and mount point on this host.
fn controller() -> Result<(Version, PathBuf), CgroupError> {
    let mi = Path::new("/proc/self/mountinfo");
    let mountinfo = fs::read_to_string(mi).map_err(io("cannot read", mi))?;
    match mounts(&mountinfo) {
        (Some(r), _) => Ok((Version::V1, r)),
        (None, Some(r))
            if fs::read_to_string(r.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory")) =>
        {
            Ok((Version::V2, r))
        }
        _ => Err(CgroupError::NoController),
    }
}

/// A stable group name for a state directory: `state-` and a hash of its path.
fn scope_name(home: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    // FNV-1a: stable across builds, unlike std's hasher.
    let h = home
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    format!("state-{h:016x}")
}

/// The daemon's own group in a hierarchy, from `/proc/self/cgroup`.
fn own_group(proc_cgroup: &str, version: Version) -> String {
    proc_cgroup
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            let hit = match version {
                Version::V1 => ctrl.split(',').any(|c| c == "memory"),
                Version::V2 => id == "0" && ctrl.is_empty(),
            };
            hit.then(|| path.to_string())
        })
        .unwrap_or_else(|| "/".into())
}

impl MemoryCgroups {
    /// Finds the memory controller and makes the top group of the daemon whose state
    /// is in `home` (needs root, or a delegated subtree).
    pub fn detect(home: &Path) -> Result<MemoryCgroups, CgroupError> {
        let pc = Path::new("/proc/self/cgroup");
        let proc_cgroup = fs::read_to_string(pc).map_err(io("cannot read", pc))?;
        let (version, root) = controller()?;
        let own = own_group(&proc_cgroup, version);
        let own = root.join(own.trim_start_matches('/'));
        let scope = scope_name(home);
        let at = |base: &Path| -> Result<MemoryCgroups, CgroupError> {
            let cg = MemoryCgroups {
                version,
                top: base.join("rebound").join(&scope),
            };
            cg.make(&base.join("rebound"))?;
            cg.make(&cg.top)?;
            Ok(cg)
        };
        match at(&own) {
            // The daemon's own v2 group holds processes, so it cannot hand the
            // memory controller down: use the hierarchy's root instead.
            Err(e) if version == Version::V2 && own != root => at(&root).map_err(|_| e),
            r => r,
        }
    }

    /// Removes the daemon's top group if no VM group is left in it.
    pub fn remove_if_empty(&self) {
        let _ = fs::remove_dir(&self.top);
    }

    /// For tests: groups under `top`, which must exist.
    pub fn at(version: Version, top: PathBuf) -> MemoryCgroups {
        MemoryCgroups { version, top }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// Creates `dir` (and, on v2, hands the memory controller down to it).
    fn make(&self, dir: &Path) -> Result<(), CgroupError> {
        if let Some(parent) = dir.parent() {
            if self.version == Version::V2 {
                let ctl = parent.join("cgroup.subtree_control");
                let on = fs::read_to_string(&ctl)
                    .is_ok_and(|c| c.split_whitespace().any(|w| w == "memory"));
                if !on {
                    write_file(&ctl, "+memory")?;
                }
            }
        }
        match fs::create_dir(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(io("cannot create", dir)(e))
            }
            _ => Ok(()),
        }
    }

    /// The VM's group (created if missing).
    pub fn vm(&self, vm: &str) -> Result<Group, CgroupError> {
        let dir = self.top.join(vm);
        self.make(&dir)?;
        Ok(Group {
            version: self.version,
            dir,
        })
    }

    /// A new group for one QEMU of the VM.
    pub fn instance(&self, vm: &str, instance: &str) -> Result<Group, CgroupError> {
        let dir = self.vm(vm)?.dir.join(instance);
        self.make(&dir)?;
        Ok(Group {
            version: self.version,
            dir,
        })
    }

    /// Removes the VM's instance groups that hold no process. Memory still charged
    /// to one (a crashed VM's RAM file) stays charged to the VM's group: charges
    /// count up the hierarchy from the moment they are made.
    pub fn prune(&self, vm: &str) {
        if let Ok(entries) = fs::read_dir(self.top.join(vm)) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    // Fails (EBUSY) while processes are in it: that group stays.
                    let _ = fs::remove_dir(e.path());
                }
            }
        }
    }

    /// Removes the VM's group and its empty instance groups; groups that still
    /// hold processes stay.
    pub fn remove_vm(&self, vm: &str) {
        self.prune(vm);
        let _ = fs::remove_dir(self.top.join(vm));
    }
}

/// One memory group.
#[derive(Debug, Clone)]
pub struct Group {
    version: Version,
    dir: PathBuf,
}

/// Memory charged to a group, by kind (from `memory.stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Charged {
    /// Anonymous memory of the group's processes.
    pub anon: u64,
    /// Shared memory and tmpfs pages (a guest's RAM file on /dev/shm).
    pub shmem: u64,
    /// Page cache of files on disks (shmem excluded): what reclaim drops first.
    pub file: u64,
}

impl Charged {
    /// Parses `memory.stat`: v1 counts shmem in `cache` and anon as `rss`; v2 counts
    /// shmem in `file`.
    fn parse(stat: &str, version: Version) -> Charged {
        let get = |key: &str| {
            stat.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == key).then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0u64)
        };
        let (anon, file) = match version {
            Version::V1 => (get("rss"), get("cache")),
            Version::V2 => (get("anon"), get("file")),
        };
        let shmem = get("shmem");
        Charged {
            anon,
            shmem,
            file: file.saturating_sub(shmem),
        }
    }
}

impl Group {
    /// The memory group process `pid` is in now: where what it charges from now on
    /// goes (charges it made in an earlier group stay there).
    pub fn of_process(pid: u32) -> Result<Group, CgroupError> {
        let (version, root) = controller()?;
        let p = PathBuf::from(format!("/proc/{pid}/cgroup"));
        let text = fs::read_to_string(&p).map_err(io("cannot read", &p))?;
        let own = own_group(&text, version);
        Ok(Group {
            version,
            dir: root.join(own.trim_start_matches('/')),
        })
    }

    /// Whether this is the hierarchy's root (which holds the whole host: never limit it).
    pub fn is_root(&self) -> bool {
        controller().is_ok_and(|(_, root)| root == self.dir)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// What is charged to the group now, by kind.
    pub fn charged(&self) -> Result<Charged, CgroupError> {
        let p = self.dir.join("memory.stat");
        let text = fs::read_to_string(&p).map_err(io("cannot read", &p))?;
        Ok(Charged::parse(&text, self.version))
    }

    fn file(&self, v1: &str, v2: &str) -> PathBuf {
        self.dir.join(match self.version {
            Version::V1 => v1,
            Version::V2 => v2,
        })
    }

    /// Sets (or with `None` lifts) the group's hard memory limit.
    pub fn set_limit(&self, bytes: Option<u64>) -> Result<(), CgroupError> {
        let text = match (bytes, self.version) {
            (Some(b), _) => b.to_string(),
            (None, Version::V1) => "-1".into(),
            (None, Version::V2) => "max".into(),
        };
        write_file(&self.file("memory.limit_in_bytes", "memory.max"), &text)
    }

    /// The hard limit (`u64::MAX`-ish when none).
    pub fn limit(&self) -> Result<u64, CgroupError> {
        read_u64(&self.file("memory.limit_in_bytes", "memory.max"))
    }

    /// Memory charged to the group now.
    pub fn usage(&self) -> Result<u64, CgroupError> {
        read_u64(&self.file("memory.usage_in_bytes", "memory.current"))
    }

    /// The most the group was charged since it was made (v2: kernel 5.19 or later).
    pub fn peak(&self) -> Result<u64, CgroupError> {
        read_u64(&self.file("memory.max_usage_in_bytes", "memory.peak"))
    }

    /// Starts the peak over from now (v1; v2's `memory.peak` counts from the group's
    /// creation on kernels before 6.12, so there a new group is the way to restart it).
    pub fn reset_peak(&self) -> Result<(), CgroupError> {
        match self.version {
            Version::V1 => write_file(&self.dir.join("memory.max_usage_in_bytes"), "0"),
            Version::V2 => Ok(()),
        }
    }

    /// Times the group hit its limit (v1 `failcnt`, v2 `max` events).
    pub fn limit_hits(&self) -> Result<u64, CgroupError> {
        match self.version {
            Version::V1 => read_u64(&self.dir.join("memory.failcnt")),
            Version::V2 => {
                let p = self.dir.join("memory.events");
                let text = fs::read_to_string(&p).map_err(io("cannot read", &p))?;
                Ok(text
                    .lines()
                    .find_map(|l| l.strip_prefix("max ")?.trim().parse().ok())
                    .unwrap_or(0))
            }
        }
    }

    /// The file a process writes "0" to in order to join the group; opened here so a
    /// forked child can join without allocating (see `process::spawn_qemu`).
    pub fn procs_file(&self) -> Result<fs::File, CgroupError> {
        let p = self.dir.join("cgroup.procs");
        fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(io("cannot open", &p))
    }

    /// Moves a running process into the group.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// Pids in the group.
    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
    const UNIFIED: &str =
        "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

    #[test]
    fn finds_the_memory_controller_in_both_layouts() {
        let (v1, v2) = mounts(HYBRID);
        assert_eq!(v1, Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let (v1, v2) = mounts(UNIFIED);
        assert_eq!(v1, None);
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup")));
    }

    #[test]
    fn finds_the_daemons_own_group() {
        let pc = "9:name=systemd:/\n4:memory:/ci/job7\n0::/system.slice/x.service\n";
        assert_eq!(own_group(pc, Version::V1), "/ci/job7");
        assert_eq!(own_group(pc, Version::V2), "/system.slice/x.service");
        assert_eq!(own_group("", Version::V2), "/");
    }

    #[test]
    fn charges_by_kind_keep_shmem_out_of_the_file_cache() {
        let v1 = "cache 700\nrss 50\nrss_huge 0\nshmem 600\nmapped_file 10\ntotal_cache 9999\n";
        let c = Charged::parse(v1, Version::V1);
        assert_eq!((c.anon, c.shmem, c.file), (50, 600, 100));
        let v2 = "anon 40\nfile 900\nkernel 7\nshmem 512\nfile_mapped 3\n";
        let c = Charged::parse(v2, Version::V2);
        assert_eq!((c.anon, c.shmem, c.file), (40, 512, 388));
        assert_eq!(Charged::parse("", Version::V2), Charged::default());
    }

    #[test]
    fn this_process_is_in_a_memory_group_under_the_mount() {
        // Skipped on hosts with no memory controller at all.
        let Ok((_, root)) = controller() else {
            return;
        };
        let g = Group::of_process(std::process::id()).unwrap();
        assert!(g.path().starts_with(&root), "{}", g.path().display());
        assert!(
            g.path().join("cgroup.procs").exists(),
            "{}",
            g.path().display()
        );
    }

    /// A v2 tree in a plain directory: no v2 memory controller is mounted on our build
    /// machines (it is bound to v1 there), so this stand-in checks which files the v2
    /// path writes; the v1 path is exercised for real by the crash tests.
    #[test]
    fn v2_hands_the_controller_down_and_writes_memory_max() {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("rebound");
        fs::create_dir(&top).unwrap();
        for d in [t.path(), &top] {
            fs::write(d.join("cgroup.subtree_control"), "").unwrap();
        }
        let cg = MemoryCgroups::at(Version::V2, top.clone());
        let vm = top.join("web");
        fs::create_dir(&vm).unwrap();
        fs::write(vm.join("cgroup.subtree_control"), "").unwrap();
        fs::write(vm.join("memory.max"), "max\n").unwrap();
        let g = cg.instance("web", "q1").unwrap();
        assert_eq!(g.path(), vm.join("q1"));
        assert_eq!(
            fs::read_to_string(top.join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        assert_eq!(
            fs::read_to_string(vm.join("cgroup.subtree_control")).unwrap(),
            "+memory"
        );
        let vg = cg.vm("web").unwrap();
        assert_eq!(vg.limit().unwrap(), u64::MAX);
        vg.set_limit(Some(5 << 20)).unwrap();
        assert_eq!(vg.limit().unwrap(), 5 << 20);
        vg.set_limit(None).unwrap();
        assert_eq!(fs::read_to_string(vm.join("memory.max")).unwrap(), "max");
    }
}
