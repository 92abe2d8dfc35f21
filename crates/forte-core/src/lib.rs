//! The core's delivery lifecycle: the relay's ready objects listed and grouped into batches in
//! the order the policy serves them; a batch still being sent fetched, verified and staged
//! ahead of its seal; a sealed batch verified against its signed inventory, delivered all or
//! nothing (and copied to the second destination), acknowledged whole at the relay, and every
//! step recorded in the catalogue.
//!
//! `ahead` stages objects before their batch is sealed, `deliver` takes a sealed batch to the
//! destination (through the landing zone of `landing` when the site's tasks check it first),
//! `acknowledge` tells the relay it may delete, `lease` keeps a batch this worker's alone
//! while it works on it (several workers may share one relay and catalogue).

mod acknowledge;
mod ahead;
mod bucket_writer;
mod copy;
mod custody;
mod deliver;
mod destination;
mod download;
pub mod dry_run;
mod kept_instances;
mod landed;
pub mod landing;
pub mod layout;
mod lease;
pub mod pull;
pub mod unpack;

pub use copy::Replica;
pub use custody::{CustodySettings, GapAlerts};
pub use landing::Landing;
pub use lease::check_name_free;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use forte_catalog::{now_us, BatchKey, BatchState, Leases, Role};
use forte_relay::api::ReadyObject;
use forte_relay::client::RelayClient;
use parking_lot::Mutex;
use serde::Serialize;

use crate::layout::Layout;
use forte_daemon::record::Catalog;
use forte_daemon::retry::{Operation, Retry};
use forte_daemon::schedule::{Policy, Waiting};
use forte_daemon::settings::Worker;

use ahead::Ahead;

/// What delivering one batch did.
#[derive(Debug, Serialize)]
pub struct DeliveryReport {
    pub site: String,
    pub batch: String,
    pub objects: usize,
    pub delivered_files: usize,
    /// Already in place from an earlier pull whose acknowledgement was lost.
    pub already_delivered: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub error: Option<String>,
    /// Parts found damaged at the relay and reported to it.
    pub rejected_parts: Vec<String>,
    /// Where the batch is kept when a task refused it (its reasons are the error).
    pub quarantined: Option<std::path::PathBuf>,
    /// What the tasks run after delivery reported (the batch stays delivered).
    pub after_delivery: Vec<String>,
    /// Set when the batch was an instance delivered before: acknowledged, not delivered again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
}

impl DeliveryReport {
    /// How the batch ended: delivered, quarantined by a site task, or failed.
    pub fn outcome(&self) -> BatchState {
        match (&self.error, &self.quarantined) {
            (None, _) => BatchState::Delivered,
            (Some(_), Some(_)) => BatchState::Quarantined,
            (Some(_), None) => BatchState::Failed,
        }
    }
}

/// How a batch's objects are downloaded, whether or not the puller watches: a part or a
/// manifest the relay cannot give (an answer of 500, a body cut short) fails the batch within
/// seconds instead of holding up every batch behind it; the batch is tried again on its own
/// schedule ([`Backoff`]).
pub(crate) const DOWNLOAD_RETRY: Retry = Retry::WITHIN_A_BATCH;

/// When each batch that failed may be tried again: 10 s after its first failure, doubling to
/// 10 minutes, so a batch that keeps failing never delays the others; forgotten once it
/// succeeds.
#[derive(Default)]
pub struct Backoff {
    failing: Mutex<HashMap<BatchKey, (u32, Instant)>>,
}

impl Backoff {
    const FIRST: Duration = Duration::from_secs(10);
    const MOST: Duration = Duration::from_secs(600);

    /// Records how a try of `batch` ended.
    fn after(&self, batch: &BatchKey, failed: bool) {
        let mut failing = self.failing.lock();
        if !failed {
            failing.remove(batch);
            return;
        }
        let failures = failing.get(batch).map_or(0, |f| f.0) + 1;
        let wait = Self::FIRST
            .saturating_mul(1 << (failures - 1).min(10))
            .min(Self::MOST);
        failing.insert(batch.clone(), (failures, Instant::now() + wait));
    }

