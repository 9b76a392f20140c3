//! Booting a real guest from the `default` image under QEMU, its command line built by
//! [`QemuCommand`]; shared by the image boot tests and the boot-time benchmark
//! (`examples/boot_ready.rs`).
#![allow(dead_code)] // each test binary and the example use a subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use rebound_image::Image;
use rebound_vmm::api::Accel;
use rebound_vmm::process::{find_qemu, free_port, qemu_command};
use rebound_vmm::qemu::{
    Boot, Control, Disk, DiskFormat, HostForward, MemoryBackend, NetBackend, Nic, QemuCommand,
    Serial,
};
use serde_json::Value;

/// The image build the image crate's tests use (same home, same agent build).
#[path = "../../../image/tests/common/mod.rs"]
mod image;
pub use image::{ensure_image, image_home};

pub type Error = Box<dyn std::error::Error>;
pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*).into()) };
}

/// A running QEMU with our guest; killed (and its RAM file removed) on drop.
pub struct Guest {
    child: Child,
    pub dir: tempfile::TempDir,
    pub ram: PathBuf,
    pub web_port: u16,
    pub kv_port: u16,
    pub spawned: Instant,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.ram);
    }
}

impl Guest {
    /// Boots `img` (on a copy of its data disk) with `extra` appended to its command line.
    pub fn boot(img: &Image, extra: &str, ram_mib: u64) -> Result<Guest> {
        Guest::boot_with(img, extra, ram_mib, |_| {})
    }

    /// As [`Guest::boot`], with `adjust` applied to the command line first (e.g. room
    /// for hotplugged memory and a virtio-mem device).
    pub fn boot_with(
        img: &Image,
        extra: &str,
        ram_mib: u64,
        adjust: impl FnOnce(&mut QemuCommand),
    ) -> Result<Guest> {
        let dir = tempfile::tempdir()?;
        let disk = dir.path().join("data.ext4");
        std::fs::copy(&img.disk, &disk)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let ram = PathBuf::from(format!(
            "/dev/shm/rebound-image-test-{}-{nanos}",
            std::process::id()
        ));
        let (web_port, kv_port) = (free_port()?, free_port()?);
        let p = |name: &str| dir.path().join(name);
        let mut q = QemuCommand::new(Accel::Tcg, ram_mib, MemoryBackend::SharedFile(ram.clone()))
            .with_crash_devices();
        q.boot = Some(Boot {
            kernel: img.kernel.clone(),
            initrd: Some(img.initrd.clone()),
            append: format!("{} {extra}", img.append),
        });
        q.disks.push(Disk::file(disk, DiskFormat::Raw));
        let forward = |host, guest| HostForward {
            bind: std::net::Ipv4Addr::LOCALHOST,
            host,
            guest,
        };
        q.nics.push(Nic {
            backend: NetBackend::User {
                forwards: vec![forward(web_port, 8080), forward(kv_port, 7070)],
            },
            mac: None,
            filters: Vec::new(),
        });
        q.control = Control {
            qmp: Some(p("qmp.sock")),
            agent: Some(p("agent.sock")),
            serial: Serial::File(p("serial.log")),
            ..Control::default()
        };
        adjust(&mut q);
        let qemu = find_qemu().map_err(|e| {
            format!("{e}; scripts/install-deps.sh installs it (Debian package qemu-system-x86)")
        })?;
        let spawned = Instant::now();
        let child = qemu_command(&qemu, &q.args()?, &p("qemu.log"))?
            .spawn()
            .map_err(|e| format!("starting {}: {e}", qemu.display()))?;
        Ok(Guest {
            child,
            dir,
            ram,
            web_port,
            kv_port,
            spawned,
        })
    }

    /// CPU time QEMU has used so far (user + system), in seconds: under TCG this is the
    /// guest's work, nearly independent of how busy the host is.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the ")" closing the command name; utime and stime are 14th and 15th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            f.get(11).unwrap_or(&"0").parse::<f64>()? + f.get(12).unwrap_or(&"0").parse::<f64>()?;
        Ok(ticks / 100.0) // USER_HZ is 100 on Linux
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Waits until QEMU exits; returns its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("qemu still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the serial log contains `needle`.
    pub fn wait_serial(&self, needle: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.serial();
            if s.contains(needle) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("serial log lacks {needle:?} after {timeout:?}:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn serial(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.path("serial.log")).unwrap_or_default())
            .into_owned()
    }

    /// Bytes of guest RAM at a guest physical address (file offset == address below 4 GiB).
    pub fn read_ram(&self, paddr: u64, len: usize) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(&self.ram)?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, paddr)?;
        Ok(buf)
    }

