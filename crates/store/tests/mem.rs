//! The conformance suite on [`MemStore`], and the in-memory store's own parts:
//! handles, history bound and fake faults.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::{next_batch, within, Fixture};
use rebound_store::mem::MemStore;
use rebound_store::{Event, Store, StoreError};

struct MemFixture {
    a: MemStore,
    b: MemStore,
}

impl Fixture for MemFixture {
    fn store(&self) -> &dyn Store {
        &self.a
    }
    fn second(&self) -> &dyn Store {
        &self.b
    }
    fn cut(&self, cut: bool) {
        self.a.fake_cut_off(cut);
    }
}

async fn mem() -> MemFixture {
    let a = MemStore::new();
    let b = a.handle();
    MemFixture { a, b }
}

conformance!(mem);

#[tokio::test]
async fn handles_count_apart_and_clones_together() {
    let a = MemStore::new();
    let clone = a.clone();
    let b = a.handle();
    a.put("k", b"1".to_vec(), None).await.unwrap();
    clone.get("k").await.unwrap();
    assert_eq!(b.get("k").await.unwrap().unwrap().value, b"1", "same data");
    assert_eq!((a.requests(), clone.requests(), b.requests()), (2, 2, 1));
}

#[tokio::test]
async fn watch_older_than_history_is_compacted() {
    let s = MemStore::with_history(3);
    for i in 0..5 {
        s.put("h/k", vec![i], None).await.unwrap();
    }
    assert_eq!(s.watch("h/", 2).await.err(), Some(StoreError::Compacted(2)));
    let mut w = s.watch("h/", 3).await.unwrap();
    for rev in 3..=5 {
        assert_eq!(next_batch(&mut w).await[0].mod_revision(), rev);
    }
}

#[tokio::test]
async fn fake_expiry_deletes_keys_in_one_revision_and_marks_lost() {
    let s = MemStore::new();
    let lease = s.lease(Duration::from_secs(60)).await.unwrap();
    s.put("fe/a", b"1".to_vec(), Some(lease.id)).await.unwrap();
    s.put("fe/b", b"1".to_vec(), Some(lease.id)).await.unwrap();
    s.put("fe/c", b"1".to_vec(), None).await.unwrap();
    let mut w = s.watch("fe/", 0).await.unwrap();
    let before = s.revision();
    assert!(s.fake_expire_lease(lease.id));
    assert!(*lease.lost.borrow());
    assert_eq!(s.revision(), before + 1);
    let batch = next_batch(&mut w).await;
    assert!(batch.iter().all(|e| matches!(e, Event::Delete { .. })));
    assert_eq!(batch.len(), 2);
    let left = s.range("fe/").await.unwrap();
    assert_eq!(left.kvs.len(), 1, "the key with no lease stays");
    assert!(!s.fake_expire_lease(lease.id), "a lease expires once");
}

#[tokio::test]
async fn short_ttls_are_kept_exactly() {
    let s = MemStore::new();
    let ttl = Duration::from_millis(200);
    let lease = s.lease(ttl).await.unwrap();
    assert_eq!(lease.ttl, ttl);
    s.put("st/k", b"1".to_vec(), Some(lease.id)).await.unwrap();
    tokio::time::sleep(ttl * 4).await;
    assert!(s.get("st/k").await.unwrap().is_some(), "renewed");
    let dropped = Instant::now();
    drop(lease);
    let mut w = s.watch("st/", 0).await.unwrap();
    next_batch(&mut w).await;
    assert!(dropped.elapsed() < ttl + Duration::from_millis(100));
}

#[tokio::test]
async fn cut_off_handle_fails_its_watches_and_campaigns() {
    let s = MemStore::new();
    let host = s.handle();
    let other = s.lease(Duration::from_secs(60)).await.unwrap();
    s.campaign("co", other.id, b"other").await.unwrap();
    let lease = host.lease(Duration::from_secs(60)).await.unwrap();
    let mut w = host.watch("x/", 0).await.unwrap();
    let campaign = host.campaign("co", lease.id, b"host");
    tokio::pin!(campaign);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut campaign)
            .await
            .is_err()
    );
    host.fake_cut_off(true);
    let err = within(Duration::from_secs(1), "campaign ends", campaign).await;
    assert!(matches!(err, Err(StoreError::Unavailable(_))), "{err:?}");
    let end = within(Duration::from_secs(1), "watch ends", w.events.recv()).await;
    assert!(
        matches!(end, Some(Err(StoreError::Unavailable(_)))),
        "{end:?}"
    );
    assert!(matches!(
        host.get("x").await,
        Err(StoreError::Unavailable(_))
    ));
    assert!(
        s.get("x").await.is_ok(),
        "other handles still reach the store"
    );
    host.fake_cut_off(false);
    assert!(host.get("x").await.is_ok());
}
