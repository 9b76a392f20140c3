//! [`EtcdStore`]: the cluster store on etcd v3, through the `etcd-client` crate.
//!
//! Every [`Store`] call maps to etcd's own API: `Range` for reads, `Txn` with
//! `Compare::mod_revision`/`value` for transactions, `Watch` with a start revision,
//! `LeaseGrant`/`LeaseRevoke` and a keep-alive stream per lease, and elections on
//! keys and watches ([`crate::election`], etcd's own algorithm), so the semantics are
//! etcd's (see [`crate::mem`] for where the in-memory store differs).
//!
//! What this module adds on top:
//! - **Failover.** One connection per endpoint; requests go to the current one and,
//!   when it cannot be reached (refused, reset, timed out, no raft leader), to
//!   the next ones in turn, for up to the request timeout. Reads, lease grants,
//!   watches, campaigns and resignations are retried so; a transaction or revoke
//!   only when it never reached the member (connection refused or already
//!   closed), because one that timed out may have been applied, and retrying a
//!   compare-and-set would then report a false failure. So a write sent just as
//!   the raft leader dies can fail with [`StoreError::Unavailable`] (etcd drops
//!   the proposal with the leader): the caller reads again and retries, as with
//!   any failed compare-and-set. Watches resume on another member from the
//!   revision after the last one delivered, so a member's death does not end
//!   them (they end with `Unavailable` if no member answers for twice the
//!   request timeout).
//! - **Leases.** A background task renews each lease every TTL/3 (on any member).
//!   The lease's `lost` flag turns true when etcd answers that it is gone (TTL 0,
//!   after expiry or revoke) or when no renewal has succeeded for two TTLs, counted
//!   from when the last successful renewal was sent. Not one TTL: while the members
//!   elect a new leader (up to two election timeouts) no renewal gets through, but
//!   no lease expires either, and the new leader gives every lease a whole TTL
//!   again; a holder that gave up at one TTL lost a lease etcd still kept (seen
//!   with the leader's member killed). Past one TTL the holder keeps asking, and
//!   etcd's answer decides. Dropping the [`Lease`] stops the renewals.
//!   etcd TTLs are whole seconds (rounded up here), and etcd raises them to its
//!   minimum (1.5 election timeouts); [`Lease::ttl`] is the TTL etcd granted.
//! - **Errors.** Transport failures and timeouts are [`StoreError::Unavailable`];
//!   permission, authentication and TLS failures (an unknown CA, a refused client
//!   certificate) are [`StoreError::Denied`]; a watch from a compacted revision ends
//!   with [`StoreError::Compacted`]; a missing lease is [`StoreError::LeaseGone`].
//!   Each message names the endpoint.
//! - **Counting.** [`Store::requests`] counts the RPCs this handle sent, including
//!   retries on another endpoint and the connection probe; lease renewals are not
//!   counted (one stream per lease, not per operation). Clones share the counter.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    LeaseKeepAliveStream, LeaseKeeper, TlsOptions, Txn, TxnOp, WatchOptions, WatchStream,
};
use tokio::sync::{mpsc, watch};

use crate::AbortOnDrop;
use tokio::time::Instant;

use crate::{
    Compare, Event, KeyValue, Leadership, Lease, LeaseId, Op, Range, Revision, Store, StoreError,
    TxnOutcome, Watch,
};

/// Where the store is and how to reach it.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the members (`https://host:2379`); a URL without a scheme
    /// gets `https://` with TLS and `http://` without.
    pub endpoints: Vec<String>,
    /// Mutual TLS; `None` for plain HTTP.
    pub tls: Option<TlsFiles>,
    /// How long connecting to one member may take.
    pub connect_timeout: Duration,
    /// How long one short request (not a watch or a campaign) may take on one member.
    pub request_timeout: Duration,
}

