//! What a command runs with, resolved once at its start: flags over the configuration file
//! over the defaults (ripgrep's split of parsed and resolved arguments).
//!
//! - [`file`]: the configuration file, every section in one place.
//! - [`flags`]: the flag groups commands share, as clap parses them.
//! - [`flag_keys`]: every flag's key in the file, and the file's values as flag defaults.
//! - [`reference`]: docs/config.md and `forte config check`, from the same keys.
//! - [`daemon`], [`send`], [`pull`]: everything one daemon command runs with, as one value.
//! - here: one resolved type per role and the one function that builds each. A command calls
//!   them first and never reads a flag group or a configuration section again, so a setting's
//!   precedence and its error message live in one place.

mod daemon;
mod file;
mod filter;
pub mod flag_keys;
mod flags;
mod pull;
pub mod reference;
mod send;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use forte_format::{EdgeKey, Identities, ReceiptKey, Recipients, TrustedCores, TrustedEdges};
use forte_ingest::{FileOptions, IngestOptions};
use forte_pipeline::{Gate, Scheduler, Scheduling};
use forte_prepare::{BundleLimits, PrepareConfig};
use forte_relay::client::{RelayClient, RelayEndpoint};
use forte_relay::pace::{Pacer, Timetable};
use forte_relay::tls::RelayTrust;
use forte_restore::RestoreConfig;

pub use daemon::Daemon;
pub use file::{check_level, Config, Connections, FileValues, Level};
pub use filter::{filter, FilterFlags, FilterSection};
pub use flags::{
    parse_codec, CoreFlags, DaemonFlags, EdgeFlags, HttpFlags, IngestFlags, PullFlags, RelayFlags,
    ScheduleFlags, SendFlags, WorkerFlags,
};
pub use pull::{pull, Destination, OnChanged, PullCommand, PullSettings};
pub use send::{send, SendCommand, SendSettings};

use crate::schedule::{Policy, PolicyName};
use crate::units::{parse_bwlimit, parse_duration, parse_rate, MOST_THREADS};

/// The most parts a prepare pass may hold in flight (each up to a part's size in memory).
const MOST_PARTS_IN_FLIGHT: usize = 4096;

/// Which core worker this is, and how long its claims last without a renewal.
#[derive(Debug, Clone)]
pub struct Worker {
    pub name: String,
    pub lease: Duration,
}

impl Worker {
    /// `HOST:PID`: unique among the workers of a catalogue, and telling a worker on this
    /// machine whether the holder of a batch is still running.
    pub fn default_name() -> String {
        format!("{}:{}", forte_usage::host_name(), std::process::id())
    }
}

/// The most uploads in flight a send may have, set or tuned (each holds a connection and up
/// to a part's bytes).
pub const MAX_UPLOADS: usize = 64;

/// The edge's: the keys that seal objects and how they are prepared.
pub struct EdgeSettings {
    pub recipients: Recipients,
    pub key: EdgeKey,
    pub prepare: PrepareConfig,
    /// Which files travel in bundles, and how large those grow.
    pub bundle: BundleLimits,
    /// Which files are taken (`--include`, `--exclude`, …, `[filter]`).
    pub filter: forte_prepare::Filter,
}

/// The core's: the keys that open objects and how they are restored.
pub struct CoreSettings {
    pub identities: Identities,
    pub trusted: TrustedKeys,
    pub restore: RestoreConfig,
}

/// The trusted edge keys, as `--trust` (or `keys.trust`) names them, read again on demand
/// (`pull --watch` on SIGHUP): each batch is checked with the keys in force when it starts.
/// When they came from the configuration file, the file's `keys.trust` is read again too,
/// so that a site can be added or removed without a restart.
pub struct TrustedKeys {
    specs: parking_lot::Mutex<Vec<forte_format::TrustSpec>>,
    /// The configuration file the specs came from, if they did.
    file: Option<PathBuf>,
    /// Whether a key given without a site may sign for every site (`--trust-any-site`).
    any_site: bool,
    current: parking_lot::RwLock<std::sync::Arc<TrustedEdges>>,
}

