//! Submitting a restore and following it to its end, from anywhere that can write
//! the restore's plan key (an operator's CLI with its own identity, or a daemon's
//! API on a one-host store).

use std::time::Duration;

use rebound_store::{Compare, Op, Store, StoreError};

use crate::layout;
use crate::records::{encode, PlanRecord, Timeouts, FORMAT};
use crate::report::{report, RestoreReport};
use crate::restore_plan::{Plan, PlanError};
use crate::run::unix_now_ns;
use crate::view::{ClusterView, RestoreView};

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the restore plan is invalid")]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Name(#[from] layout::NameError),
    #[error("restore {0} exists already in the cluster store; a new restore needs a new id")]
    Exists(String),
    #[error("host {0} is not in the cluster (no live lease)")]
    HostsNotLive(String),
    #[error("restore {0} is not in the cluster store")]
    Unknown(String),
    #[error("restore {id} was refused")]
    Refused {
        id: String,
        #[source]
        source: crate::records::RecordError,
    },
    #[error("restore {0} did not end within {1:?}")]
    Timeout(String, Duration),
    #[error("the cluster store failed")]
    Store(#[from] StoreError),
}

/// Writes the plan (create-only); the hosts it names take it from there.
pub async fn submit(store: &dyn Store, plan: Plan, timeouts: Timeouts) -> Result<(), SubmitError> {
    layout::check_restore(&plan.restore_id)?;
    for v in &plan.vms {
        layout::check_vm(&v.vm)?;
        layout::check_host(&v.host)?;
    }
    plan.groups()?;
    // Refused here, in one line, rather than by a coordinator: a plan whose hosts are
    // all gone has nobody to coordinate it. (One that dies after this is refused by
    // the coordinator, `checker`.)
    let hosts = store.range(&layout::hosts()).await?;
    let view = ClusterView::from_kvs(&hosts.kvs, hosts.revision);
    let live = view.live();
    let dead: std::collections::BTreeSet<&str> = plan
        .vms
        .iter()
        .map(|v| v.host.as_str())
        .filter(|h| !live.contains(*h))
        .collect();
    if !dead.is_empty() {
        return Err(SubmitError::HostsNotLive(
            dead.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    let key = layout::plan(&plan.restore_id);
    let id = plan.restore_id.clone();
    let rec = PlanRecord {
        format: FORMAT,
        plan,
        submitted_unix_ns: unix_now_ns(),
        timeouts,
    };
    let o = store
        .txn(
            vec![Compare::ModRevision(key.clone(), 0)],
            vec![Op::Put {
                key,
                value: encode(&rec),
                lease: None,
            }],
        )
        .await?;
    if !o.succeeded {
        return Err(SubmitError::Exists(id));
    }
    Ok(())
}

/// Follows restore `id` until its state is final and returns its report;
/// `progress` sees the restore after every change.
pub async fn wait(
    store: &dyn Store,
    id: &str,
    limit: Duration,
    mut progress: impl FnMut(&RestoreView) + Send,
) -> Result<RestoreReport, SubmitError> {
    layout::check_restore(id)?;
    let deadline = tokio::time::Instant::now() + limit;
    let follow = async {
        loop {
            let r = store.range(layout::ROOT).await?;
            let mut view = ClusterView::from_kvs(&r.kvs, r.revision);
            let mut w = store.watch(layout::ROOT, r.revision + 1).await?;
            loop {
                let Some(rv) = view.restores.get(id) else {
                    return Err(SubmitError::Unknown(id.to_string()));
                };
                if let Some(e) = rv.refused() {
                    return Err(SubmitError::Refused {
                        id: id.to_string(),
                        source: e.clone(),
                    });
                }
                progress(rv);
                if rv.state().is_some_and(|(s, _)| s.status.is_final()) {
                    return Ok(report(rv, &view.live()).expect("a final restore has a report"));
                }
                match w.events.recv().await {
                    Some(Ok(evs)) => evs.iter().for_each(|e| view.apply(e)),
                    // The watch ended (compaction, reconnection): read again.
                    Some(Err(_)) | None => break,
                }
            }
        }
    };
    tokio::time::timeout_at(deadline, follow)
        .await
        .map_err(|_| SubmitError::Timeout(id.to_string(), limit))?
}

/// Restore `id`'s report as the store holds it now (running or ended), or `None`
/// if it has no plan there. It reads the hosts, the restore's records and its
/// phases only, not the whole layout.
pub async fn read_report(
    store: &dyn Store,
    id: &str,
) -> Result<Option<RestoreReport>, SubmitError> {
    layout::check_restore(id)?;
    let hosts = store.range(&layout::hosts()).await?;
    let records = store.range(&layout::restore(id)).await?;
    let phases = store.range(&layout::phases(id)).await?;
    let mut view = ClusterView::default();
    view.put_all(hosts.kvs.iter().chain(&records.kvs).chain(&phases.kvs));
    let live = view.live();
    Ok(view.restores.get(id).and_then(|r| report(r, &live)))
}