/// PEM files for mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA that signed the members' certificates.
    pub ca: PathBuf,
    /// This host's certificate, and its private key.
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl EtcdConfig {
    /// Plain HTTP to `endpoints`, 2 s to connect, 5 s per request.
    pub fn new(endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            tls: None,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// Batches a watch buffers before its reader takes them (etcd holds the rest).
const WATCH_BUFFER: usize = 64;
/// etcd's answer to `Leader` for an election with no candidate.
const NO_LEADER: &str = "election: no leader";
/// Pause between rounds over every endpoint when none answers.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// HTTP/2 pings find a dead connection; etcd refuses pings more often than 5 s.
const PING_INTERVAL: Duration = Duration::from_secs(10);

/// A handle on an etcd cluster; see the module documentation. Clones share the
/// connections and the request counter.
#[derive(Clone)]
pub struct EtcdStore {
    conn: Arc<Conn>,
}

struct Conn {
    /// Each endpoint's URL and client.
    members: Vec<(String, Client)>,
    /// The member requests go to first.
    current: AtomicUsize,
    /// Bumped whenever a failure moves requests off a member: watches open on that
    /// member move too (one cut off the network answers nothing and says nothing,
    /// so its watch would only stall).
    moved: watch::Sender<u64>,
    request_timeout: Duration,
    requests: AtomicU64,
    /// The `lost` flags of leases granted here, so a revoke marks them at once.
    leases: Mutex<Vec<(LeaseId, Weak<watch::Sender<bool>>)>>,
}

/// Whether a failed request may be sent again to another member.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Sending it twice does no harm (a read, a grant, a campaign).
    Always,
    /// Only if it never reached a member.
    IfNotSent,
}

/// Whether a request is bounded by the request timeout (every one is now: a
/// campaign is made of short requests and a watch, `crate::election`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Length {
    Short,
}

/// A failure of one attempt on one member.
pub(crate) struct Failure {
    pub(crate) error: StoreError,
    /// The request certainly did not reach the member.
    not_sent: bool,
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path)
        .map_err(|e| StoreError::Other(format!("cannot read the {what} {}: {e}", path.display())))
}

/// The error and its sources in one line: tonic hides the cause (a refused
/// connection, an unknown certificate) in the source chain.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = s.source();
    }
    text
}

/// Words of a TLS failure (an unknown CA, a refused certificate).
const TLS_WORDS: &[&str] = &[
    "certificate",
    "handshake",
    "tls",
    "alert",
    "unknownissuer",
    "unknown ca",
];
/// Failures that happen before a request leaves: no connection, or (a broken
/// pipe) a connection the member had already closed when the request started.
const UNSENT_WORDS: &[&str] = &[
    "error trying to connect",
    "tcp connect error",
    "connection refused",
    "dns error",
    "broken pipe",
];

fn mentions(text: &str, words: &[&str]) -> bool {
    let text = text.to_ascii_lowercase();
    words.iter().any(|w| text.contains(w))
}

/// Maps one etcd-client error from `endpoint` to a [`Failure`].
pub(crate) fn failure(endpoint: &str, e: &etcd_client::Error, lease: Option<LeaseId>) -> Failure {
    use etcd_client::Error as E;
    use tonic::Code;
    let text = chain(e);
    let unsent = mentions(&text, UNSENT_WORDS);
    let error = match e {
        E::GRpcStatus(status) => match status.code() {
            Code::PermissionDenied | Code::Unauthenticated => {
                StoreError::Denied(format!("{endpoint}: {}", status.message()))
            }
            _ if status.message().contains("lease not found") => {
                StoreError::LeaseGone(lease.unwrap_or(0))
            }
            // An answer, not a failure (etcd sends it as code Unknown).
            _ if status.message().contains(NO_LEADER) => {
                StoreError::Other(format!("{endpoint}: {}", status.message()))
            }
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::Unknown
            | Code::Internal => {
                if mentions(&text, TLS_WORDS) {
                    StoreError::Denied(format!("{endpoint}: {text}"))
                } else {
                    StoreError::Unavailable(format!("{endpoint}: {text}"))
                }
            }
            _ => StoreError::Other(format!("{endpoint}: {}", status.message())),
        },
        E::TransportError(_) | E::IoError(_) => {
            if mentions(&text, TLS_WORDS) {
                StoreError::Denied(format!("{endpoint}: {text}"))
            } else {
                StoreError::Unavailable(format!("{endpoint}: {text}"))
            }
        }
        E::LeaseKeepAliveError(m) if m.contains("lease not found") => {
            StoreError::LeaseGone(lease.unwrap_or(0))
        }
        E::WatchError(_) | E::LeaseKeepAliveError(_) => {
            StoreError::Unavailable(format!("{endpoint}: {text}"))
        }
        _ => StoreError::Other(format!("{endpoint}: {text}")),
    };
    Failure {
        not_sent: unsent && matches!(error, StoreError::Unavailable(_)),
        error,
    }
}

