//! The loops that carry the protocol out on a store: one [`Participant`] per
//! daemon. It registers the host under a lease, keeps a [`ClusterView`] current
//! from watches of the hosts, of the restores (plans, states, elections) and, per
//! restore it takes part in, of its own VMs' phases (every VM's while it
//! coordinates the restore), and for every restore whose plan names its host:
//! - does its host's part ([`host_side`]): loads, takes STARTs, starts VMs on
//!   their instants, reports restored, drops held VMs on an abort;
//! - campaigns to coordinate it; the elected participant runs the [`checker`]
//!   until the restore ends. Every write of a coordinator also compares its
//!   election key, so a coordinator that lost its lease (and so its leadership)
//!   cannot write any more. When it dies, its key goes with its lease and the next
//!   candidate carries on from the records.
//!
//! A participant whose lease is lost (its host was cut off for longer than the
//! TTL) registers again with a new lease, reads everything again and carries on;
//! the others will have seen it fail meanwhile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rebound_errors::chain;
use rebound_store::{Compare, Leadership, Lease, LeaseId, Op, Revision, Store, StoreError};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use crate::checker::{self, Action, Tunables};
use crate::host_side::{self, Busy, HostAction};
use crate::layout;
use crate::records::{
    encode, HostRecord, Phase, PhaseRecord, PlanRecord, Record, StateRecord, Status, FORMAT,
};
use crate::view::{CheckedPlan, ClusterView};
use crate::vms::CohortVms;
use rebound_store::{AbortOnDrop, Event, Watch};

/// How one daemon takes part.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// This host's name (checked with [`layout::check_host`]).
    pub host: String,
    /// The host lease's TTL: others declare this host failed this long after its
    /// last renewal. Default 5 s.
    pub ttl: Duration,
    pub tunables: Tunables,
    /// Rebound's version, published in the host record.
    pub version: String,
}

