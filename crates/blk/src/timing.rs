//! Where a request's time goes inside the backend: nanoseconds per phase of the
//! request path, by class of request (a read served by the cache, a read that went to
//! the file, a write, anything else), and the time between two wakes of a queue's
//! thread, which the backend spends waiting for the guest.
//!
//! Always on. A request reads the monotonic clock once per phase boundary (about ten
//! times; [`TimingReport::clock_ns`] is the cost of one read, measured when the
//! backend starts, so a reader can subtract the instrumentation) and adds its laps to
//! shared counters once, when it is done. The phases partition the time from the
//! thread's wake to its return to the event loop, so their sum is the backend's busy
//! time per request; at queue depth 1 the wait before a request is everything else of
//! one request's round trip: the guest's own work, the kick and the completion
//! interrupt through QEMU, and the event loop's wake (epoll, reading the kick).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A phase of the request path, in the order a read goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Taking the descriptor chain off the available ring (and finding it empty).
    Pop,
    /// Draining the guest's eviction-notice ring before the request.
    Ring,
    /// Walking the chain: header, data and status buffers, checks.
    Parse,
    /// Cache lookups, copies out of the cache, admissions, write invalidations.
    Cache,
    /// The backing file: reads, writes, flushes, discards.
    Disk,
    /// Data between the backend's buffer and guest memory, and the status byte.
    Copy,
    /// The page map (which guest page holds which block), with its hash.
    Map,
    /// The used ring: `add_used`, the notification decision, re-enabling kicks.
    Used,
    /// The completion interrupt: the write to QEMU's call eventfd.
    Signal,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Pop,
        Phase::Ring,
        Phase::Parse,
        Phase::Cache,
        Phase::Disk,
        Phase::Copy,
        Phase::Map,
        Phase::Used,
        Phase::Signal,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Pop => "pop",
            Phase::Ring => "ring",
            Phase::Parse => "parse",
            Phase::Cache => "cache",
            Phase::Disk => "disk",
            Phase::Copy => "copy",
            Phase::Map => "map",
            Phase::Used => "used",
            Phase::Signal => "signal",
        }
    }
}

/// What kind of request the time was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A read every block of which the cache served.
    ReadHit,
    /// A read that read at least one block from the file.
    ReadMiss,
    Write,
    /// Flush, discard, write-zeroes, `GET_ID`, malformed requests.
    Other,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::ReadHit, Class::ReadMiss, Class::Write, Class::Other];

    pub fn name(self) -> &'static str {
        match self {
            Class::ReadHit => "read_hit",
            Class::ReadMiss => "read_miss",
            Class::Write => "write",
            Class::Other => "other",
        }
    }
}

/// A wait longer than this is not a request's round trip but the guest doing
/// something else (booting, between phases, idle): counted, not added.
pub const LONG_WAIT: Duration = Duration::from_millis(10);

/// One request's laps: each [`Lap::lap`] charges the time since the previous one to
/// a phase.
#[derive(Debug, Clone)]
pub struct Lap {
    /// `None`: the clock is not read (the instrumentation's own cost is measured
    /// against this).
    last: Option<Instant>,
    ns: [u64; Phase::ALL.len()],
    laps: u64,
    pub class: Class,
}

impl Lap {
    /// Laps from `at` on.
    pub fn at(at: Instant) -> Lap {
        Lap {
            last: Some(at),
            ns: [0; Phase::ALL.len()],
            laps: 0,
            class: Class::Other,
        }
    }

    pub fn start() -> Lap {
        Lap::at(Instant::now())
    }

    /// A lap that never reads the clock.
    pub fn off() -> Lap {
        Lap {
            last: None,
            ..Lap::at(Instant::now())
        }
    }

    /// Charges the time since the last lap to `p`.
    #[inline]
    pub fn lap(&mut self, p: Phase) {
        let Some(last) = self.last else { return };
        let now = Instant::now();
        self.ns[p as usize] += now.saturating_duration_since(last).as_nanos() as u64;
        self.last = Some(now);
        self.laps += 1;
    }

    /// When the last lap ended.
    pub fn last(&self) -> Option<Instant> {
        self.last
    }

