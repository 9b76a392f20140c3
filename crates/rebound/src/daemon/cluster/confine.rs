//! What a cluster peer may name on this host. A peer that may write a restore's
//! records in the cluster store holds its etcd role, not this daemon's user's
//! rights: a snapshot it has restored must be in this daemon's snapshot store or one
//! this daemon wrote (its catalog); a snapshot it has taken is written into the
//! store; frames it has replayed come from the snapshot restored.

use std::path::{Path, PathBuf};

use rebound_snapshot::Catalog;
use rebound_vmm::paths::{inside, Paths};

/// Why a path a peer names is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("a cluster peer's snapshot goes into this daemon's snapshot store")]
    OutsideStore(#[source] rebound_vmm::paths::PathsError),
    #[error("cannot create {}", .0.display())]
    Create(PathBuf, #[source] std::io::Error),
    #[error("{}", .0.display())]
    Resolve(PathBuf, #[source] std::io::Error),
    #[error("{} leads out of the snapshot store {} by a link", .parent.display(), .store.display())]
    Link { parent: PathBuf, store: PathBuf },
    #[error("snapshot {0:?}")]
    Snapshot(String, #[source] std::io::Error),
    #[error("snapshot {given:?} is neither in this daemon's snapshot store ({}) nor one it wrote: a cluster peer may restore only those", .store.display())]
    NotPeers { given: String, store: PathBuf },
    #[error("replay file {0:?}")]
    Replay(String, #[source] std::io::Error),
    #[error("replay file {given:?} is outside the snapshot {}: a cluster peer may replay only a snapshot's own frames", .dir.display())]
    ReplayOutside { given: String, dir: PathBuf },
}

/// The directory a peer's snapshot may be written to: `out` inside the store (a
/// relative path is taken there), its parent created, nothing outside reachable by
/// a link.
pub fn snapshot_out(paths: &Paths, out: &str) -> Result<PathBuf, ConfineError> {
    let store = paths.snapshot_store();
    let p = inside(&store, out).map_err(ConfineError::OutsideStore)?;
    let parent = p.parent().unwrap_or(&store);
    rebound_vmm::private::create_dir_all(parent)
        .map_err(|e| ConfineError::Create(parent.to_path_buf(), e))?;
    let real =
        |q: &Path| std::fs::canonicalize(q).map_err(|e| ConfineError::Resolve(q.to_path_buf(), e));
    if !real(parent)?.starts_with(real(&store)?) {
        return Err(ConfineError::Link {
            parent: parent.to_path_buf(),
            store,
        });
    }
    Ok(p)
}

/// The snapshot directory a peer may have restored: in the store or listed in the
/// catalog, canonical.
pub fn snapshot_dir(paths: &Paths, given: &str) -> Result<PathBuf, ConfineError> {
    let store = paths.snapshot_store();
    let real = std::fs::canonicalize(inside(&store, given).unwrap_or_else(|_| given.into()))
        .map_err(|e| ConfineError::Snapshot(given.to_string(), e))?;
    let in_store = std::fs::canonicalize(&store).is_ok_and(|s| real.starts_with(s));
    let listed = || Catalog::new(paths.snapshot_catalog()).contains(&real);
    if in_store || matches!(listed(), Ok(true)) {
        Ok(real)
    } else {
        Err(ConfineError::NotPeers {
            given: given.to_string(),
            store,
        })
    }
}

/// A replay file a peer names: inside the snapshot directory being restored.
pub fn replay_file(dir: &Path, given: &str) -> Result<PathBuf, ConfineError> {
    let p = dir.join(given);
    let real = std::fs::canonicalize(&p).map_err(|e| ConfineError::Replay(given.to_string(), e))?;
    if real.starts_with(dir) && real != dir {
        Ok(real)
    } else {
        Err(ConfineError::ReplayOutside {
            given: given.to_string(),
            dir: dir.to_path_buf(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A daemon's paths under a test directory.
    pub(crate) fn paths(t: &Path) -> Paths {
        Paths {
            home: t.join("home"),
            run: t.join("run"),
        }
    }

    #[test]
    fn peers_name_only_the_store_and_the_catalog() {
        let t = tempfile::tempdir().unwrap();
        let p = paths(t.path());
        let store = p.snapshot_store();
        std::fs::create_dir_all(store.join("c1/a")).unwrap();
        std::fs::create_dir_all(t.path().join("mine/b")).unwrap();
        std::fs::create_dir_all(t.path().join("theirs")).unwrap();
        let store_real = std::fs::canonicalize(&store).unwrap();
        assert_eq!(snapshot_dir(&p, "c1/a").unwrap(), store_real.join("c1/a"));
        let abs = store.join("c1/a").display().to_string();
        assert_eq!(snapshot_dir(&p, &abs).unwrap(), store_real.join("c1/a"));
        let mine = t.path().join("mine/b").display().to_string();
        let e = snapshot_dir(&p, &mine).unwrap_err().to_string();
        assert!(e.contains("nor one it wrote"), "{e}");
        Catalog::new(p.snapshot_catalog())
            .record(Path::new(&mine), &[])
            .unwrap();
        assert!(snapshot_dir(&p, &mine).is_ok());
        for bad in ["/etc", "../../theirs", "/"] {
            assert!(snapshot_dir(&p, bad).is_err(), "{bad}");
        }
        // A link inside the store that leads out is refused.
        std::os::unix::fs::symlink(t.path().join("theirs"), store.join("out")).unwrap();
        assert!(snapshot_dir(&p, "out").is_err());
        assert!(snapshot_out(&p, "out/x").is_err());
        assert_eq!(
            snapshot_out(&p, "c2/vm").unwrap(),
            store.join("c2/vm"),
            "a relative name goes to the store"
        );
        assert!(store.join("c2").is_dir());
        for bad in ["/tmp/x", "../x", ""] {
            assert!(snapshot_out(&p, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn replay_files_stay_in_their_snapshot() {
        let t = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(t.path()).unwrap().join("s");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("net1.pcap"), b"x").unwrap();
        std::fs::write(t.path().join("secret"), b"x").unwrap();
        assert!(replay_file(&dir, "net1.pcap").is_ok());
        let inside_abs = dir.join("net1.pcap").display().to_string();
        assert!(replay_file(&dir, &inside_abs).is_ok());
        for bad in ["../secret", "/etc/passwd", "."] {
            assert!(replay_file(&dir, bad).is_err(), "{bad}");
        }
    }
}