impl TrustedKeys {
    /// The keys `specs` name; a spec without a site is refused unless `any_site`.
    pub fn load(
        specs: Vec<forte_format::TrustSpec>,
        file: Option<PathBuf>,
        any_site: bool,
    ) -> Result<Self> {
        let keys = Self::checked(&specs, file.as_deref(), any_site)?;
        Ok(Self {
            specs: parking_lot::Mutex::new(specs),
            file,
            any_site,
            current: parking_lot::RwLock::new(std::sync::Arc::new(keys)),
        })
    }

    /// The keys in force now.
    pub fn current(&self) -> std::sync::Arc<TrustedEdges> {
        self.current.read().clone()
    }

    /// Reads the key files again and puts them in force; one that does not read, or a key
    /// newly given without a site (without `--trust-any-site`), is refused, and the keys in
    /// force stay. How many keys are in force.
    pub fn reload(&self) -> Result<usize> {
        let specs = match &self.file {
            Some(file) => file::trust_in(file)?,
            None => self.specs.lock().clone(),
        };
        if specs.is_empty() {
            bail!("keys.trust is empty: the core would refuse every batch");
        }
        let keys = Self::checked(&specs, self.file.as_deref(), self.any_site)?;
        for key in keys.unbound() {
            tracing::warn!("edge key {key} is trusted for every site: a relay could file one site's batch under another site signed with it; bind it with SITE=FILE in keys.trust");
        }
        let count = keys.count();
        *self.current.write() = std::sync::Arc::new(keys);
        *self.specs.lock() = specs;
        Ok(count)
    }

    /// The keys of `specs` (from `file`'s keys.trust, else from `--trust`), refused if one is
    /// given without a site and `any_site` does not allow it: such a key may sign for every
    /// site, so a relay could file one site's batch under another site that trusts it.
    fn checked(
        specs: &[forte_format::TrustSpec],
        file: Option<&Path>,
        any_site: bool,
    ) -> Result<TrustedEdges> {
        if let Some(spec) = specs
            .iter()
            .find(|s| s.site.is_none())
            .filter(|_| !any_site)
        {
            let path = spec.path.display();
            let given = match file {
                Some(file) => format!("keys.trust of {} gives {path}", file.display()),
                None => format!("--trust {path}"),
            };
            bail!("{given} without a site: its keys would be trusted for every site, and a relay could file one site's batch under another site signed with them; bind it with --trust SITE={path} (SITE={path} in keys.trust), or add --trust-any-site (trust_any_site = true in [pull]) to trust it for every site");
        }
        TrustedEdges::load(specs)
    }
}

/// The custody receipts' keys: the core's signing key (pull), or the core keys an edge
/// verifies receipts with (send).
pub fn receipt_key(flag: Option<PathBuf>, config: &Config) -> Result<Option<ReceiptKey>> {
    flag.or(config.keys.receipt_key.clone())
        .map(|path| ReceiptKey::load(&path))
        .transpose()
}

/// The core's receipt keys an edge trusts (`--receipt-pub`, or keys.receipt_pub).
pub fn receipt_pub(flags: &[PathBuf], config: &Config) -> Result<Option<TrustedCores>> {
    let paths = if flags.is_empty() {
        &config.keys.receipt_pub
    } else {
        flags
    };
    if paths.is_empty() {
        return Ok(None);
    }
    TrustedCores::load(paths).map(Some)
}

/// What `send` says when no site is given: it never takes one from the relay.
const NO_SITE: &str = "send needs its site: pass --site NAME or set site in [send] of the configuration file (the relay's name for the token is only checked against it)";

/// This edge's site, from its own configuration only: `--site`, or `site` in `[send]` (the
/// file's value is the flag's default, checked by the same parser, `flags::parse_site`). Never
/// from the relay: a relay operator who swapped two sites' names in tokens.toml would
/// otherwise have a fresh edge of one site sign its batches as the other's. The relay's name
/// for the token is only checked against it, once, before the first batch is prepared.
pub struct EdgeSite {
    /// None only for `send --cancel`, which signs nothing.
    name: Option<String>,
    /// Set once the relay's name for the token was compared with it.
    checked: std::sync::OnceLock<()>,
}

impl EdgeSite {
    /// The site `flag` gives (already checked as a site name by its parser); refused at once
    /// when there is none and `signs` (every `send` but `--cancel`).
    pub fn new(flag: Option<&str>, signs: bool) -> Result<Self> {
        if flag.is_none() && signs {
            bail!(NO_SITE);
        }
        Ok(Self {
            name: flag.map(str::to_string),
            checked: Default::default(),
        })
    }