    pub fn ns(&self, p: Phase) -> u64 {
        self.ns[p as usize]
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    laps: AtomicU64,
    ns: [AtomicU64; Phase::ALL.len()],
    waits: AtomicU64,
    wait_ns: AtomicU64,
    long_waits: AtomicU64,
}

/// The counters of one backend.
#[derive(Debug)]
pub struct Timing {
    classes: [Counters; Class::ALL.len()],
    clock_ns: f64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing::new()
    }
}

impl Timing {
    pub fn new() -> Timing {
        Timing {
            classes: Default::default(),
            clock_ns: clock_cost(),
        }
    }

    /// A request is done: its laps are added to its class.
    pub fn add(&self, lap: &Lap) {
        let c = &self.classes[lap.class as usize];
        c.requests.fetch_add(1, Relaxed);
        c.laps.fetch_add(lap.laps, Relaxed);
        for (n, &v) in c.ns.iter().zip(&lap.ns) {
            if v > 0 {
                n.fetch_add(v, Relaxed);
            }
        }
    }

    /// The queue's thread waited `d` before it found a request of class `class`.
    pub fn wait(&self, class: Class, d: Duration) {
        let c = &self.classes[class as usize];
        if d > LONG_WAIT {
            c.long_waits.fetch_add(1, Relaxed);
            return;
        }
        c.waits.fetch_add(1, Relaxed);
        c.wait_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    pub fn report(&self) -> TimingReport {
        let classes = Class::ALL
            .iter()
            .map(|&k| {
                let c = &self.classes[k as usize];
                let ns = Phase::ALL
                    .iter()
                    .map(|&p| (p.name().to_string(), c.ns[p as usize].load(Relaxed)))
                    .collect();
                let r = ClassReport {
                    requests: c.requests.load(Relaxed),
                    laps: c.laps.load(Relaxed),
                    ns,
                    waits: c.waits.load(Relaxed),
                    wait_ns: c.wait_ns.load(Relaxed),
                    long_waits: c.long_waits.load(Relaxed),
                };
                (k.name().to_string(), r)
            })
            .collect();
        TimingReport {
            clock_ns: self.clock_ns,
            classes,
        }
    }
}

/// What one read of the monotonic clock costs here, in nanoseconds (the median of a
/// few short loops, so a preemption in one does not count).
pub fn clock_cost() -> f64 {
    const N: u32 = 2000;
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t0 = Instant::now();
            let mut last = t0;
            for _ in 0..N {
                last = std::hint::black_box(Instant::now());
            }
            last.saturating_duration_since(t0).as_nanos() as f64 / N as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The backend's timing, as `stats` answers it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TimingReport {
    /// The cost of one clock read, in nanoseconds.
    pub clock_ns: f64,
    /// By class: `read_hit`, `read_miss`, `write`, `other`.
    pub classes: BTreeMap<String, ClassReport>,
}

/// The time of one class of requests since the backend started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClassReport {
    pub requests: u64,
    /// Clock reads, of all requests.
    pub laps: u64,
    /// Nanoseconds by phase (see [`Phase`]), of all requests.
    pub ns: BTreeMap<String, u64>,
    /// Waits of a queue's thread before a request of this class, of at most
    /// [`LONG_WAIT`], and their nanoseconds.
    pub waits: u64,
    pub wait_ns: u64,
    /// Waits longer than [`LONG_WAIT`] (not in `wait_ns`).
    pub long_waits: u64,
}

impl ClassReport {
    fn per(&self, ns: u64, n: u64) -> f64 {
        if n == 0 {
            return 0.0;
        }
        ns as f64 / n as f64 / 1000.0
    }

    /// Microseconds per request in phase `p`.
    pub fn phase_us(&self, p: Phase) -> f64 {
        self.per(self.ns.get(p.name()).copied().unwrap_or(0), self.requests)
    }

    /// Microseconds per request inside the backend (every phase).
    pub fn busy_us(&self) -> f64 {
        self.per(self.ns.values().sum(), self.requests)
    }

    /// Microseconds of the mean wait before a request (the time outside the backend).
    pub fn wait_us(&self) -> f64 {
        self.per(self.wait_ns, self.waits)
    }

    /// Microseconds per request that the clock reads themselves cost.
    pub fn clock_us(&self, clock_ns: f64) -> f64 {
        match self.requests {
            0 => 0.0,
            n => self.laps as f64 * clock_ns / n as f64 / 1000.0,
        }
    }

