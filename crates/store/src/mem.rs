//! [`MemStore`]: the cluster store in this process's memory, for a cluster whose
//! hosts all live on one machine (and for the protocol's tests).
//!
//! It keeps etcd v3's semantics where the protocol can notice them:
//! - one global revision; each transaction that changes something takes exactly
//!   one revision, however many keys it writes (a transaction whose only writes
//!   delete absent keys changes nothing and takes none, as in etcd);
//! - a key's `create_revision` is the revision that created it since it last did
//!   not exist, `mod_revision` the revision of its last write; a put with no lease
//!   detaches the key from its old lease;
//! - a transaction that writes the same key twice is refused, as etcd refuses it;
//! - watches deliver one batch per revision, in order, from a past revision too, as
//!   long as the history still holds it ([`MemStore::with_history`], 10,000
//!   revisions by default); an older start gets [`StoreError::Compacted`];
//! - a lease expires when its TTL passes with no renewal; its keys are deleted in one
//!   revision (none if it had no keys) and its `lost` flag turns true. The [`Lease`]
//!   handle's keeper renews every TTL/3; dropping the handle stops the renewal, so
//!   the lease expires within one TTL, which is what a dead process looks like;
//! - elections are [`crate::election`]'s, on this store's own keys and watches, as
//!   on etcd: a candidate's key is `<election>/<lease id in hex>`, attached to its
//!   lease; the leader is the candidate key with the lowest `create_revision`.
//!
//! Differences from etcd: TTLs are not rounded up to whole seconds and have no
//! minimum; expiry is exact (etcd checks every 500 ms); lease ids count up from 1;
//! watch events are never coalesced or fragmented; nothing is persisted.
//!
//! Handles: cloning a [`MemStore`] shares the store and its request counter;
//! [`MemStore::handle`] gives a handle on the same store with its own counter (one
//! per simulated host). Lease renewals are not counted as requests, in either
//! implementation: they are one stream per lease, not per operation.
//!
//! Faults that cannot happen for real in memory are faked by methods named
//! `fake_*`: [`MemStore::fake_expire_lease`] (a host whose renewals stopped long
//! enough) and [`MemStore::fake_cut_off`] (a host cut off from the store).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::{
    Compare, Event, KeyValue, Leadership, Lease, LeaseId, Op, Range, Revision, Store, StoreError,
    TxnOutcome, Watch,
};

/// Revisions of history kept for watches from the past, unless told otherwise.
pub const DEFAULT_HISTORY: usize = 10_000;
/// Batches a watch buffers before its reader takes them (more wait in the store).
const WATCH_BUFFER: usize = 64;

/// A handle on an in-memory cluster store; see the module documentation.
#[derive(Clone)]
pub struct MemStore {
    shared: Arc<Shared>,
    handle: Arc<HandleState>,
}

struct Shared {
    state: Mutex<State>,
    next_handle: AtomicU64,
}

/// What one handle owns: its request counter and whether it is (fakely) cut off.
struct HandleState {
    id: u64,
    requests: AtomicU64,
    cut: watch::Sender<bool>,
}

type Batch = Result<Vec<Event>, StoreError>;

struct Watcher {
    prefix: String,
    from: Revision,
    handle: u64,
    tx: mpsc::UnboundedSender<Batch>,
}

struct LeaseState {
    deadline: Instant,
    keys: BTreeSet<String>,
    lost: watch::Sender<bool>,
}

struct State {
    revision: Revision,
    kvs: BTreeMap<String, KeyValue>,
    /// Each revision's events, oldest first, at most `history_limit` of them.
    history: VecDeque<(Revision, Vec<Event>)>,
    history_limit: usize,
    /// The newest revision dropped from `history` (0: none).
    compacted: Revision,
    watchers: HashMap<u64, Watcher>,
    next_watcher: u64,
    leases: HashMap<LeaseId, LeaseState>,
    next_lease: LeaseId,
}

