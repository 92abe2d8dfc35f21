//! The flag groups commands share, as clap parses them. A flag that the configuration file can
//! also set is an `Option` here, so that an absent flag falls through to the file; the
//! defaults are applied only when resolving (`super`), and the help text names both.

use std::path::PathBuf;

use forte_ingest::Codec;
use forte_pipeline::Scheduler;

use super::file::{Connections, Level};
use crate::schedule::{PolicyName, PriorityRule};
use crate::units::parse_size;

/// The edge's keys and its prepare pass; `pack` and `send`.
#[derive(clap::Args)]
pub struct EdgeFlags {
    /// age recipient file of the core (core.pub); repeat it (or list files in the config) to
    /// encrypt to several, as while the core's key is rotated [config: keys.recipient].
    #[arg(long, value_name = "FILE")]
    pub(super) recipient: Vec<PathBuf>,
    /// Ed25519 signing key of this edge (edge.key) [config: keys.sign].
    #[arg(long, value_name = "FILE")]
    pub(super) sign: Option<PathBuf>,
    /// Raw bytes per part; `send` cuts the last objects of a one-shot send smaller, down to
    /// 2 MiB, so its uploads finish together [config: prepare.part_size] [default: 16MiB].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub(super) part_size: Option<u64>,
    /// zstd level, or auto: adapted between 1 and 9 to whichever of CPU and link is slower
    /// [config: prepare.level] [default: 3].
    #[arg(long, allow_negative_numbers = true, value_name = "LEVEL|auto")]
    pub(super) level: Option<Level>,
    /// CPU budget: workers computing at once [config: prepare.cpu] [default: all cores].
    #[arg(long)]
    pub(super) cpu: Option<usize>,
    /// Parts held in memory at once [config: prepare.parts_in_flight] [default: cpu + 4].
    #[arg(long)]
    pub(super) parts_in_flight: Option<usize>,
    /// Who runs the computing stages: ordo, one pool of workers choosing the next stage by its
    /// queues (a worker that dies is replaced); threads, each stage its own; or rayon's
    /// work-stealing pool (the benchmark's baseline) [config: prepare.scheduler] [default: ordo].
    #[arg(long, value_name = "ordo|threads|rayon")]
    pub(super) scheduler: Option<Scheduler>,
    /// Files smaller than this travel together in bundles (a tar stream per object), so many
    /// small files cost one upload instead of two round trips each; 0 sends every file alone
    /// [config: prepare.bundle_below] [default: 1MiB].
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub(super) bundle_below: Option<u64>,
    #[command(flatten)]
    pub(super) filter: super::FilterFlags,
}

/// The core's keys and its restore pass; `unpack` and `pull`.
#[derive(clap::Args)]
pub struct CoreFlags {
    /// age identity file of the core (core.key); repeat it (or list files in the config) to
    /// decrypt with several, as while its key is rotated [config: keys.identity].
    #[arg(long, value_name = "FILE")]
    pub(super) identity: Vec<PathBuf>,
    /// Trusted edge public key (edge.pub), bound to the site it may sign for as SITE=FILE
    /// (FILE alone: any site, which pull takes only with --trust-any-site, since a relay could
    /// then file one site's batch under another site that shares the key); repeat for
    /// several edges or sites [config: keys.trust].
    #[arg(long, value_name = "[SITE=]FILE")]
    pub(super) trust: Vec<forte_format::TrustSpec>,
    /// CPU budget [config: prepare.cpu] [default: all cores].
    #[arg(long)]
    pub(super) cpu: Option<usize>,
    /// Who runs the computing stages: ordo, threads or rayon (see pack --help)
    /// [config: prepare.scheduler] [default: ordo].
    #[arg(long, value_name = "ordo|threads|rayon")]
    pub(super) scheduler: Option<Scheduler>,
    /// Files written to the destination at once [default: 2] [config: pull.writers].
    #[arg(long, value_name = "N")]
    pub(super) writers: Option<usize>,
}

/// Which core worker this is, among those sharing one catalogue; `pull`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WorkerFlags {
    /// This worker's name in the catalogue's leases and lineage [config: pull.worker]
    /// [default: HOST:PID]. Workers sharing one catalogue need different names.
    #[arg(long, value_name = "NAME")]
    pub(super) worker: Option<String>,
    /// How long a claimed batch stays this worker's without a renewal: a worker that died or
    /// stalled loses its batches to the others after this [config: pull.lease] [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub(super) lease: Option<String>,
}