    /// The site, compared once with the relay's name for the token: a relay that names it
    /// otherwise is refused (it would file the batches under its own name, where the core
    /// refuses every one). A relay that cannot be asked is not waited for: what it files
    /// where is checked at the core against the signed site anyway.
    pub fn get(&self, client: &RelayClient) -> Result<&str> {
        let site = self.name.as_deref().context(NO_SITE)?;
        if self.checked.get().is_none() {
            if let Ok(relay) = client.site() {
                if relay != site {
                    bail!("this edge's site is {site} (--site or site in [send]), but the relay's tokens.toml gives this token to site {relay}: refused, nothing is signed for {relay}; fix the relay's tokens.toml, or this edge's site if it is the one that is wrong");
                }
            }
            let _ = self.checked.set(());
        }
        Ok(site)
    }

    /// The site, without asking the relay (empty for a `--cancel` without one): what the
    /// failure hook is told.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

/// The relay as a client reaches it.
pub struct RelayLink {
    pub endpoint: RelayEndpoint,
    /// How long one request may take before it is abandoned and retried.
    pub timeout: Duration,
}

impl RelayLink {
    pub fn connect(&self) -> Result<RelayClient> {
        RelayClient::new(&self.endpoint, self.timeout)
    }
}

/// The ingest's: where rows go and how they are written.
pub struct IngestSettings {
    pub schema: PathBuf,
    pub out: PathBuf,
    pub options: IngestOptions,
}

/// The flag if given, else the configuration's value, else an error saying how to give it.
fn required<T>(flag: Option<T>, config: Option<T>, what: &str) -> Result<T> {
    flag.or(config).with_context(|| what.to_string())
}

pub fn edge(flags: &EdgeFlags, config: &Config) -> Result<EdgeSettings> {
    if flags.recipient.is_empty() {
        bail!("no recipient: pass --recipient core.pub or set keys.recipient in the config file");
    }
    let sign = required(
        flags.sign.clone(),
        config.keys.sign.clone(),
        "no signing key: pass --sign edge.key or set keys.sign in the config file",
    )?;
    let mut p = PrepareConfig::for_this_machine();
    let c = &config.prepare;
    if let Some(size) = flags.part_size.or(c.part_size.map(|s| s.0)) {
        if size == 0 || size > 1 << 31 {
            bail!("part size {size} is out of range (1 byte to 2 GiB; default 16MiB)");
        }
        p.part_size = size;
    }
    match flags.level.or(c.level) {
        Some(Level::Fixed(level)) => {
            check_level(level)?;
            p.level = level;
        }
        Some(Level::Auto) => p.adapt = Some(Level::AUTO_BOUNDS),
        None => {}
    }
    if let Some(cpu) = flags.cpu.or(c.cpu) {
        p.cpu = count_within("--cpu (prepare.cpu)", cpu, MOST_THREADS)?;
        p.parts_in_flight = p.cpu + 4;
        p.sink = Gate::fixed(p.cpu.max(2));
    }
    if let Some(n) = flags.parts_in_flight.or(c.parts_in_flight) {
        p.parts_in_flight = count_within(
            "--parts-in-flight (prepare.parts_in_flight)",
            n,
            MOST_PARTS_IN_FLIGHT,
        )?;
    }
    p.scheduling = scheduling(flags.scheduler, config)?;
    let mut bundle = BundleLimits::DEFAULT;
    if let Some(below) = flags.bundle_below.or(c.bundle_below.map(|s| s.0)) {
        bundle.below = below;
    }
    // A bundle is one part in memory: no larger than the parts of large files.
    bundle.bytes = bundle.bytes.min(p.part_size);
    Ok(EdgeSettings {
        recipients: Recipients::load_all(&flags.recipient)?,
        key: EdgeKey::load(&sign)?,
        prepare: p,
        bundle,
        filter: filter(&flags.filter, &config.filter)?,
    })
}

/// `n`, refused when 0 (which silently meant 1 before): a setting of 0 is a typo or a
/// misunderstanding, not a wish; so is one over `most` (a hundred million threads crashed the
/// process that tried to start them).
fn count_within(setting: &str, n: usize, most: usize) -> Result<usize> {
    if n == 0 {
        bail!("{setting} is 0: give 1 or more, or leave it out for the default");
    }
    if n > most {
        bail!("{setting} is {n}: give at most {most}, or leave it out for the default");
    }
    Ok(n)
}

/// The core's keys and restore. `any_site`: whether an edge key given without a site may sign
/// for every site (`pull --trust-any-site`; `unpack`, whose archives no relay files under a
/// site, always).
pub fn core(flags: &CoreFlags, config: &Config, any_site: bool) -> Result<CoreSettings> {
    if flags.identity.is_empty() {
        bail!("no identity: pass --identity core.key or set keys.identity in the config file");
    }
    let trust = if flags.trust.is_empty() {
        config.keys.trust.clone()
    } else {
        flags.trust.clone()
    };
    if trust.is_empty() {
        bail!(
            "no trusted edge key: pass --trust SITE=edge.pub or set keys.trust in the config file"
        );
    }
    let mut restore = RestoreConfig::for_this_machine();
    if let Some(cpu) = flags.cpu.or(config.prepare.cpu) {
        restore.cpu = count_within("--cpu (prepare.cpu)", cpu, MOST_THREADS)?;
        restore.parts_in_flight = restore.cpu + 4;
    }
    if let Some(writers) = flags.writers {
        restore.writers = count_within("--writers", writers, MOST_THREADS)?;
    }
    restore.scheduling = scheduling(flags.scheduler, config)?;
    Ok(CoreSettings {
        identities: Identities::load_all(&flags.identity)?,
        // From the file if the flags hold exactly what its keys.trust says (the file's values
        // are the flags' defaults): then SIGHUP reads the file's list again.
        trusted: TrustedKeys::load(
            trust.clone(),
            config
                .file
                .path
                .clone()
                .filter(|_| !trust.is_empty() && trust == config.keys.trust),
            any_site,
        )?,
        restore,
    })
}

/// Who runs the computing stages, and the test hook `FORTE_TEST_KILL_WORKERS=SHARE,SECONDS`
/// (e.g. `0.6,4`: 60 % of the pool's workers killed every 4 s; for the tests and the benchmark).
fn scheduling(flag: Option<Scheduler>, config: &Config) -> Result<Scheduling> {
    let worker_kills = match std::env::var("FORTE_TEST_KILL_WORKERS") {
        Ok(spec) => Some(
            spec.parse()
                .map_err(|e| anyhow!("FORTE_TEST_KILL_WORKERS: {e}"))?,
        ),
        Err(_) => None,
    };
    Ok(Scheduling {
        scheduler: flag.or(config.prepare.scheduler).unwrap_or_default(),
        worker_kills,
    })
}

/// The S3 endpoint and keys the configuration file gives (the environment gives the rest).
pub fn s3(config: &Config) -> forte_bucket::Credentials {
    let c = &config.s3;
    forte_bucket::Credentials {
        endpoint: c.endpoint.clone(),
        access_key_id: c.access_key_id.clone(),
        secret_access_key: c.secret_access_key.clone(),
        region: c.region.clone(),
    }
}

/// The site's own tasks (`[[task]]`) that run at one of `points` (those of the command: the
/// others may name programs only their machine has), checked: each named once, with a command
/// that can start (a program named without a slash is looked up in PATH, one with a slash in
/// its workdir), a timeout and at least one slot.
pub fn tasks(config: &Config, points: &[crate::tasks::Point]) -> Result<crate::tasks::Tasks> {
    let mut tasks = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, t) in config.task.iter().enumerate() {
        let which = if t.name.is_empty() {
            format!("[[task]] number {}", i + 1)
        } else {
            format!("[[task]] {}", t.name)
        };
        if t.name.trim().is_empty() || t.name.contains(char::is_whitespace) {
            bail!("{which} needs a name without spaces (name = \"check-header\")");
        }
        if !names.insert(t.name.as_str()) {
            bail!("{which} is named twice: give each task its own name");
        }
        if !points.contains(&t.at) {
            continue;
        }
        let argv = match &t.command {
            file::CommandLine::Argv(argv) => argv.clone(),
            // An empty line would run `sh -c ""`, which passes every batch.
            file::CommandLine::Shell(line) if line.trim().is_empty() => Vec::new(),
            file::CommandLine::Shell(line) => vec!["sh".into(), "-c".into(), line.clone()],
        };
        if argv.first().is_none_or(|p| p.trim().is_empty()) {
            bail!("{which} has an empty command: give command = [\"program\", \"arg\"] or a line for sh -c");
        }
        let workdir = t.workdir.clone().unwrap_or_else(|| ".".into());
        if !workdir.is_dir() {
            bail!(
                "{which}: its workdir {} is not a directory",
                workdir.display()
            );
        }
        if !can_start(&argv[0], &workdir) {
            bail!(
                "{which}: its command {} is not an executable file (looked up {}); fix command in the configuration file",
                argv[0],
                if argv[0].contains('/') { format!("in {}", workdir.display()) } else { "in PATH".to_owned() }
            );
        }
        let timeout = match &t.timeout {
            Some(text) => parse_duration(text)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("timeout of {which}"))?,
            None => Duration::from_secs(600),
        };
        if timeout.is_zero() {
            bail!("{which}: a timeout of 0 would kill every try; give one such as \"5m\"");
        }
        let concurrency = t.concurrency.unwrap_or(1);
        if concurrency == 0 {
            bail!("{which}: concurrency 0 would never run it; give 1 or more");
        }
        tasks.push(crate::tasks::Task {
            name: t.name.clone(),
            at: t.at,
            per: t.per,
            argv,
            workdir,
            timeout,
            retries: t.retries.unwrap_or(0),
            concurrency,
        });
    }
    if !tasks.is_empty() {
        if let Some(warning) = crate::tasks::Supervision::here().warning() {
            tracing::warn!("{warning}");
        }
    }
    Ok(crate::tasks::Tasks(tasks))
}