    /// One line: requests, busy time per request and its phases, the wait.
    pub fn line(&self, clock_ns: f64) -> String {
        let phases: Vec<String> = Phase::ALL
            .iter()
            .filter(|p| self.phase_us(**p) >= 0.005)
            .map(|&p| format!("{} {:.2}", p.name(), self.phase_us(p)))
            .collect();
        format!(
            "{} requests, {:.2} us each in the backend ({}; clock reads {:.2}), waits between requests {:.1} us ({} longer than {} ms left out)",
            self.requests,
            self.busy_us(),
            phases.join(", "),
            self.clock_us(clock_ns),
            self.wait_us(),
            self.long_waits,
            LONG_WAIT.as_millis()
        )
    }
}

/// One thread writes an eventfd that a second one waits on in epoll, which answers on
/// another eventfd: the two wakes and four syscalls of a request's kick and
/// completion, without a guest. Microseconds per round trip, the median of `rounds`
/// rounds of `n` round trips each.
pub fn notify_round_trip_us(n: u32, rounds: u32) -> std::io::Result<f64> {
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    use vmm_sys_util::eventfd::EventFd;
    let (kick, call) = (EventFd::new(0)?, EventFd::new(0)?);
    let (k2, c2) = (kick.try_clone()?, call.try_clone()?);
    let total = n.saturating_mul(rounds.max(1));
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let ep = Epoll::new()?;
        ep.ctl(
            ControlOperation::Add,
            std::os::fd::AsRawFd::as_raw_fd(&k2),
            EpollEvent::new(EventSet::IN, 0),
        )?;
        let mut ev = [EpollEvent::default(); 1];
        let mut seen = 0u64;
        while seen < total as u64 {
            if ep.wait(-1, &mut ev)? > 0 {
                seen += k2.read()?;
                c2.write(1)?;
            }
        }
        Ok(())
    });
    let mut v = Vec::new();
    for _ in 0..rounds.max(1) {
        let t0 = Instant::now();
        for _ in 0..n {
            kick.write(1)?;
            call.read()?;
        }
        v.push(t0.elapsed().as_nanos() as f64 / n.max(1) as f64 / 1000.0);
    }
    echo.join()
        .map_err(|_| std::io::Error::other("the echo thread panicked"))??;
    v.sort_by(f64::total_cmp);
    Ok(v[v.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_partition_the_time_and_land_in_their_class() {
        let t = Timing::new();
        let start = Instant::now();
        let mut lap = Lap::at(start);
        lap.lap(Phase::Pop);
        std::thread::sleep(Duration::from_millis(2));
        lap.lap(Phase::Disk);
        lap.lap(Phase::Signal);
        lap.class = Class::ReadMiss;
        let total = lap.last().unwrap() - start;
        t.add(&lap);
        t.wait(Class::ReadMiss, Duration::from_micros(150));
        t.wait(Class::ReadMiss, Duration::from_secs(1));
        let r = t.report();
        assert!(r.clock_ns > 0.0 && r.clock_ns < 100_000.0);
        let c = &r.classes["read_miss"];
        assert_eq!((c.requests, c.laps, c.waits, c.long_waits), (1, 3, 1, 1));
        assert_eq!(c.ns.values().sum::<u64>(), total.as_nanos() as u64);
        assert!(c.phase_us(Phase::Disk) >= 2000.0, "the sleep is the disk's");
        assert!(
            (c.wait_us() - 150.0).abs() < 1e-9,
            "the long wait is left out"
        );
        assert_eq!(r.classes["read_hit"].requests, 0);
        assert_eq!(r.classes["read_hit"].busy_us(), 0.0);
        assert!(c.line(r.clock_ns).starts_with("1 requests, "));
    }

    #[test]
    fn a_lap_that_is_off_reads_no_clock() {
        let mut lap = Lap::off();
        lap.lap(Phase::Cache);
        assert_eq!((lap.laps, lap.ns(Phase::Cache)), (0, 0));
    }

    #[test]
    fn the_report_survives_json() {
        let t = Timing::new();
        let mut lap = Lap::start();
        lap.lap(Phase::Copy);
        lap.class = Class::ReadHit;
        t.add(&lap);
        let r = t.report();
        let back: TimingReport = serde_json::from_value(serde_json::to_value(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn an_eventfd_round_trip_takes_two_wakes() {
        let us = notify_round_trip_us(200, 3).unwrap();
        assert!(us > 0.0 && us < 100_000.0, "{us} us");
    }
}
