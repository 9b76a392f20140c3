//! Where the steady state's CPU goes, over the window before a reboot: CPU seconds of
//! QEMU (its vCPU threads apart from the rest), of Rebound's disk backends, of the
//! daemon and of this load generator, against what the host's CPUs did in all; with
//! what the backends and the eviction-notice forwarder did meanwhile. Under TCG on a
//! small host every CPU second another process burns is one the guest's vCPU may not
//! get, so the figures per MB served say where a variant's throughput goes.
//!
//! QEMU's threads carry no names here (no `debug-threads`): its busiest threads, as
//! many as the guest has vCPUs, are counted as the vCPU threads; under TCG they run
//! the guest all the time it runs, far above QEMU's main loop and workers.

use std::collections::BTreeMap;

use rebound_client::Client;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The processes whose CPU is counted.
#[derive(Debug, Clone, Default)]
pub struct Pids {
    pub qemu: u32,
    pub vcpus: usize,
    pub backends: Vec<u32>,
    /// The daemon (QEMU's parent).
    pub daemon: Option<u32>,
}

/// One thread: CPU ticks, and nanoseconds it waited on a run queue for a CPU
/// (`/proc/.../schedstat`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Thread {
    ticks: u64,
    wait_ns: u64,
}

/// CPU ticks of one process: in all (live and exited threads), and per live thread.
#[derive(Debug, Clone, Default, PartialEq)]
struct ProcTicks {
    total: u64,
    threads: BTreeMap<u32, Thread>,
}

/// What the backends and the forwarder had counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counts {
    hits: u64,
    misses: u64,
    read_bytes: u64,
    polls: u64,
    evicted: u64,
    forward_ms: f64,
}

/// One sample, at `t` seconds of the load.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub t: f64,
    host_busy: u64,
    qemu: ProcTicks,
    backends: u64,
    daemon: u64,
    me: u64,
    counts: Counts,
}

/// The window's figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Steady {
    pub window_s: f64,
    pub mb: f64,
    pub requests: u64,
    /// Mean seconds per request, from the closed-loop clients (Little's law:
    /// clients × window / requests), in ms.
    pub latency_ms: f64,
    pub host_cpus: usize,
    /// CPU seconds over the window: all the host's CPUs busy, QEMU's vCPU threads, its
    /// other threads, the disk backends, the daemon, this load generator, and the rest
    /// (other processes, interrupts).
    pub host_busy_s: f64,
    pub qemu_vcpu_s: f64,
    /// Seconds the vCPU threads were ready to run but waited for a CPU (another
    /// process had it); the rest of the window, neither running nor waiting, the guest
    /// was idle (halted: waiting for the network or a disk).
    #[serde(default)]
    pub qemu_vcpu_wait_s: f64,
    pub qemu_other_s: f64,
    pub backend_s: f64,
    pub daemon_s: f64,
    pub loadgen_s: f64,
    pub rest_s: f64,
    /// The backends' cache hits and misses (disk reads) and bytes read for the guest.
    pub blk_hits: u64,
    pub blk_misses: u64,
    pub blk_read_mb: f64,
    /// The eviction-notice forwarder: polls, notices read, and ms spent telling the
    /// backends (with their answers).
    pub evict_polls: u64,
    pub evicted: u64,
    pub evict_forward_ms: f64,
}

impl Steady {
    /// CPU ms per MB served.
    pub fn ms_per_mb(&self, cpu_s: f64) -> f64 {
        if self.mb > 0.0 {
            cpu_s * 1000.0 / self.mb
        } else {
            0.0
        }
    }
}

/// Clock ticks per second of `/proc` CPU times.
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime and the parent pid from a `/proc/.../stat` line (the command name in
/// parentheses may hold spaces and parentheses: fields count from the last `)`).
fn parse_stat(line: &str) -> Option<(u64, u32)> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = f.get(1)?.parse().ok()?;
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((ticks, ppid))
}

/// Busy ticks of all CPUs from `/proc/stat` (everything but idle and iowait).
fn parse_host(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let all: u64 = v.iter().take(8).sum();
    Some(all - v.get(3)? - v.get(4).copied().unwrap_or(0))
}

fn proc_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|l| parse_stat(&l))
        .map_or(0, |(t, _)| t)
}

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    let l = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&l).map(|(_, p)| p).filter(|&p| p > 1)
}

fn threads(pid: u32) -> ProcTicks {
    let mut threads = BTreeMap::new();
    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in d.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            if let Some((ticks, _)) = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|l| parse_stat(&l))
            {
                let wait_ns = std::fs::read_to_string(e.path().join("schedstat"))
                    .ok()
                    .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                    .unwrap_or(0);
                threads.insert(tid, Thread { ticks, wait_ns });
            }
        }
    }
    ProcTicks {
        total: proc_ticks(pid),
        threads,
    }
}

