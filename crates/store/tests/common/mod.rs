//! The conformance suite: the same tests for every implementation of [`Store`],
//! written once against a [`Fixture`] and instantiated per implementation by
//! `conformance!`.

#![allow(dead_code)]

pub mod etcd_server;

use std::future::Future;
use std::time::{Duration, Instant};

use rebound_store::{Compare, Event, KeyValue, Lease, Op, Store, StoreError, Watch};

/// The lease TTL the tests use (etcd's minimum with the members' timing in
/// [`etcd_server`]).
pub const TTL: Duration = Duration::from_secs(1);
/// How long anything that should happen "at once" may take.
const WAIT: Duration = Duration::from_secs(5);

/// One store under test, reached through two handles (two clients or two
/// in-memory handles), with a way to cut the first one off from the store.
pub trait Fixture: Send + Sync {
    fn store(&self) -> &dyn Store;
    fn second(&self) -> &dyn Store;
    /// Stops (`true`) or restores (`false`) the first handle's contact with the
    /// store; the second handle is only used after contact is restored.
    fn cut(&self, cut: bool);
}

/// Runs every conformance test on the fixture `$make().await` returns.
macro_rules! conformance {
    ($make:path: $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fixture = $make().await;
                common::$name(&fixture).await;
            }
        )*
    };
    ($make:path) => {
        conformance!($make: compare_and_set, create_only, duplicate_key_refused,
            watch_replays_history, watch_sees_deletes, renewed_lease_lives,
            dropped_lease_expires, lease_lost_when_cut_off, revoke, election_order,
            election_takeover, requests_counted);
    };
}

pub fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.into(),
        lease: None,
    }
}

async fn value(s: &dyn Store, key: &str) -> Option<Vec<u8>> {
    s.get(key).await.expect("get").map(|kv| kv.value)
}

/// The watch's next batch, which must come within [`WAIT`].
pub async fn next_batch(w: &mut Watch) -> Vec<Event> {
    tokio::time::timeout(WAIT, w.events.recv())
        .await
        .expect("no watch event within 5 s")
        .expect("the watch ended")
        .expect("the watch failed")
}

/// Resolves `f` within `limit`, or fails the test naming `what`.
pub async fn within<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not happen within {limit:?}"),
    }
}

fn keys(kvs: &[KeyValue]) -> Vec<&str> {
    kvs.iter().map(|kv| kv.key.as_str()).collect()
}

pub async fn compare_and_set(f: &dyn Fixture) {
    let s = f.store();
    let start = s.range("cas/").await.unwrap().revision;
    let rev = s.put("cas/a", b"1".to_vec(), None).await.unwrap();
    assert_eq!(rev, start + 1, "one put takes one revision");
    let kv = s.get("cas/a").await.unwrap().expect("cas/a was put");
    assert_eq!(kv.value, b"1");
    assert_eq!(
        (kv.create_revision, kv.mod_revision, kv.lease),
        (rev, rev, 0)
    );

    // A stale revision: nothing is written.
    let stale = vec![Compare::ModRevision("cas/a".into(), rev - 1)];
    let out = s
        .txn(stale, vec![put("cas/a", "2"), put("cas/b", "x")])
        .await
        .unwrap();
    assert!(!out.succeeded);
    assert_eq!(out.revision, rev);
    assert_eq!(value(s, "cas/a").await.unwrap(), b"1");
    assert_eq!(value(s, "cas/b").await, None);

    // The current revision: both writes, at one revision.
    let current = vec![Compare::ModRevision("cas/a".into(), rev)];
    let out = s
        .txn(current, vec![put("cas/a", "2"), put("cas/b", "x")])
        .await
        .unwrap();
    assert!(out.succeeded);
    assert_eq!(out.revision, rev + 1, "a transaction takes one revision");
    let a = s.get("cas/a").await.unwrap().unwrap();
    assert_eq!((a.create_revision, a.mod_revision), (rev, rev + 1));
    let b = s.get("cas/b").await.unwrap().unwrap();
    assert_eq!((b.create_revision, b.mod_revision), (rev + 1, rev + 1));

    // Comparing values: a wrong value, a missing key, then the right value.
    let wrong = vec![Compare::Value("cas/a".into(), b"1".to_vec())];
    assert!(
        !s.txn(wrong, vec![Op::Delete("cas/b".into())])
            .await
            .unwrap()
            .succeeded
    );
    let missing = vec![Compare::Value("cas/none".into(), Vec::new())];
    assert!(
        !s.txn(missing, vec![Op::Delete("cas/b".into())])
            .await
            .unwrap()
            .succeeded
    );
    let right = vec![
        Compare::Value("cas/a".into(), b"2".to_vec()),
        Compare::ModRevision("cas/b".into(), rev + 1),
    ];
    let out = s
        .txn(right, vec![Op::Delete("cas/b".into())])
        .await
        .unwrap();
    assert!(out.succeeded);
    assert_eq!(out.revision, rev + 2);
    assert_eq!(value(s, "cas/b").await, None);

    // Deleting what is not there changes nothing and takes no revision.
    let out = s
        .txn(vec![], vec![Op::Delete("cas/b".into())])
        .await
        .unwrap();
    assert!(out.succeeded);
    assert_eq!(out.revision, rev + 2);

    // A range: in key order, with the revision of the read.
    s.put("cas/0", b"z".to_vec(), None).await.unwrap();
    s.put("casX", b"outside".to_vec(), None).await.unwrap();
    let range = s.range("cas/").await.unwrap();
    assert_eq!(keys(&range.kvs), ["cas/0", "cas/a"]);
    assert_eq!(range.revision, rev + 4);
}

