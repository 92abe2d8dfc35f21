//! Which files of a tree are taken: `--include`, `--exclude`, `--filter-from`, `--min-age`,
//! `--max-age`, `--min-size` and `--max-size`, with rclone's semantics (as rclone 1.60 has them:
//! its docs/content/filtering.md and fs/filter/), so that `rclone lsf -R --files-only` with the
//! same flags lists the same files.
//!
//! - A glob is matched against a file's `/`-separated path relative to the root: without a
//!   leading `/` it matches the end of the path at any depth (after a `/`), with one it is
//!   anchored at the root. `*` matches within a name (not `/`), `**` across names, `?` one
//!   character but `/`, `[…]` a class, `{a,b}` alternatives, `\` escapes, `{{re}}` a regular
//!   expression.
//! - Rules are tried in order, the first match wins, and a path no rule matches is taken:
//!   every `--include` first, then every `--exclude`, then the lines of each `--filter-from`
//!   file (`+ glob`, `- glob`, `!` clears the rules so far, `#` and `;` start comments); any
//!   `--include` adds a last rule excluding everything else.
//! - Directory rules (a glob ending in `/`, or holding `**`, and the directories an include
//!   needs) decide which directories are walked into: a file under an excluded directory is
//!   not taken whatever its own rules say.
//! - Sizes and ages are checked before the rules: `--min-size` and `--max-size` (KiB unless
//!   a suffix B, K, M, G, T, P says otherwise; binary) keep a file of exactly that size;
//!   `--max-age` drops files modified before now minus it, `--min-age` those modified after
//!   now minus it (seconds unless a suffix ms, s, m, h, d, w, M, y says otherwise; or a date).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use forte_format::Kind;
use regex::Regex;
use serde::Serialize;

use crate::source::{Discovery, SourceFile};

/// What the operator asked for, as given (flags and the `[filter]` section, merged).
#[derive(Debug, Clone, Default)]
pub struct FilterSpec {
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    pub filter_from: Vec<PathBuf>,
    pub min_age: Option<String>,
    pub max_age: Option<String>,
    pub min_size: Option<String>,
    pub max_size: Option<String>,
}

/// One rule: include or exclude what its glob matches.
#[derive(Debug, Clone)]
struct Rule {
    include: bool,
    regex: Regex,
    /// As the operator wrote it, for reports: `--exclude *.tmp`, `- /a/**` (rules.txt).
    shown: String,
}

/// A bound on a file's modification time: a duration before now, or a fixed instant (a date).
#[derive(Debug, Clone, Copy)]
enum Age {
    Ago(Duration),
    At(SystemTime),
}

impl Age {
    fn instant(self, now: SystemTime) -> SystemTime {
        match self {
            Age::Ago(d) => now.checked_sub(d).unwrap_or(UNIX_EPOCH),
            Age::At(t) => t,
        }
    }
}

/// The filter, parsed once: rules for files and for directories, and the bounds.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    files: Vec<Rule>,
    dirs: Vec<Rule>,
    min_size: Option<u64>,
    max_size: Option<u64>,
    min_age: Option<(Age, String)>,
    max_age: Option<(Age, String)>,
}

/// A file the filter left out, and which rule or bound did.
#[derive(Debug, Clone, Serialize)]
pub struct Excluded {
    /// Its path relative to the root the filter matched against (`batch/sub/file` for send).
    pub path: String,
    pub size: u64,
    pub reason: String,
    /// The file as the walk found it.
    #[serde(skip)]
    pub file: SourceFile,
}

impl Filter {
    /// Parses `spec` (reading its `--filter-from` files), in rclone's order.
    pub fn new(spec: &FilterSpec) -> Result<Self> {
        let mut f = Filter {
            min_size: parse_size_opt(spec.min_size.as_deref(), "--min-size")?,
            max_size: parse_size_opt(spec.max_size.as_deref(), "--max-size")?,
            min_age: parse_age_opt(spec.min_age.as_deref(), "--min-age")?,
            max_age: parse_age_opt(spec.max_age.as_deref(), "--max-age")?,
            ..Filter::default()
        };
        if let (Some((min, _)), Some((max, _))) = (&f.min_age, &f.max_age) {
            let now = SystemTime::now();
            if min.instant(now) < max.instant(now) {
                bail!("--min-age can't be larger than --max-age: no file could be taken");
            }
        }
        for glob in &spec.include {
            f.add(true, glob, format!("--include {glob}"))?;
        }
        for glob in &spec.exclude {
            f.add(false, glob, format!("--exclude {glob}"))?;
        }
        for file in &spec.filter_from {
            f.add_filter_from(file)?;
        }
        if !spec.include.is_empty() {
            f.add(false, "/**", "--include given: everything else".into())?;
        }
        Ok(f)
    }

