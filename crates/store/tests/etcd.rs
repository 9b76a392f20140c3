//! The conformance suite on [`EtcdStore`] against a real etcd this test starts,
//! and etcd's own parts: mutual TLS, failover between members, compaction.

#[macro_use]
mod common;

use std::path::Path;
use std::time::Duration;

use common::etcd_server::{temp_dir, EtcdCluster, ServerTls};
use common::{next_batch, within, Fixture};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rebound_store::etcd::{EtcdConfig, EtcdStore, TlsFiles};
use rebound_store::{Event, Store, StoreError};

struct EtcdFixture {
    server: EtcdCluster,
    a: EtcdStore,
    b: EtcdStore,
}

impl Fixture for EtcdFixture {
    fn store(&self) -> &dyn Store {
        &self.a
    }
    fn second(&self) -> &dyn Store {
        &self.b
    }
    /// etcd cannot cut one client off, so the member hangs (SIGSTOP) instead.
    fn cut(&self, cut: bool) {
        self.server.pause(0, cut);
    }
}

fn config(endpoints: Vec<String>) -> EtcdConfig {
    EtcdConfig {
        endpoints,
        tls: None,
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
    }
}

async fn start(members: usize, tls: Option<ServerTls>) -> EtcdCluster {
    tokio::task::spawn_blocking(move || EtcdCluster::start(members, tls.as_ref()))
        .await
        .expect("start etcd")
}

async fn etcd() -> EtcdFixture {
    let server = start(1, None).await;
    let a = EtcdStore::connect(&config(server.endpoints.clone()))
        .await
        .expect("connect");
    let b = EtcdStore::connect(&config(server.endpoints.clone()))
        .await
        .expect("connect");
    EtcdFixture { server, a, b }
}

