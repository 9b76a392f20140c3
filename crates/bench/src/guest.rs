//! Guests through the daemon, as every benchmark starts and removes them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper::Method;
use rebound_api::{VmSpec, VmStatus};
use rebound_client::{Client, ClientError};
use serde_json::Value;

/// Why a guest could not be started or asked something.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the daemon refused POST {path}")]
    Post {
        path: String,
        #[source]
        source: ClientError,
    },
    #[error("the daemon refused GET {path}")]
    Get {
        path: String,
        #[source]
        source: ClientError,
    },
    #[error("the guest spec {0:?} does not encode as JSON")]
    Spec(String, #[source] serde_json::Error),
    #[error(
        "{vm}: the guest refused the fill: {line} (give it more --memory or a smaller --fill)"
    )]
    FillRefused { vm: String, line: String },
    #[error("{vm}: the guest's RAM holds {held_mib} MiB, not the {fill_mib} MiB memfill should fill, after 180 s (too little guest memory? memfill needs the fill + 16 MiB free)")]
    FillShort {
        vm: String,
        held_mib: u64,
        fill_mib: u64,
    },
}

/// A POST whose JSON answer is decoded.
pub async fn post<T: serde::de::DeserializeOwned>(
    c: &Client,
    path: &str,
    body: Option<&Value>,
) -> Result<T, Error> {
    c.call(Method::POST, path, body)
        .await
        .map_err(|source| Error::Post {
            path: path.to_string(),
            source,
        })
}

/// A GET whose JSON answer is decoded.
pub async fn get<T: serde::de::DeserializeOwned>(c: &Client, path: &str) -> Result<T, Error> {
    c.call(Method::GET, path, None)
        .await
        .map_err(|source| Error::Get {
            path: path.to_string(),
            source,
        })
}

/// Creates (starts) the guest `s` describes.
pub async fn create(c: &Client, s: &VmSpec) -> Result<VmStatus, Error> {
    let spec = serde_json::to_value(s).map_err(|e| Error::Spec(s.name.clone(), e))?;
    post(c, "/v1/vms", Some(&spec)).await
}

/// Kills and forgets a guest, whatever state it is in (errors ignored: it may be gone).
pub async fn remove(c: &Client, name: &str) {
    let _ = c
        .call::<Value>(Method::POST, &format!("/v1/vms/{name}/kill"), None)
        .await;
    let _ = c
        .call::<Value>(Method::DELETE, &format!("/v1/vms/{name}"), None)
        .await;
}

/// Removes every guest whose name starts with `tag` (a run's own guests).
pub async fn remove_tagged(c: &Client, tag: &str) {
    let Ok(vms) = c.call::<Vec<VmStatus>>(Method::GET, "/v1/vms", None).await else {
        return;
    };
    for v in vms.iter().filter(|v| v.name.starts_with(tag)) {
        remove(c, &v.name).await;
    }
}

/// Starts the guest, waits for the service and for memfill to have filled its memory:
/// the guest's RAM file holds at least the fill and has stopped growing. (A user
/// kernel has no agent link, so no memfill events: the host side is what we watch.)
pub async fn boot_filled(c: &Client, s: &VmSpec, fill_mib: u64) -> Result<VmStatus, Error> {
    create(c, s).await?;
    let n = &s.name;
    let st: VmStatus = post(
        c,
        &format!("/v1/vms/{n}/wait?for=ready&timeout_ms=600000"),
        None,
    )
    .await?;
    let ram = PathBuf::from(&st.ram_file);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let held = rebound_vmm::process::allocated_bytes(&ram).unwrap_or(0);
        if held >= fill_mib << 20 && held == last {
            return Ok(st);
        }
        last = held;
        // memfill refuses a fill that does not fit and says so on the console: no
        // point waiting out the deadline then.
        if let Ok(log) = c.text(&format!("/v1/vms/{n}/logs")).await {
            if let Some(l) = log
                .lines()
                .rev()
                .find(|l| l.contains("memfill:") && l.contains("available"))
            {
                return Err(Error::FillRefused {
                    vm: n.clone(),
                    line: l.trim().to_string(),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(Error::FillShort {
                vm: n.clone(),
                held_mib: held >> 20,
                fill_mib,
            });
        }
    }
}