    /// Parses the lines of a `--filter-from` file.
    pub fn from_lines(text: &str, source: &str) -> Result<Self> {
        let mut f = Filter::default();
        f.add_lines(text, source)?;
        Ok(f)
    }

    fn add_filter_from(&mut self, file: &Path) -> Result<()> {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read --filter-from {}", file.display()))?;
        let name = file.display().to_string();
        self.add_lines(&text, &name)
            .with_context(|| format!("in --filter-from {name}"))
    }

    fn add_lines(&mut self, text: &str, source: &str) -> Result<()> {
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let shown = format!("{line} ({source}:{})", n + 1);
            if line == "!" {
                self.files.clear();
                self.dirs.clear();
            } else if let Some(glob) = line.strip_prefix("+ ") {
                self.add(true, glob, shown)?;
            } else if let Some(glob) = line.strip_prefix("- ") {
                self.add(false, glob, shown)?;
            } else {
                bail!(
                    "line {}: malformed rule {line:?}: a rule is `+ GLOB`, `- GLOB` or `!`",
                    n + 1
                );
            }
        }
        Ok(())
    }

    /// Adds one rule: a file rule, a directory rule (a glob ending in `/`; excluding `dir/`
    /// excludes `dir/**`), or both (a glob holding `**`); an include also lets in the
    /// directories its files may be in.
    fn add(&mut self, include: bool, glob: &str, shown: String) -> Result<()> {
        let mut glob = glob.to_string();
        let mut dir_rule = glob.ends_with('/');
        let mut file_rule = !dir_rule;
        if dir_rule && !include {
            glob.push_str("**");
        }
        if glob.contains("**") {
            (dir_rule, file_rule) = (true, true);
        }
        let regex = glob_to_regex(&glob).map_err(anyhow::Error::msg)?;
        if file_rule {
            self.files.push(Rule {
                include,
                regex: regex.clone(),
                shown: shown.clone(),
            });
            if include || glob == "*" {
                for dir_glob in dir_globs(&glob) {
                    if dir_glob == "/" {
                        continue;
                    }
                    let regex = glob_to_regex(&dir_glob).map_err(anyhow::Error::msg)?;
                    let shown = shown.clone();
                    self.dirs.push(Rule {
                        include,
                        regex,
                        shown,
                    });
                }
            }
        }
        if dir_rule {
            self.dirs.push(Rule {
                include,
                regex,
                shown,
            });
        }
        Ok(())
    }

    /// Whether any rule or bound is set: without one, every file is taken.
    pub fn is_active(&self) -> bool {
        !(self.files.is_empty()
            && self.dirs.is_empty()
            && self.min_size.is_none()
            && self.max_size.is_none()
            && self.min_age.is_none()
            && self.max_age.is_none())
    }

    /// Why the directory `dir` (relative, without a trailing `/`) is not walked into, if it
    /// is not: the first directory rule that matches it excludes it.
    pub fn directory_excluded(&self, dir: &str) -> Option<String> {
        let with_slash = format!("{}/", dir.trim_matches('/'));
        let rule = self.dirs.iter().find(|r| r.regex.is_match(&with_slash))?;
        (!rule.include).then(|| format!("directory {with_slash} excluded by {}", rule.shown))
    }

    /// Why the file at `path` (relative to the root, `/`-separated) is not taken, if it is
    /// not: its directories, then its modification time, its size, then the first file rule
    /// that matches it.
    pub fn file_excluded(
        &self,
        path: &str,
        size: u64,
        modified: SystemTime,
        now: SystemTime,
    ) -> Option<String> {
        for (end, _) in path.match_indices('/') {
            if let Some(why) = self.directory_excluded(&path[..end]) {
                return Some(why);
            }
        }
        if let Some((age, shown)) = &self.max_age {
            if modified < age.instant(now) {
                return Some(format!("modified before --max-age {shown}"));
            }
        }
        if let Some((age, shown)) = &self.min_age {
            if modified > age.instant(now) {
                return Some(format!("modified after --min-age {shown}"));
            }
        }
        if let Some(min) = self.min_size.filter(|&min| size < min) {
            return Some(format!("{size} bytes, under --min-size ({min} bytes)"));
        }
        if let Some(max) = self.max_size.filter(|&max| size > max) {
            return Some(format!("{size} bytes, over --max-size ({max} bytes)"));
        }
        let rule = self.files.iter().find(|r| r.regex.is_match(path))?;
        (!rule.include).then(|| format!("excluded by {}", rule.shown))
    }

    /// Takes out of `found` (a walk of a directory whose paths the filter sees as
    /// `prefix/path`, or `path` when `prefix` is empty) every file the filter leaves out, and
    /// every empty directory under an excluded directory; returns them, with why.
    pub fn apply(&self, found: &mut Discovery, prefix: &str, now: SystemTime) -> Vec<Excluded> {
        if !self.is_active() {
            return Vec::new();
        }
        let mut excluded = Vec::new();
        found.files.retain(|f| {
            let path = prefixed(prefix, &f.path);
            match self.excludes(f, &path, now) {
                None => true,
                Some(reason) => {
                    excluded.push(Excluded {
                        path,
                        size: f.size,
                        reason,
                        file: f.clone(),
                    });
                    false
                }
            }
        });
        excluded
    }

    /// Why the filter leaves out `f`, found in a walk whose paths it sees as `prefix/path`.
    pub fn excludes_file(&self, f: &SourceFile, prefix: &str, now: SystemTime) -> Option<String> {
        if !self.is_active() {
            return None;
        }
        self.excludes(f, &prefixed(prefix, &f.path), now)
    }

    fn excludes(&self, f: &SourceFile, path: &str, now: SystemTime) -> Option<String> {
        if f.kind == Kind::Dir {
            // rclone filters directories by its directory rules only (sizes and ages apply to
            // files): an empty directory goes unless it or a parent is excluded.
            let mut ends: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
            ends.push(path.len());
            return ends
                .iter()
                .find_map(|&e| self.directory_excluded(&path[..e]));
        }
        let modified = UNIX_EPOCH
            .checked_add(Duration::new(f.mtime_s.max(0) as u64, f.mtime_ns))
            .unwrap_or(UNIX_EPOCH);
        self.file_excluded(path, f.size, modified, now)
    }
}

