//! One module per subcommand. Each `run` returns `Ok(true)` on full success, `Ok(false)` when
//! it finished but some items failed (already reported), and `Err` when it could not run.

pub mod bench;
pub mod dashboard;
pub mod demo;
pub mod ingest;
pub mod keygen;
pub mod pack;
pub mod pull;
pub mod receipts;
pub mod relay;
pub mod relay_store;
pub mod report;
pub mod send;
pub mod status;
pub mod unpack;

/// Output flags shared by the long-running commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Output {
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Running as a daemon, and telling people about failures; shared by `send` and `pull`.
#[derive(clap::Args, Debug, Clone)]
pub struct Daemon {
    /// Keep running: handle batches as they become ready, retrying network failures forever.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between looks for new work with --watch.
    #[arg(long, default_value_t = 10, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub interval: u64,
    /// With --watch, SIGTERM or SIGINT stops taking new batches and lets those under way
    /// finish for this long, then ends with status 0 (a second signal ends it at once).
    #[arg(long, value_parser = forte_daemon::units::parse_duration, value_name = "DURATION", default_value = "60s")]
    pub shutdown_grace: std::time::Duration,
    /// Command run (sh -c) when a file or batch fails; FORTE_ROLE, FORTE_BATCH, FORTE_FILE
    /// and FORTE_ERROR describe the failure.
    #[arg(long, value_name = "CMD")]
    pub on_failure: Option<String>,
    #[command(flatten)]
    pub http: forte_daemon::settings::HttpFlags,
}