pub async fn create_only(f: &dyn Fixture) {
    let s = f.store();
    let absent = || vec![Compare::ModRevision("co/k".into(), 0)];
    let first = s.txn(absent(), vec![put("co/k", "first")]).await.unwrap();
    assert!(first.succeeded, "creating an absent key");
    let second = s.txn(absent(), vec![put("co/k", "second")]).await.unwrap();
    assert!(!second.succeeded, "a second create of the same key");
    assert_eq!(second.revision, first.revision);
    assert_eq!(value(s, "co/k").await.unwrap(), b"first");

    // Once deleted, the key can be created again, with a new create revision.
    s.txn(vec![], vec![Op::Delete("co/k".into())])
        .await
        .unwrap();
    let again = s.txn(absent(), vec![put("co/k", "again")]).await.unwrap();
    assert!(again.succeeded);
    let kv = s.get("co/k").await.unwrap().unwrap();
    assert_eq!(kv.create_revision, again.revision);
    assert!(kv.create_revision > first.revision);
}

pub async fn duplicate_key_refused(f: &dyn Fixture) {
    let s = f.store();
    let err = s
        .txn(vec![], vec![put("dup/k", "1"), Op::Delete("dup/k".into())])
        .await
        .expect_err("a transaction that writes one key twice");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    assert_eq!(value(s, "dup/k").await, None);
}

pub async fn watch_replays_history(f: &dyn Fixture) {
    let s = f.store();
    let r1 = s.put("w/a", b"1".to_vec(), None).await.unwrap();
    let r2 = s
        .txn(vec![], vec![put("w/b", "1"), put("w/c", "1")])
        .await
        .unwrap()
        .revision;
    s.put("other/x", b"1".to_vec(), None).await.unwrap();
    let r3 = s
        .txn(vec![], vec![Op::Delete("w/a".into())])
        .await
        .unwrap()
        .revision;

    let mut w = s.watch("w/", r1).await.unwrap();
    let batch = next_batch(&mut w).await;
    assert_eq!(batch.len(), 1);
    assert!(matches!(&batch[0], Event::Put(kv) if kv.key == "w/a" && kv.mod_revision == r1));
    let batch = next_batch(&mut w).await;
    assert_eq!(
        batch
            .iter()
            .map(|e| (e.key(), e.mod_revision()))
            .collect::<Vec<_>>(),
        [("w/b", r2), ("w/c", r2)],
        "one batch per revision, with all of that revision's events"
    );
    let batch = next_batch(&mut w).await;
    assert_eq!(
        batch,
        [Event::Delete {
            key: "w/a".into(),
            mod_revision: r3
        }]
    );
    // History done, live changes follow.
    let r4 = s.put("w/d", b"live".to_vec(), None).await.unwrap();
    let batch = next_batch(&mut w).await;
    assert!(
        matches!(&batch[..], [Event::Put(kv)] if kv.key == "w/d" && kv.mod_revision == r4 && kv.value == b"live")
    );

    // From a later past revision, only what came after.
    let mut w = s.watch("w/", r3).await.unwrap();
    assert_eq!(next_batch(&mut w).await[0].mod_revision(), r3);
    assert_eq!(next_batch(&mut w).await[0].mod_revision(), r4);
}

