//! Which files `send` and `pack` take: the filter flags, the `[filter]` section of the
//! configuration file, and the [`Filter`] they resolve to (rclone's semantics, in
//! `forte_prepare::filter`). List flags add to the section's lists; the others override it.
//!
//! ```toml
//! [filter]
//! include = ["*.csv", "*.parquet"]   # any include excludes everything else
//! exclude = ["*.tmp", ".*"]
//! filter_from = "filters.txt"        # lines `+ GLOB`, `- GLOB`, `!` (clear), `# comment`
//! min_age = "1m"                     # seconds unless ms s m h d w M y; or a date
//! max_age = "30d"
//! min_size = "1B"                    # KiB unless B K M G T P
//! max_size = "4G"
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use forte_prepare::{Filter, FilterSpec};
use serde::Deserialize;

/// rclone's filter flags; `send` and `pack`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Filters (rclone's semantics; see docs/mechanisms.md)")]
pub struct FilterFlags {
    /// Take only files matching GLOB (repeatable), relative to the inbox for send
    /// (batch/sub/file) and to the packed directory for pack: `*` stays within a name, `**`
    /// crosses `/`, a leading `/` anchors at the root; any include excludes everything else
    /// [config: filter.include, added to these].
    #[arg(long, value_name = "GLOB")]
    pub(super) include: Vec<String>,
    /// Leave out files matching GLOB (repeatable); `dir/` leaves out a directory
    /// [config: filter.exclude, added to these].
    #[arg(long, value_name = "GLOB")]
    pub(super) exclude: Vec<String>,
    /// Rules from FILE, one a line, tried after --include and --exclude: `+ GLOB` takes,
    /// `- GLOB` leaves out, `!` clears the rules so far, `#` starts a comment; the first rule
    /// that matches wins [config: filter.filter_from, before these].
    #[arg(long, value_name = "FILE")]
    pub(super) filter_from: Vec<PathBuf>,
    /// Leave out files modified less than this long ago: seconds unless suffixed ms, s, m, h,
    /// d, w, M, y, or a date (2006-01-02, 2006-01-02 15:04:05) [config: filter.min_age].
    #[arg(long, value_name = "AGE")]
    pub(super) min_age: Option<String>,
    /// Leave out files modified more than this long ago (units as --min-age)
    /// [config: filter.max_age].
    #[arg(long, value_name = "AGE")]
    pub(super) max_age: Option<String>,
    /// Leave out files smaller than this (one of exactly this size is taken): KiB unless
    /// suffixed B, K, M, G, T, P (binary) [config: filter.min_size].
    #[arg(long, value_name = "SIZE")]
    pub(super) min_size: Option<String>,
    /// Leave out files larger than this (one of exactly this size is taken); units as
    /// --min-size [config: filter.max_size].
    #[arg(long, value_name = "SIZE")]
    pub(super) max_size: Option<String>,
}

/// `[filter]` in the configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSection {
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    pub filter_from: Option<PathBuf>,
    pub min_age: Option<String>,
    pub max_age: Option<String>,
    pub min_size: Option<String>,
    pub max_size: Option<String>,
}

impl FilterSection {
    /// Makes `filter_from` relative to the configuration file's directory.
    pub(super) fn resolve_paths(&mut self, base: &Path) {
        if let Some(p) = self.filter_from.as_mut().filter(|p| p.is_relative()) {
            *p = base.join(&*p);
        }
    }
}

/// The filter `send` and `pack` run with: the section's rules, then the flags'.
pub fn filter(flags: &FilterFlags, section: &FilterSection) -> Result<Filter> {
    let spec = FilterSpec {
        include: once_each([&section.include[..], &flags.include[..]].concat()),
        exclude: once_each([&section.exclude[..], &flags.exclude[..]].concat()),
        filter_from: once_each(
            section
                .filter_from
                .iter()
                .chain(&flags.filter_from)
                .cloned()
                .collect(),
        ),
        min_age: flags.min_age.clone().or(section.min_age.clone()),
        max_age: flags.max_age.clone().or(section.max_age.clone()),
        min_size: flags.min_size.clone().or(section.min_size.clone()),
        max_size: flags.max_size.clone().or(section.max_size.clone()),
    };
    Filter::new(&spec).context("the filter (--include, --exclude, --filter-from, --min/max-age, --min/max-size, or [filter])")
}

impl super::EdgeFlags {
    /// The filter these flags and the `[filter]` section give, alone (`--dry-run`).
    pub fn filter(&self, config: &super::Config) -> Result<Filter> {
        filter(&self.filter, &config.filter)
    }
}

impl super::EdgeFlags {
    /// This edge's signing key, if one is given (`--sign` or keys.sign): with it a dry run
    /// knows a file by its object id, as a send does.
    pub fn signing_key(&self, config: &super::Config) -> Result<Option<forte_format::EdgeKey>> {
        let path = self.sign.as_ref().or(config.keys.sign.as_ref());
        path.map(|p| forte_format::EdgeKey::load(p)).transpose()
    }
}

impl super::SendFlags {
    /// How long a batch without a marker must stay unchanged to be ready.
    pub fn settle(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.settle)
    }

    /// Whether this edge's site is given (`--site`, or site in `[send]`): `send` needs it.
    pub fn has_site(&self) -> bool {
        self.site.is_some()
    }

    /// Whether sources are deleted under the core's receipts (`--delete-after-ack`).
    pub fn delete_after_ack(&self) -> bool {
        self.delete_after_ack
    }
}

/// `items` in order, each once: a rule given in the file and again as a flag is one rule.
fn once_each<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_add_to_the_sections_lists_and_override_its_bounds() {
        let section: FilterSection =
            toml::from_str("include = [\"*.csv\"]\nmin_size = \"1K\"\nmax_size = \"1M\"").unwrap();
        let flags = FilterFlags {
            include: vec!["*.bin".into()],
            min_size: Some("10B".into()),
            ..FilterFlags::default()
        };
        let f = filter(&flags, &section).unwrap();
        let now = std::time::SystemTime::now();
        let takes = |path: &str, size| f.file_excluded(path, size, now, now).is_none();
        assert!(
            takes("a.csv", 10) && takes("a.bin", 10),
            "both includes hold"
        );
        assert!(!takes("a.txt", 10));
        assert!(
            !takes("a.csv", 9),
            "the flag's min_size overrides the section's"
        );
        assert!(
            !takes("a.csv", (1 << 20) + 1),
            "the section's max_size holds"
        );
        assert!(toml::from_str::<FilterSection>("includes = []").is_err());
    }
}