/// Whether `program` names an executable file: in `workdir` when it has a slash, else in PATH.
fn can_start(program: &str, workdir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(&workdir.join(program));
    }
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(program))))
}

/// This core worker's name and lease among the workers sharing a catalogue.
pub fn worker(flags: &WorkerFlags, config: &Config) -> Result<Worker> {
    let c = &config.pull;
    let name = flags
        .worker
        .clone()
        .or(c.worker.clone())
        .unwrap_or_else(Worker::default_name);
    if name.trim().is_empty() {
        bail!("the worker name is empty: pass --worker NAME or set pull.worker, or leave both out for HOST:PID");
    }
    let lease = match flags.lease.as_ref().or(c.lease.as_ref()) {
        Some(text) => {
            let lease = parse_duration(text).map_err(anyhow::Error::msg)?;
            if lease < Duration::from_secs(1) {
                bail!("lease {text} is too short: it is renewed every third of it; give 1s or more (default 30s)");
            }
            lease
        }
        None => Duration::from_secs(30),
    };
    Ok(Worker { name, lease })
}

pub fn relay(flags: &RelayFlags, config: &Config) -> Result<RelayLink> {
    let c = &config.relay;
    let url = required(
        flags.relay.clone(),
        c.url.clone(),
        "no relay: pass --relay https://HOST:PORT or set relay.url in the config file",
    )?;
    let token_file = flags.token_file.clone().or(c.token_file.clone());
    let token = match (token_file, std::env::var("FORTE_TOKEN")) {
        (Some(path), _) => std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read token file {}", path.display()))?
            .trim()
            .to_string(),
        (None, Ok(token)) => token,
        (None, Err(_)) => bail!(
            "no token: pass --token-file FILE, set relay.token_file in the config file, or set FORTE_TOKEN"
        ),
    };
    let trust = match (
        flags.relay_fingerprint.clone().or(c.fingerprint.clone()),
        flags.relay_ca.clone().or(c.ca.clone()),
    ) {
        (Some(fp), None) => RelayTrust::Fingerprint(fp),
        (None, Some(ca)) => RelayTrust::CaFile(ca),
        (Some(_), Some(_)) => bail!("give --relay-fingerprint or --relay-ca, not both"),
        (None, None) => bail!(
            "no way to trust the relay: pass --relay-fingerprint (printed by `forte relay`) or --relay-ca FILE"
        ),
    };
    Ok(RelayLink {
        endpoint: RelayEndpoint { url, token, trust },
        timeout: Duration::from_secs(flags.timeout.max(1)),
    })
}

