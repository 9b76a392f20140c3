//! The shared secret of the HA backup's TCP listener: at least [`MIN_TOKEN_LEN`] random bytes that
//! each peer reads from a file only its owner can read, and HMAC-SHA256 proofs that a peer
//! holds it without sending it.
//!
//! The file holds the token's bytes as they are (raw random bytes, or text such as the
//! hex printed by `openssl rand -hex 32`); one trailing newline (`\n` or `\r\n`) is not
//! part of the token. A file owned by another user than the one reading it, readable or
//! writable by group or others, shorter than [`MIN_TOKEN_LEN`] bytes or longer than
//! [`MAX_TOKEN_LEN`] bytes is refused.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The fewest bytes a cluster token may have.
pub const MIN_TOKEN_LEN: usize = 32;
/// The most bytes a token file may hold (a larger file is not a token).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read cluster token file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cluster token file {path} is accessible by group or others (mode {mode:03o}); chmod 600 it")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("cluster token file {path} belongs to uid {owner}, not to this user (uid {me}); a token file must be the daemon user's own")]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error("cluster token file {path} holds {len} bytes; a token needs at least {MIN_TOKEN_LEN} random bytes")]
    TooShort { path: PathBuf, len: usize },
    #[error("cluster token file {path} holds more than {MAX_TOKEN_LEN} bytes; it is not a token")]
    TooLong { path: PathBuf },
    #[error("cannot get random bytes for a new cluster token")]
    Random(#[source] getrandom::Error),
    #[error("cannot write cluster token file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The shared secret of a cluster. Its `Debug` does not show the bytes.
#[derive(Clone)]
pub struct ClusterToken(Vec<u8>);

impl fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterToken({} bytes)", self.0.len())
    }
}

impl ClusterToken {
    /// Reads the token from `path`, refusing a file that group or others can access
    /// and a token shorter than [`MIN_TOKEN_LEN`] bytes.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let read_err = |source| TokenError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            // Whoever owns the file can change the token under us.
            return Err(TokenError::Owner {
                path: path.to_owned(),
                owner: meta.uid(),
                me,
            });
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        if meta.len() > MAX_TOKEN_LEN as u64 + 2 {
            return Err(TokenError::TooLong {
                path: path.to_owned(),
            });
        }
        let mut bytes = std::fs::read(path).map_err(read_err)?;
        if bytes.ends_with(b"\r\n") {
            bytes.truncate(bytes.len() - 2);
        } else if bytes.ends_with(b"\n") {
            bytes.truncate(bytes.len() - 1);
        }
        if bytes.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong {
                path: path.to_owned(),
            });
        }
        if bytes.len() < MIN_TOKEN_LEN {
            return Err(TokenError::TooShort {
                path: path.to_owned(),
                len: bytes.len(),
            });
        }
        Ok(Self(bytes))
    }

    /// Creates a new token file at `path` (mode 0600, refusing to overwrite a file)
    /// holding 32 fresh random bytes as 64 hex digits, and returns the token.
    pub fn create_file(path: &Path) -> Result<Self, TokenError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(TokenError::Random)?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let write_err = |source| TokenError::Write {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_err)?;
        file.write_all(hex.as_bytes()).map_err(write_err)?;
        file.write_all(b"\n").map_err(write_err)?;
        Ok(Self(hex.into_bytes()))
    }

    /// A token from bytes already in memory (tests, or a caller with its own store);
    /// the same length rule as [`ClusterToken::from_file`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (MIN_TOKEN_LEN..=MAX_TOKEN_LEN)
            .contains(&bytes.len())
            .then(|| Self(bytes.to_vec()))
    }

    /// The secret itself, to key MACs with; never to be sent or logged.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// `HMAC(token, label ‖ nonce_a ‖ nonce_b)`: proves holding the token for one
    /// handshake (both sides' fresh nonces), in one role (the label).
    pub fn proof(&self, label: &[u8], nonce_a: &[u8], nonce_b: &[u8]) -> [u8; PROOF_LEN] {
        hmac_bytes(&self.0, &[label, nonce_a, nonce_b])
    }

    /// Checks a peer's [`proof`](Self::proof) in constant time.
    pub fn verify(&self, label: &[u8], nonce_a: &[u8], nonce_b: &[u8], proof: &[u8]) -> bool {
        hmac_verify(&self.0, &[label, nonce_a, nonce_b], proof)
    }
}

/// Bytes of a proof (an HMAC-SHA256) and of a handshake nonce.
pub const PROOF_LEN: usize = 32;
pub const NONCE_LEN: usize = 32;

/// A fresh random handshake nonce.
pub fn nonce() -> Result<[u8; NONCE_LEN], getrandom::Error> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n)?;
    Ok(n)
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes a key of any length, so `new_from_slice` cannot fail.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    for p in parts {
        mac.update(p);
    }
    mac
}

/// `HMAC-SHA256(key, parts concatenated)`.
pub fn hmac_bytes(key: &[u8], parts: &[&[u8]]) -> [u8; PROOF_LEN] {
    hmac(key, parts).finalize().into_bytes().into()
}

/// Verifies `tag` against `HMAC-SHA256(key, parts)` in constant time.
pub fn hmac_verify(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    hmac(key, parts).verify_slice(tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn accepts_private_long_token_and_strips_one_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(
            dir.path(),
            "t",
            &[b'a'; 33].iter().chain(b"\n").copied().collect::<Vec<_>>(),
            0o600,
        );
        let token = ClusterToken::from_file(&path).unwrap();
        assert_eq!(token.bytes(), &[b'a'; 33]);
        assert_eq!(format!("{token:?}"), "ClusterToken(33 bytes)");
    }

    #[test]
    fn created_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let made = ClusterToken::create_file(&path).unwrap();
        let read = ClusterToken::from_file(&path).unwrap();
        assert_eq!(made.bytes(), read.bytes());
        assert_eq!(read.bytes().len(), 64);
        assert!(
            ClusterToken::create_file(&path).is_err(),
            "must not overwrite"
        );
    }

    #[test]
    fn refuses_group_readable_and_short() {
        let dir = tempfile::tempdir().unwrap();
        let loose = write(dir.path(), "loose", &[7; 40], 0o640);
        let err = ClusterToken::from_file(&loose).unwrap_err();
        assert!(
            matches!(err, TokenError::Permissions { mode: 0o640, .. }),
            "{err}"
        );
        let short = write(dir.path(), "short", &[7; 31], 0o600);
        let err = ClusterToken::from_file(&short).unwrap_err();
        assert!(matches!(err, TokenError::TooShort { len: 31, .. }), "{err}");
        assert!(!err.to_string().contains('\n'));
    }

    #[test]
    fn refuses_a_file_another_user_owns() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "this test gives a file to another user: run it as root, as make test does"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "theirs", &[7; 40], 0o600);
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let err = ClusterToken::from_file(&path).unwrap_err();
        assert!(
            matches!(
                err,
                TokenError::Owner {
                    owner: 65534,
                    me: 0,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn proofs_verify_only_for_the_same_token_label_and_nonces() {
        let t = ClusterToken::from_bytes(&[1; 32]).unwrap();
        let other = ClusterToken::from_bytes(&[2; 32]).unwrap();
        let p = t.proof(b"role", b"a", b"b");
        assert!(t.verify(b"role", b"a", b"b", &p));
        assert!(!other.verify(b"role", b"a", b"b", &p));
        assert!(!t.verify(b"other role", b"a", b"b", &p));
        assert!(!t.verify(b"role", b"a", b"c", &p));
        assert!(!t.verify(b"role", b"a", b"b", &p[..31]));
    }
}
