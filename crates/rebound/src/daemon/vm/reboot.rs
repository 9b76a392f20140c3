//! Reboots, cold and warm.
//!
//! A warm reboot keeps the guest's file cache without trusting any of the guest's old
//! memory: before the reboot the agent lists which pages of the files under /data
//! are cached (the list is saved in the VM's directory); the guest syncs and reboots
//! in the same QEMU; once the new kernel's agent is up, it gets the list back and
//! reads those pages again. The reads go to the disk, which Rebound's block backend
//! serves from its host cache (the backend process outlives the reboot, and admits
//! only blocks equal to the disk), so the pages come back at memory speed and can be
//! neither stale nor damaged: the content never comes from the old guest memory.
//! A list that is missing or damaged makes the reboot cold, and the report says why.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_api::{EventData, RebootReport, RebootRequest};
use rebound_vmm::agent::{AgentLink, AgentMsg};
use rebound_vmm::warm::CacheList;

use super::owner::{recv_opt, Owner};
use crate::daemon::error::OpError;

/// How long a rebooting guest gets to bring its agent up again.
const REBOOT_WAIT: Duration = Duration::from_secs(180);
/// How long a guest that synced and called reboot(2) gets to reset the machine (a
/// healthy one takes well under a second, under TCG too) before it is reset.
const DOWN_GRACE: Duration = Duration::from_secs(15);
/// How long a guest gets from its reset to its agent coming up before it is reset again.
const REBOOT_GRACE: Duration = Duration::from_secs(45);
/// How long the read-back may take (it runs while the service already serves).
const PREFETCH_WAIT_S: u64 = 600;

impl Owner {
    pub(super) async fn reboot(&mut self, req: RebootRequest) -> Result<RebootReport, OpError> {
        self.require_running("only a running guest can be rebooted")?;
        let mut rep = RebootReport {
            name: self.vm.name.clone(),
            warm: req.warm,
            ..Default::default()
        };
        let list_path = self.vm.dir.warm_cache_list();
        let agent = self
            .agent
            .clone()
            .filter(|a| a.is_connected() && self.vm.record().kernel_release.is_some());
        if req.warm {
            let t_list = Instant::now();
            match &agent {
                Some(a) => match a.cachelist().await {
                    Ok(g) => {
                        let (list, dropped) = CacheList::from_guest(&g.text);
                        if dropped > 0 {
                            tracing::warn!(vm = %self.vm.name, dropped, "malformed cache-list lines from the guest dropped");
                        }
                        list.save(&list_path).map_err(|e| {
                            OpError::Io(e.to_string(), std::io::Error::other("warm-cache list"))
                        })?;
                        rep.cached_files = list.files;
                        rep.cached_pages = list.pages;
                        rep.list_ms = Some(t_list.elapsed().as_millis() as u64);
                    }
                    Err(e) => {
                        let _ = std::fs::remove_file(&list_path);
                        rep.cold_reason =
                            Some(format!("the guest did not list its cached pages: {e}"));
                    }
                },
                None => {
                    rep.cold_reason = Some(
                        "no guest agent to list the page cache (the host block cache stays warm)"
                            .into(),
                    )
                }
            }
        }
        // Not ready until the rebooted guest says so again.
        self.vm.update(|r| r.ready = false);
        let t0 = Instant::now();
        rep.how = match (&agent, req.hard) {
            (Some(a), false) => {
                a.reboot()?;
                "agent"
            }
            _ => {
                let q = self.qmp.as_ref().ok_or(OpError::NoQmp)?;
                q.execute("system_reset", None).await?;
                "reset"
            }
        }
        .into();
        self.event(EventData::RebootRequested {
            warm: req.warm,
            how: rep.how.clone(),
            cached_pages: rep.cached_pages,
        });
        if agent.is_none() {
            // Nothing to wait for here: the readiness probe marks the guest ready.
            if let Some(r) = rep.cold_reason.clone() {
                self.event(EventData::WarmCacheCold { reason: r });
            }
            return Ok(rep);
        }
        // The new boot's agent says `ready` with an uptime shorter than the time since
        // the request: an old `ready` (a late answer to `hello`) is not taken for it.
        let booted = move |s: &Seen| {
            matches!(s, Seen::Agent(AgentMsg::Ready(i))
                if i.uptime_ms <= t0.elapsed().as_millis() as u64 + 1000)
        };
        // A guest kernel can hang on its way down (seen here: a soft lockup in
        // ksoftirqd while rebooting under network load; a DAX guest of the reboot
        // bench that never reset). Once the agent says it has synced and calls
        // reboot(2), the machine must reset within moments, and the new boot's agent
        // must come up within a grace period; otherwise the machine is reset: nothing
        // unsynced is lost. An agent that does not say so (an older image) is waited
        // for as long as any reboot.
        let (mut synced, mut up) = (false, false);
        self.pump(std::future::pending::<()>(), REBOOT_WAIT, |s| {
            synced |= matches!(s, Seen::Agent(AgentMsg::Rebooting));
            up |= booted(&s);
            synced || up
        })
        .await?;
        if synced && !up {
            let mut reset = false;
            let down = self
                .pump(std::future::pending::<()>(), DOWN_GRACE, |s| {
                    reset |= matches!(s, Seen::Qmp("RESET"));
                    up |= booted(&s);
                    reset || up
                })
                .await;
            match down {
                Err(OpError::Timeout(..)) => {
                    self.force_reset(&mut rep, req.warm, "reset within", DOWN_GRACE)
                        .await?
                }
                r => {
                    r?;
                }
            }
        }
        if synced && !up {
            match self
                .pump(std::future::pending::<()>(), REBOOT_GRACE, |s| booted(&s))
                .await
            {
                Err(OpError::Timeout(..)) => {
                    self.force_reset(&mut rep, req.warm, "come back within", REBOOT_GRACE)
                        .await?;
                    self.pump(std::future::pending::<()>(), REBOOT_WAIT, |s| booted(&s))
                        .await?;
                }
                r => {
                    r?;
                }
            }
        }
        let after_ms = t0.elapsed().as_millis() as u64;
        rep.reboot_ms = Some(after_ms);
        self.event(EventData::Rebooted { after_ms });
        if !req.warm || rep.cold_reason.is_some() {
            if let Some(r) = rep.cold_reason.clone() {
                self.event(EventData::WarmCacheCold { reason: r });
            }
            return Ok(rep);
        }
        let Some(a) = self.agent.clone() else {
            return Ok(rep);
        };
        let got = self
            .pump(
                read_back(a, list_path, "the reboot"),
                REBOOT_WAIT * 4,
                |_| false,
            )
            .await?;
        match got {
            Some(Ok(p)) => {
                self.event(EventData::Prefetched(p.clone()));
                rep.prefetch = Some(p);
            }
            Some(Err(e)) => {
                let reason = rebound_errors::chain(&e);
                self.event(EventData::WarmCacheCold {
                    reason: reason.clone(),
                });
                rep.cold_reason = Some(reason);
            }
            None => {}
        }
        Ok(rep)
    }

