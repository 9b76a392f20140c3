//! When a waiting reader busy-polls its socket instead of sleeping.
//!
//! A synchronous commit waits twice: the backup for the frame, the primary for the `Ack`.
//! A reader that sleeps pays the kernel's wake-up when the data comes (40–50 µs on an idle
//! virtual CPU here, about as long as the whole round trip when both sides poll); one that
//! busy-polls pays a CPU for as long as it waits. [`Spin::Adaptive`], the default, polls
//! only while it pays: on a machine with more than one CPU, and while the peer has been
//! answering within the limit (in at least half of the last 16 waits). A primary that
//! commits less often than the backup's limit, a backup slower than the primary's (a
//! remote host, `--durable`), or peers slowed by a busy machine make the waits miss, and
//! both sides go back to sleeping within 16 waits.

use std::time::{Duration, Instant};

use crate::endpoint::PollingReader;

/// How a reader waits for data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spin {
    /// Sleep at once.
    Off,
    /// Always busy-poll up to this long before sleeping.
    Fixed(Duration),
    /// Busy-poll up to `limit` while the peer has been answering within it; sleep
    /// otherwise. Costs at most `limit` of CPU per wait, and only while it saves wake-ups.
    Adaptive { limit: Duration },
}

impl Spin {
    /// A primary's default for acknowledgements: a backup on this host answers a
    /// synchronous commit in 15–90 µs; one that needs longer is not worth a CPU.
    pub const PRIMARY: Spin = Spin::Adaptive {
        limit: Duration::from_micros(100),
    };
    /// A backup's default for the next frame: covers a primary that commits every
    /// 500 µs or faster (2,000 transactions a second and up).
    pub const BACKUP: Spin = Spin::Adaptive {
        limit: Duration::from_micros(500),
    };

    /// The longest a reader may poll per wait (zero for `Off`).
    pub fn limit(self) -> Duration {
        match self {
            Spin::Off => Duration::ZERO,
            Spin::Fixed(d) | Spin::Adaptive { limit: d } => d,
        }
    }
}

/// How many of the last 16 waits must have ended within the limit to poll.
const HITS_TO_POLL: u32 = 8;

/// A reader's [`Spin`] and its record of recent waits.
#[derive(Debug, Clone)]
pub struct Spinner {
    spin: Spin,
    /// The last 16 waits, newest in bit 0: 1 when it ended within the limit.
    hits: u16,
    /// Polling on the only CPU would keep the peer from running.
    cpus: usize,
}

impl Spinner {
    pub fn new(spin: Spin) -> Spinner {
        Spinner {
            spin,
            hits: 0,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// Whether the next wait polls, and for how long.
    pub fn budget(&self) -> Duration {
        match self.spin {
            Spin::Off => Duration::ZERO,
            Spin::Fixed(d) => d,
            Spin::Adaptive { limit } => {
                if self.cpus > 1 && self.hits.count_ones() >= HITS_TO_POLL {
                    limit
                } else {
                    Duration::ZERO
                }
            }
        }
    }

    /// Starts a wait on `reader`: polls as the policy says. Pass the returned instant to
    /// [`waited`](Self::waited) once the data was read.
    pub fn wait(&self, reader: &mut PollingReader) -> Instant {
        let start = Instant::now();
        let budget = self.budget();
        if !budget.is_zero() {
            reader.poll_for(budget);
        }
        start
    }

    /// Records how long the wait that began at `start` took.
    pub fn waited(&mut self, start: Instant) {
        self.record(start.elapsed());
    }

    fn record(&mut self, took: Duration) {
        self.hits = (self.hits << 1) | u16::from(took <= self.spin.limit());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(cpus: usize) -> Spinner {
        Spinner {
            cpus,
            ..Spinner::new(Spin::Adaptive {
                limit: Duration::from_micros(100),
            })
        }
    }

    #[test]
    fn adaptive_polls_while_the_peer_answers_within_the_limit() {
        let mut s = adaptive(2);
        let fast = Duration::from_micros(30);
        let slow = Duration::from_millis(2);
        assert_eq!(s.budget(), Duration::ZERO, "no evidence yet: sleep");
        for _ in 0..7 {
            s.record(fast);
        }
        assert_eq!(s.budget(), Duration::ZERO, "7 of 16 fast");
        s.record(fast);
        assert_eq!(s.budget(), Duration::from_micros(100), "8 of 16 fast");
        for _ in 0..8 {
            s.record(slow);
        }
        assert_eq!(s.budget(), Duration::from_micros(100), "8 fast, 8 slow");
        s.record(slow);
        assert_eq!(s.budget(), Duration::ZERO, "the peer slowed down: sleep");
    }

    #[test]
    fn adaptive_never_polls_on_one_cpu_and_off_never_polls() {
        let mut one = adaptive(1);
        let mut off = Spinner::new(Spin::Off);
        for _ in 0..16 {
            one.record(Duration::ZERO);
            off.record(Duration::ZERO);
        }
        assert_eq!(one.budget(), Duration::ZERO);
        assert_eq!(off.budget(), Duration::ZERO);
        let fixed = Spinner::new(Spin::Fixed(Duration::from_micros(7)));
        assert_eq!(
            fixed.budget(),
            Duration::from_micros(7),
            "fixed polls from the start"
        );
    }
}
