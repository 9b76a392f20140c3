//! Restore planning, without I/O: what one restore of a snapshot does (HotRestore's
//! working-set restore, its elastic variant, lazy, eager, QEMU's stock path) and
//! what its report says at each phase.
//!
//! [`plan`] turns facts about the snapshot and the host (its trace, its disks, how
//! far it is trusted) and the request into a [`Plan`]: the mode after its
//! fallbacks (a working-set or elastic restore without a trace runs lazily, one
//! whose disks are on Rebound's backend or whose image cannot be trusted to stay
//! put runs eagerly), the working set to read before the start, the background
//! loader's order (first-access-first-load, FAFL, or file order), the RAM check
//! ([`check::decide`]) and the report as it begins.
//!
//! [`Restore`] then follows one restore through its phases: spawned, device state
//! loaded, held or started, first answer, loader done, settled. Each [`Event`]
//! (a fact the daemon saw, with the instant it saw it) fills the report fields a
//! user reads and returns the [`Action`]s the daemon carries out next. The report
//! is the state: it lives where the daemon publishes it, and each event is applied
//! to it under the daemon's lock, from whichever task saw the fact.

use std::time::Instant;

use rebound_api::{LoadPath, RamCheck as AskedCheck, ReplayedFrames, RestoreMode, RestoreReport};

use crate::check::{self, Decision, RamCheck, Trust};
use crate::load::RestOrder;
use crate::trace::TracePage;

/// Why a snapshot cannot be restored as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("the snapshot's VM had disks served by Rebound's backend: a recovery VM cannot be restored from it yet (boot it: drop --recover-from)")]
    BackendRecovery,
    #[error("the snapshot has {0} RAM blocks; restores of guests with hot-plugged memory are not supported yet")]
    RamBlocks(usize),
    #[error("the snapshot's RAM block {id:?} is {size} bytes but its VM spec says {mib} MiB of memory: the manifest does not fit together")]
    RamSize { id: String, size: u64, mib: u64 },
    #[error("the snapshot has no stock migration stream (stock.mig): take it with `rebound vm snapshot --stock`")]
    NoStockStream,
    #[error("the page server cannot restore this snapshot here: {0} (--path auto falls back to the page cache)")]
    NoPageServer(String),
}

/// Checks, before anything is read, that the snapshot's parts fit together:
/// `blocks` are its RAM blocks (id, bytes), `memory_mib` its VM spec's memory.
pub fn check_fit(
    on_backend: bool,
    recovering: bool,
    blocks: &[(&str, u64)],
    memory_mib: u64,
) -> Result<(), PlanError> {
    if on_backend && recovering {
        return Err(PlanError::BackendRecovery);
    }
    let [(id, size)] = blocks else {
        return Err(PlanError::RamBlocks(blocks.len()));
    };
    if memory_mib.checked_mul(1 << 20) != Some(*size) {
        return Err(PlanError::RamSize {
            id: id.to_string(),
            size: *size,
            mib: memory_mib,
        });
    }
    Ok(())
}

/// The snapshot's working-set trace, as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceFacts {
    /// Pages in the trace.
    pub pages: u64,
    /// The elastic working set its manifest's estimate gives.
    pub default_elastic_pages: u64,
    /// Where it came from (`post-snapshot`, `restore`).
    pub source: String,
}

/// What a plan is made from: the request, the snapshot and the host.
#[derive(Debug, Clone)]
pub struct Facts {
    pub vm: String,
    pub snapshot: String,
    pub asked: RestoreMode,
    pub rest_order: rebound_api::RestOrder,
    /// Working-set pages asked for (elastic).
    pub ws_pages: Option<u64>,
    pub ram_check: AskedCheck,
    /// Some disk is served by Rebound's backend (which needs shared RAM).
    pub on_backend: bool,
    pub trust: Trust,
    pub trace: Option<TraceFacts>,
    /// The RAM image's checksum chunks.
    pub chunks: u64,
    /// The snapshot has QEMU's own stream (`stock.mig`).
    pub has_stock_stream: bool,
    /// The path asked for.
    pub path: LoadPath,
    /// Why the page server cannot run for this snapshot on this host, if it cannot.
    pub no_page_server: Option<String>,
    /// What of the snapshot's spec was not used.
    pub notes: Vec<String>,
}