/// The edge's part size as the config file sets it (flags aside): what `forte dashboard`
/// counts an upload's progress in.
pub fn part_size(config: &Config) -> u64 {
    config
        .prepare
        .part_size
        .map_or(PrepareConfig::DEFAULT_PART_SIZE, |s| s.0)
}

/// Where the dashboard, JSON API and metrics are served, and who may read them.
#[derive(Clone)]
pub struct HttpServe {
    pub addr: SocketAddr,
    pub access: forte_view::Access,
}

/// Where to serve the dashboard, JSON API and metrics (`--http`, else `http.listen`, else
/// `default`), and who may read them: other hosts with the token of `--http-token-file` (else
/// `http.token_file`); none if nothing says where.
pub fn http(
    flags: &HttpFlags,
    config: &Config,
    default: Option<SocketAddr>,
) -> Result<Option<HttpServe>> {
    let Some(addr) = flags.http.or(config.http.listen).or(default) else {
        return Ok(None);
    };
    let token = match flags
        .http_token_file
        .as_ref()
        .or(config.http.token_file.as_ref())
    {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the HTTP token file {}", path.display()))?
                .trim()
                .to_string();
            if token.is_empty() {
                bail!(
                    "the HTTP token file {} is empty: put a long random token in it",
                    path.display()
                );
            }
            Some(token.into())
        }
        None => None,
    };
    let names = if flags.http_name.is_empty() {
        config.http.names.clone()
    } else {
        flags.http_name.clone()
    };
    Ok(Some(HttpServe {
        addr,
        access: forte_view::Access::new(token, names),
    }))
}