/// QEMU over the window: ticks of its `vcpus` busiest threads, the ns they waited for
/// a CPU, and the ticks of the rest.
fn split_qemu(a: &ProcTicks, b: &ProcTicks, vcpus: usize) -> (u64, u64, u64) {
    let mut d: Vec<Thread> = b
        .threads
        .iter()
        .map(|(tid, t)| {
            let was = a.threads.get(tid).copied().unwrap_or_default();
            Thread {
                ticks: t.ticks.saturating_sub(was.ticks),
                wait_ns: t.wait_ns.saturating_sub(was.wait_ns),
            }
        })
        .collect();
    d.sort_unstable_by_key(|t| std::cmp::Reverse(t.ticks));
    let top = &d[..vcpus.max(1).min(d.len())];
    let vcpu: u64 = top.iter().map(|t| t.ticks).sum();
    let wait: u64 = top.iter().map(|t| t.wait_ns).sum();
    let total = b.total.saturating_sub(a.total);
    (vcpu, wait, total.saturating_sub(vcpu))
}

/// What the backends (`GET /disks`) and the forwarder (`GET /evict`) have counted.
async fn counts(c: &Client, name: &str) -> Counts {
    let get = |p: String| async move {
        c.call::<Value>(hyper::Method::GET, &p, None)
            .await
            .unwrap_or(Value::Null)
    };
    let disks = get(format!("/v1/vms/{name}/disks")).await;
    let evict = get(format!("/v1/vms/{name}/evict")).await;
    let mut n = Counts::default();
    for d in disks.as_array().into_iter().flatten() {
        let cache = &d["stats"]["cache"];
        let u = |k: &str| cache[k].as_u64().unwrap_or(0);
        n.hits += u("hits");
        n.misses += u("misses");
        n.read_bytes += u("read_bytes");
    }
    n.polls = evict["polls"].as_u64().unwrap_or(0);
    n.evicted = evict["evicted"].as_u64().unwrap_or(0);
    n.forward_ms = evict["forward_ms"].as_f64().unwrap_or(0.0);
    n
}

/// Samples everything at `t` seconds of the load.
pub async fn sample(c: &Client, name: &str, pids: &Pids, t: f64) -> Sample {
    let counts = counts(c, name).await;
    Sample {
        t,
        host_busy: std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| parse_host(&s))
            .unwrap_or(0),
        qemu: threads(pids.qemu),
        backends: pids.backends.iter().map(|&p| proc_ticks(p)).sum(),
        daemon: pids.daemon.map_or(0, proc_ticks),
        me: proc_ticks(std::process::id()),
        counts,
    }
}

/// The window's figures from two samples, the MB and requests served between them,
/// and the clients of the load.
pub fn between(a: &Sample, b: &Sample, pids: &Pids, served: (f64, u64), conns: usize) -> Steady {
    let hz = ticks_per_s();
    let s = |t: u64| t as f64 / hz;
    let (vcpu, vcpu_wait_ns, other) = split_qemu(&a.qemu, &b.qemu, pids.vcpus);
    let window_s = b.t - a.t;
    let host_busy = b.host_busy.saturating_sub(a.host_busy);
    let backends = b.backends.saturating_sub(a.backends);
    let daemon = b.daemon.saturating_sub(a.daemon);
    let me = b.me.saturating_sub(a.me);
    let (x, y) = (a.counts, b.counts);
    Steady {
        window_s,
        mb: served.0,
        requests: served.1,
        latency_ms: if served.1 > 0 {
            conns as f64 * window_s * 1000.0 / served.1 as f64
        } else {
            0.0
        },
        host_cpus: crate::host::host_cpus(),
        host_busy_s: s(host_busy),
        qemu_vcpu_s: s(vcpu),
        qemu_vcpu_wait_s: vcpu_wait_ns as f64 / 1e9,
        qemu_other_s: s(other),
        backend_s: s(backends),
        daemon_s: s(daemon),
        loadgen_s: s(me),
        rest_s: s(host_busy.saturating_sub(vcpu + other + backends + daemon + me)),
        blk_hits: y.hits.saturating_sub(x.hits),
        blk_misses: y.misses.saturating_sub(x.misses),
        blk_read_mb: y.read_bytes.saturating_sub(x.read_bytes) as f64 / 1e6,
        evict_polls: y.polls.saturating_sub(x.polls),
        evicted: y.evicted.saturating_sub(x.evicted),
        evict_forward_ms: (y.forward_ms - x.forward_ms).max(0.0),
    }
}

/// MB and requests answered in [from, to) seconds of the load.
pub fn served(done: &[crate::webload::Done], from: f64, to: f64) -> (f64, u64) {
    done.iter()
        .filter(|d| d.ok && d.t >= from && d.t < to)
        .fold((0.0, 0), |(mb, n), d| (mb + d.bytes as f64 / 1e6, n + 1))
}

