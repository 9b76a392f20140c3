//! The vhost-user side: the device QEMU's `vhost-user-blk-pci` talks to. Each queue
//! has its own thread (the framework's), and requests of different queues run in
//! parallel: the backend holds no lock around a request, only the cache's own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{ByteValued, GuestAddressSpace};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::config::{features, BlkConfig};
use crate::guest_memory::{Bitmap, Mem};

/// The virtio feature bit by which QEMU turns dirty logging on for a migration.
const VHOST_F_LOG_ALL: u64 = 26;
use crate::request::Device;
use crate::timing::{Lap, Phase};

/// Entries per virtqueue the backend accepts.
pub const QUEUE_SIZE: usize = 256;

pub struct BlkBackend {
    dev: Arc<Device>,
    config: BlkConfig,
    event_idx: AtomicBool,
    exits: Vec<(std::sync::Mutex<Option<EventConsumer>>, EventNotifier)>,
    /// Per queue, when its thread last went back to the event loop after answering
    /// requests (nanoseconds since `epoch`; 0: not yet): the wait before the next one.
    idle_since: Vec<AtomicU64>,
    epoch: Instant,
}

impl BlkBackend {
    pub fn new(dev: Arc<Device>, queues: u16) -> std::io::Result<BlkBackend> {
        let config = BlkConfig::new(dev.disk.size(), queues);
        let exits = (0..queues)
            .map(|_| {
                let (c, n) = new_event_consumer_and_notifier(EventFlag::NONBLOCK)?;
                Ok((std::sync::Mutex::new(Some(c)), n))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(BlkBackend {
            dev,
            config,
            event_idx: AtomicBool::new(false),
            exits,
            idle_since: (0..queues).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        })
    }

    /// Answers every request waiting in queue `q`, timing each ([`crate::timing`]):
    /// every nanosecond from the wake to the return is charged to one request, the
    /// notification's to the last of a batch, the wait before the wake to the first.
    /// The page map's update of the batch's last request ([`Device::finish`]) comes
    /// after the signal.
    fn drain(&self, q: usize, vring: &VringRwLock<Mem>) -> std::io::Result<()> {
        let woke = Instant::now();
        let Some(mem) = self.dev.mem.read().expect("mem lock").clone() else {
            return Ok(());
        };
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let timing = &self.dev.timing;
        let since = self
            .idle_since
            .get(q)
            .map_or(0, |a| a.load(Ordering::Relaxed));
        let mut wait = (since > 0).then(|| {
            woke.saturating_duration_since(self.epoch + std::time::Duration::from_nanos(since))
        });
        // The request whose laps are still open: the next one's pop, or the batch's
        // notification, goes to it.
        let mut open: Option<Lap> = None;
        let mut lap = Lap::at(woke);
        let r = (|| loop {
            let mut any = false;
            loop {
                let next = vring
                    .get_mut()
                    .get_queue_mut()
                    .pop_descriptor_chain(mem.memory());
                let Some(chain) = next else { break };
                match open.take() {
                    // The request before, not the batch's last: this pop is its, as
                    // the empty pop is the last's, then its page map's update.
                    Some(mut done) => {
                        done.lap(Phase::Pop);
                        self.dev.finish(&mut done);
                        timing.add(&done);
                        lap = Lap::at(done.last().unwrap_or(woke));
                    }
                    None => lap.lap(Phase::Pop),
                }
                let head = chain.head_index();
                let len = self.dev.execute_timed(chain, &mut lap);
                if let Some(w) = wait.take() {
                    timing.wait(lap.class, w);
                }
                let r = vring
                    .add_used(head, len)
                    .map_err(|e| std::io::Error::other(format!("{e:?}")));
                lap.lap(Phase::Used);
                let at = lap.last().unwrap_or(woke);
                open = Some(std::mem::replace(&mut lap, Lap::at(at)));
                r?;
                any = true;
            }
            // The empty pop, the decision and the signal go to the batch's last request.
            let last = open.as_mut().unwrap_or(&mut lap);
            last.lap(Phase::Pop);
            if any {
                let notify = !event_idx
                    || vring
                        .needs_notification()
                        .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
                last.lap(Phase::Used);
                if notify {
                    vring.signal_used_queue()?;
                }
                last.lap(Phase::Signal);
            }
            // With event idx, re-enable notifications and look again: a request that
            // came meanwhile would otherwise wait for the next kick.
            let again = event_idx
                && vring
                    .enable_notification()
                    .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
            last.lap(Phase::Used);
            // The guest has its answer: now the page map's update.
            self.dev.finish(last);
            if !again {
                return Ok(());
            }
            let at = last.last().unwrap_or(woke);
            lap = Lap::at(at);
        })();
        if let Some(done) = open {
            timing.add(&done);
            let end = done.last().unwrap_or(woke);
            if let Some(a) = self.idle_since.get(q) {
                let ns = end.saturating_duration_since(self.epoch).as_nanos() as u64;
                a.store(ns.max(1), Ordering::Relaxed);
            }
        }
        r
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = Bitmap;
    type Vring = VringRwLock<Mem>;

    fn num_queues(&self) -> usize {
        self.config.num_queues as usize
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        features(self.dev.disk.readonly())
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | (1 << VHOST_F_LOG_ALL)
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::LOG_SHMFD
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let b = self.config.as_slice();
        let start = (offset as usize).min(b.len());
        let end = start.saturating_add(size as usize).min(b.len());
        b[start..end].to_vec()
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> std::io::Result<()> {
        // The guest may toggle `wce`; writes go to the file before they complete
        // either way, and a flush makes them durable.
        Ok(())
    }

    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.dev.mem.write().expect("mem lock") = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.config.num_queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) = self.exits.get(thread_index)?;
        let consumer = c.lock().expect("exit lock").take()?;
        Some((consumer, n.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock<Mem>],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Err(std::io::Error::other(format!("unexpected event {evset:?}")));
        }
        match vrings.get(device_event as usize) {
            Some(v) => self.drain(device_event as usize, v),
            None => Err(std::io::Error::other(format!("no queue {device_event}"))),
        }
    }
}
