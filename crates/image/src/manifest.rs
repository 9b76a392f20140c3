//! `manifest.json` of a built image: format name and version, what it was built from
//! (inputs hash), and each file's size and SHA-256. Read back with a size cap; unknown
//! versions and anything malformed are refused with a one-line reason.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Errors reading or writing a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("cannot write {path}: {err}")]
    Write { path: String, err: std::io::Error },
    #[error("{path} is larger than {max} bytes: not a manifest")]
    TooLarge { path: String, max: u64 },
    #[error("{path} is not a valid manifest: {reason}")]
    Invalid { path: String, reason: String },
    #[error("{path} is format {format:?}, expected {FORMAT:?}")]
    WrongFormat { path: String, format: String },
    #[error("{path} has manifest version {version}; this build reads version {VERSION}")]
    WrongVersion { path: String, version: u64 },
}

pub const FORMAT: &str = "rebound-image";
pub const VERSION: u64 = 1;
const MAX_BYTES: u64 = 1 << 20;

/// One file of the image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

impl FileEntry {
    /// Size and SHA-256 of `dir/name`.
    pub fn of(dir: &Path, name: &str) -> std::io::Result<FileEntry> {
        let p = dir.join(name);
        Ok(FileEntry {
            path: name.to_string(),
            size: std::fs::metadata(&p)?.len(),
            sha256: sha256_of(&p)?,
        })
    }
}

/// SHA-256 of a file, hex.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// A package the image was built from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PackageEntry {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

/// The manifest (version 1).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u64,
    pub name: String,
    pub kernel_release: String,
    pub append: String,
    pub inputs_hash: String,
    pub built_at: String,
    pub builder_version: u32,
    pub packages: Vec<PackageEntry>,
    pub modules: Vec<String>,
    /// Role ("kernel", "kernel_bzimage", "initrd", "disk") → file.
    pub files: BTreeMap<String, FileEntry>,
}

/// Just the header, read first so a newer version is named as such instead of failing
/// on a field this build does not know.
#[derive(Deserialize)]
struct Header {
    format: String,
    version: u64,
}

impl Manifest {
    /// Parses manifest text; `path` only names the file in errors.
    pub fn parse(path: &str, text: &[u8]) -> Result<Manifest, ManifestError> {
        let invalid = |e: serde_json::Error| ManifestError::Invalid {
            path: path.to_string(),
            reason: e.to_string(),
        };
        let h: Header = serde_json::from_slice(text).map_err(invalid)?;
        if h.format != FORMAT {
            return Err(ManifestError::WrongFormat {
                path: path.to_string(),
                format: h.format,
            });
        }
        if h.version != VERSION {
            return Err(ManifestError::WrongVersion {
                path: path.to_string(),
                version: h.version,
            });
        }
        let m: Manifest = serde_json::from_slice(text).map_err(invalid)?;
        for role in ["kernel", "initrd", "disk"] {
            let Some(f) = m.files.get(role) else {
                return Err(ManifestError::Invalid {
                    path: path.to_string(),
                    reason: format!("no {role} file listed"),
                });
            };
            if f.path.is_empty() || f.path.contains('/') || f.path.starts_with('.') {
                return Err(ManifestError::Invalid {
                    path: path.to_string(),
                    reason: format!("bad file name {:?}", f.path),
                });
            }
        }
        Ok(m)
    }

    /// Reads `dir/manifest.json`.
    pub fn read(file: &Path) -> Result<Manifest, ManifestError> {
        use std::io::Read;
        let path = file.display().to_string();
        let f = std::fs::File::open(file).map_err(|err| ManifestError::Read {
            path: path.clone(),
            err,
        })?;
        let mut text = Vec::new();
        f.take(MAX_BYTES + 1)
            .read_to_end(&mut text)
            .map_err(|err| ManifestError::Read {
                path: path.clone(),
                err,
            })?;
        if text.len() as u64 > MAX_BYTES {
            return Err(ManifestError::TooLarge {
                path,
                max: MAX_BYTES,
            });
        }
        Manifest::parse(&path, &text)
    }