/// Where the guest's RAM comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The image mapped private: the kernel loads each page on first touch.
    PrivateImage,
    /// A shared RAM file in the run dir, filled by a checked copy of the image.
    SharedCopy,
    /// A fresh shared RAM file, filled by QEMU's own full stream.
    SharedStream,
    /// A fresh shared RAM file, filled through postcopy by Rebound's page server.
    Served,
}

impl Memory {
    /// The guest's RAM is the run dir's shared file from the start.
    pub fn shared(self) -> bool {
        self != Memory::PrivateImage
    }
}

/// What is read before the guest's first instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeforeStart {
    Nothing,
    /// The whole image, copied into the shared RAM file.
    CopyImage,
    /// The first `n` pages of the trace, in first-access order.
    WorkingSet(usize),
}

/// How the RAM image is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checking {
    /// Nothing to check (stock, or `--ram-check off`).
    None,
    /// Compared chunk by chunk as it is copied (eager).
    AsCopied,
    /// Every chunk before the start.
    FullBeforeStart,
    /// By the background loader, as it completes chunks.
    WithLoader,
    /// By a checker of its own beside the running guest (lazy).
    BesideGuest,
    /// By the page server, each chunk before any of its pages is sent.
    AsServed,
}

/// What one restore does.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The mode after its fallbacks.
    pub mode: RestoreMode,
    pub memory: Memory,
    pub before_start: BeforeStart,
    /// The background loader's order, when one runs (working-set, elastic).
    pub loader: Option<RestOrder>,
    pub ram_check: Decision,
    pub checking: Checking,
    /// Migration capability `x-ignore-shared` (off for QEMU's stock stream).
    pub ignore_shared: bool,
    /// The stream QEMU loads is the snapshot's `stock.mig` (else its device state).
    pub stock_stream: bool,
    /// The report as the restore begins.
    pub report: RestoreReport,
}

