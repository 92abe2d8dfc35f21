//! `forte pull`: whole batches from the relay, verified and delivered all or nothing, then
//! acknowledged so the relay may delete them. The delivery itself is `forte_core`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::Role;
use forte_relay::api::ReadyObject;
use forte_restore::{remove_stale_staging, Existing, Restore};

use super::{Daemon, Output};
use forte_core::layout::Layout;
use forte_core::{
    check_name_free, landing, CustodySettings, Delivery, DeliveryReport, Landing, SecondCopy,
};
use forte_daemon::failures::Failures;
use forte_daemon::record::Catalog;
use forte_daemon::retry::Retry;
use forte_daemon::schedule::Policy;
use forte_daemon::settings::{
    self, Config, CoreFlags, CoreSettings, RelayFlags, ScheduleFlags, WorkerFlags,
};
use forte_daemon::signals;
use forte_daemon::tasks::Point;
use forte_daemon::units::{human, mb_per_s};

#[derive(clap::Args)]
pub struct Args {
    /// Destination: a directory, or an S3-compatible bucket, s3://BUCKET/PREFIX (endpoint and
    /// keys as for --copy-to), each object completed only once its bytes matched the file's
    /// SHA-256, which it carries as metadata `sha256`.
    #[arg(long, value_name = "DEST|s3://BUCKET/PREFIX")]
    to: PathBuf,
    /// With --to s3://…: where files are assembled and verified before they go to the bucket,
    /// and removed from once it holds them.
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    #[command(flatten)]
    relay: RelayFlags,
    #[command(flatten)]
    core: CoreFlags,
    /// Where files go under DEST: fields {site} {batch} {path} {yyyy} {mm} {dd} {hh} {date} (the
    /// date and hour, UTC, the batch arrived at its edge, as the edge signed it).
    #[arg(long, default_value = "{site}/{batch}/{path}")]
    layout: String,
    /// A second destination (analysts' copy): every delivered file is copied there too,
    /// atomically, before the relay is told it may delete. A directory, or an S3-compatible
    /// bucket, s3://BUCKET/PREFIX, with the endpoint and keys in [s3] of the configuration
    /// file or AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION: each object is completed only
    /// once its bytes matched the file's SHA-256, which it carries as metadata `sha256`.
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX")]
    copy_to: Option<String>,
    /// Where verified batches wait while the site's core tasks ([[task]] at = "core") check
    /// them, before they are promoted to DEST [config: pull.landing]
    /// [default: DEST/.forte-landing]. On DEST's filesystem: promotion is a rename.
    #[arg(long, value_name = "DIR")]
    landing: Option<PathBuf>,
    /// Where batches a task refused are kept, with the reason and the task's output
    /// [config: pull.quarantine] [default: DEST/.forte-quarantine].
    #[arg(long, value_name = "DIR")]
    quarantine: Option<PathBuf>,
    /// Concurrent downloads from the relay.
    #[arg(long, default_value_t = 4, value_parser = forte_daemon::units::parse_threads)]
    connections: usize,
    /// The core's key that signs a custody receipt for every delivered batch (receipt.key from
    /// `forte keygen`): edges delete sources only under such a receipt [config: keys.receipt_key].
    #[arg(long, value_name = "FILE")]
    receipt_key: Option<PathBuf>,
    /// Alert (failure hook and standard error) when a site's batch N has not arrived this long
    /// after a later one did: a batch dropped or held back at the relay.
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    gap_alert_after: String,
    #[command(flatten)]
    schedule: ScheduleFlags,
    #[command(flatten)]
    worker: WorkerFlags,
    #[command(flatten)]
    daemon: Daemon,
    #[command(flatten)]
    output: Output,
}

