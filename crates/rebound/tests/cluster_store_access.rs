//! Identities and access in the cluster store, on a real three-member etcd with
//! mutual TLS ([`EtcdCluster`]): a certificate from another CA is refused, a host's
//! certificate writes only its own keys and the restores it is granted, and two
//! members of three keep serving when one is killed or cut off.

use std::process::Output;
use std::time::Duration;

use crate::common::etcd::{etcdctl, EtcdCluster, HOSTS};
use crate::common::eventually;

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `etcdctl` as `who` must succeed; its stdout.
fn ok(c: &EtcdCluster, who: &str, args: &[&str]) -> String {
    let o = c.etcdctl(who, args);
    assert!(o.status.success(), "etcdctl {args:?} as {who}: {}", out(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `etcdctl` as `who` must be refused for want of permission.
fn denied(c: &EtcdCluster, who: &str, args: &[&str]) {
    let o = c.etcdctl(who, args);
    assert!(!o.status.success(), "etcdctl {args:?} as {who} succeeded");
    assert!(
        out(&o).contains("permission denied"),
        "etcdctl {args:?} as {who}: {}",
        out(&o)
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().unwrap()
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let c = EtcdCluster::start();
    let other = c.dir.path().join("other");
    c.rebound_ok(&[
        "cluster",
        "certs",
        "--hosts",
        "h1",
        "--out",
        other.to_str().unwrap(),
    ]);
    // An existing CA is kept: a second run is refused with one line.
    let o = c.rebound(&[
        "cluster",
        "certs",
        "--hosts",
        "h1",
        "--out",
        other.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.contains("already holds a CA"), "{e}");

    // The members' CA is trusted, but the client's certificate is not the cluster's:
    // the members refuse it in the TLS handshake, for the host and for the operator.
    for who in ["h1", "root"] {
        let (crt, key) = (
            other.join(format!("{who}.crt")),
            other.join(format!("{who}.key")),
        );
        let o = etcdctl(
            &c.endpoints(),
            &c.ca(),
            &crt,
            &key,
            &["get", "/rebound/v2/", "--prefix"],
        );
        assert!(!o.status.success(), "{who}: {}", out(&o));
        let o = etcdctl(
            &c.endpoints(),
            &c.ca(),
            &crt,
            &key,
            &["put", "/rebound/v2/hosts/h1/x", "1"],
        );
        assert!(!o.status.success(), "{who}: {}", out(&o));
    }
    // It was the certificate: the members say so, and the same call with the
    // cluster's own certificate goes through.
    for h in ["h1", "h2", "h3"] {
        let log = c.log(h);
        assert!(
            log.contains("rejected connection")
                && log.contains("certificate signed by unknown authority"),
            "{h}: {}",
            c.logs()
        );
    }
    ok(&c, "h1", &["get", "/rebound/v2/", "--prefix"]);
    // Nothing was written by them.
    assert_eq!(ok(&c, "root", &["get", "/rebound/v2/hosts/h1/x"]), "");

    // The store's own client is refused as well (store-init with the other CA's root).
    let o = c.store_init(&other.join("root.crt"), &other.join("root.key"), "h1");
    assert!(!o.status.success(), "{}", out(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("error: cannot connect to etcd at https://"),
        "{e}"
    );
}

#[test]
fn a_host_writes_only_its_own_keys_and_the_restores_it_is_granted() {
    let c = EtcdCluster::start();
    ok(&c, "h1", &["put", "/rebound/v2/hosts/h1/x", "mine"]);
    ok(&c, "h2", &["put", "/rebound/v2/hosts/h2/x", "h2's"]);
    denied(&c, "h1", &["put", "/rebound/v2/hosts/h2/x", "not mine"]);
    denied(&c, "h1", &["del", "/rebound/v2/hosts/h2/x"]);
    // A longer host name that starts with h1's is another host.
    denied(&c, "h1", &["put", "/rebound/v2/hosts/h10/x", "not mine"]);
    // VM records: its own host's only.
    ok(&c, "h1", &["put", "/rebound/v2/vms/h1/a", "mine"]);
    denied(&c, "h1", &["put", "/rebound/v2/vms/h2/a", "not mine"]);
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/restores/r1/x", "not granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/phases/r1/h1/a", "not granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/clusters/c1", "the operator's"],
    );
    denied(&c, "h1", &["put", "/elsewhere", "outside the layout"]);
    // Every host reads every host's records; nothing outside the layout.
    assert_eq!(
        ok(
            &c,
            "h1",
            &["get", "/rebound/v2/hosts/h2/x", "--print-value-only"]
        )
        .trim(),
        "h2's"
    );
    denied(&c, "h1", &["get", "/elsewhere"]);
    assert_eq!(
        ok(
            &c,
            "root",
            &["get", "/rebound/v2/hosts/h2/x", "--print-value-only"]
        )
        .trim(),
        "h2's"
    );

    // The restore's submitter (root) lets h1 write restore r1's records, not r2's.
    let hosts = vec!["h1".to_string()];
    let tls = c.tls("root");
    let endpoints = c.endpoints();
    rt().block_on(async {
        use rebound_store::access;
        let mut client = access::connect(&endpoints, &tls).await.unwrap();
        access::grant_restore(&mut client, "r1", &hosts)
            .await
            .unwrap();
        // Granting twice changes nothing.
        access::grant_restore(&mut client, "r1", &hosts)
            .await
            .unwrap();
        // A host without a store user is named.
        let e = access::grant_restore(&mut client, "r1", &["h9".to_string()])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("\"h9\" has no store user"), "{e}");
    });
    ok(&c, "h1", &["put", "/rebound/v2/restores/r1/x", "granted"]);
    // Any host of the restore may coordinate it: it writes every VM's phase.
    ok(&c, "h1", &["put", "/rebound/v2/phases/r1/h2/a", "granted"]);
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/phases/r2/h1/a", "not granted"],
    );
    ok(
        &c,
        "h1",
        &["put", "/rebound/v2/restores/r1/election/x", "granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/restores/r2/x", "not granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v2/restores/r10/x", "not granted"],
    );
    denied(
        &c,
        "h2",
        &["put", "/rebound/v2/restores/r1/x", "not taking part"],
    );

    // store-init again, idempotent: the grants are kept, h1 still confined.
    let (crt, key) = c.cert("root");
    let o = c.store_init(&crt, &key, "h1,h2,h3");
    assert!(o.status.success(), "{}", out(&o));
    ok(
        &c,
        "h1",
        &["put", "/rebound/v2/restores/r1/x", "still granted"],
    );
    denied(&c, "h1", &["put", "/rebound/v2/hosts/h2/x", "not mine"]);

    // Once the restore is over its write access goes; the records stay readable.
    rt().block_on(async {
        use rebound_store::access;
        let mut client = access::connect(&endpoints, &tls).await.unwrap();
        access::revoke_restore(&mut client, "r1").await.unwrap();
        access::revoke_restore(&mut client, "r1").await.unwrap();
    });
    denied(&c, "h1", &["put", "/rebound/v2/restores/r1/x", "revoked"]);
    denied(&c, "h1", &["put", "/rebound/v2/phases/r1/h1/a", "revoked"]);
    assert_eq!(
        ok(
            &c,
            "h1",
            &["get", "/rebound/v2/restores/r1/x", "--print-value-only"]
        )
        .trim(),
        "still granted"
    );
}

/// Writes `value` through member `m` (retrying while a new leader is elected) and
/// returns how long that took.
fn write_through(c: &EtcdCluster, m: &str, key: &str, value: &str) -> Duration {
    let t0 = std::time::Instant::now();
    eventually(
        Duration::from_secs(20),
        &format!("a write through {m}"),
        || {
            // Short tries: a request made before the new leader is dropped.
            let o = c.etcdctl_on(m, "h1", &["--command-timeout=1s", "put", key, value]);
            o.status.success().then_some(())
        },
    );
    t0.elapsed()
}

/// Waits until member `m` reads `value` at `key`.
fn reads(c: &EtcdCluster, m: &str, key: &str, value: &str) {
    eventually(
        Duration::from_secs(30),
        &format!("{m} to read {value}"),
        || {
            let o = c.etcdctl_on(m, "root", &["get", key, "--print-value-only"]);
            (o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == value).then_some(())
        },
    );
}

/// With host `gone`'s member out (`how`), each of the other two takes a write of
/// `key` (after a new leader is elected) that the third sees, and `gone`'s member
/// does not answer; returns the value the last write left.
fn the_others_serve(c: &EtcdCluster, gone: &str, how: &str, key: &str) -> String {
    let live: Vec<&str> = HOSTS.into_iter().filter(|h| *h != gone).collect();
    for m in &live {
        let took = write_through(c, m, key, m);
        eprintln!("write through {m} with {gone} {how}: {took:?}");
        reads(c, live.iter().find(|o| *o != m).unwrap(), key, m);
    }
    let o = c.etcdctl_on(gone, "root", &["get", key]);
    assert!(!o.status.success(), "{gone} answered, {how}: {}", out(&o));
    assert_ne!(c.leader(), gone);
    live[1].to_string()
}

#[test]
fn two_members_of_three_keep_serving_when_the_leaders_host_is_cut_off_or_killed() {
    let mut c = EtcdCluster::start();
    ok(&c, "h1", &["put", "/rebound/v2/hosts/h1/a", "1"]);

    // The leader's host cut off; healed, it catches up.
    let cut = c.leader();
    c.cut(&cut);
    let key = "/rebound/v2/hosts/h1/b";
    let last = the_others_serve(&c, &cut, "cut off", key);
    c.heal(&cut);
    reads(&c, &cut, key, &last);

    // The leader's member killed; back on its data, it rejoins with what it missed.
    let dead = c.leader();
    c.kill_member(&dead);
    let key = "/rebound/v2/hosts/h1/c";
    let last = the_others_serve(&c, &dead, "killed", key);
    c.restart_member(&dead);
    reads(&c, &dead, key, &last);
}

/// A client whose member is cut off the network (it answers nothing and closes
/// nothing) keeps its lease and its watch: the lease's renewal gives up on that
/// member within a third of the TTL and asks the next one, and the watch moves with
/// it, so a write through another member still arrives, and the lease outlives two
/// TTLs of the cut.
#[test]
fn a_client_of_a_member_cut_off_keeps_its_lease_and_its_watch() {
    use rebound_store::etcd::{EtcdConfig, EtcdStore};
    use rebound_store::{Event, Store};
    let c = EtcdCluster::start();
    // h3's member first: the client talks to it until it fails.
    let mut endpoints = vec![c.endpoint("h3")];
    endpoints.extend(["h1", "h2"].map(|h| c.endpoint(h)));
    let mut config = EtcdConfig::new(endpoints);
    config.tls = Some(c.tls("h1"));
    rt().block_on(async {
        let s = EtcdStore::connect(&config).await.unwrap();
        assert_eq!(s.current_endpoint(), c.endpoint("h3"));
        let lease = s.lease(Duration::from_secs(5)).await.unwrap();
        s.put("/rebound/v2/hosts/h1/info", b"1".to_vec(), Some(lease.id))
            .await
            .unwrap();
        let mut w = s.watch("/rebound/v2/hosts/h1/", 0).await.unwrap();

        c.cut("h3");
        let cut_at = std::time::Instant::now();
        // Written through another member while this client's is cut off (once the
        // other two have a leader, if the cut member led).
        write_through(&c, "h1", "/rebound/v2/hosts/h1/after", "2");
        // Within two TTLs: the transport's own keep-alive would notice the dead
        // member only after 15 s.
        let seen = tokio::time::timeout(lease.ttl * 2, async {
            while let Some(batch) = w.events.recv().await {
                if batch
                    .unwrap()
                    .iter()
                    .any(|e| matches!(e, Event::Put(kv) if kv.key.ends_with("/after")))
                {
                    return cut_at.elapsed();
                }
            }
            panic!("the watch ended");
        })
        .await
        .expect("the write through another member reached the watch");
        eprintln!("seen {seen:?} after the cut");
        assert_ne!(s.current_endpoint(), c.endpoint("h3"));
        tokio::time::sleep(lease.ttl * 2).await;
        assert!(!*lease.lost.borrow(), "the lease was lost with the member");
        assert!(s.get("/rebound/v2/hosts/h1/info").await.unwrap().is_some());
    });
    c.heal("h3");
}
