//! The configuration file described from the command line's definition: docs/config.md
//! (`forte config reference`) and the settings a file resolves to (`forte config check`).
//! Both read the keys from the flags' help (`flag_keys`), so neither can drift from them.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::{Arg, Command};

use super::flag_keys::{config_key, per_run};

/// One key: the flags that take it, and what it is.
#[derive(Debug, Default)]
pub struct KeyDoc {
    /// `forte send --settle`, one per command that has the flag.
    pub flags: Vec<String>,
    pub value: String,
    /// The flag's default (after the file's values were applied, the file's value).
    pub default: Vec<String>,
    pub help: String,
}

/// Every key of every command, by key; and the flags that have none (`[per run]`).
pub fn keys(cmd: &Command) -> (BTreeMap<String, KeyDoc>, Vec<String>) {
    let mut keys = BTreeMap::new();
    let mut per_run_flags = Vec::new();
    walk(cmd, cmd.get_name(), &mut keys, &mut per_run_flags);
    (keys, per_run_flags)
}

fn walk(
    cmd: &Command,
    path: &str,
    keys: &mut BTreeMap<String, KeyDoc>,
    per_run_flags: &mut Vec<String>,
) {
    for arg in cmd.get_arguments().filter(|a| !is_builtin(a)) {
        let flag = format!("`{path} {}`", flag_name(arg));
        match config_key(arg) {
            Some(key) => {
                let doc: &mut KeyDoc = keys.entry(key).or_default();
                if !doc.flags.contains(&flag) {
                    doc.flags.push(flag);
                }
                if doc.help.is_empty() {
                    doc.help = clean_help(arg);
                    doc.value = value_name(arg);
                    doc.default = arg
                        .get_default_values()
                        .iter()
                        .map(|v| v.to_string_lossy().into_owned())
                        .collect();
                }
            }
            None if per_run(arg) => per_run_flags.push(flag),
            None => {}
        }
    }
    for sub in cmd.get_subcommands() {
        walk(
            sub,
            &format!("{path} {}", sub.get_name()),
            keys,
            per_run_flags,
        );
    }
}

/// The flags every command has from clap: `--help`, `--version`.
pub fn is_builtin(arg: &Arg) -> bool {
    matches!(arg.get_id().as_str(), "help" | "version")
}

/// Flags of `cmd` and its subcommands that have neither a key nor `[per run]`, as
/// `forte send --settle`: the test of docs/config.md wants none.
pub fn unkeyed(cmd: &Command) -> Vec<String> {
    let mut out = Vec::new();
    unkeyed_in(cmd, cmd.get_name(), &mut out);
    out
}

fn unkeyed_in(cmd: &Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments().filter(|a| !is_builtin(a)) {
        if config_key(arg).is_none() && !per_run(arg) {
            out.push(format!("{path} {}", flag_name(arg)));
        }
    }
    for sub in cmd.get_subcommands() {
        unkeyed_in(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

fn flag_name(arg: &Arg) -> String {
    match arg.get_long() {
        Some(long) => format!("--{long}"),
        None => format!("<{}>", value_name(arg)),
    }
}

fn value_name(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some(names) => names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        None if !arg.get_action().takes_values() => "true|false".to_owned(),
        None => arg.get_id().as_str().to_uppercase(),
    }
}

/// The help without its `[config: …]` annotation, on one line.
fn clean_help(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(ToString::to_string)
        .unwrap_or_default();
    let mut text = help.split_whitespace().collect::<Vec<_>>().join(" ");
    while let Some(start) = text.find("[config: ") {
        let end = text[start..]
            .find(']')
            .map_or(text.len(), |e| start + e + 1);
        text.replace_range(start..end, "");
    }
    let text = text.replace(crate::settings::flag_keys::PER_RUN_MARK, "");
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" .", ".")
        .replace(" :", ":")
        .replace(" ,", ",")
}

/// docs/config.md: every key, by section, with the flags that take it.
pub fn markdown(cmd: &Command, file_only: &str) -> String {
    let (keys, per_run_flags) = keys(cmd);
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the command line's definition by `forte config reference`; a test \
         fails when this file and the flags differ. One TOML file (`--config FILE` or \
         `$FORTE_CONFIG`) holds every setting; each key is the default of the flags named \
         beside it, and a flag given on the command line overrides it. Relative paths are \
         relative to the file's directory. `forte config check FILE` validates a file and \
         prints what it resolves to.\n",
    );
    let mut section = None;
    for (key, doc) in &keys {
        let (name, short) = key.split_once('.').unwrap_or(("", key));
        if section != Some(name) {
            section = Some(name);
            let title = if name.is_empty() {
                "At the top of the file".to_owned()
            } else {
                format!("[{name}]")
            };
            let _ = write!(
                out,
                "\n## {title}\n\n| key | value | flags | meaning |\n|---|---|---|---|\n"
            );
        }
        let default = match doc.default.as_slice() {
            _ if doc.help.contains("[default:") => String::new(),
            [] => String::new(),
            d => format!(" Default: `{}`.", d.join(", ")),
        };
        let _ = writeln!(
            out,
            "| `{short}` | `{}` | {} | {}{default} |",
            doc.value.replace('|', "\\|"),
            doc.flags.join(", "),
            doc.help.replace('|', "\\|"),
        );
    }
    out.push_str(file_only);
    out.push_str(
        "\n## Flags without a key\n\nThese say what one run does (an action, a lookup, an \
         output choice) rather than how forte runs, so they are given on the command line \
         only:\n\n",
    );
    for flag in per_run_flags {
        let _ = writeln!(out, "- {flag}");
    }
    out
}
