//! `forte`: one binary for the whole path, edge → relay → core. See ARCHITECTURE.md.

mod commands;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};
use forte_daemon::{record, settings};

#[derive(Parser)]
#[command(name = "forte", version, about, long_about = None)]
struct Cli {
    /// Configuration file (TOML); flags override its values.
    #[arg(long, global = true, env = "FORTE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Catalogue: a SQLite file, or postgres://user:pass@host/db [default: ~/.local/state/forte/catalog.sqlite].
    #[arg(long, global = true, env = "FORTE_CATALOG", value_name = "URL")]
    catalog: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the core's age key pair, the edge's Ed25519 signing key pair and the core's
    /// receipt-signing key pair.
    Keygen(commands::keygen::Args),
    /// Prepare a file or directory tree into encrypted, signed objects in one pass.
    Pack(commands::pack::Args),
    /// Verify, decrypt and restore packed objects; all or nothing.
    Unpack(commands::unpack::Args),
    /// Serve the relay: an HTTPS store of ciphertext between edges and the core.
    Relay(commands::relay::Args),
    /// What a relay's store holds per site and batch; cancel a batch there.
    RelayStore(commands::relay_store::Args),
    /// Prepare every ready batch of an inbox in one pass and upload it to the relay.
    Send(commands::send::Args),
    /// Download whole batches from the relay; verify, deliver atomically, acknowledge.
    Pull(commands::pull::Args),
    /// Batches and files in the catalogue with their state; a file's lineage with --file.
    Status(commands::status::Args),
    /// The core's custody receipts in the catalogue (or given as files), verified with its
    /// receipt key; printed or exported as JSON.
    Receipts(commands::receipts::Args),
    /// The pipeline's KPIs: batch latency (queueing and processing per task), R_b, R_P,
    /// daily capacity; a timeline and utilisation charts.
    Report(commands::report::Args),
    /// Serve the web dashboard and the JSON API over catalogues (the daemons serve theirs
    /// with --http).
    Dashboard(commands::dashboard::Args),
    /// Capture row streams from sensors into Parquet files (BYTE_STREAM_SPLIT + zstd) that
    /// become batches for `send`.
    Ingest(commands::ingest::Args),
    /// Measure on your own data (compress: every zstd level's speed, ratio and end-to-end rate
    /// over your link, and the level to use).
    Bench(commands::bench::Args),
    /// Generate sample data, then keygen, pack, unpack and verify it, saying what happens.
    Demo(commands::demo::Args),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(commands::completions::Args),
    /// Write the manual pages (forte.1, forte-SUB.1) into a directory.
    #[command(hide = true)]
    Man(commands::man::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The commands that only print what they read (not `relay-store`, which may delete).
    let only_prints = matches!(
        cli.command,
        Command::Status(_) | Command::Report(_) | Command::Receipts(_)
    );
    if only_prints {
        // Like other Unix tools, end quietly when the reader of our output goes away
        // (`forte status | head`, `forte receipts --json | head`). Only here: a relay or a transfer must never die because
        // whoever read its log went away.
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // Structured log lines on stderr; FORTE_LOG sets the level or filter (default: info).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FORTE_LOG")
                // sqlx logs what the catalogue's own errors say better, once (FORTE_LOG shows it).
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=off")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result =
        settings::Config::load(cli.config.as_deref()).and_then(|config| match cli.command {
            Command::Keygen(args) => commands::keygen::run(args),
            Command::Pack(args) => commands::pack::run(args, &config),
            Command::Unpack(args) => commands::unpack::run(args, &config),
            Command::Relay(args) => commands::relay::run(args, &config),
            Command::RelayStore(args) => commands::relay_store::run(args, &config),
            Command::Send(args) => commands::send::run(args, &config, &record::open(cli.catalog)?),
            Command::Pull(args) => commands::pull::run(args, &config, &record::open(cli.catalog)?),
            Command::Status(args) => commands::status::run(args, &record::open(cli.catalog)?),
            Command::Receipts(args) => {
                commands::receipts::run(args, &config, || record::open(cli.catalog))
            }
            Command::Report(args) => commands::report::run(args, &record::open(cli.catalog)?),
            Command::Dashboard(args) => {
                commands::dashboard::run(args, &config, &record::open(cli.catalog)?)
            }
            Command::Ingest(args) => commands::ingest::run(args, &config),
            Command::Bench(args) => commands::bench::run(args),
            Command::Demo(args) => commands::demo::run(args),
            Command::Completions(args) => commands::completions::run(args, Cli::command()),
            Command::Man(args) => commands::man::run(args, Cli::command()),
        });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