/// `send`'s uploads in flight, as resolved.
pub struct Uploads {
    /// The upload sink's gate: how many uploads may be in flight.
    pub gate: Arc<Gate>,
    /// Whether the tuner turns the gate (`--connections auto`).
    pub tuned: bool,
}

/// `send`'s uploads in flight: the `--connections` flag if given, else `send.connections`,
/// else auto. Returns the sink's gate and whether the tuner turns it.
pub fn uploads(flag: Option<Connections>, config: &Config) -> Uploads {
    match flag.or(config.send.connections) {
        Some(Connections::Fixed(n)) => Uploads {
            gate: Gate::fixed(n),
            tuned: false,
        },
        // Until the tuner has measured the round trip: the setting that was the default.
        _ => Uploads {
            gate: Gate::new(16, MAX_UPLOADS),
            tuned: true,
        },
    }
}

/// `send`'s upload pacer: the `--bwlimit` flag if given, else `send.bwlimit`, and the
/// `--target-rate` flag if given, else `send.target_rate`, which caps every entry of the
/// timetable; none when neither sets a limit. Timetables are read in local time.
pub fn upload_pacer(
    bwlimit: Option<&str>,
    target_rate: Option<&str>,
    config: &Config,
) -> Result<Option<Arc<Pacer>>> {
    let timetable = match bwlimit.or(config.send.bwlimit.as_deref()) {
        Some(text) => parse_bwlimit(text).map_err(|e| anyhow!("--bwlimit (send.bwlimit): {e}"))?,
        None => Timetable::fixed(None),
    };
    let timetable = match target_rate.or(config.send.target_rate.as_deref()) {
        Some(text) => {
            let rate = parse_rate(text)
                .and_then(|r| {
                    (r > 0.0)
                        .then_some(r)
                        .ok_or_else(|| format!("{text:?} sends nothing; give a rate such as 30MB"))
                })
                .map_err(|e| anyhow!("--target-rate (send.target_rate): {e}"))?;
            timetable.capped(rate)
        }
        None => timetable,
    };
    // A timetable that never limits (`off`, or every entry off) needs no pacing at all.
    if timetable.lowest().is_none() {
        return Ok(None);
    }
    Ok(Some(Arc::new(Pacer::new(
        timetable,
        Box::new(local_minute_of_week),
    ))))
}

