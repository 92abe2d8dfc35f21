use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use forte_relay::server::store::Location;
use forte_relay::server::{run as serve, RelayConfig};

use forte_daemon::settings::{self, Config, HttpFlags};

use forte_daemon::units::parse_duration;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on [config: relay_server.listen].
    #[arg(long, default_value = "127.0.0.1:8443")]
    listen: SocketAddr,
    /// Where stored objects, the relay's records and its self-signed certificate live: a
    /// directory, or an S3-compatible bucket, s3://BUCKET/PREFIX, with the endpoint and keys in
    /// [s3] of the configuration file or AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY and AWS_REGION. Relays serving one bucket share everything in it
    /// (put them behind one load balancer): they present one certificate, kept in the bucket.
    /// A part is written to disk as it arrives (in DIR, or for a bucket in $TMPDIR, before it
    /// is sent on): give $TMPDIR room for the parts in flight at once [config: relay_server.store].
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    store: String,
    /// Tokens file (TOML): one [[token]] per edge site and per core; see `forte relay --help` [config: relay_server.tokens].
    #[arg(long, value_name = "FILE")]
    tokens: PathBuf,
    /// TLS certificate chain (PEM); without it a self-signed pair is made in STORE/tls (in a
    /// bucket, STORE/tls/identity.pem) [config: relay_server.tls_cert].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) [config: relay_server.tls_key].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Host name or address for the self-signed certificate (repeatable) [config: relay_server.tls_names].
    #[arg(long = "tls-name", value_name = "NAME", default_values = ["localhost", "127.0.0.1"])]
    tls_names: Vec<String>,
    /// Most bytes one site may hold at the relay; uploads beyond get 507 until the core pulls
    /// (413 at once if nothing held is waiting for the core, so no pull can free space). A
    /// part is charged from its declared length before a byte of it is read [config: relay_server.quota_per_site].
    #[arg(long, value_parser = forte_daemon::units::parse_nonzero_size, value_name = "SIZE")]
    quota_per_site: Option<u64>,
    /// Delete uploads never sealed and unchanged for this long (abandoned by their edge);
    /// `off` keeps them forever [config: relay_server.expire_open_after].
    #[arg(long, value_parser = parse_expiry, value_name = "DURATION|off", default_value = "7d")]
    expire_open_after: Expiry,
    /// Let sites sending at once split the relay's ingress as TCP does, per connection,
    /// instead of holding each to a fair share (the default: a site with more uploads in
    /// flight would otherwise take more of a shared link). For sites on separate links whose
    /// rates are close, which the relay would treat as sharing one [config: relay_server.no_fair_shares].
    #[arg(long)]
    no_fair_shares: bool,
    /// On SIGTERM or SIGINT the relay stops taking connections and gives the requests in
    /// flight this long to finish, then ends with status 0 (a second signal ends it at once).
    /// SIGHUP reloads --tokens: a file that does not parse is refused and logged, the tokens
    /// in force stay [config: relay_server.shutdown_grace].
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", default_value = "30s")]
    shutdown_grace: std::time::Duration,
    /// Connections open at once; one more is closed as soon as it is accepted. The default
    /// holds under a limit of 1 024 descriptors (ulimit -n): keep it some 250 below it [config: relay_server.max_connections].
    #[arg(long, default_value_t = 768, value_name = "N", value_parser = forte_daemon::units::parse_count)]
    max_connections: usize,
    /// Connections open at once from one address: a sender's uploads (up to 64) and its requests beside them; raise it for sites behind one NAT [config: relay_server.max_connections_per_address].
    #[arg(long, default_value_t = 96, value_name = "N", value_parser = forte_daemon::units::parse_count)]
    pub(crate) max_connections_per_address: usize,
    /// How long a TLS handshake may take [config: relay_server.handshake_timeout].
    #[arg(long, value_parser = forte_daemon::units::parse_period, value_name = "DURATION", default_value = "10s")]
    handshake_timeout: std::time::Duration,
    /// How long a connection may wait to send a request's headers (its first, or its next
    /// on a kept-alive connection) before it is closed [config: relay_server.idle_timeout].
    #[arg(long, value_parser = forte_daemon::units::parse_period, value_name = "DURATION", default_value = "30s")]
    idle_timeout: std::time::Duration,
    /// Memory that request bodies held whole (seals, inventories, acknowledgements: JSON
    /// while it is parsed) may take, all requests together, taken as their bytes arrive; one
    /// token's at most 400 MiB. A body that finds no room waits up to 30 s, then is told to
    /// retry (503). Part bodies are written to disk as they arrive and take none of it [config: relay_server.body_memory].
    #[arg(long, value_parser = forte_daemon::units::parse_nonzero_size, value_name = "SIZE", default_value = "512MiB")]
    body_memory: u64,
    #[command(flatten)]
    http: HttpFlags,
}

/// How long abandoned uploads are kept.
#[derive(Clone, Copy)]
struct Expiry(Option<std::time::Duration>);

fn parse_expiry(text: &str) -> Result<Expiry, String> {
    if text == "off" {
        return Ok(Expiry(None));
    }
    forte_daemon::units::parse_period(text).map(|d| Expiry(Some(d)))
}

pub fn run(args: Args, config: &Config) -> Result<bool> {
    if let Some(http) = settings::http(&args.http, config, None)? {
        let view = forte_view::View {
            server: forte_view::Server::Relay,
            catalogs: vec![],
            live: Some(forte_daemon::monitor::relay_view(
                Location::parse(&args.store, settings::s3(config)),
                args.quota_per_site,
                !args.no_fair_shares,
            )),
            progress: forte_view::model::Progress::new(
                settings::part_size(config),
                forte_view::model::Order::LeastRemaining,
            ),
        };
        let bound = forte_view::start(http.addr, http.access, view)?;
        tracing::info!("dashboard: http://{bound}/  metrics: http://{bound}/metrics");
    }
    serve(RelayConfig {
        listen: args.listen,
        store: Location::parse(&args.store, settings::s3(config)),
        tokens: args.tokens,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_names: args.tls_names,
        quota_per_site: args.quota_per_site,
        expire_open_after: args.expire_open_after.0,
        fair_shares: !args.no_fair_shares,
        shutdown_grace: args.shutdown_grace,
        connections: forte_relay::server::connections::Limits {
            total: args.max_connections,
            per_address: args.max_connections_per_address,
            handshake: args.handshake_timeout,
            idle: args.idle_timeout,
        },
        body_memory: args.body_memory,
    })?;
    Ok(true)
}
