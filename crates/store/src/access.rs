//! Who may read and write what in etcd: users, roles and their key ranges.
//!
//! etcd run with `--client-cert-auth` (and no password logins) takes a client's
//! user name from its certificate's common name. Each host has its own
//! certificate, user and role, all named `rebound-host-<host>` ([`host_user`]);
//! the operator's certificate is etcd's `root`. Under [`PREFIX`]:
//!
//! | user | may write | may read |
//! |---|---|---|
//! | `root` | everything | everything |
//! | `rebound-host-<h>` | `hosts/<h>/` | all of [`PREFIX`] |
//! | `rebound-host-<h>` of a restore's host | `restores/<id>/` while granted | |
//!
//! A restore's records are writable by the hosts taking part in it only: whoever
//! submits the restore (with the root identity) calls [`grant_restore`] with its
//! hosts before writing the plan, and [`revoke_restore`] once it is over. The
//! grant is one role per restore (`rebound-restore-<id>`, readwrite on
//! `restores/<id>/`) given to each host's user, so revoking it is deleting that
//! role (etcd takes it from every user).
//!
//! Everything here only adds what is missing ([`store_init`] can run again, with
//! more hosts); it never removes a host. What to create is decided by pure
//! functions ([`hosts_plan`], [`restore_plan`]) and carried out by [`apply`].

/// The etcd client the access calls take (connected with [`connect`]).
pub use etcd_client::Client;

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, Permission, TlsOptions, UserAddOptions};