fn prefixed(prefix: &str, path: &str) -> String {
    if prefix.is_empty() {
        path.to_string()
    } else {
        format!("{prefix}/{path}")
    }
}

/// rclone's glob as a regular expression over a path (fs/filter/glob.go, reimplemented).
fn glob_to_regex(glob: &str) -> Result<Regex, String> {
    let mut re = String::new();
    let body = match glob.strip_prefix('/') {
        Some(rest) => {
            re.push('^');
            rest
        }
        None => {
            re.push_str("(^|/)");
            glob
        }
    };
    let mut g = GlobState::default();
    for c in body.chars() {
        g.push(c, &mut re, glob)?;
    }
    g.stars(&mut re, glob)?;
    if g.brackets > 0 {
        return Err(format!("mismatched '[' and ']' in glob {glob:?}"));
    }
    if g.braces {
        return Err(format!("mismatched '{{' and '}}' in glob {glob:?}"));
    }
    if g.regexp {
        return Err(format!("mismatched '{{{{' and '}}}}' in glob {glob:?}"));
    }
    re.push('$');
    Regex::new(&re).map_err(|e| format!("bad glob pattern {glob:?} (regexp {re:?}): {e}"))
}

/// Where the glob translation is.
#[derive(Default)]
struct GlobState {
    stars: usize,
    braces: bool,
    brackets: usize,
    escaped: bool,
    regexp: bool,
    regexp_end: bool,
    last: Option<char>,
}

impl GlobState {
    fn stars(&mut self, re: &mut String, glob: &str) -> Result<(), String> {
        match self.stars {
            0 => {}
            1 => re.push_str("[^/]*"),
            2 => re.push_str(".*"),
            _ => return Err(format!("too many stars in {glob:?}")),
        }
        self.stars = 0;
        Ok(())
    }

