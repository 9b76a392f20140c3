//! Host ports of QEMU's user networking (slirp) changed on a running QEMU: a
//! forward handed from one QEMU to another, and the forwards a QEMU should hold put
//! back where it lost them. QEMU 7.2 has these only as HMP commands, which answer
//! with text rather than a QMP error: an empty answer is success for `hostfwd_add`,
//! "... removed" for `hostfwd_remove`; anything else is QEMU's reason, passed on.
//!
//! A listening socket cannot move between processes here, so a hand-over has a gap
//! of one monitor command (the old QEMU closes its listener, the new one binds): a
//! connection attempt in it is refused. Connections already accepted stay with the
//! QEMU that accepted them (their TCP state lives in its slirp).

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
/// On an error the forwards already moved (and the one that failed) go back onto
/// `from`, as far as it takes them, and the error is returned.
pub async fn hand_over(
    from: &impl Monitor,
    to: &impl Monitor,
    forwards: &[HostForward],
) -> Result<(), UsernetError> {
    for (i, f) in forwards.iter().enumerate() {
        let moved = match remove(from, f).await {
            Ok(()) => add(to, f).await,
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

/// The host ports (address, port) QEMU's `info usernet` answer lists as forwarded.
/// Lines it does not recognise are skipped: what is not understood is not counted
/// as held, so the worst outcome is an `add` that QEMU refuses.
pub fn listening(info_usernet: &str) -> Vec<(std::net::Ipv4Addr, u16)> {
    info_usernet
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            if w.next()? != "TCP[HOST_FORWARD]" {
                return None;
            }
            let _fd = w.next()?;
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
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
