//! The configuration file: one TOML file (`--config` or `$FORTE_CONFIG`); flags override it.
//!
//! ```toml
//! [keys]
//! recipient = "keys/core.pub"   # pack: encrypt to this age recipient file
//! sign = "keys/edge.key"        # pack: sign manifests with this edge key
//! identity = "keys/core.key"    # unpack: decrypt with this age identity file
//! trust = ["mine-7=keys/edge.pub"]  # unpack, pull: accept what this edge key signs for site
//!                               # mine-7 ("keys/edge.pub" alone: for any site, which
//!                               # unpack takes, and pull only with trust_any_site in [pull])
//! receipt_key = "keys/receipt.key"  # pull: sign custody receipts with this core key
//! receipt_pub = ["keys/receipt.pub"] # send: delete sources only under receipts it verifies
//!
//! [prepare]
//! part_size = "16MiB"
//! level = 3            # or "auto": adapted to the slower of CPU and link
//! cpu = 2                # default: all cores
//! parts_in_flight = 6    # default: cpu + 4
//! bundle_below = "1MiB"  # smaller files travel in bundles; "0" sends each alone
//! scheduler = "ordo"     # or "threads", "rayon": who runs the computing stages (all commands)
//!
//! [relay]
//! url = "https://relay.example:8443"
//! token_file = "keys/site-a.token"
//! fingerprint = "…"              # or: ca = "relay-ca.pem"
//!
//! [send]
//! site = "mine-7"                  # signed into every inventory; send needs it (never takes
//!                                  # it from the relay, whose name for the token must match)
//! connections = "auto"             # or a number: uploads in flight, fixed
//! bwlimit = "08:00,2MB 19:00,off"  # or a rate ("20MB"), or "Mon-08:00,2MB Sat-00:00,off"
//! target_rate = "30MB"             # hold the upload at this rate
//!
//! [pull]
//! worker = "core-1"              # default: HOST:PID; unique among workers sharing a catalogue
//! lease = "30s"                  # a dead or stalled worker's batches go to others after this
//! landing = "landing"            # verified batches wait here while their core tasks run
//! quarantine = "quarantine"      # batches a task refused, with its output
//!                                # (both default to hidden directories in the destination)
//! trust_any_site = false         # true: a key in keys.trust without SITE= signs for any site
//! on_changed = "replace"         # a later version of a file replaces it (the earlier kept in
//!                                # DEST/.forte-replaced); "keep-first": refused once, explicitly
//!
//! [[task]]                       # a site's own step; as many as needed, run in this order
//! name = "parquet-columns"
//! at = "core"                    # core: landed, before promotion; delivered: after it
//! per = "file"                   # or "batch"
//! command = ["python3", "checks/parquet_columns.py"]  # or one string, run with sh -c
//! workdir = "."                  # default: this file's directory
//! timeout = "5m"
//! retries = 2                    # tries after a crash or a timeout (exit 1 refuses at once)
//! concurrency = 2                # tries of this task at once
//!
//! [http]                         # the dashboard, JSON API and metrics (send, pull, relay, dashboard)
//! listen = "127.0.0.1:8080"
//! token_file = "keys/http.token" # other hosts must send it (Authorization: Bearer); without it, loopback only
//! names = ["forte.mine.example"] # host names it is reached by (its addresses always are)
//!
//! [s3]                           # buckets (relay --store, pull --copy-to s3://…);
//! endpoint = "http://s3.local:7070"  # each key unset here comes from AWS_ENDPOINT_URL,
//! access_key_id = "…"            # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
//! secret_access_key = "…"
//! region = "us-east-1"
//!
//! [schedule]
//! policy = "sjf-aging"           # fifo, sjf, sjf-aging, priority, lanes
//! max_wait = "1h"
//! small_share = 0.25             # lanes: share of bytes for the smallest batch
//! priority = ["incident-*=10"]   # priority: batch-name rules
//!
//! [ingest]
//! schema = "rows.toml"
//! out = "outbox"
//! codec = "zstd"                 # zstd:LEVEL, lz4, snappy, none
//! rows_per_group = 65536
//! row_groups_per_file = 16
//! flush_after = "10s"
//! writers = 2                    # default: one per core
//! ```
//!
//! Relative paths are relative to the directory of the configuration file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use forte_pipeline::Scheduler;
use serde::Deserialize;

