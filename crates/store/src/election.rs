//! Elections on the store's own keys and watches, the algorithm of etcd's
//! `concurrency` package: a candidate's key is `<election>/<lease id in hex>`,
//! attached to its lease; the leader is the live candidate with the lowest
//! `create_revision`; a candidate waits for a deletion under the election's prefix
//! while an older candidate stands. [`crate::etcd::EtcdStore`] uses it instead of
//! etcd's election service, whose campaigns stopped being answered at a few dozen
//! concurrent candidates in `rebound bench cluster-scale` (etcd 3.4.23).

use crate::{Compare, Event, KeyValue, Leadership, LeaseId, Op, Store, StoreError};

fn candidate_key(election: &str, lease: LeaseId) -> String {
    format!("{election}/{lease:x}")
}

/// See the module doc; resolves once this lease's candidacy leads.
pub async fn campaign<S: Store + ?Sized>(
    store: &S,
    election: &str,
    lease: LeaseId,
    value: &[u8],
) -> Result<Leadership, StoreError> {
    let key = candidate_key(election, lease);
    let prefix = format!("{election}/");
    // Create-only: campaigning again with the same lease keeps the candidacy.
    store
        .txn(
            vec![Compare::ModRevision(key.clone(), 0)],
            vec![Op::Put {
                key: key.clone(),
                value: value.to_vec(),
                lease: Some(lease),
            }],
        )
        .await?;
    loop {
        let r = store.range(&prefix).await?;
        let Some(mine) = r.kvs.iter().find(|kv| kv.key == key) else {
            return Err(StoreError::LeaseGone(lease));
        };
        let older = r
            .kvs
            .iter()
            .filter(|kv| kv.create_revision < mine.create_revision)
            .max_by_key(|kv| kv.create_revision);
        let Some(older) = older else {
            return Ok(Leadership {
                election: election.to_string(),
                key,
                revision: mine.create_revision,
                lease,
            });
        };
        let waiting_for = older.key.clone();
        let mut w = store.watch(&prefix, r.revision + 1).await?;
        'wait: loop {
            match w.events.recv().await {
                Some(Ok(evs)) => {
                    let gone = evs.iter().any(|e| {
                        matches!(e, Event::Delete { key, .. } if *key == waiting_for || *key == candidate_key(election, lease))
                    });
                    if gone {
                        break 'wait;
                    }
                }
                // A watch the store ended: read again.
                Some(Err(_)) | None => break 'wait,
            }
        }
    }
}

/// The leading candidate's key and value.
pub async fn leader<S: Store + ?Sized>(
    store: &S,
    election: &str,
) -> Result<Option<KeyValue>, StoreError> {
    let r = store.range(&format!("{election}/")).await?;
    Ok(r.kvs.into_iter().min_by_key(|kv| kv.create_revision))
}

/// Deletes the candidacy if it is still this one (safe twice).
pub async fn resign<S: Store + ?Sized>(store: &S, l: &Leadership) -> Result<(), StoreError> {
    store
        .txn(
            vec![Compare::ModRevision(l.key.clone(), l.revision)],
            vec![Op::Delete(l.key.clone())],
        )
        .await?;
    Ok(())
}
