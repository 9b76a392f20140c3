//! The coordinator: runs one restore of a [`Plan`] across the cohorts and implements
//! the paper's Checker (HotRestore 4.2.1, 4.3).
//!
//! # One restore
//!
//! 1. One link task per cohort connects (and reconnects after a dropped connection),
//!    authenticates, and pings every [`CoordinatorConfig::ping`]; each PONG gives a
//!    round trip and a clock-offset sample (NTP-style, see [`crate::report`]). The
//!    pings also keep the cohort's `hold_timeout` from firing.
//! 2. On every (re)connection the coordinator sends the cohort what is outstanding:
//!    LOAD for its VMs without LOAD_FIN, START for VMs started but without
//!    START_FIN or RESTORE_FIN, ABORT while aborting. It sends the same again every
//!    [`CoordinatorConfig::retry`]: the cohort's handling is idempotent, so a lost
//!    command or answer costs one retry and nothing runs twice.
//! 3. Checker: a start group (one VM, or a ring) starts when every member has
//!    LOAD_FIN, every VM outside the group that a member depends on has START_FIN,
//!    and the coordinator's clock has passed the largest `start_at_s` of the
//!    members. A ring's STARTs go out back to back. START carries no time: cohorts
//!    start on receipt, so host clock differences do not move start times.
//! 4. The restore is done when every VM sent RESTORE_FIN.
//!
//! # Failure
//!
//! A LOAD_FAILED, START_FAILED or RESTORE_FAILED, a cohort lost while it has VMs not
//! yet restored (no frame for [`CoordinatorConfig::peer`], or it failed
//! authentication), or a phase timeout (`load`, `start`, `restore`) aborts the
//! restore: the coordinator sends ABORT to every cohort it can still reach, waits up
//! to [`CoordinatorConfig::abort`] for their ABORT_ACKs, and returns a report with
//! [`Outcome::Aborted`]. Each VM then ends as one [`VmState`]: `restored` or
//! `started` (it runs; the coordinator does not stop started VMs), `aborted` (never
//! started, the cohort confirmed it dropped it; `held` tells whether it had
//! loaded), `load_failed`/`start_failed`/`restore_failed` (with the cohort's
//! error), or `unknown` (never confirmed started, cohort unreachable: if alive it
//! aborts the VM after its `hold_timeout`). Each cohort is reported `reachable` or
//! not, with the reason.

use std::collections::HashMap;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::msg::{unix_now_ns, LoadVm, Message};
use crate::report::{CohortReport, Outcome, RestoreReport, RingReport, VmReport, VmState};
use crate::restore_plan::{Groups, Plan, PlanError};
use crate::token::ClusterToken;
use crate::wire::{client_handshake, WireError};
use rebound_errors::chain;

/// The coordinator's timeouts.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// One TCP connect attempt. Default 2 s.
    pub connect: Duration,
    /// One handshake. Default 5 s.
    pub handshake: Duration,
    /// Outstanding commands are sent again this often; also the pause between
    /// connect attempts. Default 1 s.
    pub retry: Duration,
    /// PING to every cohort this often. Default 1 s (keep well under the cohorts'
    /// `hold_timeout`).
    pub ping: Duration,
    /// A cohort from which no frame came for this long (and that could not be
    /// reconnected) is unreachable. Default 10 s.
    pub peer: Duration,
    /// From the start of the restore to each VM's LOAD_FIN. Default 300 s.
    pub load: Duration,
    /// From START to START_FIN. Default 30 s.
    pub start: Duration,
    /// From START_FIN to RESTORE_FIN. Default 600 s.
    pub restore: Duration,
    /// How long an aborting coordinator waits for ABORT_ACKs. Default 5 s.
    pub abort: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            handshake: Duration::from_secs(5),
            retry: Duration::from_secs(1),
            ping: Duration::from_secs(1),
            peer: Duration::from_secs(10),
            load: Duration::from_secs(300),
            start: Duration::from_secs(30),
            restore: Duration::from_secs(600),
            abort: Duration::from_secs(5),
        }
    }
}

/// Why a restore could not be run at all (a restore that runs and fails returns a
/// report saying so).
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("the restore plan is invalid")]
    Plan(#[from] PlanError),
}