/// The local time as minutes since Monday 00:00, the clock a bandwidth timetable is read by.
pub fn local_minute_of_week() -> u32 {
    // SAFETY: time with a null pointer only returns the time.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm = std::mem::MaybeUninit::<libc::tm>::zeroed();
    // SAFETY: localtime_r fills the tm it is given from `now` and touches nothing else.
    if unsafe { libc::localtime_r(&now, tm.as_mut_ptr()) }.is_null() {
        return 0;
    }
    // SAFETY: it succeeded, so the struct is filled (and was zeroed before).
    let tm = unsafe { tm.assume_init() };
    // tm_wday counts from Sunday; the timetable's week starts on Monday.
    let day = (tm.tm_wday.clamp(0, 6) as u32 + 6) % 7;
    day * 24 * 60 + tm.tm_hour.clamp(0, 23) as u32 * 60 + tm.tm_min.clamp(0, 59) as u32
}

pub fn policy(flags: &ScheduleFlags, config: &Config) -> Result<Policy> {
    let c = &config.schedule;
    let max_wait = match flags.max_wait.as_ref().or(c.max_wait.as_ref()) {
        Some(text) => parse_duration(text).map_err(anyhow::Error::msg)?,
        None => Duration::from_secs(3600),
    };
    let small_share = flags.small_share.or(c.small_share).unwrap_or(0.25);
    if !(0.0..=1.0).contains(&small_share) {
        bail!("--small-share {small_share} must be between 0 and 1");
    }
    let mut rules = flags.priority.clone();
    for text in &c.priority {
        rules.push(text.parse().map_err(anyhow::Error::msg)?);
    }
    Ok(Policy::new(
        flags.policy.or(c.policy).unwrap_or(PolicyName::SjfAging),
        max_wait,
        small_share,
        rules,
    ))
}