/// The dashboard, JSON API and metrics; `send`, `pull`, `relay` and `dashboard`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HttpFlags {
    /// Serve the web dashboard, the JSON API (docs/api.md) and Prometheus metrics at
    /// http://ADDR/, e.g. 127.0.0.1:8080 [config: http.listen]. This machine is served;
    /// other hosts need --http-token-file.
    #[arg(long, alias = "metrics", value_name = "ADDR")]
    pub(super) http: Option<std::net::SocketAddr>,
    /// File holding the token other hosts must send (Authorization: Bearer TOKEN, or
    /// ?token=TOKEN in a browser); without it only this machine is served
    /// [config: http.token_file].
    #[arg(long, value_name = "FILE")]
    pub(super) http_token_file: Option<PathBuf>,
    /// A host name the dashboard is reached by (repeatable) [config: http.names]: requests
    /// naming another host are refused (against DNS rebinding); its addresses, and
    /// localhost when it serves loopback, are always answered.
    #[arg(long, value_name = "NAME")]
    pub(super) http_name: Vec<String>,
}

/// Where the relay is and how to trust it; `send` and `pull`.
#[derive(clap::Args, Debug, Clone)]
pub struct RelayFlags {
    /// Relay URL, e.g. https://relay.example:8443 [config: relay.url].
    #[arg(long, value_name = "URL")]
    pub(super) relay: Option<String>,
    /// File holding this node's bearer token [config: relay.token_file] [env: FORTE_TOKEN for the token itself].
    #[arg(long, value_name = "FILE")]
    pub(super) token_file: Option<PathBuf>,
    /// SHA-256 fingerprint of the relay's certificate, as `forte relay` prints it [config: relay.fingerprint].
    #[arg(long, value_name = "HEX")]
    pub(super) relay_fingerprint: Option<String>,
    /// CA certificate (PEM) the relay's certificate chains to, instead of a fingerprint [config: relay.ca].
    #[arg(long, value_name = "FILE")]
    pub(super) relay_ca: Option<PathBuf>,
    /// Seconds a request to the relay may take before it is abandoned and retried: how long a
    /// stalled link goes unnoticed. A whole part must cross the link within it [config: relay.timeout].
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) timeout: u64,
}

/// The order of batches; `send` and `pull`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ScheduleFlags {
    /// Order of batches [config: schedule.policy] [default: sjf-aging].
    #[arg(long, value_enum)]
    pub(super) policy: Option<PolicyName>,
    /// With sjf-aging, priority and lanes: no batch waits longer than this
    /// [config: schedule.max_wait] [default: 1h].
    #[arg(long, value_name = "DURATION")]
    pub(super) max_wait: Option<String>,
    /// With lanes: the share of bytes reserved for the smallest batch
    /// [config: schedule.small_share] [default: 0.25].
    #[arg(long, value_name = "FRACTION")]
    pub(super) small_share: Option<f64>,
    /// With priority: PATTERN=N gives matching batch names priority N (repeatable; a number
    /// in the batch's .ready marker wins) [config: schedule.priority, added to these].
    #[arg(long = "priority", value_name = "PATTERN=N")]
    pub(super) priority: Vec<PriorityRule>,
}

/// Where ingested rows go and how they are written; `ingest`.
#[derive(clap::Args, Debug)]
pub struct IngestFlags {
    /// The rows' layout (TOML; see below) [config: ingest.schema].
    #[arg(long, value_name = "FILE")]
    pub(super) schema: Option<PathBuf>,
    /// Where finished files appear, one batch directory each [config: ingest.out].
    #[arg(long, value_name = "DIR")]
    pub(super) out: Option<PathBuf>,
    /// Page codec: zstd (level 1), zstd:LEVEL, lz4, snappy or none [config: ingest.codec]
    /// [default: zstd].
    #[arg(long, value_parser = parse_codec)]
    pub(super) codec: Option<Codec>,
    /// Rows per row group; each stream holds two row groups in memory
    /// [config: ingest.rows_per_group] [default: 65536].
    #[arg(long, value_name = "N", value_parser = crate::units::parse_count)]
    pub(super) rows_per_group: Option<usize>,
    /// Close and publish a file after this many row groups [config: ingest.row_groups_per_file]
    /// [default: 16].
    #[arg(long, value_name = "N", value_parser = crate::units::parse_count)]
    pub(super) row_groups_per_file: Option<usize>,
    /// Write a partly filled row group after this long without filling, e.g. 10s
    /// [config: ingest.flush_after] [default: 10s].
    #[arg(long, value_parser = crate::units::parse_period, value_name = "DURATION")]
    pub(super) flush_after: Option<std::time::Duration>,
    /// Writers of row groups at once (the write stage's CPU budget) [config: ingest.writers]
    /// [default: one per core].
    #[arg(long, value_name = "N", value_parser = crate::units::parse_threads)]
    pub(super) writers: Option<usize>,
    /// Who runs the writers: ordo, threads or rayon (see pack --help)
    /// [config: prepare.scheduler] [default: ordo].
    #[arg(long, value_name = "ordo|threads|rayon")]
    pub(super) scheduler: Option<Scheduler>,
}