impl Default for MemStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemStore {
    /// An empty store at revision 0, keeping [`DEFAULT_HISTORY`] revisions.
    pub fn new() -> MemStore {
        Self::with_history(DEFAULT_HISTORY)
    }

    /// An empty store that keeps the last `revisions` revisions for watches.
    pub fn with_history(revisions: usize) -> MemStore {
        let state = State {
            revision: 0,
            kvs: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: revisions.max(1),
            compacted: 0,
            watchers: HashMap::new(),
            next_watcher: 0,
            leases: HashMap::new(),
            next_lease: 1,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            next_handle: AtomicU64::new(0),
        });
        let handle = HandleState::new(&shared);
        MemStore { shared, handle }
    }

    /// Another handle on the same store, with its own request counter (and its own
    /// [`MemStore::fake_cut_off`] switch).
    pub fn handle(&self) -> MemStore {
        MemStore {
            shared: self.shared.clone(),
            handle: HandleState::new(&self.shared),
        }
    }

    /// The store's current revision (not a request).
    pub fn revision(&self) -> Revision {
        self.state().revision
    }

    /// FAKE FAULT: expires lease `id` now, as the store would once its holder's
    /// renewals had stopped for a TTL (a host that died or lost its network).
    /// Its keys are deleted in one revision and its `lost` flag turns true.
    /// Returns whether the lease was still alive.
    pub fn fake_expire_lease(&self, id: LeaseId) -> bool {
        self.state().end_lease(id)
    }

    /// FAKE FAULT: cuts this handle off from the store (`true`) or reconnects it
    /// (`false`), as a host whose network is down. While cut off, its requests
    /// fail with [`StoreError::Unavailable`], its watches and campaigns end with
    /// that error, and the leases it granted are not renewed, so they expire after
    /// their TTL unless it reconnects first. Other handles (even clones of other
    /// handles) are unaffected; clones of this handle are cut off with it.
    pub fn fake_cut_off(&self, cut: bool) {
        self.handle.cut.send_replace(cut);
        if cut {
            let mut state = self.state();
            state.watchers.retain(|_, w| {
                if w.handle != self.handle.id {
                    return true;
                }
                let _ = w.tx.send(Err(cut_off()));
                false
            });
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Counts one request, and refuses it if this handle is cut off.
    fn request(&self) -> Result<(), StoreError> {
        self.handle.requests.fetch_add(1, Ordering::Relaxed);
        if *self.handle.cut.borrow() {
            return Err(cut_off());
        }
        Ok(())
    }

    /// Applies `ops` and wakes whoever waits for a new revision.
    fn write(&self, state: &mut State, ops: Vec<Op>) -> Result<(), StoreError> {
        state.write(ops)?;
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent map (every write is
        // checked before it starts), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl HandleState {
    fn new(shared: &Shared) -> Arc<HandleState> {
        Arc::new(HandleState {
            id: shared.next_handle.fetch_add(1, Ordering::Relaxed),
            requests: AtomicU64::new(0),
            cut: watch::channel(false).0,
        })
    }
}

fn cut_off() -> StoreError {
    StoreError::Unavailable("this handle is cut off from the in-memory store (fake fault)".into())
}

fn under<'a, 'p>(
    kvs: &'a BTreeMap<String, KeyValue>,
    prefix: &'p str,
) -> impl Iterator<Item = &'a KeyValue> + use<'a, 'p> {
    kvs.range(prefix.to_string()..)
        .take_while(move |(k, _)| k.starts_with(prefix))
        .map(|(_, kv)| kv)
}

impl State {
    fn holds(&self, compare: &Compare) -> bool {
        match compare {
            Compare::ModRevision(key, rev) => {
                self.kvs.get(key).map_or(0, |kv| kv.mod_revision) == *rev
            }
            Compare::Value(key, value) => self.kvs.get(key).is_some_and(|kv| kv.value == *value),
        }
    }

    /// Makes every write of `ops` at the next revision, or none of them.
    fn write(&mut self, ops: Vec<Op>) -> Result<(), StoreError> {
        let mut keys = HashSet::new();
        for op in &ops {
            let key = match op {
                Op::Put { key, lease, .. } => {
                    if let Some(id) = lease {
                        if !self.leases.contains_key(id) {
                            return Err(StoreError::LeaseGone(*id));
                        }
                    }
                    key
                }
                Op::Delete(key) => key,
            };
            if !keys.insert(key.as_str()) {
                return Err(StoreError::Other(format!(
                    "a transaction writes key {key} twice"
                )));
            }
        }
        let rev = self.revision + 1;
        let mut events = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                Op::Put { key, value, lease } => events.push(self.put(key, value, lease, rev)),
                Op::Delete(key) => events.extend(self.delete(&key, rev)),
            }
        }
        self.commit(rev, events);
        Ok(())
    }

    fn put(&mut self, key: String, value: Vec<u8>, lease: Option<LeaseId>, rev: Revision) -> Event {
        let lease = lease.unwrap_or(0);
        let old = self.kvs.get(&key).map(|kv| (kv.lease, kv.create_revision));
        let create_revision = match old {
            Some((old_lease, create_revision)) => {
                if old_lease != lease {
                    self.detach(old_lease, &key);
                }
                create_revision
            }
            None => rev,
        };
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.insert(key.clone());
        }
        let kv = KeyValue {
            key: key.clone(),
            value,
            create_revision,
            mod_revision: rev,
            lease,
        };
        self.kvs.insert(key, kv.clone());
        Event::Put(kv)
    }

    fn delete(&mut self, key: &str, rev: Revision) -> Option<Event> {
        let old = self.kvs.remove(key)?;
        self.detach(old.lease, key);
        Some(Event::Delete {
            key: old.key,
            mod_revision: rev,
        })
    }

    fn detach(&mut self, lease: LeaseId, key: &str) {
        if let Some(l) = self.leases.get_mut(&lease) {
            l.keys.remove(key);
        }
    }

    /// Records revision `rev`'s events (if any: no change takes no revision) and
    /// hands them to the watchers.
    fn commit(&mut self, rev: Revision, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        self.revision = rev;
        self.watchers.retain(|_, w| {
            if rev < w.from {
                return true;
            }
            let batch: Vec<Event> = events
                .iter()
                .filter(|e| e.key().starts_with(&w.prefix))
                .cloned()
                .collect();
            // A closed channel is a watch whose reader is gone.
            batch.is_empty() || w.tx.send(Ok(batch)).is_ok()
        });
        self.history.push_back((rev, events));
        while self.history.len() > self.history_limit {
            if let Some((old, _)) = self.history.pop_front() {
                self.compacted = old;
            }
        }
    }

    /// Ends lease `id`: deletes its keys in one revision and marks it lost.
    fn end_lease(&mut self, id: LeaseId) -> bool {
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        let rev = self.revision + 1;
        let events = lease
            .keys
            .iter()
            .filter_map(|key| self.delete(key, rev))
            .collect();
        self.commit(rev, events);
        lease.lost.send_replace(true);
        true
    }
}

