//! `forte dashboard`: the web dashboard and the JSON API (docs/api.md) over one or more
//! catalogues, for a node whose daemons run without `--http`, or for the whole path at once
//! (the edge's catalogue and the core's, or one shared PostgreSQL catalogue).

use std::net::SocketAddr;

use anyhow::Result;

use forte_daemon::record::{self, Catalog};
use forte_daemon::settings::{self, Config, HttpFlags};

#[derive(clap::Args)]
#[command(
    after_help = "Open the address it prints in a browser: batches in flight with \
progress, rate and ETA; failures and alerts; history with search; each batch's files and \
timeline; each file's lineage; the report's KPIs and charts. Every page reads without \
JavaScript. Programs read the same over the JSON API under /api/v1 (docs/api.md). Without \
--http-token-file only this machine is served."
)]
pub struct Args {
    /// Further catalogues to show (repeatable): with separate SQLite files per node, the
    /// edge's as --catalog and the core's here. One shared PostgreSQL catalogue needs none [config: dashboard.with].
    #[arg(long = "with", value_name = "URL")]
    with: Vec<String>,
    #[command(flatten)]
    http: HttpFlags,
}

/// Where the dashboard listens unless told otherwise.
const DEFAULT_ADDR: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8080);

pub fn run(args: Args, config: &Config, catalog: &Catalog) -> Result<bool> {
    let http = settings::http(&args.http, config, Some(DEFAULT_ADDR))?.expect("a default address");
    let mut catalogs = vec![catalog.reader()];
    for url in &args.with {
        catalogs.push(record::open(Some(url.clone()), record::Use::Read)?.reader());
    }
    let shown: Vec<String> = catalogs.iter().map(|c| c.url().to_owned()).collect();
    let view = forte_view::View {
        server: forte_view::Server::Dashboard,
        catalogs,
        live: None,
        progress: forte_view::model::Progress::new(
            settings::part_size(config),
            settings::policy(&Default::default(), config)?.eta_order(),
        ),
    };
    let bound = forte_view::start(http.addr, http.access, view)?;
    println!("dashboard: http://{bound}/ over {}", shown.join(", "));
    // It only reads: nothing to finish or record on a stop.
    forte_daemon::signals::install("nothing: the dashboard only reads");
    forte_daemon::signals::wait_for_stop(std::time::Duration::from_millis(100));
    tracing::info!("dashboard stopped ({})", forte_daemon::signals::which());
    Ok(true)
}
