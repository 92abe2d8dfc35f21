//! Everything `pull` runs with, resolved in one place: the destination and its layout, the
//! relay, the core's keys and restore, the receipts it signs, the queue policy, this worker,
//! the landing zone and quarantine for the site's tasks, the second copy and how the daemon
//! runs.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use forte_catalog::Role;
use forte_format::ReceiptKey;
use forte_restore::Existing;

use super::daemon::{daemon, Daemon};
use super::{
    core, policy, receipt_key, relay, s3, tasks, worker, Config, CoreFlags, CoreSettings,
    DaemonFlags, PullFlags, RelayFlags, RelayLink, ScheduleFlags, Worker, WorkerFlags,
};
use crate::schedule::Policy;
use crate::tasks::{Point, Tasks};
use crate::units::parse_duration;

/// Where delivered files go.
pub enum Destination {
    /// A directory: files are assembled in place.
    Dir(PathBuf),
    /// An S3-compatible bucket, `s3://BUCKET/PREFIX`: files are assembled and verified in
    /// `scratch`, and removed from it once the bucket holds them.
    Bucket { url: String, scratch: PathBuf },
}

/// `pull`'s settings, resolved once.
pub struct PullSettings {
    pub to: Destination,
    /// `--to` as given: how receipts and alerts name the destination.
    pub to_text: String,
    /// The layout template under the destination (parsed by forte-core, which renders it).
    pub layout: String,
    pub relay: RelayLink,
    /// The keys that open objects, and the restore: files already there and identical are
    /// kept, and as many readers as downloads.
    pub core: CoreSettings,
    /// Signs a custody receipt for every delivered batch; none: no edge deletes its sources.
    pub receipt_key: Option<ReceiptKey>,
    /// How long a missing batch may lag a later one before it is alerted.
    pub gap_alert_after: Duration,
    /// What a later version of a batch does to the earlier files it would replace.
    pub on_changed: OnChanged,
    pub policy: Policy,
    pub worker: Worker,
    pub credentials: forte_bucket::Credentials,
    /// The core's and the delivered tasks.
    pub tasks: Tasks,
    /// The landing zone's root if given (`--landing`, `pull.landing`); else under DEST.
    pub landing: Option<PathBuf>,
    /// Where refused batches are kept if given (`--quarantine`, `pull.quarantine`).
    pub quarantine: Option<PathBuf>,
    /// The second copy, a directory or `s3://BUCKET/PREFIX`.
    pub copy_to: Option<String>,
    pub daemon: Daemon,
}

impl PullSettings {
    /// What an operator should know about these settings before the first batch.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self.core.trusted.current().unbound().into_iter().map(|key| format!("edge key {key} is trusted for every site: a relay could file one site's batch under another site signed with it; bind it with --trust SITE=FILE")).collect();
        if self.receipt_key.is_none() {
            warnings.push("no receipt key (--receipt-key keys/receipt.key): batches are delivered and acknowledged, but no edge deletes a source without the core's signed receipt".into());
        }
        warnings
    }
}

/// What a later version of a batch (an instance of a higher generation) does to the files an
/// earlier one delivered, where its files differ (`--on-changed`, `pull.on_changed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnChanged {
    /// The new version goes in place atomically; the earlier one is kept aside.
    #[default]
    Replace,
    /// The earlier version stays; the later instance is refused once, explicitly.
    KeepFirst,
}

impl std::str::FromStr for OnChanged {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "replace" => Ok(Self::Replace),
            "keep-first" => Ok(Self::KeepFirst),
            other => Err(format!(
                "{other:?} is not a policy: give replace (the new version in place, the earlier kept under DEST/.forte-replaced) or keep-first"
            )),
        }
    }
}

/// The flag groups `pull` parses.
pub struct PullCommand<'a> {
    pub pull: &'a PullFlags,
    pub relay: &'a RelayFlags,
    pub core: &'a CoreFlags,
    pub schedule: &'a ScheduleFlags,
    pub worker: &'a WorkerFlags,
    pub daemon: &'a DaemonFlags,
}

pub fn pull(flags: PullCommand, config: &Config) -> Result<PullSettings> {
    let f = flags.pull;
    let relay = relay(flags.relay, config)?;
    let mut core = core(flags.core, config, f.trust_any_site)?;
    core.restore.existing = Existing::KeepIdentical;
    core.restore.readers = f.connections.max(1);
    let receipt_key = receipt_key(f.receipt_key.clone(), config)?;
    let gap_alert_after =
        parse_duration(&f.gap_alert_after).map_err(|e| anyhow!("--gap-alert-after: {e}"))?;
    let on_changed = f
        .on_changed
        .parse()
        .map_err(|e| anyhow!("--on-changed: {e}"))?;
    let policy = policy(flags.schedule, config)?;
    let worker = worker(flags.worker, config)?;
    let to_text = f.to.to_string_lossy().into_owned();
    let tasks = tasks(config, &[Point::Core, Point::Delivered])?;
    let quarantine = f.quarantine.clone().or(config.pull.quarantine.clone());
    let into_bucket = forte_bucket::Bucket::is_url(&to_text);
    // With a bucket destination DEST is a scratch directory, emptied as the bucket takes the
    // files: no place to keep what a task refused.
    ensure!(
        tasks.0.is_empty() || quarantine.is_some() || !into_bucket,
        "with --to {to_text} and site tasks ([[task]]), give --quarantine DIR or pull.quarantine (on the file system of --scratch): refused batches are kept there, and the scratch directory is not a place to keep them"
    );
    let to = if into_bucket {
        Destination::Bucket {
            url: to_text.clone(),
            scratch: f
                .scratch
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join("forte-scratch")),
        }
    } else {
        ensure!(
            f.scratch.is_none(),
            "--scratch is for a bucket destination (--to s3://BUCKET/PREFIX); {to_text} is a directory, where files are assembled in place"
        );
        Destination::Dir(f.to.clone())
    };
    Ok(PullSettings {
        to,
        to_text,
        layout: f.layout.clone(),
        relay,
        core,
        receipt_key,
        gap_alert_after,
        on_changed,
        policy,
        worker,
        credentials: s3(config),
        tasks,
        landing: f.landing.clone().or(config.pull.landing.clone()),
        quarantine,
        copy_to: f.copy_to.clone(),
        daemon: daemon(flags.daemon, Role::Core, config)?,
    })
}