    /// Writes the manifest to `file`, synced.
    pub fn write(&self, file: &Path) -> Result<(), ManifestError> {
        use std::io::Write;
        let path = file.display().to_string();
        let werr = |err| ManifestError::Write {
            path: path.clone(),
            err,
        };
        let mut text =
            serde_json::to_vec_pretty(self).map_err(|e| werr(std::io::Error::other(e)))?;
        text.push(b'\n');
        let mut f = std::fs::File::create(file).map_err(werr)?;
        f.write_all(&text).map_err(werr)?;
        f.sync_all().map_err(werr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let file = |p: &str| FileEntry {
            path: p.into(),
            size: 3,
            sha256: "00".repeat(32),
        };
        Manifest {
            format: FORMAT.into(),
            version: VERSION,
            name: "default".into(),
            kernel_release: "6.1.0-56-amd64".into(),
            append: "console=ttyS0".into(),
            inputs_hash: "ab".repeat(32),
            built_at: "2026-11-22T00:00:00Z".into(),
            builder_version: 1,
            packages: vec![PackageEntry {
                name: "busybox-static".into(),
                version: "1:1.35".into(),
                sha256: "cd".repeat(32),
            }],
            modules: vec!["kernel/fs/ext4/ext4.ko".into()],
            files: [
                ("kernel", file("vmlinux")),
                ("initrd", file("initrd.cpio.gz")),
                ("disk", file("data.ext4")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        }
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("manifest.json");
        sample().write(&p).unwrap();
        assert_eq!(Manifest::read(&p).unwrap(), sample());
    }

    #[test]
    fn truncated_is_invalid() {
        let text = serde_json::to_vec(&sample()).unwrap();
        for cut in [0, 1, 10, text.len() / 2, text.len() - 1] {
            let e = Manifest::parse("m", &text[..cut]).unwrap_err();
            assert!(matches!(e, ManifestError::Invalid { .. }), "cut {cut}: {e}");
        }
    }

    #[test]
    fn wrong_version_and_format() {
        let mut m = serde_json::to_value(sample()).unwrap();
        m["version"] = 2.into();
        m["new_field"] = "from the future".into();
        let e = Manifest::parse("m", &serde_json::to_vec(&m).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "m has manifest version 2; this build reads version 1"
        );
        let mut m = serde_json::to_value(sample()).unwrap();
        m["format"] = "rebound-snapshot".into();
        assert!(matches!(
            Manifest::parse("m", &serde_json::to_vec(&m).unwrap()).unwrap_err(),
            ManifestError::WrongFormat { .. }
        ));
    }

    #[test]
    fn garbage_and_bad_fields() {
        for g in [
            &b"\x00\xff\xfe garbage"[..],
            b"[]",
            b"null",
            b"{}",
            b"{\"format\":\"rebound-image\"}",
        ] {
            assert!(matches!(
                Manifest::parse("m", g).unwrap_err(),
                ManifestError::Invalid { .. }
            ));
        }
        let mut m = serde_json::to_value(sample()).unwrap();
        m["files"]["kernel"]["path"] = "../../etc/passwd".into();
        let e = Manifest::parse("m", &serde_json::to_vec(&m).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad file name"), "{e}");
        let mut m = serde_json::to_value(sample()).unwrap();
        m["files"].as_object_mut().unwrap().remove("initrd");
        let e = Manifest::parse("m", &serde_json::to_vec(&m).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no initrd file"), "{e}");
        let mut m = serde_json::to_value(sample()).unwrap();
        m["files"]["disk"]["size"] = "big".into();
        assert!(matches!(
            Manifest::parse("m", &serde_json::to_vec(&m).unwrap()).unwrap_err(),
            ManifestError::Invalid { .. }
        ));
    }

    #[test]
    fn oversized_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("manifest.json");
        std::fs::write(&p, vec![b' '; (MAX_BYTES + 10) as usize]).unwrap();
        assert!(matches!(
            Manifest::read(&p).unwrap_err(),
            ManifestError::TooLarge { .. }
        ));
    }
}