    /// Whether `batch` may be tried now.
    fn due(&self, batch: &BatchKey, now: Instant) -> bool {
        self.failing
            .lock()
            .get(batch)
            .is_none_or(|(_, next)| *next <= now)
    }
}

/// What a core delivers with: the relay, the destination and its layout, the copies, the
/// catalogue and this worker.
pub struct CoreSetup<'a> {
    pub client: &'a RelayClient,
    pub retry: Retry,
    pub layout: &'a Layout,
    /// Where files are placed: the destination, or with `into_bucket` a scratch directory they
    /// leave once the bucket holds them.
    pub dest: &'a Path,
    /// The destination when it is a bucket (`--to s3://…`).
    pub into_bucket: Option<&'a Replica>,
    pub copy_to: Option<&'a Replica>,
    pub catalog: &'a Catalog,
    /// Which worker this is; its leases on batches are `Core::leases`.
    pub worker: Worker,
    /// What a later version of a batch does to the files of an earlier one.
    pub on_changed: forte_daemon::settings::OnChanged,
}

/// What every batch of one `pull` run shares: what it delivers with (`setup`), the landing
/// zone, custody, this worker's leases, and the batches fetched ahead of their seal.
pub struct Core<'a> {
    setup: CoreSetup<'a>,
    /// The landing zone and the site's tasks, where tasks are configured.
    landing: Option<&'a Landing>,
    /// Site binding, replays and receipts (`pull`; `None` in tests of delivery alone).
    custody: Option<CustodySettings<'a>>,
    leases: Leases,
    /// Batches still being sent whose sealed objects are already verified and staged, by
    /// batch key.
    ahead: Mutex<HashMap<BatchKey, Ahead>>,
    /// The relay's seal generation at the last listing, for [`Core::wait_for_seal`].
    generation: Mutex<Option<u64>>,
    /// When each failing batch is due to be tried again.
    backoff: Backoff,
}

impl<'a> Core<'a> {
    pub fn new(setup: CoreSetup<'a>) -> Self {
        Self {
            leases: setup.catalog.leases(),
            setup,
            landing: None,
            custody: None,
            ahead: Mutex::default(),
            generation: Mutex::default(),
            backoff: Backoff::default(),
        }
    }

    /// Batches go through `landing`: checked by the site's tasks before they are promoted to
    /// the destination, and checked again after.
    pub fn with_landing(self, landing: Option<&'a Landing>) -> Self {
        Self { landing, ..self }
    }

    /// Batches are filed only under the site their edge signed, replays are acknowledged and
    /// not delivered, and every delivered instance gets a signed receipt.
    pub fn with_custody(self, custody: CustodySettings<'a>) -> Self {
        Self {
            custody: Some(custody),
            ..self
        }
    }