/// Plans a restore; `facts.trust` matters only for a mode that maps the image.
pub fn plan(facts: Facts) -> Result<Plan, PlanError> {
    let mut notes = facts.notes;
    let mut mode = facts.asked;
    let ws_mode = matches!(mode, RestoreMode::WorkingSet | RestoreMode::Elastic);
    if facts.trace.is_none() && ws_mode {
        notes.push(format!(
            "the snapshot has no working-set trace: restored lazily instead of {}; this restore records one",
            mode.as_str()
        ));
        mode = RestoreMode::Lazy;
    }
    if facts.on_backend && !matches!(mode, RestoreMode::Eager | RestoreMode::Stock) {
        notes.push(format!(
            "its disks are served by Rebound's backend, which needs the guest's RAM shared: restored eagerly instead of {}",
            mode.as_str()
        ));
        mode = RestoreMode::Eager;
    }
    let asked = match facts.ram_check {
        AskedCheck::Auto => None,
        AskedCheck::Full => Some(RamCheck::Full),
        AskedCheck::Background => Some(RamCheck::Background),
        AskedCheck::Off => Some(RamCheck::Off),
    };
    let maps = matches!(
        mode,
        RestoreMode::Lazy | RestoreMode::WorkingSet | RestoreMode::Elastic
    );
    let mut ram_check = check::decide(asked, facts.trust, maps);
    if ram_check.copy_instead {
        mode = RestoreMode::Eager;
    }
    // The page server: where it can run, and where the image is not to be copied
    // instead (it reads the image after its chunk check, so a copy is the safe
    // answer to an image others can change).
    let served = match (mode, facts.path) {
        (RestoreMode::Stock, _) | (_, LoadPath::PageCache) => false,
        (_, asked_path) => {
            let why = if facts.on_backend {
                Some("its disks are served by Rebound's vhost-user backend, which does not take part in postcopy".to_string())
            } else if facts.trust == Trust::Mutable {
                Some(
                    "its RAM image can be changed by another user, so it is copied, checked, first"
                        .to_string(),
                )
            } else {
                facts.no_page_server.clone()
            };
            match why {
                None => true,
                Some(w) if asked_path == LoadPath::PageServer => {
                    return Err(PlanError::NoPageServer(w))
                }
                Some(w) => {
                    notes.push(format!(
                        "restored through the page cache, not the page server: {w}"
                    ));
                    false
                }
            }
        }
    };
    if served {
        // The server checks each chunk before the guest can see any of its pages.
        if ram_check.check != RamCheck::Off {
            ram_check.check = RamCheck::Full;
            ram_check.note = None;
        }
    }
    notes.extend(ram_check.note.clone());
    if mode == RestoreMode::Stock && !facts.has_stock_stream {
        return Err(PlanError::NoStockStream);
    }
    let ws = match (&facts.trace, mode) {
        (Some(t), RestoreMode::WorkingSet) => t.pages,
        (Some(t), RestoreMode::Elastic) => {
            let n = facts.ws_pages.unwrap_or(t.default_elastic_pages);
            n.min(t.pages)
        }
        _ => 0,
    };
    let (memory, before_start) = match mode {
        RestoreMode::Eager if served => (Memory::Served, BeforeStart::CopyImage),
        RestoreMode::Lazy if served => (Memory::Served, BeforeStart::Nothing),
        RestoreMode::WorkingSet | RestoreMode::Elastic if served => {
            (Memory::Served, BeforeStart::WorkingSet(ws as usize))
        }
        RestoreMode::Eager => (Memory::SharedCopy, BeforeStart::CopyImage),
        RestoreMode::Stock => (Memory::SharedStream, BeforeStart::Nothing),
        RestoreMode::Lazy => (Memory::PrivateImage, BeforeStart::Nothing),
        RestoreMode::WorkingSet | RestoreMode::Elastic => {
            (Memory::PrivateImage, BeforeStart::WorkingSet(ws as usize))
        }
    };
    let loader =
        (matches!(before_start, BeforeStart::WorkingSet(_)) && !served).then_some(facts.rest_order);
    let checking = match (mode, ram_check.check) {
        (RestoreMode::Stock, _) => Checking::None,
        (_, RamCheck::Off) if served => Checking::None,
        _ if served => Checking::AsServed,
        (RestoreMode::Eager, _) => Checking::AsCopied,
        (_, RamCheck::Off) => Checking::None,
        (_, RamCheck::Full) => Checking::FullBeforeStart,
        (RestoreMode::Lazy, RamCheck::Background) => Checking::BesideGuest,
        (_, RamCheck::Background) => Checking::WithLoader,
    };
    let stock = mode == RestoreMode::Stock;
    let report = RestoreReport {
        vm: facts.vm,
        snapshot: facts.snapshot,
        mode,
        rest_order: facts.rest_order,
        path: (!stock).then_some(if served {
            LoadPath::PageServer
        } else {
            LoadPath::PageCache
        }),
        phase: "loading".into(),
        notes,
        trace_source: facts.trace.map(|t| t.source),
        ram_check: (!stock).then_some(as_api(ram_check.check)),
        ram_chunks: if stock { 0 } else { facts.chunks },
        working_set_pages: ws,
        ..Default::default()
    };
    Ok(Plan {
        mode,
        memory,
        before_start,
        loader,
        ram_check,
        checking,
        ignore_shared: !stock,
        stock_stream: stock,
        report,
    })
}

/// The report's name for a check.
pub fn as_api(c: RamCheck) -> AskedCheck {
    match c {
        RamCheck::Full => AskedCheck::Full,
        RamCheck::Background => AskedCheck::Background,
        RamCheck::Off => AskedCheck::Off,
    }
}

/// When a restore guest moves onto shared RAM (settles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleAfter {
    /// Once the background loader ends (and the watch window is over).
    Loader,
    /// Once the watch window is over.
    Window,
    /// Never: its RAM is shared from the start.
    Never,
}

