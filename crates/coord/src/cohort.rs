//! The cohort: the server one host's daemon runs so a coordinator can restore the
//! host's VMs. It drives the VMs through [`CohortVms`].
//!
//! # Per VM, per restore
//!
//! `LOAD` → `loading` → `held` (loaded, paused; `LOAD_FIN` sent) → `START` →
//! `starting` → `started` (`START_FIN` sent) → `restored` (the rest of memory is in;
//! `RESTORE_FIN` sent). Failures end in `load_failed`, `start_failed` or
//! `restore_failed` with the daemon's error, which is sent to the coordinator.
//!
//! Every command is idempotent, keyed by restore id and VM, not by connection, so a
//! coordinator that reconnects and sends its command again gets the answer again:
//! - `LOAD` for a VM that is loading answers `LOAD_FIN` when the load ends; for a VM
//!   loaded (held or later) it answers `LOAD_FIN` again; for a failed load,
//!   `LOAD_FAILED` again. Nothing loads twice.
//! - `START` for a VM starting answers when the start ends; for a started VM it
//!   answers `START_FIN` again (and `RESTORE_FIN`/`RESTORE_FAILED` again if known).
//!   Nothing starts twice. `START` for a VM that is not held answers `START_FAILED`.
//! - `ABORT` aborts every held VM of the restore (calls [`CohortVms::abort`] once
//!   each), marks loading VMs to be aborted when their load ends, refuses later
//!   `LOAD`s and `START`s of the restore, and answers `ABORT_ACK`; started VMs keep
//!   running.
//!
//! Answers that come later (a load or start that ends) go to the connection that
//! last sent a message for the restore; if that connection is gone the answer is
//! lost and the coordinator's next retry gets it.
//!
//! # Hold timeout
//!
//! A cohort holding VMs of a restore (loading or held) that hears nothing for the
//! restore (no command, no `PING`) for [`CohortConfig::hold_timeout`] aborts them
//! itself, as if the coordinator had sent `ABORT`, and records the reason (see
//! [`CohortHandle::status`]): VMs are never held paused forever when the
//! coordinator dies after `LOAD`.
//!
//! # API relay
//!
//! A cohort started with [`spawn_cohort_with_api`] also answers `API_CALL`s (see
//! [`crate::relay`]) on the same listener, each in its own task, so a long call does
//! not hold up the restore messages of its connection.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::msg::{unix_now_ns, LoadVm, Message};
use crate::relay::CohortApi;
use crate::tasks::Tasks;
use crate::token::ClusterToken;
use crate::wire::{server_handshake, WireError};
use rebound_errors::chain;

/// What a VM's working-set load reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadInfo {
    /// Pages actually loaded.
    pub pages: u64,
    /// Seconds the load took.
    pub load_s: f64,
}

/// What a VM's start reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartInfo {
    /// This host's wall clock (ns since the Unix epoch) when the VM began running.
    pub started_unix_ns: i64,
}

/// Why one of [`CohortVms`]' operations failed: the implementation's own error with its
/// sources; the cohort prints the whole chain once, into the coordinator's message.
pub type VmError = Box<dyn std::error::Error + Send + Sync>;

/// The host's VMs as the cohort sees them; the daemon implements it on its real VMs.
///
/// The cohort calls each method at most once per restore and VM: `load`, then either
/// `abort` (a held VM dropped) or `start` followed by `restored`.
#[async_trait::async_trait]
pub trait CohortVms: Send + Sync + 'static {
    /// Prepares `vm` from its snapshot and loads its working set of `ws_pages` pages,
    /// leaving it paused (held). `args` are the coordinator's opaque restore args.
    async fn load(
        &self,
        restore_id: &str,
        vm: &str,
        ws_pages: u64,
        args: &serde_json::Value,
    ) -> Result<LoadInfo, VmError>;
    /// Starts a held VM (the rest of memory loads on demand and in the background).
    async fn start(&self, restore_id: &str, vm: &str) -> Result<StartInfo, VmError>;
    /// Resolves when the rest of a started VM's memory is loaded.
    async fn restored(&self, restore_id: &str, vm: &str) -> Result<(), VmError>;
    /// Drops a held (loaded, never started) VM.
    async fn abort(&self, restore_id: &str, vm: &str);
}

