//! Where everything lives in the cluster store: the key layout, version 2. The
//! whole layout, with each record's fields and who writes it, is described in
//! `docs/cluster-store.md`; this module is its one implementation.
//!
//! ```text
//! /rebound/v2/hosts/<host>/info             HostRecord, on the host's lease
//! /rebound/v2/hosts/<host>/snapshots        SnapshotsRecord: its snapshot catalog
//! /rebound/v2/restores/<id>/plan            PlanRecord: written once by the submitter
//! /rebound/v2/restores/<id>/state           StateRecord: the restore's status
//! /rebound/v2/restores/<id>/election/...    the restore's coordinator election
//! /rebound/v2/phases/<id>/<host>/<vm>       PhaseRecord: one VM's phase
//! /rebound/v2/vms/<host>/<vm>               VmRecord: what the host's daemon runs
//! /rebound/v2/clusters/<name>               ClusterRecord: a cluster's definition
//! ```
//!
//! Records that change with every VM (phases, VM records) are kept out of the
//! prefixes every daemon watches (`hosts/`, `restores/`), and a phase's key names
//! its host: a daemon watches only its own VMs' phases, the coordinator a whole
//! restore's, so the store's work per change does not grow with the number of hosts.
//!
//! Host, VM and restore names are checked before they become part of a key, so a
//! name can never reach into another host's or restore's keys.

/// Every key starts with this; the version changes with any change of the keys
/// (the store's access rules grant under the same prefix).
pub const ROOT: &str = rebound_store::access::PREFIX;

/// Why a name cannot be used in a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("host name {0:?} is not 1 to 63 characters of a-z, 0-9 and '-' starting with a letter or digit")]
    Host(String),
    #[error("VM name {0:?} is not 1 to 63 characters of letters, digits, '_', '.' and '-' starting with a letter or digit")]
    Vm(String),
    #[error("restore id {0:?} is not 1 to 64 characters of letters, digits, '_', '.' and '-' not starting with '.'")]
    Restore(String),
}

/// A host's name as it appears in keys, in its certificate's user name and as a
/// DNS name in it (the store's access rules use the same check).
pub fn check_host(name: &str) -> Result<(), NameError> {
    if rebound_store::access::valid_host(name) {
        Ok(())
    } else {
        Err(NameError::Host(name.to_string()))
    }
}

/// A VM's name: the daemon API's pattern. No '/' can reach another key.
pub fn check_vm(name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(NameError::Vm(name.to_string()))
    }
}

/// A restore's id (the store's access rules use the same check).
pub fn check_restore(name: &str) -> Result<(), NameError> {
    if rebound_store::access::valid_restore_id(name) {
        Ok(())
    } else {
        Err(NameError::Restore(name.to_string()))
    }
}

pub fn hosts() -> String {
    format!("{ROOT}hosts/")
}

pub fn host(host: &str) -> String {
    format!("{ROOT}hosts/{host}/")
}

pub fn host_info(host: &str) -> String {
    format!("{ROOT}hosts/{host}/info")
}

/// Every host's VM records.
pub fn vms() -> String {
    format!("{ROOT}vms/")
}

pub fn host_vms(host: &str) -> String {
    format!("{ROOT}vms/{host}/")
}

pub fn host_vm(host: &str, vm: &str) -> String {
    format!("{ROOT}vms/{host}/{vm}")
}

pub fn host_snapshots(host: &str) -> String {
    format!("{ROOT}hosts/{host}/snapshots")
}

pub fn cluster(name: &str) -> String {
    format!("{ROOT}clusters/{name}")
}

pub fn restores() -> String {
    format!("{ROOT}restores/")
}

pub fn restore(id: &str) -> String {
    format!("{ROOT}restores/{id}/")
}

pub fn plan(id: &str) -> String {
    format!("{ROOT}restores/{id}/plan")
}

pub fn state(id: &str) -> String {
    format!("{ROOT}restores/{id}/state")
}

/// Every VM's phase in restore `id`.
pub fn phases(id: &str) -> String {
    format!("{ROOT}phases/{id}/")
}

/// Host `host`'s VMs' phases in restore `id`.
pub fn host_phases(id: &str, host: &str) -> String {
    format!("{ROOT}phases/{id}/{host}/")
}

