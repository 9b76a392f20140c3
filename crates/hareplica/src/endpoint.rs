//! Endpoints (`tcp:HOST:PORT`, `unix:PATH`) and the streams and listeners behind them.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("endpoint {0:?} is neither tcp:HOST:PORT nor unix:PATH")]
    Syntax(String),
    #[error("cannot resolve {0}")]
    Resolve(String, #[source] io::Error),
    #[error("cannot connect to {0}")]
    Connect(String, #[source] io::Error),
    #[error("cannot listen on {0}")]
    Listen(String, #[source] io::Error),
    #[error("{0} is in use by a live listener")]
    InUse(String),
}

/// Where a backup listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `host:port`, resolved at connect time.
    Tcp(String),
    Unix(PathBuf),
}

impl FromStr for Endpoint {
    type Err = EndpointError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(addr) = s.strip_prefix("tcp:") {
            match addr.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Endpoint::Tcp(addr.to_string()))
                }
                _ => Err(EndpointError::Syntax(s.to_string())),
            }
        } else if let Some(path) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            Ok(Endpoint::Unix(PathBuf::from(path)))
        } else {
            Err(EndpointError::Syntax(s.to_string()))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A connected byte stream of either kind.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Endpoint {
    /// Connects, with Nagle off for TCP (commits are latency-bound small writes).
    pub fn connect(&self, timeout: Duration) -> Result<Stream, EndpointError> {
        let conn = |e| EndpointError::Connect(self.to_string(), e);
        match self {
            Endpoint::Tcp(a) => {
                let addrs = a
                    .to_socket_addrs()
                    .map_err(|e| EndpointError::Resolve(a.clone(), e))?;
                let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            s.set_nodelay(true).map_err(conn)?;
                            return Ok(Stream::Tcp(s));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(conn(last))
            }
            Endpoint::Unix(p) => UnixStream::connect(p).map(Stream::Unix).map_err(conn),
        }
    }

    /// Binds a listener. A unix socket file left by a dead listener is replaced; one
    /// that still answers is refused. A unix socket is mode 0600: only its owner (and
    /// root) can connect.
    pub fn listen(&self) -> Result<Listener, EndpointError> {
        let err = |e| EndpointError::Listen(self.to_string(), e);
        match self {
            Endpoint::Tcp(a) => TcpListener::bind(a).map(Listener::Tcp).map_err(err),
            Endpoint::Unix(p) => {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    if meta.file_type().is_socket() {
                        if UnixStream::connect(p).is_ok() {
                            return Err(EndpointError::InUse(self.to_string()));
                        }
                        std::fs::remove_file(p).map_err(err)?;
                    }
                }
                // Bound in a private directory, made 0600 and renamed into place: the
                // socket file appears only once it listens (between bind and listen a
                // client that saw the file would be refused) and is never open to
                // others, not even for an instant.
                let mut tmp = p.as_os_str().to_owned();
                tmp.push(format!(".{}.d", std::process::id()));
                let tmp_dir = std::path::PathBuf::from(tmp);
                let _ = std::fs::remove_dir_all(&tmp_dir);
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&tmp_dir)
                    .map_err(err)?;
                let tmp = tmp_dir.join("s");
                let bound = UnixListener::bind(&tmp).and_then(|l| {
                    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
                    std::fs::rename(&tmp, p)?;
                    Ok(l)
                });
                let _ = std::fs::remove_file(&tmp);
                let _ = std::fs::remove_dir(&tmp_dir);
                match bound {
                    Ok(l) => Ok(Listener::Unix(l, p.clone())),
                    // The longer name does not fit a socket address: bind the name
                    // itself.
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => bind_private(p)
                        .map(|l| Listener::Unix(l, p.clone()))
                        .map_err(err),
                    Err(e) => Err(err(e)),
                }
            }
        }
    }
}

