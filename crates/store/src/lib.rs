//! The store the hosts of a Rebound cluster share, behind one trait ([`Store`]):
//! keys with revisions, multi-key transactions that compare before they write,
//! watches from a revision, leases that expire when their holder stops renewing
//! them, and elections. It is etcd v3's model, and [`Store`] is small enough that
//! etcd implements it directly; an in-memory implementation serves a
//! cluster that lives on one host, so the same protocol code runs with no etcd.
//!
//! Keys are UTF-8 strings; values are bytes the caller checks (they come from
//! other hosts). A revision is the store's global write counter: every write
//! (a transaction that succeeds, a lease that expires and deletes keys) gets the
//! next one, and a key's `mod_revision` is the revision of its last write.

pub mod access;
pub mod election;
pub mod etcd;
pub mod mem;
pub mod member;
pub mod probe;

use std::time::Duration;

use tokio::sync::{mpsc, watch};

/// Aborts a background task when dropped: a lease's renewal, a watch's reader, a
/// task passing a watch on.
pub struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The store's global write counter; 0 means "never" (a key that does not exist).
pub type Revision = i64;
/// A lease's id, as the store gave it.
pub type LeaseId = i64;

/// One key as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (since it last did not exist).
    pub create_revision: Revision,
    /// The revision of the key's last write.
    pub mod_revision: Revision,
    /// The lease the key is attached to, 0 for none.
    pub lease: LeaseId,
}

/// What a prefix read returns: the keys in order, and the store's revision at the
/// read (watch from `revision + 1` to see every later change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub kvs: Vec<KeyValue>,
    pub revision: Revision,
}

/// One condition of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    /// The key's `mod_revision` is this; 0 means the key does not exist.
    ModRevision(String, Revision),
    /// The key exists and holds exactly these bytes.
    Value(String, Vec<u8>),
}

/// One write of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        /// Attach the key to this lease (it is deleted when the lease expires).
        lease: Option<LeaseId>,
    },
    Delete(String),
}

/// What a transaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Every comparison held and every write was made, at `revision`; otherwise
    /// nothing was written.
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: Revision,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    Delete { key: String, mod_revision: Revision },
}

impl Event {
    pub fn key(&self) -> &str {
        match self {
            Event::Put(kv) => &kv.key,
            Event::Delete { key, .. } => key,
        }
    }
    pub fn mod_revision(&self) -> Revision {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// A watch of a prefix: batches of events in revision order, each revision's
/// events together. An error ends the watch (the receiver then yields `None`);
/// the watcher reads the prefix again and watches from the new revision.
pub struct Watch {
    pub events: mpsc::Receiver<Result<Vec<Event>, StoreError>>,
    /// Dropped with the watch: cancels it in the store.
    pub _guard: Box<dyn Send + Sync>,
}

/// A lease this process holds; the store's implementation renews it in the
/// background until the handle is dropped or [`Store::revoke`] is called.
pub struct Lease {
    pub id: LeaseId,
    pub ttl: Duration,
    /// Turns `true` once the lease is lost: renewal failed for two TTLs (etcd)
    /// or the store said it expired. Keys attached to it are gone (or soon will
    /// be); whatever the holder did under it (a leadership) is over.
    pub lost: watch::Receiver<bool>,
    /// Dropped with the lease: stops the renewal.
    pub _keeper: Box<dyn Send + Sync>,
}

impl Lease {
    /// Resolves once the lease is lost.
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        // An error means the keeper is gone, which also ends the lease.
        let _ = rx.wait_for(|lost| *lost).await;
    }
}

/// Being the leader of an election: held until resigned or the lease is lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub election: String,
    /// The key that holds the leadership (under the election's prefix).
    pub key: String,
    /// Its create revision: leaders of an election are ordered by it.
    pub revision: Revision,
    pub lease: LeaseId,
}

/// Why a store call failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    #[error("the cluster store cannot be reached: {0}")]
    Unavailable(String),
    #[error("the cluster store refused this host: {0}")]
    Denied(String),
    #[error("revision {0} is compacted away; read again")]
    Compacted(Revision),
    #[error("lease {0} is not held (expired or revoked)")]
    LeaseGone(LeaseId),
    #[error("the cluster store failed: {0}")]
    Other(String),
}

/// The cluster store. Every method is one request to the store (a watch or a
/// campaign is one long request), counted in [`Store::requests`].
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// One key, or `None`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;
    /// Every key that starts with `prefix`, in key order.
    async fn range(&self, prefix: &str) -> Result<Range, StoreError>;
    /// If every comparison holds, makes every write, atomically.
    async fn txn(&self, when: Vec<Compare>, then: Vec<Op>) -> Result<TxnOutcome, StoreError>;
    /// Changes to keys under `prefix` from revision `from` on (inclusive).
    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError>;
    /// A new lease of `ttl`, renewed in the background.
    async fn lease(&self, ttl: Duration) -> Result<Lease, StoreError>;
    /// Ends a lease now: its keys are deleted.
    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError>;
    /// Waits until this lease's holder leads `election` (the candidates are ordered
    /// by when they campaigned; the leader is the oldest whose lease is alive), and
    /// publishes `value` as the leader's.
    async fn campaign(
        &self,
        election: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Leadership, StoreError>;
    /// The current leader's key and value, if any.
    async fn leader(&self, election: &str) -> Result<Option<KeyValue>, StoreError>;
    /// Gives the leadership up (the next candidate leads).
    async fn resign(&self, leadership: &Leadership) -> Result<(), StoreError>;
    /// Requests made to the store so far through this handle.
    fn requests(&self) -> u64;

    /// Writes one key unconditionally.
    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let op = Op::Put {
            key: key.to_string(),
            value,
            lease,
        };
        Ok(self.txn(Vec::new(), vec![op]).await?.revision)
    }
}