/// A fact the daemon saw during one restore.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// What was read and checked before the start: `loaded` (pages, bytes, seconds)
    /// when something was read, chunks checked, seconds of a full check.
    LoadedBeforeStart {
        loaded: Option<(u64, u64, f64)>,
        chunks_checked: u64,
        full_check_s: Option<f64>,
    },
    /// QEMU loaded the device state; `replayed` frames were handed to its NICs.
    DeviceStateLoaded {
        accel: String,
        replayed: Vec<ReplayedFrames>,
    },
    /// The vCPUs run (after `cont`), QEMU's `RESUME` stamp if new, and the bytes a
    /// held restore's loader read while it waited.
    Started {
        at: Instant,
        resume_stamp: Option<i64>,
        loaded_while_held: Option<u64>,
    },
    /// A checker counted `n` chunks checked so far.
    ChunksChecked(u64),
    /// The lazy restore's checker could not start (why).
    CheckerUnavailable(String),
    /// The background loader ended (`stopped`: the VM stopped it).
    LoaderDone {
        at: Instant,
        pages: u64,
        seconds: f64,
        stopped: bool,
        chunks_checked: u64,
    },
    /// The background loader failed (not a damaged chunk).
    LoaderFailed { error: String, chunks_checked: u64 },
    /// A chunk of the image is damaged, or the image changed (`running`: a QEMU
    /// still runs the guest).
    Damaged { error: String, running: bool },
    /// The watch window is over: the guest's answer, its counters, its touches.
    WatchEnded(&'a WatchEnd<'a>),
    /// The guest now runs on shared RAM.
    Settled { at: Instant },
    /// The page server sent every page and the destination confirmed it.
    Served(ServerEnd),
}

/// What a page server did, once it ended well.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerEnd {
    pub at: Instant,
    /// Pages pushed after the devices loaded (requests not counted).
    pub pushed_pages: u64,
    /// Requests after the start: one per guest fault on a page not there yet.
    pub requests_after_start: u64,
    pub service_p50_us: Option<f64>,
    pub service_p99_us: Option<f64>,
    /// Bytes it read from the image after the start.
    pub bytes_after_start: u64,
    /// Chunks it checked, and the distinct pages the guest asked for.
    pub chunks_checked: u64,
    pub requested_pages: u64,
    /// The requests were saved as (or into) the snapshot's trace; why not if that failed.
    pub recorded: Result<bool, String>,
}

/// What the watch window saw.
#[derive(Debug, Clone)]
pub struct WatchEnd<'a> {
    pub started: Instant,
    /// When the guest's service first answered.
    pub answered: Option<Instant>,
    /// QEMU's (major faults, bytes read) at the start and at the window's end.
    pub counters: Option<((u64, u64), (u64, u64))>,
    /// Bytes the background loader read after the start.
    pub loader_bytes_after_start: u64,
    /// The pages the guest touched, when the trace worked.
    pub touched: Option<&'a [TracePage]>,
    /// The working set read before the start.
    pub loaded: &'a [TracePage],
    /// Whether the touches were saved as the snapshot's trace; why not, if that failed.
    pub recorded: Result<bool, String>,
    pub watch_s: f64,
}

/// What the daemon does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Record the guest's first touches, armed before its first instruction
    /// (`held`: its window begins at the start).
    ArmTrace { held: bool },
    /// Start the background loader in this order.
    StartLoader(RestOrder),
    /// Start the lazy restore's checker beside the guest.
    CheckBesideGuest,
    /// Stop the guest at any change of the image it maps.
    GuardImage,
    /// Publish the report.
    Publish,
    /// Start the vCPUs.
    Cont,
    /// Save the touches as the snapshot's trace.
    RecordTrace,
    /// Log the restore's failure (`RestoreFailed`).
    Fail(String),
    /// Stop the guest's QEMU.
    StopGuest,
}

/// One restore after its plan: the constants its events need.
#[derive(Debug, Clone)]
pub struct Restore {
    pub t0: Instant,
    pub mode: RestoreMode,
    pub memory: Memory,
    pub loader: Option<RestOrder>,
    pub checking: Checking,
    pub held: bool,
    /// The snapshot had a trace (else this restore records one).
    pub had_trace: bool,
}

impl Restore {
    /// `t0`: when the request came in.
    pub fn new(plan: &Plan, t0: Instant, held: bool, had_trace: bool) -> Restore {
        Restore {
            t0,
            mode: plan.mode,
            memory: plan.memory,
            loader: plan.loader,
            checking: plan.checking,
            held,
            had_trace,
        }
    }

    /// When the guest settles onto shared RAM.
    pub fn settle_after(&self) -> SettleAfter {
        match (self.memory, self.loader) {
            (m, _) if m.shared() => SettleAfter::Never,
            (_, Some(_)) => SettleAfter::Loader,
            (_, None) => SettleAfter::Window,
        }
    }

