//! Every step of the demo is a `forte` command: it is printed as a user would type it (`$ forte
//! …`, quoted for a POSIX shell, paths as the demo was given them), then run by this very
//! binary, so that what is printed is exactly what ran and can be pasted into a real set-up.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{ensure, Context, Result};

/// The words of a command line, each anything an `OsString` is made from.
macro_rules! words {
    ($($w:expr),* $(,)?) => { [$(std::ffi::OsString::from($w)),*] };
}
pub(crate) use words;

/// The running binary, which the demo runs as `forte`.
pub(crate) struct Forte {
    me: PathBuf,
}

impl Forte {
    pub(crate) fn new() -> Result<Self> {
        let me = std::env::current_exe().context("finding the forte binary")?;
        Ok(Self { me })
    }

    /// Prints `$ forte WORDS [suffix]` (the suffix is shell text such as `>> FILE`).
    pub(crate) fn show(&self, words: &[OsString], suffix: &str) {
        println!("   $ {}{suffix}", command_line(words));
    }

    /// Prints the command, runs it, and prints what it printed, indented; fails when it fails.
    pub(crate) fn run(&self, words: &[OsString]) -> Result<String> {
        self.show(words, "");
        self.run_quietly(words, usize::MAX)
    }

    /// Runs the command (already shown) and prints the first `lines` lines it printed,
    /// indented, and how many more there were.
    pub(crate) fn run_quietly(&self, words: &[OsString], lines: usize) -> Result<String> {
        let out = Command::new(&self.me)
            .args(words)
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", command_line(words)))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        for line in text.lines().take(lines) {
            println!("     {line}");
        }
        let more = text.lines().count().saturating_sub(lines);
        if more > 0 {
            println!("     … and {more} more lines");
        }
        ensure!(out.status.success(), "`{}` failed", command_line(words));
        Ok(text)
    }

    /// Prints the command and starts it, its stdout piped to the caller and its stderr dropped.
    pub(crate) fn spawn(&self, words: &[OsString]) -> Result<Child> {
        self.show(words, "");
        Command::new(&self.me)
            .args(words)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", command_line(words)))
    }
}

/// `forte` and the words, each quoted for a POSIX shell when it needs it.
pub(crate) fn command_line(words: &[OsString]) -> String {
    let mut line = String::from("forte");
    for word in words {
        line.push(' ');
        line.push_str(&quote(word));
    }
    line
}

/// A word as a POSIX shell reads it back: bare when it is only safe characters, else in
/// single quotes (a single quote inside written '\'').
fn quote(word: &OsStr) -> String {
    let text = word.to_string_lossy();
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-./=:@%+,".contains(c);
    if !text.is_empty() && text.chars().all(safe) {
        return text.into_owned();
    }
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `path` relative to the current directory when it is under it, so that printed commands
/// read as a user would type them there; else as given.
pub(crate) fn from_here(path: &Path) -> PathBuf {
    let here = std::env::current_dir().ok();
    match here
        .as_deref()
        .and_then(|here| path.strip_prefix(here).ok())
    {
        Some(rel) if path.is_absolute() && !rel.as_os_str().is_empty() => rel.to_path_buf(),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_only_when_a_shell_would_split_or_expand_them() {
        let line = command_line(&words!["token", "--core", "*", "--out", "a b/it's"]);
        assert_eq!(line, r"forte token --core '*' --out 'a b/it'\''s'");
        assert_eq!(
            command_line(&words!["status", "--file", "s/b/x.log"]),
            "forte status --file s/b/x.log"
        );
    }
}