enum Event {
    Connected {
        cohort: usize,
    },
    Msg {
        cohort: usize,
        msg: Message,
    },
    Clock {
        cohort: usize,
        offset_ns: i64,
        rtt_ns: i64,
    },
    Lost {
        cohort: usize,
        reason: String,
    },
}

#[derive(Default)]
struct VmRun {
    load_fin: Option<(Instant, u64, f64)>,
    start_sent: Option<Instant>,
    start_fin: Option<(Instant, i64)>,
    restore_fin: Option<Instant>,
    failed: Option<(VmState, String)>,
    acked: Option<VmState>,
}

impl VmRun {
    fn terminal(&self) -> bool {
        self.restore_fin.is_some() || self.failed.is_some()
    }
}

struct CohortRun {
    addr: String,
    vms: Vec<usize>,
    out: mpsc::UnboundedSender<Message>,
    connected: bool,
    connections: u32,
    lost: Option<String>,
    /// (offset, round trip) of the sample with the smallest round trip.
    clock: Option<(i64, i64)>,
    abort_acked: bool,
}

struct Run<'a> {
    plan: &'a Plan,
    config: &'a CoordinatorConfig,
    groups: Groups,
    index: HashMap<&'a str, usize>,
    vms: Vec<VmRun>,
    cohorts: Vec<CohortRun>,
    cohort_of: Vec<usize>,
    t0: Instant,
    aborting: Option<(String, Instant)>,
}

/// Restores the plan's VMs; returns when every VM sent RESTORE_FIN or the restore
/// was aborted (see the module doc). Dropping the future stops the coordinator at
/// once; cohorts then abort held VMs after their `hold_timeout`.
pub async fn restore(
    plan: &Plan,
    token: &ClusterToken,
    config: &CoordinatorConfig,
) -> Result<RestoreReport, CoordError> {
    let groups = plan.groups()?;
    let index = plan
        .vms
        .iter()
        .enumerate()
        .map(|(i, v)| (v.vm.as_str(), i))
        .collect();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let mut links = JoinSet::new();
    let mut cohorts: Vec<CohortRun> = Vec::new();
    let mut cohort_of = Vec::with_capacity(plan.vms.len());
    for (i, v) in plan.vms.iter().enumerate() {
        let c = match cohorts.iter().position(|c| c.addr == v.host) {
            Some(c) => c,
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                let c = cohorts.len();
                links.spawn(link(
                    c,
                    v.host.clone(),
                    plan.restore_id.clone(),
                    token.clone(),
                    config.clone(),
                    rx,
                    ev_tx.clone(),
                ));
                cohorts.push(CohortRun {
                    addr: v.host.clone(),
                    vms: Vec::new(),
                    out: tx,
                    connected: false,
                    connections: 0,
                    lost: None,
                    clock: None,
                    abort_acked: false,
                });
                c
            }
        };
        cohorts[c].vms.push(i);
        cohort_of.push(c);
    }
    drop(ev_tx);
    let began_unix_ns = unix_now_ns();
    let mut run = Run {
        plan,
        config,
        groups,
        index,
        vms: (0..plan.vms.len()).map(|_| VmRun::default()).collect(),
        cohorts,
        cohort_of,
        t0: Instant::now(),
        aborting: None,
    };
    info!(restore_id = %plan.restore_id, vms = plan.vms.len(), cohorts = run.cohorts.len(), "cluster restore begins");
    let mut retry = tokio::time::interval_at(Instant::now() + config.retry, config.retry);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let now = Instant::now();
        run.check_timeouts(now);
        let wake = if run.aborting.is_none() {
            run.checker(now)
        } else {
            None
        };
        if run.done() {
            break;
        }
        let wake = [wake, run.next_deadline()].into_iter().flatten().min();
        let sleep = tokio::time::sleep_until(wake.unwrap_or(now + Duration::from_secs(3600)));
        tokio::select! {
            ev = ev_rx.recv() => match ev {
                Some(ev) => run.on_event(ev),
                None => break,
            },
            _ = retry.tick() => {
                for c in 0..run.cohorts.len() {
                    run.send_outstanding(c);
                }
            }
            _ = sleep => {}
        }
    }
    links.abort_all();
    let report = run.report(began_unix_ns);
    match &report.outcome {
        Outcome::Restored => {
            info!(restore_id = %plan.restore_id, duration_s = report.duration_s, "cluster restore done")
        }
        Outcome::Aborted { reason } => {
            warn!(restore_id = %plan.restore_id, %reason, "cluster restore aborted")
        }
    }
    Ok(report)
}