/// The cohort's timeouts.
#[derive(Debug, Clone)]
pub struct CohortConfig {
    /// A connection that has not finished the handshake by then is dropped.
    /// Default 5 s.
    pub handshake_timeout: Duration,
    /// Held VMs of a restore are aborted after this long without a message for the
    /// restore. Default 30 s: above the coordinator's default `peer` timeout (10 s),
    /// so a coordinator that lost the cohort gives up first, and many times its
    /// default ping interval (1 s).
    pub hold_timeout: Duration,
    /// Connections open at once; more are closed as they come. Default 64.
    pub max_connections: usize,
    /// Connections still in their handshake at once: peers without the token can
    /// hold only these, for at most `handshake_timeout`. Default 16.
    pub max_handshakes: usize,
}

impl Default for CohortConfig {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(5),
            hold_timeout: Duration::from_secs(30),
            max_connections: 64,
            max_handshakes: 16,
        }
    }
}

/// Counts refusals and says when one should be logged: the first ten, then the
/// 16th, 32nd, 64th..., so a peer refused in a loop cannot flood the log.
#[derive(Default)]
struct Refusals(std::sync::atomic::AtomicU64);

impl Refusals {
    /// Counts one; `Some(total)` when this one is to be logged.
    fn count(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        (n <= 10 || n.is_power_of_two()).then_some(n)
    }
}

/// One VM's state on the cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum CohortVmState {
    Loading,
    /// Loaded and paused, waiting for `START`.
    Held,
    LoadFailed {
        error: String,
    },
    Starting,
    Started,
    StartFailed {
        error: String,
    },
    Restored,
    RestoreFailed {
        error: String,
    },
    /// Aborted while held, or while loading (then [`CohortVms::abort`] runs when the
    /// load ends).
    Aborted {
        while_loading: bool,
    },
}

/// A restore as one cohort saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CohortRestoreStatus {
    /// Why the restore was aborted here (coordinator's `ABORT`, or hold timeout).
    pub aborted: Option<String>,
    pub vms: BTreeMap<String, CohortVmState>,
}

struct RestoreSlot {
    last_heard: Instant,
    aborted: Option<String>,
    reply: Option<mpsc::UnboundedSender<Message>>,
    vms: BTreeMap<String, VmSlot>,
    watchdog: bool,
}

struct VmSlot {
    state: CohortVmState,
    load: Option<LoadInfo>,
    start: Option<StartInfo>,
}

impl RestoreSlot {
    fn new() -> Self {
        Self {
            last_heard: Instant::now(),
            aborted: None,
            reply: None,
            vms: BTreeMap::new(),
            watchdog: false,
        }
    }

    fn send(&self, msg: Message) {
        if let Some(tx) = &self.reply {
            // A closed connection loses the answer; the coordinator's retry gets it.
            let _ = tx.send(msg);
        }
    }

    fn holds(&self) -> bool {
        self.vms
            .values()
            .any(|v| matches!(v.state, CohortVmState::Loading | CohortVmState::Held))
    }

    /// Marks the restore aborted; returns the held VMs to abort now.
    fn abort(&mut self, reason: &str) -> Vec<String> {
        if self.aborted.is_none() {
            self.aborted = Some(reason.to_owned());
        }
        let mut now = Vec::new();
        for (name, v) in self.vms.iter_mut() {
            match v.state {
                CohortVmState::Held => {
                    v.state = CohortVmState::Aborted {
                        while_loading: false,
                    };
                    now.push(name.clone());
                }
                CohortVmState::Loading => {
                    v.state = CohortVmState::Aborted {
                        while_loading: true,
                    }
                }
                _ => {}
            }
        }
        now
    }
}

struct Shared {
    token: ClusterToken,
    vms: Arc<dyn CohortVms>,
    api: Option<Arc<dyn CohortApi>>,
    config: CohortConfig,
    tasks: Tasks,
    restores: Mutex<HashMap<String, RestoreSlot>>,
    connections: Arc<tokio::sync::Semaphore>,
    handshakes: Arc<tokio::sync::Semaphore>,
    refused: Refusals,
}