/// The rounds' windows summed into one (a variant's steady state over all its
/// reboots).
pub fn sum(all: &[Steady]) -> Steady {
    let mut t = Steady::default();
    for s in all {
        t.window_s += s.window_s;
        t.mb += s.mb;
        t.requests += s.requests;
        t.host_cpus = s.host_cpus;
        t.host_busy_s += s.host_busy_s;
        t.qemu_vcpu_s += s.qemu_vcpu_s;
        t.qemu_vcpu_wait_s += s.qemu_vcpu_wait_s;
        t.qemu_other_s += s.qemu_other_s;
        t.backend_s += s.backend_s;
        t.daemon_s += s.daemon_s;
        t.loadgen_s += s.loadgen_s;
        t.rest_s += s.rest_s;
        t.blk_hits += s.blk_hits;
        t.blk_misses += s.blk_misses;
        t.blk_read_mb += s.blk_read_mb;
        t.evict_polls += s.evict_polls;
        t.evicted += s.evicted;
        t.evict_forward_ms += s.evict_forward_ms;
    }
    // Little's law over the sum: the clients' mean time per request.
    let conns: f64 = all
        .iter()
        .map(|s| s.latency_ms * s.requests as f64 / (s.window_s * 1000.0).max(1e-9))
        .sum::<f64>()
        / all.len().max(1) as f64;
    t.latency_ms = if t.requests > 0 {
        conns * t.window_s * 1000.0 / t.requests as f64
    } else {
        0.0
    };
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        let l = "4242 (qemu (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 5 0 1 2 3";
        assert_eq!(parse_stat(l), Some((281, 17)));
        assert_eq!(parse_stat("garbage"), None);
        let host = "cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_host(host), Some(160));
    }

    #[test]
    fn the_busiest_threads_are_the_vcpus_and_exited_threads_count_as_other() {
        let t = |ticks, wait_ns| Thread { ticks, wait_ns };
        let a = ProcTicks {
            total: 1000,
            threads: [(1, t(100, 7)), (2, t(800, 1000)), (3, t(50, 0))].into(),
        };
        // Thread 3 exited with 20 more ticks; thread 4 is new.
        let b = ProcTicks {
            total: 1000 + 10 + 300 + 20 + 5,
            threads: [(1, t(110, 9)), (2, t(1100, 5000)), (4, t(5, 1))].into(),
        };
        assert_eq!(split_qemu(&a, &b, 1), (300, 4000, 35));
        assert_eq!(split_qemu(&a, &b, 2), (310, 4002, 25));
        assert_eq!(
            split_qemu(&a, &b, 9),
            (315, 4003, 20),
            "more vCPUs than threads"
        );
    }

    #[test]
    fn served_counts_answers_inside_the_window() {
        use crate::webload::Done;
        let d = |t, ok| Done {
            t,
            bytes: 200_000,
            ok,
        };
        let done = [
            d(0.5, true),
            d(1.0, true),
            d(1.5, false),
            d(2.9, true),
            d(3.0, true),
        ];
        assert_eq!(served(&done, 1.0, 3.0), (0.4, 2));
    }

    #[test]
    fn a_window_says_cpu_per_mb_and_the_rest_of_the_host() {
        let pids = Pids {
            qemu: 1,
            vcpus: 1,
            backends: vec![2],
            daemon: Some(3),
        };
        let hz = ticks_per_s() as u64;
        let at = |t: f64, k: u64| Sample {
            t,
            host_busy: k * 10 * hz,
            qemu: ProcTicks {
                total: k * 6 * hz,
                threads: [(
                    1,
                    Thread {
                        ticks: k * 5 * hz,
                        wait_ns: k * 250_000_000,
                    },
                )]
                .into(),
            },
            backends: k * 2 * hz,
            daemon: k * hz / 2,
            me: k * hz,
            counts: Counts {
                hits: k * 10,
                misses: k,
                read_bytes: k * 1_000_000,
                polls: k * 50,
                evicted: 0,
                forward_ms: k as f64 * 5.0,
            },
        };
        let s = between(&at(10.0, 1), &at(40.0, 2), &pids, (300.0, 1500), 4);
        assert_eq!(s.window_s, 30.0);
        assert_eq!((s.qemu_vcpu_s, s.qemu_other_s), (5.0, 1.0));
        assert_eq!(s.qemu_vcpu_wait_s, 0.25);
        assert_eq!((s.backend_s, s.daemon_s, s.loadgen_s), (2.0, 0.5, 1.0));
        assert_eq!(s.rest_s, 0.5);
        assert_eq!(s.latency_ms, 80.0);
        assert_eq!(s.ms_per_mb(s.backend_s), 2000.0 / 300.0);
        assert_eq!((s.blk_hits, s.blk_misses, s.evict_polls), (10, 1, 50));
        let two = sum(&[s.clone(), s.clone()]);
        assert_eq!((two.window_s, two.mb, two.requests), (60.0, 600.0, 3000));
        assert!((two.latency_ms - 80.0).abs() < 1e-9, "{}", two.latency_ms);
    }
}
