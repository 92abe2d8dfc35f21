//! The log: events on standard error, in one format per run (text for people, JSON lines for
//! journald's or a collector's parsers), at the level the operator chose. Standard output
//! is the command's result only.
//!
//! Which level applies, first found: `--log-level` on the command line, `FORTE_LOG`,
//! `RUST_LOG`, `log.level` in the configuration file, `info`. Each is a level (`error`,
//! `warn`, `info`, `debug`, `trace`) or a filter such as `info,forte_core=debug`.

use anyhow::{anyhow, Result};

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    /// One line per event for people: time, level, where, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`.
    Json,
}

/// The level or filter in force: `flag` if given on the command line, else the environment,
/// else `file` (the configuration file's), else info.
pub fn filter(flag: Option<&str>, file: Option<&str>) -> String {
    let from_env = || {
        ["FORTE_LOG", "RUST_LOG"]
            .into_iter()
            .filter_map(|name| std::env::var(name).ok())
            .find(|v| !v.trim().is_empty())
    };
    flag.map(str::to_owned)
        .or_else(from_env)
        .or_else(|| file.map(str::to_owned))
        .unwrap_or_else(|| "info".to_owned())
}

/// Starts the log. sqlx's own lines repeat what the catalogue's errors say better, so they
/// are off unless the filter names sqlx.
pub fn init(filter: &str, format: LogFormat) -> Result<()> {
    let mut directives = filter.to_owned();
    if !filter.contains("sqlx") {
        directives.push_str(",sqlx=off");
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&directives).map_err(|e| {
        anyhow!("log level {filter:?} is not valid ({e}): give error, warn, info, debug, trace or a filter such as info,forte_core=debug")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder.json().flatten_event(false).init(),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_then_the_file_then_info() {
        // The environment of the test run may set FORTE_LOG or RUST_LOG: only the cases
        // that do not depend on it are asserted here (the integration tests set it).
        assert_eq!(filter(Some("debug"), Some("error")), "debug");
        if std::env::var_os("FORTE_LOG").is_none() && std::env::var_os("RUST_LOG").is_none() {
            assert_eq!(filter(None, Some("error")), "error");
            assert_eq!(filter(None, None), "info");
        }
    }
}
