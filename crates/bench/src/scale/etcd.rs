//! A single-member etcd this benchmark starts for itself: plain HTTP on 127.0.0.1,
//! free ports, its data in a fresh directory on /dev/shm; killed and removed when
//! dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rebound_store::etcd::{EtcdConfig, EtcdStore};
use rebound_store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find two free ports on 127.0.0.1")]
    Ports(#[source] std::io::Error),
    #[error("cannot create etcd's data directory {}", .0.display())]
    Dir(PathBuf, #[source] std::io::Error),
    #[error("cannot run {} (install etcd, or give --etcd)", .0.display())]
    Spawn(PathBuf, #[source] std::io::Error),
    #[error("etcd did not answer within {0:?}; the end of its log: {1}")]
    NotReady(Duration, String),
    #[error("cannot connect to etcd at {0}")]
    Connect(String, #[source] StoreError),
}

pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub endpoint: String,
}

fn free_port() -> Result<u16, Error> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(Error::Ports)?;
    Ok(l.local_addr().map_err(Error::Ports)?.port())
}

impl Etcd {
    /// Starts `bin` and waits until it answers.
    pub async fn start(bin: &Path) -> Result<Etcd, Error> {
        let (client, peer) = (free_port()?, free_port()?);
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("rebound-bench-scale-etcd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Dir(dir.clone(), e))?;
        let log =
            std::fs::File::create(dir.join("etcd.log")).map_err(|e| Error::Dir(dir.clone(), e))?;
        let log2 = log.try_clone().map_err(|e| Error::Dir(dir.clone(), e))?;
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(bin)
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={endpoint}"))
            .arg(format!("--advertise-client-urls={endpoint}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| Error::Spawn(bin.to_path_buf(), e))?;
        let mut etcd = Etcd {
            child,
            dir,
            endpoint,
        };
        let limit = Duration::from_secs(20);
        let t = Instant::now();
        loop {
            if etcd.connect().await.is_ok() {
                return Ok(etcd);
            }
            let exited = matches!(etcd.child.try_wait(), Ok(Some(_)));
            if exited || t.elapsed() > limit {
                return Err(Error::NotReady(limit, etcd.log_tail()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new handle with its own connection (and its own request count).
    pub async fn connect(&self) -> Result<Arc<dyn Store>, Error> {
        let s = EtcdStore::connect(&EtcdConfig::new(vec![self.endpoint.clone()]))
            .await
            .map_err(|e| Error::Connect(self.endpoint.clone(), e))?;
        Ok(Arc::new(s))
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