fn key_string(key: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(key.to_vec())
        .map_err(|_| StoreError::Other(format!("etcd holds a key that is not UTF-8: {key:?}")))
}

fn key_value(kv: &etcd_client::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: key_string(kv.key())?,
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    })
}

fn revision_of(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision, StoreError> {
    header
        .map(|h| h.revision())
        .ok_or_else(|| StoreError::Other("etcd answered without a header".into()))
}

impl EtcdStore {
    /// Connects to the members in `config` and checks that one of them answers
    /// (so a wrong certificate or address fails here, with the reason).
    pub async fn connect(config: &EtcdConfig) -> Result<EtcdStore, StoreError> {
        if config.endpoints.is_empty() {
            return Err(StoreError::Other("no etcd endpoints given".into()));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(PING_INTERVAL, config.request_timeout)
            // A member cut off from the others refuses instead of hanging, so the
            // request moves on to a member that has a leader.
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            let ca = read_pem(&tls.ca, "etcd CA certificate")?;
            let cert = read_pem(&tls.cert, "etcd client certificate")?;
            let key = read_pem(&tls.key, "etcd client key")?;
            let tls = TlsOptions::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(Identity::from_pem(cert, key));
            options = options.with_tls(tls);
        }
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut members = Vec::new();
        for endpoint in &config.endpoints {
            let url = if endpoint.contains("://") {
                endpoint.clone()
            } else {
                format!("{scheme}://{endpoint}")
            };
            if !url.starts_with(&format!("{scheme}://")) {
                let want = if config.tls.is_some() {
                    "with"
                } else {
                    "without"
                };
                return Err(StoreError::Other(format!(
                    "etcd endpoint {url}: {want} TLS files the endpoint must be {scheme}://"
                )));
            }
            let client = Client::connect([url.as_str()], Some(options.clone()))
                .await
                .map_err(|e| failure(&url, &e, None).error)?;
            members.push((url, client));
        }
        let store = EtcdStore {
            conn: Arc::new(Conn {
                members,
                current: AtomicUsize::new(0),
                moved: watch::Sender::new(0),
                request_timeout: config.request_timeout,
                requests: AtomicU64::new(0),
                leases: Mutex::new(Vec::new()),
            }),
        };
        store
            .conn
            .call(Retry::Always, Length::Short, None, |mut c| async move {
                c.status().await
            })
            .await?;
        Ok(store)
    }

    /// The endpoint requests go to first (the last one that answered).
    pub fn current_endpoint(&self) -> &str {
        self.conn.current().0
    }
}

impl Conn {
    fn current(&self) -> (&str, usize) {
        let i = self.current.load(Ordering::Relaxed) % self.members.len();
        (&self.members[i].0, i)
    }

    /// Moves on from member `from` (unless another request already did).
    fn fail_over(&self, from: usize) {
        let next = (from + 1) % self.members.len();
        if self
            .current
            .compare_exchange(from, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.moved.send_modify(|n| *n += 1);
        }
    }

    /// Sends one request to the current member and, on failures `retry` allows,
    /// to the next ones in turn (pausing after each round, as an election may be
    /// under way) until one answers or the request timeout has passed since the
    /// first attempt; then the last failure is returned.
    async fn call<T, F, Fut>(
        &self,
        retry: Retry,
        length: Length,
        lease: Option<LeaseId>,
        mut request: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let give_up = Instant::now() + self.request_timeout;
        let mut attempts = 0;
        loop {
            if attempts > 0 && attempts % self.members.len() == 0 {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            attempts += 1;
            let (_, i) = self.current();
            let (endpoint, client) = &self.members[i];
            self.requests.fetch_add(1, Ordering::Relaxed);
            let attempt = request(client.clone());
            let result = match length {
                Length::Short => match tokio::time::timeout(self.request_timeout, attempt).await {
                    Ok(result) => result.map_err(|e| failure(endpoint, &e, lease)),
                    Err(_) => Err(Failure {
                        error: StoreError::Unavailable(format!(
                            "{endpoint}: no answer within {:?}",
                            self.request_timeout
                        )),
                        not_sent: false,
                    }),
                },
            };
            let failure = match result {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            if !matches!(failure.error, StoreError::Unavailable(_)) {
                return Err(failure.error);
            }
            tracing::debug!(error = %failure.error, "etcd member unavailable, trying the next");
            self.fail_over(i);
            if (retry == Retry::IfNotSent && !failure.not_sent) || Instant::now() >= give_up {
                return Err(failure.error);
            }
        }
    }

    /// Opens a watch of `prefix` from `from` on some member and reads its creation
    /// (a compacted start is refused there).
    /// Opens a watch of `prefix` from revision `from` (0: from now); with the
    /// revision it was created at.
    async fn open_watch(
        &self,
        prefix: &str,
        from: Revision,
    ) -> Result<(WatchStream, Revision), StoreError> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from.max(0));
        self.call(Retry::Always, Length::Short, None, |mut c| {
            let options = options.clone();
            async move {
                let mut stream = c.watch(prefix, Some(options)).await?;
                match stream.message().await? {
                    Some(created) if created.canceled() => {
                        Err(etcd_client::Error::WatchError(format!(
                            "compacted:{}:{}",
                            created.compact_revision(),
                            created.cancel_reason()
                        )))
                    }
                    Some(created) => Ok((stream, created.header().map_or(0, |h| h.revision()))),
                    None => Err(etcd_client::Error::WatchError(
                        "the watch stream closed".into(),
                    )),
                }
            }
        })
        .await
        .map_err(|e| match e {
            StoreError::Other(m) | StoreError::Unavailable(m) if m.contains("compacted:") => {
                compacted_or(from, &m)
            }
            e => e,
        })
    }

    fn mark_lost(&self, id: LeaseId) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        leases.retain(|(lease, lost)| match lost.upgrade() {
            Some(lost) if *lease == id => {
                lost.send_replace(true);
                false
            }
            Some(_) => true,
            None => false,
        });
    }
}