pub fn run(args: Args, config: &Config, catalog: &Catalog) -> Result<bool> {
    let layout = Layout::parse(&args.layout)?;
    let link = settings::relay(&args.relay, config)?;
    let mut core = settings::core(&args.core, config)?;
    for key in core.trusted.current().unbound() {
        eprintln!("warning: edge key {key} is trusted for every site: a relay could file one site's batch under another site signed with it; bind it with --trust SITE=FILE");
    }
    let receipt_key = settings::receipt_key(args.receipt_key.clone(), config)?;
    if receipt_key.is_none() {
        eprintln!("warning: no receipt key (--receipt-key keys/receipt.key): batches are delivered and acknowledged, but no edge deletes a source without the core's signed receipt");
    }
    let gap_after = forte_daemon::units::parse_duration(&args.gap_alert_after)
        .map_err(|e| anyhow::anyhow!("--gap-alert-after: {e}"))?;
    core.restore.existing = Existing::KeepIdentical;
    core.restore.readers = args.connections.max(1);
    let policy = settings::policy(&args.schedule, config)?;
    let order = policy.eta_order();
    let worker = settings::worker(&args.worker, config)?;
    check_name_free(&catalog.leases(), &worker)?;
    let failures = Failures {
        role: Role::Core,
        command: args.daemon.on_failure.clone(),
    };
    let _usage = forte_daemon::record::sample_usage(catalog, Role::Core);
    let client = link.connect()?;
    let credentials = settings::s3(config);
    let to = args.to.to_string_lossy().into_owned();
    let tasks = settings::tasks(config, &[Point::Core, Point::Delivered])?;
    // With a bucket destination DEST is a scratch directory, emptied as the bucket takes the
    // files: no place to keep what a task refused.
    let quarantine = args.quarantine.clone().or(config.pull.quarantine.clone());
    anyhow::ensure!(
        tasks.0.is_empty() || quarantine.is_some() || !forte_bucket::Bucket::is_url(&to),
        "with --to {to} and site tasks ([[task]]), give --quarantine DIR or pull.quarantine (on the file system of --scratch): refused batches are kept there, and the scratch directory is not a place to keep them"
    );
    let (dest, into_bucket) = if forte_bucket::Bucket::is_url(&to) {
        let scratch = args
            .scratch
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("forte-scratch"));
        std::fs::create_dir_all(&scratch).with_context(|| {
            format!("cannot create the scratch directory {}", scratch.display())
        })?;
        (scratch, Some(SecondCopy::open(&to, &credentials)?))
    } else {
        anyhow::ensure!(
            args.scratch.is_none(),
            "--scratch is for a bucket destination (--to s3://BUCKET/PREFIX); {to} is a directory, where files are assembled in place"
        );
        (args.to.clone(), None)
    };
    // Whatever a killed puller of this machine left half-staged is garbage; other workers'
    // staging is theirs.
    let stale = remove_stale_staging(&dest)?;
    if stale > 0 {
        eprintln!("removed {stale} staging directories left by an interrupted pull");
    }
    // And what one left in the landing zone, whether or not tasks are configured now: the
    // batch it was landing may be delivered without landing again.
    let landing_root = args.landing.clone().or(config.pull.landing.clone());
    let stale = landing::remove_stale(&landing::root(&dest, landing_root.clone()))?;
    if stale > 0 {
        eprintln!("removed what {stale} interrupted pulls left in the landing zone");
    }
    let retry = if args.daemon.watch {
        Retry::forever()
    } else {
        Retry::one_shot()
    };
    let copy_to = args
        .copy_to
        .as_deref()
        .map(|to| SecondCopy::open(to, &credentials))
        .transpose()?;
    let landing = if tasks.0.is_empty() {
        None
    } else {
        Some(Landing::new(tasks, &dest, landing_root, quarantine)?)
    };
    let delivery = Delivery::new(
        &client,
        retry,
        &layout,
        (&dest, into_bucket.as_ref()),
        copy_to.as_ref(),
        catalog,
        worker,
    )
    .with_landing(landing.as_ref())
    .with_custody(CustodySettings::new(
        &core.trusted,
        receipt_key.as_ref(),
        gap_after,
        (args.to.display().to_string(), failures.clone()),
    ));
    if let Some(http) = settings::http(&args.daemon.http, config, None)? {
        // The core counts progress in files, not parts: the part size is the default one.
        let part_size = forte_prepare::PrepareConfig::DEFAULT_PART_SIZE;
        forte_daemon::monitor::serve(http, Role::Core, catalog, (part_size, order))?;
    }
    // A puller killed after the relay took a batch's acknowledgement but before recording it
    // left files `delivered` that the relay no longer lists: ask the relay again.
    // One attempt: if the relay cannot be reached, the listing below retries and reports it.
    if let Ok(listed) = client.ready(true) {
        delivery.confirm_acknowledgements(&listed.iter().map(|o| o.id).collect());
    }
    let puller = Puller {
        delivery: &delivery,
        core: &core,
        policy,
        failures,
        json: args.output.json,
    };
    if args.daemon.watch {
        println!(
            "pulling from {} every {} s (Ctrl-C or SIGTERM stops after the batch under way; a restart resumes)",
            link.endpoint.url, args.daemon.interval
        );
        signals::install(
            "a batch not yet acknowledged is taken again at the next start (which removes what it staged)",
        );
        signals::end_after_grace(args.daemon.shutdown_grace);
        puller.watch(Duration::from_secs(args.daemon.interval))
    } else {
        puller.once()
    }
}

/// One run's delivery and how it restores, orders and reports batches.
struct Puller<'a> {
    delivery: &'a Delivery<'a>,
    core: &'a CoreSettings,
    policy: Policy,
    failures: Failures,
    json: bool,
}

