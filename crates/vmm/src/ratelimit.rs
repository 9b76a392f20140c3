//! Rate-limited warnings for input a guest or a peer controls: a hostile or broken
//! guest must not be able to flood the daemon's log.

use std::time::{Duration, Instant};

/// Lets through at most `burst` messages per `window`; counts the rest and reports
/// the count with the next message let through.
#[derive(Debug)]
pub struct RateLimit {
    window: Duration,
    burst: u32,
    start: Option<Instant>,
    sent: u32,
    suppressed: u64,
}

impl RateLimit {
    pub const fn new(burst: u32, window: Duration) -> Self {
        RateLimit {
            window,
            burst,
            start: None,
            sent: 0,
            suppressed: 0,
        }
    }

    /// `Some(n)` when a message may go out now (`n` = how many were dropped since the
    /// last one), `None` when it must be dropped.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.start {
            Some(s) if now.duration_since(s) < self.window => {}
            _ => {
                self.start = Some(now);
                self.sent = 0;
            }
        }
        if self.sent < self.burst {
            self.sent += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_drops_then_reports() {
        let mut r = RateLimit::new(2, Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(r.admit(t), Some(0));
        assert_eq!(r.admit(t), Some(0));
        assert_eq!(r.admit(t), None);
        assert_eq!(r.admit(t + Duration::from_secs(1)), None);
        assert_eq!(r.admit(t + Duration::from_secs(11)), Some(2));
    }
}
