//! `pull`'s entry point: the destination prepared (what an interrupted pull left removed), the
//! core built from the resolved settings, then one pass over the batches waiting at the
//! relay, or a daemon that takes batches as they are sealed until stopped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use forte_catalog::Role;
use forte_daemon::failures::{Failure, Failures};
use forte_daemon::record::{sample_usage, Catalog};
use forte_daemon::schedule::Policy;
use forte_daemon::settings::{CoreSettings, Destination, PullSettings};
use forte_daemon::{monitor, signals};
use forte_relay::api::ReadyObject;
use forte_restore::{remove_stale_staging, Restore};

use crate::layout::Layout;
use crate::lease;
use crate::{
    check_name_free, landing, Core, CoreSetup, CustodySettings, DeliveryReport, GapAlerts, Landing,
    Replica,
};

/// What a `pull` did.
pub enum Pulled {
    /// One pass over the batches waiting at the relay.
    Pass(PullPass),
    /// Watching ended on a stop, the batch under way finished.
    Stopped,
}

/// One pass's outcome, for the command to print.
pub struct PullPass {
    /// The batches this worker delivered (or failed to).
    pub reports: Vec<DeliveryReport>,
    /// Batches listed, including those other workers hold.
    pub listed: usize,
}

impl PullPass {
    /// Listed batches other workers are delivering.
    pub fn left_to_others(&self) -> usize {
        self.listed - self.reports.len()
    }

    /// Every batch this worker took was delivered.
    pub fn ok(&self) -> bool {
        self.reports.iter().all(|r| r.error.is_none())
    }
}

/// What a watching puller stopped by a signal leaves to its next start, in words (for
/// [`signals::install`], which its command calls before the puller starts).
pub const LEFT_AT_STOP: &str =
    "a batch not yet acknowledged is taken again at the next start (which removes what it staged)";

/// Runs `pull` with `settings`: once, or watching until stopped. `on_report` is told of each
/// batch as it is delivered.
pub fn pull(
    settings: PullSettings,
    catalog: &Catalog,
    on_report: Option<fn(&DeliveryReport)>,
) -> Result<Pulled> {
    let s = settings;
    let layout = Layout::parse(&s.layout)?;
    check_name_free(&catalog.leases(), &s.worker)?;
    let _usage = sample_usage(catalog, Role::Core);
    let client = s.relay.connect()?;
    let Destinations {
        dest,
        into_bucket,
        copy_to,
    } = destinations(&s)?;
    let interrupted = lease::record_interrupted(catalog, &s.worker)?;
    if interrupted > 0 {
        tracing::warn!("{interrupted} batch(es) left pulling or checking by an interrupted pull: recorded failed; each is pulled again when the relay offers it");
    }
    let landing = if s.tasks.0.is_empty() {
        None
    } else {
        Some(Landing::new(s.tasks, &dest, s.landing, s.quarantine)?)
    };
    let core = Core::new(CoreSetup {
        client: &client,
        retry: s.daemon.retry(),
        layout: &layout,
        dest: &dest,
        into_bucket: into_bucket.as_ref(),
        copy_to: copy_to.as_ref(),
        catalog,
        worker: s.worker,
        on_changed: s.on_changed,
    })
    .with_landing(landing.as_ref())
    .with_custody(CustodySettings::new(
        &s.core.trusted,
        s.receipt_key.as_ref(),
        s.gap_alert_after,
        GapAlerts {
            destination: s.to_text,
            failures: s.daemon.failures.clone(),
        },
    ));
    if let Some(http) = s.daemon.http.clone() {
        // The core counts progress in files, not parts: the part size is the default one.
        let progress = monitor::Progress {
            part_size: forte_prepare::PrepareConfig::DEFAULT_PART_SIZE,
            order: s.policy.eta_order(),
        };
        monitor::serve(http, Role::Core, catalog, progress)?;
    }
    let default_part = forte_prepare::PrepareConfig::DEFAULT_PART_SIZE;
    monitor::publish_etas(Role::Core, catalog, default_part, s.policy.eta_order());
    // A puller killed after the relay took a batch's acknowledgement but before recording it
    // left files `delivered` that the relay no longer lists: ask the relay again.
    // One attempt: if the relay cannot be reached, the listing below retries and reports it.
    if let Ok(listed) = client.ready(true) {
        core.confirm_acknowledgements(&listed.iter().map(|o| o.id).collect());
    }
    let puller = Puller {
        core: &core,
        settings: &s.core,
        policy: s.policy,
        failures: s.daemon.failures,
        on_report,
    };
    if !s.daemon.watch {
        return puller.once().map(Pulled::Pass);
    }
    let url = &s.relay.endpoint.url;
    puller.watch_until_stopped(url, s.daemon.interval, s.daemon.shutdown_grace);
    Ok(Pulled::Stopped)
}

