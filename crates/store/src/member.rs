//! The command line of one etcd member of a cluster whose members each have their
//! own address (a simulated host's namespace, or a small setup's hosts): mutual TLS
//! for clients and for peers, and the timing a loaded machine needs. `rebound
//! cluster start` and the tests start members with it.

use std::ffi::OsString;
use std::path::Path;

use crate::access::TlsFiles;

/// The client port of every member.
pub const CLIENT_PORT: u16 = 2379;
/// The peer port of every member.
pub const PEER_PORT: u16 = 2380;

/// One member: its name and address, its data, the whole cluster's members
/// (name, address) and its TLS identity.
pub struct Member<'a> {
    pub name: &'a str,
    pub ip: &'a str,
    pub data_dir: &'a Path,
    pub cluster: &'a [(String, String)],
    /// Distinguishes this cluster's members from another's on the same network.
    pub token: &'a str,
    pub tls: &'a TlsFiles,
}

impl Member<'_> {
    /// `etcd`'s arguments (the program's name not included). The member joins as
    /// `new` unless its data directory exists, in which case it starts on that.
    pub fn args(&self) -> Vec<OsString> {
        let url = |port: u16| format!("https://{}:{port}", self.ip);
        let initial: Vec<String> = self
            .cluster
            .iter()
            .map(|(n, ip)| format!("{n}=https://{ip}:{PEER_PORT}"))
            .collect();
        let state = if self.data_dir.exists() {
            "existing"
        } else {
            "new"
        };
        let t = self.tls;
        let mut a: Vec<OsString> = Vec::new();
        let mut kv = |k: &str, v: &dyn AsRef<std::ffi::OsStr>| {
            a.push(k.into());
            a.push(v.as_ref().to_os_string());
        };
        kv("--name", &self.name);
        kv("--data-dir", &self.data_dir);
        kv("--listen-client-urls", &url(CLIENT_PORT));
        kv("--advertise-client-urls", &url(CLIENT_PORT));
        kv("--listen-peer-urls", &url(PEER_PORT));
        kv("--initial-advertise-peer-urls", &url(PEER_PORT));
        kv("--initial-cluster", &initial.join(","));
        kv("--initial-cluster-state", &state);
        kv("--initial-cluster-token", &self.token);
        // Members sharing a small machine's CPUs: a slow heartbeat is not a dead
        // leader.
        kv("--heartbeat-interval", &"200");
        kv("--election-timeout", &"2000");
        kv("--trusted-ca-file", &t.ca);
        kv("--cert-file", &t.cert);
        kv("--key-file", &t.key);
        kv("--peer-trusted-ca-file", &t.ca);
        kv("--peer-cert-file", &t.cert);
        kv("--peer-key-file", &t.key);
        // A member cut off and joined again asks before it campaigns, instead of
        // forcing an election on the others that went on without it.
        a.push("--pre-vote".into());
        a.push("--client-cert-auth".into());
        a.push("--peer-client-cert-auth".into());
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_member_names_every_peer_and_its_own_identity() {
        let tls = TlsFiles {
            ca: PathBuf::from("/p/ca.crt"),
            cert: PathBuf::from("/p/h2.crt"),
            key: PathBuf::from("/p/h2.key"),
        };
        let cluster = [
            ("h1".to_string(), "10.0.0.1".to_string()),
            ("h2".to_string(), "10.0.0.2".to_string()),
        ];
        let m = Member {
            name: "h2",
            ip: "10.0.0.2",
            data_dir: Path::new("/nonexistent/data"),
            cluster: &cluster,
            token: "rebound-c",
            tls: &tls,
        };
        let a: Vec<String> = m
            .args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let after = |k: &str| a[a.iter().position(|x| x == k).unwrap() + 1].clone();
        assert_eq!(
            after("--initial-cluster"),
            "h1=https://10.0.0.1:2380,h2=https://10.0.0.2:2380"
        );
        assert_eq!(after("--listen-client-urls"), "https://10.0.0.2:2379");
        assert_eq!(after("--initial-cluster-state"), "new");
        assert_eq!(after("--peer-cert-file"), "/p/h2.crt");
        for flag in [
            "--client-cert-auth",
            "--peer-client-cert-auth",
            "--pre-vote",
        ] {
            assert_eq!(a.iter().filter(|x| *x == flag).count(), 1, "{flag}");
        }
    }
}
