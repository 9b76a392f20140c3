//! How quickly a write reaches a watcher through the store: the latency every
//! cross-host step of a restore pays at least once (a host's LOAD_FIN reaching the
//! coordinator, a START reaching its host).

use std::time::{Duration, Instant};

use crate::{Event, Op, Store, StoreError};

/// Writes `n` keys under `prefix`, one after another, each after the previous one
/// was seen by a watch of the prefix on the same handle; returns each write's time
/// from the request to the watch delivering it. The keys are deleted afterwards.
pub async fn watch_latency(
    store: &dyn Store,
    prefix: &str,
    n: usize,
) -> Result<Vec<Duration>, StoreError> {
    let r = store.range(prefix).await?;
    let mut w = store.watch(prefix, r.revision + 1).await?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("{prefix}{i:06}");
        let t = Instant::now();
        store.put(&key, i.to_string().into_bytes(), None).await?;
        'seen: loop {
            match w.events.recv().await {
                Some(Ok(evs)) => {
                    if evs
                        .iter()
                        .any(|e| matches!(e, Event::Put(kv) if kv.key == key))
                    {
                        break 'seen;
                    }
                }
                Some(Err(e)) => return Err(e),
                None => return Err(StoreError::Other("the probe's watch ended".into())),
            }
        }
        out.push(t.elapsed());
    }
    let keys: Vec<Op> = (0..n)
        .map(|i| Op::Delete(format!("{prefix}{i:06}")))
        .collect();
    for chunk in keys.chunks(100) {
        store.txn(Vec::new(), chunk.to_vec()).await?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_write_is_timed_and_the_keys_go() {
        let s = crate::mem::MemStore::new();
        let l = watch_latency(&s, "/probe/", 20).await.unwrap();
        assert_eq!(l.len(), 20);
        assert!(s.range("/probe/").await.unwrap().kvs.is_empty());
    }
}