impl Puller<'_> {
    /// A restore with the trusted keys in force now (`trusted`: [`TrustedKeys::current`]).
    fn restore<'a>(&'a self, trusted: &'a forte_format::TrustedEdges) -> Restore<'a> {
        Restore::new(self.core.restore.clone(), &self.core.identities, trusted)
    }

    /// Delivers one sealed batch and reports it; `None` when another worker holds it.
    fn pull(&self, batch: Vec<ReadyObject>) -> Option<DeliveryReport> {
        let trusted = self.core.trusted.current();
        let restore = self.restore(&trusted);
        let report = forte_daemon::monitor::while_running(
            Role::Core,
            &restore.pipeline,
            || {},
            || self.delivery.pull_batch(&restore, batch),
        )?;
        forte_daemon::monitor::batch_done(Role::Core, report.outcome());
        if !self.json {
            print_report(&report);
        }
        for e in report.error.iter().chain(&report.after_delivery) {
            self.failures.report(&report.batch, None, e);
        }
        self.delivery.alert_gaps();
        Some(report)
    }

    /// Delivers every sealed batch waiting now; true when all went.
    fn once(&self) -> Result<bool> {
        let waiting = self.delivery.waiting(&self.policy, false)?;
        let listed = waiting.len();
        let reports: Vec<DeliveryReport> =
            waiting.into_iter().filter_map(|b| self.pull(b)).collect();
        let others = listed - reports.len();
        if self.json {
            println!("{}", serde_json::to_string_pretty(&reports)?);
        } else if listed == 0 {
            println!("nothing waiting at the relay");
        }
        if others > 0 {
            eprintln!("{others} batches are being delivered by other workers; left to them");
        }
        Ok(reports.iter().all(|r| r.error.is_none()))
    }

    /// Delivers batches as they are sealed, until stopped.
    fn watch(&self, interval: Duration) -> Result<bool> {
        // While the edge is still sending a batch, the core fetches and verifies its sealed
        // files ahead, and takes the batch as soon as it is sealed: it waits on the relay's
        // long poll for no longer than this, and polls this often a relay without one.
        let busy_poll = Duration::from_millis(200);
        loop {
            if signals::take_reload() {
                match self.core.trusted.reload() {
                    Ok(n) => println!("trusted edge keys read again (SIGHUP): {n} in force for the batches from now on"),
                    Err(e) => eprintln!("error: trusted edge keys not read again (SIGHUP); the keys in force stay: {e:#}"),
                }
            }
            if signals::stop_requested() {
                println!(
                    "stopped ({}): no batch taken since; the one under way was finished",
                    signals::which()
                );
                return Ok(true);
            }
            // One batch per listing, so a batch sealed meanwhile can go next if the policy
            // says so; after a delivery look again at once.
            let mut pause = interval;
            match self.delivery.waiting(&self.policy, true) {
                Ok(batches) => {
                    let (sealed, open): (Vec<_>, Vec<_>) =
                        batches.into_iter().partition(|b| b[0].batch_sealed);
                    let delivered = |b| self.pull(b).is_some_and(|r| r.error.is_none());
                    if sealed.into_iter().any(delivered) {
                        continue;
                    }
                    if !open.is_empty() {
                        pause = busy_poll;
                        let trusted = self.core.trusted.current();
                        let restore = self.restore(&trusted);
                        let fetched = forte_daemon::monitor::while_running(
                            Role::Core,
                            &restore.pipeline,
                            || {},
                            || {
                                open.into_iter()
                                    .any(|b| self.delivery.fetch_ahead(&restore, b))
                            },
                        );
                        if fetched {
                            continue;
                        }
                    }
                }
                Err(e) => self.failures.report("", None, &format!("{e:#}")),
            }
            // Idle, or fetching ahead of a batch still being sent: the relay answers at its
            // next seal of an object or a batch, so the next object is fetched ahead and the
            // batch's seal is taken as soon as they happen (a 200 ms sleep here let the seal of
            // the last batch wait up to 200 ms, and its last objects after it). A relay
            // without long polls is polled.
            self.delivery.alert_gaps();
            if !self.delivery.wait_for_seal(pause) {
                signals::sleep_unless_stopped(pause);
            }
        }
    }
}

fn print_report(r: &DeliveryReport) {
    match &r.error {
        None => println!(
            "batch {} of {}: delivered {} files ({}) in {:.1} s ({:.1} MB/s){}, verified and acknowledged",
            r.batch,
            r.site,
            r.delivered_files,
            human(r.bytes),
            r.seconds,
            mb_per_s(r.bytes, r.seconds),
            if r.already_delivered > 0 { format!(", {} already in place", r.already_delivered) } else { String::new() }
        ),
        // The failure itself is logged once, by `Failures::report`.
        Some(_) => {
            for p in &r.rejected_parts {
                eprintln!("  reported damaged to the relay, which dropped it for the sender to upload again: {p}");
            }
        }
    }
}
