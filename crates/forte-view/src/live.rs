//! What a daemon knows that its catalogue does not: its pipelines' stages and its batch queue
//! now, and its Prometheus metrics. `forte dashboard` has none of it.

use std::collections::HashMap;

use forte_catalog::Role;
use serde::Serialize;

/// A pipeline stage now: `GET /api/v1/stages`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageView {
    pub role: Role,
    pub stage: &'static str,
    /// What its items are (`object`, `part`).
    pub item: &'static str,
    pub workers: usize,
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// `queue_depth / queue_capacity`, 0 to 1.
    pub fill: f64,
    pub items: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub busy_s: f64,
    pub service_rate_bytes_per_second: f64,
}

/// A daemon's batch queue: what it admitted and has not finished.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct QueueView {
    pub role: Role,
    pub batches: usize,
    pub files: usize,
    pub bytes: u64,
}

/// What the edge has put on the link and has ready for it, in sealed bytes: what the link
/// paces. Batches compress differently (the test set's first ones 4-8x, the next 3x), so an
/// ETA counted in raw bytes at the rate the first ones went overstates the next ones' pace;
/// counted in these it does not. Only the edge's daemon knows the sealed size of a part
/// before it is sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WireView {
    /// Sealed bytes the uploads' connections have taken since the daemon started, counted as
    /// they go (every attempt's): the link's rate, which the parts the relay accepted tell
    /// only seconds late, a part at a time.
    pub sent: u64,
    /// When the link last went from idle to busy (a part prepared with none waiting; µs since
    /// the epoch), and `sent` then: the node's rate runs from there, not from the last look
    /// before it.
    pub resumed: Option<(i64, u64)>,
    /// Raw and sealed bytes of every part prepared since the daemon started: the node's
    /// compression, for a batch with none prepared yet.
    pub prepared_raw: u64,
    pub prepared_sealed: u64,
    /// Of the parts prepared whose compression was estimated before (see [`BatchWire`]): the
    /// estimate's sealed bytes and theirs; how far the estimate is off at the level in use.
    pub estimated_prepared: (u64, u64),
    /// Per running batch (its catalogue key): what it has prepared.
    pub batches: HashMap<String, BatchWire>,
    /// The parts prepared and not yet sent, in the order they were prepared: the order the
    /// uploads take them in, whatever their batch.
    pub waiting: Vec<WaitingPart>,
}

/// A running batch's parts prepared at the edge, in raw and sealed bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchWire {
    /// Every part prepared so far, sent or not: the batch's compression.
    pub prepared_raw: u64,
    pub prepared_sealed: u64,
    /// Raw bytes of its parts prepared and not yet sent.
    pub waiting_raw: u64,
    /// Its raw bytes not prepared yet and their sealed bytes as estimated before it was
    /// prepared, from windows of its bytes compressed at zstd's fastest level
    /// (`forte_prepare::probe`): a batch whose data changes along the way (logs, then video)
    /// compresses unlike its parts so far.
    pub estimated_left: (u64, u64),
    /// Of its parts prepared that were estimated: the estimate's sealed bytes and theirs.
    pub estimated_prepared: (u64, u64),
}

/// A part prepared at the edge and not yet sent.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingPart {
    /// Its batch's catalogue key.
    pub batch: String,
    /// Its place in the order parts were prepared.
    pub seq: u64,
    pub sealed: u64,
    /// If it is being uploaded: the bytes of it its connection has taken so far (a retried
    /// upload counts from its start again).
    pub sending: Option<u64>,
}

/// What a relay holds now, for its page and `GET /api/v1/relay`: read from its store as
/// `forte relay-store list` reads it, so the two show the same numbers.
#[derive(Debug, Clone, Serialize, Default)]
pub struct RelayHoldings {
    pub at_us: i64,
    /// Per site and batch, oldest change first within a site.
    pub batches: Vec<HeldBatch>,
    /// Per site: what it holds against its quota.
    pub sites: Vec<SiteUsage>,
    /// Most bytes one site may hold (`--quota-per-site`), if limited.
    pub quota_per_site: Option<u64>,
    pub shares: ShareView,
    /// Objects the core acknowledged (then deleted here) since the relay started.
    pub acknowledged_objects: u64,
}

/// What the relay holds of one batch of one site.
#[derive(Debug, Clone, Serialize)]
pub struct HeldBatch {
    pub site: String,
    /// The batch's id at the relay; `None` for objects not sealed into a batch yet.
    pub batch: Option<String>,
    /// `uploading` (its objects are arriving, the batch not sealed yet) or `sealed` (waiting for
    /// the core).
    pub state: &'static str,
    pub objects: usize,
    pub bytes: u64,
    /// Seconds since its oldest object's last change.
    pub age_s: u64,
    /// Its newest change, µs since the epoch.
    pub changed_us: i64,
}