    fn push(&mut self, c: char, re: &mut String, glob: &str) -> Result<(), String> {
        let last = self.last.replace(c);
        if self.escaped {
            re.push(c);
            self.escaped = false;
            return Ok(());
        }
        if self.regexp_end {
            if c == '}' {
                // `}}}`: the regular expression ends with a `}`.
                re.pop();
                re.push_str("})");
                return Ok(());
            }
            self.regexp_end = false;
        }
        if self.regexp {
            if c == '}' && last == Some('}') {
                (self.regexp, self.regexp_end) = (false, true);
                re.pop();
                re.push(')');
            } else {
                re.push(c);
            }
            return Ok(());
        }
        if c != '*' {
            self.stars(re, glob)?;
        }
        if self.brackets > 0 {
            re.push(c);
            match c {
                '[' => self.brackets += 1,
                ']' => self.brackets -= 1,
                _ => {}
            }
            return Ok(());
        }
        self.push_outside(c, last, re, glob)
    }

    fn push_outside(
        &mut self,
        c: char,
        last: Option<char>,
        re: &mut String,
        glob: &str,
    ) -> Result<(), String> {
        match c {
            '\\' => {
                re.push(c);
                self.escaped = true;
            }
            '*' => self.stars += 1,
            '?' => re.push_str("[^/]"),
            '[' => {
                re.push(c);
                self.brackets += 1;
            }
            ']' => return Err(format!("mismatched ']' in glob {glob:?}")),
            '{' if self.braces && last == Some('{') => (self.regexp, self.braces) = (true, false),
            '{' if self.braces => return Err(format!("can't nest '{{' '}}' in glob {glob:?}")),
            '{' => {
                self.braces = true;
                re.push('(');
            }
            '}' if !self.braces => {
                return Err(format!("mismatched '{{' and '}}' in glob {glob:?}"))
            }
            '}' => {
                re.push(')');
                self.braces = false;
            }
            ',' if self.braces => re.push('|'),
            '.' | '+' | '(' | ')' | '|' | '^' | '$' => {
                re.push('\\');
                re.push(c);
            }
            _ => re.push(c),
        }
        Ok(())
    }
}

/// The directory globs a file glob implies: matched against a directory (with its trailing
/// `/`), whether a file the glob matches could be in it (rclone's `globToDirGlobs`).
fn dir_globs(glob: &str) -> Vec<String> {
    let too_hard = Regex::new(r"(\{[^{}]*(\*\*|/)[^{}]*\})|\{\{|\}\}").expect("a valid regex");
    if too_hard.is_match(glob) {
        return vec!["/**".into()];
    }
    let squash = Regex::new("/{2,}").expect("a valid regex");
    let mut glob = squash.replace_all(glob, "/").into_owned();
    let mut out: Vec<String> = Vec::new();
    loop {
        let slash = glob.rfind('/');
        let stars = glob.rfind("**");
        let (i, what) = match (slash, stars) {
            (Some(s), Some(j)) if j <= s => (s, ""),
            (_, Some(j)) => (j, "**"),
            (Some(s), None) => (s, ""),
            (None, None) => {
                if out.is_empty() {
                    out.push("/**".into());
                }
                return out;
            }
        };
        glob.truncate(i);
        let dir = format!("{glob}{what}/");
        if out.last() != Some(&dir) {
            out.push(dir);
        }
    }
}

fn parse_size_opt(text: Option<&str>, flag: &str) -> Result<Option<u64>> {
    text.map(|t| parse_size(t).with_context(|| format!("{flag} {t:?}")))
        .transpose()
        .map(Option::flatten)
}

fn parse_age_opt(text: Option<&str>, flag: &str) -> Result<Option<(Age, String)>> {
    let Some(t) = text else { return Ok(None) };
    let age = parse_age(t).with_context(|| format!("{flag} {t:?}"))?;
    Ok(age.map(|a| (a, t.to_string())))
}