use crate::schedule::PolicyName;
use crate::units::parse_size;

#[derive(Debug, Default, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub keys: KeysSection,
    #[serde(default)]
    pub prepare: PrepareSection,
    #[serde(default)]
    pub relay: RelaySection,
    #[serde(default)]
    pub send: SendSection,
    #[serde(default)]
    pub pull: PullSection,
    #[serde(default)]
    pub schedule: ScheduleSection,
    #[serde(default)]
    pub ingest: IngestSection,
    #[serde(default)]
    pub s3: S3Section,
    #[serde(default)]
    pub http: HttpSection,
    #[serde(default)]
    pub filter: super::FilterSection,
    /// The site's own tasks, in order.
    #[serde(default)]
    pub task: Vec<TaskSection>,
    /// Every value of the file by key, for the flags that take their defaults from it.
    #[serde(skip)]
    pub file: FileValues,
}

/// The file's values by key (`section.key`) and the directory relative paths are taken from.
#[derive(Debug, Default)]
pub struct FileValues {
    pub values: std::collections::BTreeMap<String, toml::Value>,
    pub base: PathBuf,
    /// The file itself, read again where a setting is reloaded (`keys.trust` on SIGHUP).
    pub path: Option<PathBuf>,
}

/// One `[[task]]`: a site's own step (see `crate::tasks`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    pub name: String,
    pub at: crate::tasks::Point,
    #[serde(default)]
    pub per: crate::tasks::Per,
    pub command: CommandLine,
    /// Relative to the configuration file's directory, which it is by default.
    pub workdir: Option<PathBuf>,
    /// `units::parse_duration`; default 10 minutes.
    pub timeout: Option<String>,
    pub retries: Option<u32>,
    pub concurrency: Option<usize>,
}

/// A command: a program and its arguments, or one line for `sh -c`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CommandLine {
    Argv(Vec<String>),
    Shell(String),
}

/// Where the dashboard, JSON API and metrics are served, and the token other hosts need.
#[derive(Debug, Default, Deserialize)]
pub struct HttpSection {
    pub listen: Option<std::net::SocketAddr>,
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub names: Vec<String>,
}

