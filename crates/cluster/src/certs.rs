//! Certificates for a cluster store in test and small setups (`rebound cluster
//! certs`): a CA, one certificate per host and one for the operator. Production
//! uses the operator's own PKI; what matters to Rebound is only the names below.
//!
//! etcd run with `--client-cert-auth` takes a client's user name from its
//! certificate's common name, so the names here ARE the store's identities:
//! - host `h` gets `h.crt`/`h.key` with CN `rebound-host-h` ([`host_cn`]), for
//!   client and server authentication, with the SANs `h`, `localhost`, 127.0.0.1 and
//!   any addresses given for `h`: the same pair serves the etcd member in `h`'s
//!   network and the host's daemon;
//! - the operator gets `root.crt`/`root.key` with CN `root` (etcd's root user);
//! - the CA is `ca.crt`/`ca.key`.
//!
//! Keys are ECDSA P-256, written mode 600 in a directory created mode 700. An
//! existing CA is never overwritten unless asked ([`Mode::Replace`]); more hosts
//! are signed with it by [`Mode::Add`]. Every file is written under a temporary
//! name first, so a failure leaves no half-made set.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// The etcd user (and certificate CN) of the operator: etcd's root user.
pub const ROOT_CN: &str = "root";
/// File stems no host may take: they name the CA's and the operator's files.
const RESERVED: [&str; 2] = ["ca", ROOT_CN];
/// The CA outlives the certificates it signs, so hosts can be added later.
const CA_MIN_DAYS: u32 = 3650;
/// Certificates start an hour in the past: clocks of hosts differ.
const BACKDATE: Duration = Duration::hours(1);

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("invalid host name {0:?}: use 1-63 lowercase letters, digits or '-', starting with a letter or digit")]
    BadHost(String),
    #[error("host name {0:?} is reserved for the CA's or the operator's files")]
    ReservedHost(String),
    #[error("host {0:?} is given twice")]
    DuplicateHost(String),
    #[error("no host given (--hosts h1,h2,...)")]
    NoHosts,
    #[error("invalid address {0:?}: use HOST=IP")]
    BadIpSan(String),
    #[error("address given for {0:?}, which is not in the host list")]
    IpSanForUnknownHost(String),
    #[error("validity must be at least one day")]
    BadDays,
    #[error("{0} already holds a CA: --add signs more hosts with it, --force replaces it (every certificate it signed stops working)")]
    CaExists(PathBuf),
    #[error("no CA in {0} to add to (ca.crt and ca.key)")]
    NoCa(PathBuf),
    #[error("{0} exists already: remove it to sign it again")]
    CertExists(PathBuf),
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("cannot read the CA in {0}")]
    ReadCa(PathBuf, #[source] std::io::Error),
    #[error("the CA in {0} cannot be used")]
    BadCa(PathBuf, #[source] rcgen::Error),
    #[error("cannot make a certificate")]
    Generate(#[from] rcgen::Error),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// The etcd user (and certificate CN) of host `host`.
pub fn host_cn(host: &str) -> String {
    format!("rebound-host-{host}")
}

/// A host name: `[a-z0-9][a-z0-9-]{0,62}` (a DNS label, and part of store keys).
pub fn valid_host(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// What to do with the CA in the output directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Make a CA; refuse if the directory holds one.
    New,
    /// Make a CA even if the directory holds one (the old one's certificates stop
    /// working with the new `ca.crt`).
    Replace,
    /// Sign the hosts (and `root`, if its files are missing) with the directory's CA;
    /// refuse to overwrite any host's files.
    Add,
}

/// One `rebound cluster certs` request, checked by [`Request::new`].
#[derive(Debug, Clone)]
pub struct Request {
    hosts: Vec<String>,
    ip_sans: BTreeMap<String, Vec<IpAddr>>,
    days: u32,
    mode: Mode,
}

/// One certificate to issue: its file stem, CN, SANs and uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub stem: String,
    pub cn: String,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// Also a server certificate (an etcd member's), not only a client's.
    pub server: bool,
}

/// Parses `HOST=IP` (`--ip-sans`).
pub fn parse_ip_san(s: &str) -> Result<(String, IpAddr), CertsError> {
    let (h, ip) = s
        .split_once('=')
        .ok_or_else(|| CertsError::BadIpSan(s.into()))?;
    let ip = ip.parse().map_err(|_| CertsError::BadIpSan(s.into()))?;
    Ok((h.to_string(), ip))
}

impl Request {
    pub fn new(
        hosts: &[String],
        ip_sans: &[(String, IpAddr)],
        days: u32,
        mode: Mode,
    ) -> Result<Request, CertsError> {
        if hosts.is_empty() {
            return Err(CertsError::NoHosts);
        }
        if days == 0 {
            return Err(CertsError::BadDays);
        }
        let mut seen = BTreeSet::new();
        for h in hosts {
            if !valid_host(h) {
                return Err(CertsError::BadHost(h.clone()));
            }
            if RESERVED.contains(&h.as_str()) {
                return Err(CertsError::ReservedHost(h.clone()));
            }
            if !seen.insert(h.as_str()) {
                return Err(CertsError::DuplicateHost(h.clone()));
            }
        }
        let mut ips: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (h, ip) in ip_sans {
            if !seen.contains(h.as_str()) {
                return Err(CertsError::IpSanForUnknownHost(h.clone()));
            }
            let v = ips.entry(h.clone()).or_default();
            if !v.contains(ip) {
                v.push(*ip);
            }
        }
        Ok(Request {
            hosts: hosts.to_vec(),
            ip_sans: ips,
            days,
            mode,
        })
    }

    /// The certificates to issue; `root_missing` says whether the directory lacks the
    /// operator's files (only [`Mode::Add`] looks at it).
    pub fn identities(&self, root_missing: bool) -> Vec<Identity> {
        let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut out: Vec<Identity> = self
            .hosts
            .iter()
            .map(|h| {
                let mut ips = vec![localhost];
                for ip in self.ip_sans.get(h).into_iter().flatten() {
                    if !ips.contains(ip) {
                        ips.push(*ip);
                    }
                }
                Identity {
                    stem: h.clone(),
                    cn: host_cn(h),
                    dns: vec![h.clone(), "localhost".into()],
                    ips,
                    server: true,
                }
            })
            .collect();
        if self.mode != Mode::Add || root_missing {
            out.push(Identity {
                stem: ROOT_CN.into(),
                cn: ROOT_CN.into(),
                dns: Vec::new(),
                ips: Vec::new(),
                server: false,
            });
        }
        out
    }
}

/// What [`issue`] wrote, in order.
#[derive(Debug)]
pub struct Issued {
    pub files: Vec<PathBuf>,
    /// Whether a new CA was made (otherwise the directory's signed them).
    pub new_ca: bool,
}

/// Writes the request's certificates into `dir` (created mode 700 if missing).
pub fn issue(dir: &Path, req: &Request) -> Result<Issued, CertsError> {
    let (ca_crt, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if dir.exists() && !dir.is_dir() {
        return Err(CertsError::NotADirectory(dir.into()));
    }
    let has_ca = ca_crt.exists() || ca_key.exists();
    match req.mode {
        Mode::New if has_ca => return Err(CertsError::CaExists(dir.into())),
        Mode::Add if !(ca_crt.exists() && ca_key.exists()) => {
            return Err(CertsError::NoCa(dir.into()))
        }
        _ => {}
    }
    let ids = req.identities(!dir.join(format!("{ROOT_CN}.crt")).exists());
    if req.mode == Mode::Add {
        for id in &ids {
            for ext in ["crt", "key"] {
                let p = dir.join(format!("{}.{ext}", id.stem));
                if p.exists() {
                    return Err(CertsError::CertExists(p));
                }
            }
        }
    }

    let now = OffsetDateTime::now_utc();
    let mut files: Vec<(PathBuf, String, bool)> = Vec::new();
    let issuer = if req.mode == Mode::Add {
        let read =
            |p: &Path| std::fs::read_to_string(p).map_err(|e| CertsError::ReadCa(dir.into(), e));
        let key =
            KeyPair::from_pem(&read(&ca_key)?).map_err(|e| CertsError::BadCa(dir.into(), e))?;
        Issuer::from_ca_cert_pem(&read(&ca_crt)?, key)
            .map_err(|e| CertsError::BadCa(dir.into(), e))?
    } else {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, "Rebound cluster CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        p.not_before = now - BACKDATE;
        p.not_after = now + Duration::days(i64::from(req.days.max(CA_MIN_DAYS)));
        let key = KeyPair::generate()?;
        let cert = p.self_signed(&key)?;
        files.push((ca_crt.clone(), cert.pem(), false));
        files.push((ca_key.clone(), key.serialize_pem(), true));
        Issuer::new(p, key)
    };
    for id in &ids {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, id.cn.as_str());
        p.subject_alt_names = id
            .dns
            .iter()
            .map(|d| Ok(SanType::DnsName(d.as_str().try_into()?)))
            .collect::<Result<Vec<_>, rcgen::Error>>()?;
        p.subject_alt_names
            .extend(id.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if id.server {
            p.extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        p.use_authority_key_identifier_extension = true;
        p.not_before = now - BACKDATE;
        p.not_after = now + Duration::days(i64::from(req.days));
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &issuer)?;
        files.push((dir.join(format!("{}.crt", id.stem)), cert.pem(), false));
        files.push((
            dir.join(format!("{}.key", id.stem)),
            key.serialize_pem(),
            true,
        ));
    }
    write_all(dir, &files)?;
    Ok(Issued {
        files: files.into_iter().map(|(p, _, _)| p).collect(),
        new_ca: req.mode != Mode::Add,
    })
}

/// Writes every file under a temporary name, then renames them all into place; on
/// failure the temporary files go and nothing in `dir` changed.
fn write_all(dir: &Path, files: &[(PathBuf, String, bool)]) -> Result<(), CertsError> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| CertsError::Write(dir.into(), e))?;
    }
    let tmp = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push(".tmp");
        PathBuf::from(s)
    };
    let mut written = Vec::new();
    let r = (|| {
        for (path, text, secret) in files {
            let t = tmp(path);
            let _ = std::fs::remove_file(&t);
            written.push(t.clone());
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if *secret { 0o600 } else { 0o644 })
                .open(&t)
                .map_err(|e| CertsError::Write(path.clone(), e))?;
            f.write_all(text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| CertsError::Write(path.clone(), e))?;
        }
        for (path, _, _) in files {
            std::fs::rename(tmp(path), path).map_err(|e| CertsError::Write(path.clone(), e))?;
        }
        Ok(())
    })();
    if r.is_err() {
        for t in written {
            let _ = std::fs::remove_file(t);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::*;

    use super::*;

    fn hosts(h: &[&str]) -> Vec<String> {
        h.iter().map(|s| s.to_string()).collect()
    }

    fn pem_der(p: &Path) -> Vec<u8> {
        let text = std::fs::read(p).unwrap();
        let (_, pem) = parse_x509_pem(&text).unwrap();
        assert_eq!(pem.label, "CERTIFICATE");
        pem.contents
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    fn cn(c: &X509Certificate) -> String {
        c.subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn host_names_follow_the_key_layout() {
        for ok in ["h1", "a", "0", "host-2", &"a".repeat(63)] {
            assert!(valid_host(ok), "{ok}");
        }
        for bad in ["", "-a", "A1", "h_1", "h.1", "h/1", "hé", &"a".repeat(64)] {
            assert!(!valid_host(bad), "{bad}");
        }
        assert_eq!(host_cn("h1"), "rebound-host-h1");
    }

    #[test]
    fn requests_are_checked_before_anything_is_made() {
        let r = |h: &[&str], ips: &[(&str, &str)], days| {
            let ips: Vec<_> = ips
                .iter()
                .map(|(h, i)| (h.to_string(), i.parse().unwrap()))
                .collect();
            Request::new(&hosts(h), &ips, days, Mode::New)
                .unwrap_err()
                .to_string()
        };
        assert!(r(&[], &[], 1).contains("no host"));
        assert!(r(&["H1"], &[], 1).contains("invalid host name \"H1\""));
        assert!(r(&["root"], &[], 1).contains("reserved"));
        assert!(r(&["ca"], &[], 1).contains("reserved"));
        assert!(r(&["h1", "h1"], &[], 1).contains("twice"));
        assert!(r(&["h1"], &[("h2", "10.0.0.1")], 1).contains("\"h2\""));
        assert!(r(&["h1"], &[], 0).contains("one day"));
        assert!(parse_ip_san("h1").is_err());
        assert!(parse_ip_san("h1=10.0.0.300").is_err());
        assert_eq!(
            parse_ip_san("h1=10.77.0.1").unwrap(),
            ("h1".to_string(), "10.77.0.1".parse().unwrap())
        );
    }

    #[test]
    fn a_ca_host_certificates_and_the_operators_parse_back_with_their_names_and_uses() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let ip = ("h1".to_string(), "10.77.0.1".parse().unwrap());
        let req = Request::new(&hosts(&["h1", "h2"]), &[ip], 30, Mode::New).unwrap();
        let issued = issue(&dir, &req).unwrap();
        assert!(issued.new_ca);
        assert_eq!(mode(&dir), 0o700);
        let names: Vec<String> = issued
            .files
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["ca.crt", "ca.key", "h1.crt", "h1.key", "h2.crt", "h2.key", "root.crt", "root.key"]
        );
        for n in &names {
            let m = mode(&dir.join(n));
            if n.ends_with(".key") {
                assert_eq!(m, 0o600, "{n}");
            } else {
                // 644 less the umask: certificates are public.
                assert_eq!(m & !0o644, 0, "{n}: {m:o}");
            }
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), names.len());

        let ca_der = pem_der(&dir.join("ca.crt"));
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        assert!(ca.is_ca());
        let now = ASN1Time::now();
        assert!(ca.validity().is_valid_at(now));

        let h1_der = pem_der(&dir.join("h1.crt"));
        let (_, h1) = parse_x509_certificate(&h1_der).unwrap();
        assert_eq!(cn(&h1), "rebound-host-h1");
        assert!(!h1.is_ca());
        h1.verify_signature(Some(ca.public_key())).unwrap();
        let eku = h1.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && eku.server_auth);
        let sans: Vec<String> = h1
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|g| match g {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(b) => {
                    let a: [u8; 4] = (*b).try_into().unwrap();
                    IpAddr::from(a).to_string()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sans, ["h1", "localhost", "127.0.0.1", "10.77.0.1"]);
        // About 30 days, not the CA's ten years.
        let left = h1.validity().not_after.timestamp() - now.timestamp();
        assert!((29 * 86400..=30 * 86400).contains(&left), "{left}");

        let root_der = pem_der(&dir.join("root.crt"));
        let (_, root) = parse_x509_certificate(&root_der).unwrap();
        assert_eq!(cn(&root), ROOT_CN);
        root.verify_signature(Some(ca.public_key())).unwrap();
        let eku = root.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);

        // The key matches its certificate.
        let key = KeyPair::from_pem(&std::fs::read_to_string(dir.join("h1.key")).unwrap()).unwrap();
        assert_eq!(
            key.public_key_raw(),
            h1.public_key().subject_public_key.data.as_ref()
        );
    }

    #[test]
    fn an_existing_ca_is_kept_unless_replaced_and_signs_hosts_added_later() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        issue(
            dir,
            &Request::new(&hosts(&["h1"]), &[], 5, Mode::New).unwrap(),
        )
        .unwrap();
        let ca_before = std::fs::read(dir.join("ca.crt")).unwrap();
        let h1_before = std::fs::read(dir.join("h1.crt")).unwrap();

        let e = issue(
            dir,
            &Request::new(&hosts(&["h2"]), &[], 5, Mode::New).unwrap(),
        );
        assert!(e.unwrap_err().to_string().contains("already holds a CA"));
        assert!(!dir.join("h2.crt").exists());

        // Adding a host: signed by the same CA, nothing else touched.
        let add = Request::new(&hosts(&["h2"]), &[], 5, Mode::Add).unwrap();
        let issued = issue(dir, &add).unwrap();
        assert!(!issued.new_ca);
        assert_eq!(issued.files.len(), 2, "{:?}", issued.files);
        assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), ca_before);
        assert_eq!(std::fs::read(dir.join("h1.crt")).unwrap(), h1_before);
        let ca_der = pem_der(&dir.join("ca.crt"));
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        let h2_der = pem_der(&dir.join("h2.crt"));
        let (_, h2) = parse_x509_certificate(&h2_der).unwrap();
        h2.verify_signature(Some(ca.public_key())).unwrap();
        assert_eq!(cn(&h2), "rebound-host-h2");

        // Adding a host that has its files: refused, nothing written.
        let again = Request::new(&hosts(&["h2"]), &[], 5, Mode::Add).unwrap();
        let e = issue(dir, &again).unwrap_err().to_string();
        assert!(e.contains("h2.crt exists already"), "{e}");
        let leftovers: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("tmp".as_ref()))
            .collect();
        assert!(leftovers.is_empty());

        // Replacing: a new CA, and h1 is no longer signed by it.
        issue(
            dir,
            &Request::new(&hosts(&["h3"]), &[], 5, Mode::Replace).unwrap(),
        )
        .unwrap();
        let ca_der = pem_der(&dir.join("ca.crt"));
        assert_ne!(std::fs::read(dir.join("ca.crt")).unwrap(), ca_before);
        let (_, ca) = parse_x509_certificate(&ca_der).unwrap();
        let h1_der = parse_x509_pem(&h1_before).unwrap().1.contents;
        let (_, h1) = parse_x509_certificate(&h1_der).unwrap();
        assert!(h1.verify_signature(Some(ca.public_key())).is_err());
    }

    #[test]
    fn adding_needs_a_ca_and_a_file_is_no_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let add = Request::new(&hosts(&["h1"]), &[], 5, Mode::Add).unwrap();
        let e = issue(tmp.path(), &add).unwrap_err().to_string();
        assert!(e.contains("no CA in"), "{e}");
        let f = tmp.path().join("file");
        std::fs::write(&f, "x").unwrap();
        let new = Request::new(&hosts(&["h1"]), &[], 5, Mode::New).unwrap();
        let e = issue(&f, &new).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
    }
}