    /// The batches ready at the relay (with `open`, also those still being sent), in the order
    /// `policy` serves them now. The relay knows batches only by opaque ids, so the name rules
    /// of the priority policy cannot apply here.
    /// Waits up to `wait` for the relay to seal anything after the last listing of
    /// [`Core::waiting`] (a long poll: one request, answered at the seal). Returns `false`
    /// at once if it cannot (a relay that predates long polls, or an error): then sleep.
    pub fn wait_for_seal(&self, wait: Duration) -> bool {
        let Some(generation) = *self.generation.lock() else {
            return false;
        };
        let until = Instant::now() + wait;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || forte_daemon::signals::stop_requested() {
                return true;
            }
            // A second at most each time, so a stop asked for meanwhile is seen within one;
            // well within the client's own timeout, so a quiet relay is not taken for a dead
            // one.
            let slice = left
                .min(Duration::from_secs(1))
                .min(self.setup.client.timeout() / 2);
            match self
                .setup
                .client
                .ready_after(false, Some((generation, slice)))
            {
                Ok((_, now)) if now != Some(generation) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    }

    /// Records a batch that failed here and that the relay no longer offers as cancelled
    /// (by its edge; a batch another worker delivered is recorded delivered, which stays), so
    /// that the dashboard's alerts stop showing it failed.
    fn record_gone(&self, key: &BatchKey) {
        let catalog = self.setup.catalog;
        let Ok(Some(row)) = catalog.batch(key) else {
            return;
        };
        if row.state != BatchState::Failed {
            return;
        }
        let record = forte_catalog::BatchRecord {
            key,
            name: &row.name,
            files: row.files as u64,
            bytes: row.bytes as u64,
            state: BatchState::Cancelled,
            arrived: None,
            detail: Some("the relay no longer offers it: cancelled at its edge"),
        };
        forte_daemon::record::note("a batch", catalog.batch_state(&record));
    }

    pub fn waiting(&self, policy: &Policy, open: bool) -> Result<Vec<Vec<ReadyObject>>> {
        let client = self.setup.client;
        let (ready, generation) =
            self.setup
                .retry
                .run(Operation::Listing, "listing of ready objects", || {
                    client.ready_after(open, None)
                })?;
        *self.generation.lock() = generation;
        let (now, epoch) = (Instant::now(), now_us() / 1_000_000);
        let waiting: Vec<_> = group_by_batch(ready)
            .into_iter()
            .map(|objects| {
                let sealed_at = objects.iter().map(|o| o.sealed_at).max().unwrap_or(0);
                let age = Duration::from_secs((epoch as u64).saturating_sub(sealed_at));
                let waiting = Waiting {
                    arrived: now.checked_sub(age).unwrap_or(now),
                    remaining: sealed_bytes(&objects),
                    priority: 0,
                };
                (waiting, objects)
            })
            .collect();
        let listed: std::collections::HashSet<BatchKey> = waiting
            .iter()
            .map(|(_, objects)| batch_key_of(objects))
            .collect();
        // A failing batch the relay no longer offers was cancelled or delivered elsewhere.
        if let Some(custody) = &self.custody {
            let offered = |site: &str, id: &str| listed.contains(&BatchKey::core(site, id));
            for (site, id) in custody.failures.clear_unlisted(offered) {
                self.record_gone(&BatchKey::core(&site, &id));
            }
        }
        if open {
            // Batches fetched ahead that the relay no longer lists were delivered by another
            // worker (this one lost its lease): their staging and leases go.
            self.ahead.lock().retain(|key, _| {
                let keep = listed.contains(key);
                if !keep {
                    tracing::warn!("batch {key}: the relay no longer offers it (another worker delivered it, or its site cancelled it); what this worker fetched ahead is dropped and the batch left to it");
                }
                keep
            });
        }
        let mut ordered = policy.order(waiting, now);
        // A batch that failed waits for its turn; the others go meanwhile.
        ordered.retain(|objects| self.backoff.due(&batch_key_of(objects), now));
        let bytes = ordered.iter().map(|b| sealed_bytes(b)).sum();
        let files = ordered.iter().map(Vec::len).sum();
        forte_daemon::monitor::queue(Role::Core, ordered.len(), files, bytes);
        Ok(ordered)
    }
}

/// The bytes on the wire of `objects`: what the relay holds of them.
fn sealed_bytes(objects: &[ReadyObject]) -> u64 {
    objects
        .iter()
        .flat_map(|o| &o.parts)
        .map(|p| p.length)
        .sum()
}

/// Objects grouped by site and batch, in the order the relay listed them (oldest first).
fn group_by_batch(ready: Vec<ReadyObject>) -> Vec<Vec<ReadyObject>> {
    let mut groups: Vec<Vec<ReadyObject>> = Vec::new();
    for object in ready {
        match groups
            .iter_mut()
            .find(|g| g[0].site == object.site && g[0].batch == object.batch)
        {
            Some(group) => group.push(object),
            None => groups.push(vec![object]),
        }
    }
    // A sealed batch is the objects its seal lists: one the relay still holds sealed under
    // the batch's id but outside its seal is of an earlier instance its edge superseded
    // (a file changed before the core pulled the batch), never part of it.
    for group in &mut groups {
        if group.iter().any(|o| o.batch_sealed) {
            group.retain(|o| o.batch_sealed);
        }
    }
    groups
}

fn batch_key_of(objects: &[ReadyObject]) -> BatchKey {
    BatchKey::core(&objects[0].site, &objects[0].batch)
}
