//! Metrics for operators, in the OpenMetrics text format Prometheus scrapes
//! (`GET /metrics` on the daemon's socket, and on `--metrics-addr` if asked).
//!
//! Counters only go up, from the owner tasks as things happen; VMs by state are
//! counted when scraped. Each capability adds its counters here.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use rebound_api::VmState;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// Every metric the daemon serves.
pub struct Metrics {
    registry: Registry,
    vms: Family<StateLabel, Gauge>,
    pub starts: Counter,
    pub start_failures: Counter,
    pub panics: Counter,
    pub watchdog_expiries: Counter,
    pub stops: Counter,
    pub kills: Counter,
    pub exits: Counter,
    pub reattaches: Counter,
    pub snapshots: Counter,
    pub restores: Counter,
    pub ready_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("rebound");
        let vms = Family::<StateLabel, Gauge>::default();
        registry.register("vms", "VMs the daemon knows, by state", vms.clone());
        let counter = |r: &mut Registry, name: &str, help: &str| {
            let c = Counter::default();
            r.register(name, help, c.clone());
            c
        };
        let starts = counter(&mut registry, "vm_starts", "VM starts that brought QEMU up");
        let start_failures = counter(
            &mut registry,
            "vm_start_failures",
            "VM starts refused or failed after the spec was accepted",
        );
        let panics = counter(
            &mut registry,
            "vm_panics",
            "Guest kernel panics (GUEST_PANICKED)",
        );
        let watchdog_expiries = counter(
            &mut registry,
            "vm_watchdog_expiries",
            "Guests whose watchdog expired (hung), paused by QEMU",
        );
        let stops = counter(&mut registry, "vm_stops", "VMs stopped on request");
        let kills = counter(&mut registry, "vm_kills", "VMs killed on request");
        let exits = counter(
            &mut registry,
            "vm_exits",
            "QEMUs that went away on their own",
        );
        let reattaches = counter(
            &mut registry,
            "vm_reattaches",
            "Running VMs a restarted daemon took back",
        );
        let snapshots = counter(
            &mut registry,
            "vm_snapshots",
            "Snapshots written (complete directories)",
        );
        let restores = counter(
            &mut registry,
            "vm_restores",
            "Restores whose guest was loaded (running or held ready)",
        );
        // 0.25 s .. 128 s: TCG boots take seconds, KVM boots well under one.
        let ready_seconds = Histogram::new(exponential_buckets(0.25, 2.0, 10));
        registry.register(
            "vm_ready_seconds",
            "Time from QEMU spawn to the VM's readiness condition",
            ready_seconds.clone(),
        );
        Metrics {
            registry,
            vms,
            starts,
            start_failures,
            panics,
            watchdog_expiries,
            stops,
            kills,
            exits,
            reattaches,
            snapshots,
            restores,
            ready_seconds,
        }
    }

    /// The text a scrape gets, with the VMs counted by state now.
    pub fn render(&self, states: impl IntoIterator<Item = VmState>) -> String {
        let mut counts = [0i64; VmState::ALL.len()];
        for s in states {
            if let Some(i) = VmState::ALL.iter().position(|x| *x == s) {
                counts[i] += 1;
            }
        }
        for (s, n) in VmState::ALL.iter().zip(counts) {
            self.vms
                .get_or_create(&StateLabel { state: s.as_str() })
                .set(n);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_states_and_the_histogram() {
        let m = Metrics::new();
        m.starts.inc();
        m.ready_seconds.observe(3.5);
        let t = m.render([VmState::Running, VmState::Running, VmState::Panicked]);
        assert!(t.contains("rebound_vm_starts_total 1\n"), "{t}");
        assert!(t.contains("rebound_vm_panics_total 0\n"), "{t}");
        assert!(t.contains("rebound_vms{state=\"running\"} 2\n"), "{t}");
        assert!(t.contains("rebound_vms{state=\"panicked\"} 1\n"), "{t}");
        assert!(t.contains("rebound_vms{state=\"stopped\"} 0\n"), "{t}");
        assert!(t.contains("rebound_vm_ready_seconds_count 1\n"), "{t}");
        assert!(t.ends_with("# EOF\n"));
    }
}