/// A site name as `--site` (or `site` in `[send]`) gives it, by the rule the core checks
/// signed sites with: a name the core would refuse for ever is refused before anything is
/// signed or uploaded, the error naming the flag or the key.
fn parse_site(text: &str) -> Result<String, String> {
    forte_format::check_site_name(text)?;
    Ok(text.to_string())
}

/// A Parquet page codec as a flag value.
pub fn parse_codec(text: &str) -> Result<Codec, String> {
    text.parse().map_err(|e: anyhow::Error| format!("{e:#}"))
}

/// Running as a daemon, and telling people about failures; `send` and `pull`.
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonFlags {
    /// Keep running: handle batches as they become ready, retrying network failures forever [config: daemon.watch].
    #[arg(long)]
    pub watch: bool,
    /// Seconds between looks for new work with --watch [config: daemon.interval].
    #[arg(long, default_value_t = 10, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(super) interval: u64,
    /// With --watch, SIGTERM or SIGINT stops taking new batches and lets those under way
    /// finish for this long, then ends with status 0 (a second signal ends it at once) [config: daemon.shutdown_grace].
    #[arg(long, value_parser = crate::units::parse_duration, value_name = "DURATION", default_value = "60s")]
    pub(super) shutdown_grace: std::time::Duration,
    /// Command run (sh -c) when a batch (or one file of it) starts failing, FORTE_EVENT=failed;
    /// while it keeps failing, again after --on-failure-repeat, then twice that, doubling to
    /// at most a day, FORTE_EVENT=failing; and once when it clears (delivered, sent or
    /// cancelled), FORTE_EVENT=cleared. FORTE_ROLE, FORTE_SITE, FORTE_BATCH (the batch's
    /// name), FORTE_BATCH_ID (its id at the relay), FORTE_FILE, FORTE_ERROR and
    /// FORTE_FAILURES (failed attempts since it started) describe it. Hooks run one at a time
    /// beside the transfer, each killed after 60 s. The state is kept in memory: a restarted
    /// daemon says failed once more for what still fails [config: alerts.on_failure].
    #[arg(long, value_name = "CMD")]
    pub(super) on_failure: Option<String>,
    /// While a failure persists, run --on-failure again after this long, then after twice
    /// that, doubling to at most 24 h [config: alerts.repeat_after] [default: 1h].
    #[arg(long, value_parser = crate::units::parse_duration, value_name = "DURATION", default_value = "1h")]
    pub(super) on_failure_repeat: std::time::Duration,
    #[command(flatten)]
    pub(super) http: HttpFlags,
}

impl DaemonFlags {
    /// Between looks for new work while watching.
    pub fn interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.interval)
    }
}

/// `send`'s own flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SendFlags {
    /// Seconds without any change after which a batch without a .ready marker is complete [config: send.settle].
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub(super) settle: u64,
    /// Uploads in flight to the relay. auto starts from this relay's history (per size of
    /// request and hour of day), else from the measured round trip, and is tuned on the
    /// goodput while the transfer runs (every 2 s, or longer until 8 requests went out), each
    /// change logged with its reason; a number fixes it [config: send.connections]
    /// [default: auto].
    #[arg(long, value_name = "N|auto")]
    pub(super) connections: Option<Connections>,
    /// Hold the upload at this rate (30MB, 240mbit) by pacing every upload, never by letting
    /// requests time out; under a --bwlimit timetable, the lower of the two holds
    /// [config: send.target_rate].
    #[arg(long, value_name = "RATE")]
    pub(super) target_rate: Option<String>,
    /// Upload bandwidth limit, held by pacing every upload (never by letting requests time
    /// out): a rate (20MB, 160mbit), off, or a weekly timetable in local time,
    /// "08:00,2MB 19:00,off" or "Mon-08:00,2MB Sat-00:00,off" [config: send.bwlimit] [default: off].
    #[arg(long, value_name = "RATE|TIMETABLE")]
    pub(super) bwlimit: Option<String>,
    /// With --watch: delete a batch's source files once the core's signed custody receipt
    /// (checked with --receipt-pub) lists every one with the SHA-256 its bytes still have [config: send.delete_after_ack].
    #[arg(long, requires = "watch")]
    pub(super) delete_after_ack: bool,
    /// The core's receipt key (receipt.pub from `forte keygen`); repeat for several cores.
    /// --delete-after-ack deletes only under receipts signed by one of them
    /// [config: keys.receipt_pub].
    #[arg(long, value_name = "FILE")]
    pub(super) receipt_pub: Vec<PathBuf>,
    /// This edge's site, signed into every batch so the core files it under no other site;
    /// `send` needs it (`--cancel` aside) and never takes it from the relay, whose name for
    /// this token is only checked against it: a mismatch is refused before anything is
    /// prepared [config: send.site].
    #[arg(long, value_name = "NAME", value_parser = parse_site)]
    pub(super) site: Option<String>,
    /// Cancel this batch (a directory name of the inbox; repeatable) instead of sending: the
    /// relay deletes what it holds of it that the core has not taken, so the core never gets
    /// it, and later runs skip it. The source is untouched; touch its .ready marker to send it
    /// again. For a batch too large for the relay, or sent by mistake [per run].
    #[arg(long, value_name = "BATCH", conflicts_with_all = ["watch", "delete_after_ack"])]
    pub(super) cancel: Vec<String>,
}