/// Every key Rebound keeps in etcd starts with this (version 2 of the layout).
pub const PREFIX: &str = "/rebound/v2/";
/// etcd's root user and role: the operator's identity.
pub const ROOT: &str = "root";

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("invalid host name {0:?}: use 1-63 lowercase letters, digits or '-', starting with a letter or digit")]
    BadHost(String),
    #[error("invalid restore id {0:?}: use 1-64 letters, digits, '-', '_' or '.', not starting with '.'")]
    BadRestoreId(String),
    #[error("no host given")]
    NoHosts,
    #[error(
        "host {0:?} has no store user: add it with `rebound cluster store-init --hosts ...` first"
    )]
    UnknownHost(String),
    #[error("cannot read {0}")]
    ReadFile(PathBuf, #[source] std::io::Error),
    #[error("cannot connect to etcd at {0}")]
    Connect(String, #[source] etcd_client::Error),
    #[error("no etcd endpoint given")]
    NoEndpoints,
    #[error("etcd refused to {0}")]
    Request(String, #[source] etcd_client::Error),
}

impl AccessError {
    /// Whether the same request may succeed a little later: the store's own
    /// classification calls it unavailable (no member answered, or the members were
    /// electing a leader: "request timed out", "leader changed"). Every request here
    /// is idempotent, so trying again is safe.
    pub fn is_transient(&self) -> bool {
        match self {
            AccessError::Request(_, e) | AccessError::Connect(_, e) => matches!(
                crate::etcd::failure("", e, None).error,
                crate::StoreError::Unavailable(_)
            ),
            _ => false,
        }
    }
}

/// The etcd user and role of host `host` (its certificate's CN).
pub fn host_user(host: &str) -> String {
    format!("rebound-host-{host}")
}

/// The role that lets a restore's hosts write its records.
pub fn restore_role(id: &str) -> String {
    format!("rebound-restore-{id}")
}

/// A host name: `[a-z0-9][a-z0-9-]{0,62}`.
pub fn valid_host(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A restore id: one key segment (no '/'), never `.` or `..`.
pub fn valid_restore_id(id: &str) -> bool {
    let b = id.as_bytes();
    (1..=64).contains(&b.len())
        && b[0] != b'.'
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// One role's access to every key under `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub prefix: String,
    pub access: Access,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    pub name: String,
    /// Empty for `root`, which may do everything.
    pub grants: Vec<Grant>,
}

/// A user (created without a password: it logs in by certificate) and its roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub roles: Vec<String>,
}

/// What must exist in etcd: roles, then users holding them; `users_exist` says the
/// users must be there already (a restore's hosts) instead of being created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub roles: Vec<Role>,
    pub users: Vec<User>,
    pub users_exist: bool,
}

fn check_hosts(hosts: &[String]) -> Result<(), AccessError> {
    if hosts.is_empty() {
        return Err(AccessError::NoHosts);
    }
    match hosts.iter().find(|h| !valid_host(h)) {
        Some(h) => Err(AccessError::BadHost(h.clone())),
        None => Ok(()),
    }
}

/// The root user and role, and per host its user and role: readwrite on its own
/// `hosts/<h>/` and `vms/<h>/`, read on all of [`PREFIX`].
pub fn hosts_plan(hosts: &[String]) -> Result<Plan, AccessError> {
    check_hosts(hosts)?;
    let mut roles = vec![Role {
        name: ROOT.into(),
        grants: Vec::new(),
    }];
    let mut users = vec![User {
        name: ROOT.into(),
        roles: vec![ROOT.into()],
    }];
    for h in hosts {
        let name = host_user(h);
        roles.push(Role {
            name: name.clone(),
            grants: vec![
                Grant {
                    prefix: format!("{PREFIX}hosts/{h}/"),
                    access: Access::ReadWrite,
                },
                Grant {
                    prefix: format!("{PREFIX}vms/{h}/"),
                    access: Access::ReadWrite,
                },
                Grant {
                    prefix: PREFIX.into(),
                    access: Access::Read,
                },
            ],
        });
        users.push(User {
            roles: vec![name.clone()],
            name,
        });
    }
    Ok(Plan {
        roles,
        users,
        users_exist: false,
    })
}

/// Restore `id`'s role (readwrite on `restores/<id>/` and `phases/<id>/`: any of
/// its hosts may coordinate it) given to each of its hosts.
pub fn restore_plan(id: &str, hosts: &[String]) -> Result<Plan, AccessError> {
    if !valid_restore_id(id) {
        return Err(AccessError::BadRestoreId(id.into()));
    }
    check_hosts(hosts)?;
    let role = restore_role(id);
    Ok(Plan {
        roles: vec![Role {
            name: role.clone(),
            grants: ["restores", "phases"]
                .iter()
                .map(|p| Grant {
                    prefix: format!("{PREFIX}{p}/{id}/"),
                    access: Access::ReadWrite,
                })
                .collect(),
        }],
        users: hosts
            .iter()
            .map(|h| User {
                name: host_user(h),
                roles: vec![role.clone()],
            })
            .collect(),
        users_exist: true,
    })
}

/// The files of a TLS identity and the CA that signed the members' certificates:
/// the same as the store's own connections take.
pub use crate::etcd::TlsFiles;

/// A client of the etcd members at `endpoints` (`https://host:port`), logged in by
/// the certificate in `tls`.
pub async fn connect(endpoints: &[String], tls: &TlsFiles) -> Result<Client, AccessError> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| AccessError::ReadFile(p.into(), e));
    let opts = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(&tls.ca)?))
        .identity(Identity::from_pem(read(&tls.cert)?, read(&tls.key)?));
    let opts = ConnectOptions::new()
        .with_tls(opts)
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10));
    // One member that answers is enough for these few requests (members forward
    // writes to their leader). A channel balanced over all of them sends a request
    // to a member that is down as readily as to one that is up, and over several
    // endpoints it says only "timeout" where one alone says why (a refused
    // certificate, say): members are tried one by one, in order.
    let mut last = None;
    for e in endpoints {
        let one = async {
            let mut c = Client::connect([e.as_str()], Some(opts.clone())).await?;
            // The channel connects lazily: one request shows a refusal here.
            c.status().await?;
            Ok::<_, etcd_client::Error>(c)
        };
        match one.await {
            Ok(c) => return Ok(c),
            Err(why) => last = Some(AccessError::Connect(e.clone(), why)),
        }
    }
    Err(last.unwrap_or(AccessError::NoEndpoints))
}