/// What one site holds at the relay against its quota.
#[derive(Debug, Clone, Serialize)]
pub struct SiteUsage {
    pub site: String,
    pub bytes: u64,
    pub objects: usize,
    /// `bytes` over the quota, 0 to 1 (and beyond), if there is one.
    pub quota_used: Option<f64>,
    /// The ingress rate the site got lately, bytes per second (0: not sending).
    pub rate_bytes_per_second: f64,
}

/// The relay's fair shares of its ingress now.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ShareView {
    /// Sites are held to fair shares (not `--no-fair-shares`).
    pub fair: bool,
    pub sites_sending: usize,
    /// The rate each sending site is held to; `None` while fewer than two send.
    pub cap_bytes_per_second: Option<f64>,
}

impl HeldBatch {
    /// A batch the store holds: its site, id (`None`: objects not sealed into a batch yet),
    /// whether it is sealed, its objects and bytes, and its oldest and newest change (seconds
    /// since the epoch), as `forte relay-store list` reads them.
    pub fn new(
        site: String,
        batch: Option<String>,
        sealed: bool,
        (objects, bytes): (usize, u64),
        (oldest, newest): (u64, u64),
    ) -> Self {
        let now_s = (forte_catalog::now_us() / 1_000_000).max(0) as u64;
        Self {
            site,
            batch,
            state: if sealed { "sealed" } else { "uploading" },
            objects,
            bytes,
            age_s: now_s.saturating_sub(oldest),
            changed_us: newest as i64 * 1_000_000,
        }
    }
}

impl ShareView {
    /// The shares in force: `cap` over the sites whose `rates` were last measured.
    pub fn new(fair: bool, cap: Option<f64>, rates: &[(String, f64)]) -> Self {
        Self {
            fair,
            sites_sending: rates.len(),
            cap_bytes_per_second: cap,
        }
    }
}

impl RelayHoldings {
    /// The page's answer from the store's `batches`, each site's usage summed from them.
    pub fn of(
        batches: impl Iterator<Item = HeldBatch>,
        quota_per_site: Option<u64>,
        shares: ShareView,
        rates: &[(String, f64)],
        acknowledged_objects: u64,
    ) -> Self {
        let mut batches: Vec<HeldBatch> = batches.collect();
        batches.sort_by(|a, b| {
            (&a.site, std::cmp::Reverse(a.age_s)).cmp(&(&b.site, std::cmp::Reverse(b.age_s)))
        });
        let mut sites: Vec<SiteUsage> = vec![];
        for b in &batches {
            match sites.iter_mut().find(|s| s.site == b.site) {
                Some(s) => {
                    s.bytes += b.bytes;
                    s.objects += b.objects;
                }
                None => sites.push(SiteUsage {
                    site: b.site.clone(),
                    bytes: b.bytes,
                    objects: b.objects,
                    quota_used: None,
                    rate_bytes_per_second: 0.0,
                }),
            }
        }
        for s in &mut sites {
            s.quota_used = quota_per_site.map(|q| s.bytes as f64 / q as f64);
            s.rate_bytes_per_second = rates
                .iter()
                .find(|(site, _)| *site == s.site)
                .map_or(0.0, |(_, rate)| *rate);
        }
        Self {
            at_us: forte_catalog::now_us(),
            batches,
            sites,
            quota_per_site,
            shares,
            acknowledged_objects,
        }
    }

    /// Batches of `site` sealed and waiting for the core.
    pub fn sealed_batches(&self, site: &str) -> usize {
        self.batches
            .iter()
            .filter(|b| b.site == site && b.state == "sealed")
            .count()
    }

    /// Seconds since the oldest change among what `site` holds.
    pub fn oldest_age_s(&self, site: &str) -> u64 {
        self.batches
            .iter()
            .filter(|b| b.site == site)
            .map(|b| b.age_s)
            .max()
            .unwrap_or(0)
    }
}

/// Sealed bytes per raw byte, of `raw` raw bytes that sealed to `sealed`.
pub(crate) fn sealed_per_raw(raw: u64, sealed: u64) -> Option<f64> {
    (raw > 0).then(|| sealed as f64 / raw as f64)
}

/// A daemon's live view of itself, read at each request.
pub trait Live: Send + Sync + 'static {
    /// The stages of the pipelines running now.
    fn stages(&self) -> Vec<StageView>;
    /// The batch queue, where one runs.
    fn queue(&self) -> Option<QueueView>;
    /// Prometheus' text format, served at `/metrics`, where the daemon keeps metrics.
    fn metrics(&self) -> Option<String>;
    /// What the edge has put on and has ready for the link; `None` elsewhere.
    fn wire(&self) -> Option<WireView> {
        None
    }
    /// What a relay holds; `None` elsewhere.
    fn relay(&self) -> Option<RelayHoldings> {
        None
    }
}
