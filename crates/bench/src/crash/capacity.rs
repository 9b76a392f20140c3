//! The service's capacity: how many requests a second it answers to clients that
//! ask as fast as it answers. Measured before the crash and again while the dump
//! runs, once the recovery VM serves: a recovery VM starved of memory or disk can
//! answer one request (its downtime ends) and then crawl.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::probe;

/// Clients asking at once, each one request at a time.
pub(super) const CLIENTS: usize = 4;
/// How long a client waits after a refused or failed request before the next.
const BACKOFF: Duration = Duration::from_millis(20);
/// The shortest window a capacity is given for, seconds.
pub(super) const MIN_WINDOW_S: f64 = 1.0;
/// How long the capacity before the crash is measured.
pub(super) const BEFORE: Duration = Duration::from_secs(3);

/// Clients asking the service's `/` back to back; answers kept with their times.
pub(super) struct Load {
    t0: Instant,
    answers: Arc<Mutex<Vec<f64>>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Load {
    /// Starts [`CLIENTS`] clients on `port`; times are seconds since `t0`.
    pub(super) fn start(port: u16, t0: Instant) -> Load {
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        for _ in 0..CLIENTS {
            let (a, mut stopped) = (answers.clone(), stopped.clone());
            tokio::spawn(async move {
                loop {
                    let ok = tokio::select! {
                        r = tokio::time::timeout(Duration::from_secs(3), probe(port)) => matches!(r, Ok(true)),
                        _ = stopped.changed() => return,
                    };
                    if ok {
                        a.lock().unwrap().push(t0.elapsed().as_secs_f64());
                    } else {
                        tokio::time::sleep(BACKOFF).await;
                    }
                }
            });
        }
        Load { t0, answers, stop }
    }

    pub(super) fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Stops the clients; what they measured.
    pub(super) fn stop(self) -> Answers {
        let _ = self.stop.send(true);
        let mut v = self.answers.lock().unwrap().clone();
        v.sort_by(f64::total_cmp);
        Answers(v)
    }
}

/// The times of a load's answers, sorted.
pub(super) struct Answers(Vec<f64>);

impl Answers {
    /// Answers per second in `[from, to)`; `None` for an empty window.
    pub(super) fn rate(&self, from: f64, to: f64) -> Option<f64> {
        (to > from)
            .then(|| self.0.iter().filter(|&&t| t >= from && t < to).count() as f64 / (to - from))
    }
}

/// The capacity figures of one crash.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Capacity {
    /// Requests a second before the crash.
    pub before_rps: Option<f64>,
    /// Requests a second from the recovery VM's first answer until the dump ended
    /// (none when the dump ended first or less than a second after it).
    pub during_dump_rps: Option<f64>,
    /// Seconds of that window.
    pub window_s: Option<f64>,
}

impl Capacity {
    /// The capacity during the dump against the capacity before the crash.
    pub(super) fn ratio(&self) -> Option<f64> {
        match (self.during_dump_rps, self.before_rps) {
            (Some(d), Some(b)) if b > 0.0 => Some(d / b),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_count_answers_in_their_window_only() {
        let a = Answers(vec![0.5, 1.0, 1.5, 2.0, 2.5, 9.0]);
        assert_eq!(a.rate(1.0, 3.0), Some(2.0));
        assert_eq!(a.rate(3.0, 3.0), None);
        assert_eq!(a.rate(3.0, 8.0), Some(0.0));
        let c = Capacity {
            before_rps: Some(40.0),
            during_dump_rps: Some(10.0),
            window_s: Some(2.0),
        };
        assert_eq!(c.ratio(), Some(0.25));
        assert_eq!(Capacity::default().ratio(), None);
    }
}