/// Renews lease `id` every TTL/3 while its keeper lives and its handle is not cut
/// off, and expires it once a TTL passes with no renewal.
async fn keep_lease(
    shared: Weak<Shared>,
    handle: Arc<HandleState>,
    id: LeaseId,
    ttl: Duration,
    keeper: Weak<()>,
) {
    let renew_every = ttl / 3;
    let mut renewed = Instant::now();
    let renewing = || keeper.strong_count() > 0 && !*handle.cut.borrow();
    loop {
        let Some(deadline) = shared
            .upgrade()
            .and_then(|s| s.lock().leases.get(&id).map(|l| l.deadline))
        else {
            return;
        };
        let wake = if renewing() {
            deadline.min(renewed + renew_every)
        } else {
            deadline
        };
        tokio::time::sleep_until(wake).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut state = shared.lock();
        let now = Instant::now();
        let Some(lease) = state.leases.get_mut(&id) else {
            return;
        };
        if now >= lease.deadline {
            state.end_lease(id);
            return;
        }
        if renewing() && now >= renewed + renew_every {
            lease.deadline = now + ttl;
            renewed = now;
        }
    }
}

/// Moves a watch's batches from the store's unbounded queue to the bounded
/// channel the watcher reads, so a slow reader never blocks a writer.
async fn forward(mut from: mpsc::UnboundedReceiver<Batch>, to: mpsc::Sender<Batch>) {
    while let Some(batch) = from.recv().await {
        let end = batch.is_err();
        if to.send(batch).await.is_err() || end {
            return;
        }
    }
}