    /// Waits for `fut` while still handling what QEMU and the agent report (a job
    /// holds the owner's loop): `Some(output)` when `fut` ends, `None` when an agent
    /// message or a QEMU event matches `want`. A guest that dies meanwhile is handed to its crash
    /// policy and the wait fails.
    pub(super) async fn pump<T>(
        &mut self,
        fut: impl Future<Output = T>,
        limit: Duration,
        mut want: impl FnMut(Seen) -> bool,
    ) -> Result<Option<T>, OpError> {
        let deadline = tokio::time::Instant::now() + limit;
        tokio::pin!(fut);
        loop {
            tokio::select! {
                r = &mut fut => return Ok(Some(r)),
                m = recv_opt(&mut self.agent_msgs) => match m {
                    Some(m) => {
                        let hit = want(Seen::Agent(&m));
                        self.on_agent(m);
                        if hit {
                            return Ok(None);
                        }
                    }
                    None => self.agent_msgs = None,
                },
                e = recv_opt(&mut self.qmp_events) => match e {
                    Some(ev) => {
                        let hit = want(Seen::Qmp(&ev.event));
                        if let Some(cause) = self.on_qmp(ev) {
                            self.respond_to_crash(cause).await;
                            return Err(OpError::Unreachable(
                                self.vm.name.clone(),
                                "rebooted".into(),
                                self.vm.record().state,
                            ));
                        }
                        if hit {
                            return Ok(None);
                        }
                    }
                    None => {
                        self.on_qemu_gone().await;
                        return Err(OpError::Unreachable(
                            self.vm.name.clone(),
                            "rebooted".into(),
                            self.vm.record().state,
                        ));
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(OpError::Timeout(
                        limit.as_millis() as u64,
                        "the rebooted guest's agent".into(),
                    ));
                }
            }
        }
    }
}

/// What [`Owner::pump`] shows its caller: an agent message or a QEMU event's name.
pub(super) enum Seen<'a> {
    Agent(&'a AgentMsg),
    Qmp(&'a str),
}

impl Owner {
    /// Resets a guest that did not `what` `grace` of its reboot(2).
    async fn force_reset(
        &mut self,
        rep: &mut RebootReport,
        warm: bool,
        what: &str,
        grace: Duration,
    ) -> Result<(), OpError> {
        tracing::warn!(vm = %self.vm.name, "the guest did not {what} {} s of its reboot(2): resetting it", grace.as_secs());
        let q = self.qmp.as_ref().ok_or(OpError::NoQmp)?;
        q.execute("system_reset", None).await?;
        rep.how = "agent+reset".into();
        self.event(EventData::RebootRequested {
            warm,
            how: rep.how.clone(),
            cached_pages: rep.cached_pages,
        });
        Ok(())
    }

    /// For `--on-crash ... --warm`: lists the running guest's cache in the background
    /// (a crash gives no chance to ask), keeping the last good list on disk.
    pub(super) fn refresh_warm_list(&mut self) {
        let rec = self.vm.record();
        if !rec.spec.crash.warm || rec.state != rebound_api::VmState::Running || !rec.ready {
            return;
        }
        if self.warm_listing.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let Some(agent) = self.agent.clone().filter(|a| a.is_connected()) else {
            return;
        };
        let (path, name) = (self.vm.dir.warm_cache_list(), self.vm.name.clone());
        self.warm_listing = Some(tokio::spawn(async move {
            match agent.cachelist().await {
                Ok(g) => {
                    let (list, _) = CacheList::from_guest(&g.text);
                    if let Err(e) = list.save(&path) {
                        tracing::warn!(vm = %name, "{e}");
                    }
                }
                Err(e) => tracing::debug!(vm = %name, "cache list: {e}"),
            }
        }));
    }

    /// The recovery VM of a `--warm` crash policy is up: read the last list back in
    /// the background (the service already serves; the crash's dump goes on).
    pub(super) fn warm_recovery(&mut self) {
        if !self.vm.record().spec.crash.warm {
            return;
        }
        let Some(agent) = self.agent.clone() else {
            return;
        };
        let vm = self.vm.clone();
        tokio::spawn(async move {
            let d = match read_back(agent, vm.dir.warm_cache_list(), "the recovery VM").await {
                Ok(p) => EventData::Prefetched(p),
                Err(e) => EventData::WarmCacheCold {
                    reason: rebound_errors::chain(&e),
                },
            };
            if let Err(e) = vm.events.append(d) {
                tracing::error!(vm = %vm.name, "{}", rebound_errors::chain(&e));
            }
        });
    }
}

/// Why the page cache stays cold after a warm reboot or recovery (`who` names what
/// goes on cold). The cause comes first in the report's reason, as it always has.
#[derive(Debug, thiserror::Error)]
enum Cold {
    #[error("{source}: {who} is cold")]
    List {
        who: &'static str,
        source: rebound_vmm::warm::WarmError,
    },
    #[error("the guest did not read its cache back: {source}: {who} is cold")]
    Prefetch {
        who: &'static str,
        source: rebound_vmm::agent::AgentError,
    },
}

/// Loads the saved list and has the guest read its pages back: what it read, or why
/// the cache stays cold.
async fn read_back(
    agent: Arc<AgentLink>,
    list: PathBuf,
    who: &'static str,
) -> Result<rebound_api::PrefetchReport, Cold> {
    let list = CacheList::load(&list).map_err(|source| Cold::List { who, source })?;
    agent
        .prefetch(&list.chunks(), PREFETCH_WAIT_S)
        .await
        .map_err(|source| Cold::Prefetch { who, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cold_reason_names_its_cause_first_and_once() {
        let e = Cold::Prefetch {
            who: "the reboot",
            source: rebound_vmm::agent::AgentError::Timeout(30),
        };
        assert_eq!(
            rebound_errors::chain(&e),
            "the guest did not read its cache back: the guest agent did not answer within 30 s: the reboot is cold"
        );
        let e = Cold::List {
            who: "the recovery VM",
            source: rebound_vmm::warm::WarmError::Magic {
                path: "/v/warm.list".into(),
            },
        };
        assert_eq!(
            rebound_errors::chain(&e),
            "warm-cache list /v/warm.list is not one (no `rebound-warm-cache` header): the recovery VM is cold"
        );
    }
}