impl Run<'_> {
    fn name(&self, vm: usize) -> &str {
        &self.plan.vms[vm].vm
    }

    fn send(&self, c: usize, msg: Message) {
        debug!(cohort = %self.cohorts[c].addr, kind = msg.kind(), "coordinator sends");
        // A link that ended was lost; its event says so.
        let _ = self.cohorts[c].out.send(msg);
    }

    fn done(&self) -> bool {
        match &self.aborting {
            None => self.vms.iter().all(|v| v.restore_fin.is_some()),
            Some((_, deadline)) => {
                Instant::now() >= *deadline
                    || self
                        .cohorts
                        .iter()
                        .all(|c| c.abort_acked || c.lost.is_some())
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        if let Some((_, d)) = &self.aborting {
            return Some(*d);
        }
        let c = self.config;
        self.vms
            .iter()
            .filter(|v| !v.terminal())
            .map(|v| match (v.load_fin, v.start_sent, v.start_fin) {
                (None, _, _) => self.t0 + c.load,
                (Some(_), None, _) => self.t0 + Duration::from_secs(365 * 86400),
                (Some(_), Some(s), None) => s + c.start,
                (Some(_), Some(_), Some((f, _))) => f + c.restore,
            })
            .min()
    }

    /// Starts the restore's abort (once).
    fn fail(&mut self, reason: String) {
        if self.aborting.is_some() {
            return;
        }
        warn!(restore_id = %self.plan.restore_id, %reason, "aborting the cluster restore");
        self.aborting = Some((reason, Instant::now() + self.config.abort));
        for c in 0..self.cohorts.len() {
            self.send_outstanding(c);
        }
    }

    fn check_timeouts(&mut self, now: Instant) {
        if self.aborting.is_some() {
            return;
        }
        let c = self.config;
        let mut reason = None;
        for (i, v) in self.vms.iter().enumerate() {
            if v.terminal() {
                continue;
            }
            let late = match (v.load_fin, v.start_sent, v.start_fin) {
                (None, _, _) if now >= self.t0 + c.load => Some(("LOAD_FIN", c.load)),
                (Some(_), Some(s), None) if now >= s + c.start => Some(("START_FIN", c.start)),
                (Some(_), Some(_), Some((f, _))) if now >= f + c.restore => {
                    Some(("RESTORE_FIN", c.restore))
                }
                _ => None,
            };
            if let Some((what, limit)) = late {
                reason = Some(format!(
                    "VM {}: no {what} within {:.1} s",
                    self.name(i),
                    limit.as_secs_f64()
                ));
                break;
            }
        }
        if let Some(r) = reason {
            self.fail(r);
        }
    }

    /// Sends cohort `c` what it has not answered yet.
    fn send_outstanding(&self, c: usize) {
        let cohort = &self.cohorts[c];
        if cohort.lost.is_some() || !cohort.connected {
            return;
        }
        let restore_id = self.plan.restore_id.clone();
        if let Some((reason, _)) = &self.aborting {
            if !cohort.abort_acked {
                self.send(
                    c,
                    Message::Abort {
                        restore_id,
                        reason: reason.clone(),
                    },
                );
            }
            return;
        }
        let loads: Vec<LoadVm> = cohort
            .vms
            .iter()
            .filter(|&&i| self.vms[i].load_fin.is_none() && self.vms[i].failed.is_none())
            .map(|&i| {
                let p = &self.plan.vms[i];
                LoadVm {
                    vm: p.vm.clone(),
                    ws_pages: p.ws_pages,
                    args: p.args.clone(),
                }
            })
            .collect();
        if !loads.is_empty() {
            self.send(
                c,
                Message::Load {
                    restore_id: restore_id.clone(),
                    vms: loads,
                },
            );
        }
        for &i in &cohort.vms {
            let v = &self.vms[i];
            if v.start_sent.is_some() && !v.terminal() {
                self.send(
                    c,
                    Message::Start {
                        restore_id: restore_id.clone(),
                        vm: self.name(i).to_owned(),
                    },
                );
            }
        }
    }

    /// The Checker: sends START to every group now allowed to start; returns when
    /// to look again for a group waiting for its `start_at_s`.
    fn checker(&mut self, now: Instant) -> Option<Instant> {
        let mut wake: Option<Instant> = None;
        for g in 0..self.groups.groups.len() {
            let members = &self.groups.groups[g];
            let ready = members.iter().all(|&m| {
                let v = &self.vms[m];
                v.start_sent.is_none() && v.load_fin.is_some() && v.failed.is_none()
            }) && self.groups.needs[g]
                .iter()
                .all(|&d| self.vms[d].start_fin.is_some());
            if !ready {
                continue;
            }
            let at = members
                .iter()
                .filter_map(|&m| self.plan.vms[m].start_at_s)
                .fold(0.0, f64::max);
            let not_before = self.t0 + Duration::from_secs_f64(at);
            if now < not_before {
                wake = Some(wake.map_or(not_before, |w| w.min(not_before)));
                continue;
            }
            let members = members.clone();
            for &m in &members {
                self.vms[m].start_sent = Some(now);
            }
            for &m in &members {
                self.send(
                    self.cohort_of[m],
                    Message::Start {
                        restore_id: self.plan.restore_id.clone(),
                        vm: self.name(m).to_owned(),
                    },
                );
            }
            info!(restore_id = %self.plan.restore_id, vms = ?members.iter().map(|&m| self.name(m)).collect::<Vec<_>>(), "START sent");
        }
        wake
    }

    fn vm_of(&self, c: usize, name: &str) -> Option<usize> {
        let i = *self.index.get(name)?;
        (self.cohort_of[i] == c).then_some(i)
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Connected { cohort } => {
                let cr = &mut self.cohorts[cohort];
                cr.connected = true;
                cr.connections += 1;
                self.send_outstanding(cohort);
            }
            Event::Clock {
                cohort,
                offset_ns,
                rtt_ns,
            } => {
                let cr = &mut self.cohorts[cohort];
                if !matches!(cr.clock, Some((_, best)) if best <= rtt_ns) {
                    cr.clock = Some((offset_ns, rtt_ns));
                }
            }
            Event::Lost { cohort, reason } => {
                let addr = self.cohorts[cohort].addr.clone();
                warn!(cohort = %addr, %reason, "cohort unreachable");
                self.cohorts[cohort].lost = Some(reason.clone());
                let pending = self.cohorts[cohort]
                    .vms
                    .iter()
                    .any(|&i| !self.vms[i].terminal());
                if pending {
                    self.fail(format!("cohort {addr} is unreachable: {reason}"));
                }
            }
            Event::Msg { cohort, msg } => self.on_msg(cohort, msg),
        }
    }

    fn on_msg(&mut self, c: usize, msg: Message) {
        if msg.restore_id() != Some(self.plan.restore_id.as_str()) {
            debug!(
                kind = msg.kind(),
                restore_id = msg.restore_id().unwrap_or("-"),
                "coordinator ignores a message of another restore"
            );
            return;
        }
        let now = Instant::now();
        let aborting = self.aborting.is_some();
        let kind = msg.kind();
        let vm_named = |run: &Self, name: &str| {
            let i = run.vm_of(c, name);
            if i.is_none() {
                warn!(cohort = %run.cohorts[c].addr, vm = name, "coordinator ignores an answer about a VM this cohort does not restore");
            }
            i
        };
        match msg {
            Message::LoadFin {
                vm, pages, load_s, ..
            } => {
                if let Some(i) = vm_named(self, &vm) {
                    let v = &mut self.vms[i];
                    if v.load_fin.is_none() {
                        v.load_fin = Some((now, pages, load_s));
                    }
                }
            }
            Message::StartFin {
                vm,
                started_unix_ns,
                ..
            } => {
                if let Some(i) = vm_named(self, &vm) {
                    let v = &mut self.vms[i];
                    if v.start_fin.is_none() {
                        v.start_fin = Some((now, started_unix_ns));
                    }
                }
            }
            Message::RestoreFin { vm, .. } => {
                if let Some(i) = vm_named(self, &vm) {
                    let v = &mut self.vms[i];
                    if v.restore_fin.is_none() {
                        v.restore_fin = Some(now);
                    }
                }
            }
            Message::LoadFailed { vm, error, .. }
            | Message::StartFailed { vm, error, .. }
            | Message::RestoreFailed { vm, error, .. } => {
                let (state, what) = match kind {
                    "LOAD_FAILED" => (VmState::LoadFailed, "failed to load"),
                    "START_FAILED" => (VmState::StartFailed, "failed to start"),
                    _ => (VmState::RestoreFailed, "failed to load the rest of memory"),
                };
                if let Some(i) = vm_named(self, &vm) {
                    // Answers to commands crossing an ABORT say only that.
                    if aborting || self.vms[i].terminal() {
                        return;
                    }
                    self.vms[i].failed = Some((state, error.clone()));
                    self.fail(format!("VM {vm} {what}: {error}"));
                }
            }
            Message::AbortAck {
                aborted, started, ..
            } => {
                if !aborting {
                    return;
                }
                self.cohorts[c].abort_acked = true;
                for (names, state) in [(aborted, VmState::Aborted), (started, VmState::Started)] {
                    for name in names {
                        if let Some(i) = vm_named(self, &name) {
                            self.vms[i].acked = Some(state);
                        }
                    }
                }
            }
            other => {
                warn!(
                    kind = other.kind(),
                    "coordinator ignores a message only a coordinator sends"
                );
            }
        }
    }

    fn report(&self, began_unix_ns: i64) -> RestoreReport {
        let secs = |t: Instant| t.saturating_duration_since(self.t0).as_secs_f64();
        let vms: Vec<VmReport> = self
            .plan
            .vms
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let v = &self.vms[i];
                let cohort = &self.cohorts[self.cohort_of[i]];
                let offset = cohort.clock.map(|(o, _)| o);
                let state = match (&v.failed, v.restore_fin, v.start_fin, v.acked) {
                    (Some((s, _)), _, _, _) => *s,
                    (None, Some(_), _, _) => VmState::Restored,
                    (None, None, Some(_), _) => VmState::Started,
                    (None, None, None, Some(s)) => s,
                    (None, None, None, None) => VmState::Unknown,
                };
                let start_unix_ns = v.start_fin.map(|(_, ns)| ns - offset.unwrap_or(0));
                VmReport {
                    vm: p.vm.clone(),
                    cohort: cohort.addr.clone(),
                    state,
                    ws_pages: p.ws_pages,
                    held: v.load_fin.is_some(),
                    pages: v.load_fin.map(|(_, pages, _)| pages),
                    load_s: v.load_fin.map(|(_, _, s)| s),
                    load_fin_s: v.load_fin.map(|(t, _, _)| secs(t)),
                    start_sent_s: v.start_sent.map(secs),
                    start_unix_ns,
                    start_s: start_unix_ns.map(|ns| (ns - began_unix_ns) as f64 / 1e9),
                    start_fin_latency_s: match (v.start_sent, v.start_fin) {
                        (Some(s), Some((f, _))) => {
                            Some(f.saturating_duration_since(s).as_secs_f64())
                        }
                        _ => None,
                    },
                    restore_fin_s: v.restore_fin.map(secs),
                    clock_offset_ns: offset,
                    error: v.failed.as_ref().map(|(_, e)| e.clone()),
                }
            })
            .collect();
        let rings = self
            .groups
            .groups
            .iter()
            .filter(|m| m.len() > 1)
            .map(|members| {
                let starts: Option<Vec<i64>> =
                    members.iter().map(|&m| vms[m].start_unix_ns).collect();
                RingReport {
                    vms: members.iter().map(|&m| self.name(m).to_owned()).collect(),
                    spread_s: starts
                        .and_then(|s| Some((*s.iter().max()? - *s.iter().min()?) as f64 / 1e9)),
                }
            })
            .collect();
        let cohorts = self
            .cohorts
            .iter()
            .map(|c| CohortReport {
                addr: c.addr.clone(),
                vms: c.vms.iter().map(|&i| self.name(i).to_owned()).collect(),
                reachable: c.lost.is_none(),
                error: c.lost.clone(),
                clock_offset_ns: c.clock.map(|(o, _)| o),
                one_way_delay_ns: c.clock.map(|(_, rtt)| rtt / 2),
                reconnects: c.connections.saturating_sub(1),
            })
            .collect();
        RestoreReport {
            restore_id: self.plan.restore_id.clone(),
            outcome: match &self.aborting {
                None => Outcome::Restored,
                Some((reason, _)) => Outcome::Aborted {
                    reason: reason.clone(),
                },
            },
            began_unix_ns,
            duration_s: secs(Instant::now()),
            vms,
            rings,
            cohorts,
        }
    }
}