pub async fn watch_sees_deletes(f: &dyn Fixture) {
    let s = f.store();
    s.put("wd/a", b"1".to_vec(), None).await.unwrap();
    s.put("wd/b", b"1".to_vec(), None).await.unwrap();
    let from = s.range("wd/").await.unwrap().revision + 1;
    let mut w = s.watch("wd/", from).await.unwrap();
    let del = s
        .txn(
            vec![],
            vec![Op::Delete("wd/a".into()), Op::Delete("wd/b".into())],
        )
        .await
        .unwrap()
        .revision;
    let batch = next_batch(&mut w).await;
    let expect = |key: &str| Event::Delete {
        key: key.into(),
        mod_revision: del,
    };
    assert_eq!(batch, [expect("wd/a"), expect("wd/b")]);
}

/// Puts `n` keys under `prefix` attached to `lease`.
async fn attach(s: &dyn Store, prefix: &str, lease: &Lease, n: usize) {
    for i in 0..n {
        s.put(&format!("{prefix}{i}"), b"held".to_vec(), Some(lease.id))
            .await
            .unwrap();
    }
}

pub async fn renewed_lease_lives(f: &dyn Fixture) {
    let s = f.store();
    let lease = s.lease(TTL).await.unwrap();
    assert!(lease.ttl >= TTL);
    attach(s, "lr/", &lease, 1).await;
    tokio::time::sleep(lease.ttl * 3).await;
    assert!(!*lease.lost.borrow(), "a renewed lease was lost");
    let kv = s.get("lr/0").await.unwrap().expect("a renewed lease's key");
    assert_eq!(kv.lease, lease.id);
}

pub async fn dropped_lease_expires(f: &dyn Fixture) {
    let s = f.store();
    let lease = s.lease(TTL).await.unwrap();
    let ttl = lease.ttl;
    attach(s, "ld/", &lease, 2).await;
    let mut w = s.watch("ld/", 0).await.unwrap();
    let dropped = Instant::now();
    drop(lease);
    assert!(s.get("ld/0").await.unwrap().is_some(), "expired at once");
    let batch = within(ttl + Duration::from_secs(2), "expiry", next_batch(&mut w)).await;
    let waited = dropped.elapsed();
    assert!(
        waited <= ttl + Duration::from_secs(1),
        "expired after {waited:?}"
    );
    assert_eq!(
        batch.len(),
        2,
        "both keys deleted in one revision: {batch:?}"
    );
    assert!(batch.iter().all(|e| matches!(e, Event::Delete { .. })));
    assert!(s.range("ld/").await.unwrap().kvs.is_empty());
}