/// Where a pull's batches go.
struct Destinations {
    /// The directory batches are delivered into (a bucket's scratch directory when the
    /// destination is a bucket).
    dest: PathBuf,
    /// The bucket that is the destination, if it is one.
    into_bucket: Option<Replica>,
    /// The second copy (`--copy-to`), if any.
    copy_to: Option<Replica>,
}

/// Opens where `pull`'s batches go (`s.to`, `s.copy_to`), the scratch directory of a bucket
/// destination created, and removes what an interrupted pull left under the destination.
fn destinations(s: &PullSettings) -> Result<Destinations> {
    let (dest, into_bucket) = match &s.to {
        Destination::Bucket { url, scratch } => {
            std::fs::create_dir_all(scratch).with_context(|| {
                format!("cannot create the scratch directory {}", scratch.display())
            })?;
            (scratch.clone(), Some(Replica::open(url, &s.credentials)?))
        }
        Destination::Dir(dir) => (dir.clone(), None),
    };
    remove_what_was_left(&dest, s.landing.clone())?;
    let copy_to = s
        .copy_to
        .as_deref()
        .map(|to| Replica::open(to, &s.credentials))
        .transpose()?;
    Ok(Destinations {
        dest,
        into_bucket,
        copy_to,
    })
}

/// Removes what a killed puller of this machine left half-staged under `dest` (other workers'
/// staging is theirs), and what one left in the landing zone, whether or not tasks are
/// configured now: the batch it was landing may be delivered without landing again.
fn remove_what_was_left(dest: &Path, landing_root: Option<std::path::PathBuf>) -> Result<()> {
    let stale = remove_stale_staging(dest)?;
    if stale > 0 {
        tracing::warn!("removed {stale} staging directories left by an interrupted pull");
    }
    let stale = landing::remove_stale(&landing::root(dest, landing_root))?;
    if stale > 0 {
        tracing::warn!("removed what {stale} interrupted pulls left in the landing zone");
    }
    Ok(())
}

/// One run's core and how it restores, orders and reports batches.
struct Puller<'a> {
    core: &'a Core<'a>,
    settings: &'a CoreSettings,
    policy: Policy,
    failures: Failures,
    on_report: Option<fn(&DeliveryReport)>,
}