    fn wait_socket(&mut self, name: &str, deadline: Instant) -> Result<UnixStream> {
        loop {
            if let Ok(s) = UnixStream::connect(self.path(name)) {
                return Ok(s);
            }
            if let Some(st) = self.child.try_wait()? {
                let log = std::fs::read_to_string(self.path("qemu.log")).unwrap_or_default();
                bail!("qemu exited ({st}): {log}");
            }
            if Instant::now() > deadline {
                bail!("{name} did not appear");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn agent(&mut self, deadline: Instant) -> Result<Agent> {
        let s = self.wait_socket("agent.sock", deadline)?;
        Ok(Agent {
            reader: BufReader::new(s.try_clone()?),
            stream: s,
            seen: Vec::new(),
        })
    }

    pub fn qmp(&mut self, deadline: Instant) -> Result<Qmp> {
        let s = self.wait_socket("qmp.sock", deadline)?;
        let mut q = Qmp {
            reader: BufReader::new(s.try_clone()?),
            stream: s,
        };
        q.read(deadline)?; // greeting
        q.execute("qmp_capabilities", deadline)?;
        Ok(q)
    }
}

fn read_json_line(reader: &mut BufReader<UnixStream>, deadline: Instant) -> Result<Value> {
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .ok_or("timed out")?;
        reader
            .get_ref()
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => bail!("connection closed"),
            Ok(_) if line.trim().is_empty() => continue,
            Ok(_) => {
                return serde_json::from_str(line.trim())
                    .map_err(|e| format!("bad JSON line {line:?}: {e}").into())
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                bail!("timed out")
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The host end of the agent channel.
pub struct Agent {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// Every message received so far, in order.
    pub seen: Vec<Value>,
}

impl Agent {
    pub fn send(&mut self, line: &str) -> Result<()> {
        self.stream.write_all(line.as_bytes())?;
        self.stream.write_all(b"\n")?;
        Ok(())
    }

    /// The next message satisfying `pred`, within `timeout`.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = read_json_line(&mut self.reader, deadline)
                .map_err(|e| format!("waiting for {what}: {e}"))?;
            self.seen.push(v.clone());
            if pred(&v) {
                return Ok(v);
            }
        }
    }
}

pub fn is_type(v: &Value, t: &str) -> bool {
    v["type"] == t
}

/// A QMP connection.
pub struct Qmp {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Qmp {
    pub fn read(&mut self, deadline: Instant) -> Result<Value> {
        read_json_line(&mut self.reader, deadline)
    }

    pub fn execute(&mut self, cmd: &str, deadline: Instant) -> Result<Value> {
        self.execute_args(cmd, Value::Null, deadline)
    }

    pub fn execute_args(&mut self, cmd: &str, args: Value, deadline: Instant) -> Result<Value> {
        let mut req = serde_json::json!({ "execute": cmd });
        if !args.is_null() {
            req["arguments"] = args;
        }
        self.stream.write_all(format!("{req}\n").as_bytes())?;
        loop {
            let v = self.read(deadline)?;
            if v.get("return").is_some() {
                return Ok(v["return"].clone());
            }
            if let Some(e) = v.get("error") {
                bail!("{cmd}: {e}");
            }
        }
    }

    pub fn wait_event(&mut self, name: &str, deadline: Instant) -> Result<Value> {
        loop {
            let v = self
                .read(deadline)
                .map_err(|e| format!("waiting for {name}: {e}"))?;
            if v["event"] == name {
                return Ok(v);
            }
        }
    }
}

/// One HTTP/1.1 GET; returns (status, body).
pub fn http_get(port: u16, target: &str) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET {target} HTTP/1.1\r\nHost: guest\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no header end in {resp:?}"))?;
    let head = String::from_utf8_lossy(&resp[..split]).into_owned();
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| format!("bad status line {head}"))?
        .parse()?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .ok_or_else(|| format!("no Content-Length in {head}"))?
        .trim()
        .parse()?;
    let body = resp[split + 4..].to_vec();
    if body.len() != len {
        bail!("body has {} bytes, Content-Length says {len}", body.len());
    }
    Ok((status, body))
}