conformance!(etcd);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_compacted_revision_fails() {
    let f = etcd().await;
    let s = &f.a;
    let first = s.put("cp/k", b"1".to_vec(), None).await.unwrap();
    let last = s.put("cp/k", b"2".to_vec(), None).await.unwrap();
    let mut raw = etcd_client::Client::connect(&f.server.endpoints, None)
        .await
        .unwrap();
    raw.compact(last, None).await.unwrap();
    // etcd may refuse at creation or cancel right after: either way, Compacted.
    let error = match s.watch("cp/", first).await {
        Err(e) => e,
        Ok(mut w) => within(Duration::from_secs(5), "cancel", w.events.recv())
            .await
            .expect("an error before the watch ends")
            .expect_err("no events from a compacted revision"),
    };
    assert_eq!(error, StoreError::Compacted(first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_store_is_unavailable() {
    let dir = temp_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let error = EtcdStore::connect(&config(vec![url.clone()]))
        .await
        .err()
        .expect("nothing listens there");
    assert!(
        matches!(&error, StoreError::Unavailable(m) if m.contains(&url)),
        "{error}"
    );

    let mut tls = config(vec![format!("127.0.0.1:{port}")]);
    let missing = dir.path().join("missing.pem");
    tls.tls = Some(TlsFiles {
        ca: missing.clone(),
        cert: missing.clone(),
        key: missing.clone(),
    });
    let error = EtcdStore::connect(&tls).await.err().expect("no CA file");
    assert!(
        error.to_string().contains(&missing.display().to_string()),
        "the error names the file: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_one_killed_keeps_serving() {
    let mut cluster = start(3, None).await;
    // A leader's death costs an election (a second or more on a loaded machine),
    // during which no member answers: the TTL and timeout leave room for it.
    let patient = |endpoints| EtcdConfig {
        request_timeout: Duration::from_secs(5),
        ..config(endpoints)
    };
    let s = EtcdStore::connect(&patient(cluster.endpoints.clone()))
        .await
        .unwrap();
    let lease = s.lease(Duration::from_secs(3)).await.unwrap();
    s.put("fo/held", b"1".to_vec(), Some(lease.id))
        .await
        .unwrap();
    let leader = s.campaign("fo-election", lease.id, b"me").await.unwrap();
    let mut w = s.watch("fo/", 0).await.unwrap();

    // Kill the member this client talks to.
    let current = s.current_endpoint().to_string();
    let killed = cluster
        .endpoints
        .iter()
        .position(|e| *e == current)
        .expect("the current endpoint is a member");
    cluster.kill(killed);

    // Reads go on at once through the other members.
    assert!(s
        .get("fo/held")
        .await
        .expect("a read after the kill")
        .is_some());
    // A write sent while the dead member was the raft leader may be lost with it
    // and time out (ambiguous, so not retried here); once the others have elected
    // a leader, writes go through.
    let killed_at = std::time::Instant::now();
    let rev = loop {
        match s.put("fo/after", b"2".to_vec(), None).await {
            Ok(rev) => break rev,
            Err(StoreError::Unavailable(e)) if killed_at.elapsed() < Duration::from_secs(15) => {
                eprintln!("write after the kill: {e}");
            }
            Err(e) => panic!("no write within 15 s of the kill of {current}: {e}"),
        }
    };
    eprintln!("first write after the kill: {:?}", killed_at.elapsed());
    assert_ne!(s.current_endpoint(), current, "moved to another member");
    assert_eq!(s.get("fo/after").await.unwrap().unwrap().mod_revision, rev);
    let batch = next_batch(&mut w).await;
    assert!(
        matches!(&batch[..], [Event::Put(kv)] if kv.key == "fo/after"),
        "{batch:?}"
    );

    // The lease is renewed through the others, so the leadership stands.
    tokio::time::sleep(lease.ttl * 2).await;
    assert!(
        !*lease.lost.borrow(),
        "the lease was lost with one member of three"
    );
    assert!(s.get("fo/held").await.unwrap().is_some());
    let now = s.leader("fo-election").await.unwrap().expect("a leader");
    assert_eq!(now.key, leader.key);

    // A new client whose first endpoint is the dead member connects too.
    let mut endpoints = cluster.endpoints.clone();
    endpoints.rotate_left(killed);
    let fresh = EtcdStore::connect(&patient(endpoints))
        .await
        .expect("connect");
    assert_eq!(fresh.get("fo/after").await.unwrap().unwrap().value, b"2");
}

/// A CA: its certificate's PEM and an issuer for the certificates it signs.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, Issuer::new(params, key))
}

/// A certificate for 127.0.0.1 signed by `issuer`, written as `<name>.pem` and
/// `<name>-key.pem` in `dir`.
fn leaf(
    dir: &Path,
    name: &str,
    issuer: &Issuer<'static, KeyPair>,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}-key.pem")),
    );
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_admits_own_ca_and_refuses_another() {
    let dir = temp_dir();
    let (ca_pem, issuer) = ca("rebound test CA");
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    let (server_cert, server_key) = leaf(dir.path(), "server", &issuer);
    let (client_cert, client_key) = leaf(dir.path(), "host1", &issuer);
    let (_, other_issuer) = ca("another CA");
    let (other_cert, other_key) = leaf(dir.path(), "intruder", &other_issuer);

    let server = start(
        1,
        Some(ServerTls {
            ca: ca_path.clone(),
            cert: server_cert,
            key: server_key,
        }),
    )
    .await;
    let with = |cert, key| EtcdConfig {
        tls: Some(TlsFiles {
            ca: ca_path.clone(),
            cert,
            key,
        }),
        ..config(server.endpoints.clone())
    };

    let s = EtcdStore::connect(&with(client_cert, client_key))
        .await
        .expect("a client with the cluster CA's certificate");
    s.put("tls/k", b"1".to_vec(), None).await.unwrap();
    assert_eq!(s.get("tls/k").await.unwrap().unwrap().value, b"1");

    let refused = EtcdStore::connect(&with(other_cert, other_key)).await;
    let error = refused
        .err()
        .expect("a certificate from another CA is refused");
    match &error {
        StoreError::Denied(m) | StoreError::Unavailable(m) => {
            assert!(m.contains(&server.endpoints[0]), "names the endpoint: {m}")
        }
        other => panic!("neither Denied nor Unavailable: {other:?}"),
    }
    eprintln!("another CA's certificate: {error}");

    // Plain HTTP to a TLS member is refused too, not hung.
    let plain = config(
        server
            .endpoints
            .iter()
            .map(|e| e.replace("https", "http"))
            .collect(),
    );
    let error = EtcdStore::connect(&plain)
        .await
        .err()
        .expect("plain HTTP refused");
    eprintln!("plain HTTP to a TLS member: {error}");
}
