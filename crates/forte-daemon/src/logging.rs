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

/// Whether the log is JSON lines, for what must be written without `tracing` (from a signal
/// handler).
pub fn is_json() -> bool {
    JSON.get().copied().unwrap_or(false)
}

static JSON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Starts the log. sqlx's own lines repeat what the catalogue's errors say better, so they
/// are off unless the filter names sqlx.
pub fn init(filter: &str, format: LogFormat) -> Result<()> {
    let filter = parse(filter)?;
    let _ = JSON.set(format == LogFormat::Json);
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Text => {
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            builder
                .with_ansi(ansi)
                .with_writer(move || Escaping { ansi })
                .init()
        }
        LogFormat::Json => builder
            .json()
            .flatten_event(false)
            .with_writer(std::io::stderr)
            .init(),
    }
    Ok(())
}

/// A level or filter as the log takes it, or what is wrong with it.
pub fn parse(filter: &str) -> Result<tracing_subscriber::EnvFilter> {
    // One bare word is a level: tracing would take "verbose" as a target and log nothing.
    let levels = ["off", "error", "warn", "info", "debug", "trace"];
    let one_word = !filter.contains(['=', ',', ':', '[']);
    if one_word && !levels.contains(&filter.trim().to_ascii_lowercase().as_str()) {
        anyhow::bail!("log level {filter:?} is not a level: give error, warn, info, debug, trace or a filter such as info,forte_core=debug");
    }
    let mut directives = filter.to_owned();
    if !filter.contains("sqlx") {
        directives.push_str(",sqlx=off");
    }
    tracing_subscriber::EnvFilter::try_new(&directives).map_err(|e| {
        anyhow!("log level {filter:?} is not valid ({e}): give error, warn, info, debug, trace or a filter such as info,forte_core=debug")
    })
}

/// Standard error for text logs, one event per write: what is logged may come from others
/// (a batch's directory name, a relay's error text), so a line break inside an event, a
/// carriage return or an escape sequence other than the colours forte writes is shown
/// escaped, never obeyed: no one can forge a log line or drive the terminal through a log.
struct Escaping {
    ansi: bool,
}

impl std::io::Write for Escaping {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = escape_event(&String::from_utf8_lossy(buf), self.ansi);
        std::io::Write::write_all(&mut std::io::stderr().lock(), text.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut std::io::stderr())
    }
}

/// `event` (one formatted log event) with every control character escaped but its final line
/// break and, with `ansi`, colour sequences (`ESC [ digits ; m`).
fn escape_event(event: &str, ansi: bool) -> String {
    let body = event.strip_suffix('\n').unwrap_or(event);
    let mut out = String::with_capacity(event.len());
    for (at, c) in body.char_indices() {
        match c {
            '\u{1b}' if ansi && is_colour(&body[at..]) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    if body.len() < event.len() {
        out.push('\n');
    }
    out
}

/// Whether `text` starts with a colour sequence: ESC [ digits and semicolons, then m.
fn is_colour(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("\u{1b}[") else {
        return false;
    };
    let params = rest.find(|c: char| !c.is_ascii_digit() && c != ';');
    params.is_some_and(|end| rest[end..].starts_with('m'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_peoples_text_cannot_forge_a_line_or_drive_the_terminal() {
        let forged =
            "batch evil\n2026-01-01T00:00:00Z  INFO forged\u{1b}]0;owned\u{7}\u{1b}[2K\r!\n";
        let shown = escape_event(forged, true);
        assert_eq!(shown.matches('\n').count(), 1, "{shown}");
        assert!(
            shown.ends_with("!\n") && !shown.contains('\u{1b}') && !shown.contains('\r'),
            "{shown:?}"
        );
        assert!(
            shown.contains("\\n2026") && shown.contains("\\u{1b}]0;owned"),
            "{shown}"
        );
        let coloured = "\u{1b}[32m INFO\u{1b}[0m sent\n";
        assert_eq!(escape_event(coloured, true), coloured);
        assert!(!escape_event(coloured, false).contains('\u{1b}'));
    }

    #[test]
    fn the_flag_wins_then_the_file_then_info() {
        // The environment of the test run may set FORTE_LOG or RUST_LOG: only the cases
        // that do not depend on it are asserted here (the integration tests set it).
        assert_eq!(filter(Some("debug"), Some("error")), "debug");
        assert!(parse("verbose").is_err() && parse("info,forte_core=debug").is_ok());
        if std::env::var_os("FORTE_LOG").is_none() && std::env::var_os("RUST_LOG").is_none() {
            assert_eq!(filter(None, Some("error")), "error");
            assert_eq!(filter(None, None), "info");
        }
    }
}