/// One cohort's connection, reconnected until the restore ends or the cohort has
/// been silent for `peer`.
async fn link(
    cohort: usize,
    addr: String,
    restore_id: String,
    token: ClusterToken,
    config: CoordinatorConfig,
    mut out: mpsc::UnboundedReceiver<Message>,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut last_heard = Instant::now();
    let lost = |reason: String| {
        let _ = events.send(Event::Lost { cohort, reason });
    };
    loop {
        if last_heard.elapsed() >= config.peer {
            lost(format!(
                "no frame from it for {:.1} s",
                config.peer.as_secs_f64()
            ));
            return;
        }
        let stream = match tokio::time::timeout(config.connect, TcpStream::connect(&addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                debug!(cohort = %addr, "cannot connect: {e}");
                tokio::time::sleep(config.retry).await;
                continue;
            }
            Err(_) => {
                debug!(cohort = %addr, "connect timed out");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (mut reader, mut writer) =
            match client_handshake(stream, &token, config.handshake).await {
                Ok(rw) => rw,
                Err(
                    e @ (WireError::NotAuthenticated
                    | WireError::UnknownVersion(_)
                    | WireError::BadMagic),
                ) => {
                    warn!(cohort = %addr, "coordinator refused the cohort: {}", chain(&e));
                    lost(chain(&e));
                    return;
                }
                Err(e) => {
                    warn!(cohort = %addr, "handshake failed: {}", chain(&e));
                    tokio::time::sleep(config.retry).await;
                    continue;
                }
            };
        last_heard = Instant::now();
        if events.send(Event::Connected { cohort }).is_err() {
            return;
        }
        let (ftx, mut frx) = mpsc::unbounded_channel();
        let reader_task = tokio::spawn(async move {
            loop {
                let r = reader.read().await;
                let stop = r.is_err();
                if ftx.send(r).is_err() || stop {
                    break;
                }
            }
        });
        let mut ping = tokio::time::interval(config.ping);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let reason = loop {
            tokio::select! {
                r = frx.recv() => {
                    let payload = match r {
                        Some(Ok(p)) => p,
                        Some(Err(e)) => break chain(&e),
                        None => break "the reader ended".to_owned(),
                    };
                    last_heard = Instant::now();
                    let msg: Message = match serde_json::from_slice(&payload) {
                        Ok(m) => m,
                        Err(e) => break format!("undecodable message: {e}"),
                    };
                    if let Message::Pong { t1_unix_ns, t2_unix_ns, t3_unix_ns, .. } = msg {
                        let t4 = unix_now_ns();
                        let offset_ns = ((t2_unix_ns - t1_unix_ns) + (t3_unix_ns - t4)) / 2;
                        let rtt_ns = (t4 - t1_unix_ns) - (t3_unix_ns - t2_unix_ns);
                        let _ = events.send(Event::Clock { cohort, offset_ns, rtt_ns });
                    } else if events.send(Event::Msg { cohort, msg }).is_err() {
                        reader_task.abort();
                        return;
                    }
                }
                m = out.recv() => {
                    let Some(m) = m else {
                        reader_task.abort();
                        return;
                    };
                    let bytes = match serde_json::to_vec(&m) {
                        Ok(b) => b,
                        Err(e) => {
                            warn!("cannot encode {}: {e}", m.kind());
                            continue;
                        }
                    };
                    if let Err(e) = writer.write(&bytes).await {
                        break chain(&e);
                    }
                }
                _ = ping.tick() => {
                    if last_heard.elapsed() >= config.peer {
                        reader_task.abort();
                        lost(format!("no frame from it for {:.1} s", config.peer.as_secs_f64()));
                        return;
                    }
                    let ping = Message::Ping { restore_id: restore_id.clone(), t1_unix_ns: unix_now_ns() };
                    let bytes = match serde_json::to_vec(&ping) {
                        Ok(b) => b,
                        Err(e) => break format!("cannot encode PING: {e}"),
                    };
                    if let Err(e) = writer.write(&bytes).await {
                        break chain(&e);
                    }
                }
            }
        };
        reader_task.abort();
        warn!(cohort = %addr, "coordinator dropped the connection: {reason}; reconnecting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
