use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use forte_relay::server::{run as serve, RelayConfig};

use crate::units::parse_size;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// Directory for stored objects, the relay's records and its self-signed certificate.
    #[arg(long, value_name = "DIR")]
    store: PathBuf,
    /// Tokens file (TOML): one [[token]] per edge site and per core; see `forte relay --help`.
    #[arg(long, value_name = "FILE")]
    tokens: PathBuf,
    /// TLS certificate chain (PEM); without it a self-signed pair is made in STORE/tls.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Host name or address for the self-signed certificate (repeatable).
    #[arg(long = "tls-name", value_name = "NAME", default_values = ["localhost", "127.0.0.1"])]
    tls_names: Vec<String>,
    /// Most bytes one site may hold at the relay; uploads beyond get 507 until the core pulls.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    quota_per_site: Option<u64>,
}

pub fn run(args: Args) -> Result<bool> {
    serve(RelayConfig {
        listen: args.listen,
        store: args.store,
        tokens: args.tokens,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_names: args.tls_names,
        quota_per_site: args.quota_per_site,
    })?;
    Ok(true)
}
