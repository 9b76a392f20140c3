//! `rebound cluster certs` and `rebound cluster store-init`: the hosts' and the
//! operator's identities in the cluster store, and what each may write there
//! ([`rebound_cluster::certs`], [`rebound_store::access`]).

use std::net::IpAddr;
use std::path::PathBuf;

use clap::Args;
use rebound_cluster::certs::{self, Mode, Request};
use rebound_store::access::{self, TlsFiles};

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// The hosts, comma-separated: each gets `<host>.crt`/`<host>.key` (CN
    /// `rebound-host-<host>`, for a daemon and for an etcd member on that host).
    #[arg(long, value_delimiter = ',', required = true)]
    pub hosts: Vec<String>,
    /// The directory to write (created mode 700); it also gets `ca.crt`/`ca.key` and
    /// the operator's `root.crt`/`root.key`.
    #[arg(long)]
    pub out: PathBuf,
    /// Days the host and operator certificates are valid.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// More addresses a host's certificate is valid for (its etcd member's address),
    /// as HOST=IP, comma-separated or repeated.
    #[arg(long, value_delimiter = ',', value_parser = parse_ip_san)]
    pub ip_sans: Vec<(String, IpAddr)>,
    /// Replace the CA in --out (certificates it signed stop working).
    #[arg(long, conflicts_with = "add")]
    pub force: bool,
    /// Sign the hosts with the CA already in --out (hosts added later).
    #[arg(long)]
    pub add: bool,
}

fn parse_ip_san(s: &str) -> Result<(String, IpAddr), String> {
    certs::parse_ip_san(s).map_err(|e| e.to_string())
}

#[derive(Args, Debug)]
pub struct StoreInitArgs {
    /// etcd's client URLs, comma-separated (https://host:port).
    #[arg(long, value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// The CA that signed the etcd members' certificates.
    #[arg(long)]
    pub ca: PathBuf,
    /// The operator's certificate (CN `root`, from `rebound cluster certs`).
    #[arg(long)]
    pub cert: PathBuf,
    #[arg(long)]
    pub key: PathBuf,
    /// The hosts to give a user and role, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub hosts: Vec<String>,
}

pub fn certs(a: CertsArgs) -> anyhow::Result<()> {
    let mode = match (a.force, a.add) {
        (true, _) => Mode::Replace,
        (_, true) => Mode::Add,
        _ => Mode::New,
    };
    let req = Request::new(&a.hosts, &a.ip_sans, a.days, mode)?;
    let issued = certs::issue(&a.out, &req)?;
    let ca = if issued.new_ca { "a new CA" } else { "its CA" };
    println!(
        "wrote {} files to {} with {ca}:",
        issued.files.len(),
        a.out.display()
    );
    for f in &issued.files {
        println!("  {}", f.display());
    }
    Ok(())
}

pub async fn store_init(a: StoreInitArgs) -> anyhow::Result<()> {
    let tls = TlsFiles {
        ca: a.ca,
        cert: a.cert,
        key: a.key,
    };
    let mut client = access::connect(&a.etcd, &tls).await?;
    access::store_init(&mut client, &a.hosts).await?;
    println!(
        "etcd authentication on; users and roles for root and {} hosts ({})",
        a.hosts.len(),
        a.hosts.join(",")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    /// A host's certificate logs it in as the user the store's roles are made for.
    #[test]
    fn certificate_names_are_the_stores_user_names() {
        for h in ["h1", "a", "host-22"] {
            assert_eq!(
                rebound_cluster::certs::host_cn(h),
                rebound_store::access::host_user(h)
            );
        }
        for h in [
            "h1",
            "",
            "H",
            "a-",
            "-a",
            "a_b",
            &"x".repeat(63),
            &"x".repeat(64),
        ] {
            assert_eq!(
                rebound_cluster::certs::valid_host(h),
                rebound_store::access::valid_host(h),
                "{h}"
            );
        }
        assert_eq!(rebound_cluster::certs::ROOT_CN, rebound_store::access::ROOT);
    }
}