/// Where the S3 server is and its keys; each unset one comes from the environment.
#[derive(Debug, Default, Deserialize)]
pub struct S3Section {
    pub endpoint: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub region: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SendSection {
    /// Uploads in flight: `auto` (tuned while the transfer runs) or a fixed number.
    pub connections: Option<Connections>,
    /// The upload's bandwidth limit: a rate or a timetable (`units::parse_bwlimit`).
    pub bwlimit: Option<String>,
    /// A rate the upload is held at (`units::parse_rate`).
    pub target_rate: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PullSection {
    /// This core worker's name in leases and lineage.
    pub worker: Option<String>,
    /// How long a claimed batch stays the worker's without a renewal (`units::parse_duration`).
    pub lease: Option<String>,
    /// Where verified batches wait while their core tasks run.
    pub landing: Option<PathBuf>,
    /// Where batches a task refused are kept.
    pub quarantine: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RelaySection {
    pub url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub fingerprint: Option<String>,
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
pub struct KeysSection {
    pub sign: Option<PathBuf>,
    #[serde(default)]
    pub trust: Vec<forte_format::TrustSpec>,
    /// The core's key that signs custody receipts (pull).
    pub receipt_key: Option<PathBuf>,
    /// The core's receipt keys the edge verifies receipts with (send).
    #[serde(default)]
    pub receipt_pub: Vec<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PrepareSection {
    pub part_size: Option<Size>,
    pub level: Option<Level>,
    pub cpu: Option<usize>,
    pub parts_in_flight: Option<usize>,
    pub bundle_below: Option<Size>,
    pub scheduler: Option<Scheduler>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ScheduleSection {
    pub policy: Option<PolicyName>,
    pub max_wait: Option<String>,
    pub small_share: Option<f64>,
    #[serde(default)]
    pub priority: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct IngestSection {
    pub schema: Option<PathBuf>,
    pub out: Option<PathBuf>,
    pub codec: Option<String>,
    pub rows_per_group: Option<usize>,
    pub row_groups_per_file: Option<usize>,
    pub flush_after: Option<String>,
    pub writers: Option<usize>,
}

/// A zstd level, or `auto`: adapted between 1 and 9 to whichever of CPU and link is slower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "NumberOrText")]
pub enum Level {
    Fixed(i32),
    Auto,
}

impl Level {
    /// The bounds `auto` adapts within: level 1 is fast enough for any link a CPU can feed;
    /// above 9 the ratio grows little for much more CPU.
    pub const AUTO_BOUNDS: (i32, i32) = (1, 9);
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "auto" => Ok(Level::Auto),
            t => t
                .parse()
                .map(Level::Fixed)
                .map_err(|_| format!("{text:?} is not a zstd level (a number such as 3, or auto)")),
        }
    }
}

impl TryFrom<NumberOrText> for Level {
    type Error = String;
    fn try_from(v: NumberOrText) -> Result<Self, String> {
        match v {
            NumberOrText::Number(n) => i32::try_from(n)
                .map(Level::Fixed)
                .map_err(|_| format!("zstd level {n} is out of range")),
            NumberOrText::Text(t) => t.parse(),
        }
    }
}

/// How many uploads `send` keeps in flight: tuned while it runs, or a fixed number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "NumberOrText")]
pub enum Connections {
    Auto,
    Fixed(usize),
}

impl std::str::FromStr for Connections {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "auto" => Ok(Connections::Auto),
            t => match t.parse::<usize>() {
                Ok(n) if n > 0 && n <= crate::units::MOST_THREADS => Ok(Connections::Fixed(n)),
                _ => Err(format!(
                    "{text:?} is not a number of connections (a number such as 16, or auto)"
                )),
            },
        }
    }
}

impl TryFrom<NumberOrText> for Connections {
    type Error = String;
    fn try_from(v: NumberOrText) -> Result<Self, String> {
        match v {
            NumberOrText::Number(n) => n.to_string().parse(),
            NumberOrText::Text(t) => t.parse(),
        }
    }
}

/// A byte size written as a number or a string such as `"16MiB"`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "NumberOrText")]
pub struct Size(pub u64);

/// How a level or a size may be written in TOML: a bare number or a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl TryFrom<NumberOrText> for Size {
    type Error = String;
    fn try_from(v: NumberOrText) -> Result<Self, String> {
        match v {
            NumberOrText::Number(n) => Ok(Size(n)),
            NumberOrText::Text(t) => parse_size(&t).map(Size),
        }
    }
}

impl Config {
    /// Reads the file if one is given; no file means all defaults. `claimed` are the keys
    /// flags take their defaults from (`flag_keys`): a key that neither a flag nor a section
    /// here knows is refused, with the keys of its section.
    pub fn load(path: Option<&Path>, claimed: &BTreeSet<String>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let invalid = |e: &dyn std::fmt::Display| {
            anyhow::anyhow!("config file {} is not valid: {e}", path.display())
        };
        let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(&e))?;
        let mut unknown = Vec::new();
        let mut config: Config =
            serde_ignored::deserialize(table.clone(), |key| unknown.push(key.to_string()))
                .map_err(|e| invalid(&e))?;
        // A section no typed field knows comes back whole: its keys are checked one by one.
        let unknown: Vec<String> = unknown
            .into_iter()
            .flat_map(|key| match table.get(&key) {
                Some(toml::Value::Table(section)) => {
                    section.keys().map(|k| format!("{key}.{k}")).collect()
                }
                _ => vec![key],
            })
            .collect();
        if let Some(key) = unknown.iter().find(|k| !claimed.contains(*k)) {
            return Err(invalid(&unknown_key(key, claimed)));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        config.file = FileValues {
            values: super::flag_keys::flatten(&table),
            base: base.to_owned(),
            path: Some(path.to_owned()),
        };
        let k = &mut config.keys;
        for p in [&mut k.sign, &mut k.receipt_key].into_iter().flatten() {
            *p = base.join(&*p);
        }
        for p in k
            .trust
            .iter_mut()
            .map(|t| &mut t.path)
            .chain(&mut k.receipt_pub)
        {
            *p = base.join(&*p);
        }
        let r = &mut config.relay;
        for p in [&mut r.token_file, &mut r.ca, &mut config.http.token_file]
            .into_iter()
            .flatten()
        {
            *p = base.join(&*p);
        }
        let i = &mut config.ingest;
        for p in [&mut i.schema, &mut i.out].into_iter().flatten() {
            *p = base.join(&*p);
        }
        let pull = &mut config.pull;
        for p in [&mut pull.landing, &mut pull.quarantine]
            .into_iter()
            .flatten()
        {
            *p = base.join(&*p);
        }
        config.filter.resolve_paths(base);
        for task in &mut config.task {
            task.workdir = Some(base.join(task.workdir.as_deref().unwrap_or(Path::new("."))));
        }
        if let Some(Level::Fixed(level)) = config.prepare.level {
            check_level(level)
                .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        }
        Ok(config)
    }
}

/// `keys.trust` of the configuration file at `path` as it is now, its files relative to
/// the file's directory: what `pull --watch` puts in force on SIGHUP when its trust came from
/// the file, so that a site is added or removed without a restart.
pub fn trust_in(path: &Path) -> Result<Vec<forte_format::TrustSpec>> {
    #[derive(Deserialize)]
    struct KeysOnly {
        #[serde(default)]
        keys: KeysSection,
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let file: KeysOnly = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("config file {} is not valid: {e}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut trust = file.keys.trust;
    for spec in &mut trust {
        spec.path = base.join(&spec.path);
    }
    Ok(trust)
}

/// The keys no flag takes: the S3 server's, the tasks', the priority rules'.
const FILE_ONLY_KEYS: &[&str] = &[
    "s3.endpoint",
    "s3.access_key_id",
    "s3.secret_access_key",
    "s3.region",
];

/// What to say of a key nothing knows: the keys its section has.
fn unknown_key(key: &str, claimed: &BTreeSet<String>) -> String {
    let section = key.split_once('.').map_or("", |(s, _)| s);
    let same: Vec<&str> = claimed
        .iter()
        .map(String::as_str)
        .chain(FILE_ONLY_KEYS.iter().copied())
        .filter(|k| k.split_once('.').map_or("", |(s, _)| s) == section)
        .map(|k| k.split_once('.').map_or(k, |(_, key)| key))
        .collect();
    let place = if section.is_empty() {
        "at the top".to_owned()
    } else {
        format!("in [{section}]")
    };
    format!(
        "unknown key {key}; the keys {place} are: {} (docs/config.md lists every key)",
        same.join(", ")
    )
}

/// Levels zstd accepts; negative levels are its fast modes.
pub fn check_level(level: i32) -> Result<()> {
    if !(-7..=22).contains(&level) || level == 0 {
        bail!("zstd level {level} is out of range (use 1 to 22, or -1 to -7 for the fast modes)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_resolves_relative_paths_and_rejects_typos() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("forte.toml");
        std::fs::write(
            &file,
            "[keys]\nsign = \"k/edge.key\"\n[prepare]\npart_size = \"8MiB\"\n",
        )
        .unwrap();
        let claimed = BTreeSet::from(["send.settle".to_owned()]);
        let c = Config::load(Some(&file), &claimed).unwrap();
        assert_eq!(c.keys.sign.unwrap(), dir.path().join("k/edge.key"));
        assert_eq!(c.prepare.part_size.unwrap().0, 8 << 20);

        std::fs::write(&file, "[prepare]\npart_sise = 3\n").unwrap();
        let e = Config::load(Some(&file), &claimed).unwrap_err().to_string();
        assert!(e.contains("forte.toml") && e.contains("part_sise"), "{e}");
        std::fs::write(&file, "[prepare]\nlevel = 99\n").unwrap();
        let e = Config::load(Some(&file), &claimed).unwrap_err().to_string();
        assert!(e.contains("level 99"), "{e}");
    }
}