pub async fn lease_lost_when_cut_off(f: &dyn Fixture) {
    let s = f.store();
    let lease = s.lease(TTL).await.unwrap();
    attach(s, "lc/", &lease, 1).await;
    f.cut(true);
    let cut = Instant::now();
    within(
        lease.ttl + Duration::from_secs(1),
        "lease lost",
        lease.lost(),
    )
    .await;
    assert!(
        cut.elapsed() >= lease.ttl / 2,
        "lost too early: {:?}",
        cut.elapsed()
    );
    f.cut(false);
    // The store expired it too: the key goes.
    let other = f.second();
    let gone = async {
        while other.get("lc/0").await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    within(Duration::from_secs(2), "the lost lease's key deleted", gone).await;
    assert!(matches!(
        other.revoke(lease.id).await,
        Err(StoreError::LeaseGone(id)) if id == lease.id
    ));
}

pub async fn revoke(f: &dyn Fixture) {
    let s = f.store();
    let lease = s.lease(TTL).await.unwrap();
    attach(s, "rv/", &lease, 2).await;
    let mut w = s.watch("rv/", 0).await.unwrap();
    f.second().revoke(lease.id).await.unwrap();
    assert!(
        s.range("rv/").await.unwrap().kvs.is_empty(),
        "revoke deletes at once"
    );
    let batch = next_batch(&mut w).await;
    assert_eq!(batch.len(), 2, "one revision: {batch:?}");
    within(WAIT, "a revoked lease lost", lease.lost()).await;
    let id = lease.id;
    assert_eq!(s.revoke(id).await, Err(StoreError::LeaseGone(id)));
    assert_eq!(
        s.put("rv/x", b"1".to_vec(), Some(id)).await,
        Err(StoreError::LeaseGone(id))
    );
    let campaign = s.campaign("rv-election", id, b"x").await;
    assert_eq!(campaign, Err(StoreError::LeaseGone(id)));
}

pub async fn election_order(f: &dyn Fixture) {
    let s = f.store();
    let (la, lb) = (s.lease(TTL).await.unwrap(), s.lease(TTL).await.unwrap());
    assert_eq!(s.leader("eo").await.unwrap(), None);
    let a = s.campaign("eo", la.id, b"a").await.unwrap();
    assert_eq!(a.key, format!("eo/{:x}", la.id));
    assert_eq!((a.election.as_str(), a.lease), ("eo", la.id));
    let b = s.campaign("eo", lb.id, b"b");
    tokio::pin!(b);
    let early = tokio::time::timeout(Duration::from_millis(500), &mut b).await;
    assert!(early.is_err(), "a second candidate led while the first did");
    let leader = s.leader("eo").await.unwrap().expect("a leader");
    assert_eq!(
        (leader.key.as_str(), leader.value.as_slice()),
        (a.key.as_str(), &b"a"[..])
    );
    assert_eq!(leader.create_revision, a.revision);

    f.second().resign(&a).await.unwrap();
    let b = within(WAIT, "the next candidate leads", b).await.unwrap();
    assert_eq!(b.key, format!("eo/{:x}", lb.id));
    assert!(b.revision > a.revision);
    let leader = s.leader("eo").await.unwrap().expect("a leader");
    assert_eq!((leader.key, leader.value), (b.key.clone(), b"b".to_vec()));
    s.resign(&b).await.unwrap();
    assert_eq!(s.leader("eo").await.unwrap(), None);
}

pub async fn election_takeover(f: &dyn Fixture) {
    let s = f.store();
    let la = s.lease(TTL).await.unwrap();
    let lb = f.second().lease(TTL).await.unwrap();
    let ttl = la.ttl;
    let a = s.campaign("et", la.id, b"a").await.unwrap();
    let b = f.second().campaign("et", lb.id, b"b");
    tokio::pin!(b);
    assert!(tokio::time::timeout(Duration::from_millis(300), &mut b)
        .await
        .is_err());
    // The leader's process dies: its lease is no longer renewed.
    let died = Instant::now();
    drop(la);
    let b = within(ttl + Duration::from_secs(2), "takeover", b)
        .await
        .unwrap();
    let took = died.elapsed();
    assert!(
        took <= ttl + Duration::from_secs(1),
        "takeover took {took:?}"
    );
    assert!(b.revision > a.revision);
    let leader = s.leader("et").await.unwrap().expect("a leader");
    assert_eq!(leader.key, b.key);
}

pub async fn requests_counted(f: &dyn Fixture) {
    let s = f.store();
    let before = (s.requests(), f.second().requests());
    s.put("rq/a", b"1".to_vec(), None).await.unwrap();
    s.get("rq/a").await.unwrap();
    s.range("rq/").await.unwrap();
    let _ = s.revoke(12345).await;
    assert_eq!(s.requests(), before.0 + 4);
    assert_eq!(f.second().requests(), before.1, "counted per handle");
}