/// `pull`'s own flags.
#[derive(clap::Args, Debug, Clone)]
pub struct PullFlags {
    /// Destination: a directory, or an S3-compatible bucket, s3://BUCKET/PREFIX (endpoint and
    /// keys as for --copy-to), each object completed only once its bytes matched the file's
    /// SHA-256, which it carries as metadata `sha256` [config: pull.to].
    #[arg(long, value_name = "DEST|s3://BUCKET/PREFIX")]
    pub(super) to: PathBuf,
    /// With --to s3://…: where files are assembled and verified before they go to the bucket,
    /// and removed from once it holds them [config: pull.scratch].
    #[arg(long, value_name = "DIR")]
    pub(super) scratch: Option<PathBuf>,
    /// Where files go under DEST: fields {site} {batch} {path} {yyyy} {mm} {dd} {hh} {date} (the
    /// date and hour, UTC, the batch arrived at its edge, as the edge signed it) [config: pull.layout].
    #[arg(long, default_value = "{site}/{batch}/{path}")]
    pub(super) layout: String,
    /// A second destination (analysts' copy): every delivered file is copied there too,
    /// atomically, before the relay is told it may delete. A directory, or an S3-compatible
    /// bucket, s3://BUCKET/PREFIX, with the endpoint and keys in [s3] of the configuration
    /// file or AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION: each object is completed only
    /// once its bytes matched the file's SHA-256, which it carries as metadata `sha256` [config: pull.copy_to].
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    pub(super) copy_to: Option<String>,
    /// Where verified batches wait while the site's core tasks ([[task]] at = "core") check
    /// them, before they are promoted to DEST [config: pull.landing]
    /// [default: DEST/.forte-landing]. On DEST's filesystem: promotion is a rename.
    #[arg(long, value_name = "DIR")]
    pub(super) landing: Option<PathBuf>,
    /// Where batches a task refused are kept, with the reason and the task's output
    /// [config: pull.quarantine] [default: DEST/.forte-quarantine].
    #[arg(long, value_name = "DIR")]
    pub(super) quarantine: Option<PathBuf>,
    /// Concurrent downloads from the relay [config: pull.connections].
    #[arg(long, default_value_t = 4, value_parser = crate::units::parse_threads)]
    pub(super) connections: usize,
    /// The core's key that signs a custody receipt for every delivered batch (receipt.key from
    /// `forte keygen`): edges delete sources only under such a receipt [config: keys.receipt_key].
    #[arg(long, value_name = "FILE")]
    pub(super) receipt_key: Option<PathBuf>,
    /// Trust an edge key given without a site (--trust FILE, or FILE alone in keys.trust) for
    /// every site. Without this such a key is refused at the start: a relay could file one
    /// site's batch under another site signed with it; bind each key to its site with --trust
    /// SITE=FILE instead [config: pull.trust_any_site].
    #[arg(long)]
    pub(super) trust_any_site: bool,
    /// What a later version of a batch does to the files of an earlier one it delivered (a file
    /// changed after it was sent): `replace` puts the new version in place atomically and
    /// keeps the earlier one under DEST/.forte-replaced; `keep-first` keeps the earlier one and
    /// refuses the later version once, with a signed refusal the edge reports, so nothing waits
    /// at the relay [config: pull.on_changed].
    #[arg(long, value_name = "replace|keep-first", default_value = "replace")]
    pub(super) on_changed: String,
    /// Alert (failure hook and standard error) when a site's batch N has not arrived this long
    /// after a later one did: a batch dropped or held back at the relay [config: pull.gap_alert_after].
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    pub(super) gap_alert_after: String,
}
