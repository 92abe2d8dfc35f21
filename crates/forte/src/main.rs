//! `forte`: one binary for the whole path, edge → relay → core. See ARCHITECTURE.md.

mod commands;

// musl's own malloc is slow under forte's threads (the static x86-64 build packed 1.19x slower
// than the glibc one; with mimalloc 1.01x, docs/benchmarks.md): the musl builds use mimalloc.
#[cfg(target_env = "musl")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use forte_daemon::logging::{self, LogFormat};
use forte_daemon::record::{self, Use};
use forte_daemon::settings;

#[derive(Parser)]
#[command(name = "forte", version, about, long_about = None)]
struct Cli {
    /// Configuration file (TOML): it gives every flag's default (each flag's help names its
    /// key), and flags given override it; docs/config.md lists every key [per run].
    #[arg(long, global = true, env = "FORTE_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Catalogue: a SQLite file, or postgres://user:pass@host/db [config: catalog]
    /// [default: ~/.local/state/forte/edge.sqlite for send, core.sqlite for pull; status,
    /// report, receipts and dashboard read the one there, and never make one].
    #[arg(long, global = true, env = "FORTE_CATALOG", value_name = "URL")]
    catalog: Option<String>,
    /// Log level or filter on standard error: error, warn, info, debug, trace, or e.g.
    /// info,forte_core=debug [config: log.level] [default: $FORTE_LOG, else $RUST_LOG, else
    /// info].
    #[arg(long, global = true, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Log format on standard error: text, or json (one object per line, for journald or a
    /// collector) [config: log.format].
    #[arg(long, global = true, value_enum, default_value_t)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the key pairs of a role: --core (age and receipt keys), --edge SITE (a signing
    /// key); without either, every pair, for a trial on one machine.
    Keygen(commands::keygen::Args),
    /// Make a bearer token for an edge site or the core, printed as its tokens.toml entry.
    Token(commands::token::Args),
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
    /// Generate sample recordings and run the whole path on them, offline then through a
    /// relay on loopback, printing every command as you would type it.
    Demo(commands::demo::Args),
    /// Check a configuration file and print the settings it resolves to (`config check`);
    /// every key is in docs/config.md (`config reference` writes it).
    Config(commands::config::Args),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(commands::completions::Args),
    /// Write the manual pages (forte.1, forte-SUB.1) into a directory.
    #[command(hide = true)]
    Man(commands::man::Args),
}

fn main() -> ExitCode {
    let (cli, config) = match parse() {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // The commands that only print what they read (not `relay-store`, which may delete).
    let only_prints = matches!(
        cli.command,
        Command::Status(_) | Command::Report(_) | Command::Receipts(_) | Command::Config(_)
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
    let json_log = cli.log_format == LogFormat::Json;
    match run(cli, &config) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) if json_log => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The command line over the configuration file's values (each flag's default is the file's
/// value of its key, `settings::flag_keys`), and the log started as they say.
fn parse() -> anyhow::Result<(Cli, settings::Config)> {
    let command = Cli::command();
    let path = config_path();
    let claimed = settings::flag_keys::claimed_keys(&command);
    let config = settings::Config::load(path.as_deref(), &claimed)?;
    let command = settings::flag_keys::apply(command, &config.file.values, &config.file.base)
        .map_err(|e| {
            let file = path
                .as_deref()
                .unwrap_or(std::path::Path::new(""))
                .display();
            anyhow::anyhow!("config file {file} is not valid: {e:#}")
        })?;
    let matches = command.get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let from_command_line = matches.value_source("log_level") == Some(ValueSource::CommandLine);
    let flag = cli.log_level.as_deref().filter(|_| from_command_line);
    let file = cli.log_level.as_deref().filter(|_| !from_command_line);
    logging::init(&logging::filter(flag, file), cli.log_format)?;
    Ok((cli, config))
}

/// The configuration file named by `--config FILE`, `--config=FILE` or `$FORTE_CONFIG`, found
/// before the command line is parsed (its values are the flags' defaults).
fn config_path() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.to_str().and_then(|a| a.strip_prefix("--config=")) {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("FORTE_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn run(cli: Cli, config: &settings::Config) -> anyhow::Result<bool> {
    let catalog = cli.catalog;
    match cli.command {
        Command::Keygen(args) => commands::keygen::run(args),
        Command::Token(args) => commands::token::run(args),
        Command::Pack(args) => commands::pack::run(args, config),
        Command::Unpack(args) => commands::unpack::run(args, config),
        Command::Relay(args) => commands::relay::run(args, config),
        Command::RelayStore(args) => commands::relay_store::run(args, config),
        Command::Send(args) => commands::send::run(args, config, catalog),
        Command::Pull(args) => {
            commands::pull::run(args, config, || record::open(catalog, Use::Core))
        }
        Command::Status(args) => commands::status::run(args, &record::open(catalog, Use::Read)?),
        Command::Receipts(args) => {
            commands::receipts::run(args, config, || record::open(catalog, Use::Read))
        }
        Command::Report(args) => commands::report::run(args, &record::open(catalog, Use::Read)?),
        Command::Dashboard(args) => {
            commands::dashboard::run(args, config, &record::open(catalog, Use::Read)?)
        }
        Command::Ingest(args) => commands::ingest::run(args, config),
        Command::Bench(args) => commands::bench::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Config(args) => commands::config::run(args, Cli::command(), config_path()),
        Command::Completions(args) => commands::completions::run(args, Cli::command()),
        Command::Man(args) => commands::man::run(args, Cli::command()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag has a key in the configuration file or says why not (`[per run]`), and
    /// docs/config.md is what the flags say.
    #[test]
    fn every_flag_has_a_key_and_docs_config_md_is_current() {
        let cli = Cli::command();
        let unkeyed = settings::reference::unkeyed(&cli);
        assert!(
            unkeyed.is_empty(),
            "flags with neither [config: KEY] nor [per run] in their help: {unkeyed:#?}"
        );
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
        let written = std::fs::read_to_string(path).unwrap_or_default();
        let current = settings::reference::markdown(&cli, commands::config::FILE_ONLY);
        assert!(written == current, "docs/config.md is not current: run `cargo run -p forte -- config reference > docs/config.md`");
    }

    /// A sender's most uploads in flight and a request beside them fit under the relay's
    /// default cap per address: at 64 each, a sender on a 600 ms link had connections closed
    /// at once ("64 connections open from 10.77.0.1").
    #[test]
    fn the_relay_holds_a_senders_most_uploads_and_its_requests() {
        let cli = Cli::try_parse_from(["forte", "relay", "--store", "s", "--tokens", "t"])
            .expect("relay with its defaults");
        let Command::Relay(args) = cli.command else {
            panic!("not the relay command")
        };
        let per_address = args.max_connections_per_address;
        assert!(
            per_address > forte_daemon::settings::MAX_UPLOADS + 8,
            "{per_address} per address"
        );
    }
}