fn req<T>(
    what: impl FnOnce() -> String,
    r: Result<T, etcd_client::Error>,
) -> Result<T, AccessError> {
    r.map_err(|e| AccessError::Request(what(), e))
}

/// Creates what `plan` names and is missing, and grants every permission and role
/// (etcd ignores a grant that is already there).
pub async fn apply(client: &mut Client, plan: &Plan) -> Result<(), AccessError> {
    let roles = req(|| "list roles".into(), client.role_list().await)?;
    let have_roles = roles.roles().to_vec();
    let users = req(|| "list users".into(), client.user_list().await)?;
    let have_users = users.users().to_vec();
    if plan.users_exist {
        if let Some(u) = plan.users.iter().find(|u| !have_users.contains(&u.name)) {
            let host = u.name.strip_prefix("rebound-host-").unwrap_or(&u.name);
            return Err(AccessError::UnknownHost(host.into()));
        }
    }
    for r in &plan.roles {
        if !have_roles.contains(&r.name) {
            req(
                || format!("add role {}", r.name),
                client.role_add(r.name.as_str()).await,
            )?;
        }
        for g in &r.grants {
            let p = match g.access {
                Access::Read => Permission::read(g.prefix.as_str()),
                Access::ReadWrite => Permission::read_write(g.prefix.as_str()),
            };
            req(
                || format!("grant {:?} on {} to role {}", g.access, g.prefix, r.name),
                client
                    .role_grant_permission(r.name.as_str(), p.with_prefix())
                    .await,
            )?;
        }
    }
    for u in &plan.users {
        if !plan.users_exist && !have_users.contains(&u.name) {
            req(
                || format!("add user {}", u.name),
                client
                    .user_add(
                        u.name.as_str(),
                        "",
                        Some(UserAddOptions::new().with_no_pwd()),
                    )
                    .await,
            )?;
        }
        for r in &u.roles {
            req(
                || format!("grant role {r} to user {}", u.name),
                client.user_grant_role(u.name.as_str(), r.as_str()).await,
            )?;
        }
    }
    Ok(())
}

/// Sets up the root user and every host's user and role, then turns etcd's
/// authentication on. `client` must be logged in as root (the operator's
/// certificate); running it again, with more hosts, adds what is missing.
pub async fn store_init(client: &mut Client, hosts: &[String]) -> Result<(), AccessError> {
    apply(client, &hosts_plan(hosts)?).await?;
    req(
        || "enable authentication".into(),
        client.auth_enable().await,
    )?;
    Ok(())
}

/// Lets `hosts` write restore `id`'s records (`restores/<id>/`). Needs root.
pub async fn grant_restore(
    client: &mut Client,
    id: &str,
    hosts: &[String],
) -> Result<(), AccessError> {
    apply(client, &restore_plan(id, hosts)?).await
}