/// A watch canceled at creation: compacted away, or refused for another reason.
fn compacted_or(from: Revision, message: &str) -> StoreError {
    let compact = message
        .split("compacted:")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse::<Revision>().ok())
        .unwrap_or(0);
    if compact > 0 {
        StoreError::Compacted(from)
    } else if message.contains("permission denied") {
        StoreError::Denied(message.to_string())
    } else {
        StoreError::Other(format!("etcd canceled the watch: {message}"))
    }
}

/// Converts one watch response's events into batches, one per revision.
fn batches(events: &[etcd_client::Event]) -> Result<Vec<Vec<Event>>, StoreError> {
    let mut out: Vec<Vec<Event>> = Vec::new();
    for event in events {
        let kv = event
            .kv()
            .ok_or_else(|| StoreError::Other("a watch event without its key".into()))?;
        let converted = match event.event_type() {
            EventType::Put => Event::Put(key_value(kv)?),
            EventType::Delete => Event::Delete {
                key: key_string(kv.key())?,
                mod_revision: kv.mod_revision(),
            },
        };
        match out.last_mut() {
            Some(batch) if batch[0].mod_revision() == converted.mod_revision() => {
                batch.push(converted)
            }
            _ => out.push(vec![converted]),
        }
    }
    Ok(out)
}

