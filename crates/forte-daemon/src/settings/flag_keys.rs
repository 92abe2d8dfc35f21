//! Every flag's key in the configuration file, written once: in the flag's help, as
//! `[config: SECTION.KEY]` (`[config: KEY]` at the top of the file). The file's value becomes
//! the flag's default before the command line is parsed, so a flag given overrides it and
//! both go through the flag's own parser; `reference` writes docs/config.md from the same
//! annotations, and a test refuses a flag that has none. A flag that only makes sense for
//! one run (an action such as `--cancel`, an output choice such as `--json`) says `[per run]`
//! instead.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use clap::{Arg, ArgAction, Command, ValueHint};

/// The annotation that ties a flag to its key.
const KEY_MARK: &str = "[config: ";
/// The annotation of a flag that has no key, on purpose.
pub const PER_RUN_MARK: &str = "[per run]";

/// A flag's key in the configuration file, read from its help.
pub fn config_key(arg: &Arg) -> Option<String> {
    let help = help_text(arg);
    let start = help.find(KEY_MARK)? + KEY_MARK.len();
    let key: String = help[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    (!key.is_empty()).then_some(key)
}

/// Whether a flag says it has no key on purpose.
pub fn per_run(arg: &Arg) -> bool {
    help_text(arg).contains(PER_RUN_MARK)
}

fn help_text(arg: &Arg) -> String {
    let long = arg.get_long_help().map(ToString::to_string);
    long.or_else(|| arg.get_help().map(ToString::to_string))
        .unwrap_or_default()
}

/// Every key a flag of `cmd` (or of its subcommands) claims.
pub fn claimed_keys(cmd: &Command) -> std::collections::BTreeSet<String> {
    let mut keys: std::collections::BTreeSet<String> =
        cmd.get_arguments().filter_map(config_key).collect();
    for sub in cmd.get_subcommands() {
        keys.extend(claimed_keys(sub));
    }
    keys
}

/// The configuration file's values as flag defaults: each arg of `cmd` and its subcommands
/// whose key the file sets gets that value as its default (checked by the flag's parser, the
/// error naming the file and the key). Relative paths are taken from `base`, the file's
/// directory.
pub fn apply(cmd: Command, values: &BTreeMap<String, toml::Value>, base: &Path) -> Result<Command> {
    let owner = cmd.clone();
    let mut cmd = cmd;
    let ids: Vec<(String, String)> = cmd
        .get_arguments()
        .filter_map(|a| Some((a.get_id().to_string(), config_key(a)?)))
        .collect();
    for (id, key) in ids {
        let Some(value) = values.get(&key) else {
            continue;
        };
        let arg = owner.get_arguments().find(|a| a.get_id() == id.as_str());
        let arg = arg.expect("listed above");
        let texts = texts(arg, &key, value, base)?;
        for text in &texts {
            check(arg, &key, text)?;
        }
        cmd = cmd.mut_arg(id, |a| with_default(a, texts));
    }
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in names {
        let sub = cmd.find_subcommand(&name).expect("listed").clone();
        let sub = apply(sub, values, base)?;
        cmd = cmd.mut_subcommand(name, |_| sub);
    }
    Ok(cmd)
}

fn with_default(arg: Arg, texts: Vec<OsString>) -> Arg {
    let texts: Vec<clap::builder::OsStr> = texts.into_iter().map(Into::into).collect();
    arg.required(false).default_values(texts)
}

/// A value of the file as the flag's texts: a list for a flag that may be repeated.
fn texts(arg: &Arg, key: &str, value: &toml::Value, base: &Path) -> Result<Vec<OsString>> {
    let repeated = matches!(arg.get_action(), ArgAction::Append);
    let flag = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
    let one = |v: &toml::Value| -> Result<OsString> {
        let text = match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) if flag => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            other => bail!("{key} cannot be {} here", other.type_str()),
        };
        if flag && !matches!(v, toml::Value::Boolean(_)) {
            bail!("{key} is true or false");
        }
        Ok(resolve_path(arg, text, base))
    };
    match value {
        toml::Value::Array(items) if repeated => items.iter().map(one).collect(),
        toml::Value::Array(_) => bail!("{key} takes one value, not a list"),
        v => Ok(vec![one(v)?]),
    }
}

/// A relative path in the file is relative to the file's directory; URLs stay as they are,
/// and of a `NAME=FILE` value (`keys.trust`) only the file is a path.
fn resolve_path(arg: &Arg, text: String, base: &Path) -> OsString {
    let names: Vec<&str> = arg
        .get_value_names()
        .map(|names| names.iter().map(|n| n.as_str()).collect())
        .unwrap_or_default();
    // A catalogue (`URL`) is a path unless it has a scheme: sqlite://… or postgres://….
    let path_like = arg.get_value_hint() == ValueHint::AnyPath
        || names
            .iter()
            .any(|n| n.contains("DIR") || n.contains("FILE") || n.contains("URL"));
    if !path_like {
        return text.into();
    }
    let (prefix, path) = match text.split_once('=') {
        Some((name, path)) if names.iter().any(|n| n.contains('=')) => (format!("{name}="), path),
        _ => (String::new(), text.as_str()),
    };
    if path.is_empty() || !Path::new(path).is_relative() || path.contains("://") {
        return text.into();
    }
    format!("{prefix}{}", base.join(path).display()).into()
}