/// Binds `p` and makes it 0600. Until the chmod the socket has the mode the umask gives
/// (0755 under the usual 022, which lets no one else connect: connecting needs write
/// permission). The umask is not changed instead: it is the whole process's.
fn bind_private(p: &std::path::Path) -> io::Result<UnixListener> {
    let l = UnixListener::bind(p)?;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

impl Stream {
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// Closes both directions; blocked readers on clones wake up.
    pub fn shutdown(&self) {
        // The peer may already be gone; nothing to do then.
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Ends our sending side; the peer reads end-of-stream after what was sent.
    pub fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        }
    }

    fn raw_fd(&self) -> i32 {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// A printable name of the peer.
    pub fn peer_name(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_else(|_| "tcp:?".into()),
            Stream::Unix(_) => "unix".into(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The buffered read side of a [`Stream`] that can busy-poll: waking a blocked reader costs
/// tens of µs on an idle CPU, more than a short spin. What a poll finds stays in the buffer,
/// so once data has come, reading it takes no further system call.
pub struct PollingReader {
    stream: Stream,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    /// A poll saw the end of the stream; the next read reports it.
    eof: bool,
}

impl PollingReader {
    pub fn with_capacity(capacity: usize, stream: Stream) -> PollingReader {
        PollingReader {
            stream,
            buf: vec![0u8; capacity.max(1)].into_boxed_slice(),
            pos: 0,
            len: 0,
            eof: false,
        }
    }

    /// Bytes read from the stream and not yet consumed.
    pub fn buffer(&self) -> &[u8] {
        &self.buf[self.pos..self.len]
    }

    pub fn get_ref(&self) -> &Stream {
        &self.stream
    }

    pub fn get_mut(&mut self) -> &mut Stream {
        &mut self.stream
    }

    /// Busy-polls up to `spin` for bytes (or the end of the stream) without sleeping.
    /// Returns whether something is there to read; on `false` a read blocks as usual.
    pub fn poll_for(&mut self, spin: Duration) -> bool {
        if self.pos < self.len || self.eof {
            return true;
        }
        let fd = self.stream.raw_fd();
        let start = std::time::Instant::now();
        loop {
            // SAFETY: `buf` is writable memory of `buf.len()` bytes owned by `self` for the
            // call, and `fd` stays open because `self.stream` owns it.
            let n = unsafe {
                libc::recv(
                    fd,
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                (self.pos, self.len) = (0, n as usize);
                return true;
            }
            if n == 0 {
                self.eof = true;
                return true;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock && e.kind() != io::ErrorKind::Interrupted {
                return true; // the blocking read reports the error
            }
            if start.elapsed() >= spin {
                return false;
            }
            std::hint::spin_loop();
        }
    }
}

impl Read for PollingReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.len {
            if self.eof {
                self.eof = false;
                return Ok(0);
            }
            // Large reads bypass the buffer, as BufReader's do.
            if out.len() >= self.buf.len() {
                return self.stream.read(out);
            }
            let n = self.stream.read(&mut self.buf)?;
            (self.pos, self.len) = (0, n);
        }
        let n = out.len().min(self.len - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// A bound listener of either kind.
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Waits up to `timeout` for a connection to accept; `false` on timeout.
    pub fn wait_pending(&self, timeout: Duration) -> io::Result<bool> {
        let fd = match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one valid pollfd on our stack for the duration of the call, and
        // `fd` stays open because `self` borrows the listener that owns it.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            n if n < 0 => Err(io::Error::last_os_error()),
            n => Ok(n > 0),
        }
    }

    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                set_keepalive(&s)?;
                Ok(Stream::Tcp(s))
            }
            Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
        }
    }

    /// The endpoint actually bound (resolves `tcp:…:0` to the chosen port).
    pub fn local_endpoint(&self) -> io::Result<Endpoint> {
        match self {
            Listener::Tcp(l) => Ok(Endpoint::Tcp(l.local_addr()?.to_string())),
            // The name it was renamed to, not the one it was bound under.
            Listener::Unix(_, path) => Ok(Endpoint::Unix(path.clone())),
        }
    }
}

/// TCP keepalive: a peer whose host died (no FIN ever comes) is noticed after about
/// 5 + 3 × 2 = 11 s of silence, which ends its session.
fn set_keepalive(s: &TcpStream) -> io::Result<()> {
    let fd = s.as_raw_fd();
    for (level, opt, val) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 2),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = val;
        // SAFETY: `fd` is the open socket `s` borrows; the option value is a c_int on our
        // stack whose size we pass, as these options expect.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_endpoints() {
        for s in [
            "tcp:127.0.0.1:7800",
            "tcp:[::1]:1",
            "unix:/tmp/x.sock",
            "tcp:localhost:0",
        ] {
            assert_eq!(s.parse::<Endpoint>().unwrap().to_string(), s);
        }
        for s in [
            "",
            "tcp:",
            "tcp:host",
            "tcp::80",
            "tcp:h:99999",
            "unix:",
            "udp:1:2",
            "x",
        ] {
            assert!(s.parse::<Endpoint>().is_err(), "{s} accepted");
        }
    }

    #[test]
    fn polling_reader_keeps_what_it_finds_and_gives_up_on_silence() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut a = Stream::Unix(a);
        let mut r = PollingReader::with_capacity(4, Stream::Unix(b));
        let t = std::time::Instant::now();
        assert!(!r.poll_for(Duration::from_micros(300)));
        assert!(t.elapsed() >= Duration::from_micros(300));
        assert!(!r.poll_for(Duration::ZERO));
        a.write_all(b"hello").unwrap();
        assert!(r.poll_for(Duration::from_secs(5)));
        assert_eq!(r.buffer(), b"hell", "the poll read up to the buffer's size");
        let mut buf = [0u8; 8];
        assert_eq!(r.read(&mut buf).unwrap(), 4);
        assert_eq!(
            r.read(&mut buf).unwrap(),
            1,
            "the rest comes from the stream"
        );
        assert_eq!(buf[0], b'o');
        a.shutdown();
        assert!(r.poll_for(Duration::from_secs(5)));
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn accepted_tcp_streams_have_keepalive_and_nodelay() {
        let l = Endpoint::Tcp("127.0.0.1:0".into()).listen().unwrap();
        let ep = l.local_endpoint().unwrap();
        let _c = ep.connect(Duration::from_secs(5)).unwrap();
        let Stream::Tcp(s) = l.accept().unwrap() else {
            panic!("not tcp")
        };
        assert!(s.nodelay().unwrap());
        let get = |level, opt| {
            let mut v: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: `s` keeps the descriptor open; `v` and `len` are live locals sized
            // for the c_int these options return.
            let rc = unsafe {
                libc::getsockopt(
                    s.as_raw_fd(),
                    level,
                    opt,
                    (&mut v as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v
        };
        assert_eq!(get(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 5);
    }

    #[test]
    fn unix_sockets_are_private_however_long_their_name() {
        let dir = tempfile::tempdir().unwrap();
        // The second name leaves no room for the private directory's suffix.
        let long = "x".repeat(100 - dir.path().as_os_str().len());
        for name in ["s", long.as_str()] {
            let ep = Endpoint::Unix(dir.path().join(name));
            let _l = ep.listen().unwrap();
            let Endpoint::Unix(p) = &ep else {
                unreachable!()
            };
            let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 2, "no temporary names left behind: {left:?}");
    }

    #[test]
    fn stale_unix_socket_is_replaced_live_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ep: Endpoint = format!("unix:{}/s", dir.path().display()).parse().unwrap();
        let l = ep.listen().unwrap();
        assert!(matches!(ep.listen(), Err(EndpointError::InUse(_))));
        drop(l);
        let _l2 = ep.listen().unwrap();
    }
}