/// Reads a watch's responses and hands them on one revision at a time; when the
/// member goes away, or another request failed over off it, resumes on another
/// from the next revision.
async fn run_watch(
    conn: Arc<Conn>,
    prefix: String,
    mut next: Revision,
    mut stream: WatchStream,
    tx: mpsc::Sender<Result<Vec<Event>, StoreError>>,
) {
    let mut moved = conn.moved.subscribe();
    let mut on = conn.current().1;
    loop {
        let message = tokio::select! {
            m = stream.message() => Some(m),
            _ = moved.changed() => None,
        };
        let left = match &message {
            None => conn.current().1 != on,
            Some(Ok(Some(_))) => false,
            Some(Ok(None) | Err(_)) => true,
        };
        if left {
            match resume(&conn, &prefix, next).await {
                Ok(resumed) => {
                    stream = resumed;
                    on = conn.current().1;
                    continue;
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
        let Some(Ok(Some(response))) = message else {
            continue;
        };
        if response.canceled() {
            let reason = format!(
                "compacted:{}:{}",
                response.compact_revision(),
                response.cancel_reason()
            );
            let _ = tx.send(Err(compacted_or(next, &reason))).await;
            return;
        }
        let batches = match batches(response.events()) {
            Ok(batches) => batches,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        for batch in batches {
            next = batch[0].mod_revision() + 1;
            if tx.send(Ok(batch)).await.is_err() {
                return;
            }
        }
    }
}

/// Opens the watch again, on any member, for up to twice the request timeout.
async fn resume(conn: &Conn, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
    let give_up = Instant::now() + conn.request_timeout * 2;
    loop {
        match conn.open_watch(prefix, from).await {
            Err(StoreError::Unavailable(e)) if Instant::now() < give_up => {
                tracing::debug!(error = %e, "resuming an etcd watch");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            other => return other.map(|(stream, _)| stream),
        }
    }
}

/// One renewal: opens the keep-alive stream on the current member if needed
/// (which renews once) or sends one renewal on it. Returns etcd's remaining TTL.
async fn renew(
    conn: &Conn,
    id: LeaseId,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<i64, Failure> {
    let (endpoint, i) = conn.current();
    let result = async {
        if let Some((keeper, responses)) = stream.as_mut() {
            keeper.keep_alive().await?;
            return match responses.message().await? {
                Some(response) => Ok(response.ttl()),
                None => Err(etcd_client::Error::LeaseKeepAliveError(
                    "the keep-alive stream closed".into(),
                )),
            };
        }
        let mut client = conn.members[i].1.clone();
        *stream = Some(client.lease_keep_alive(id).await?);
        Ok(1)
    }
    .await;
    result.map_err(|e| {
        *stream = None;
        conn.fail_over(i);
        failure(endpoint, &e, Some(id))
    })
}

/// Renews lease `id` every TTL/3 until the task is aborted (the [`Lease`] was
/// dropped) or the lease is lost.
async fn keep_lease(
    conn: Arc<Conn>,
    id: LeaseId,
    ttl: Duration,
    granted: Instant,
    lost: Arc<watch::Sender<bool>>,
) {
    let mut renewed = granted;
    let mut stream = None;
    let mut wake = granted + ttl / 3;
    loop {
        tokio::time::sleep_until(wake).await;
        let sent = Instant::now();
        let deadline = renewed + ttl * 2;
        if sent >= deadline {
            tracing::warn!(lease = id, "no etcd lease renewal succeeded for two TTLs");
            break;
        }
        // One try gets a third of the TTL at most: a member cut off the network
        // answers nothing, and the next member must still be asked in time.
        let limit = (deadline - sent).min(conn.request_timeout).min(ttl / 3);
        match tokio::time::timeout(limit, renew(&conn, id, &mut stream)).await {
            Ok(Ok(left)) if left > 0 => {
                renewed = sent;
                wake = sent + ttl / 3;
            }
            Ok(Ok(_))
            | Ok(Err(Failure {
                error: StoreError::LeaseGone(_),
                ..
            })) => {
                tracing::info!(lease = id, "etcd says the lease is gone");
                break;
            }
            Ok(Err(f)) => {
                tracing::debug!(lease = id, error = %f.error, "etcd lease renewal failed");
                wake = Instant::now() + RETRY_PAUSE;
            }
            Err(_) => {
                stream = None;
                conn.fail_over(conn.current().1);
                wake = Instant::now();
            }
        }
    }
    lost.send_replace(true);
}

#[async_trait::async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let response = self
            .conn
            .call(Retry::Always, Length::Short, None, |mut c| async move {
                c.get(key, None).await
            })
            .await?;
        response.kvs().first().map(key_value).transpose()
    }

    async fn range(&self, prefix: &str) -> Result<Range, StoreError> {
        let response = self
            .conn
            .call(Retry::Always, Length::Short, None, |mut c| async move {
                c.get(prefix, Some(GetOptions::new().with_prefix())).await
            })
            .await?;
        Ok(Range {
            kvs: response
                .kvs()
                .iter()
                .map(key_value)
                .collect::<Result<_, _>>()?,
            revision: revision_of(response.header())?,
        })
    }

    async fn txn(&self, when: Vec<Compare>, then: Vec<Op>) -> Result<TxnOutcome, StoreError> {
        let compares: Vec<etcd_client::Compare> = when
            .into_iter()
            .map(|c| match c {
                Compare::ModRevision(key, rev) => {
                    etcd_client::Compare::mod_revision(key, CompareOp::Equal, rev)
                }
                Compare::Value(key, value) => {
                    etcd_client::Compare::value(key, CompareOp::Equal, value)
                }
            })
            .collect();
        let lease = then.iter().find_map(|op| match op {
            Op::Put { lease, .. } => *lease,
            Op::Delete(_) => None,
        });
        let ops: Vec<TxnOp> = then
            .into_iter()
            .map(|op| match op {
                Op::Put { key, value, lease } => {
                    let options = lease.map(|id| etcd_client::PutOptions::new().with_lease(id));
                    TxnOp::put(key, value, options)
                }
                Op::Delete(key) => TxnOp::delete(key, None),
            })
            .collect();
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self
            .conn
            .call(Retry::IfNotSent, Length::Short, lease, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(TxnOutcome {
            succeeded: response.succeeded(),
            revision: revision_of(response.header())?,
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<Watch, StoreError> {
        let (stream, created) = self.conn.open_watch(prefix, from).await?;
        // A watch "from now" resumes after a member's loss from the revision it was
        // created at, not from "now" again: what came in between is not lost.
        let from = if from > 0 { from } else { created + 1 };
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let task = tokio::spawn(run_watch(
            self.conn.clone(),
            prefix.to_string(),
            from,
            stream,
            tx,
        ));
        Ok(Watch {
            events,
            _guard: Box::new(AbortOnDrop(task.abort_handle())),
        })
    }

    async fn lease(&self, ttl: Duration) -> Result<Lease, StoreError> {
        let seconds = (ttl.as_millis().div_ceil(1000) as i64).max(1);
        let asked = Instant::now();
        let response = self
            .conn
            .call(Retry::Always, Length::Short, None, |mut c| async move {
                c.lease_grant(seconds, None).await
            })
            .await?;
        if !response.error().is_empty() {
            return Err(StoreError::Other(format!(
                "etcd refused a lease: {}",
                response.error()
            )));
        }
        let id = response.id();
        let ttl = Duration::from_secs(response.ttl().max(1) as u64);
        let (lost_tx, lost) = watch::channel(false);
        let lost_tx = Arc::new(lost_tx);
        self.conn
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, Arc::downgrade(&lost_tx)));
        let task = tokio::spawn(keep_lease(self.conn.clone(), id, ttl, asked, lost_tx));
        Ok(Lease {
            id,
            ttl,
            lost,
            _keeper: Box::new(AbortOnDrop(task.abort_handle())),
        })
    }

    async fn revoke(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.conn
            .call(
                Retry::IfNotSent,
                Length::Short,
                Some(lease),
                |mut c| async move { c.lease_revoke(lease).await },
            )
            .await?;
        self.conn.mark_lost(lease);
        Ok(())
    }

    async fn campaign(
        &self,
        election: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<Leadership, StoreError> {
        crate::election::campaign(self, election, lease, value).await
    }

    async fn leader(&self, election: &str) -> Result<Option<KeyValue>, StoreError> {
        crate::election::leader(self, election).await
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), StoreError> {
        crate::election::resign(self, leadership).await
    }

    fn requests(&self) -> u64 {
        self.conn.requests.load(Ordering::Relaxed)
    }
}