/// Runs the flag's own parser on a value of the file, so that a bad one is reported with
/// the key it came from before anything runs.
fn check(arg: &Arg, key: &str, text: &OsString) -> Result<()> {
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return Ok(()); // `texts` took only true or false
    }
    let parser = arg.get_value_parser().clone();
    Command::new(key.to_owned())
        .no_binary_name(true)
        .arg(Arg::new("value").long("value").value_parser(parser))
        .try_get_matches_from([OsString::from("--value"), text.clone()])
        .map(drop)
        .map_err(|e| {
            let e = e.to_string();
            let e = e.replace(" for '--value <value>'", "");
            let e = e.trim_start_matches("error: ").lines().next().unwrap_or("");
            anyhow!("{key} = {text:?}: {e}")
        })
}

/// The file's values by key (`section.key`, or `key` at the top), tables of tables and arrays
/// of tables (`[[task]]`) left to the typed configuration.
pub fn flatten(table: &toml::Table) -> BTreeMap<String, toml::Value> {
    let mut out = BTreeMap::new();
    for (name, value) in table {
        match value {
            toml::Value::Table(section) => {
                for (key, v) in section {
                    if !v.is_table() {
                        out.insert(format!("{name}.{key}"), v.clone());
                    }
                }
            }
            toml::Value::Array(a) if a.iter().all(toml::Value::is_table) && !a.is_empty() => {}
            v => {
                out.insert(name.clone(), v.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        Command::new("t").subcommand(
            Command::new("send")
                .arg(
                    Arg::new("inbox")
                        .required(true)
                        .value_hint(ValueHint::AnyPath)
                        .help("Inbox [config: send.inbox]."),
                )
                .arg(
                    Arg::new("settle")
                        .long("settle")
                        .value_parser(clap::value_parser!(u64))
                        .default_value("30")
                        .help("Seconds [config: send.settle]."),
                )
                .arg(
                    Arg::new("watch")
                        .long("watch")
                        .action(ArgAction::SetTrue)
                        .help("Keep going [config: send.watch]."),
                )
                .arg(
                    Arg::new("trust")
                        .long("trust")
                        .value_name("[SITE=]FILE")
                        .action(ArgAction::Append)
                        .help("Keys [config: keys.trust]."),
                )
                .arg(
                    Arg::new("json")
                        .long("json")
                        .action(ArgAction::SetTrue)
                        .help("JSON [per run]."),
                ),
        )
    }

    fn values(text: &str) -> BTreeMap<String, toml::Value> {
        flatten(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn the_file_gives_defaults_and_flags_override() {
        let v = values("[send]\ninbox = \"in\"\nsettle = 5\nwatch = true\n[keys]\ntrust = [\"a=k/a.pub\", \"k/b.pub\"]\n");
        let cmd = apply(cli(), &v, Path::new("/etc/forte")).unwrap();
        let m = cmd.clone().try_get_matches_from(["t", "send"]).unwrap();
        let m = m.subcommand_matches("send").unwrap();
        assert_eq!(m.get_one::<String>("inbox").unwrap(), "/etc/forte/in");
        assert_eq!(*m.get_one::<u64>("settle").unwrap(), 5);
        assert!(m.get_flag("watch"));
        let trust: Vec<&String> = m.get_many("trust").unwrap().collect();
        assert_eq!(trust, ["a=/etc/forte/k/a.pub", "/etc/forte/k/b.pub"]);
        let m = cmd
            .try_get_matches_from(["t", "send", "/x", "--settle", "7", "--trust", "c"])
            .unwrap();
        let m = m.subcommand_matches("send").unwrap();
        assert_eq!(m.get_one::<String>("inbox").unwrap(), "/x");
        assert_eq!(*m.get_one::<u64>("settle").unwrap(), 7);
        assert_eq!(m.get_many::<String>("trust").unwrap().count(), 1);
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let e = apply(
            cli(),
            &values("[send]\nsettle = \"soon\"\n"),
            Path::new("."),
        );
        let e = e.unwrap_err().to_string();
        assert!(
            e.starts_with("send.settle = \"soon\": invalid value"),
            "{e}"
        );
        let e = apply(cli(), &values("[send]\nwatch = \"yes\"\n"), Path::new("."));
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("send.watch is true or false"));
        let e = apply(cli(), &values("[send]\nsettle = [1, 2]\n"), Path::new("."));
        assert!(e.unwrap_err().to_string().contains("one value, not a list"));
    }

    #[test]
    fn keys_are_read_from_the_help() {
        let cmd = cli();
        let send = cmd.find_subcommand("send").unwrap();
        let keys: Vec<Option<String>> = send.get_arguments().map(config_key).collect();
        assert_eq!(keys[1].as_deref(), Some("send.settle"));
        assert!(send.get_arguments().any(per_run));
        assert!(claimed_keys(&cmd).contains("keys.trust"));
    }
}
