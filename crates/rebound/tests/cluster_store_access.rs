//! Identities and access in the cluster store, on a real three-member etcd with
//! mutual TLS ([`EtcdCluster`]): a certificate from another CA is refused, a host's
//! certificate writes only its own keys and the restores it is granted, and two
//! members of three keep serving when one is killed or cut off.

use std::process::Output;
use std::time::Duration;

use crate::common::etcd::{etcdctl, EtcdCluster};
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
            &["get", "/rebound/v1/", "--prefix"],
        );
        assert!(!o.status.success(), "{who}: {}", out(&o));
        let o = etcdctl(
            &c.endpoints(),
            &c.ca(),
            &crt,
            &key,
            &["put", "/rebound/v1/hosts/h1/x", "1"],
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
    ok(&c, "h1", &["get", "/rebound/v1/", "--prefix"]);
    // Nothing was written by them.
    assert_eq!(ok(&c, "root", &["get", "/rebound/v1/hosts/h1/x"]), "");

    // The store's own client is refused as well (store-init with the other CA's root).
    let o = c.rebound(&[
        "cluster",
        "store-init",
        "--etcd",
        &c.endpoints().join(","),
        "--ca",
        c.ca().to_str().unwrap(),
        "--cert",
        other.join("root.crt").to_str().unwrap(),
        "--key",
        other.join("root.key").to_str().unwrap(),
        "--hosts",
        "h1",
    ]);
    assert!(!o.status.success(), "{}", out(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("error: cannot connect to etcd at https://"),
        "{e}"
    );
    assert!(e.contains("BadCertificate"), "{e}");
}

#[test]
fn a_host_writes_only_its_own_keys_and_the_restores_it_is_granted() {
    let c = EtcdCluster::start();
    ok(&c, "h1", &["put", "/rebound/v1/hosts/h1/x", "mine"]);
    ok(&c, "h2", &["put", "/rebound/v1/hosts/h2/x", "h2's"]);
    denied(&c, "h1", &["put", "/rebound/v1/hosts/h2/x", "not mine"]);
    denied(&c, "h1", &["del", "/rebound/v1/hosts/h2/x"]);
    // A longer host name that starts with h1's is another host.
    denied(&c, "h1", &["put", "/rebound/v1/hosts/h10/x", "not mine"]);
    denied(
        &c,
        "h1",
        &["put", "/rebound/v1/restores/r1/x", "not granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v1/clusters/c1", "the operator's"],
    );
    denied(&c, "h1", &["put", "/elsewhere", "outside the layout"]);
    // Every host reads every host's records; nothing outside the layout.
    assert_eq!(
        ok(
            &c,
            "h1",
            &["get", "/rebound/v1/hosts/h2/x", "--print-value-only"]
        )
        .trim(),
        "h2's"
    );
    denied(&c, "h1", &["get", "/elsewhere"]);
    assert_eq!(
        ok(
            &c,
            "root",
            &["get", "/rebound/v1/hosts/h2/x", "--print-value-only"]
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
    ok(&c, "h1", &["put", "/rebound/v1/restores/r1/x", "granted"]);
    ok(
        &c,
        "h1",
        &["put", "/rebound/v1/restores/r1/election/x", "granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v1/restores/r2/x", "not granted"],
    );
    denied(
        &c,
        "h1",
        &["put", "/rebound/v1/restores/r10/x", "not granted"],
    );
    denied(
        &c,
        "h2",
        &["put", "/rebound/v1/restores/r1/x", "not taking part"],
    );

    // store-init again, idempotent: the grants are kept, h1 still confined.
    let again = [
        "cluster",
        "store-init",
        "--etcd",
        &c.endpoints().join(","),
        "--ca",
        c.ca().to_str().unwrap(),
        "--cert",
        c.cert("root").0.to_str().unwrap(),
        "--key",
        c.cert("root").1.to_str().unwrap(),
        "--hosts",
        "h1,h2,h3",
    ];
    c.rebound_ok(&again);
    ok(
        &c,
        "h1",
        &["put", "/rebound/v1/restores/r1/x", "still granted"],
    );
    denied(&c, "h1", &["put", "/rebound/v1/hosts/h2/x", "not mine"]);

    // Once the restore is over its write access goes; the records stay readable.
    rt().block_on(async {
        use rebound_store::access;
        let mut client = access::connect(&endpoints, &tls).await.unwrap();
        access::revoke_restore(&mut client, "r1").await.unwrap();
        access::revoke_restore(&mut client, "r1").await.unwrap();
    });
    denied(&c, "h1", &["put", "/rebound/v1/restores/r1/x", "revoked"]);
    assert_eq!(
        ok(
            &c,
            "h1",
            &["get", "/rebound/v1/restores/r1/x", "--print-value-only"]
        )
        .trim(),
        "still granted"
    );
}

#[test]
fn two_members_of_three_keep_serving_when_one_is_killed_or_cut_off() {
    let mut c = EtcdCluster::start();
    ok(&c, "h1", &["put", "/rebound/v1/hosts/h1/a", "1"]);

    // h3's network cut: h1 and h2 still take writes; h3 is not reached.
    c.cut("h3");
    for m in ["h1", "h2"] {
        let o = c.etcdctl_on(m, "h1", &["put", "/rebound/v1/hosts/h1/b", m]);
        assert!(o.status.success(), "{m}: {}\n{}", out(&o), c.logs());
    }
    let o = c.etcdctl_on("h3", "root", &["get", "/rebound/v1/hosts/h1/b"]);
    assert!(
        !o.status.success(),
        "h3 answered while cut off: {}",
        out(&o)
    );
    // Healed: h3 catches up with what it missed.
    c.heal("h3");
    eventually(Duration::from_secs(30), "h3 to catch up", || {
        let o = c.etcdctl_on(
            "h3",
            "root",
            &["get", "/rebound/v1/hosts/h1/b", "--print-value-only"],
        );
        (o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "h2").then_some(())
    });

    // h2's member killed: the other two still answer and agree.
    c.kill_member("h2");
    for m in ["h1", "h3"] {
        let o = c.etcdctl_on(m, "h1", &["put", "/rebound/v1/hosts/h1/c", m]);
        assert!(o.status.success(), "{m}: {}\n{}", out(&o), c.logs());
        let o = c.etcdctl_on(
            m,
            "h3",
            &["get", "/rebound/v1/hosts/h1/c", "--print-value-only"],
        );
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), m, "{}", out(&o));
    }
    let o = c.etcdctl_on("h2", "root", &["get", "/rebound/v1/hosts/h1/c"]);
    assert!(!o.status.success(), "a killed member answered: {}", out(&o));
    // Back on its data, it rejoins and has the write it missed.
    c.restart_member("h2");
    eventually(Duration::from_secs(30), "h2 to rejoin", || {
        let o = c.etcdctl_on(
            "h2",
            "root",
            &["get", "/rebound/v1/hosts/h1/c", "--print-value-only"],
        );
        (o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "h3").then_some(())
    });
}
