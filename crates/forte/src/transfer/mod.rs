//! Moving objects over the network: connecting to the relay, retrying, uploading (send) and
//! downloading (pull).

pub mod download;
pub mod retry;
pub mod upload;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use forte_relay::client::{RelayClient, RelayEndpoint};
use forte_relay::tls::RelayTrust;

use crate::config::Config;

/// Flags that say where the relay is and how to trust it; shared by `send` and `pull`.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayArgs {
    /// Relay URL, e.g. https://relay.example:8443 [config: relay.url].
    #[arg(long, value_name = "URL")]
    pub relay: Option<String>,
    /// File holding this node's bearer token [config: relay.token_file] [env: FORTE_TOKEN for the token itself].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// SHA-256 fingerprint of the relay's certificate, as `forte relay` prints it [config: relay.fingerprint].
    #[arg(long, value_name = "HEX")]
    pub relay_fingerprint: Option<String>,
    /// CA certificate (PEM) the relay's certificate chains to, instead of a fingerprint [config: relay.ca].
    #[arg(long, value_name = "FILE")]
    pub relay_ca: Option<PathBuf>,
    /// Seconds a request to the relay may take before it is abandoned and retried: how long a
    /// stalled link goes unnoticed. A whole part must cross the link within it.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub timeout: u64,
}

impl RelayArgs {
    pub fn endpoint(&self, config: &Config) -> Result<RelayEndpoint> {
        let c = &config.relay;
        let url = self.relay.clone().or(c.url.clone()).context(
            "no relay: pass --relay https://HOST:PORT or set relay.url in the config file",
        )?;
        let token = match (self.token_file.clone().or(c.token_file.clone()), std::env::var("FORTE_TOKEN")) {
            (Some(path), _) => std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read token file {}", path.display()))?
                .trim()
                .to_string(),
            (None, Ok(token)) => token,
            (None, Err(_)) => bail!(
                "no token: pass --token-file FILE, set relay.token_file in the config file, or set FORTE_TOKEN"
            ),
        };
        let trust = match (
            self.relay_fingerprint.clone().or(c.fingerprint.clone()),
            self.relay_ca.clone().or(c.ca.clone()),
        ) {
            (Some(fp), None) => RelayTrust::Fingerprint(fp),
            (None, Some(ca)) => RelayTrust::CaFile(ca),
            (Some(_), Some(_)) => bail!("give --relay-fingerprint or --relay-ca, not both"),
            (None, None) => bail!(
                "no way to trust the relay: pass --relay-fingerprint (printed by `forte relay`) or --relay-ca FILE"
            ),
        };
        Ok(RelayEndpoint { url, token, trust })
    }
}

/// A client whose requests are abandoned (and retried) after `--timeout` seconds.
pub fn connect(endpoint: &RelayEndpoint, args: &RelayArgs) -> Result<RelayClient> {
    RelayClient::new(endpoint, Duration::from_secs(args.timeout.max(1)))
}