/// A running cohort. Dropping it (or [`CohortHandle::shutdown`]) stops the listener,
/// its connections and its pending work at once, without aborting held VMs: that is
/// a host going away, and the daemon's VMs go with it.
pub struct CohortHandle {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

/// Starts a cohort accepting coordinators on `listener` (bound by the daemon, only
/// when asked to serve cluster restores).
pub fn spawn_cohort(
    listener: TcpListener,
    token: ClusterToken,
    vms: Arc<dyn CohortVms>,
    config: CohortConfig,
) -> std::io::Result<CohortHandle> {
    spawn(listener, token, vms, None, config)
}

/// Like [`spawn_cohort`], and also relays calls of the host's API to `api` (see
/// [`crate::relay`]).
pub fn spawn_cohort_with_api(
    listener: TcpListener,
    token: ClusterToken,
    vms: Arc<dyn CohortVms>,
    api: Arc<dyn CohortApi>,
    config: CohortConfig,
) -> std::io::Result<CohortHandle> {
    spawn(listener, token, vms, Some(api), config)
}

fn spawn(
    listener: TcpListener,
    token: ClusterToken,
    vms: Arc<dyn CohortVms>,
    api: Option<Arc<dyn CohortApi>>,
    config: CohortConfig,
) -> std::io::Result<CohortHandle> {
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared {
        token,
        vms,
        api,
        tasks: Tasks::default(),
        restores: Mutex::new(HashMap::new()),
        connections: Arc::new(tokio::sync::Semaphore::new(config.max_connections)),
        handshakes: Arc::new(tokio::sync::Semaphore::new(config.max_handshakes)),
        refused: Refusals::default(),
        config,
    });
    let s = shared.clone();
    shared.tasks.spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let Ok(permit) = s.connections.clone().try_acquire_owned() else {
                        if let Some(n) = s.refused.count() {
                            warn!(%peer, "cohort closed a connection: {} open already ({n} refused so far)", s.config.max_connections);
                        }
                        continue;
                    };
                    let s2 = s.clone();
                    s.tasks.spawn(async move {
                        serve_conn(s2, stream, peer).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    warn!(%addr, "cohort cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    info!(%addr, "cohort listening");
    Ok(CohortHandle { shared, addr })
}

impl CohortHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The restore as this cohort saw it, if it ever heard of it.
    pub fn status(&self, restore_id: &str) -> Option<CohortRestoreStatus> {
        let restores = self.shared.lock();
        restores.get(restore_id).map(|r| CohortRestoreStatus {
            aborted: r.aborted.clone(),
            vms: r
                .vms
                .iter()
                .map(|(k, v)| (k.clone(), v.state.clone()))
                .collect(),
        })
    }

    /// Stops the cohort at once (see [`CohortHandle`]).
    pub fn shutdown(&self) {
        self.shared.tasks.abort_all();
    }
}

impl Drop for CohortHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, RestoreSlot>> {
        self.restores.lock().unwrap_or_else(|p| p.into_inner())
    }
}

async fn serve_conn(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let Ok(handshake) = shared.handshakes.clone().try_acquire_owned() else {
        if let Some(n) = shared.refused.count() {
            warn!(%peer, "cohort closed a connection: {} handshakes in flight already ({n} refused so far)", shared.config.max_handshakes);
        }
        return;
    };
    let (mut reader, mut writer) =
        match server_handshake(stream, &shared.token, shared.config.handshake_timeout).await {
            Ok(rw) => rw,
            Err(e) => {
                if let Some(n) = shared.refused.count() {
                    warn!(%peer, "cohort refused a connection: {} ({n} refused so far)", chain(&e));
                }
                return;
            }
        };
    drop(handshake);
    debug!(%peer, "coordinator connected");
    let (tx, mut rx) = mpsc::unbounded_channel::<Message>();
    let writer_task = shared.tasks.spawn(async move {
        while let Some(msg) = rx.recv().await {
            let bytes = match serde_json::to_vec(&msg) {
                Ok(b) => b,
                Err(e) => {
                    warn!(%peer, "cannot encode {}: {e}", msg.kind());
                    continue;
                }
            };
            if let Err(e) = writer.write(&bytes).await {
                debug!(%peer, "cohort stops writing: {}", chain(&e));
                break;
            }
        }
    });
    loop {
        let payload = match reader.read().await {
            Ok(p) => p,
            Err(WireError::Closed) => {
                debug!(%peer, "coordinator closed the connection");
                break;
            }
            Err(e) => {
                warn!(%peer, "cohort dropped a connection: {}", chain(&e));
                break;
            }
        };
        let msg: Message = match serde_json::from_slice(&payload) {
            Ok(m) => m,
            Err(e) => {
                warn!(%peer, "cohort dropped a connection: undecodable message: {e}");
                break;
            }
        };
        debug!(%peer, kind = msg.kind(), restore_id = msg.restore_id().unwrap_or("-"), "cohort got");
        handle(&shared, msg, &tx).await;
    }
    writer_task.abort();
}

async fn handle(shared: &Arc<Shared>, msg: Message, tx: &mpsc::UnboundedSender<Message>) {
    match msg {
        Message::Ping {
            restore_id,
            t1_unix_ns,
        } => {
            let t2_unix_ns = unix_now_ns();
            if let Some(slot) = shared.lock().get_mut(&restore_id) {
                slot.last_heard = Instant::now();
                slot.reply = Some(tx.clone());
            }
            let _ = tx.send(Message::Pong {
                restore_id,
                t1_unix_ns,
                t2_unix_ns,
                t3_unix_ns: unix_now_ns(),
            });
        }
        Message::Load { restore_id, vms } => on_load(shared, restore_id, vms, tx),
        Message::Start { restore_id, vm } => on_start(shared, restore_id, vm, tx),
        Message::Abort { restore_id, reason } => {
            let (to_abort, ack) = {
                let mut restores = shared.lock();
                let slot = restores
                    .entry(restore_id.clone())
                    .or_insert_with(RestoreSlot::new);
                slot.last_heard = Instant::now();
                slot.reply = Some(tx.clone());
                if slot.aborted.is_none() {
                    warn!(%restore_id, %reason, "coordinator aborted the restore");
                }
                let to_abort = slot.abort(&format!("coordinator: {reason}"));
                let mut aborted = Vec::new();
                let mut started = Vec::new();
                for (name, v) in &slot.vms {
                    match v.state {
                        CohortVmState::Aborted { .. } => aborted.push(name.clone()),
                        CohortVmState::Starting
                        | CohortVmState::Started
                        | CohortVmState::Restored
                        | CohortVmState::RestoreFailed { .. } => started.push(name.clone()),
                        _ => {}
                    }
                }
                (
                    to_abort,
                    Message::AbortAck {
                        restore_id: restore_id.clone(),
                        aborted,
                        started,
                    },
                )
            };
            for vm in to_abort {
                shared.vms.abort(&restore_id, &vm).await;
            }
            let _ = tx.send(ack);
        }
        Message::ApiCall {
            call_id,
            method,
            path,
            body,
        } => {
            let (s, tx) = (shared.clone(), tx.clone());
            shared.tasks.spawn(async move {
                info!(%method, %path, "relayed API call");
                let reply =
                    crate::relay::answer(s.api.as_deref(), call_id, &method, &path, body).await;
                let _ = tx.send(reply);
            });
        }
        other => {
            warn!(
                kind = other.kind(),
                "cohort ignores a message only a cohort sends"
            );
        }
    }
}

fn on_load(
    shared: &Arc<Shared>,
    restore_id: String,
    vms: Vec<LoadVm>,
    tx: &mpsc::UnboundedSender<Message>,
) {
    let mut restores = shared.lock();
    let slot = restores
        .entry(restore_id.clone())
        .or_insert_with(RestoreSlot::new);
    slot.last_heard = Instant::now();
    slot.reply = Some(tx.clone());
    for lv in vms {
        let answer = match slot.vms.get(&lv.vm) {
            None => {
                if let Some(reason) = &slot.aborted {
                    Some(Message::LoadFailed {
                        restore_id: restore_id.clone(),
                        vm: lv.vm.clone(),
                        error: format!("the restore was aborted: {reason}"),
                    })
                } else {
                    slot.vms.insert(
                        lv.vm.clone(),
                        VmSlot {
                            state: CohortVmState::Loading,
                            load: None,
                            start: None,
                        },
                    );
                    let s = shared.clone();
                    let rid = restore_id.clone();
                    shared.tasks.spawn(run_load(s, rid, lv.clone()));
                    None
                }
            }
            Some(v) => match (&v.state, &v.load) {
                (CohortVmState::Loading, _) => None,
                (CohortVmState::LoadFailed { error }, _) => Some(Message::LoadFailed {
                    restore_id: restore_id.clone(),
                    vm: lv.vm.clone(),
                    error: error.clone(),
                }),
                (CohortVmState::Aborted { .. }, _) => Some(Message::LoadFailed {
                    restore_id: restore_id.clone(),
                    vm: lv.vm.clone(),
                    error: format!(
                        "the restore was aborted: {}",
                        slot.aborted.as_deref().unwrap_or("")
                    ),
                }),
                (_, Some(info)) => Some(Message::LoadFin {
                    restore_id: restore_id.clone(),
                    vm: lv.vm.clone(),
                    pages: info.pages,
                    load_s: info.load_s,
                }),
                (_, None) => None,
            },
        };
        if let Some(a) = answer {
            slot.send(a);
        }
    }
    if !slot.watchdog && slot.holds() {
        slot.watchdog = true;
        shared.tasks.spawn(watchdog(shared.clone(), restore_id));
    }
}

async fn run_load(shared: Arc<Shared>, restore_id: String, lv: LoadVm) {
    let result = shared
        .vms
        .load(&restore_id, &lv.vm, lv.ws_pages, &lv.args)
        .await
        .map_err(|e| rebound_errors::chain(&*e));
    let abort_now = {
        let mut restores = shared.lock();
        let Some(slot) = restores.get_mut(&restore_id) else {
            return;
        };
        let Some(v) = slot.vms.get_mut(&lv.vm) else {
            return;
        };
        match (&v.state, result) {
            (CohortVmState::Loading, Ok(info)) => {
                v.state = CohortVmState::Held;
                v.load = Some(info.clone());
                slot.send(Message::LoadFin {
                    restore_id: restore_id.clone(),
                    vm: lv.vm.clone(),
                    pages: info.pages,
                    load_s: info.load_s,
                });
                false
            }
            (CohortVmState::Loading, Err(error)) => {
                warn!(%restore_id, vm = %lv.vm, %error, "load failed");
                v.state = CohortVmState::LoadFailed {
                    error: error.clone(),
                };
                slot.send(Message::LoadFailed {
                    restore_id: restore_id.clone(),
                    vm: lv.vm.clone(),
                    error,
                });
                false
            }
            (_, Ok(info)) => {
                v.load = Some(info);
                true
            }
            (_, Err(_)) => false,
        }
    };
    if abort_now {
        info!(%restore_id, vm = %lv.vm, "aborting a VM whose load ended after the restore was aborted");
        shared.vms.abort(&restore_id, &lv.vm).await;
    }
}

fn on_start(
    shared: &Arc<Shared>,
    restore_id: String,
    vm: String,
    tx: &mpsc::UnboundedSender<Message>,
) {
    let mut restores = shared.lock();
    let Some(slot) = restores.get_mut(&restore_id) else {
        let _ = tx.send(Message::StartFailed {
            restore_id,
            vm,
            error: "this cohort has no such restore".into(),
        });
        return;
    };
    slot.last_heard = Instant::now();
    slot.reply = Some(tx.clone());
    let aborted = slot.aborted.clone().unwrap_or_default();
    let failed = |error: String| Message::StartFailed {
        restore_id: restore_id.clone(),
        vm: vm.clone(),
        error,
    };
    let Some(v) = slot.vms.get_mut(&vm) else {
        slot.send(failed("this cohort was not asked to load the VM".into()));
        return;
    };
    let fin = |s: &Option<StartInfo>| Message::StartFin {
        restore_id: restore_id.clone(),
        vm: vm.clone(),
        started_unix_ns: s.as_ref().map_or(0, |s| s.started_unix_ns),
    };
    let mut out = Vec::new();
    match &v.state {
        CohortVmState::Held => {
            v.state = CohortVmState::Starting;
            shared
                .tasks
                .spawn(run_start(shared.clone(), restore_id.clone(), vm.clone()));
        }
        CohortVmState::Starting => {}
        CohortVmState::Started => out.push(fin(&v.start)),
        CohortVmState::Restored => {
            out.push(fin(&v.start));
            out.push(Message::RestoreFin {
                restore_id: restore_id.clone(),
                vm: vm.clone(),
            });
        }
        CohortVmState::RestoreFailed { error } => {
            out.push(fin(&v.start));
            out.push(Message::RestoreFailed {
                restore_id: restore_id.clone(),
                vm: vm.clone(),
                error: error.clone(),
            });
        }
        CohortVmState::StartFailed { error } => out.push(failed(error.clone())),
        CohortVmState::Loading => out.push(failed("the VM has not finished loading".into())),
        CohortVmState::LoadFailed { error } => {
            out.push(failed(format!("the VM failed to load: {error}")))
        }
        CohortVmState::Aborted { .. } => {
            out.push(failed(format!("the restore was aborted: {aborted}")))
        }
    }
    for m in out {
        slot.send(m);
    }
}

async fn run_start(shared: Arc<Shared>, restore_id: String, vm: String) {
    let result = shared
        .vms
        .start(&restore_id, &vm)
        .await
        .map_err(|e| rebound_errors::chain(&*e));
    {
        let mut restores = shared.lock();
        let Some(slot) = restores.get_mut(&restore_id) else {
            return;
        };
        let Some(v) = slot.vms.get_mut(&vm) else {
            return;
        };
        match result {
            Ok(info) => {
                let started_unix_ns = info.started_unix_ns;
                v.state = CohortVmState::Started;
                v.start = Some(info);
                slot.send(Message::StartFin {
                    restore_id: restore_id.clone(),
                    vm: vm.clone(),
                    started_unix_ns,
                });
            }
            Err(error) => {
                warn!(%restore_id, %vm, %error, "start failed");
                v.state = CohortVmState::StartFailed {
                    error: error.clone(),
                };
                slot.send(Message::StartFailed {
                    restore_id,
                    vm,
                    error,
                });
                return;
            }
        }
    }
    let result = shared
        .vms
        .restored(&restore_id, &vm)
        .await
        .map_err(|e| rebound_errors::chain(&*e));
    let mut restores = shared.lock();
    let Some(slot) = restores.get_mut(&restore_id) else {
        return;
    };
    let Some(v) = slot.vms.get_mut(&vm) else {
        return;
    };
    let msg = match result {
        Ok(()) => {
            v.state = CohortVmState::Restored;
            Message::RestoreFin { restore_id, vm }
        }
        Err(error) => {
            warn!(%restore_id, %vm, %error, "loading the rest of memory failed");
            v.state = CohortVmState::RestoreFailed {
                error: error.clone(),
            };
            Message::RestoreFailed {
                restore_id,
                vm,
                error,
            }
        }
    };
    slot.send(msg);
}

/// Aborts the restore's held VMs once nothing was heard for `hold_timeout`; ends
/// when the restore holds no VM.
async fn watchdog(shared: Arc<Shared>, restore_id: String) {
    let hold = shared.config.hold_timeout;
    loop {
        let next = {
            let mut restores = shared.lock();
            let Some(slot) = restores.get_mut(&restore_id) else {
                return;
            };
            if !slot.holds() {
                slot.watchdog = false;
                return;
            }
            let deadline = slot.last_heard + hold;
            if Instant::now() < deadline {
                Err(deadline)
            } else {
                slot.watchdog = false;
                let reason = format!(
                    "no word from the coordinator for {:.1} s (hold_timeout)",
                    hold.as_secs_f64()
                );
                warn!(%restore_id, "cohort aborts the held VMs of the restore: {reason}");
                Ok(slot.abort(&reason))
            }
        };
        match next {
            Err(deadline) => tokio::time::sleep_until(deadline).await,
            Ok(to_abort) => {
                for vm in to_abort {
                    shared.vms.abort(&restore_id, &vm).await;
                }
                return;
            }
        }
    }
}