/// Cancels a watch in the store when dropped.
struct WatchGuard {
    shared: Weak<Shared>,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().watchers.remove(&self.id);
        }
    }
}

#[async_trait::async_trait]
impl Store for MemStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        self.request()?;
        Ok(self.state().kvs.get(key).cloned())
    }

    async fn range(&self, prefix: &str) -> Result<Range, StoreError> {
        self.request()?;
        let state = self.state();
        Ok(Range {
            kvs: under(&state.kvs, prefix).cloned().collect(),
            revision: state.revision,
        })
    }

    async fn txn(&self, when: Vec<Compare>, then: Vec<Op>) -> Result<TxnOutcome, StoreError> {
        self.request()?;
        let mut state = self.state();
        let succeeded = when.iter().all(|c| state.holds(c));
        if succeeded {
            self.write(&mut state, then)?;
        }
        Ok(TxnOutcome {
            succeeded,
            revision: state.revision,
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        self.request()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.state();
        // As in etcd, 0 (or less) means "from the next revision".
        let from = if from <= 0 { state.revision + 1 } else { from };
        if from <= state.compacted {
            return Err(StoreError::Compacted(from));
        }
        for (rev, events) in &state.history {
            if *rev < from {
                continue;
            }
            let batch: Vec<Event> = events
                .iter()
                .filter(|e| e.key().starts_with(prefix))
                .cloned()
                .collect();
            if !batch.is_empty() {
                let _ = tx.send(Ok(batch));
            }
        }
        let id = state.next_watcher;
        state.next_watcher += 1;
        state.watchers.insert(
            id,
            Watcher {
                prefix: prefix.to_string(),
                from,
                handle: self.handle.id,
                tx,
            },
        );
        drop(state);
        let (out, events) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(forward(rx, out));
        Ok(Watch {
            events,
            _guard: Box::new(WatchGuard {
                shared: Arc::downgrade(&self.shared),
                id,
            }),
        })
    }

    async fn lease(&self, ttl: Duration) -> Result<Lease, StoreError> {
        self.request()?;
        if ttl.is_zero() {
            return Err(StoreError::Other("a lease needs a TTL above zero".into()));
        }
        let (lost_tx, lost) = watch::channel(false);
        let id = {
            let mut state = self.state();
            let id = state.next_lease;
            state.next_lease += 1;
            state.leases.insert(
                id,
                LeaseState {
                    deadline: Instant::now() + ttl,
                    keys: BTreeSet::new(),
                    lost: lost_tx,
                },
            );
            id
        };
        let keeper = Arc::new(());
        tokio::spawn(keep_lease(
            Arc::downgrade(&self.shared),
            self.handle.clone(),
            id,
            ttl,
            Arc::downgrade(&keeper),
        ));
        Ok(Lease {
            id,
            ttl,
            lost,
            _keeper: Box::new(keeper),
        })
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.request()?;
        let mut state = self.state();
        if !state.end_lease(lease) {
            return Err(StoreError::LeaseGone(lease));
        }
        Ok(())
    }

    async fn campaign(
        &self,
        election: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Leadership, StoreError> {
        crate::election::campaign(self, election, lease, value).await
    }

    async fn leader(&self, election: &str) -> Result<Option<KeyValue>, StoreError> {
        crate::election::leader(self, election).await
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), StoreError> {
        crate::election::resign(self, leadership).await
    }

    fn requests(&self) -> u64 {
        self.handle.requests.load(Ordering::Relaxed)
    }
}