/// Takes restore `id`'s write access from every host it was granted to; nothing to
/// do if there is none. Needs root. Call it once the hosts resigned from the
/// restore's election: etcd lets a host revoke a lease only while it may write
/// every key attached to it (a lease left behind still expires by its TTL).
pub async fn revoke_restore(client: &mut Client, id: &str) -> Result<(), AccessError> {
    if !valid_restore_id(id) {
        return Err(AccessError::BadRestoreId(id.into()));
    }
    let role = restore_role(id);
    let roles = req(|| "list roles".into(), client.role_list().await)?;
    if roles.roles().contains(&role) {
        req(
            || format!("delete role {role}"),
            client.role_delete(role.as_str()).await,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    /// Whether `user` may write (or only read) `key` under `plan`'s grants.
    fn may(plan: &Plan, user: &str, key: &str, write: bool) -> bool {
        let Some(u) = plan.users.iter().find(|u| u.name == user) else {
            return false;
        };
        u.roles.iter().any(|r| {
            let role = plan.roles.iter().find(|x| &x.name == r).unwrap();
            role.name == ROOT
                || role.grants.iter().any(|g| {
                    key.starts_with(&g.prefix) && (!write || g.access == Access::ReadWrite)
                })
        })
    }

    #[test]
    fn a_host_writes_only_its_own_keys_and_reads_every_hosts() {
        let p = hosts_plan(&hosts(&["h1", "h2"])).unwrap();
        let h1 = "rebound-host-h1";
        assert!(may(&p, h1, "/rebound/v2/hosts/h1/info", true));
        assert!(may(&p, h1, "/rebound/v2/vms/h1/a", true));
        assert!(!may(&p, h1, "/rebound/v2/hosts/h2/info", true));
        assert!(!may(&p, h1, "/rebound/v2/vms/h2/a", true));
        assert!(!may(&p, h1, "/rebound/v2/phases/r1/h1/a", true));
        assert!(may(&p, h1, "/rebound/v2/hosts/h2/info", false));
        // A host whose name extends h1's gains nothing from h1's grant.
        assert!(!may(&p, h1, "/rebound/v2/hosts/h10/info", true));
        assert!(!may(&p, h1, "/rebound/v2/restores/r1/state", true));
        assert!(may(&p, h1, "/rebound/v2/restores/r1/state", false));
        assert!(!may(&p, h1, "/rebound/v2/clusters/c", true));
        assert!(!may(&p, h1, "/other/key", false));
        assert!(may(&p, ROOT, "/anything", true));
        assert!(!p.users_exist);
        let names: Vec<&str> = p.users.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["root", "rebound-host-h1", "rebound-host-h2"]);
    }

    #[test]
    fn a_restore_grant_opens_that_restore_only_to_its_hosts() {
        let mut p = hosts_plan(&hosts(&["h1", "h2"])).unwrap();
        let r = restore_plan("r1", &hosts(&["h1"])).unwrap();
        assert!(r.users_exist);
        p.roles.extend(r.roles);
        for u in r.users {
            let mine = p.users.iter_mut().find(|x| x.name == u.name).unwrap();
            mine.roles.extend(u.roles);
        }
        assert!(may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/restores/r1/state",
            true
        ));
        assert!(may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/restores/r1/election/x",
            true
        ));
        // Any host of the restore may coordinate it: it writes every VM's phase.
        assert!(may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/phases/r1/h2/a",
            true
        ));
        assert!(!may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/phases/r2/h1/a",
            true
        ));
        assert!(!may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/restores/r10/state",
            true
        ));
        assert!(!may(
            &p,
            "rebound-host-h1",
            "/rebound/v2/restores/r2/state",
            true
        ));
        assert!(!may(
            &p,
            "rebound-host-h2",
            "/rebound/v2/restores/r1/state",
            true
        ));
    }

    #[test]
    fn names_are_checked_before_anything_is_asked_of_etcd() {
        assert!(matches!(hosts_plan(&[]), Err(AccessError::NoHosts)));
        for bad in ["", "H1", "h/1", "-h", "h_1"] {
            assert!(
                matches!(
                    hosts_plan(&hosts(&["h1", bad])),
                    Err(AccessError::BadHost(_))
                ),
                "{bad}"
            );
        }
        for bad in ["", ".", "..", ".x", "r/1", "r 1", &"r".repeat(65)] {
            assert!(
                matches!(
                    restore_plan(bad, &hosts(&["h1"])),
                    Err(AccessError::BadRestoreId(_))
                ),
                "{bad}"
            );
        }
        for ok in ["r1", "2026-11-28T19.00_a", &"r".repeat(64)] {
            assert!(restore_plan(ok, &hosts(&["h1"])).is_ok(), "{ok}");
        }
        assert_eq!(host_user("h1"), "rebound-host-h1");
        assert_eq!(restore_role("r1"), "rebound-restore-r1");
    }
}