impl Puller<'_> {
    /// A restore with the trusted keys in force now (`trusted`: [`TrustedKeys::current`]).
    fn restore<'a>(&'a self, trusted: &'a forte_format::TrustedEdges) -> Restore<'a> {
        Restore::new(
            self.settings.restore.clone(),
            &self.settings.identities,
            trusted,
        )
    }

    /// Delivers one sealed batch and reports it; `None` when another worker holds it.
    fn pull(&self, batch: Vec<ReadyObject>) -> Option<DeliveryReport> {
        let batch_id = batch[0].batch.clone();
        let trusted = self.settings.trusted.current();
        let restore = self.restore(&trusted);
        let report = monitor::while_running(
            Role::Core,
            &restore.pipeline,
            || {},
            || self.core.pull_batch(&restore, batch),
        )?;
        monitor::batch_done(Role::Core, report.outcome());
        if let Some(tell) = self.on_report {
            tell(&report);
        }
        self.tell_failures(&report, &batch_id);
        self.core.alert_gaps();
        Some(report)
    }

    /// Tells the failure hook how the batch ended: failed (its name is its id when it failed
    /// before its signed inventory named it), or cleared once delivered or acknowledged as a
    /// replay; what the tasks after delivery reported is a failure of its own, which nothing
    /// retries. A quarantined batch stays failed: nothing retries it either.
    fn tell_failures(&self, report: &DeliveryReport, batch_id: &str) {
        let failure = |error| Failure {
            site: &report.site,
            batch: &report.batch,
            batch_id,
            file: None,
            error,
        };
        match &report.error {
            Some(e) => self.failures.report(&failure(e)),
            None => self.failures.cleared(&report.site, batch_id, &report.batch),
        }
        for e in &report.after_delivery {
            self.failures.report(&failure(e));
        }
    }

    /// Delivers every sealed batch waiting now.
    fn once(&self) -> Result<PullPass> {
        let waiting = self.core.waiting(&self.policy, false)?;
        let listed = waiting.len();
        let reports = waiting.into_iter().filter_map(|b| self.pull(b)).collect();
        Ok(PullPass { reports, listed })
    }

    /// Says that it watches `relay_url`, installs the handlers of the signals that stop it
    /// (the second at once, or after `shutdown_grace`), and delivers batches as they are
    /// sealed until stopped.
    fn watch_until_stopped(&self, relay_url: &str, interval: Duration, shutdown_grace: Duration) {
        tracing::info!("pulling from {} every {} s (Ctrl-C or SIGTERM stops after the batch under way; a restart resumes)",
            relay_url,
            interval.as_secs()
        );
        signals::install(LEFT_AT_STOP);
        signals::end_after_grace(shutdown_grace);
        self.watch(interval);
    }

    /// Delivers batches as they are sealed, until stopped.
    fn watch(&self, interval: Duration) {
        // While the edge is still sending a batch, the core fetches and verifies its sealed
        // files ahead, and takes the batch as soon as it is sealed: it waits on the relay's
        // long poll for no longer than this, and polls this often a relay without one.
        let busy_poll = Duration::from_millis(200);
        loop {
            if signals::take_reload() {
                match self.settings.trusted.reload() {
                    Ok(n) => tracing::info!("trusted edge keys read again (SIGHUP): {n} in force for the batches from now on"),
                    Err(e) => tracing::error!("trusted edge keys not read again (SIGHUP); the keys in force stay: {e:#}"),
                }
            }
            if signals::stop_requested() {
                tracing::info!(
                    "stopped ({}): no batch taken since; the one under way was finished",
                    signals::which()
                );
                return;
            }
            // One batch per listing, so a batch sealed meanwhile can go next if the policy
            // says so; after a delivery look again at once.
            let mut pause = interval;
            match self.core.waiting(&self.policy, true) {
                Ok(batches) => {
                    self.failures.cleared("", "", "");
                    let (sealed, open): (Vec<_>, Vec<_>) =
                        batches.into_iter().partition(|b| b[0].batch_sealed);
                    let delivered = |b| self.pull(b).is_some_and(|r| r.error.is_none());
                    if sealed.into_iter().any(delivered) {
                        continue;
                    }
                    if !open.is_empty() {
                        pause = busy_poll;
                        let trusted = self.settings.trusted.current();
                        let restore = self.restore(&trusted);
                        let fetched = monitor::while_running(
                            Role::Core,
                            &restore.pipeline,
                            || {},
                            || open.into_iter().any(|b| self.core.fetch_ahead(&restore, b)),
                        );
                        if fetched {
                            continue;
                        }
                    }
                }
                Err(e) => self.failures.report(&Failure {
                    error: &format!("{e:#}"),
                    ..Failure::default()
                }),
            }
            // Idle, or fetching ahead of a batch still being sent: the relay answers at its
            // next seal of an object or a batch, so the next object is fetched ahead and the
            // batch's seal is taken as soon as they happen (a 200 ms sleep here let the seal of
            // the last batch wait up to 200 ms, and its last objects after it). A relay
            // without long polls is polled.
            self.core.alert_gaps();
            if !self.core.wait_for_seal(pause) {
                signals::sleep_unless_stopped(pause);
            }
        }
    }
}