impl HostConfig {
    pub fn new(host: &str) -> HostConfig {
        HostConfig {
            host: host.to_string(),
            ttl: Duration::from_secs(5),
            tunables: Tunables::default(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Why a participant could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Name(#[from] layout::NameError),
    #[error("cannot register host {host} in the cluster store")]
    Register {
        host: String,
        #[source]
        source: StoreError,
    },
}

/// Transactions hold at most this many writes (etcd's default limit is 128).
const TXN_OPS: usize = 100;

pub fn unix_now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A running participant; dropping it stops it (its lease then expires).
pub struct Participant {
    shared: Arc<Shared>,
    main: AbortHandle,
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.main.abort();
        self.shared.stop_all();
    }
}

impl Participant {
    /// Registers the host (its first lease and record are in place when this
    /// returns) and starts taking part.
    pub async fn start(
        store: Arc<dyn Store>,
        config: HostConfig,
        vms: Arc<dyn CohortVms>,
    ) -> Result<Participant, RunError> {
        layout::check_host(&config.host)?;
        let shared = Arc::new(Shared {
            store,
            config,
            vms,
            view: Mutex::new(ClusterView::default()),
            changed: watch::channel(0).0,
            inner: Mutex::new(Inner::default()),
        });
        let lease = shared
            .register()
            .await
            .map_err(|source| RunError::Register {
                host: shared.config.host.clone(),
                source,
            })?;
        let s = shared.clone();
        let main = tokio::spawn(async move { s.main(lease).await }).abort_handle();
        Ok(Participant { shared, main })
    }

    pub fn host(&self) -> &str {
        &self.shared.config.host
    }
}

/// Which of a restore's phase records a participant follows: its own VMs', or
/// (while it coordinates the restore) every VM's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Own,
    All,
}

/// What every watch of one reading round sends: batches of changes, or the error
/// that ended a watch (then everything is read again).
type Feed = mpsc::UnboundedSender<Result<Vec<Event>, StoreError>>;

/// Passes one watch's batches on to the round's [`Feed`] until the returned guard
/// is dropped, which ends the watch.
fn forward(w: Watch, feed: &Feed) -> AbortOnDrop {
    let feed = feed.clone();
    let task = tokio::spawn(async move {
        // The whole watch moves in (its guard too: dropping that ends the watch).
        let mut w = w;
        loop {
            let b = w
                .events
                .recv()
                .await
                .unwrap_or_else(|| Err(StoreError::Other("a watch ended".into())));
            let end = b.is_err();
            if feed.send(b).is_err() || end {
                return;
            }
        }
    });
    AbortOnDrop(task.abort_handle())
}

#[derive(Default)]
struct Inner {
    lease: Option<LeaseId>,
    /// Restores whose election this participant won (it follows all their phases).
    coordinating: HashSet<String>,
    /// Per restore, the phases whose read is in the view and the watch that keeps
    /// them current (dropped, it ends).
    followed: HashMap<String, (Scope, AbortOnDrop)>,
    /// Ended restores in which this host's VMs are all settled: not followed.
    settled: HashSet<String>,
    /// Per restore, what this host is doing.
    busy: HashMap<String, Busy>,
    /// Per restore, the campaign (and then coordinator) task.
    campaigns: HashMap<String, AbortHandle>,
    /// Host tasks, stopped with the participant.
    tasks: Vec<AbortHandle>,
    /// Refused restores already logged.
    refusals: HashSet<String>,
}

struct Shared {
    store: Arc<dyn Store>,
    config: HostConfig,
    vms: Arc<dyn CohortVms>,
    view: Mutex<ClusterView>,
    /// Bumped on every change of the view or of `inner`.
    changed: watch::Sender<u64>,
    inner: Mutex<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn view(&self) -> MutexGuard<'_, ClusterView> {
        lock(&self.view)
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    fn stop_all(&self) {
        let handles: Vec<AbortHandle> = {
            let mut inner = self.inner();
            inner.busy.clear();
            // Ends the phase watches (the control watches end with their round).
            inner.followed.clear();
            let c = inner.campaigns.drain().map(|(_, h)| h).collect::<Vec<_>>();
            c.into_iter().chain(inner.tasks.drain(..)).collect()
        };
        // Aborted outside the lock: a task's guards take it as they drop.
        for h in handles {
            h.abort();
        }
    }

    /// A new lease and the host record on it.
    async fn register(&self) -> Result<Lease, StoreError> {
        let c = &self.config;
        let lease = self.store.lease(c.ttl).await?;
        let rec = HostRecord {
            format: FORMAT,
            host: c.host.clone(),
            version: c.version.clone(),
            joined_unix_ns: unix_now_ns(),
            ttl_s: c.ttl.as_secs_f64(),
        };
        self.store
            .put(&layout::host_info(&c.host), encode(&rec), Some(lease.id))
            .await?;
        self.inner().lease = Some(lease.id);
        info!(host = %c.host, lease = lease.id, ttl_s = c.ttl.as_secs_f64(), "joined the cluster store");
        Ok(lease)
    }

    async fn main(self: Arc<Self>, mut lease: Lease) {
        loop {
            self.follow(&lease).await;
            // The lease is lost: everything done under it is over.
            self.stop_all();
            warn!(host = %self.config.host, "lost this host's lease in the cluster store; joining again");
            lease = loop {
                match self.register().await {
                    Ok(l) => break l,
                    Err(e) => {
                        debug!("cannot join the cluster store yet: {}", chain(&e));
                        tokio::time::sleep(self.config.ttl / 5).await;
                    }
                }
            };
        }
    }

    /// Reads, watches and acts until the lease is lost.
    async fn follow(self: &Arc<Self>, lease: &Lease) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<()>();
        loop {
            // Every watch of this round feeds one channel; a new round (after a
            // watch ended) makes a new one, so nothing of an old watch comes late.
            let (feed, mut rx) = mpsc::unbounded_channel();
            let control = tokio::select! {
                r = self.read_control(&feed) => r,
                _ = lease.lost() => return,
            };
            let _control = match control {
                Ok(c) => c,
                Err(e) => {
                    debug!("cannot read the cluster store: {}", chain(&e));
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.ttl / 5) => continue,
                        _ = lease.lost() => return,
                    }
                }
            };
            self.bump();
            loop {
                let synced = tokio::select! {
                    r = self.follow_phases(&feed) => r,
                    _ = lease.lost() => return,
                };
                if let Err(e) = synced {
                    debug!(
                        "cannot read a restore's phases: {}; reading again",
                        chain(&e)
                    );
                    break;
                }
                self.act(&done_tx);
                tokio::select! {
                    b = rx.recv() => match b {
                        Some(Ok(events)) => {
                            {
                                let mut v = self.view();
                                for e in &events {
                                    v.apply(e);
                                }
                            }
                            self.bump();
                        }
                        Some(Err(e)) => {
                            debug!("a watch of the cluster store ended: {}; reading again", chain(&e));
                            break;
                        }
                        None => break,
                    },
                    _ = done_rx.recv() => {}
                    _ = lease.lost() => return,
                }
            }
            self.inner().followed.clear();
        }
    }

    /// Reads the hosts and the restores (plans, states, elections) into a new view
    /// and watches both; what the phase watches read comes after.
    async fn read_control(&self, feed: &Feed) -> Result<[AbortOnDrop; 2], StoreError> {
        let hosts = self.store.range(&layout::hosts()).await?;
        let restores = self.store.range(&layout::restores()).await?;
        let wh = self
            .store
            .watch(&layout::hosts(), hosts.revision + 1)
            .await?;
        let wr = self
            .store
            .watch(&layout::restores(), restores.revision + 1)
            .await?;
        let mut v = ClusterView::default();
        v.put_all(&hosts.kvs);
        v.put_all(&restores.kvs);
        v.revision = restores.revision;
        *self.view() = v;
        let mut inner = self.inner();
        inner.followed.clear();
        inner.settled.clear();
        Ok([forward(wh, feed), forward(wr, feed)])
    }

    /// The phases this participant needs now: its own VMs' in every restore that
    /// names its host, until the restore is restored or, ended otherwise, its VMs
    /// in it are settled; every VM's in the restores it coordinates.
    fn wanted_phases(&self) -> HashMap<String, Scope> {
        let me = &self.config.host;
        let view = self.view();
        let mut inner = self.inner();
        let mut want = HashMap::new();
        let mut settled = Vec::new();
        for (id, r) in &view.restores {
            if inner.coordinating.contains(id) {
                want.insert(id.clone(), Scope::All);
                continue;
            }
            let Some(plan) = r.plan() else { continue };
            if !plan.by_host.contains_key(me) {
                continue;
            }
            let status = r.state().map(|(s, _)| s.status);
            if status == Some(Status::Restored) {
                continue;
            }
            let is_settled = || {
                inner.followed.contains_key(id)
                    && inner
                        .busy
                        .get(id)
                        .is_none_or(|b| b.loading.is_empty() && b.running.is_empty())
                    && plan.vms_of(me).all(|p| {
                        r.phases
                            .get(&p.vm)
                            .is_none_or(|(ph, _)| ph.phase.is_final())
                    })
            };
            if status.is_some_and(Status::is_final) {
                if inner.settled.contains(id) {
                    continue;
                }
                if is_settled() {
                    settled.push(id.clone());
                    continue;
                }
            }
            want.insert(id.clone(), Scope::Own);
        }
        inner.settled.extend(settled);
        want
    }

    /// Opens the phase watches [`Shared::wanted_phases`] asks for (each read
    /// first) and ends those it no longer does.
    async fn follow_phases(&self, feed: &Feed) -> Result<(), StoreError> {
        let want = self.wanted_phases();
        self.inner()
            .followed
            .retain(|id, (scope, _)| want.get(id) == Some(scope));
        for (id, scope) in want {
            if self.inner().followed.contains_key(&id) {
                continue;
            }
            let prefix = match scope {
                Scope::Own => layout::host_phases(&id, &self.config.host),
                Scope::All => layout::phases(&id),
            };
            let r = self.store.range(&prefix).await?;
            let w = self.store.watch(&prefix, r.revision + 1).await?;
            {
                let mut v = self.view();
                v.put_all(&r.kvs);
                v.phases_read(&id, r.revision);
            }
            self.inner().followed.insert(id, (scope, forward(w, feed)));
            self.bump();
        }
        Ok(())
    }

    /// Looks at every restore this host takes part in and starts what is due.
    fn act(self: &Arc<Self>, done: &mpsc::UnboundedSender<()>) {
        let me = self.config.host.clone();
        let mut todo = Vec::new();
        let mut campaign = Vec::new();
        let mut finished = Vec::new();
        {
            let view = self.view();
            let mut inner = self.inner();
            for (id, r) in &view.restores {
                if let Some(e) = r.refused() {
                    if inner.refusals.insert(id.clone()) {
                        warn!(restore = %id, "refused a restore's record: {}", chain(e));
                    }
                }
                let Some(plan) = r.plan() else { continue };
                if !plan.by_host.contains_key(&me) {
                    continue;
                }
                let status = r.state().map(|(s, _)| s.status);
                if status.is_some_and(Status::is_final) {
                    finished.push(id.clone());
                    if status == Some(Status::Restored) {
                        // Every VM of it is restored: nothing is left for any host, and
                        // past restores need not cost every later change a look.
                        continue;
                    }
                } else if r.refused().is_none()
                    && inner.campaigns.get(id).is_none_or(|h| h.is_finished())
                {
                    campaign.push(id.clone());
                }
                let busy = inner.busy.entry(id.clone()).or_default();
                let state_rev = r.state().map_or(0, |(_, rev)| rev);
                for a in host_side::decide(&me, plan.vms_of(&me), r.state(), &r.phases, busy) {
                    if let Some((vm, (_, rev))) = r.phases.get_key_value(a.vm()) {
                        let acted = busy.acted.entry(vm.clone()).or_default();
                        acted.record = *rev;
                        acted.state = state_rev;
                    }
                    match &a {
                        HostAction::Load { vm, .. } => busy.loading.insert(vm.clone()),
                        HostAction::Take { vm, .. }
                        | HostAction::Resume { vm, .. }
                        | HostAction::Drop { vm, .. } => busy.running.insert(vm.clone()),
                    };
                    todo.push((id.clone(), plan.clone(), a));
                }
            }
            for id in finished {
                if let Some(h) = inner.campaigns.remove(&id) {
                    h.abort();
                }
            }
            inner.tasks.retain(|h| !h.is_finished());
        }
        for id in campaign {
            let s = self.clone();
            let rid = id.clone();
            let done = done.clone();
            let h = tokio::spawn(async move { s.coordinate(&rid, done).await }).abort_handle();
            self.inner().campaigns.insert(id, h);
        }
        for (id, plan, a) in todo {
            let s = self.clone();
            let done = done.clone();
            let h = tokio::spawn(async move {
                s.host_task(&id, &plan.record, a).await;
                let _ = done.send(());
            })
            .abort_handle();
            self.inner().tasks.push(h);
        }
    }

    fn unbusy(&self, id: &str, vm: &str) {
        if let Some(b) = self.inner().busy.get_mut(id) {
            b.loading.remove(vm);
            b.running.remove(vm);
        }
    }

    /// Records that this host wrote `vm`'s phase at `rev`: until the view shows that
    /// write, what it holds of the VM is older than what this host did, and acting
    /// on it would repeat a step (resume a VM just restored).
    fn wrote(&self, id: &str, vm: &str, rev: Revision) -> Revision {
        if let Some(b) = self.inner().busy.get_mut(id) {
            let a = b.acted.entry(vm.to_string()).or_default();
            a.wrote = a.wrote.max(rev);
        }
        rev
    }

    /// The phase record of `vm` as this host last saw it.
    fn phase(&self, id: &str, vm: &str) -> Option<(PhaseRecord, Revision)> {
        self.view().restores.get(id)?.phases.get(vm).cloned()
    }

    /// Writes `rec` over the phase record seen at `rev`; the new revision, or
    /// `None` if the record changed meanwhile (or the store failed for good: logged).
    async fn write_phase(&self, id: &str, rec: &PhaseRecord, rev: Revision) -> Option<Revision> {
        let key = layout::phase(id, &rec.host, &rec.vm);
        self.cas_put(id, &key, vec![Compare::ModRevision(key.clone(), rev)], rec)
            .await
    }

    /// Puts `rec` at `key` if `when` holds; the revision written at, or `None` if a
    /// comparison failed. A store that fails is asked again (up to about a minute):
    /// a write that timed out may have been applied, so a retry whose comparison
    /// fails reads the key back, and finding `rec` there is the earlier attempt's
    /// success.
    async fn cas_put(
        &self,
        id: &str,
        key: &str,
        when: Vec<Compare>,
        rec: &PhaseRecord,
    ) -> Option<Revision> {
        let value = encode(rec);
        let mut pause = Duration::from_millis(50);
        for attempt in 0..40 {
            let op = Op::Put {
                key: key.to_string(),
                value: value.clone(),
                lease: None,
            };
            match self.store.txn(when.clone(), vec![op]).await {
                Ok(o) if o.succeeded => return Some(self.wrote(id, &rec.vm, o.revision)),
                Ok(_) => {
                    if attempt > 0 {
                        if let Ok(Some(kv)) = self.store.get(key).await {
                            if kv.value == value {
                                return Some(self.wrote(id, &rec.vm, kv.mod_revision));
                            }
                        }
                    }
                    debug!(restore = %id, vm = %rec.vm, "phase changed before {} was written", rec.phase.name());
                    return None;
                }
                Err(e) => {
                    warn!(restore = %id, vm = %rec.vm, "cannot write phase {} yet: {}", rec.phase.name(), chain(&e));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
        warn!(restore = %id, vm = %rec.vm, "gave up writing phase {}", rec.phase.name());
        None
    }

    async fn host_task(&self, id: &str, plan: &PlanRecord, a: HostAction) {
        let vms = &self.vms;
        match a {
            HostAction::Load { vm, rev } => {
                let p = plan.plan.vms.iter().find(|p| p.vm == vm).expect("planned");
                info!(restore = %id, %vm, ws_pages = p.ws_pages, "loading");
                let r = vms.load(id, &vm, p.ws_pages, &p.args).await;
                let Some((mut rec, _)) = self.phase(id, &vm) else {
                    return self.unbusy(id, &vm);
                };
                match r {
                    Ok(info) => {
                        rec.phase = Phase::Loaded;
                        rec.pages = Some(info.pages);
                        rec.load_s = Some(info.load_s);
                        rec.loaded_unix_ns = Some(unix_now_ns());
                    }
                    Err(e) => {
                        rec.phase = Phase::LoadFailed;
                        rec.error = Some(chain(&*e));
                    }
                }
                if self.write_phase(id, &rec, rev).await.is_none() && rec.phase == Phase::Loaded {
                    // The record moved on without us (aborted): drop what we loaded.
                    vms.abort(id, &vm).await;
                }
                self.unbusy(id, &vm);
            }
            HostAction::Take {
                vm,
                rev,
                at_unix_ns,
            } => {
                let Some((mut rec, _)) = self.phase(id, &vm) else {
                    return self.unbusy(id, &vm);
                };
                let state_rev = self
                    .view()
                    .restores
                    .get(id)
                    .and_then(|r| r.state().map(|(_, rev)| rev));
                let Some(state_rev) = state_rev else {
                    return self.unbusy(id, &vm);
                };
                rec.phase = Phase::Starting;
                let key = layout::phase(id, &rec.host, &vm);
                let when = vec![
                    Compare::ModRevision(key.clone(), rev),
                    Compare::ModRevision(layout::state(id), state_rev),
                ];
                match self.cas_put(id, &key, when, &rec).await {
                    Some(r) => self.run_vm(id, &vm, rec, r, at_unix_ns).await,
                    None => {
                        debug!(restore = %id, %vm, "START not taken: the records changed first")
                    }
                }
                self.unbusy(id, &vm);
            }
            HostAction::Resume {
                vm,
                phase,
                at_unix_ns,
            } => {
                if let Some((rec, rev)) = self.phase(id, &vm) {
                    if rec.phase == phase {
                        info!(restore = %id, %vm, phase = phase.name(), "carrying on with a VM taken before");
                        self.run_vm(id, &vm, rec, rev, at_unix_ns).await;
                    }
                }
                self.unbusy(id, &vm);
            }
            HostAction::Drop { vm, rev, loaded } => {
                if loaded {
                    info!(restore = %id, %vm, "dropping a held VM: the restore is aborting");
                }
                vms.abort(id, &vm).await;
                if let Some((mut rec, _)) = self.phase(id, &vm) {
                    rec.phase = Phase::Aborted;
                    self.write_phase(id, &rec, rev).await;
                }
                self.unbusy(id, &vm);
            }
        }
    }

    /// Starts a taken VM on its instant (unless it already started), then awaits
    /// the rest of its memory.
    async fn run_vm(&self, id: &str, vm: &str, mut rec: PhaseRecord, mut rev: Revision, at: i64) {
        if rec.phase == Phase::Starting {
            let wait = at.saturating_sub(unix_now_ns());
            if wait > 0 {
                tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
            }
            match self.vms.start(id, vm).await {
                Ok(s) => {
                    rec.phase = Phase::Started;
                    rec.started_unix_ns = Some(s.started_unix_ns);
                    info!(restore = %id, %vm, error_ms = (s.started_unix_ns - at) as f64 / 1e6, "started on its instant");
                }
                Err(e) => {
                    rec.phase = Phase::StartFailed;
                    rec.error = Some(chain(&*e));
                }
            }
            match self.write_phase(id, &rec, rev).await {
                Some(r) => rev = r,
                None => return,
            }
        }
        if rec.phase != Phase::Started {
            return;
        }
        match self.vms.restored(id, vm).await {
            Ok(()) => {
                rec.phase = Phase::Restored;
                rec.restored_unix_ns = Some(unix_now_ns());
            }
            Err(e) => {
                rec.phase = Phase::RestoreFailed;
                rec.error = Some(chain(&*e));
            }
        }
        self.write_phase(id, &rec, rev).await;
    }

    /// Campaigns to coordinate restore `id`, then coordinates it to its end.
    async fn coordinate(self: Arc<Self>, id: &str, done: mpsc::UnboundedSender<()>) {
        let me = &self.config.host;
        // A campaign the store ends (a timeout, a member lost) is made again for as
        // long as the restore runs: a host that stopped campaigning could leave the
        // restore with no coordinator once the leader dies.
        let leader = loop {
            let Some(lease) = self.inner().lease else {
                return;
            };
            match self
                .store
                .campaign(&layout::election(id), lease, me.as_bytes())
                .await
            {
                Ok(l) => break l,
                Err(e) => {
                    debug!(restore = %id, "campaign ended: {}; campaigning again", chain(&e));
                    if matches!(self.step(id, Written::default()), Step::End) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        };
        info!(restore = %id, host = %me, "coordinating the restore");
        // From now on the participant follows every VM's phase in the restore.
        let _coordinating = Coordinating::new(&self, id);
        let _ = done.send(());
        let mut changes = self.changed.subscribe();
        let mut min = Written::default();
        loop {
            let mut wake = None;
            match self.step(id, min) {
                Step::Wait => {}
                Step::End => {
                    let _ = self.store.resign(&leader).await;
                    info!(restore = %id, "no longer coordinating the restore: it ended");
                    return;
                }
                Step::Act(mut s) => {
                    wake = s.decision.wake_unix_ns;
                    for a in std::mem::take(&mut s.decision.actions) {
                        match self.apply(id, &leader, &s, a).await {
                            Ok(w) => min = min.max(w),
                            Err(e) => {
                                warn!(restore = %id, "the coordinator cannot write: {}", chain(&e));
                                wake = Some(unix_now_ns() + 200_000_000);
                            }
                        }
                    }
                }
            }
            let sleep = async {
                match wake {
                    Some(at) => {
                        let d = at.saturating_sub(unix_now_ns()).max(0) as u64;
                        tokio::time::sleep(Duration::from_nanos(d)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = sleep => {}
            }
        }
    }

    /// What the coordinator of `id` does next, from the current view; `min` is
    /// what it wrote last.
    fn step(&self, id: &str, min: Written) -> Step {
        let view = self.view();
        let Some(r) = view.restores.get(id) else {
            return Step::End;
        };
        let Some(plan) = r.plan() else {
            return Step::End;
        };
        let state = r.state().map(|(s, rev)| (s.clone(), rev));
        if state.as_ref().is_some_and(|(s, _)| s.status.is_final()) {
            return Step::End;
        }
        let all = self
            .inner()
            .followed
            .get(id)
            .is_some_and(|(s, _)| *s == Scope::All);
        if !all || view.revision < min.state || r.phases_rev < min.phases {
            // Every VM's phase is not read yet, or our last write is not in the
            // view yet: deciding now would miss records or repeat the write.
            return Step::Wait;
        }
        let decision = match r.bad_phases.iter().next() {
            // A phase record was refused: abort, naming it.
            Some((vm, (e, _))) => checker::Decision {
                actions: match &state {
                    Some((s, _)) if s.status == Status::Active => vec![Action::Abort {
                        reason: format!("VM {vm}'s record was refused: {}", chain(e)),
                    }],
                    _ => Vec::new(),
                },
                wake_unix_ns: None,
            },
            None => {
                let live = view.live();
                let v = checker::View {
                    plan: &plan.record,
                    groups: &plan.groups,
                    state: r.state(),
                    phases: &r.phases,
                    live: &live,
                    now_unix_ns: unix_now_ns(),
                };
                checker::decide(&v, &self.config.tunables)
            }
        };
        // Only the records the writes compare against are copied: this runs on every
        // change, and a copy of every VM's record made it grow with the cluster.
        let mut phases = HashMap::new();
        let mut missing = Vec::new();
        for a in &decision.actions {
            match a {
                Action::Start { vms } => {
                    for (vm, _) in vms {
                        if let Some(p) = r.phases.get(vm) {
                            phases.insert(vm.clone(), p.clone());
                        }
                    }
                }
                Action::Begin => {
                    missing = (0..plan.record.plan.vms.len())
                        .filter(|&i| !r.phases.contains_key(&plan.record.plan.vms[i].vm))
                        .collect()
                }
                _ => {}
            }
        }
        Step::Act(Box::new(Snapshot {
            decision,
            plan: plan.clone(),
            state,
            phases,
            missing,
        }))
    }

    /// Writes one of the checker's actions; the revisions written at, if it did.
    async fn apply(
        &self,
        id: &str,
        leader: &Leadership,
        s: &Snapshot,
        a: Action,
    ) -> Result<Written, StoreError> {
        let (plan, state, phases) = (&s.plan.record, s.state.as_ref(), &s.phases);
        let me = &self.config.host;
        let now = unix_now_ns();
        let fence = Compare::ModRevision(leader.key.clone(), leader.revision);
        let state_key = layout::state(id);
        let new_state = |status: Status, reason: Option<String>| StateRecord {
            format: FORMAT,
            restore_id: id.to_string(),
            status,
            began_unix_ns: state.map_or(now, |(s, _)| s.began_unix_ns),
            by: me.clone(),
            coordinators: {
                let mut c = state
                    .map(|(s, _)| s.coordinators.clone())
                    .unwrap_or_default();
                if c.last() != Some(me) {
                    c.push(me.clone());
                }
                c
            },
            reason,
            updated_unix_ns: now,
        };
        let mut w = Written::default();
        match a {
            Action::Refuse { reason } => {
                warn!(restore = %id, %reason, "refusing the restore");
                let o = self
                    .store
                    .txn(
                        vec![fence, Compare::ModRevision(state_key.clone(), 0)],
                        vec![put(&state_key, &new_state(Status::Aborted, Some(reason)))],
                    )
                    .await?;
                w.state = if o.succeeded { o.revision } else { 0 };
            }
            Action::Begin => {
                let mut ops = Vec::new();
                let mut cmps = vec![fence.clone()];
                if state.is_none() {
                    info!(restore = %id, vms = plan.plan.vms.len(), "restore begins: LOAD to every VM");
                    cmps.push(Compare::ModRevision(state_key.clone(), 0));
                    ops.push(put(&state_key, &new_state(Status::Active, None)));
                }
                let mut with_state = state.is_none();
                for p in s.missing.iter().map(|&i| &plan.plan.vms[i]) {
                    let key = layout::phase(id, &p.host, &p.vm);
                    cmps.push(Compare::ModRevision(key.clone(), 0));
                    ops.push(put(&key, &PhaseRecord::new(&p.vm, &p.host)));
                    if ops.len() == TXN_OPS {
                        let o = self
                            .store
                            .txn(std::mem::take(&mut cmps), std::mem::take(&mut ops))
                            .await?;
                        if !o.succeeded {
                            return Ok(w);
                        }
                        if std::mem::take(&mut with_state) {
                            w.state = o.revision;
                        }
                        w.phases = o.revision;
                        cmps.push(fence.clone());
                    }
                }
                if !ops.is_empty() {
                    let o = self.store.txn(cmps, ops).await?;
                    if o.succeeded {
                        if with_state {
                            w.state = o.revision;
                        }
                        w.phases = o.revision;
                    }
                }
            }
            Action::Start { vms } => {
                let Some((_, state_rev)) = state else {
                    return Ok(w);
                };
                for chunk in vms.chunks(TXN_OPS) {
                    let mut cmps = vec![
                        fence.clone(),
                        Compare::ModRevision(state_key.clone(), *state_rev),
                    ];
                    let mut ops = Vec::new();
                    for (vm, at) in chunk {
                        let Some((rec, rev)) = phases.get(vm) else {
                            continue;
                        };
                        let key = layout::phase(id, &rec.host, vm);
                        let mut rec = rec.clone();
                        rec.phase = Phase::Start;
                        rec.start_sent_unix_ns = Some(now);
                        rec.start_at_unix_ns = Some(*at);
                        cmps.push(Compare::ModRevision(key.clone(), *rev));
                        ops.push(put(&key, &rec));
                    }
                    debug!(restore = %id, vms = ops.len(), "START");
                    let o = self.store.txn(cmps, ops).await?;
                    if !o.succeeded {
                        return Ok(w);
                    }
                    w.phases = o.revision;
                }
            }
            Action::Abort { reason } => {
                let Some((_, state_rev)) = state else {
                    return Ok(w);
                };
                warn!(restore = %id, %reason, "aborting the restore");
                let o = self
                    .store
                    .txn(
                        vec![fence, Compare::ModRevision(state_key.clone(), *state_rev)],
                        vec![put(&state_key, &new_state(Status::Aborting, Some(reason)))],
                    )
                    .await?;
                w.state = if o.succeeded { o.revision } else { 0 };
            }
            Action::Finish { status } => {
                let Some((s, state_rev)) = state else {
                    return Ok(w);
                };
                let o = self
                    .store
                    .txn(
                        vec![fence, Compare::ModRevision(state_key.clone(), *state_rev)],
                        vec![put(&state_key, &new_state(status, s.reason.clone()))],
                    )
                    .await?;
                if o.succeeded {
                    info!(restore = %id, status = ?status, "restore ended");
                    w.state = o.revision;
                }
            }
        }
        Ok(w)
    }
}

/// What a coordinator wrote last: the revisions of its last state and phase
/// writes (0 for none). Each comes back through its own watch.
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    state: Revision,
    phases: Revision,
}

impl Written {
    fn max(self, o: Written) -> Written {
        Written {
            state: self.state.max(o.state),
            phases: self.phases.max(o.phases),
        }
    }
}

/// Marks a restore as coordinated by this participant while it lives.
struct Coordinating {
    shared: Arc<Shared>,
    id: String,
}

impl Coordinating {
    fn new(shared: &Arc<Shared>, id: &str) -> Coordinating {
        shared.inner().coordinating.insert(id.to_string());
        Coordinating {
            shared: shared.clone(),
            id: id.to_string(),
        }
    }
}

impl Drop for Coordinating {
    fn drop(&mut self) {
        self.shared.inner().coordinating.remove(&self.id);
    }
}

enum Step {
    /// Wait for the view to catch up with our own writes.
    Wait,
    /// The restore ended (or is gone): resign.
    End,
    Act(Box<Snapshot>),
}

/// A decision and the records it was made from (the writes compare against them).
struct Snapshot {
    decision: checker::Decision,
    plan: Arc<CheckedPlan>,
    state: Option<(StateRecord, Revision)>,
    /// The records of the VMs the decision starts.
    phases: HashMap<String, (PhaseRecord, Revision)>,
    /// The plan's VMs with no record yet (for `Begin`).
    missing: Vec<usize>,
}

fn put<T: Record>(key: &str, rec: &T) -> Op {
    Op::Put {
        key: key.to_string(),
        value: encode(rec),
        lease: None,
    }
}
