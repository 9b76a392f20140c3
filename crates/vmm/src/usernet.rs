//! Host ports of QEMU's user networking (slirp) changed on a running QEMU: a
//! forward handed from one QEMU to another, and the forwards a QEMU should hold put
//! back where it lost them. QEMU 7.2 has these only as HMP commands, which answer
//! with text rather than a QMP error: an empty answer is success for `hostfwd_add`,
//! "... removed" for `hostfwd_remove`; anything else is QEMU's reason, passed on.
//!
//! A listening socket cannot move into QEMU (its forwards bind their own), so a
//! hand-over has a gap of one monitor command to the new QEMU (the old listener
//! closed, the new one not yet bound): a connection attempt in it is refused.
//! Connections the kernel had queued on the old listener, which slirp had not yet
//! accepted, would be reset when it closes: the hand-over first takes a duplicate of
//! the listener out of the old QEMU (`pidfd_getfd`), so the removal leaves it
//! listening, accepts what is queued, and relays each such connection to the new
//! QEMU. Connections slirp had accepted stay with the QEMU that accepted them (their
//! TCP state lives in its slirp).

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};

use crate::port::Monitor;
use crate::qemu::HostForward;
use crate::qmp::QmpError;

/// The user network every supervised VM's forwards live on.
const NETDEV: &str = "net0";

#[derive(Debug, thiserror::Error)]
pub enum UsernetError {
    #[error("QMP")]
    Qmp(#[from] QmpError),
    #[error("QEMU refused `{command}`: {answer}")]
    Refused { command: String, answer: String },
}

fn add_line(f: &HostForward) -> String {
    format!(
        "hostfwd_add {NETDEV} tcp:{}:{}-:{}",
        f.bind, f.host, f.guest
    )
}

fn remove_line(f: &HostForward) -> String {
    format!("hostfwd_remove {NETDEV} tcp:{}:{}", f.bind, f.host)
}

async fn hmp(q: &impl Monitor, line: String) -> Result<(String, String), UsernetError> {
    let args = serde_json::json!({ "command-line": line });
    let v = q.qmp("human-monitor-command", Some(args)).await?;
    Ok((line, v.as_str().unwrap_or_default().trim().to_string()))
}

/// Has `q` forward `f`'s host port to its guest port.
pub async fn add(q: &impl Monitor, f: &HostForward) -> Result<(), UsernetError> {
    let (command, answer) = hmp(q, add_line(f)).await?;
    if answer.is_empty() {
        Ok(())
    } else {
        Err(UsernetError::Refused { command, answer })
    }
}

/// Has `q` stop forwarding `f`'s host port (it closes the listener).
pub async fn remove(q: &impl Monitor, f: &HostForward) -> Result<(), UsernetError> {
    let (command, answer) = hmp(q, remove_line(f)).await?;
    if answer.ends_with("removed") {
        Ok(())
    } else {
        Err(UsernetError::Refused { command, answer })
    }
}

/// Moves every forward in `forwards` from `from` to `to`, each off and at once on.
/// With `from_pid`, the process behind `from`, the connections queued on each old
/// listener are relayed to whichever QEMU holds the port afterwards (see the module
/// doc); without it (or where the listener cannot be taken) they are reset, as QEMU
/// alone would. On an error the forwards already moved (and the one that failed) go
/// back onto `from`, as far as it takes them, and the error is returned.
pub async fn hand_over(
    from: &impl Monitor,
    from_pid: Option<u32>,
    to: &impl Monitor,
    forwards: &[HostForward],
) -> Result<(), UsernetError> {
    let fds = match from_pid {
        Some(_) => listeners(&hmp(from, "info usernet".into()).await?.1),
        None => Vec::new(),
    };
    for (i, f) in forwards.iter().enumerate() {
        let taken = from_pid.and_then(|pid| {
            let fd = fds
                .iter()
                .find(|l| (l.1, l.2) == (f.bind, f.host))
                .map(|l| l.0)?;
            take_listener(pid, fd, f)
        });
        let moved = match remove(from, f).await {
            Ok(()) => {
                let queued = taken.map(drain).unwrap_or_default();
                let r = add(to, f).await;
                relay(queued, f);
                r
            }
            Err(e) => Err(e),
        };
        if let Err(e) = moved {
            for g in &forwards[..=i] {
                let _ = add(from, g).await;
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Forward `f`'s listening socket, fd `fd` of process `pid`, duplicated into this
/// process; `None` where it cannot be had (no permission, a kernel before 5.6) or
/// the fd is not that listener (checked: the process may have reused the number).
fn take_listener(pid: u32, fd: i32, f: &HostForward) -> Option<TcpListener> {
    use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).ok()?;
    let dup = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()).ok()?;
    let listening =
        nix::sys::socket::getsockopt(&dup, nix::sys::socket::sockopt::AcceptConn).ok()?;
    let l = TcpListener::from(dup);
    let at = l.local_addr().ok()?;
    let want = std::net::SocketAddr::V4(SocketAddrV4::new(f.bind, f.host));
    (listening && at == want).then_some(l)
}

/// The connections queued on `l`, which only this process holds now.
fn drain(l: TcpListener) -> Vec<TcpStream> {
    if l.set_nonblocking(true).is_err() {
        return Vec::new();
    }
    std::iter::from_fn(|| l.accept().ok().map(|(c, _)| c)).collect()
}

/// Relays each of `queued` to forward `f`'s port, whoever listens there now, until
/// either side closes (needs a tokio runtime; the connections are few: those queued
/// in the instant of one monitor command).
fn relay(queued: Vec<TcpStream>, f: &HostForward) {
    let to = SocketAddrV4::new(
        if f.bind.is_unspecified() {
            Ipv4Addr::LOCALHOST
        } else {
            f.bind
        },
        f.host,
    );
    for c in queued {
        tokio::spawn(async move {
            let Ok(mut c) = c
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(c))
            else {
                return;
            };
            if let Ok(mut q) = tokio::net::TcpStream::connect(to).await {
                let _ = tokio::io::copy_bidirectional(&mut c, &mut q).await;
            }
        });
    }
}

/// The host ports (address, port) QEMU's `info usernet` answer lists as forwarded.
/// Lines it does not recognise are skipped: what is not understood is not counted
/// as held, so the worst outcome is an `add` that QEMU refuses.
pub fn listening(info_usernet: &str) -> Vec<(Ipv4Addr, u16)> {
    listeners(info_usernet)
        .into_iter()
        .map(|(_, a, p)| (a, p))
        .collect()
}

/// As [`listening`], with the descriptor number of each listener in QEMU.
fn listeners(info_usernet: &str) -> Vec<(i32, Ipv4Addr, u16)> {
    info_usernet
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next()? != "TCP[HOST_FORWARD]" {
                return None;
            }
            Some((
                w.next()?.parse().ok()?,
                w.next()?.parse().ok()?,
                w.next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Puts back on `q` each of `forwards` it does not hold (a hand-over cut short by a
/// death of the process driving it leaves a QEMU without its ports); the forwards
/// it put back.
pub async fn restore(
    q: &impl Monitor,
    forwards: &[HostForward],
) -> Result<Vec<HostForward>, UsernetError> {
    let (_, info) = hmp(q, "info usernet".into()).await?;
    let held = listening(&info);
    let mut put_back = Vec::new();
    for f in forwards {
        if !held.contains(&(f.bind, f.host)) {
            add(q, f).await?;
            put_back.push(*f);
        }
    }
    Ok(put_back)
}

#[cfg(test)]
mod tests;
