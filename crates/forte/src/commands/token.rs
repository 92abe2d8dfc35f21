//! `forte token`: a fresh bearer token for an edge site or for the core, printed as the
//! `[[token]]` entry the relay's tokens file takes (append it there, then reload the relay
//! with SIGHUP), and written, with `--out`, into the token file the edge or core reads.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use forte_relay::server::{new_token_entry, Principal};

use super::keygen::site_name;

#[derive(clap::Args)]
pub struct Args {
    /// An edge's token: it uploads for this site only [per run].
    #[arg(long, value_name = "SITE", value_parser = site_name, required_unless_present = "core")]
    edge: Option<String>,
    /// The core's token: it pulls these sites (repeatable; * for every site) [per run].
    #[arg(long, value_name = "SITE", conflicts_with = "edge")]
    core: Vec<String>,
    /// Also write the token into this file (mode 0600, never overwritten): the edge's or the
    /// core's --token-file (relay.token_file) [per run].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<bool> {
    let principal = match args.edge {
        Some(site) => Principal::Edge { site },
        None => {
            for site in args.core.iter().filter(|s| *s != "*") {
                site_name(site).map_err(anyhow::Error::msg)?;
            }
            Principal::Core { sites: args.core }
        }
    };
    let (token, entry) = new_token_entry(&principal)?;
    if let Some(path) = &args.out {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot create the token file {} (an existing one is never overwritten)",
                    path.display()
                )
            })?;
        writeln!(file, "{token}").with_context(|| format!("cannot write {}", path.display()))?;
        tracing::info!("token written to {} (mode 0600)", path.display());
    }
    println!(
        "# append to the relay's tokens file, then: systemctl reload forte-relay (or kill -HUP)"
    );
    print!("{entry}");
    Ok(true)
}