pub fn phase(id: &str, host: &str, vm: &str) -> String {
    format!("{ROOT}phases/{id}/{host}/{vm}")
}

pub fn election(id: &str) -> String {
    format!("{ROOT}restores/{id}/election")
}

/// What a key under [`ROOT`] is, parsed back (names checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key<'a> {
    HostInfo {
        host: &'a str,
    },
    HostVm {
        host: &'a str,
        vm: &'a str,
    },
    HostSnapshots {
        host: &'a str,
    },
    Plan {
        restore: &'a str,
    },
    State {
        restore: &'a str,
    },
    Phase {
        restore: &'a str,
        host: &'a str,
        vm: &'a str,
    },
    Election {
        restore: &'a str,
    },
    Cluster {
        name: &'a str,
    },
    Other,
}

pub fn parse(key: &str) -> Key<'_> {
    let Some(rest) = key.strip_prefix(ROOT) else {
        return Key::Other;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    let k = match parts.as_slice() {
        ["hosts", h, "info"] => Key::HostInfo { host: h },
        ["hosts", h, "snapshots"] => Key::HostSnapshots { host: h },
        ["vms", h, v] if check_vm(v).is_ok() => Key::HostVm { host: h, vm: v },
        ["restores", r, "plan"] => Key::Plan { restore: r },
        ["restores", r, "state"] => Key::State { restore: r },
        ["phases", r, h, v] if check_vm(v).is_ok() && check_host(h).is_ok() => Key::Phase {
            restore: r,
            host: h,
            vm: v,
        },
        ["restores", r, "election", ..] => Key::Election { restore: r },
        ["clusters", c] => Key::Cluster { name: c },
        _ => return Key::Other,
    };
    let name_ok = match &k {
        Key::HostInfo { host } | Key::HostVm { host, .. } | Key::HostSnapshots { host } => {
            check_host(host).is_ok()
        }
        Key::Plan { restore }
        | Key::State { restore }
        | Key::Phase { restore, .. }
        | Key::Election { restore } => check_restore(restore).is_ok(),
        Key::Cluster { name } => check_restore(name).is_ok(),
        Key::Other => true,
    };
    if name_ok {
        k
    } else {
        Key::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_reach_other_keys() {
        let long = "x".repeat(64);
        for bad in ["", "a/b", "..", "A", "-a", &long, "a b", "h\n", "a.b"] {
            assert!(check_host(bad).is_err(), "{bad:?}");
        }
        for good in ["h1", "host-2", &long[..63]] {
            assert!(check_host(good).is_ok(), "{good:?}");
        }
        let longer = "x".repeat(65);
        for bad in ["", "a/b", "..", ".x", &longer] {
            assert!(
                check_vm(bad).is_err() && check_restore(bad).is_err(),
                "{bad:?}"
            );
        }
        for good in ["Web-1", "vm_3", "a.b"] {
            assert!(
                check_vm(good).is_ok() && check_restore(good).is_ok(),
                "{good:?}"
            );
        }
    }

    #[test]
    fn keys_parse_back() {
        assert_eq!(parse(&host_info("h1")), Key::HostInfo { host: "h1" });
        assert_eq!(
            parse(&phase("r1", "h1", "vm-a")),
            Key::Phase {
                restore: "r1",
                host: "h1",
                vm: "vm-a"
            }
        );
        assert_eq!(
            parse(&host_vm("h1", "vm-a")),
            Key::HostVm {
                host: "h1",
                vm: "vm-a"
            }
        );
        assert_eq!(parse("/rebound/v2/phases/r1/H1/vm-a"), Key::Other);
        // The prefixes every daemon watches hold no per-VM record.
        for k in [phase("r1", "h1", "a"), host_vm("h1", "a")] {
            assert!(
                !k.starts_with(&hosts()) && !k.starts_with(&restores()),
                "{k}"
            );
        }
        assert_eq!(parse(&state("r1")), Key::State { restore: "r1" });
        assert_eq!(
            parse(&format!("{}/00694d8", election("r1"))),
            Key::Election { restore: "r1" }
        );
        assert_eq!(parse("/rebound/v2/restores/R!/plan"), Key::Other);
        assert_eq!(parse("/rebound/v1/hosts/h1/info"), Key::Other);
        assert_eq!(parse("/rebound/v2/vms/h1/a/b"), Key::Other);
    }
}