/// An rclone size: KiB unless suffixed B (bytes), K, M, G, T, P, E (binary, optionally
/// `Ki`/`KiB`…), a fraction allowed; `off` is no bound.
pub fn parse_size(text: &str) -> Result<Option<u64>> {
    if text.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let multiplier = |c: u8| -> Option<f64> {
        let power = match c.to_ascii_lowercase() {
            b'k' => 1,
            b'm' => 2,
            b'g' => 3,
            b't' => 4,
            b'p' => 5,
            b'e' => 6,
            _ => return None,
        };
        Some(1024f64.powi(power))
    };
    let bytes = text.as_bytes();
    let Some(&last) = bytes.last() else {
        bail!("empty size")
    };
    let (number, times) = match last {
        b'0'..=b'9' | b'.' => (text, 1024.0),
        b'b' | b'B' if bytes.len() > 2 && bytes[bytes.len() - 2] == b'i' => {
            let c = bytes[bytes.len() - 3];
            let m = multiplier(c).with_context(|| format!("bad suffix {:?}", c as char))?;
            (&text[..text.len() - 3], m)
        }
        b'b' | b'B' => (&text[..text.len() - 1], 1.0),
        b'i' | b'I' if bytes.len() > 1 => {
            let c = bytes[bytes.len() - 2];
            let m = multiplier(c).with_context(|| format!("bad suffix {:?}", c as char))?;
            (&text[..text.len() - 2], m)
        }
        c => {
            let m = multiplier(c).with_context(|| format!("bad suffix {:?}", c as char))?;
            (&text[..text.len() - 1], m)
        }
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .with_context(|| format!("{number:?} is not a number"))?;
    if value < 0.0 {
        bail!("size can't be negative");
    }
    Ok(Some((value * times) as u64))
}

/// An rclone age: a Go duration (`1h30m`, `300ms`), a number with a suffix d, w, M (30 days),
/// y (365 days) or none (seconds), or a date (`2006-01-02`, `2006-01-02 15:04:05`,
/// `2006-01-02T15:04:05`, in local time, or RFC 3339); `off` is no bound.
fn parse_age(text: &str) -> Result<Option<Age>> {
    if text == "off" {
        return Ok(None);
    }
    if let Some(d) = go_duration(text) {
        return Ok(Some(Age::Ago(d)));
    }
    for (suffix, seconds) in [("d", 86_400.0), ("w", 604_800.0), ("M", 2_592_000.0)] {
        if let Some(n) = text
            .strip_suffix(suffix)
            .and_then(|n| n.parse::<f64>().ok())
        {
            return Ok(Some(Age::Ago(seconds_of(n * seconds)?)));
        }
    }
    let (number, seconds) = match text.strip_suffix('y') {
        Some(n) => (n, 31_536_000.0),
        None => (text, 1.0),
    };
    if let Ok(n) = number.parse::<f64>() {
        return Ok(Some(Age::Ago(seconds_of(n * seconds)?)));
    }
    date(text)
        .map(|t| Some(Age::At(t)))
        .with_context(|| "not a duration (1h30m, 2d, 3w, 1M, 1y; seconds without a unit) nor a date (2006-01-02, 2006-01-02 15:04:05)")
}

/// A moment given as an rclone age before `now` (`1d`, `12h`, `1h30m`, `2w`) or as a date
/// (`2026-12-01`, `2026-12-01 08:00:00` in local time, or RFC 3339): what `--since` and
/// `--until` take.
pub fn parse_moment(text: &str, now: SystemTime) -> Result<SystemTime> {
    match parse_age(text.trim()).with_context(|| format!("{text:?}"))? {
        Some(age) => Ok(age.instant(now)),
        None => anyhow::bail!("{text:?}: give a moment (1d, 12h, 2026-12-01), not off"),
    }
}

fn seconds_of(seconds: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds.max(0.0)).context("out of range")
}

/// Go's `time.ParseDuration`: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or `0`.
fn go_duration(text: &str) -> Option<Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let negative = text.starts_with('-');
    let mut rest = text.strip_prefix('-').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        if number.is_empty() || number == "." {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let nanos = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * nanos;
        rest = next;
    }
    // A negative age puts the bound in the future; as a duration before now it is zero.
    Some(if negative {
        Duration::ZERO
    } else {
        Duration::from_nanos(total as u64)
    })
}

/// A date as rclone reads one: RFC 3339, or in local time.
fn date(text: &str) -> Option<SystemTime> {
    use chrono::{DateTime, Local, NaiveDate, NaiveDateTime, TimeZone};
    let at = |seconds: i64, nanos: u32| {
        let since = Duration::new(seconds.max(0) as u64, nanos);
        UNIX_EPOCH.checked_add(since)
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return at(t.timestamp(), t.timestamp_subsec_nanos());
    }
    let naive = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .or_else(|| {
            let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
            day.and_hms_opt(0, 0, 0)
        })?;
    let local = Local.from_local_datetime(&naive).earliest()?;
    at(local.timestamp(), local.timestamp_subsec_nanos())
}

#[cfg(test)]
mod tests;
