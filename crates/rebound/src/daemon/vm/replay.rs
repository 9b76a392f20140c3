//! Frames replayed into a restored guest before it runs (`RestoreRequest::replay`):
//! the frames in flight to it at a cluster snapshot's cut, which its peers sent
//! before their own snapshot points and will not send again.
//!
//! With QEMU's stock parts: a socket chardev (a unix server in the VM's run dir,
//! `wait: false`) and a `filter-redirector` on the NIC's netdev with that chardev as
//! its `indev`. Each frame goes down the socket in the redirector's wire format
//! (`rebound_cluster::replay::redirector_record`). Its queue is `tx`: QEMU names a
//! filter's queue from the netdev's side, so frames the redirector injects into
//! `tx` travel as if the tap had sent them, into the NIC's incoming queue
//! (`redirector_to_filter` passes them on with the netdev as their sender); `rx`
//! would send them out of the tap instead. While the VM is paused QEMU cannot deliver
//! them (`qemu_can_send_packet` is false unless the VM runs), so they wait in that
//! queue, in order, and reach the guest at `cont`, when QEMU flushes the queues
//! (`net_vm_change_state_handler`, and virtio-net's own start). Checked on QEMU 7.2:
//! nothing reaches a paused guest, and an echo request replayed this way is answered
//! right after `cont`.
//!
//! Before the guest may run, QEMU must have read every byte: the socket's unsent
//! bytes (`SIOCOUTQ`) fall to 0 once QEMU's chardev has read them, and the
//! redirector handles what it reads in the same main-loop callback, so one QMP round
//! trip after that comes after the last frame is queued. Then the filter and the
//! chardev go; the queued frames stay.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rebound_api::{ReplayedFrames, RestoreRequest, VmSpec};
use rebound_vmm::qmp::Qmp;
use tokio::io::AsyncWriteExt;

use crate::daemon::error::OpError;

/// How long QEMU gets to read one NIC's frames.
const READ_WAIT: Duration = Duration::from_secs(10);
/// The longest path a unix socket address holds (`sun_path`, with its NUL).
const SUN_PATH_MAX: usize = 107;