    /// Whether the watch window's touches are to be saved as the snapshot's trace.
    pub fn records_trace(&self, touched: Option<&[TracePage]>) -> bool {
        !self.had_trace && touched.is_some_and(|t| !t.is_empty())
    }

    /// Applies `ev` to the restore's report; what to do next.
    pub fn on(&self, rep: &mut RestoreReport, ev: Event<'_>) -> Vec<Action> {
        let since = |at: Instant| at.saturating_duration_since(self.t0).as_secs_f64();
        match ev {
            Event::LoadedBeforeStart {
                loaded,
                chunks_checked,
                full_check_s,
            } => {
                if self.mode != RestoreMode::Stock {
                    rep.ram_chunks_checked = chunks_checked;
                    rep.ram_chunks_checked_before_start = chunks_checked;
                    rep.ram_check_s = full_check_s;
                }
                if let Some((pages, bytes, secs)) = loaded {
                    rep.pages_loaded_before_start = pages;
                    rep.bytes_loaded_before_start = bytes;
                    rep.load_before_start_s = secs;
                }
                Vec::new()
            }
            Event::DeviceStateLoaded { accel, replayed } => {
                rep.replayed_frames.extend(replayed);
                rep.accel = Some(accel);
                let mut out = Vec::new();
                // Held: the trace is armed and the loader runs now, so that the
                // start is a bare `cont` with more of the working set in memory.
                // The page server's requests are the trace: no page-table watch.
                let traced = self.memory != Memory::Served;
                if self.held {
                    out.extend(traced.then_some(Action::ArmTrace { held: true }));
                    out.extend(self.loader.map(Action::StartLoader));
                    rep.phase = "held".into();
                }
                if self.checking == Checking::BesideGuest {
                    out.push(Action::CheckBesideGuest);
                }
                out.push(Action::Publish);
                if !self.memory.shared() {
                    out.push(Action::GuardImage);
                }
                if !self.held {
                    out.extend(traced.then_some(Action::ArmTrace { held: false }));
                    out.push(Action::Cont);
                }
                out
            }
            Event::Started {
                at,
                resume_stamp,
                loaded_while_held,
            } => {
                let to_running = since(at);
                rep.time_to_running_s = Some(to_running);
                rep.started_unix_ns = resume_stamp;
                rep.phase = "watching".into();
                if matches!(self.memory, Memory::SharedCopy | Memory::SharedStream) {
                    // Every page was read before the start.
                    rep.memory_loaded_s = Some(to_running);
                }
                if let Some(b) = loaded_while_held {
                    rep.bytes_loaded_while_held = b;
                }
                match (self.held, self.loader) {
                    (false, Some(order)) => vec![Action::Publish, Action::StartLoader(order)],
                    _ => vec![Action::Publish],
                }
            }
            Event::ChunksChecked(n) => {
                rep.ram_chunks_checked = n;
                vec![Action::Publish]
            }
            Event::CheckerUnavailable(why) => {
                rep.ram_check = Some(AskedCheck::Off);
                rep.notes.push(format!(
                    "the RAM check could not start ({why}): the guest runs unchecked"
                ));
                vec![Action::Publish]
            }
            Event::LoaderDone {
                at,
                pages,
                seconds,
                stopped,
                chunks_checked,
            } => {
                if chunks_checked > 0 {
                    rep.ram_chunks_checked = chunks_checked;
                }
                rep.background_pages = pages;
                rep.background_s = Some(seconds);
                if !stopped && rep.memory_loaded_s.is_none() {
                    rep.memory_loaded_s = Some(since(at));
                }
                vec![Action::Publish]
            }
            Event::LoaderFailed {
                error,
                chunks_checked,
            } => {
                if chunks_checked > 0 {
                    rep.ram_chunks_checked = chunks_checked;
                }
                rep.background_error = Some(error);
                vec![Action::Publish]
            }
            Event::Damaged { error, running } => Restore::damaged(rep, error, running),
            Event::WatchEnded(w) => {
                self.watch_ended(rep, w);
                vec![Action::Publish]
            }
            Event::Served(e) => {
                let at = since(e.at);
                Restore::served(rep, at, e);
                vec![Action::Publish]
            }
            Event::Settled { at } => {
                // A lazy restore's memory is complete only from here on.
                if rep.memory_loaded_s.is_none() {
                    rep.memory_loaded_s = Some(since(at));
                }
                vec![Action::Publish]
            }
        }
    }

