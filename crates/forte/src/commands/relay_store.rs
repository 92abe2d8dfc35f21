//! `forte relay-store`: what a relay's store holds, per site and batch, and cancelling a batch
//! there. Run on the relay host; access to the store directory is the authority (the edge
//! cancels its own batches over the network with `forte send --cancel`).

use anyhow::Result;
use forte_relay::server::store::{Location, Store};

use super::Output;
use forte_catalog::format_utc;
use forte_daemon::settings::{self, Config};
use forte_daemon::units::human;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// List what the store holds per site and batch: sealed batches waiting for the core,
    /// objects of batches still being sent, and uploads not sealed yet.
    List {
        /// The relay's store, as given to `forte relay --store`: a directory or a bucket
        /// [config: relay_server.store].
        #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
        store: String,
        #[command(flatten)]
        output: Output,
    },
    /// Delete every object sealed into one batch of one site, and the batch's seal: the core
    /// never gets it. A running relay counts the freed space against its quota again only
    /// from its next start. Objects not sealed yet carry no batch; the edge cancels those
    /// (`forte send INBOX --cancel NAME`), or they expire (`forte relay --expire-open-after`).
    Cancel {
        /// The relay's store: a directory or a bucket [config: relay_server.store].
        #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
        store: String,
        /// The site, as in the tokens file [per run].
        #[arg(long)]
        site: String,
        /// The batch's id at the relay, as `forte relay-store list` prints it [per run].
        #[arg(long)]
        batch: String,
    },
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    let at = |store: &str| Location::parse(store, settings::s3(config));
    match args.action {
        Action::List { store, output } => {
            let holdings = Store::inspect(at(&store))?
                .holdings()
                .map_err(|e| anyhow::anyhow!("cannot list {store}: {e:?}"))?;
            if output.json {
                println!("{}", serde_json::to_string_pretty(&holdings)?);
            } else if holdings.is_empty() {
                println!("{store} holds nothing");
            }
            for h in holdings.iter().filter(|_| !output.json) {
                let what = match (&h.batch, h.batch_sealed) {
                    (Some(b), true) => format!("batch {b} (sealed, waiting for the core)"),
                    (Some(b), false) => format!("batch {b} (being sent)"),
                    (None, _) => "uploads not sealed yet".to_string(),
                };
                println!(
                    "site {}: {what}: {} objects, {}, last change {}",
                    h.site,
                    h.objects,
                    human(h.bytes),
                    format_utc(h.newest as i64 * 1_000_000)
                );
            }
            Ok(true)
        }
        Action::Cancel { store, site, batch } => {
            anyhow::ensure!(
                forte_relay::api::valid_site(&site) && forte_relay::api::valid_batch(&batch),
                "site {site:?} or batch {batch:?} is not a valid name (see `forte relay-store list`)"
            );
            let (objects, bytes) = Store::inspect(at(&store))?
                .cancel_sealed(&site, &batch)
                .map_err(|e| {
                    anyhow::anyhow!("cannot cancel batch {batch} of site {site}: {e:?}")
                })?;
            println!(
                "batch {batch} of site {site}: cancelled; {objects} objects ({}) deleted",
                human(bytes)
            );
            Ok(true)
        }
    }
}