/// Why frames could not be read or handed to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay file {} for net{nic}", .path.display())]
    File {
        path: PathBuf,
        nic: u32,
        #[source]
        source: rebound_cluster::replay::ReplayError,
    },
    #[error("the socket path {} is too long for a unix socket", .0.display())]
    LongPath(PathBuf),
    /// A QMP command of the hand-over failed (named).
    #[error("{0}")]
    Qmp(&'static str, #[source] rebound_vmm::qmp::QmpError),
    #[error("cannot connect to {}", .0.display())]
    Connect(PathBuf, #[source] std::io::Error),
    #[error("QEMU did not take the frames within {0:?}")]
    WriteTimeout(Duration),
    #[error("cannot write the frames")]
    Write(#[source] std::io::Error),
    #[error("SIOCOUTQ")]
    Unsent(#[source] std::io::Error),
    #[error("QEMU left {left} bytes of the frames unread for {wait:?}")]
    Unread { left: i32, wait: Duration },
    #[error("the guest is not paused (status {0})")]
    NotPaused(serde_json::Value),
}

/// One bridge NIC's frames, read and checked.
#[derive(Debug, Clone)]
pub struct ReplayFrames {
    /// 1-based: QEMU's `net<nic>`.
    pub nic: u32,
    pub frames: Vec<Vec<u8>>,
}

/// Checks a restore's `replay` against the snapshot's VM spec and reads its files:
/// every problem is a one-line error before anything starts.
pub async fn load(req: &RestoreRequest, spec: &VmSpec) -> Result<Vec<ReplayFrames>, OpError> {
    let Some(list) = req.replay.as_ref().filter(|l| !l.is_empty()) else {
        return Ok(Vec::new());
    };
    let bad = |m: String| Err(OpError::BadRequest(m));
    if !req.paused {
        return bad(
            "replay needs paused: true: the frames are queued while the restored guest is held, so that it receives them before its first instruction, ahead of anything newer"
                .into(),
        );
    }
    let nics = spec.nics.len();
    let mut out: Vec<ReplayFrames> = Vec::new();
    for r in list {
        let n = r.nic;
        if n == 0 || n as usize > nics {
            let has = match nics {
                0 => "no bridge NIC".to_string(),
                1 => "1 bridge NIC (net1)".to_string(),
                k => format!("{k} bridge NICs (net1..net{k})"),
            };
            return bad(format!(
                "replay names NIC {n}, but the snapshot's VM has {has}"
            ));
        }
        if out.iter().any(|o| o.nic == n) {
            return bad(format!("replay names NIC {n} (net{n}) twice"));
        }
        let path = PathBuf::from(&r.pcap);
        if !path.is_absolute() {
            return bad(format!(
                "replay file {:?} for net{n} must be an absolute path",
                r.pcap
            ));
        }
        let frames = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || rebound_cluster::replay::read_frames(&path))
                .await
                .map_err(OpError::Task)?
        };
        let frames = frames.map_err(|source| {
            OpError::BadInput(Box::new(ReplayError::File {
                path: path.clone(),
                nic: n,
                source,
            }))
        })?;
        out.push(ReplayFrames { nic: n, frames });
    }
    Ok(out)
}

/// Hands `frames` to the paused QEMU for the guest on bridge NIC `nic`; returns once
/// QEMU holds them all in the NIC's queue.
pub(super) async fn deliver(
    q: &Qmp,
    run_dir: &Path,
    r: &ReplayFrames,
) -> Result<ReplayedFrames, OpError> {
    let nic = r.nic;
    let chardev = format!("rbreplay-net{nic}");
    let filter = format!("rbreplay-net{nic}-filter");
    let sock = run_dir.join(format!("replay-net{nic}.sock"));
    let fail = |source: ReplayError| OpError::Replay { nic, source };
    let qmp = |what: &'static str| move |e| fail(ReplayError::Qmp(what, e));
    if sock.as_os_str().len() > SUN_PATH_MAX {
        return Err(fail(ReplayError::LongPath(sock)));
    }
    let _ = std::fs::remove_file(&sock);
    q.execute(
        "chardev-add",
        Some(serde_json::json!({
            "id": chardev,
            "backend": {"type": "socket", "data": {
                "addr": {"type": "unix", "data": {"path": sock.display().to_string()}},
                "server": true,
                "wait": false,
            }},
        })),
    )
    .await
    .map_err(qmp("chardev-add"))?;
    let sent: Result<u64, OpError> = async {
        q.execute(
            "object-add",
            Some(serde_json::json!({
                "qom-type": "filter-redirector",
                "id": filter,
                "netdev": format!("net{nic}"),
                "queue": "tx",
                "indev": chardev,
            })),
        )
        .await
        .map_err(qmp("filter-redirector"))?;
        let sent = send(q, &sock, &r.frames).await.map_err(fail);
        let removed = q
            .execute("object-del", Some(serde_json::json!({ "id": filter })))
            .await
            .map_err(qmp("object-del"));
        let bytes = sent?;
        removed?;
        Ok(bytes)
    }
    .await;
    let removed = q
        .execute("chardev-remove", Some(serde_json::json!({ "id": chardev })))
        .await
        .map_err(qmp("chardev-remove"));
    let _ = std::fs::remove_file(&sock);
    let bytes = sent?;
    removed?;
    Ok(ReplayedFrames {
        nic,
        frames: r.frames.len() as u64,
        bytes,
    })
}

/// Writes every frame to the redirector's socket and waits until QEMU has read and
/// queued them; returns the frames' bytes. The connection closes on return.
async fn send(q: &Qmp, sock: &Path, frames: &[Vec<u8>]) -> Result<u64, ReplayError> {
    let mut s = tokio::net::UnixStream::connect(sock)
        .await
        .map_err(|e| ReplayError::Connect(sock.to_path_buf(), e))?;
    let mut wire = Vec::new();
    let mut bytes = 0u64;
    for f in frames {
        wire.extend_from_slice(&rebound_cluster::replay::redirector_record(f));
        bytes += f.len() as u64;
    }
    tokio::time::timeout(READ_WAIT, s.write_all(&wire))
        .await
        .map_err(|_| ReplayError::WriteTimeout(READ_WAIT))?
        .map_err(ReplayError::Write)?;
    let end = Instant::now() + READ_WAIT;
    loop {
        let left = unsent(&s).map_err(ReplayError::Unsent)?;
        if left == 0 {
            break;
        }
        if Instant::now() > end {
            return Err(ReplayError::Unread {
                left,
                wait: READ_WAIT,
            });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // QEMU's main loop handled the read that emptied the socket before it answers
    // this; the guest must still be paused, or it ran without the frames.
    let st = q
        .execute("query-status", None)
        .await
        .map_err(|e| ReplayError::Qmp("query-status", e))?;
    if st["running"] != serde_json::Value::Bool(false) {
        return Err(ReplayError::NotPaused(st["status"].clone()));
    }
    Ok(bytes)
}

/// Bytes written to a unix stream socket that its peer has not read yet.
fn unsent(s: &tokio::net::UnixStream) -> std::io::Result<i32> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ on Linux) writes one int through the pointer, which
    // is valid for that long; the fd is open for as long as `s` lives.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n)
}