    /// The page server's end, `memory_loaded_s` after the request: its figures, the
    /// trace it recorded, and `done` if the watch window is over. Needs nothing of
    /// the restore: a daemon restarted after the request applies it too.
    pub fn served(rep: &mut RestoreReport, memory_loaded_s: f64, e: ServerEnd) {
        rep.memory_loaded_s = Some(memory_loaded_s);
        rep.background_pages = e.pushed_pages;
        rep.page_requests_after_start = Some(e.requests_after_start);
        rep.request_service_p50_us = e.service_p50_us;
        rep.request_service_p99_us = e.service_p99_us;
        rep.bytes_read_after_start = Some(e.bytes_after_start);
        rep.major_faults_after_start = Some(e.requests_after_start);
        rep.ram_chunks_checked = rep.ram_chunks_checked.max(e.chunks_checked);
        rep.pages_touched_after_start = e.requested_pages;
        match e.recorded {
            Ok(r) => rep.trace_recorded |= r,
            Err(why) => rep.notes.push(format!(
                "the page requests could not be saved as the snapshot's trace: {why}"
            )),
        }
        if rep.phase == "serving" {
            rep.phase = "done".into();
        }
    }

    /// A damaged or changed image found (`running`: a QEMU still runs the guest):
    /// the restore fails, and its guest is stopped. Needs nothing of the restore: a
    /// checker that outlives it applies it too.
    pub fn damaged(rep: &mut RestoreReport, error: String, running: bool) -> Vec<Action> {
        let error = if running {
            format!("{error}: the guest was stopped")
        } else {
            error
        };
        rep.phase = "failed".into();
        rep.error = Some(error.clone());
        let mut out = vec![Action::Publish, Action::Fail(error)];
        if running {
            out.push(Action::StopGuest);
        }
        out
    }

    fn watch_ended(&self, rep: &mut RestoreReport, w: &WatchEnd<'_>) {
        if let Some(at) = w.answered {
            rep.time_to_responsive_s = Some(since_of(self.t0, at));
            rep.responsive_after_start_s = Some(since_of(w.started, at));
        }
        // The page server reads the image, not QEMU: its own figures come in
        // `Served`.
        if let Some((b, a)) = w.counters.filter(|_| self.memory != Memory::Served) {
            rep.major_faults_after_start = Some(a.0.saturating_sub(b.0));
            rep.bytes_read_after_start = Some(a.1.saturating_sub(b.1) + w.loader_bytes_after_start);
        }
        let mut notes = Vec::new();
        if w.answered.is_none() {
            notes.push("no service answer to time (no service port or readiness probe, or none within 60 s)".to_string());
        }
        if let Err(e) = &w.recorded {
            notes.push(format!("the trace could not be saved in the snapshot: {e}"));
        }
        if let Some(t) = w.touched {
            rep.pages_touched_after_start = t.len() as u64;
            if let Some((h, a)) = crate::trace::hit_rate_accuracy(w.loaded, t) {
                rep.hit_rate = Some(h);
                rep.accuracy = Some(a);
            } else if !w.loaded.is_empty() {
                rep.notes.push(format!(
                    "hit rate and accuracy need {} touched pages; the guest touched {} in {} s",
                    w.loaded.len(),
                    t.len(),
                    w.watch_s
                ));
            }
        }
        rep.trace_recorded |= matches!(w.recorded, Ok(true));
        rep.notes.extend(notes);
        // On the page server the report is whole at the server's end (its requests,
        // the trace it recorded): until then the guest runs while it is `serving`.
        rep.phase = if self.memory == Memory::Served && rep.memory_loaded_s.is_none() {
            "serving".into()
        } else {
            "done".into()
        };
    }
}

fn since_of(from: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(from).as_secs_f64()
}

#[cfg(test)]
#[path = "restore_plan_tests.rs"]
mod tests;
