//! `forte config check [FILE]`: is this configuration file valid, and what does each key
//! resolve to (the file's value, or the default)? `forte config reference` writes
//! docs/config.md. Both come from the flags' own `[config: …]` keys
//! (`forte_daemon::settings::reference`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use forte_daemon::settings::{flag_keys, reference, Config};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Validate a configuration file (every key known, every value accepted by its flag, the
    /// filter's rules and the log level) and print each key with the value it resolves to,
    /// from the file or the default. Exits 1, naming the key and the fix, when the file is
    /// not valid. Files it names (keys, tokens) are read when a command starts, not here.
    Check {
        /// The file [default: --config's, $FORTE_CONFIG's] [per run].
        file: Option<PathBuf>,
    },
    /// Print the reference of every key (docs/config.md) on stdout.
    Reference,
}

/// Keys no flag takes, described by hand (the typed sections of `settings::Config`).
pub const FILE_ONLY: &str = include_str!("config_file_only.md");

/// `cli` is the whole CLI (`Cli::command()`), handed over by main.rs; `file` the file
/// named by `--config`.
pub fn run(args: Args, cli: clap::Command, file: Option<PathBuf>) -> Result<bool> {
    match args.action {
        Action::Reference => {
            print!("{}", reference::markdown(&cli, FILE_ONLY));
            Ok(true)
        }
        Action::Check { file: given } => {
            let path = given
                .or(file)
                .context("no configuration file: give one (forte config check FILE) or --config")?;
            let config = Config::load(Some(&path), &flag_keys::claimed_keys(&cli))?;
            let cli = flag_keys::apply(cli, &config.file.values, &config.file.base)
                .with_context(|| format!("config file {} is not valid", path.display()))?;
            // Values whose checks need more than one key or than the flag's parser.
            forte_daemon::settings::filter(&Default::default(), &config.filter)
                .with_context(|| format!("config file {}: [filter]", path.display()))?;
            if let Some(level) = config.file.values.get("log.level").and_then(|v| v.as_str()) {
                forte_daemon::logging::parse(level)
                    .with_context(|| format!("config file {}: log.level", path.display()))?;
            }
            println!("config file {}: valid", path.display());
            print_resolved(&cli, &config);
            Ok(true)
        }
    }
}

/// Each key, by section, with its value and where it came from.
fn print_resolved(cli: &clap::Command, config: &Config) {
    let (keys, _) = reference::keys(cli);
    let mut section = None;
    for (key, doc) in keys {
        let (name, short) = key.split_once('.').unwrap_or(("", &key));
        if section.as_deref() != Some(name) {
            println!(
                "{}",
                if name.is_empty() {
                    "(top)".to_owned()
                } else {
                    format!("[{name}]")
                }
            );
            section = Some(name.to_owned());
        }
        // The flag's default after the file was applied: the file's value as the run takes
        // it (relative paths resolved), or the default.
        let from = match config.file.values.contains_key(&key) {
            true => "file",
            false => "default",
        };
        let value = match doc.default.as_slice() {
            [] => "(unset)".to_owned(),
            d => d.join(", "),
        };
        println!("  {short:<28} {value:<40} ({from})");
    }
}