pub fn ingest(flags: &IngestFlags, config: &Config) -> Result<IngestSettings> {
    let c = &config.ingest;
    let schema = required(
        flags.schema.clone(),
        c.schema.clone(),
        "no schema: give --schema FILE or set schema in [ingest] of the config",
    )?;
    let out = required(
        flags.out.clone(),
        c.out.clone(),
        "no outbox: give --out DIR or set out in [ingest] of the config",
    )?;
    let defaults = IngestOptions::default();
    let codec = match (&flags.codec, &c.codec) {
        (Some(codec), _) => *codec,
        (None, Some(text)) => text.parse().context("codec in [ingest] of the config")?,
        (None, None) => defaults.file.codec,
    };
    let flush_after = match (flags.flush_after, &c.flush_after) {
        (Some(d), _) => d,
        (None, Some(text)) => crate::units::parse_period(text)
            .map_err(anyhow::Error::msg)
            .context("flush_after in [ingest] of the config")?,
        (None, None) => defaults.flush_after,
    };
    // The flags are checked as they are parsed; the file's values here.
    let count =
        |flag: Option<usize>, file: Option<usize>, key: &str, (default, most)| match (flag, file) {
            (Some(n), _) => Ok(n),
            (None, Some(n)) => count_within(&format!("{key} in [ingest] of the config"), n, most),
            (None, None) => Ok(default),
        };
    let options = IngestOptions {
        rows_per_group: count(
            flags.rows_per_group,
            c.rows_per_group,
            "rows_per_group",
            (defaults.rows_per_group, usize::MAX),
        )?,
        row_groups_per_file: count(
            flags.row_groups_per_file,
            c.row_groups_per_file,
            "row_groups_per_file",
            (defaults.row_groups_per_file, usize::MAX),
        )?,
        flush_after,
        writers: count(
            flags.writers,
            c.writers,
            "writers",
            (defaults.writers, MOST_THREADS),
        )?,
        scheduling: scheduling(flags.scheduler, config)?,
        file: FileOptions {
            codec,
            plain: false,
        },
    };
    Ok(IngestSettings {
        schema,
        out,
        options,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        schedule: ScheduleFlags,
        #[command(flatten)]
        ingest: IngestFlags,
        #[command(flatten)]
        relay: RelayFlags,
        #[command(flatten)]
        worker: WorkerFlags,
    }

    fn config(text: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("forte.toml");
        std::fs::write(&file, text).unwrap();
        Config::load(Some(&file), &Default::default()).unwrap()
    }

    #[test]
    fn a_worker_is_named_and_leased_by_flag_then_file_then_default() {
        let none = Flags::parse_from(["t"]);
        let w = worker(&none.worker, &Config::default()).unwrap();
        assert_eq!(w.name, Worker::default_name());
        assert_eq!(w.lease, Duration::from_secs(30));
        let file = config("[pull]\nworker = \"core-1\"\nlease = \"2m\"\n");
        let w = worker(&none.worker, &file).unwrap();
        assert_eq!(
            (w.name.as_str(), w.lease),
            ("core-1", Duration::from_secs(120))
        );
        let flags = Flags::parse_from(["t", "--worker", "core-2", "--lease", "5s"]);
        let w = worker(&flags.worker, &file).unwrap();
        assert_eq!(
            (w.name.as_str(), w.lease),
            ("core-2", Duration::from_secs(5))
        );
        let short = Flags::parse_from(["t", "--lease", "100ms"]);
        let e = worker(&short.worker, &file).unwrap_err().to_string();
        assert!(e.contains("lease 100ms is too short"), "{e}");
    }

    #[test]
    fn a_flag_beats_the_file_which_beats_the_default() {
        let config = config(
            "[schedule]\npolicy = \"fifo\"\nmax_wait = \"2h\"\n\
             [ingest]\nschema = \"s.toml\"\nout = \"o\"\ncodec = \"lz4\"\nrows_per_group = 100\n",
        );
        let flags = Flags::parse_from(["t", "--policy", "lanes", "--rows-per-group", "7"]);
        let p = policy(&flags.schedule, &config).unwrap();
        assert_eq!(p.name, PolicyName::Lanes);
        assert_eq!(p.max_wait, Duration::from_secs(7200));
        assert_eq!(p.small_share, 0.25);
        let i = ingest(&flags.ingest, &config).unwrap();
        assert_eq!(i.options.rows_per_group, 7);
        assert_eq!(i.options.file.codec.to_string(), "lz4");
        assert_eq!(i.options.flush_after, IngestOptions::default().flush_after);
        assert!(
            i.schema.ends_with("s.toml") && i.schema.is_absolute(),
            "{:?}",
            i.schema
        );
    }

    #[test]
    fn a_key_for_every_site_needs_the_opt_in_at_start_and_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let keys = forte_format::keys::generate(dir.path()).unwrap();
        let bound: forte_format::TrustSpec = format!("mine-7={}", keys.edge_pub.display())
            .parse()
            .unwrap();
        let bare = forte_format::TrustSpec::any_site(&keys.edge_pub);
        let e = TrustedKeys::load(vec![bare.clone()], None, false)
            .err()
            .unwrap();
        let e = e.to_string();
        assert!(
            e.contains("--trust-any-site") && e.contains("--trust SITE="),
            "{e}"
        );
        let any = TrustedKeys::load(vec![bare.clone()], None, true).unwrap();
        assert_eq!(any.current().unbound().len(), 1);
        // From the file: the key newly written there without a site is refused on SIGHUP,
        // and the bound one stays in force.
        let file = dir.path().join("core.toml");
        let written =
            |spec: &str| std::fs::write(&file, format!("[keys]\ntrust = [\"{spec}\"]\n")).unwrap();
        written(&format!("mine-7={}", keys.edge_pub.display()));
        let trusted = TrustedKeys::load(vec![bound], Some(file.clone()), false).unwrap();
        written(&keys.edge_pub.display().to_string());
        let e = trusted.reload().unwrap_err().to_string();
        assert!(
            e.contains("keys.trust of") && e.contains("trust_any_site"),
            "{e}"
        );
        assert!(trusted.current().unbound().is_empty());
    }

    #[test]
    fn a_missing_setting_says_which_flag_or_key_gives_it() {
        let flags = Flags::parse_from(["t", "--relay", "https://r:1"]);
        let empty = Config::default();
        let e = ingest(&flags.ingest, &empty).err().unwrap().to_string();
        assert!(e.contains("--schema FILE") && e.contains("[ingest]"), "{e}");
        std::env::remove_var("FORTE_TOKEN");
        let e = relay(&flags.relay, &empty).err().unwrap().to_string();
        assert!(
            e.contains("--token-file") && e.contains("FORTE_TOKEN"),
            "{e}"
        );
        let flags = Flags::parse_from(["t", "--small-share", "1.5"]);
        let e = policy(&flags.schedule, &empty).err().unwrap().to_string();
        assert!(e.contains("1.5 must be between 0 and 1"), "{e}");
    }
}
