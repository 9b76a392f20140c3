//! The backend as a process, from the outside: garbage on its vhost-user socket is
//! refused and it keeps serving; a backing file on a full filesystem gives the guest
//! an I/O error for that write only. Real sockets, a real `rebound blk serve`, a real
//! tmpfs that fills up.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;

fn rebound() -> &'static str {
    env!("CARGO_BIN_EXE_rebound")
}

struct Backend {
    child: Child,
    socket: PathBuf,
    control: PathBuf,
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &Path, disk: &Path) -> Backend {
    let (socket, control) = (dir.join("blk.sock"), dir.join("blk.ctl"));
    let child = Command::new(rebound())
        .args(["blk", "serve", "--disk"])
        .arg(disk)
        .arg("--socket")
        .arg(&socket)
        .arg("--control")
        .arg(&control)
        .args(["--cache", "1048576"])
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !(socket.exists() && control.exists()) {
        assert!(Instant::now() < end, "the backend did not listen");
        std::thread::sleep(Duration::from_millis(10));
    }
    Backend {
        child,
        socket,
        control,
    }
}

/// A vhost-user frontend's first questions get answers: the backend serves.
fn answers(socket: &Path) -> u64 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match Frontend::connect(socket, 1) {
            Ok(mut f) => {
                let features = f.get_features().unwrap();
                f.set_features(features).unwrap();
                let proto = f.get_protocol_features().unwrap();
                assert!(proto.contains(VhostUserProtocolFeatures::CONFIG));
                return features;
            }
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the backend does not answer: {e}"),
        }
    }
}

#[test]
fn garbage_on_the_socket_is_refused_and_the_backend_serves_on() {
    let d = tempfile::tempdir().unwrap();
    let disk = d.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    let mut b = serve(d.path(), &disk);
    for junk in [
        &b"not a vhost-user message at all"[..],
        // A header claiming a 4 GiB body.
        &[1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff][..],
        // An unknown request code, then a truncated body.
        &[0xee, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 1, 2][..],
    ] {
        let end = Instant::now() + Duration::from_secs(10);
        let mut s = loop {
            match UnixStream::connect(&b.socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= end => panic!("the backend never listened: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let _ = s.write_all(junk);
        drop(s);
        // The next frontend is served: the junk was read, refused and forgotten.
        answers(&b.socket);
        assert!(
            b.child.try_wait().unwrap().is_none(),
            "the backend died on {junk:?}"
        );
    }
    let features = answers(&b.socket);
    assert_ne!(features & (1 << 32), 0, "VIRTIO_F_VERSION_1 offered");
    // Its control socket refuses junk in one JSON line and still answers.
    let v = rebound_blk::serve::ask(&b.control, &serde_json::json!({"op": "format-disk"})).unwrap();
    assert!(v["error"].as_str().unwrap().contains("bad request"), "{v}");
    let v = rebound_blk::serve::ask(&b.control, &serde_json::json!({"op": "stats"})).unwrap();
    assert_eq!(v["size_bytes"], 1 << 20);
}

#[test]
fn a_bad_disk_is_refused_in_one_line() {
    let d = tempfile::tempdir().unwrap();
    let q = d.path().join("q.img");
    let mut head = vec![0u8; 4096];
    head[..4].copy_from_slice(b"QFI\xfb");
    std::fs::write(&q, head).unwrap();
    for (disk, want) in [
        (q.clone(), "qcow2"),
        (d.path().join("missing.img"), "cannot open"),
    ] {
        let out = Command::new(rebound())
            .args(["blk", "serve", "--disk"])
            .arg(&disk)
            .arg("--socket")
            .arg(d.path().join("s.sock"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: ") && err.contains(want), "{err}");
    }
}
